"""W4 of PERFORMANCE.md: Keras mnist_cnn inference (batch 1 and 64) with a NumPy
im2col reference in the same run, and a training step of the same network
(batch 64, mean softmax cross-entropy, plain SGD) next to its forward time."""
import numpy as np

import numbackend as K
from numbackend import tuning

from .common import (
    F32,
    cnn_function,
    cnn_graph,
    cnn_inputs,
    cnn_numpy,
    cnn_weights,
    ratio,
    rng,
    setup_once,
)

LEARNING_RATE = 0.01


class W4MnistCnn:
    """28x28x1 -> conv 3x3x32 relu -> conv 3x3x64 relu -> max pool 2x2 -> dense 128
    relu -> dense 10 softmax, channels_last."""

    params = (1, 64)
    param_names = ("batch",)
    # with a cold kernel cache, the setup compiles the convolutions' loops and
    # (batch 1) the whole compiled call: about 55 s on the 2-core VM
    timeout = 300

    @setup_once
    def setup(self, batch):
        self.weights = cnn_weights()
        self.x = cnn_inputs(batch)
        self.fn = cnn_function(K, self.weights)
        np.testing.assert_allclose(self.fn([self.x])[0], cnn_numpy(self.weights, self.x),
                                   rtol=1e-4, atol=1e-6)
        # out of the timed calls: at batch 1 a function's ONE_CALL_AFTER-th call
        # compiles it as one call
        for _ in range(tuning.ONE_CALL_AFTER + 1):
            self.fn([self.x])

    def time_numbackend(self, batch):
        self.fn([self.x])

    def time_numpy(self, batch):
        cnn_numpy(self.weights, self.x)

    def track_speedup_vs_numpy(self, batch):
        return ratio(lambda: cnn_numpy(self.weights, self.x), lambda: self.fn([self.x]),
                     100 if batch == 1 else 20)

    track_speedup_vs_numpy.unit = "x"


def cnn_batch(batch=64):
    x = cnn_inputs(batch)
    y = np.eye(10, dtype=F32)[rng().integers(0, 10, batch)]
    return x, y


def cnn_step(K, weights, lr=LEARNING_RATE):
    """The compiled training step: ``step([x, y]) -> [loss]``, updating the weights."""
    x, y = K.placeholder((None, 28, 28, 1)), K.placeholder((None, 10))
    probs, params = cnn_graph(K, weights, x)
    loss = K.mean(K.categorical_crossentropy(y, probs))
    grads = K.gradients(loss, params)
    return K.function([x, y], [loss], updates=[(p, p - lr * g) for p, g in zip(params, grads)])


class W4MnistCnnTrainingStep:
    """One SGD step of the mnist_cnn network on a batch of 64, and its time over the
    forward pass (inference) of the same batch, both measured in this run."""

    @setup_once
    def setup(self):
        weights = cnn_weights()
        self.x, self.y = cnn_batch(64)
        self.step = cnn_step(K, weights)
        self.forward = cnn_function(K, weights)
        self.step([self.x, self.y])
        self.forward([self.x])

    def time_numbackend(self):
        self.step([self.x, self.y])

    def track_step_over_forward(self):
        return ratio(lambda: self.step([self.x, self.y]), lambda: self.forward([self.x]), 20)

    track_step_over_forward.unit = "x"
