"""Keras 2.2.5's example models on numbackend (synthetic data): mnist_mlp and
mnist_cnn at the examples' sizes, imdb_lstm and imdb_bidirectional_lstm with
the examples' layers on shorter vocabularies, a stacked GRU, a functional model
with two inputs, BatchNormalization and Concatenate, and image_ocr's CTC model
(the example's layers, 128x64 images).

Per model: the time of one epoch of ``fit``, of ``predict_on_batch`` at batch 1
and 128, and of building the model and its first calls (one prediction, one
training step) in a fresh process, with an empty kernel cache and with one that
another process filled.

Keras is imported on first use with KERAS_BACKEND=numbackend and a KERAS_HOME
of its own (Keras's defaults: channels_last, float32), so asv can import this
module without loading a backend.
"""
import os
import tempfile

import numpy as np

from numbackend import tuning

from .common import F32, cold_cache_run, rng, setup_once, warm_cache_run

MODEL_NAMES = ("mnist_mlp", "mnist_cnn", "imdb_lstm", "stacked_gru", "imdb_bidirectional_lstm",
               "two_inputs_batchnorm", "image_ocr")
PREDICT_BATCHES = (1, 128)


def keras_modules():
    """(keras, keras.layers, keras.models, keras.backend), loaded on numbackend."""
    os.environ["KERAS_BACKEND"] = "numbackend"
    os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="numbackend-asv-keras-"))
    import keras
    from keras import backend, layers, models
    assert backend.backend() == "numbackend", backend.backend()
    return keras, layers, models, backend


def one_hot(labels, n):
    return np.eye(n, dtype=F32)[labels]


def mnist_mlp():
    keras, layers, models, _ = keras_modules()
    model = models.Sequential([layers.Dense(512, activation="relu", input_shape=(784,)),
                               layers.Dropout(0.2),
                               layers.Dense(512, activation="relu"),
                               layers.Dropout(0.2),
                               layers.Dense(10, activation="softmax")])
    model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.RMSprop(),
                  metrics=["accuracy"])
    r = rng()
    x = r.random((1024, 784), dtype=F32)
    return model, [x], [one_hot(r.integers(0, 10, len(x)), 10)], 128


def mnist_cnn():
    keras, layers, models, _ = keras_modules()
    model = models.Sequential([
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu", input_shape=(28, 28, 1)),
        layers.Conv2D(64, (3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Dropout(0.25),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax")])
    model.compile(loss=keras.losses.categorical_crossentropy,
                  optimizer=keras.optimizers.Adadelta(), metrics=["accuracy"])
    r = rng()
    x = r.random((256, 28, 28, 1), dtype=F32)
    return model, [x], [one_hot(r.integers(0, 10, len(x)), 10)], 128


def word_ids(samples, steps, vocabulary):
    r = rng()
    return (r.integers(1, vocabulary, (samples, steps)).astype(np.int32),
            r.integers(0, 2, (samples, 1)).astype(F32))


def imdb_lstm():
    _, layers, models, _ = keras_modules()
    model = models.Sequential([layers.Embedding(2000, 128),
                               layers.LSTM(128, dropout=0.2, recurrent_dropout=0.2),
                               layers.Dense(1, activation="sigmoid")])
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    x, y = word_ids(256, 80, 2000)
    return model, [x], [y], 32


def stacked_gru():
    _, layers, models, _ = keras_modules()
    model = models.Sequential([layers.GRU(128, return_sequences=True, input_shape=(50, 32)),
                               layers.GRU(64),
                               layers.Dense(1)])
    model.compile(loss="mse", optimizer="rmsprop")
    r = rng()
    return (model, [r.standard_normal((256, 50, 32), dtype=F32)],
            [r.standard_normal((256, 1), dtype=F32)], 32)


def imdb_bidirectional_lstm():
    _, layers, models, _ = keras_modules()
    model = models.Sequential([layers.Embedding(2000, 128, input_length=100),
                               layers.Bidirectional(layers.LSTM(64)),
                               layers.Dropout(0.5),
                               layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    x, y = word_ids(256, 100, 2000)
    return model, [x], [y], 32


def two_inputs_batchnorm():
    _, layers, models, _ = keras_modules()
    a, b = layers.Input((64,)), layers.Input((32,))
    ha = layers.Activation("relu")(layers.BatchNormalization()(layers.Dense(256)(a)))
    hb = layers.Activation("relu")(layers.BatchNormalization()(layers.Dense(256)(b)))
    out = layers.Dense(10, activation="softmax")(layers.Concatenate()([ha, hb]))
    model = models.Model([a, b], out)
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    r = rng()
    xa, xb = r.standard_normal((1024, 64), dtype=F32), r.standard_normal((1024, 32), dtype=F32)
    return model, [xa, xb], [one_hot(r.integers(0, 10, len(xa)), 10)], 128


# image_ocr's train(): 128x64 images, 16 conv filters, 32 dense units, GRUs of 512,
# 27 letters and the blank, labels of up to 16, minibatches of 32
OCR_WIDTH, OCR_HEIGHT, OCR_CLASSES, OCR_MAX_LABEL = 128, 64, 28, 16


def ctc_lambda_func(args):
    y_pred, labels, input_length, label_length = args
    from keras import backend
    return backend.ctc_batch_cost(labels, y_pred[:, 2:, :], input_length, label_length)


def ctc_passthrough(y_true, y_pred):
    return y_pred


def image_ocr():
    keras, layers, models, _ = keras_modules()
    input_data = layers.Input(name="the_input", shape=(OCR_WIDTH, OCR_HEIGHT, 1))
    inner = input_data
    for i in (1, 2):
        inner = layers.Conv2D(16, (3, 3), padding="same", activation="relu",
                              kernel_initializer="he_normal", name=f"conv{i}")(inner)
        inner = layers.MaxPooling2D((2, 2), name=f"max{i}")(inner)
    frames = OCR_WIDTH // 4
    inner = layers.Reshape((frames, OCR_HEIGHT // 4 * 16), name="reshape")(inner)
    inner = layers.Dense(32, activation="relu", name="dense1")(inner)

    def gru(name, **kwargs):
        return layers.GRU(512, return_sequences=True, kernel_initializer="he_normal",
                          name=name, **kwargs)
    merged = layers.add([gru("gru1")(inner), gru("gru1_b", go_backwards=True)(inner)])
    inner = layers.concatenate([gru("gru2")(merged), gru("gru2_b", go_backwards=True)(merged)])
    inner = layers.Dense(OCR_CLASSES, kernel_initializer="he_normal", name="dense2")(inner)
    y_pred = layers.Activation("softmax", name="softmax")(inner)
    labels = layers.Input(name="the_labels", shape=[OCR_MAX_LABEL], dtype="float32")
    input_length = layers.Input(name="input_length", shape=[1], dtype="int64")
    label_length = layers.Input(name="label_length", shape=[1], dtype="int64")
    loss_out = layers.Lambda(ctc_lambda_func, output_shape=(1,), name="ctc")(
        [y_pred, labels, input_length, label_length])
    model = models.Model([input_data, labels, input_length, label_length], loss_out)
    sgd = keras.optimizers.SGD(lr=0.02, decay=1e-6, momentum=0.9, nesterov=True, clipnorm=5)
    model.compile(loss={"ctc": ctc_passthrough}, optimizer=sgd)
    r = rng()
    n = 128
    label_length = r.integers(1, OCR_MAX_LABEL + 1, (n, 1))
    labels = r.integers(0, OCR_CLASSES - 1, (n, OCR_MAX_LABEL)).astype(F32)
    labels[np.arange(OCR_MAX_LABEL) >= label_length] = -1
    inputs = [r.random((n, OCR_WIDTH, OCR_HEIGHT, 1), dtype=F32), labels,
              np.full((n, 1), frames - 2, np.int64), label_length.astype(np.int64)]
    return model, inputs, [np.zeros((n, 1), F32)], 32


BUILDERS = {build.__name__: build for build in (mnist_mlp, mnist_cnn, imdb_lstm, stacked_gru,
                                                imdb_bidirectional_lstm, two_inputs_batchnorm,
                                                image_ocr)}
assert tuple(BUILDERS) == MODEL_NAMES


def build(name):
    """(compiled model, inputs, targets, the fit's batch size); weights seeded."""
    np.random.seed(0)   # Keras's initial weights come from NumPy's global generator
    return BUILDERS[name]()


def rows(inputs, n):
    """The first n samples of each input, repeated where there are fewer."""
    return [np.resize(x, (n,) + x.shape[1:]) for x in inputs]


def predictor(model, inputs):
    """(the model that predicts, its inputs): image_ocr's is its softmax output, which
    the example decodes (the model itself outputs the CTC loss), the others' the model."""
    if "softmax" not in [layer.name for layer in model.layers]:
        return model, inputs
    _, _, models, _ = keras_modules()
    return models.Model(model.inputs[0], model.get_layer("softmax").output), inputs[:1]


def first_calls(name):
    """Builds the model and makes its first calls: a prediction at batch 1 and a
    training step at the fit's batch size."""
    model, x, y, batch = build(name)
    predicting, inputs = predictor(model, x)
    predicting.predict_on_batch(rows(inputs, 1))
    model.train_on_batch(rows(x, batch), rows(y, batch))


class KerasModels:
    """One epoch of fit, and predict_on_batch at batch 1 and 128 (image_ocr: of its
    softmax output)."""

    params = (MODEL_NAMES,)
    param_names = ("model",)
    # the setup compiles the model's kernels: with a cold kernel cache, minutes
    timeout = 900

    @setup_once
    def setup(self, name):
        self.model, self.x, self.y, self.batch = build(name)
        self.predicting, inputs = predictor(self.model, self.x)
        self.samples = {n: rows(inputs, n) for n in PREDICT_BATCHES}
        self.model.fit(self.x, self.y, batch_size=self.batch, epochs=1, verbose=0)
        # out of the timed calls: at batch 1 a function's ONE_CALL_AFTER-th call
        # compiles it as one call
        for n in PREDICT_BATCHES:
            for _ in range(tuning.ONE_CALL_AFTER + 1):
                self.predicting.predict_on_batch(self.samples[n])

    def time_fit_epoch(self, name):
        self.model.fit(self.x, self.y, batch_size=self.batch, epochs=1, verbose=0)

    def time_predict_batch_1(self, name):
        self.predicting.predict_on_batch(self.samples[1])

    def time_predict_batch_128(self, name):
        self.predicting.predict_on_batch(self.samples[128])


class KerasModelsFirstCalls:
    """Building a model, its first prediction and its first training step, in a fresh
    process: with an empty kernel cache, and with one filled by another process.
    One method per model and cache (``timeraw_<cold|warm>_cache_<model>``): the
    installed asv_runner drops what a parameterized timeraw benchmark returns."""

    timeout = 900


def _add_first_calls_benchmarks():
    for name in MODEL_NAMES:
        code = f"from benchmarks.keras_models import first_calls; first_calls({name!r})"

        def cold(self, code=code):
            return cold_cache_run(code)

        def warm(self, code=code):
            return warm_cache_run(code)
        setattr(KerasModelsFirstCalls, f"timeraw_cold_cache_{name}", cold)
        setattr(KerasModelsFirstCalls, f"timeraw_warm_cache_{name}", warm)


_add_first_calls_benchmarks()
