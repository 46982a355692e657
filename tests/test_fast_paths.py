"""Ops Keras inserts on the way (K.identity where a layer returns its input,
K.in_train_phase / K.switch on the learning phase) cost no step of a plan and
keep a function on its fast paths: fused kernels and the whole compiled call."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K
from tests.kernel_helpers import needs_blas


def test_identity_inside_an_elementwise_chain_fuses():
    x = K.placeholder((None, 5))
    y = K.exp(K.identity(x * 2.0) - 1.0) + K.identity(x)
    f = K.function([x], [y])
    assert [s.kind for s in f.plan.steps] == ["kernel"]
    assert "identity" not in K.explain(f)
    a = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_allclose(f([a])[0], np.exp(a * 2 - 1) + a, rtol=1e-6)


def test_identity_of_an_input_or_a_variable_is_a_copy():
    x = K.placeholder((2, 3), dtype="float64")
    v = K.variable(np.arange(6.0).reshape(2, 3), dtype="float64")
    y = x * 3.0
    f = K.function([x], [K.identity(x), K.identity(v), y, K.identity(y),
                         K.identity(K.reshape(x, (3, 2)))])
    a = np.ones((2, 3))
    for _ in range(3):
        same_x, same_v, tripled, tripled_again, reshaped = f([a])
        np.testing.assert_array_equal(same_x, np.ones((2, 3)))
        np.testing.assert_array_equal(same_v, np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(tripled_again, np.full((2, 3), 3.0))
        same_x[:] = same_v[:] = tripled_again[:] = reshaped[:] = -1
        np.testing.assert_array_equal(a, np.ones((2, 3)))
        np.testing.assert_array_equal(K.get_value(v), np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(tripled, np.full((2, 3), 3.0))  # a result of its own


@needs_blas
def test_identity_results_are_copies_in_the_whole_call_too(plan_runs):
    x = K.placeholder((None, 3), dtype="float64")
    v = K.variable(np.eye(3), dtype="float64")
    h = K.dot(x, v)
    f = K.function([x], [K.identity(x), K.identity(v), h, K.identity(h)])
    runs = plan_runs(f)
    a = np.arange(6.0).reshape(2, 3)
    for _ in range(4):
        same_x, same_v, product, product_again = f([a])
        np.testing.assert_array_equal(product_again, np.arange(6.0).reshape(2, 3))
        same_x[:] = same_v[:] = product_again[:] = -1
        np.testing.assert_array_equal(a, np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(K.get_value(v), np.eye(3))
        np.testing.assert_array_equal(product, np.arange(6.0).reshape(2, 3))
    assert runs[0] == 1 and f.whole_call


def _dropout_chain(rate=0.5):
    x = K.placeholder((None, 4))
    w = K.variable(np.linspace(-1, 1, 12).reshape(4, 3))
    h = K.relu(K.dot(x, w) + 0.25)
    return x, w, K.softmax(K.in_train_phase(K.dropout(h, rate), h))


def _forward(a, w, keep=None, rate=0.5):
    h = np.maximum(a @ w + 0.25, 0)
    if keep is not None:
        h = np.where(keep, h / (1 - rate), 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@needs_blas
def test_the_test_phase_drops_the_dropout_branch(plan_runs):
    x, w, y = _dropout_chain()
    f = K.function([x, K.learning_phase()], [y])
    runs = plan_runs(f)
    a = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    for _ in range(4):
        np.testing.assert_allclose(f([a, 0.0])[0], _forward(a, K.get_value(w)), rtol=1e-6)
    text = K.explain(f)
    assert "random" not in text and "where" not in text and "not_equal" not in text
    assert runs[0] == 1 and f.whole_call


def test_the_training_phase_keeps_dropout_and_drops_the_switch():
    x, w, y = _dropout_chain()
    f = K.function([x, K.learning_phase()], [y])
    a = np.linspace(-1, 1, 4000, dtype=np.float32).reshape(1000, 4)
    wv = K.get_value(w)
    train = f([a, 1])[0]
    # each value of h is either dropped or scaled: the softmax of one of the
    # 2**3 masks of its row, which the brute force below finds
    masks = np.array([[i >> j & 1 for j in range(3)] for i in range(8)], dtype=bool)
    candidates = np.stack([_forward(a, wv, np.broadcast_to(m, (1000, 3))) for m in masks])
    errors = np.abs(candidates - train).max(axis=2)
    assert (errors.min(axis=0) < 1e-6).all()
    used = errors.argmin(axis=0)
    assert 2 <= len(set(used.tolist())) <= 8  # the masks differ from row to row
    assert K.explain(f).count("where") == 1  # the dropout's own; the switch is gone
    assert [s.label for s in f.plan.steps].count("random_shaped") == 1
    np.testing.assert_allclose(f([a, 0])[0], _forward(a, wv), rtol=1e-6)
    np.testing.assert_allclose(f([a, 1.0])[0].sum(axis=1), 1, rtol=1e-6)


def test_a_learning_phase_not_fed_is_the_test_phase():
    x, w, y = _dropout_chain()
    f = K.function([x], [y])  # the learning phase at its default, 0
    a = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(f([a])[0], _forward(a, K.get_value(w)), rtol=1e-6)
    assert "random" not in K.explain(f)
    np.testing.assert_allclose(K.eval(K.in_train_phase(K.constant(2.0), K.constant(3.0))), 3.0)


def test_a_switch_on_the_phase_inside_a_recurrence_follows_the_value_fed():
    x = K.placeholder((2, 3, 4))

    def step(inputs, states):
        out = K.in_train_phase(inputs * 2.0, inputs) + states[0]
        return out, [out]
    last, _, _ = K.rnn(step, x, [K.zeros((2, 4))])
    f = K.function([x, K.learning_phase()], [last])
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for phase in (1, 0, 1):
        np.testing.assert_allclose(f([a, phase])[0], a.sum(axis=1) * (2 if phase else 1),
                                   rtol=1e-6)


def test_the_branch_a_phase_picks_is_the_callers_copy():
    x = K.placeholder((2, 3))
    v = K.variable(np.ones((2, 3)))
    f = K.function([x, K.learning_phase()], [K.in_train_phase(x, v)])
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    for phase, want in ((1, a.copy()), (0, np.ones((2, 3))), (1, a.copy())):
        result = f([a, phase])[0]
        np.testing.assert_array_equal(result, want)
        result[:] = -7
        np.testing.assert_array_equal(a, np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(K.get_value(v), np.ones((2, 3)))


# --- Keras 2.2.5's own models ----------------------------------------------------

KERAS_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from keras import backend as K
    from keras.layers import Activation, Dense, Dropout, Flatten
    from keras.models import Sequential
    import numbackend
    from numbackend.graph import toposort
    np.random.seed(0)
    model = Sequential([Flatten(input_shape=(4, 2)), Dense(16, activation="relu"), Dropout(0.5),
                        Activation("linear"), Dense(5, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy")
    x = np.random.rand(1, 4, 2).astype("float32")
    first = model.predict(x)
    for _ in range(4):
        np.testing.assert_array_equal(model.predict(x), first)
    f = model.predict_function
    plan = numbackend.explain(f)

    w1, b1, w2, b2 = model.get_weights()
    z = np.maximum(x.reshape(1, 8) @ w1 + b1, 0) @ w2 + b2
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()

    # a training step reads the learning phase as 1: the dropout stays, the switch goes
    loss = float(model.train_on_batch(x, np.eye(5, dtype="float32")[[2]]))
    train_plan = numbackend.explain(model.train_function)

    def reads_the_phase(fn):
        return any(n is K.learning_phase() for n in toposort(fn.plan.targets))
    print(json.dumps({"one_call": bool(f.whole_call), "plan": plan,
                      "inputs": [p.name for p in f.inputs],
                      "max_error": float(np.abs(first - want).max()),
                      "predict_reads_the_phase": reads_the_phase(f),
                      "train_reads_the_phase": reads_the_phase(model.train_function),
                      "train_plan": train_plan, "loss": loss}))
""")


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras 2.2.5")
@needs_blas
def test_a_keras_model_with_dropout_predicts_as_one_call(tmp_path):
    """Keras feeds the learning phase (0. to predict): the predict function's plan
    for 0 draws no dropout mask and runs as one call; its Activation('linear'),
    which returns its input, costs no step (Keras wraps it in K.identity)."""
    env = dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(tmp_path),
               NUMBACKEND_TUNE_ONE_CALL_AFTER="2")
    result = subprocess.run([sys.executable, "-c", KERAS_SCRIPT], env=env, capture_output=True,
                            text=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "keras_learning_phase" in report["inputs"]  # fed 0 by predict
    for op in ("random", "where", "identity", "not_equal"):
        assert op not in report["plan"], report["plan"]
    assert report["one_call"], report["plan"]
    assert report["max_error"] < 1e-6
    assert not report["predict_reads_the_phase"] and not report["train_reads_the_phase"]
    steps = report["train_plan"].splitlines()
    assert sum("random_" in step for step in steps) == 1 and "identity" not in report["train_plan"]
    assert np.isfinite(report["loss"])


def test_python_numbers_fed_to_scalar_inputs():
    """Keras feeds the learning phase as a Python float: a whole float is taken
    for an integer input, a fractional one is refused, ints fill float inputs."""
    n = K.placeholder((), dtype="int32")
    s = K.placeholder((), dtype="float32")
    f = K.function([n, s, K.learning_phase()], [n * 2, s + 0.5, K.cast(K.learning_phase(), "int32")])
    for fed, want in (([3, 2, 1.0], [6, 2.5, 1]), ([3.0, 2.25, 0], [6, 2.75, 0]),
                      ([np.int64(-4), np.float64(1), np.uint8(1)], [-8, 1.5, 1])):
        got = f(fed)
        assert [g.dtype for g in got] == [np.int32, np.float32, np.int32]
        assert [g.item() for g in got] == want
    for fed in ([2.5, 0.0, 0], [1, 0.0, 0.5]):
        with pytest.raises(TypeError, match="cannot cast a float64"):
            f(fed)
