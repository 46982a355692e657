"""Workload builders shared by the suites (data: seeded normal inputs, float32)."""
import itertools
import time

import numpy as np

F32 = np.float32


def rng():
    return np.random.default_rng(0)


def median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def ratio(reference, ours, repeat):
    """reference time / our time, both measured in this run (interleaved)."""
    ref_times, our_times = [], []
    for _ in range(repeat):
        ref_times.append(median_time(reference, 1))
        our_times.append(median_time(ours, 1))
    return float(np.median(ref_times) / np.median(our_times))


def w1_inputs():
    r = rng()
    return [r.standard_normal((1024, 4096)).astype(F32) for _ in range(3)]


def w1_numpy(a, b, c):
    return np.tanh(a * b + c) * (1 / (1 + np.exp(-(a - c)))) + F32(0.5) * b * b


def w1_function(K):
    a, b, c = (K.placeholder((None, 4096)) for _ in range(3))
    return K.function([a, b, c], [K.tanh(a * b + c) * K.sigmoid(a - c) + 0.5 * b * b])


def softmax_numpy(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mlp_weights():
    r = rng()
    sizes = [784, 512, 512, 10]
    return [(r.standard_normal((m, n)).astype(F32) / F32(np.sqrt(m)), r.standard_normal(n).astype(F32))
            for m, n in itertools.pairwise(sizes)]


def mlp_function(K, weights):
    x = K.placeholder((None, 784))
    h = x
    for i, (w, b) in enumerate(weights):
        h = K.dot(h, K.variable(w)) + K.variable(b)
        h = K.relu(h) if i < len(weights) - 1 else K.softmax(h)
    return K.function([x], [h])


def mlp_numpy(weights, x):
    h = x
    for i, (w, b) in enumerate(weights):
        h = h @ w + b
        h = np.maximum(h, 0) if i < len(weights) - 1 else softmax_numpy(h)
    return h
