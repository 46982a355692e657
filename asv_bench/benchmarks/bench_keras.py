"""W4 through Keras 2.2.5: examples/mnist_cnn.py's model, its Dropout layers
included, predicting at batch 1 through its predict function (fed the learning
phase, 0), next to the same network written with K.* in one K.function
(bench_conv.W4MnistCnn's), on the same weights.  Skipped where Keras 2.2.5 is
not installed.  asv_bench/keras_mnist_cnn.py prints more: model.predict,
first calls, a training step."""
import os
import time

import numpy as np

import numbackend as K
from numbackend import tuning

from .common import cnn_function, cnn_inputs, cnn_weights, setup_once


def import_keras():
    """Keras 2.2.5 on numbackend; NotImplementedError (asv: skipped) where it is
    not installed or loads another backend."""
    os.environ.setdefault("KERAS_BACKEND", "numbackend")
    try:
        import keras
    except ImportError:
        raise NotImplementedError("Keras 2.2.5 is not installed") from None
    if keras.backend.backend() != "numbackend":
        raise NotImplementedError(f"Keras loaded the {keras.backend.backend()} backend")
    return keras


def keras_mnist_cnn(keras, weights, optimizer):
    """examples/mnist_cnn.py's model, its weights set to ``weights`` (see
    common.cnn_weights), compiled with ``optimizer``."""
    from keras.layers import Conv2D, Dense, Dropout, Flatten, MaxPooling2D
    from keras.models import Sequential
    model = Sequential()
    model.add(Conv2D(32, kernel_size=(3, 3), activation="relu", input_shape=(28, 28, 1)))
    model.add(Conv2D(64, (3, 3), activation="relu"))
    model.add(MaxPooling2D(pool_size=(2, 2)))
    model.add(Dropout(0.25))
    model.add(Flatten())
    model.add(Dense(128, activation="relu"))
    model.add(Dropout(0.5))
    model.add(Dense(10, activation="softmax"))
    model.compile(loss=keras.losses.categorical_crossentropy, optimizer=optimizer,
                  metrics=["accuracy"])
    model.set_weights([a for pair in weights for a in pair])
    return model


def interleaved_times(calls, rounds, untimed=3):
    """{name: [seconds per round]}: in each round every call ``untimed`` times, then
    once timed, in turns, so that a machine's slow spell reaches all of them alike.
    The calls before each timed one bring its weights back into the caches: after
    another network's call, a call of mnist_cnn at batch 1 took 1.3-1.4x the time
    of one after calls of its own, and a single call before did not make up for it."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(untimed):
                call()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


class W4KerasMnistCnn:
    """Batch 1: the Keras model's predict function and the K.* function."""

    # with a cold kernel cache, the setup compiles the convolutions' loops and the
    # whole compiled call (see bench_conv.W4MnistCnn)
    timeout = 300

    @setup_once
    def setup(self):
        keras = import_keras()
        weights = cnn_weights()
        self.x = cnn_inputs(1)
        self.model = keras_mnist_cnn(keras, weights, keras.optimizers.SGD(lr=0.01))
        self.fn = cnn_function(K, weights)
        np.testing.assert_array_equal(self.model.predict(self.x), self.fn([self.x])[0])
        self.predict_function = self.model.predict_function
        self.fed = [self.x, 0.0] if len(self.predict_function.inputs) == 2 else [self.x]
        # out of the timed calls: the ONE_CALL_AFTER-th call compiles each as one call
        for _ in range(tuning.ONE_CALL_AFTER + 1):
            self.predict_function(self.fed)
            self.fn([self.x])

    def time_keras_predict_function(self):
        self.predict_function(self.fed)

    def time_keras_predict_on_batch(self):
        self.model.predict_on_batch(self.x)

    def time_kstar_function(self):
        self.fn([self.x])

    def track_keras_over_kstar(self):
        """The predict function's median time over the K.* function's, measured
        in this run (1.0: Keras's model costs nothing over its K.* graph)."""
        times = interleaved_times({"keras": lambda: self.predict_function(self.fed),
                                   "kstar": lambda: self.fn([self.x])}, 100)
        return float(np.median(times["keras"]) / np.median(times["kstar"]))

    track_keras_over_kstar.unit = "x"
