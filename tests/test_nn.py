"""numbackend.nn against independent NumPy formulas."""
import numpy as np
import pytest

import numbackend as K
from numbackend import core

TOL = {"float32": {"rtol": 2e-6, "atol": 1e-7}, "float64": {"rtol": 1e-12, "atol": 1e-15}}
XENT_TOL = {"float32": {"rtol": 1e-5, "atol": 1e-6}, "float64": {"rtol": 1e-12, "atol": 1e-14}}
EPS = 1e-7  # config.epsilon() by default


@pytest.fixture(autouse=True)
def learning_phase_not_fixed(monkeypatch):
    monkeypatch.setattr(core, "_fixed_learning_phase", None)


def run(outputs, feeds):
    """Compile a function of the placeholders in ``feeds`` and call it once."""
    placeholders = list(feeds)
    return K.function(placeholders, list(outputs))([feeds[p] for p in placeholders])


def data(shape, dtype, scale=3.0, seed=0):
    x = np.random.default_rng(seed).normal(scale=scale, size=shape)
    flat = x.reshape(-1)
    flat[:4] = [-60.0, -20.0, 20.0, 60.0]
    return x.astype(dtype)


# ---------------------------------------------------------------------------
# Activations


def np_relu(x, alpha=0.0, max_value=None, threshold=0.0):
    """Keras's definition: max_value above max_value, x from threshold up, alpha * (x - threshold) below."""
    top = np.inf if max_value is None else max_value
    return np.where(x >= top, top, np.where(x >= threshold, x, alpha * (x - threshold)))


def np_sigmoid(x):
    return np.exp(-np.logaddexp(0, -x))


ACTIVATIONS = {
    "relu": (K.relu, np_relu),
    "leaky_relu": (lambda x: K.relu(x, alpha=0.3), lambda x: np_relu(x, 0.3)),
    "relu_max": (lambda x: K.relu(x, max_value=1.5), lambda x: np_relu(x, max_value=1.5)),
    "relu6": (lambda x: K.relu(x, max_value=6), lambda x: np_relu(x, max_value=6)),
    "relu_threshold": (lambda x: K.relu(x, threshold=0.5), lambda x: np_relu(x, threshold=0.5)),
    "relu_alpha_max": (lambda x: K.relu(x, 0.2, 2.0), lambda x: np_relu(x, 0.2, 2.0)),
    "relu_all": (lambda x: K.relu(x, alpha=0.3, max_value=1.5, threshold=0.5),
                 lambda x: np_relu(x, 0.3, 1.5, 0.5)),
    "elu": (K.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
    "elu_alpha": (lambda x: K.elu(x, alpha=0.5),
                  lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0)))),
    "softplus": (K.softplus, lambda x: np.logaddexp(0, x)),
    "softsign": (K.softsign, lambda x: x / (1 + np.abs(x))),
    "sigmoid": (K.sigmoid, np_sigmoid),
    "hard_sigmoid": (K.hard_sigmoid,
                     lambda x: np.where(x < -2.5, 0.0, np.where(x > 2.5, 1.0, 0.2 * x + 0.5))),
    "tanh": (K.tanh, np.tanh),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activations(dtype):
    x = K.placeholder(ndim=2, dtype=dtype)
    names = list(ACTIVATIONS)
    f = K.function([x], [ACTIVATIONS[n][0](x) for n in names])
    for shape in [(13, 17), (1, 5)]:
        xv = data(shape, dtype)
        for name, got in zip(names, f([xv])):
            expected = ACTIVATIONS[name][1](xv.astype(np.float64))
            assert got.dtype == dtype and got.shape == shape, name
            np.testing.assert_allclose(got, expected, err_msg=name, **TOL[dtype])


def test_relu_keeps_keras_225_form_at_negative_threshold():
    # Keras 2.2.5 zeroes x <= threshold, then clips to [0, max_value] when max_value is set
    x = K.variable([-2.0, -0.5, 0.0, 0.5, 3.0])
    got = K.eval(K.relu(x, max_value=1.0, threshold=-1.0))
    np.testing.assert_array_equal(got, [0.0, 0.0, 0.0, 0.5, 1.0])


def test_activations_accept_arrays_and_int_tensors():
    got = K.eval(K.relu(np.array([-1.0, 2.0], "float32")))
    np.testing.assert_array_equal(got, [0.0, 2.0])
    got = K.eval(K.sigmoid(K.variable([0, 1], dtype="int32")))
    np.testing.assert_allclose(got, [0.5, 1 / (1 + np.exp(-1))], rtol=1e-6)


# ---------------------------------------------------------------------------
# Softmax


def np_softmax(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    x = x.astype(np.float64)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("dtype,shape,axis", [("float32", (6, 5), -1), ("float64", (6, 5), -1),
                                              ("float32", (2, 5, 3), 1),
                                              ("float32", (131, 9), -1)])  # rows in blocks
def test_softmax(dtype, shape, axis):
    x = K.placeholder(ndim=len(shape), dtype=dtype)
    xv = data(shape, dtype, scale=30.0)
    (got,) = run([K.softmax(x, axis=axis)], {x: xv})
    assert got.dtype == dtype
    np.testing.assert_allclose(got, np_softmax(xv, axis), **TOL[dtype])
    np.testing.assert_allclose(got.sum(axis=axis), 1.0, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 130])
def test_softmax_row_max_of_the_next_row_folded_into_the_loop(rows):
    # the kernel takes each row's shift (its max, NaN aside) while it computes exp of
    # the row before; rows at the edges of the blocks of rows (130 rows: 64 blocks of
    # 2 or 3) and special values there must give what a separate max gives, and
    # K.max of the same rows keeps NumPy's NaN rule
    x = K.placeholder((None, 7))
    fn = K.function([x], [K.softmax(x), K.max(x, axis=-1)])
    assert "rd.shift_maximum(" in fn.kernel_sources()[0]
    xv = data((rows, 7), "float32", scale=30.0)
    for r, value in [(0, np.inf), (1, -np.inf), (2, np.nan), (rows - 1, np.nan), (65, 1e30)]:
        if r < rows:
            xv[r, r % 7] = value
    if rows > 3:
        xv[3, :] = -np.inf
    got, peak = fn([xv])
    np.testing.assert_array_equal(peak, xv.max(-1))
    with np.errstate(all="ignore"):
        want = np_softmax(xv, -1)
    np.testing.assert_allclose(got, want, equal_nan=True, **TOL["float32"])


def test_softmax_rejects_bad_axis():
    with pytest.raises(ValueError, match="softmax"):
        K.softmax(K.placeholder((2, 3)), axis=2)


# ---------------------------------------------------------------------------
# Categorical cross-entropy


def extreme_logits(shape, seed=1):
    x = np.random.default_rng(seed).normal(scale=40.0, size=shape)
    x.reshape(-1)[:2] = [100.0, -100.0]
    return x


def one_hot(labels, classes):
    return np.eye(classes)[labels]


def test_categorical_crossentropy_of_probabilities():
    # TensorFlow backend: normalise, clip to [eps, 1 - eps], -sum(target * log)
    rng = np.random.default_rng(2)
    p = rng.uniform(0.0, 2.0, (7, 4)).astype("float32")
    p[0] = [0.0, 1.0, 0.0, 0.0]  # a zero probability is clipped
    t = rng.dirichlet(np.ones(4), 7).astype("float32")
    target, output = K.placeholder((None, 4)), K.placeholder((None, 4))
    (got,) = run([K.categorical_crossentropy(target, output)], {target: t, output: p})
    q = np.clip(p / p.sum(-1, keepdims=True), EPS, 1 - EPS)
    np.testing.assert_allclose(got, -(t * np.log(q)).sum(-1), rtol=1e-5)


def test_categorical_crossentropy_channels_first_probabilities():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5), (2, 3)).transpose(0, 2, 1)  # (2, 5, 3), classes on axis 1
    t = one_hot(rng.integers(0, 5, (2, 3)), 5).transpose(0, 2, 1)
    target, output = K.placeholder(ndim=3, dtype="float64"), K.placeholder(ndim=3, dtype="float64")
    (got,) = run([K.categorical_crossentropy(target, output, axis=1)], {target: t, output: p})
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, -(t * np.log(np.clip(p, EPS, 1 - EPS))).sum(1), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_categorical_crossentropy_stable_at_extreme_logits(dtype):
    z = extreme_logits((8, 5)).astype(dtype)
    t = one_hot(np.arange(8) % 5, 5).astype(dtype)
    t[1] = [0.1, 0.2, 0.3, 0.2, 0.2]
    target, logits = K.placeholder((None, 5), dtype=dtype), K.placeholder((None, 5), dtype=dtype)
    from_logits = K.categorical_crossentropy(target, logits, from_logits=True)
    from_softmax = K.categorical_crossentropy(target, K.softmax(logits))
    keras1_keywords = K.categorical_crossentropy(output=K.softmax(logits), target=target)
    results = run([from_logits, from_softmax, keras1_keywords], {target: t, logits: z})
    expected = -(t * np_log_softmax(z)).sum(-1)
    assert expected.max() > 100  # far beyond what clipping at epsilon allows
    for got in results:
        assert got.dtype == dtype and np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, **XENT_TOL[dtype])


def test_categorical_crossentropy_recognises_keras_softmax_form():
    # Keras builds softmax for rank >= 3 as exp(x - max) / sum(exp(x - max))
    z = extreme_logits((2, 3, 4))
    t = one_hot(np.array([[0, 1, 2], [3, 0, 1]]), 4)
    x, target = K.placeholder(ndim=3, dtype="float64"), K.placeholder(ndim=3, dtype="float64")
    e = K.exp(x - K.max(x, axis=-1, keepdims=True))
    probs = e / K.sum(e, axis=-1, keepdims=True)
    (got,) = run([K.categorical_crossentropy(target, probs)], {x: z, target: t})
    np.testing.assert_allclose(got, -(t * np_log_softmax(z)).sum(-1), rtol=1e-12)


def test_categorical_crossentropy_softmax_on_another_axis_is_not_shortcut():
    z = np.random.default_rng(4).normal(size=(3, 4))
    t = one_hot(np.array([0, 1, 3]), 4)
    x, target = K.placeholder((3, 4), dtype="float64"), K.placeholder((3, 4), dtype="float64")
    (got,) = run([K.categorical_crossentropy(target, K.softmax(x, axis=0))], {x: z, target: t})
    p = np_softmax(z, axis=0)
    q = np.clip(p / p.sum(-1, keepdims=True), EPS, 1 - EPS)
    np.testing.assert_allclose(got, -(t * np.log(q)).sum(-1), rtol=1e-12)


def test_crossentropy_rejects_bad_axis():
    t, o = K.placeholder((2, 3)), K.placeholder((2, 3))
    with pytest.raises(ValueError, match="channels axis"):
        K.categorical_crossentropy(t, o, axis=2)
    with pytest.raises(ValueError, match="channels axis"):
        K.sparse_categorical_crossentropy(t, o, axis=-2)


# ---------------------------------------------------------------------------
# Sparse categorical cross-entropy


def np_sparse_xent_of_logits(labels, z, axis=-1):
    log_p = np.moveaxis(np_log_softmax(z, axis), axis, -1)
    return -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]


def test_sparse_categorical_crossentropy_of_probabilities():
    # TensorFlow backend: the log of the clipped probabilities are the logits of a softmax
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(6), 9).astype("float32")
    p[0] = [1.0, 0, 0, 0, 0, 0]
    labels = rng.integers(0, 6, 9)
    labels[0] = 3
    target = K.placeholder((None, 1))  # Keras feeds float targets of shape (batch, 1)
    output = K.placeholder((None, 6))
    (got,) = run([K.sparse_categorical_crossentropy(target, output)],
                 {target: labels[:, None].astype("float32"), output: p})
    q = np.clip(p.astype(np.float64), EPS, 1 - EPS)
    expected = -np.log(q[np.arange(9), labels] / q.sum(-1))
    assert got.shape == (9,)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_categorical_crossentropy_stable_at_extreme_logits(dtype):
    z = extreme_logits((10, 7)).astype(dtype)
    labels = np.arange(10) % 7
    labels[0] = 1  # against the logit of -100... the row holds +100 too
    target, logits = K.placeholder((None,), dtype="int32"), K.placeholder((None, 7), dtype=dtype)
    outs = [K.sparse_categorical_crossentropy(target, logits, from_logits=True),
            K.sparse_categorical_crossentropy(target, K.softmax(logits))]
    results = run(outs, {target: labels, logits: z})
    expected = np_sparse_xent_of_logits(labels, z)
    assert expected.max() > 100
    for got in results:
        assert got.dtype == dtype and np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, **XENT_TOL[dtype])


def test_sparse_categorical_crossentropy_sequences_and_channels_first():
    rng = np.random.default_rng(6)
    z_last = rng.normal(scale=5.0, size=(2, 3, 4))
    labels = rng.integers(0, 4, (2, 3))
    z_first = z_last.transpose(0, 2, 1).copy()
    target = K.placeholder((None, 3), dtype="int64")
    x_last = K.placeholder((None, 3, 4), dtype="float64")
    x_first = K.placeholder((None, 4, 3), dtype="float64")
    outs = [K.sparse_categorical_crossentropy(target, x_last, from_logits=True),
            K.sparse_categorical_crossentropy(target, x_first, from_logits=True, axis=1),
            K.sparse_categorical_crossentropy(target, K.softmax(x_first, axis=1), axis=1)]
    results = run(outs, {target: labels, x_last: z_last, x_first: z_first})
    expected = np_sparse_xent_of_logits(labels, z_last)
    for got in results:
        assert got.shape == (2, 3)
        np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_sparse_categorical_crossentropy_flattened_targets():
    z = np.random.default_rng(7).normal(size=(2, 3, 4))
    labels = np.array([[1, 2, 3], [0, 1, 2]])
    target, x = K.placeholder((None,), dtype="int32"), K.placeholder((None, 3, 4), dtype="float64")
    (got,) = run([K.sparse_categorical_crossentropy(target, x, from_logits=True)],
                 {target: labels.reshape(-1), x: z})
    np.testing.assert_allclose(got, np_sparse_xent_of_logits(labels, z), rtol=1e-12)


def test_sparse_categorical_crossentropy_bad_label_is_nan():
    z = np.zeros((3, 4))
    target, x = K.placeholder((3,), dtype="int32"), K.placeholder((3, 4), dtype="float64")
    (got,) = run([K.sparse_categorical_crossentropy(target, x, from_logits=True)],
                 {target: np.array([1, 4, -1]), x: z})
    np.testing.assert_allclose(got[0], np.log(4))
    assert np.isnan(got[1:]).all()


# ---------------------------------------------------------------------------
# Binary cross-entropy


def test_binary_crossentropy_of_probabilities():
    rng = np.random.default_rng(8)
    p = rng.uniform(size=(5, 6)).astype("float32")
    p[0, :2] = [0.0, 1.0]  # clipped to [eps, 1 - eps]
    t = rng.uniform(size=(5, 6)).astype("float32")
    target, output = K.placeholder((None, 6)), K.placeholder((None, 6))
    (got,) = run([K.binary_crossentropy(target, output)], {target: t, output: p})
    q = np.clip(p, np.float32(EPS), np.float32(1 - EPS)).astype(np.float64)  # clipped in float32
    expected = -(t * np.log(q) + (1 - t) * np.log(1 - q))
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_binary_crossentropy_stable_at_extreme_logits(dtype):
    z = extreme_logits((4, 5)).astype(dtype)
    t = (np.random.default_rng(9).uniform(size=(4, 5)) > 0.5).astype(dtype)
    t[0, :2] = [0.0, 1.0]  # wrong by 100 logits each
    target, logits = K.placeholder((None, 5), dtype=dtype), K.placeholder((None, 5), dtype=dtype)
    outs = [K.binary_crossentropy(target, logits, from_logits=True),
            K.binary_crossentropy(target, K.sigmoid(logits)),
            K.binary_crossentropy(output=K.sigmoid(logits), target=target)]
    results = run(outs, {target: t, logits: z})
    z64 = z.astype(np.float64)
    expected = np.logaddexp(0, z64) - t * z64  # -t log s(z) - (1 - t) log(1 - s(z))
    assert expected.max() >= 100
    for got in results:
        assert got.dtype == dtype and np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, **XENT_TOL[dtype])


def test_crossentropy_gradients_through_softmax_and_sigmoid():
    # through the logits the gradients are softmax(z) - t and sigmoid(z) - t, even where
    # clipped probabilities would give zero
    z = extreme_logits((4, 5))
    t = one_hot(np.array([1, 0, 4, 2]), 5)
    logits, target = K.placeholder((4, 5), dtype="float64"), K.placeholder((4, 5), dtype="float64")
    categorical = K.sum(K.categorical_crossentropy(target, K.softmax(logits)))
    sparse = K.sum(K.sparse_categorical_crossentropy(K.argmax(target), K.softmax(logits)))
    binary = K.sum(K.binary_crossentropy(target, K.sigmoid(logits)))
    grads = [K.gradients(loss, [logits])[0] for loss in (categorical, sparse, binary)]
    got = run(grads, {logits: z, target: t})
    np.testing.assert_allclose(got[0], np_softmax(z) - t, atol=1e-12)
    np.testing.assert_allclose(got[1], np_softmax(z) - t, atol=1e-12)
    np.testing.assert_allclose(got[2], np_sigmoid(z) - t, atol=1e-12)


# ---------------------------------------------------------------------------
# Dropout


def test_dropout_statistics_and_scaling():
    x = K.placeholder((None, 500))
    f = K.function([x], [K.dropout(x, 0.3)])
    xv = np.random.default_rng(10).uniform(1.0, 2.0, (400, 500)).astype("float32")
    (first,) = f([xv])
    (second,) = f([xv])
    for out in (first, second):
        dropped = out == 0
        assert abs(dropped.mean() - 0.3) < 0.006
        np.testing.assert_array_equal(out[~dropped], xv[~dropped] / np.float32(0.7))
    assert ((first == 0) != (second == 0)).mean() > 0.3  # a fresh mask each call
    (small,) = f([xv[:7]])
    assert small.shape == (7, 500)


def test_dropout_seed_is_reproducible():
    x = K.placeholder((20, 30), dtype="float64")
    xv = np.ones((20, 30))
    a, b, c = run([K.dropout(x, 0.5, seed=42), K.dropout(x, 0.5, seed=42),
                   K.dropout(x, 0.5, seed=43)], {x: xv})
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    assert set(np.unique(a)) == {0.0, 2.0}


def test_dropout_noise_shape():
    x = K.placeholder((None, 8, 6))
    xv = np.ones((50, 8, 6), "float32")
    per_sample, per_channel = run([K.dropout(x, 0.5, noise_shape=(None, 1, 1)),
                                   K.dropout(x, 0.25, noise_shape=(50, 1, 6))], {x: xv})
    assert (per_sample == per_sample[:, :1, :1]).all()  # one decision per sample
    assert 0 < (per_sample[:, 0, 0] == 0).sum() < 50
    assert (per_channel == per_channel[:, :1, :]).all()
    assert set(np.unique(per_channel)) == {0.0, np.float32(1 / 0.75)}


def test_dropout_rejects_bad_level():
    x = K.placeholder((2, 3))
    for level in (1.0, -0.1):
        with pytest.raises(ValueError, match="level"):
            K.dropout(x, level)


# ---------------------------------------------------------------------------
# L2 normalisation


@pytest.mark.parametrize("axis", [None, -1, 0, [0, 2]])
def test_l2_normalize(axis):
    xv = data((3, 4, 5), "float64")
    xv[1, 2] = 0.0  # a zero vector stays zero
    x = K.placeholder((3, 4, 5), dtype="float64")
    (got,) = run([K.l2_normalize(x, axis=axis)], {x: xv})
    reduce_axes = None if axis is None else tuple(np.atleast_1d(axis))
    norm = np.sqrt(np.maximum((xv ** 2).sum(axis=reduce_axes, keepdims=True), 1e-12))
    np.testing.assert_allclose(got, xv / norm, rtol=1e-12)
    assert np.isfinite(got).all()


# ---------------------------------------------------------------------------
# Batch normalisation


def np_moments(x, axes):
    return x.mean(axis=axes), x.var(axis=axes)


@pytest.mark.parametrize("shape,axes,feature_axis", [((16, 5), [0], 1), ((4, 3, 3, 5), [0, 1, 2], 3),
                                                     ((4, 5, 3, 2), [0, 2, 3], 1)])
def test_normalize_batch_in_training(shape, axes, feature_axis):
    rng = np.random.default_rng(11)
    xv = rng.normal(2.0, 3.0, shape)
    gv, bv = rng.uniform(0.5, 2.0, shape[feature_axis]), rng.normal(size=shape[feature_axis])
    x = K.placeholder(shape, dtype="float64")
    gamma, beta = K.variable(gv, dtype="float64"), K.variable(bv, dtype="float64")
    normed, mean, var = K.normalize_batch_in_training(x, gamma, beta, axes)
    plain, _, _ = K.normalize_batch_in_training(x, None, None, axes, epsilon=1e-5)
    got_normed, got_mean, got_var, got_plain = run([normed, mean, var, plain], {x: xv})
    m, v = np_moments(xv, tuple(axes))
    np.testing.assert_allclose(got_mean, m, rtol=1e-12)
    np.testing.assert_allclose(got_var, v, rtol=1e-12)
    bshape = [1] * len(shape)
    bshape[feature_axis] = shape[feature_axis]
    m_b, v_b = m.reshape(bshape), v.reshape(bshape)
    expected = (xv - m_b) / np.sqrt(v_b + 1e-3) * gv.reshape(bshape) + bv.reshape(bshape)
    np.testing.assert_allclose(got_normed, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_plain, (xv - m_b) / np.sqrt(v_b + 1e-5), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batch_normalization_last_axis(dtype):
    rng = np.random.default_rng(12)
    xv = rng.normal(size=(6, 4)).astype(dtype)
    mv, vv = rng.normal(size=4).astype(dtype), rng.uniform(0, 2, 4).astype(dtype)
    bv, gv = rng.normal(size=4).astype(dtype), rng.normal(size=4).astype(dtype)
    vv[0] = 0.0  # epsilon defaults to 1e-3
    x = K.placeholder((None, 4), dtype=dtype)
    out = K.batch_normalization(x, K.variable(mv, dtype), K.variable(vv, dtype),
                                 K.variable(bv, dtype), K.variable(gv, dtype))
    (got,) = run([out], {x: xv})
    x64 = xv.astype(np.float64)
    expected = (x64 - mv) / np.sqrt(vv.astype(np.float64) + 1e-3) * gv + bv
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)


def test_batch_normalization_channels_first():
    rng = np.random.default_rng(13)
    xv = rng.normal(size=(2, 3, 4, 5))
    mv, vv, bv, gv = rng.normal(size=3), rng.uniform(0.1, 2, 3), rng.normal(size=3), rng.normal(size=3)
    x = K.placeholder((None, 3, 4, 5), dtype="float64")
    vec = [K.variable(v, dtype="float64") for v in (mv, vv, bv, gv)]
    col = [K.variable(v.reshape(1, 3, 1, 1), dtype="float64") for v in (mv, vv, bv, gv)]
    outs = [K.batch_normalization(x, *vec, axis=1, epsilon=1e-5),
            K.batch_normalization(x, *col, axis=1, epsilon=1e-5),
            K.batch_normalization(x, vec[0], vec[1], None, None, axis=1)]
    r = [v.reshape(1, 3, 1, 1) for v in (mv, vv, bv, gv)]
    got_vec, got_col, got_plain = run(outs, {x: xv})
    expected = (xv - r[0]) / np.sqrt(r[1] + 1e-5) * r[3] + r[2]
    np.testing.assert_allclose(got_vec, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_col, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_plain, (xv - r[0]) / np.sqrt(r[1] + 1e-3), rtol=1e-12)


def test_batch_normalization_rejects_keras1_positional_epsilon():
    x = K.placeholder((2, 3))
    with pytest.raises(TypeError, match="epsilon"):
        K.batch_normalization(x, 0.0, 1.0, 0.0, 1.0, 1e-4)


# ---------------------------------------------------------------------------
# switch and the learning phase


def test_switch_scalar_condition():
    cond = K.placeholder((), dtype="int32")
    a, b = K.placeholder((2, 3)), K.placeholder((2, 3))
    av, bv = np.ones((2, 3), "float32"), np.full((2, 3), 5.0, "float32")
    f = K.function([cond, a, b], [K.switch(cond, a, b), K.switch(cond, lambda: a * 2, lambda: b)])
    np.testing.assert_array_equal(f([1, av, bv]), [av, av * 2])
    np.testing.assert_array_equal(f([0, av, bv]), [bv, bv])


def test_switch_condition_selects_leading_axes():
    rng = np.random.default_rng(14)
    av, bv = rng.normal(size=(4, 3, 2)), rng.normal(size=(4, 3, 2))
    rows = np.array([True, False, False, True])
    cells = rng.uniform(size=(4, 3)) > 0.5
    a, b = K.placeholder((4, 3, 2), dtype="float64"), K.placeholder((4, 3, 2), dtype="float64")
    c1, c2 = K.placeholder((4,), dtype="bool"), K.placeholder((4, 3), dtype="bool")
    c3 = K.placeholder((4, 3, 2), dtype="float64")
    got = run([K.switch(c1, a, b), K.switch(c2, a, b), K.switch(c3, a, b)],
              {a: av, b: bv, c1: rows, c2: cells, c3: (av > 0).astype(np.float64)})
    np.testing.assert_array_equal(got[0], np.where(rows[:, None, None], av, bv))
    np.testing.assert_array_equal(got[1], np.where(cells[:, :, None], av, bv))
    np.testing.assert_array_equal(got[2], np.where(av > 0, av, bv))


def test_switch_rejects_condition_of_higher_rank():
    with pytest.raises(ValueError, match="Rank of `condition`"):
        K.switch(K.placeholder((2, 3), dtype="bool"), K.placeholder((2,)), K.placeholder((2,)))


def test_switch_python_condition_picks_a_branch():
    a, b = K.placeholder((2,)), K.placeholder((2,))
    assert K.switch(True, a, b) is a
    assert K.switch(0, lambda: a, lambda: b) is b


def test_in_train_phase_follows_the_fed_learning_phase():
    x = K.placeholder((3,))
    xv = np.arange(3, dtype="float32")
    train, test = K.in_train_phase(x * 2, x), K.in_test_phase(x * 2, x)
    assert train._uses_learning_phase and test._uses_learning_phase
    f = K.function([x, K.learning_phase()], [train, test])
    np.testing.assert_array_equal(f([xv, 1]), [xv * 2, xv])
    np.testing.assert_array_equal(f([xv, 0]), [xv, xv * 2])
    unfed = K.function([x], [train])  # the learning phase defaults to 0 (test)
    np.testing.assert_array_equal(unfed([xv])[0], xv)


def test_in_train_phase_with_explicit_training():
    x, alt = K.placeholder((3,)), K.placeholder((3,))
    assert K.in_train_phase(x, alt, training=1) is x
    assert K.in_train_phase(x, alt, training=True) is x
    assert K.in_train_phase(x, alt, training=0) is alt
    assert K.in_train_phase(lambda: x, lambda: alt, training=False) is alt
    assert K.in_test_phase(x, alt, training=1) is alt
    assert K.in_test_phase(x, alt, training=0) is x
    flag = K.placeholder((), dtype="bool")
    out = K.in_train_phase(x, alt, training=flag)
    assert not getattr(out, "_uses_learning_phase", False)
    xv, av = np.ones(3, "float32"), np.zeros(3, "float32")
    f = K.function([flag, x, alt], [out])
    np.testing.assert_array_equal(f([True, xv, av])[0], xv)
    np.testing.assert_array_equal(f([False, xv, av])[0], av)


def test_in_train_phase_with_fixed_learning_phase():
    x, alt = K.placeholder((3,)), K.placeholder((3,))
    calls = []
    K.set_learning_phase(1)
    assert K.in_train_phase(x, lambda: calls.append(1) or alt) is x
    assert K.in_test_phase(x, alt) is alt
    K.set_learning_phase(0)
    assert K.in_train_phase(x, alt) is alt
    assert K.in_test_phase(lambda: x, alt) is x
    assert calls == []  # the branch not taken is never built
