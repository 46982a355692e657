"""Training: an MLP written against the API (K.gradients, K.function with updates),
trained with plain SGD and with a hand-written Adam; and Keras 2.2.5 models fitted
with its own 'sgd' and 'adam' optimizers, run with KERAS_BACKEND=numbackend in a
subprocess (importing keras here would load its default backend).

The task is synthetic and seeded: three classes labelled by the largest of three
random linear scores of 10 features, keeping only points whose best score leads
the second by a margin, so that it is separable and a small MLP classifies held-out
points almost perfectly.
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

import numbackend as K

F32 = np.float32
SIZES = (10, 32, 3)


def separable_task(n, seed):
    """n points and their labels; the labelling is the same for every seed."""
    w = np.random.default_rng(0).standard_normal((SIZES[0], SIZES[-1]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8 * n, SIZES[0]))
    scores = np.sort(x @ w, axis=1)
    x = x[scores[:, -1] - scores[:, -2] > 0.5][:n]
    assert len(x) == n
    return x.astype(F32), np.argmax(x @ w, axis=1)


X_TRAIN, Y_TRAIN = separable_task(512, seed=1)
X_TEST, Y_TEST = separable_task(512, seed=2)


def initial_weights(seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for m, n in itertools.pairwise(SIZES):
        params += [(rng.standard_normal((m, n)) * np.sqrt(2.0 / m)).astype(F32), np.zeros(n, F32)]
    return params


def np_forward(params, x):
    """The logits, with the hidden activations (NumPy)."""
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0)
    return h @ w2 + b2, h


def np_gradients(params, x, labels):
    """The gradients of the mean softmax cross-entropy, by a hand-written backward pass."""
    w2 = params[2]
    z, h = np_forward(params, x)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = (p - np.eye(SIZES[-1])[labels]) / len(x)
    dh = (dz @ w2.T) * (h > 0)
    return [x.T @ dh, dh.sum(0), h.T @ dz, dz.sum(0)]


def accuracy(params, x, labels):
    return float(np.mean(np.argmax(np_forward(params, x)[0], axis=1) == labels))


class Mlp:
    """The model as a graph: variables, the loss of a batch and its gradients."""

    def __init__(self):
        self.params = [K.variable(p) for p in initial_weights()]
        w1, b1, w2, b2 = self.params
        self.x = K.placeholder((None, SIZES[0]))
        self.labels = K.placeholder((None,), dtype="int32")
        self.probabilities = K.softmax(K.dot(K.relu(K.dot(self.x, w1) + b1), w2) + b2)
        self.loss = K.mean(K.sparse_categorical_crossentropy(self.labels, self.probabilities))
        self.grads = K.gradients(self.loss, self.params)

    def values(self):
        return [K.get_value(p) for p in self.params]

    def fit(self, step, epochs, batch=64):
        """Runs ``step`` over shuffled mini-batches; returns the mean loss of each epoch."""
        rng = np.random.default_rng(2)
        history = []
        for _ in range(epochs):
            order = rng.permutation(len(X_TRAIN))
            losses = [step([X_TRAIN[i], Y_TRAIN[i]])[0]
                      for i in np.array_split(order, len(order) // batch)]
            history.append(float(np.mean(losses)))
        return history


def test_sgd_trains_an_mlp():
    model, lr = Mlp(), 0.2
    step = K.function([model.x, model.labels], [model.loss],
                      updates=[(p, p - lr * g) for p, g in zip(model.params, model.grads)])
    # the first step against NumPy's forward and backward pass (updates are computed from
    # the values before the call)
    before = model.values()
    step([X_TRAIN[:64], Y_TRAIN[:64]])
    grads = np_gradients(before, X_TRAIN[:64], Y_TRAIN[:64])
    for got, p, g in zip(model.values(), before, grads):
        np.testing.assert_allclose(got, p - lr * g, rtol=1e-4, atol=1e-6)
    history = model.fit(step, epochs=15)
    assert history[-1] < 0.25 * history[0], history
    assert accuracy(model.values(), X_TEST, Y_TEST) > 0.95
    # the compiled prediction agrees with NumPy's forward pass on the trained weights
    predict = K.function([model.x], [model.probabilities])
    z = np_forward(model.values(), X_TEST)[0]
    np.testing.assert_array_equal(np.argmax(predict([X_TEST])[0], axis=1), np.argmax(z, axis=1))


def adam_updates(params, grads, lr=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Adam (Kingma and Ba, Algorithm 1) with bias correction folded into the step size."""
    t = K.variable(0.0, name="iterations")
    t_next = t + 1.0
    lr_t = lr * K.sqrt(1.0 - K.pow(beta_2, t_next)) / (1.0 - K.pow(beta_1, t_next))
    updates = [(t, t_next)]
    for p, g in zip(params, grads):
        m = K.variable(np.zeros(K.int_shape(p), F32))
        v = K.variable(np.zeros(K.int_shape(p), F32))
        m_next = beta_1 * m + (1.0 - beta_1) * g
        v_next = beta_2 * v + (1.0 - beta_2) * K.square(g)
        updates += [(m, m_next), (v, v_next),
                    (p, p - lr_t * m_next / (K.sqrt(v_next) + epsilon))]
    return updates, t


def test_adam_trains_an_mlp():
    model = Mlp()
    updates, t = adam_updates(model.params, model.grads, lr=0.01)
    step = K.function([model.x, model.labels], [model.loss], updates=updates)
    # the first step against NumPy: m = 0.1 g, v = 0.001 g^2 and the bias-corrected step size
    before = model.values()
    step([X_TRAIN[:64], Y_TRAIN[:64]])
    lr_1 = 0.01 * np.sqrt(1 - 0.999) / (1 - 0.9)
    for got, p, g in zip(model.values(), before, np_gradients(before, X_TRAIN[:64], Y_TRAIN[:64])):
        want = p - lr_1 * (0.1 * g) / (np.sqrt(0.001 * g * g) + 1e-7)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    history = model.fit(step, epochs=8)
    assert K.get_value(t) == 1 + 8 * (len(X_TRAIN) // 64)
    assert history[-1] < 0.25 * history[0], history
    assert accuracy(model.values(), X_TEST, Y_TEST) > 0.95


# ---------------------------------------------------------------------------
# Keras 2.2.5

KERAS_FIT = textwrap.dedent("""
    import json
    import numpy as np
    from keras import backend as K
    from keras.models import Sequential
    from keras.layers import Dense, Dropout

    assert K.backend() == "numbackend", K.backend()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 1024)
    x = (rng.standard_normal((3, 20))[labels] + rng.standard_normal((1024, 20))).astype("float32")
    y = np.eye(3, dtype="float32")[labels]
    report = {}
    for optimizer in ("sgd", "adam"):
        model = Sequential([Dense(32, activation="relu", input_shape=(20,)), Dropout(0.2),
                            Dense(32, activation="relu"), Dropout(0.2),
                            Dense(3, activation="softmax")])
        model.compile(optimizer=optimizer, loss="categorical_crossentropy", metrics=["accuracy"])
        history = model.fit(x, y, batch_size=32, epochs=6, verbose=0)
        loss, acc = model.evaluate(x, y, batch_size=256, verbose=0)
        report[optimizer] = {"history": [float(v) for v in history.history["loss"]],
                             "loss": float(loss), "accuracy": float(acc)}
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def keras_report(tmp_path_factory):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras 2.2.5 comes with the test extra")
    env = dict(os.environ, KERAS_BACKEND="numbackend",
               KERAS_HOME=str(tmp_path_factory.mktemp("keras-home")))
    result = subprocess.run([sys.executable, "-c", KERAS_FIT], env=env, capture_output=True,
                            text=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_keras_sequential_fits(keras_report, optimizer):
    report = keras_report[optimizer]
    history = report["history"]
    assert all(np.isfinite(history)), history
    assert history[-1] < 0.6 * history[0], history
    assert report["loss"] < 0.6 * history[0] and report["accuracy"] > 0.85, report


# ---------------------------------------------------------------------------
# What K.update and its kin return: evaluating it applies the update, once


def test_eval_of_an_update_applies_it_once_and_gives_the_new_value():
    v = K.variable(1.0)
    added = K.update_add(v, 2.0)
    assert K.eval(added) == 3.0 and K.get_value(v) == 3.0
    assert K.eval(added) == 5.0 and K.get_value(v) == 5.0
    w = K.variable(np.arange(3.0), dtype="float64")
    for update, expected in [(K.update_sub(w, 1.0), np.arange(3.0) - 1),
                             (K.update(w, np.ones(3)), np.ones(3)),
                             (K.moving_average_update(w, np.full(3, 3.0), 0.75), 0.75 + 0.25 * 3)]:
        np.testing.assert_array_equal(K.eval(update), expected)
        np.testing.assert_array_equal(K.get_value(w), expected)


def test_an_update_among_a_functions_outputs_is_applied_once_per_call():
    v = K.variable(np.zeros(3), dtype="float64")
    x = K.placeholder((3,), dtype="float64")
    added = K.update_add(v, x)
    # read twice among the outputs and passed as an update too: still one addition a call
    f = K.function([x], [added, added * 2.0, v], updates=[added])
    step = np.array([1.0, 2.0, 3.0])
    for n in range(1, 4):
        new, doubled, before = f([step])
        np.testing.assert_array_equal(new, n * step)
        np.testing.assert_array_equal(doubled, 2 * n * step)
        np.testing.assert_array_equal(before, (n - 1) * step)  # read before the call's updates
        np.testing.assert_array_equal(K.get_value(v), n * step)
        new[:] = -1  # the caller's array: the variable keeps its value
        np.testing.assert_array_equal(K.get_value(v), n * step)
    g = K.function([x], [K.update_add(v, x)])  # an output only, no updates given
    np.testing.assert_array_equal(g([step])[0], 4 * step)
    np.testing.assert_array_equal(K.get_value(v), 4 * step)


def test_updates_given_as_keras_does_are_applied_once_per_call():
    counter = K.variable(0.0)
    total = K.variable(np.zeros(2), dtype="float64")
    x = K.placeholder((2,), dtype="float64")
    f = K.function([x], [x * 1.0], updates=[K.update_add(counter, 1.0), K.update_add(total, x)])
    for n in range(1, 4):
        f([np.array([1.0, 2.0])])
        assert K.get_value(counter) == n
        np.testing.assert_array_equal(K.get_value(total), n * np.array([1.0, 2.0]))
    # an update's new value used in another update's: that update is applied too
    v, w = K.variable(0.0), K.variable(1.0)
    K.function([], [], updates=[(v, K.update_add(w, 1.0) * 10.0)])([])
    assert K.get_value(w) == 2.0 and K.get_value(v) == 20.0


def test_an_update_of_a_known_wrong_shape_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match=r"update: variable .* has shape \(3,\), the new value shape \(2,\)"):
        K.update(K.variable(np.zeros(3)), np.zeros(2))
