"""Keras 2.2.5 models with sparse inputs (``Input(sparse=True)``) on numbackend."""
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

# Importing keras here would load its default (TensorFlow) backend: only look for it.
if importlib.util.find_spec("keras") is None:
    pytest.skip("Keras 2.2.5 comes with the test extra", allow_module_level=True)


def run_keras(script, tmp_path):
    env = dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_dense_layers_on_a_sparse_input_fit_as_on_its_dense_array(tmp_path):
    script = textwrap.dedent("""
        import json
        import numpy as np
        import scipy.sparse as sparse
        from keras.layers import Dense, Dropout, Input, InputLayer
        from keras.models import Model, Sequential
        from keras.optimizers import SGD

        rng = np.random.default_rng(0)
        x = sparse.random(12, 6, density=0.3, format="csr", random_state=0, dtype=np.float32)
        y = rng.standard_normal((12, 3)).astype("float32")

        def functional(is_sparse):
            inputs = Input(shape=(6,), sparse=is_sparse)
            outputs = Dense(3)(Dense(5, activation="tanh")(inputs))
            return Model(inputs, outputs)

        def sequential(is_sparse):
            return Sequential([InputLayer(input_shape=(6,), sparse=is_sparse),
                               Dense(5, activation="tanh"), Dense(3)])

        report = {}
        for kind, make in (("functional", functional), ("sequential", sequential)):
            on_sparse, on_dense = make(True), make(False)
            weights = [rng.standard_normal(w.shape).astype("float32")
                       for w in on_sparse.get_weights()]
            on_sparse.set_weights(weights)
            on_dense.set_weights(weights)
            w1, b1, w2, b2 = weights
            numpy_prediction = np.tanh(x.toarray() @ w1 + b1) @ w2 + b2
            report[kind + "_predict"] = float(np.abs(
                on_sparse.predict(x, batch_size=5) - numpy_prediction).max())
            for model in (on_sparse, on_dense):
                model.compile(SGD(0.1), "mse")
            on_sparse.fit(x, y, epochs=3, batch_size=4, shuffle=False, verbose=0)
            on_dense.fit(x.toarray(), y, epochs=3, batch_size=4, shuffle=False, verbose=0)
            trained = on_sparse.get_weights()
            report[kind + "_moved"] = float(min(np.abs(a - b).max()
                                                for a, b in zip(trained, weights)))
            report[kind + "_weights"] = float(max(np.abs(a - b).max() for a, b in
                                                  zip(trained, on_dense.get_weights())))
            report[kind + "_after_fit"] = float(np.abs(
                on_sparse.predict(x) - on_dense.predict(x.toarray())).max())

        # Keras's test_sparse_placeholder_fit: a sparse input beside a dense one, sparse
        # targets (which Keras makes dense), a validation split and evaluate
        inputs = [sparse.random(6, 3, density=0.25, random_state=i).tocsr() for i in range(2)]
        targets = [sparse.random(6, n, density=0.25, random_state=n).tocsr() for n in (3, 4)]
        in1, in2 = Input(shape=(3,)), Input(shape=(3,), sparse=True)
        model = Model([in1, in2], [Dropout(0.5)(in1), Dense(4)(in2)])
        model.predict(inputs, batch_size=2)
        model.compile("rmsprop", "mse")
        model.fit(inputs, targets, epochs=1, batch_size=2, validation_split=0.5, verbose=0)
        report["evaluate"] = [float(v) for v in model.evaluate(inputs, targets, batch_size=2,
                                                                verbose=0)]
        print(json.dumps(report))
    """)
    report = run_keras(script, tmp_path)
    for kind in ("functional", "sequential"):
        assert report[kind + "_predict"] < 1e-5
        assert report[kind + "_moved"] > 1e-4  # every weight trained
        assert report[kind + "_weights"] < 1e-5
        assert report[kind + "_after_fit"] < 1e-5
    assert len(report["evaluate"]) == 3
    assert all(math.isfinite(v) and v >= 0 for v in report["evaluate"])
