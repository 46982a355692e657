"""Keras 2.2.5's example models end to end on numbackend, small and on synthetic data:
mnist_mlp, mnist_cnn, imdb_lstm, a stacked GRU, imdb_bidirectional_lstm, a functional
model with two inputs, BatchNormalization and Concatenate, and image_ocr's CTC model.

Each is built, evaluated, fitted for a few batches, evaluated and predicted in one
process, which saves it three ways (``model.save``, ``save_weights``, ``to_json`` with
``get_weights``); a second process loads each and must predict the same numbers.
Keras must be imported with KERAS_BACKEND=numbackend, so both run as subprocesses,
each going through every model (a process costs seconds of imports).
"""
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# Importing keras here would load its default (TensorFlow) backend: only look for it.
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras 2.2.5 comes with the test extra", allow_module_level=True)

MODELS_SCRIPT = textwrap.dedent('''
    """python models.py (train|load) FOLDER: every model's stages, each reported in
    FOLDER/<model>.<phase>.json as its results or the traceback that stopped it."""
    import json
    import sys
    import traceback
    from pathlib import Path

    import numpy as np

    import keras
    from keras import backend as K
    from keras import layers
    from keras.models import Model, Sequential, load_model, model_from_json

    assert K.backend() == "numbackend", K.backend()
    BATCH = 16


    def data_rng():
        return np.random.default_rng(0)


    def one_hot_classes(x, n):
        """Targets a model can learn: the argmax of a fixed random projection of x."""
        projection = np.random.default_rng(1).standard_normal((x.shape[1], n))
        return np.eye(n, dtype="float32")[np.argmax(x @ projection, axis=1)]


    def mnist_mlp():
        model = Sequential([layers.Dense(64, activation="relu", input_shape=(784,)),
                            layers.Dropout(0.2),
                            layers.Dense(64, activation="relu"),
                            layers.Dropout(0.2),
                            layers.Dense(10, activation="softmax")])
        model.compile(loss="categorical_crossentropy", optimizer=keras.optimizers.RMSprop(),
                      metrics=["accuracy"])
        x = data_rng().random((48, 784)).astype("float32")
        return model, [x], [one_hot_classes(x, 10)]


    def mnist_cnn():
        model = Sequential([layers.Conv2D(8, (3, 3), activation="relu", input_shape=(12, 12, 1)),
                            layers.Conv2D(16, (3, 3), activation="relu"),
                            layers.MaxPooling2D((2, 2)),
                            layers.Dropout(0.25),
                            layers.Flatten(),
                            layers.Dense(32, activation="relu"),
                            layers.Dropout(0.5),
                            layers.Dense(10, activation="softmax")])
        model.compile(loss=keras.losses.categorical_crossentropy,
                      optimizer=keras.optimizers.Adadelta(), metrics=["accuracy"])
        x = data_rng().random((48, 12, 12, 1)).astype("float32")
        return model, [x], [one_hot_classes(x.reshape(len(x), -1), 10)]


    def word_sequences():
        """Sequences of 10 word ids (1..49) labelled by whether their mean is above 25."""
        x = data_rng().integers(1, 50, (48, 10)).astype("int32")
        return x, (x.mean(axis=1) > 25).astype("float32")[:, None]


    def imdb_lstm():
        model = Sequential([layers.Embedding(50, 16),
                            layers.LSTM(16, dropout=0.2, recurrent_dropout=0.2),
                            layers.Dense(1, activation="sigmoid")])
        model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
        x, y = word_sequences()
        return model, [x], [y]


    def stacked_gru():
        model = Sequential([layers.GRU(16, return_sequences=True, input_shape=(10, 4)),
                            layers.GRU(8),
                            layers.Dense(1)])
        model.compile(loss="mse", optimizer="rmsprop")
        x = data_rng().standard_normal((48, 10, 4)).astype("float32")
        return model, [x], [x.sum(axis=(1, 2))[:, None] / 5]


    def imdb_bidirectional_lstm():
        model = Sequential([layers.Embedding(50, 16, input_length=10),
                            layers.Bidirectional(layers.LSTM(8)),
                            layers.Dropout(0.5),
                            layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
        x, y = word_sequences()
        return model, [x], [y]


    def two_inputs_batchnorm():
        a, b = layers.Input((8,), name="a"), layers.Input((6,), name="b")
        ha = layers.BatchNormalization(name="bn_a")(layers.Dense(16, name="dense_a")(a))
        hb = layers.BatchNormalization(name="bn_b")(layers.Dense(16, name="dense_b")(b))
        merged = layers.Concatenate(name="concat")([layers.Activation("relu")(ha),
                                                    layers.Activation("relu")(hb)])
        out = layers.Dense(3, activation="softmax", name="out")(merged)
        model = Model([a, b], out)
        model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
        rng = data_rng()
        xa = rng.standard_normal((48, 8)).astype("float32")
        xb = rng.standard_normal((48, 6)).astype("float32")
        return model, [xa, xb], [one_hot_classes(np.concatenate([xa, xb], 1), 3)]


    # image_ocr: 32x16 images, 8 frames, 3 letters and the blank (last), labels of 1-3
    OCR_WIDTH, OCR_HEIGHT, OCR_CLASSES, OCR_MAX_LABEL = 32, 16, 4, 3
    OCR_FRAMES = OCR_WIDTH // 4


    def ctc_lambda_func(args):
        y_pred, labels, input_length, label_length = args
        y_pred = y_pred[:, 2:, :]   # image_ocr drops the RNN's first two outputs
        return K.ctc_batch_cost(labels, y_pred, input_length, label_length)


    def ctc_passthrough(y_true, y_pred):
        return y_pred


    def ocr_inputs(n, blank_samples=0):
        """Images, labels (float, padded with -1), input and label lengths; as image_ocr's
        generator, the last ``blank_samples`` samples are labelled with the blank alone."""
        rng = data_rng()
        images = rng.random((n, OCR_WIDTH, OCR_HEIGHT, 1)).astype("float32")
        label_length = rng.integers(1, OCR_MAX_LABEL + 1, (n, 1))
        labels = rng.integers(0, OCR_CLASSES - 1, (n, OCR_MAX_LABEL)).astype("float32")
        labels[np.arange(OCR_MAX_LABEL) >= label_length] = -1
        if blank_samples:
            labels[-blank_samples:] = -1
            labels[-blank_samples:, 0] = OCR_CLASSES - 1
            label_length[-blank_samples:] = 1
        input_length = np.full((n, 1), OCR_FRAMES - 2, "int64")
        return [images, labels, input_length, label_length.astype("int64")]


    def image_ocr():
        input_data = layers.Input(name="the_input", shape=(OCR_WIDTH, OCR_HEIGHT, 1))
        inner = input_data
        for i in (1, 2):
            inner = layers.Conv2D(4, (3, 3), padding="same", activation="relu",
                                  kernel_initializer="he_normal", name=f"conv{i}")(inner)
            inner = layers.MaxPooling2D((2, 2), name=f"max{i}")(inner)
        inner = layers.Reshape((OCR_FRAMES, OCR_HEIGHT // 4 * 4), name="reshape")(inner)
        inner = layers.Dense(8, activation="relu", name="dense1")(inner)

        def gru(name, **kwargs):
            return layers.GRU(16, return_sequences=True, kernel_initializer="he_normal",
                              name=name, **kwargs)
        merged = layers.add([gru("gru1")(inner), gru("gru1_b", go_backwards=True)(inner)])
        inner = layers.concatenate([gru("gru2")(merged),
                                    gru("gru2_b", go_backwards=True)(merged)])
        inner = layers.Dense(OCR_CLASSES, kernel_initializer="he_normal", name="dense2")(inner)
        y_pred = layers.Activation("softmax", name="softmax")(inner)
        labels = layers.Input(name="the_labels", shape=[OCR_MAX_LABEL], dtype="float32")
        input_length = layers.Input(name="input_length", shape=[1], dtype="int64")
        label_length = layers.Input(name="label_length", shape=[1], dtype="int64")
        loss_out = layers.Lambda(ctc_lambda_func, output_shape=(1,), name="ctc")(
            [y_pred, labels, input_length, label_length])
        model = Model([input_data, labels, input_length, label_length], loss_out)
        sgd = keras.optimizers.SGD(lr=0.02, decay=1e-6, momentum=0.9, nesterov=True, clipnorm=5)
        model.compile(loss={"ctc": ctc_passthrough}, optimizer=sgd)
        return model, ocr_inputs(48), [np.zeros((48, 1), "float32")]


    MODELS = [mnist_mlp, mnist_cnn, imdb_lstm, stacked_gru, imdb_bidirectional_lstm,
              two_inputs_batchnorm, image_ocr]
    CUSTOM_OBJECTS = {"ctc_passthrough": ctc_passthrough}


    def named_batches(model, x, y):
        """Endless batches of inputs and targets as dictionaries keyed by the model's
        input and output names, as image_ocr's TextImageGenerator yields them."""
        while True:
            for start in range(0, len(x[0]), BATCH):
                part = slice(start, start + BATCH)
                yield ({k: v[part] for k, v in zip(model.input_names, x)},
                       {k: v[part] for k, v in zip(model.output_names, y)})


    def loss_of(evaluated):
        return float(evaluated[0] if isinstance(evaluated, list) else evaluated)


    def ocr_decodings(model, folder):
        """image_ocr's decoding: the softmax output of four images with 8, 8, 6 and 5
        frames, decoded greedily and by beam search (two best paths).  The last
        layer's kernel is a larger random one meanwhile: a few batches of training
        leave the softmax nearly flat, which decodes every image alike."""
        dense2 = model.get_layer("dense2")
        weights = dense2.get_weights()
        kernel = np.random.default_rng(2).standard_normal(weights[0].shape) * 3
        dense2.set_weights([kernel, np.zeros_like(weights[1])])
        try:
            decode_images(model, folder)
        finally:
            dense2.set_weights(weights)


    def decode_images(model, folder):
        images = ocr_inputs(4)[0]
        lengths = np.array([OCR_FRAMES, OCR_FRAMES, 6, 5], "int32")
        softmax = model.get_layer("softmax").output
        length_input = K.placeholder((None,), dtype="int32")
        greedy, greedy_log_prob = K.ctc_decode(softmax, length_input, greedy=True)
        beam, beam_log_prob = K.ctc_decode(softmax, length_input, greedy=False,
                                           beam_width=100, top_paths=2)
        decode = K.function([model.inputs[0], length_input],
                            [softmax, greedy[0], greedy_log_prob] + beam + [beam_log_prob])
        names = ["probs", "greedy", "greedy_log_prob", "beam0", "beam1", "beam_log_prob"]
        arrays = dict(zip(names, decode([images, lengths])), lengths=lengths)
        np.savez(folder / "image_ocr.decode.npz", **arrays)


    def ocr_losses(model, folder, blank_samples, tag):
        """The CTC model's loss output and its softmax on 8 images, the last
        ``blank_samples`` labelled with the blank alone as image_ocr's generator does."""
        inputs = ocr_inputs(8, blank_samples)
        probs = Model(model.inputs[0], model.get_layer("softmax").output).predict(inputs[0])
        np.savez(folder / f"image_ocr.{tag}.npz", probs=probs, labels=inputs[1],
                 input_length=inputs[2], label_length=inputs[3], loss=model.predict(inputs))


    def train_stages(build, folder):
        """(state, [(stage name, stage)]) of the train phase; the first stage builds
        the model that the others use."""
        name = build.__name__
        state = {}

        def fit():
            np.random.seed(0)
            model, x, y = build()
            state["model"] = model
            state["loss_before"] = loss_of(model.evaluate(x, y, batch_size=BATCH, verbose=0))
            if name == "image_ocr":   # as the example trains it: batches of named arrays
                history = model.fit_generator(named_batches(model, x, y), steps_per_epoch=3,
                                              epochs=2, verbose=0,
                                              validation_data=named_batches(model, x, y),
                                              validation_steps=3)
            else:
                history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                                    validation_data=(x, y))
            state["loss_validation"] = float(history.history["val_loss"][-1])
            state["loss_after"] = loss_of(model.evaluate(x, y, batch_size=BATCH, verbose=0))
            np.save(folder / f"{name}.predict.npy", model.predict(x, batch_size=BATCH))
            by_layer = {f"{layer.name}/{i}": w for layer in model.layers
                        for i, w in enumerate(layer.get_weights())}
            np.savez(folder / f"{name}.weights.npz", *model.get_weights(), **by_layer)

        def to_json():
            (folder / f"{name}.json").write_text(state["model"].to_json())

        def decode():
            ocr_decodings(state["model"], folder)

        def ctc_loss():
            ocr_losses(state["model"], folder, 0, "ctc_loss")

        def ctc_loss_blank():
            ocr_losses(state["model"], folder, 2, "ctc_loss_blank")

        def save():
            state["model"].save(str(folder / f"{name}.h5"))

        def save_weights():
            state["model"].save_weights(str(folder / f"{name}.weights.h5"))

        stages = [fit, to_json, save, save_weights]
        if name == "image_ocr":
            stages[2:2] = [decode, ctc_loss, ctc_loss_blank]
        return state, [(stage.__name__, stage) for stage in stages]


    def load_stages(build, folder):
        """(state, [(stage name, stage)]) of the load phase: after the inputs, each
        stage loads the model one way."""
        name = build.__name__
        state = {}

        def inputs():
            state["x"] = build()[1]

        def predict(model, how):
            np.save(folder / f"{name}.{how}.npy", model.predict(state["x"], batch_size=BATCH))

        def by_load_model():
            model = load_model(str(folder / f"{name}.h5"), custom_objects=CUSTOM_OBJECTS)
            predict(model, "load_model")

        def by_model_from_json():
            model = model_from_json((folder / f"{name}.json").read_text(),
                                    custom_objects=CUSTOM_OBJECTS)
            saved = np.load(folder / f"{name}.weights.npz")
            model.set_weights([saved[f"arr_{i}"] for i in range(len(model.get_weights()))])
            predict(model, "model_from_json")

        def by_load_weights():
            np.random.seed(1)   # other initial weights, which load_weights must replace
            model = build()[0]
            model.load_weights(str(folder / f"{name}.weights.h5"))
            predict(model, "load_weights")

        return state, [("inputs", inputs), ("load_model", by_load_model),
                       ("model_from_json", by_model_from_json), ("load_weights", by_load_weights)]


    def main(phase, folder):
        folder = Path(folder)
        make_stages = {"train": train_stages, "load": load_stages}[phase]
        for build in MODELS:
            state, stages = make_stages(build, folder)
            report = {"done": [], "errors": {}}
            for i, (name, stage) in enumerate(stages):
                try:
                    stage()
                    report["done"].append(name)
                except Exception:
                    report["errors"][name] = traceback.format_exc()
                    if i == 0:
                        break   # the others need what it makes
            report.update((k, v) for k, v in state.items() if k.startswith("loss"))
            (folder / f"{build.__name__}.{phase}.json").write_text(json.dumps(report))


    main(*sys.argv[1:])
''')

MODEL_NAMES = ["mnist_mlp", "mnist_cnn", "imdb_lstm", "stacked_gru", "imdb_bidirectional_lstm",
               "two_inputs_batchnorm", "image_ocr"]

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The folder where both processes ran: reports, predictions and saved models."""
    folder = tmp_path_factory.mktemp("keras_models")
    script = folder / "models.py"
    script.write_text(MODELS_SCRIPT)
    # Scans run their steps from Python (SCAN_LOOP_AFTER: never): compiling the recurrent
    # models' loops took three quarters of this fixture's time, and nothing here compares a
    # loop's numbers with NumPy's.  Keras's recurrent layers in compiled loops are checked in
    # tests/test_keras.py, K.rnn's loops and their gradients in tests/test_rnn.py.
    env = dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(folder),
               NUMBACKEND_TUNE_SCAN_LOOP_AFTER=str(10**9))
    for phase in ("train", "load"):
        # a cold kernel cache compiles every model's kernels here: a minute on 2 cores
        result = subprocess.run([sys.executable, str(script), phase, str(folder)], env=env,
                                capture_output=True, text=True, check=False, timeout=1800)
        assert result.returncode == 0, result.stderr[-3000:]
    return folder


def stage_result(runs, name, phase, stage):
    """The phase's report; fails with the phase's tracebacks unless the stage ran."""
    report = json.loads((runs / f"{name}.{phase}.json").read_text())
    if stage not in report["done"]:
        errors = "\n".join(f"{where}:\n{tb}" for where, tb in report["errors"].items())
        pytest.fail(f"{name}: {phase} stage {stage!r} did not run\n{errors}")
    return report


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_fit_lowers_the_loss(runs, name):
    report = stage_result(runs, name, "train", "fit")
    assert np.isfinite(report["loss_before"]) and np.isfinite(report["loss_after"])
    assert report["loss_after"] < report["loss_before"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_last_validation_loss_is_the_evaluated_loss(runs, name):
    """fit validates on its training data after its last batch: the same weights and
    batches as the evaluate that follows."""
    report = stage_result(runs, name, "train", "fit")
    np.testing.assert_allclose(report["loss_validation"], report["loss_after"], rtol=1e-6)


def expect_same_predictions(runs, name, how):
    stage_result(runs, name, "load", how)
    want = np.load(runs / f"{name}.predict.npy")
    got = np.load(runs / f"{name}.{how}.npy")
    assert got.shape == want.shape
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_load_model_in_a_new_process_predicts_the_same(runs, name):
    stage_result(runs, name, "train", "save")
    expect_same_predictions(runs, name, "load_model")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_from_json_with_set_weights_predicts_the_same(runs, name):
    stage_result(runs, name, "train", "to_json")
    expect_same_predictions(runs, name, "model_from_json")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_load_weights_predicts_the_same(runs, name):
    stage_result(runs, name, "train", "save_weights")
    expect_same_predictions(runs, name, "load_weights")


def test_two_inputs_batchnorm_predicts_numpys_numbers(runs):
    """Inference-mode BatchNormalization (moving statistics) and Concatenate, against
    NumPy on the fitted weights."""
    stage_result(runs, "two_inputs_batchnorm", "train", "fit")
    w = np.load(runs / "two_inputs_batchnorm.weights.npz")
    rng = np.random.default_rng(0)   # the script's data
    xa = rng.standard_normal((48, 8)).astype("float32")
    xb = rng.standard_normal((48, 6)).astype("float32")

    def branch(x, side):
        h = x @ w[f"dense_{side}/0"] + w[f"dense_{side}/1"]
        gamma, beta, mean, var = (w[f"bn_{side}/{i}"] for i in range(4))
        return np.maximum((h - mean) / np.sqrt(var + 1e-3) * gamma + beta, 0)
    z = np.concatenate([branch(xa, "a"), branch(xb, "b")], 1) @ w["out/0"] + w["out/1"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    # the moving statistics moved during fit: inference must not use the batch's
    assert np.abs(w["bn_a/2"]).max() > 0
    np.testing.assert_allclose(np.load(runs / "two_inputs_batchnorm.predict.npy"), want,
                               rtol=1e-4, atol=1e-6)


# image_ocr's decoding and CTC loss, against brute-force definitions

EPSILON = 1e-7  # Keras's epsilon(): the CTC ops see log(y_pred + epsilon)


def frame_log_probs(probs):
    """log of the softmax TensorFlow's CTC ops take of log(y_pred + epsilon)."""
    p = probs.astype(np.float64) + EPSILON
    return np.log(p / p.sum(axis=-1, keepdims=True))


def labelling_log_probs(log_probs):
    """{labelling: log P(labelling)} over every path of the frames (blank last):
    each path's labelling merges repeats, then drops blanks."""
    frames, classes = log_probs.shape
    blank = classes - 1
    paths = np.array(list(itertools.product(range(classes), repeat=frames)))
    path_log_p = log_probs[np.arange(frames), paths].sum(axis=1)
    sums = {}
    for path, log_p in zip(paths.tolist(), path_log_p):
        labelling = tuple(c for i, c in enumerate(path)
                          if c != blank and (i == 0 or c != path[i - 1]))
        sums.setdefault(labelling, []).append(log_p)
    return {k: float(np.logaddexp.reduce(v)) for k, v in sums.items()}


def unpad(row):
    return tuple(int(c) for c in row if c != -1)


@pytest.fixture(scope="module")
def ocr_decode(runs):
    stage_result(runs, "image_ocr", "train", "decode")
    return np.load(runs / "image_ocr.decode.npz")


def test_image_ocr_greedy_decode_is_the_best_path(ocr_decode):
    probs, lengths = ocr_decode["probs"], ocr_decode["lengths"]
    blank = probs.shape[2] - 1
    want, want_log_prob = [], []
    for sample, frames in zip(probs, lengths):
        best = sample[:frames].argmax(axis=1)
        want.append(tuple(int(c) for i, c in enumerate(best)
                          if c != blank and (i == 0 or c != best[i - 1])))
        # TensorFlow's greedy decoder: minus the sum of each frame's largest logit
        want_log_prob.append(-np.log(sample[:frames].max(axis=1) + EPSILON).sum())
    got = ocr_decode["greedy"]
    assert got.shape == (len(probs), max(map(len, want)))
    assert [unpad(row) for row in got] == want
    np.testing.assert_allclose(ocr_decode["greedy_log_prob"][:, 0], want_log_prob, rtol=1e-5)


def test_image_ocr_beam_decode_finds_the_most_probable_labellings(ocr_decode):
    probs, lengths = ocr_decode["probs"], ocr_decode["lengths"]
    for b, (sample, frames) in enumerate(zip(probs, lengths)):
        log_p = labelling_log_probs(frame_log_probs(sample[:frames]))
        ranked = sorted(log_p.values(), reverse=True)
        first, second = unpad(ocr_decode["beam0"][b]), unpad(ocr_decode["beam1"][b])
        assert first != second
        # ties within rounding may come in either order
        assert log_p[first] >= ranked[0] - 1e-6, b
        assert log_p[second] >= ranked[1] - 1e-6, b


def test_image_ocr_beam_decode_log_probs(ocr_decode):
    probs, lengths = ocr_decode["probs"], ocr_decode["lengths"]
    for b, (sample, frames) in enumerate(zip(probs, lengths)):
        log_p = labelling_log_probs(frame_log_probs(sample[:frames]))
        want = [log_p[unpad(ocr_decode[f"beam{k}"][b])] for k in (0, 1)]
        np.testing.assert_allclose(ocr_decode["beam_log_prob"][b], want, rtol=1e-4)


def ctc_loss_numpy(log_probs, label):
    """CTC loss by the forward recursion over the label with blanks between and around
    its classes (log space, float64)."""
    frames, classes = log_probs.shape
    blank = classes - 1
    states = [blank]
    for c in label:
        states += [c, blank]
    alpha = np.full(len(states), -np.inf)
    alpha[:2] = log_probs[0, states[:2]]
    for t in range(1, frames):
        previous = alpha.copy()
        for s, c in enumerate(states):
            terms = [previous[s]] + ([previous[s - 1]] if s else [])
            if s >= 2 and c != blank and c != states[s - 2]:
                terms.append(previous[s - 2])
            alpha[s] = np.logaddexp.reduce(terms) + log_probs[t, c]
    return -np.logaddexp(alpha[-1], alpha[-2])


def ocr_ctc(runs, tag):
    stage_result(runs, "image_ocr", "train", tag)
    return np.load(runs / f"image_ocr.{tag}.npz")


def test_image_ocr_ctc_loss_of_labelled_samples(runs):
    """The Lambda's ctc_batch_cost on the softmax's frames from the third on."""
    ctc = ocr_ctc(runs, "ctc_loss")
    losses = []
    for b in range(len(ctc["probs"])):
        label = ctc["labels"][b, :int(ctc["label_length"][b, 0])].astype(int)
        frames = 2 + int(ctc["input_length"][b, 0])
        losses.append(ctc_loss_numpy(frame_log_probs(ctc["probs"][b, 2:frames]), label))
    np.testing.assert_allclose(ctc["loss"][:, 0], losses, rtol=1e-5)


def test_image_ocr_ctc_loss_of_blank_samples_as_tensorflow_1(runs):
    """image_ocr labels some samples with the blank class alone. TensorFlow 1 scores
    such a label as P(empty labelling) * (1 + p_blank(last frame)) / p_blank(last frame)."""
    ctc = ocr_ctc(runs, "ctc_loss_blank")
    for b in (6, 7):
        frames = 2 + int(ctc["input_length"][b, 0])
        log_probs = frame_log_probs(ctc["probs"][b, 2:frames])
        empty = log_probs[:, -1].sum()
        last_blank = np.exp(log_probs[-1, -1])
        want = -(empty + np.log1p(last_blank) - np.log(last_blank))
        np.testing.assert_allclose(ctc["loss"][b, 0], want, rtol=1e-5)
