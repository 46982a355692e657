"""Keras 2.2.5 loads numbackend (KERAS_BACKEND=numbackend) and runs a Dense model."""
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


def run_keras(script, tmp_path):
    env = dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(tmp_path))
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
