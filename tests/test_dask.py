"""Batch inference over a Dask array on a LocalCluster of two worker processes
(numbackend.batch_inference.predict_blocks): each worker unpickles the
compiled function once and loads its kernels from the shared cache.

Dask is in the ``test`` extra (and the ``dask`` one); these tests skip without it."""
import gc
import os

import numpy as np
import pytest

import numbackend as K
from numbackend import codegen
from numbackend.batch_inference import predict_blocks
from numbackend.runtime import Function

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def client():
    """Two worker processes of one thread each, reading this process's kernel cache
    (closed when the test ends: the tests after it have no current client).
    Without the scheduler's active memory manager, which every 2 s drops the
    copies of scattered data that no task waits for: a worker's copy of the
    function would be gone by the time the test counts it."""
    env = {"NUMBACKEND_CACHE_DIR": os.environ["NUMBACKEND_CACHE_DIR"], "PYTHONPATH": ROOT,
           "NUMBACKEND_NUM_THREADS": "1"}
    with (dask.config.set({"distributed.scheduler.active-memory-manager.start": False}),
          distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None, env=env) as cluster,
          distributed.Client(cluster) as client):
        yield client


def small_cnn():
    """A 3x3 convolution with bias and ReLU, 2x2 max pooling, a dense softmax
    layer: the function and a NumPy formula of it."""
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((3, 3, 1, 4)).astype("float32") / 3
    bias = rng.standard_normal(4).astype("float32")
    dense = rng.standard_normal((3 * 3 * 4, 5)).astype("float32") / 6
    x = K.placeholder((None, 8, 8, 1))
    h = K.relu(K.bias_add(K.conv2d(x, K.variable(kernel)), K.variable(bias)))
    h = K.batch_flatten(K.pool2d(h, (2, 2), strides=(2, 2)))
    f = K.function([x], [K.softmax(K.dot(h, K.variable(dense)))])

    def formula(images):
        n = len(images)
        conv = np.zeros((n, 6, 6, 4))
        for i in range(6):
            for j in range(6):
                conv[:, i, j] = np.einsum("nhwc,hwcd->nd", images[:, i:i + 3, j:j + 3], kernel)
        pooled = np.maximum(conv + bias, 0).reshape(n, 3, 2, 3, 2, 4).max(axis=(2, 4))
        logits = pooled.reshape(n, -1) @ dense
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return f, formula


def functions_held():
    """How many compiled functions this process holds (run on each worker)."""
    gc.collect()
    return sum(isinstance(o, Function) for o in gc.get_objects())


def blocks_computed(name, dask_worker=None):
    """The blocks of the layer ``name`` that this worker computed (run on each
    worker): a worker may also hold blocks that others computed, copied to it."""
    return sorted({entry[0] for entry in dask_worker.state.log
                   if isinstance(entry[0], tuple) and entry[0][0] == name
                   and tuple(entry[1:3]) == ("executing", "memory")})


def test_blocks_on_two_workers_equal_one_process(client):
    f, formula = small_cnn()
    images = np.random.default_rng(1).standard_normal((60, 8, 8, 1)).astype("float32")
    chunks = [images[i:i + 12] for i in range(0, 60, 12)]
    one_process = np.concatenate([f([chunk])[0] for chunk in chunks])  # and warms the cache
    predictions = predict_blocks(f, da.from_array(images, chunks=(12, 8, 8, 1)), client)
    assert predictions.shape == (60, 5) and predictions.chunks == ((12,) * 5, (5,))
    held = predictions.persist()
    distributed.wait(held)
    got = held.compute()
    np.testing.assert_array_equal(got, one_process)
    np.testing.assert_allclose(got, formula(images.astype("float64")), rtol=1e-5, atol=1e-6)
    # the workers that computed blocks (a busy machine may leave one idle, and an
    # idle one may not have unpickled its copy yet, though it may hold blocks
    # copied to it) hold one copy of the function, not one a block, and loaded
    # its kernels from the cache this process filled, compiling none
    computed = client.run(blocks_computed, predictions.name)
    assert sorted(key for keys in computed.values() for key in keys) == \
        [(predictions.name, i, 0) for i in range(5)], computed  # each block once
    computing = [worker for worker, keys in computed.items() if keys]
    held_functions = client.run(functions_held)
    assert all(held_functions[worker] == 1 for worker in computing), held_functions
    assert all(count <= 1 for count in held_functions.values()), held_functions
    stats = client.run(codegen.numba_stats)
    for worker in computing:
        assert stats[worker]["compiled"] == 0 and stats[worker]["cache_hits"] > 0, stats
    assert all(worker_stats["compiled"] == 0 for worker_stats in stats.values()), stats


def test_blocks_without_a_cluster_call_the_function_itself():
    f, formula = small_cnn()
    images = np.random.default_rng(2).standard_normal((10, 8, 8, 1)).astype("float32")
    blocks = da.from_array(images, chunks=(4, 4, 8, 1))  # split along axis 1 too: rechunked
    got = predict_blocks(f, blocks).compute(scheduler="threads")
    np.testing.assert_allclose(got, formula(images.astype("float64")), rtol=1e-5, atol=1e-6)


def test_a_function_predict_blocks_cannot_call_is_refused():
    x = K.placeholder((None, 3))
    blocks = da.zeros((4, 3), chunks=2, dtype="float32")
    with pytest.raises(ValueError, match="one input and one output"):
        predict_blocks(K.function([x], [x, x]), blocks)
    with pytest.raises(ValueError, match=r"input .* has shape \(None, 3\), images have shape "
                                         r"\(4, 3, 1\)"):
        predict_blocks(K.function([x], [x]), blocks[..., None])
    with pytest.raises(TypeError, match="must be a dask array"):
        predict_blocks(K.function([x], [x]), np.zeros((4, 3)))
