"""numbackend in forked processes: a child forked after the parent ran
parallel kernels computes right (its kernels run on one thread), and a fork
while another thread runs a function neither hangs the parent nor the child.

Each case runs in a subprocess with a time limit: before these were handled,
a child entering a parallel kernel was terminated by Numba's OpenMP layer (so
a multiprocessing.Pool's map never returned), and a fork while a thread ran a
scan left that thread hung in OpenBLAS's pool."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork is POSIX; tested on Linux")

_MODELS = """
import os, threading, multiprocessing, warnings
# the pooling below on Numba's threads, whatever its size: they do not survive a fork
os.environ["NUMBACKEND_TUNE_LIBRARY_PARALLEL_MIN_WORK"] = "0"
os.environ["NUMBACKEND_TUNE_LIBRARY_IMAGE_PARTS_MIN_WORK"] = str(10**12)
import numpy as np
import numbackend as K

rng = np.random.default_rng(0)
# a fused kernel with enough work to run in row parts on OpenBLAS's threads
x = K.placeholder((None, 1000))
fused = K.function([x], [K.tanh(x * 2.0 + 1.0) * K.sigmoid(x)])
xv = rng.random((1000, 1000), dtype=np.float32)
fused_want = np.tanh(xv * 2 + 1) / (1 + np.exp(-xv))

# max pooling, its parallel loop on Numba's threads
im = K.placeholder((None, 64, 64, 16))
pool = K.function([im], [K.pool2d(im, (2, 2), (2, 2))])
imv = rng.random((64, 64, 64, 16), dtype=np.float32)
pool_want = imv.reshape(64, 32, 2, 32, 2, 16).max(axis=(2, 4))

# a recurrent scan whose rows split between OpenBLAS's threads
T, B, D, U = 10, 512, 64, 128
seq = K.placeholder((None, T, D))
W = K.variable(rng.standard_normal((D, U)).astype("f4") * 0.1)
R = K.variable(rng.standard_normal((U, U)).astype("f4") * 0.1)
def step(inp, states):
    h = K.tanh(K.dot(inp, W) + K.dot(states[0], R))
    return h, [h]
scan = K.function([seq], [K.rnn(step, seq, [K.zeros((B, U))])[1]])
sv = rng.standard_normal((B, T, D)).astype("f4")
h = np.zeros((B, U), "f4")
scan_want = []
for t in range(T):
    h = np.tanh(sv[:, t] @ W.value + h @ R.value)
    scan_want.append(h)
scan_want = np.stack(scan_want, 1)

def errors(_=None):
    return (float(np.abs(fused([xv])[0] - fused_want).max()),
            float(np.abs(pool([imv])[0] - pool_want).max()),
            float(np.abs(scan([sv])[0] - scan_want).max()))

def assert_right(errs, where):
    assert errs[0] < 1e-6 and errs[1] == 0 and errs[2] < 1e-5, (where, errs)

for _ in range(3):
    assert_right(errors(), "parent")
"""


def _run(body, timeout=240):
    source = _MODELS + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", source], check=False, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_forked_child_computes_right_on_one_thread():
    done = _run("""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    assert_right(errors(), "child")
                assert any("forked" in str(w.message) for w in caught), "no warning"
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        print("child ok")
    """)
    assert "child ok" in done.stdout


def test_a_fork_pool_maps_a_function_built_in_the_parent():
    _run("""
        with multiprocessing.get_context("fork").Pool(2) as workers:
            for errs in workers.map(errors, range(4)):
                assert_right(errs, "worker")
        print("pool ok")
    """)


def test_forking_while_another_thread_runs_a_function():
    _run("""
        stop = []
        def keep_scanning():
            while not stop:
                assert_right((0.0, 0.0, float(np.abs(scan([sv])[0] - scan_want).max())), "thread")
        thread = threading.Thread(target=keep_scanning)
        thread.start()
        try:
            for _ in range(40):
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
        finally:
            stop.append(True)
            thread.join()
        assert_right(errors(), "parent after the forks")
    """)
