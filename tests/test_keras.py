"""Keras 2.2.5 loads numbackend (KERAS_BACKEND=numbackend) and runs Dense and recurrent models."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

# Importing keras here would load its default (TensorFlow) backend: only look for it.
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras 2.2.5 comes with the test extra", allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    from keras import backend as K
    from keras.models import Sequential
    from keras.layers import Dense, Dropout

    assert K.backend() == "numbackend", K.backend()
    rng = np.random.default_rng(0)
    model = Sequential([Dense(16, activation="relu", input_shape=(8,)), Dropout(0.5),
                        Dense(12, activation="tanh"), Dense(5, activation="softmax")])
    weights = [rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(weights)
    x = rng.standard_normal((7, 8)).astype("float32")
    got = model.predict(x, batch_size=4)

    w1, b1, w2, b2, w3, b3 = weights
    h = np.maximum(x @ w1 + b1, 0)          # Dropout is the identity at test time
    h = np.tanh(h @ w2 + b2)
    z = h @ w3 + b3
    e = np.exp(z - z.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    print(json.dumps({"max_error": float(np.abs(got - want).max()), "shape": list(got.shape)}))
""")


def run_keras(script, tmp_path, **environment):
    """Run ``script`` in a new process with Keras on numbackend; ``environment``: variables
    set for it too."""
    env = dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(tmp_path), **environment)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            check=False,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_import_keras_with_numbackend(tmp_path):
    result = run_keras("import keras; from keras import backend as K; print(K.backend())", tmp_path)
    assert result.stdout.strip().splitlines()[-1] == "numbackend"
    assert "Using numbackend backend" in result.stderr


def test_sequential_dense_predicts_numpy_numbers(tmp_path):
    result = run_keras(SCRIPT, tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["shape"] == [7, 5]
    assert report["max_error"] < 1e-5


def test_lambda_output_shape_reaches_the_next_layer(tmp_path):
    # int_shape must prefer the shape Keras computed (_keras_shape), as TF's backend does
    script = textwrap.dedent("""
        import numpy as np
        from keras.models import Sequential
        from keras.layers import Lambda, Flatten, Dense
        from keras import backend as K
        model = Sequential([Lambda(lambda x: K.reshape(x, K.stack([K.shape(x)[0], 4, 2])),
                                   output_shape=(4, 2), input_shape=(8,)), Flatten(), Dense(1)])
        x = np.arange(16, dtype="float32").reshape(2, 8)
        w, b = model.layers[-1].get_weights()
        print(float(np.abs(model.predict(x) - (x @ w + b)).max()))
    """)
    result = run_keras(script, tmp_path)
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-5


RECURRENT_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from keras.models import Sequential
    from keras.layers import GRU, LSTM, Dense, Masking, SimpleRNN

    rng = np.random.default_rng(0)

    def hard_sigmoid(x):
        return np.clip(0.2 * x + 0.5, 0, 1)

    def numpy_lstm(x, w, u, b, units, mask=None):
        h = c = np.zeros((x.shape[0], units))
        outputs = []
        for t in range(x.shape[1]):
            z = x[:, t] @ w + h @ u + b
            i, f = hard_sigmoid(z[:, :units]), hard_sigmoid(z[:, units:2 * units])
            c_new = f * c + i * np.tanh(z[:, 2 * units:3 * units])
            h_new = hard_sigmoid(z[:, 3 * units:]) * np.tanh(c_new)
            if mask is not None:
                m = mask[:, t][:, None]
                h_new, c_new = np.where(m, h_new, h), np.where(m, c_new, c)
            h, c = h_new, c_new
            outputs.append(h)
        return np.stack(outputs, axis=1)

    def numpy_gru(x, w, u, b, units):
        h = np.zeros((x.shape[0], units))
        for t in range(x.shape[1]):
            xz = x[:, t] @ w + b
            z = hard_sigmoid(xz[:, :units] + h @ u[:, :units])
            r = hard_sigmoid(xz[:, units:2 * units] + h @ u[:, units:2 * units])
            candidate = np.tanh(xz[:, 2 * units:] + (r * h) @ u[:, 2 * units:])
            h = z * h + (1 - z) * candidate
        return h

    x = rng.standard_normal((4, 6, 3)).astype("float32")
    errors = {}
    for impl in (1, 2):
        model = Sequential([LSTM(5, input_shape=(6, 3), implementation=impl,
                                 return_sequences=True)])
        w, u, b = model.get_weights()
        b = rng.standard_normal(b.shape).astype("float32")
        model.set_weights([w, u, b])
        errors[f"lstm{impl}"] = np.abs(model.predict(x) - numpy_lstm(x, w, u, b, 5)).max()
        model = Sequential([GRU(5, input_shape=(6, 3), implementation=impl)])
        w, u, b = model.get_weights()
        errors[f"gru{impl}"] = np.abs(model.predict(x) - numpy_gru(x, w, u, b, 5)).max()
        model = Sequential([SimpleRNN(5, input_shape=(6, 3), go_backwards=True)])
        w, u, b = model.get_weights()
        h = np.zeros((4, 5))
        for t in range(5, -1, -1):
            h = np.tanh(x[:, t] @ w + h @ u + b)
        errors[f"simple_rnn{impl}"] = np.abs(model.predict(x) - h).max()
    masked = x.copy()
    masked[0, 4:] = 0
    masked[2, :2] = 0
    model = Sequential([Masking(0.0, input_shape=(6, 3)), LSTM(5, return_sequences=True)])
    w, u, b = model.get_weights()
    want = numpy_lstm(masked, w, u, b, 5, np.any(masked != 0, axis=-1))
    errors["masked"] = np.abs(model.predict(masked) - want).max()

    model = Sequential([LSTM(8, input_shape=(6, 3), dropout=0.2, recurrent_dropout=0.2),
                        Dense(1)])
    model.compile("sgd", "mse")
    y = rng.standard_normal((4, 1)).astype("float32")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=20, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    print(json.dumps({"errors": {k: float(v) for k, v in errors.items()},
                      "loss": [float(before), float(after)]}))
""")


def test_recurrent_layers_match_numpy_and_train(tmp_path):
    result = run_keras(RECURRENT_SCRIPT, tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["errors"]) == {"lstm1", "lstm2", "gru1", "gru2", "simple_rnn1",
                                     "simple_rnn2", "masked"}
    for name, error in report["errors"].items():
        assert error < 1e-5, name
    before, after = report["loss"]
    assert after < before


INITIAL_WEIGHTS_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from keras.models import Sequential
    from keras.layers import Dense

    def initial_weights(seed):
        np.random.seed(seed)  # Keras's recipe for reproducible runs
        model = Sequential([Dense(8, input_shape=(4,)), Dense(3, kernel_initializer="he_normal")])
        return [w.tolist() for w in model.get_weights()]

    print(json.dumps([initial_weights(0), initial_weights(0), initial_weights(1)]))
""")


def test_initial_weights_follow_numpys_global_seed(tmp_path):
    result = run_keras(INITIAL_WEIGHTS_SCRIPT, tmp_path)
    first, again, other = json.loads(result.stdout.strip().splitlines()[-1])
    assert first == again
    assert first[0] != other[0] and first[2] != other[2]  # the kernels (the biases start at 0)
