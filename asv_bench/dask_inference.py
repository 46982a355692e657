"""Batch inference of Keras 2.2.5's mnist_cnn (untrained weights, see
common.cnn_weights) over N images: one process against a Dask LocalCluster of
worker processes (numbackend.batch_inference.predict_blocks).

    python asv_bench/dask_inference.py [--images N] [--chunk C] [--workers W] [--rounds R]

The predict function is ``K.function(model.inputs, model.outputs)`` (the
learning phase at its default, 0), called once here on C images, which fills
the kernel cache.  W workers of one process and one thread each
(``NUMBACKEND_NUM_THREADS=1``; the same ``NUMBACKEND_CACHE_DIR``, inherited)
make the N images, a Dask array in blocks of C, and keep them (as where
workers read their data themselves).  This process predicts them chunk by
chunk (C images a call, numbackend's default threads) and the workers predict
the blocks (predict_blocks): each once untimed, then R rounds of one timed run
of each, in turns.  Printed: the cluster's start, its first computation
(shipping the function, each worker unpickling it and loading its kernels),
each side's times and throughput (images/s, of the median time), the ratio of
the two, whether the workers compiled any generated kernel, and the largest
difference between the two results.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # numbackend of this tree
sys.path.insert(0, HERE)  # the benchmarks' shared builders

from benchmarks.bench_keras import import_keras, keras_mnist_cnn
from benchmarks.common import cnn_weights, timed


def seconds(times, images):
    """The times of each round and the throughput of their median."""
    rate = images / float(np.median(times))
    return f"{', '.join(f'{t:.2f}' for t in times)} s; median {rate:,.0f} images/s"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=10_000, help="images (default 10,000)")
    parser.add_argument("--chunk", type=int, default=500, help="images a block (default 500)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds, one of each side (default 5)")
    args = parser.parse_args()

    import dask.array as da
    from distributed import Client, LocalCluster

    keras = import_keras()
    from keras import backend as K

    from numbackend import codegen
    from numbackend.batch_inference import predict_blocks

    model = keras_mnist_cnn(keras, cnn_weights(), keras.optimizers.SGD())
    predict = K.function(model.inputs, model.outputs)
    _, warm = timed(lambda: predict([np.zeros((args.chunk, 28, 28, 1), np.float32)]))

    # the workers inherit this environment (NUMBACKEND_CACHE_DIR included)
    env = {"NUMBACKEND_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    begin = time.perf_counter()
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, env=env) as cluster, Client(cluster) as client:
        start = time.perf_counter() - begin
        # the images are made on the workers, as where they read them from storage
        blocks = client.persist(da.random.default_rng(0).standard_normal(
            (args.images, 28, 28, 1), chunks=(args.chunk, 28, 28, 1), dtype=np.float32))
        images = blocks.compute()

        def one_process():
            return np.concatenate([predict([images[i:i + args.chunk]])[0]
                                   for i in range(0, args.images, args.chunk)])

        expected, _ = timed(one_process)
        predictions = predict_blocks(predict, blocks, client)
        got, first = timed(predictions.compute)
        # in turns, so that a slow spell of the shared machine reaches both alike
        alone, cluster_times = [], []
        for _ in range(args.rounds):
            alone.append(timed(one_process)[1])
            cluster_times.append(timed(predictions.compute)[1])
        stats = client.run(codegen.numba_stats)
        caches = set(client.run(codegen.cache_dir).values())
    print(f"one process, numbackend's default threads: first call {warm:.2f} s; "
          f"{args.images} images in chunks of {args.chunk}: {seconds(alone, args.images)}")
    print(f"LocalCluster, {args.workers} worker processes of 1 thread: start {start:.2f} s; "
          f"first computation {first:.2f} s (the function shipped, unpickled, its kernels "
          f"loaded); then {seconds(cluster_times, args.images)}")
    of_medians = np.median(alone) / np.median(cluster_times)
    in_rounds = np.median(np.array(alone) / np.array(cluster_times))
    print(f"cluster throughput over one process's: {of_medians:.2f}x of the medians; "
          f"median ratio in a round {in_rounds:.2f}x")
    same = "the same" if caches == {codegen.cache_dir()} else f"{caches}, not this process's"
    print(f"workers' kernel cache: {same}; their generated kernels: " + "; ".join(
        f"{s['compiled']} compiled, {s['cache_hits']} from the cache" for s in stats.values()))
    difference = float(np.abs(got - expected).max())
    print(f"max |cluster - one process| = {difference:.3g} "
          f"({'identical' if difference == 0 else 'differ'})")


if __name__ == "__main__":
    main()
