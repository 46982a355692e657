"""W7 of PERFORMANCE.md: an MLP 784-512(relu)-512(relu)-10(softmax) training step,
batch 128, mean softmax cross-entropy against one-hot targets, plain SGD (lr 0.01):
the warm step, the same step in NumPy (hand-written backward pass) in the same run,
and building plus first-calling the step in a fresh process (cold and warm cache).
"""

import numpy as np

import numbackend as K

from .common import F32, cold_cache_run, mlp_weights, ratio, rng, setup_once, warm_cache_run

LEARNING_RATE = 0.01


def w7_batch():
    r = rng()
    x = r.standard_normal((128, 784)).astype(F32)
    y = np.eye(10, dtype=F32)[r.integers(0, 10, 128)]
    return x, y


def w7_step(K, weights, lr=LEARNING_RATE):
    """The compiled training step: ``step([x, y]) -> [loss]``, updating the weights."""
    x, y = K.placeholder((None, 784)), K.placeholder((None, 10))
    params, h = [], x
    for i, (w, b) in enumerate(weights):
        wv, bv = K.variable(w), K.variable(b)
        params += [wv, bv]
        h = K.dot(h, wv) + bv
        h = K.relu(h) if i < len(weights) - 1 else K.softmax(h)
    loss = K.mean(K.categorical_crossentropy(y, h))
    grads = K.gradients(loss, params)
    return K.function([x, y], [loss], updates=[(p, p - lr * g) for p, g in zip(params, grads)])


def w7_numpy_step(weights, lr=LEARNING_RATE):
    """The same step in NumPy, updating its own copy of the weights in place."""
    params = [np.array(v) for wb in weights for v in wb]
    lr = F32(lr)

    def step(x, y):
        w1, b1, w2, b2, w3, b3 = params
        z1 = x @ w1 + b1
        h1 = np.maximum(z1, 0)
        z2 = h1 @ w2 + b2
        h2 = np.maximum(z2, 0)
        z3 = h2 @ w3 + b3
        e = np.exp(z3 - z3.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.mean(np.sum(y * np.log(p), axis=1))
        dz3 = (p - y) / F32(len(x))
        dh2 = dz3 @ w3.T * (z2 > 0)
        dh1 = dh2 @ w2.T * (z1 > 0)
        grads = [x.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dz3, dz3.sum(0)]
        for q, g in zip(params, grads):
            q -= lr * g
        return loss
    return step


class W7TrainingStep:
    """One SGD step of the 784-512-512-10 MLP on a batch of 128."""

    @setup_once
    def setup(self):
        self.x, self.y = w7_batch()
        weights = mlp_weights()
        self.step = w7_step(K, weights)
        self.numpy_step = w7_numpy_step(weights)
        self.step([self.x, self.y])

    def time_step(self):
        self.step([self.x, self.y])

    def time_numpy(self):
        self.numpy_step(self.x, self.y)

    def track_speedup_vs_numpy(self):
        return ratio(lambda: self.numpy_step(self.x, self.y), lambda: self.step([self.x, self.y]),
                     100)

    track_speedup_vs_numpy.unit = "x"


_BUILD = ("import numbackend as K; "
          "from benchmarks.bench_training import w7_batch, w7_step; "
          "from benchmarks.common import mlp_weights; x, y = w7_batch(); "
          "w7_step(K, mlp_weights())([x, y])")


class W7CompileAndLoad:
    """Building the W7 training step (graph, gradients, plan) and calling it once, in a
    fresh process: with an empty kernel cache, and with one filled by another process."""

    def timeraw_compile_cold_cache(self):
        return cold_cache_run(_BUILD)

    def timeraw_load_warm_cache(self):
        return warm_cache_run(_BUILD)
