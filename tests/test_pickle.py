"""A compiled K.function pickles: unpickled, it is built again from its graph
(its kernels from the cache there), with copies of its variables."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


def test_a_dense_relu_function_round_trips():
    w0 = np.linspace(-1, 1, 12).reshape(4, 3)
    b0 = np.array([0.1, -0.2, 0.3])
    x = K.placeholder((None, 4))
    f = K.function([x], [K.relu(K.dot(x, K.variable(w0)) + K.variable(b0))])
    g = round_trip(f)
    a = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")
    want = np.maximum(a @ w0 + b0, 0)
    np.testing.assert_allclose(g([a])[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g([a])[0], f([a])[0])
    assert g([a[:1]])[0].shape == (1, 3)  # any batch size, as the original


def numpy_conv_relu_pool(a, w, b):
    """A valid 2-D convolution (NHWC), bias, ReLU and 2x2 max pooling, by their definitions."""
    n, h, wd, _ = a.shape
    kh, kw, _, c = w.shape
    conv = np.zeros((n, h - kh + 1, wd - kw + 1, c))
    for i in range(conv.shape[1]):
        for j in range(conv.shape[2]):
            conv[:, i, j] = np.einsum("nhwc,hwcd->nd", a[:, i:i + kh, j:j + kw], w)
    act = np.maximum(conv + b, 0)
    ph, pw = act.shape[1] // 2, act.shape[2] // 2
    return act[:, :2 * ph, :2 * pw].reshape(n, ph, 2, pw, 2, c).max(axis=(2, 4))


def test_a_conv_pool_function_round_trips():
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((3, 3, 2, 4)).astype("float32")
    b0 = rng.standard_normal(4).astype("float32")
    x = K.placeholder((None, 9, 9, 2))
    y = K.pool2d(K.relu(K.bias_add(K.conv2d(x, K.variable(w0)), K.variable(b0))), (2, 2), (2, 2))
    f = K.function([x], [y])
    g = round_trip(f)
    a = rng.standard_normal((3, 9, 9, 2)).astype("float32")
    np.testing.assert_allclose(g([a])[0], numpy_conv_relu_pool(a, w0, b0), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(g([a])[0], f([a])[0])


def lstm_weights(rng, d, units):
    return (rng.standard_normal((d, 4 * units)) * 0.5, rng.standard_normal((units, 4 * units)) * 0.5,
            rng.standard_normal(4 * units) * 0.1)


def numpy_lstm(a, w, u, b):
    """The last output of an LSTM over axis 1 of ``a`` (gates i, f, c, o), by its equations."""
    units = u.shape[0]
    h = c = np.zeros((a.shape[0], units))

    def sigmoid(z):
        return 1 / (1 + np.exp(-z))

    for t in range(a.shape[1]):
        z = a[:, t] @ w + h @ u + b
        i, f, g, o = (z[:, k * units:(k + 1) * units] for k in range(4))
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
    return h


def test_an_lstm_scan_function_round_trips():
    rng = np.random.default_rng(2)
    units, d = 5, 3
    w0, u0, b0 = lstm_weights(rng, d, units)
    w, u, b = K.variable(w0, "float64"), K.variable(u0, "float64"), K.variable(b0, "float64")

    def step(x_t, states):
        h, c = states
        z = K.dot(x_t, w) + K.dot(h, u) + b
        i, f, g, o = (z[:, k * units:(k + 1) * units] for k in range(4))
        c = K.sigmoid(f) * c + K.sigmoid(i) * K.tanh(g)
        h = K.sigmoid(o) * K.tanh(c)
        return h, [h, c]

    x = K.placeholder((None, 6, d), dtype="float64")
    zeros = K.zeros_like(K.dot(x[:, 0], K.zeros((d, units), "float64")))
    last = K.rnn(step, x, [zeros, zeros])[0]
    f = K.function([x], [last])
    a = rng.standard_normal((4, 6, d))
    f([a])  # the original has run: its compiled step and loop are not pickled
    g = round_trip(f)
    np.testing.assert_allclose(g([a])[0], numpy_lstm(a, w0, u0, b0), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(g([a])[0], f([a])[0])


def sgd_step(x_value, t_value, w_value, b_value, lr):
    """One SGD step on the mean squared error of x @ w + b, the gradient by hand."""
    residual = x_value @ w_value + b_value - t_value
    scale = 2 / residual.size
    return (w_value - lr * scale * x_value.T @ residual,
            b_value - lr * scale * residual.sum(axis=0))


def test_a_training_function_applies_its_updates_to_its_own_variables():
    rng = np.random.default_rng(3)
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    xa, ta = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))
    x, t = K.placeholder((None, 3), dtype="float64"), K.placeholder((None, 2), dtype="float64")
    w, b = K.variable(w0, "float64"), K.variable(b0, "float64")
    loss = K.mean(K.square(K.dot(x, w) + b - t))
    grad_w, grad_b = K.gradients(loss, [w, b])
    train = K.function([x, t], [loss], updates=[(w, w - 0.1 * grad_w), (b, b - 0.1 * grad_b)])
    copy = round_trip(train)
    copy([xa, ta])
    copy([xa, ta])
    np.testing.assert_array_equal(K.get_value(w), w0)  # the original's variables are untouched
    want_w, want_b = sgd_step(xa, ta, *sgd_step(xa, ta, w0, b0, 0.1), 0.1)
    copied_w = next(v for v in copy.update_vars if v.shape == (3, 2))
    np.testing.assert_allclose(K.get_value(copied_w), want_w, rtol=1e-12)
    train([xa, ta])  # and the original steps from its own values
    np.testing.assert_allclose(K.get_value(w), sgd_step(xa, ta, w0, b0, 0.1)[0], rtol=1e-12)
    np.testing.assert_allclose(K.get_value(copied_w), want_w, rtol=1e-12)
    np.testing.assert_allclose(copy([xa, ta])[0], np.mean((xa @ want_w + want_b - ta) ** 2),
                               rtol=1e-12)


def test_functions_pickled_together_share_their_copied_variables():
    x = K.placeholder((2,), dtype="float64")
    v = K.variable(np.array([1.0, 2.0]), "float64")
    add = K.function([x], [x], updates=[(v, v + x)])
    read = K.function([], [v * 10])
    add_copy, read_copy = round_trip((add, read))
    add_copy([np.array([0.5, 0.25])])
    np.testing.assert_array_equal(read_copy([])[0], [15.0, 22.5])
    np.testing.assert_array_equal(read([])[0], [10.0, 20.0])


def test_a_function_with_the_learning_phase_pickles_both_plans():
    x = K.placeholder((None, 2))
    f = K.function([x, K.learning_phase()], [K.in_train_phase(x * 3.0, x + 1.0)])
    a = np.array([[1.0, 2.0]], "float32")
    f([a, 0]), f([a, 1])  # each value's plan is built: its compiled code is not pickled
    g = round_trip(f)
    np.testing.assert_array_equal(g([a, 0])[0], a + 1)
    np.testing.assert_array_equal(g([a, 1])[0], a * 3)


def test_a_copy_draws_the_random_numbers_the_original_would_draw_next():
    x = K.placeholder((4,))
    f = K.function([x], [x + K.random_uniform((4,))])
    a = np.zeros(4, "float32")
    first = f([a])[0]
    copy = round_trip(f)
    following = f([a])[0]
    np.testing.assert_array_equal(copy([a])[0], following)
    assert not np.array_equal(first, following) and ((0 <= following) & (following < 1)).all()


def test_a_sparse_function_round_trips():
    sparse = pytest.importorskip("scipy.sparse")
    w0 = np.arange(6.0).reshape(3, 2) - 2
    s = K.placeholder((None, 3), sparse=True)
    g = round_trip(K.function([s], [K.dot(s, K.variable(w0))]))
    m = sparse.random(4, 3, density=0.5, format="csr", dtype="float32", random_state=0)
    np.testing.assert_allclose(g([m])[0], m.toarray() @ w0, rtol=1e-6)


def test_a_deep_graph_pickles_without_exceeding_the_recursion_limit():
    # pickling each node after its inputs keeps pickle from recursing along the chain
    angle = 0.01
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    x = K.placeholder((None, 2), dtype="float64")
    y, m = x, K.variable(turn, "float64")
    for _ in range(sys.getrecursionlimit()):
        y = K.dot(y, m)
    g = round_trip(K.function([x], [y]))
    a = np.array([[1.0, 0.0], [0.5, 2.0]])
    want = a @ np.linalg.matrix_power(turn, sys.getrecursionlimit())
    np.testing.assert_allclose(g([a])[0], want, rtol=1e-9)


def test_a_graph_holding_what_cannot_be_pickled_is_refused_by_name():
    x = K.placeholder((2,))
    v = K.variable(np.ones(2), name="clipped", constraint=lambda value: K.clip(value, 0, 1))
    f = K.function([x], [x + v])
    with pytest.raises(TypeError, match=r"node 'clipped.*lambda.*'constraint'.*cannot be pickled"):
        pickle.dumps(f)


def run_python(script, *args, env=None):
    """Runs ``script`` in a new interpreter with this tree first on the path; its stdout."""
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                            capture_output=True, text=True, check=False, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# Unpickles a function and its input from argv[1], saves its outputs to argv[2];
# says which modules it loaded that an unpickled function should not need.
PREDICT = """
    import pickle, sys
    import numpy as np
    with open(sys.argv[1], "rb") as file:
        function, inputs = pickle.load(file)
    np.save(sys.argv[2], function(inputs)[0])
    print(sorted(name for name in ("keras", "tensorflow") if name in sys.modules))
"""


def test_a_function_pickled_here_gives_the_same_outputs_in_a_new_process(tmp_path):
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal((6, 4)).astype("float32")
    x = K.placeholder((None, 6))
    f = K.function([x], [K.softmax(K.tanh(K.dot(x, K.variable(w0))))])
    a = rng.standard_normal((5, 6)).astype("float32")
    with open(tmp_path / "f.pkl", "wb") as file:
        pickle.dump((f, [a]), file)
    run_python(PREDICT, tmp_path / "f.pkl", tmp_path / "out.npy")
    got = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(got, f([a])[0])
    e = np.exp(np.tanh(a.astype("float64") @ w0))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5)


# Builds a Keras model (a Lambda layer holding a lambda among its layers),
# pickles its predict function and an input to argv[1], saves model.predict to argv[2].
KERAS_MODEL = """
    import pickle, sys
    import numpy as np
    import keras.backend as K
    from keras.layers import Conv2D, Dense, Dropout, Flatten, Lambda, MaxPooling2D
    from keras.models import Sequential

    model = Sequential([Conv2D(4, (3, 3), activation="relu", input_shape=(8, 8, 1)),
                        MaxPooling2D(), Dropout(0.5), Flatten(), Lambda(lambda t: t * 2.0),
                        Dense(3, activation="softmax")])
    predict = K.function(model.inputs + [K.learning_phase()], model.outputs)
    data = np.random.RandomState(0).rand(5, 8, 8, 1).astype("float32")
    with open(sys.argv[1], "wb") as file:
        pickle.dump((predict, [data, 0]), file)
    np.save(sys.argv[2], model.predict(data))
"""


def test_a_keras_predict_function_unpickles_without_keras(tmp_path):
    pytest.importorskip("keras")
    pickled, predicted, unpickled = tmp_path / "f.pkl", tmp_path / "keras.npy", tmp_path / "f.npy"
    run_python(KERAS_MODEL, pickled, predicted,
               env=dict(os.environ, KERAS_BACKEND="numbackend", KERAS_HOME=str(tmp_path)))
    assert run_python(PREDICT, pickled, unpickled).strip() == "[]"
    np.testing.assert_allclose(np.load(unpickled), np.load(predicted), rtol=1e-6, atol=1e-7)
