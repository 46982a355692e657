"""numbackend.math (through the flat ``import numbackend as K`` API) against
independent NumPy formulas.

Inputs are placeholders with an unknown batch axis, so element-wise chains run
through generated kernels rather than the NumPy path used for tiny constant
graphs.  Cases that share an expression structure share its compiled kernel.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp as scipy_logsumexp

import numbackend as K
from numbackend import ops
from tests.finite_differences import numeric_gradient

RNG = np.random.default_rng(1234)


def placeholder_for(value, batch_unknown=True):
    """A placeholder for ``value``; the first axis of a value of rank >= 2 is unknown
    unless told otherwise."""
    shape = tuple(value.shape)
    if batch_unknown and len(shape) >= 2:
        shape = (None,) + shape[1:]
    return K.placeholder(shape, dtype=value.dtype.name)


def run(fn, *values, batch_unknown=True):
    """fn applied to placeholders for ``values``, compiled and run on them."""
    inputs = [placeholder_for(v, batch_unknown) for v in values]
    return K.function(inputs, [fn(*inputs)])(list(values))[0]


def tolerance(dtype):
    return {"rtol": 2e-6, "atol": 1e-6} if np.dtype(dtype) == np.float32 else {
        "rtol": 1e-12, "atol": 1e-12}


def sample(shape, dtype, low=-3.0, high=3.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return RNG.random(shape) < 0.5
    return RNG.uniform(low, high, size=shape).astype(dtype)


# ---------------------------------------------------------------------------
# Element-wise

UNARY = {
    "abs": (K.abs, np.abs),
    "square": (K.square, np.square),
    "sqrt": (K.sqrt, lambda x: np.sqrt(np.maximum(x, 0))),
    "exp": (K.exp, np.exp),
    "log": (K.log, np.log),
    "round": (K.round, np.rint),
    "sign": (K.sign, np.sign),
    "sin": (K.sin, np.sin),
    "cos": (K.cos, np.cos),
}
FLOAT_RESULT = {"sqrt", "exp", "log", "round", "sin", "cos"}


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    fn, reference = UNARY[name]
    x = sample((6, 5), dtype)
    if dtype != "int32":
        x[0, :5] = [-2.5, -0.5, 0.5, 1.5, 2.5]  # ties round to even
        x[1, :2] = [0.0, -0.0]
    out = run(fn, x)
    expected_dtype = "float32" if dtype == "int32" and name in FLOAT_RESULT else dtype
    assert out.dtype == expected_dtype
    with np.errstate(all="ignore"):
        expected = reference(x.astype(np.float64))
    np.testing.assert_allclose(out, expected, equal_nan=True, **tolerance(out.dtype))


def test_sqrt_clips_negatives_to_zero_and_keeps_nan():
    x = np.array([[-4.0, -0.0, 0.0, 2.25, np.nan, np.inf]], np.float32)
    np.testing.assert_array_equal(run(K.sqrt, x), [[0, 0, 0, 1.5, np.nan, np.inf]])


BINARY = {
    "maximum": (K.maximum, np.maximum),
    "minimum": (K.minimum, np.minimum),
    "equal": (K.equal, np.equal),
    "not_equal": (K.not_equal, np.not_equal),
    "greater": (K.greater, np.greater),
    "greater_equal": (K.greater_equal, np.greater_equal),
    "less": (K.less, np.less),
    "less_equal": (K.less_equal, np.less_equal),
    "lesser": (K.lesser, np.less),
    "lesser_equal": (K.lesser_equal, np.less_equal),
}


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasts_a_row(name, dtype):
    fn, reference = BINARY[name]
    x = sample((5, 4), dtype)
    y = sample((4,), dtype)
    x[0] = y  # ties, where the comparisons differ from each other
    out = run(fn, x, y)
    expected = reference(x, y)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("x_shape, y_shape", [((5, 1), (1, 4)), ((5, 4), ()), ((2, 5, 4), (5, 1))])
def test_binary_broadcasting_shapes(x_shape, y_shape):
    x = sample(x_shape, "float64")
    y = sample(y_shape, "float64")
    xp = placeholder_for(x)
    yp = K.placeholder(y_shape, dtype="float64")
    f = K.function([xp, yp], [K.maximum(xp, yp), K.greater(xp, yp)])
    out_max, out_greater = f([x, y])
    np.testing.assert_array_equal(out_max, np.maximum(x, y))
    np.testing.assert_array_equal(out_greater, np.greater(x, y))


def test_binary_with_python_scalars_keeps_tensor_dtype():
    x = sample((5, 4), "float64")
    out = run(lambda t: K.minimum(K.maximum(t, 0), 2), x)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.minimum(np.maximum(x, 0), 2))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow(dtype):
    x = sample((5, 4), dtype, 0.1, 3.0)
    y = sample((4,), dtype, -2.0, 2.0)
    out = run(K.pow, x, y)
    np.testing.assert_allclose(out, np.power(x.astype(np.float64), y),
                               rtol=1e-5 if dtype == "float32" else 1e-12)


def test_pow_with_python_exponent_and_negative_base():
    x = np.array([[-2.0, -0.5, 0.0, 3.0]] * 5, np.float32)
    np.testing.assert_allclose(run(lambda t: K.pow(t, 2), x), x ** 2, rtol=1e-6)
    np.testing.assert_allclose(run(lambda t: K.pow(t, 3), x), x ** 3, rtol=1e-6)


CLIP_CASES = [
    (-1.0, 1.5, lambda x: np.minimum(np.maximum(x, -1.0), 1.5)),
    (None, 0.5, lambda x: np.minimum(x, 0.5)),
    (0.5, None, lambda x: np.maximum(x, 0.5)),
    (2.0, -1.0, lambda x: np.where(np.isnan(x), x, 2.0)),  # max < min: max becomes min
]


@pytest.mark.parametrize("low, high, reference", CLIP_CASES)
def test_clip(low, high, reference):
    x = sample((5, 4), "float32")
    x[0, 0] = np.nan
    np.testing.assert_array_equal(run(lambda t: K.clip(t, low, high), x), reference(x))


def test_clip_with_tensor_bounds_and_integers():
    x = sample((5, 4), "float64")
    low = np.full((4,), -0.5)
    high = np.linspace(0, 2, 4)
    out = run(K.clip, x, low, high, batch_unknown=False)
    np.testing.assert_array_equal(out, np.minimum(np.maximum(x, low), high))
    xi = sample((5, 4), "int32", -9, 9)
    out = run(lambda t: K.clip(t, -2, 3), xi)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.minimum(np.maximum(xi, -2), 3))


@pytest.mark.parametrize("axis, keepdims", [(None, False), (-1, False), (-1, True), ([0, 2], False),
                                            (1, True)])
def test_logsumexp(axis, keepdims):
    x = sample((3, 4, 5), "float64", -5, 5)
    x[0, 0, :] = [1000.0, 999.0, -1000.0, 0.0, 1.0]  # exp overflows without the shift
    expected = scipy_logsumexp(x, axis=tuple(axis) if isinstance(axis, list) else axis,
                               keepdims=keepdims)
    np.testing.assert_allclose(run(lambda t: K.logsumexp(t, axis, keepdims), x), expected,
                               rtol=1e-12)


def test_logsumexp_infinities():
    x = np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0], [-np.inf, 0.0, 0.0]])
    out = run(lambda t: K.logsumexp(t, axis=1), x)
    np.testing.assert_allclose(out, [-np.inf, np.inf, np.log(2.0)])


# ---------------------------------------------------------------------------
# Reductions

REDUCTIONS = {
    "max": (K.max, np.max),
    "min": (K.min, np.min),
    "sum": (K.sum, np.sum),
    "prod": (K.prod, np.prod),
    "mean": (K.mean, np.mean),
    "var": (K.var, lambda x, axis, keepdims: np.mean(
        (x - np.mean(x, axis=axis, keepdims=True)) ** 2, axis=axis, keepdims=keepdims)),
    "std": (K.std, lambda x, axis, keepdims: np.sqrt(np.mean(
        (x - np.mean(x, axis=axis, keepdims=True)) ** 2, axis=axis, keepdims=keepdims))),
    "any": (K.any, np.any),
    "all": (K.all, np.all),
}
AXES = [(None, False), (None, True), (-1, False), (-1, True), (1, False), ([0, 2], True),
        ((-2, -1), False)]


@pytest.mark.parametrize("axis, keepdims", AXES)
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_float32(name, axis, keepdims):
    fn, reference = REDUCTIONS[name]
    x = sample((3, 4, 5), "float32", 0.5, 1.5)
    if name in ("any", "all"):
        x[0, 1, :] = 0
        x[1, :, 2] = 0
    out = run(lambda t: fn(t, axis=axis, keepdims=keepdims), x)
    np_axis = tuple(axis) if isinstance(axis, (list, tuple)) else axis
    expected = reference(x.astype(np.float64), axis=np_axis, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    if name in ("any", "all"):
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out, expected)
    else:
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "float64", "bool"])
@pytest.mark.parametrize("name", ["max", "sum", "mean", "var", "any"])
def test_reduction_dtypes(name, dtype):
    fn, reference = REDUCTIONS[name]
    x = sample((4, 6), dtype)
    out = run(lambda t: fn(t, axis=-1), x)
    expected = reference(x.astype(np.float64) if name in ("mean", "var") else x, axis=-1,
                         keepdims=False)
    if name in ("mean", "var"):  # integers and booleans give floatx
        assert out.dtype == (np.float64 if dtype == "float64" else np.float32)
    elif name in ("max", "any"):
        assert out.dtype == expected.dtype
    np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int64"])
def test_max_min_special_values_anywhere_in_a_row(dtype):
    """Rows long enough for packed loops, with NaN (any one NaN makes the result NaN,
    as np.max) or the type's extremes at the start, in the middle and in the tail."""
    n = 67
    if np.dtype(dtype).kind == "f":
        x = sample((9, n), dtype)
        specials = [np.nan, np.inf, -np.inf]
    else:
        info = np.iinfo(dtype)
        x = RNG.integers(info.min, info.max, size=(9, n), endpoint=True).astype(dtype)
        specials = [info.min, info.max]
    for row, column in enumerate([0, 1, 30, 64, 66, 0, 33, 65, 2]):
        x[row, column] = specials[row % len(specials)]
    t = placeholder_for(x)
    out_max, out_min = K.function([t], [K.max(t, axis=-1), K.min(t, axis=-1)])([x])
    np.testing.assert_array_equal(out_max, np.max(x, axis=-1))
    np.testing.assert_array_equal(out_min, np.min(x, axis=-1))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_min_and_softmax_see_a_nan_at_any_position_of_a_long_row(dtype):
    """Row i holds a NaN at column i: every lane of the packed loops' accumulators
    (four of 16 float32 on AVX-512, then the tail) meets one.  max and min are NaN
    there, as np.max/np.min; softmax, whose row max is folded into its exp loop, is
    NaN on that row.  Ties of -0.0 and 0.0 give a zero (of either sign, as NumPy's
    packed max may)."""
    n = 150
    x = sample((n + 2, n), dtype)
    x[np.arange(n), np.arange(n)] = np.nan
    x[n] = 0.0
    x[n, ::3] = -0.0
    x[n + 1, 5] = -np.inf
    t = placeholder_for(x)
    out_max, out_min, out_softmax = K.function(
        [t], [K.max(t, axis=-1), K.min(t, axis=-1), K.softmax(t)])([x])
    assert np.isnan(out_max[:n]).all() and np.isnan(out_min[:n]).all()
    assert np.isnan(out_softmax[:n]).all()
    np.testing.assert_array_equal(out_max[n:], [0.0, np.max(x[n + 1])])
    np.testing.assert_array_equal(out_min[n:], [0.0, -np.inf])
    row = x[n + 1].astype(np.float64)
    want = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    np.testing.assert_allclose(out_softmax[n + 1], want, **tolerance(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_rows_beside_rows_with_a_nan_are_exact(dtype):
    """A softmax's shift (its row max) ignores NaN: a row with a NaN is all NaN
    through its sum whatever the shift.  Every row without one must still be
    shifted by its own max, also where the row before or after holds a NaN (the
    kernel reduces the next row inside the exp loop of the current one).  Rows
    of other scales (up to 1e4: a shift by another row's max overflows or
    underflows), with -inf in them, and the cross-entropy from logits (a
    log-softmax) on the same rows, against NumPy in float64."""
    n = 120
    x = sample((2 * n, n), dtype)
    clean = np.arange(0, 2 * n, 2)
    x[clean] *= (1.0 + np.arange(n) * 80.0)[:, None].astype(dtype)
    x[clean[::7], 3] = -np.inf
    nan_rows = np.arange(1, 2 * n, 2)
    x[nan_rows, np.arange(n)] = np.nan  # every position: the fold's lanes and tail
    t = placeholder_for(x)
    target = placeholder_for(x)
    labels = RNG.random(x.shape).astype(dtype)
    probabilities, losses = K.function(
        [t, target], [K.softmax(t), K.categorical_crossentropy(target, t, from_logits=True)])(
        [x, labels])
    rows = x[clean].astype(np.float64)
    shifted = rows - rows.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(probabilities[clean], np.exp(log_p), **tolerance(dtype))
    # (inf on the rows with a -inf)
    np.testing.assert_allclose(losses[clean], -(labels[clean] * log_p).sum(-1), **tolerance(dtype))
    assert np.isnan(probabilities[nan_rows]).all() and np.isnan(losses[nan_rows]).all()


def test_reduction_keras_shape_and_static_shape():
    x = K.placeholder((None, 3, 4))
    assert K.int_shape(K.sum(x, axis=[1, 2])) == (None,)
    assert K.int_shape(K.mean(x, axis=-1, keepdims=True)) == (None, 3, 1)
    assert K.int_shape(K.max(x)) == ()
    assert K.int_shape(K.std(x, axis=0)) == (3, 4)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_argmax_argmin(axis):
    x = sample((4, 5), "float32")
    x[0, 1] = x[0, 3] = 10.0  # the first of equal maxima wins
    f_max = run(lambda t: K.argmax(t, axis), x)
    f_min = run(lambda t: K.argmin(t, axis), x)
    np.testing.assert_array_equal(f_max, np.argmax(x, axis=axis))
    np.testing.assert_array_equal(f_min, np.argmin(x, axis=axis))


def test_argmax_default_axis_is_last():
    x = sample((3, 4, 5), "float64")
    np.testing.assert_array_equal(run(K.argmax, x), x.argmax(-1))
    np.testing.assert_array_equal(run(K.argmin, x), x.argmin(-1))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_cumsum_cumprod(axis, dtype):
    x = sample((3, 4), dtype, 1, 3)
    np.testing.assert_allclose(run(lambda t: K.cumsum(t, axis), x), np.cumsum(x, axis=axis))
    np.testing.assert_allclose(run(lambda t: K.cumprod(t, axis), x), np.cumprod(x, axis=axis))


def test_cumsum_default_axis_is_first():
    x = sample((3, 4), "float64")
    np.testing.assert_allclose(run(K.cumsum, x), np.cumsum(x, axis=0))
    np.testing.assert_allclose(run(K.cumprod, x), np.cumprod(x, axis=0))


# ---------------------------------------------------------------------------
# Linear algebra and indexing


def _theano_dot(x, y):
    """Contract the last axis of x with the second-to-last of y (the last when y is 1-D)."""
    return np.tensordot(x, y, axes=([x.ndim - 1], [max(y.ndim - 2, 0)]))


@pytest.mark.parametrize("x_shape, y_shape", [
    ((2, 3), (3, 4)), ((5, 28, 3), (3, 4)), ((2, 3), (4, 3, 5)), ((3, 2, 3), (2, 4, 3, 5)),
    ((3,), (4, 3, 5)), ((4, 3), (3,)),
])
def test_dot(x_shape, y_shape):
    x = sample(x_shape, "float64")
    y = sample(y_shape, "float64")
    out = run(K.dot, x, y, batch_unknown=False)
    np.testing.assert_allclose(out, _theano_dot(x, y), rtol=1e-12)


def test_dot_static_shapes():
    x = K.placeholder((None, 28, 3))
    y = K.placeholder((3, 4))
    assert K.int_shape(K.dot(x, y)) == (None, 28, 4)
    assert K.int_shape(K.dot(K.placeholder((2, 3)), K.ones((4, 3, 5)))) == (2, 4, 5)
    assert K.int_shape(K.dot(K.placeholder((None, 3)), K.placeholder((4, 3, None)))) == (
        None, 4, None)


def test_dot_nd_with_unknown_dims():
    x = sample((2, 3), "float64")
    y = sample((4, 3, 5), "float64")
    xp = K.placeholder((None, 3), dtype="float64")
    yp = K.placeholder((None, 3, None), dtype="float64")
    out = K.function([xp, yp], [K.dot(xp, yp)])([x, y])[0]
    np.testing.assert_allclose(out, _theano_dot(x, y), rtol=1e-12)


def _reference_batch_dot(x, y, axes):
    """The loop over samples Keras documents, with rank-1 results expanded to (batch, 1)."""
    if axes is None:
        axes = (x.ndim - 1, y.ndim - 1 if y.ndim == 2 else y.ndim - 2)
    elif isinstance(axes, int):
        axes = (axes, axes)
    a0, a1 = (a % n for a, n in zip(axes, (x.ndim, y.ndim)))
    out = np.stack([np.tensordot(xi, yi, axes=(a0 - 1, a1 - 1)) for xi, yi in zip(x, y)])
    return out.reshape(-1, 1) if out.ndim == 1 else out


@pytest.mark.parametrize("x_shape, y_shape, axes", [
    ((2, 2), (2, 2), 1),
    ((4, 3), (4, 3), None),
    ((4, 3), (4, 3, 5), None),
    ((4, 5, 3), (4, 3), None),
    ((4, 5, 3), (4, 3, 6), None),
    ((4, 5, 3), (4, 3, 6), (2, 1)),
    ((4, 20, 1), (4, 30, 20), (1, 2)),
    ((4, 3, 5), (4, 6, 3), (-2, -1)),
    ((4, 2, 3, 5), (4, 5, 2, 3), (3, 1)),
    ((4, 2, 3, 5), (4, 2, 7), (1, 1)),
])
def test_batch_dot(x_shape, y_shape, axes):
    x = sample(x_shape, "float64")
    y = sample(y_shape, "float64")
    expected = _reference_batch_dot(x, y, axes)
    for batch_unknown in (True, False):
        out = run(lambda a, b: K.batch_dot(a, b, axes), x, y, batch_unknown=batch_unknown)
        np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_batch_dot_keras_examples():
    x = K.variable([[1, 2], [3, 4]])
    y = K.variable([[5, 6], [7, 8]])
    np.testing.assert_allclose(K.eval(K.batch_dot(x, y, axes=1)), [[17], [53]])
    xy = K.batch_dot(K.ones((32, 20, 1)), K.ones((32, 30, 20)), axes=(1, 2))
    assert K.int_shape(xy) == (32, 1, 30)


def test_batch_dot_with_all_dims_unknown_keeps_rank():
    x = sample((3, 2, 4, 5), "float64")
    y = sample((3, 5, 6), "float64")
    xp = K.placeholder((None, None, None, None), dtype="float64")
    yp = K.placeholder((None, None, None), dtype="float64")
    out_t = K.batch_dot(xp, yp, axes=(3, 1))
    assert K.ndim(out_t) == 4
    out = K.function([xp, yp], [out_t])([x, y])[0]
    np.testing.assert_allclose(out, _reference_batch_dot(x, y, (3, 1)), rtol=1e-12)


def test_transpose_and_permute_dimensions():
    x = sample((2, 3, 4), "float32")
    np.testing.assert_array_equal(run(K.transpose, x), x.T)
    np.testing.assert_array_equal(run(lambda t: K.permute_dimensions(t, (1, 2, 0)), x),
                                  np.transpose(x, (1, 2, 0)))
    v = sample((5,), "float32")
    np.testing.assert_array_equal(run(K.transpose, v), v)
    assert K.int_shape(K.transpose(K.placeholder((None, 3)))) == (3, None)


@pytest.mark.parametrize("indices", [np.array([2, 0, 2], np.int32), np.array([[1, 0], [3, 3]], np.int64)])
def test_gather(indices):
    ref = sample((4, 3), "float32")
    out = run(K.gather, ref, indices, batch_unknown=False)
    np.testing.assert_array_equal(out, ref[indices])


def test_gather_with_python_list_indices():
    ref = sample((4, 3), "float64")
    np.testing.assert_array_equal(run(lambda r: K.gather(r, [3, 1]), ref), ref[[3, 1]])


def test_one_hot():
    indices = np.array([[0, 2, 1], [3, 5, -1]], np.int32)  # 5 and -1: rows of zeros
    expected = (indices[..., None] == np.arange(4)).astype(np.float32)
    out = run(lambda t: K.one_hot(t, 4), indices)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(run(lambda t: K.one_hot(t, nb_classes=4), indices), expected)
    assert K.int_shape(K.one_hot(K.placeholder((None, 3), dtype="int32"), 4)) == (None, 3, 4)


@pytest.mark.parametrize("axes", [0, -1, [0, 2], (1,)])
def test_reverse(axes):
    x = sample((2, 3, 4), "int32", -5, 5)
    np.testing.assert_array_equal(run(lambda t: K.reverse(t, axes), x), np.flip(x, axes))


@pytest.mark.parametrize("args, kwargs", [
    ((5,), {}), ((-3,), {}), ((2, 9), {}), ((2, 9, 3), {}), ((9, 2, -2), {}),
    ((0, 2, 0.5), {"dtype": "float32"}), ((0, 3), {"dtype": "int64"}), ((0, 1, 0.25), {}),
])
def test_arange(args, kwargs):
    out_t = K.arange(*args, **kwargs)
    expected = np.arange(*args) if len(args) > 1 else np.arange(max(args[0], 0))
    dtype = kwargs.get("dtype", "int32")
    assert K.dtype(out_t) == dtype and K.int_shape(out_t) == expected.shape
    out = K.eval(out_t)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, expected.astype(dtype))


def test_arange_with_tensor_bounds():
    x = K.placeholder((None, 3))
    length = K.shape(x)[0]
    f = K.function([x], [K.arange(length), K.arange(1, length * 2, 2)])
    first, second = f([np.zeros((4, 3), np.float32)])
    np.testing.assert_array_equal(first, np.arange(4))
    np.testing.assert_array_equal(second, np.arange(1, 8, 2))


def test_get_variable_shape_is_the_variables_shape():
    value = np.zeros((2, 3, 4), np.float32)
    assert K.get_variable_shape(K.variable(value)) == value.shape
    assert K.get_variable_shape(K.variable(1.0)) == ()


def test_in_top_k():
    predictions = np.array([[0.1, 0.5, 0.4, 0.0], [0.3, 0.3, 0.3, 0.1], [0.9, 0.05, 0.03, 0.02]],
                           np.float32)
    targets = np.array([2, 1, 3], np.int32)
    for k in (1, 2, 3):
        expected = [predictions[i, t] >= np.sort(predictions[i])[::-1][k - 1]
                    for i, t in enumerate(targets)]
        out = run(lambda p, t, k=k: K.in_top_k(p, t, k), predictions, targets)
        np.testing.assert_array_equal(out, expected)



def in_top_k_by_sorting(predictions, targets, k):
    """TensorFlow's in_top_k by its definition: the target's prediction is at least
    the k-th largest of its row (ties all in); a row with a non-finite value is False."""
    out = []
    for row, target in zip(predictions, targets):
        kth_largest = np.sort(row)[::-1][min(k, row.size) - 1] if k > 0 else np.inf
        out.append(bool(np.all(np.isfinite(row)) and row[target] >= kth_largest))
    return np.array(out)


def test_in_top_k_counts_every_tie_at_the_kth_value():
    # small integers: many rows have more than k values >= the k-th largest
    predictions = RNG.integers(0, 3, size=(200, 5)).astype(np.float32)
    targets = RNG.integers(0, 5, size=200).astype(np.int32)
    for k in (0, 1, 2, 4, 5, 7):
        out = run(lambda p, t, k=k: K.in_top_k(p, t, k), predictions, targets)
        np.testing.assert_array_equal(out, in_top_k_by_sorting(predictions, targets, k))


def test_in_top_k_is_false_for_a_row_with_a_non_finite_prediction():
    predictions = np.array([[0.1, np.inf, 0.4], [0.1, np.nan, 0.4], [0.1, 0.5, np.nan],
                            [-np.inf, 0.5, 0.4], [0.1, 0.5, 0.4]], np.float32)
    targets = np.array([2, 2, 2, 2, 2], np.int32)
    out = run(lambda p, t: K.in_top_k(p, t, 2), predictions, targets)
    np.testing.assert_array_equal(out, in_top_k_by_sorting(predictions, targets, 2))
    np.testing.assert_array_equal(out, [False, False, False, False, True])


@pytest.mark.parametrize("bad_target", [-1, 3])
def test_in_top_k_rejects_a_target_out_of_range(bad_target):
    predictions = np.array([[0.1, 0.5, 0.4], [0.3, 0.2, 0.1]], np.float32)
    targets = np.array([0, bad_target], np.int32)
    with pytest.raises(ValueError, match=rf"in_top_k: targets\[1\] = {bad_target} is out of range for 3"):
        run(lambda p, t: K.in_top_k(p, t, 1), predictions, targets)


# ---------------------------------------------------------------------------
# Shape manipulation


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_concatenate(axis):
    a = sample((2, 3), "float32")
    b = sample((2, 3), "float32")
    c = sample((2, 3), "float32")
    out = run(lambda *ts: K.concatenate(list(ts), axis=axis), a, b, c, batch_unknown=False)
    np.testing.assert_array_equal(out, np.concatenate([a, b, c], axis=axis))


def test_concatenate_default_axis_and_static_shape():
    a = K.placeholder((None, 3))
    b = K.placeholder((None, 5))
    assert K.int_shape(K.concatenate([a, b])) == (None, 8)
    x, y = sample((2, 3), "float32"), sample((2, 5), "float32")
    np.testing.assert_array_equal(run(lambda s, t: K.concatenate([s, t]), x, y),
                                  np.concatenate([x, y], axis=-1))


def test_reshape_with_ints_and_minus_one():
    x = sample((4, 6), "float32")
    np.testing.assert_array_equal(run(lambda t: K.reshape(t, (2, 3, -1)), x), x.reshape(2, 3, -1))
    np.testing.assert_array_equal(run(lambda t: K.reshape(t, [-1]), x), x.reshape(-1))


def test_reshape_with_shape_tensor_entries():
    x = sample((4, 6), "float32")
    xp = placeholder_for(x)
    y = K.reshape(xp, (K.shape(xp)[0], 2, 3))  # Keras' Reshape layer
    assert K.int_shape(y) == (None, 2, 3)
    two_unknown = K.reshape(xp, (K.shape(xp)[0], -1, 3))
    assert K.int_shape(two_unknown) == (None, None, 3)
    whole = K.reshape(xp, K.stack([K.shape(xp)[1], K.shape(xp)[0]]))
    assert K.ndim(whole) == 2
    outs = K.function([xp], [y, two_unknown, whole])([x])
    np.testing.assert_array_equal(outs[0], x.reshape(4, 2, 3))
    np.testing.assert_array_equal(outs[1], x.reshape(4, -1, 3))
    np.testing.assert_array_equal(outs[2], x.reshape(6, 4))


def test_reshape_to_shapes_built_from_unknown_dims():
    """Targets built from K.shape of a tensor with several unknown dims, as Keras's
    TimeDistributed builds them; one compiled function at two run-time shapes.  The
    static shape has what TensorFlow infers: dims of static shapes read through
    K.shape are known."""
    y = K.placeholder((None, None, 4))
    x = K.placeholder((None, 8))
    outs = {"same": (K.reshape(y, K.shape(y)), (None, None, 4), lambda v: v),
            "merge": (K.reshape(y, (-1, K.shape(y)[2])), (None, 4), lambda v: v.reshape(-1, 4)),
            "split": (K.reshape(K.reshape(y, (-1, 4)), (K.shape(y)[0], -1, 2, 2)),
                      (None, None, 2, 2), lambda v: v.reshape(v.shape[0], -1, 2, 2)),
            "unit": (K.reshape(y, (K.shape(y)[0], K.shape(y)[1], 4, 1)), (None, None, 4, 1),
                     lambda v: v[..., None]),
            "known_entry": (K.reshape(x, [K.shape(x)[0], K.shape(x)[1], 1]), (None, 8, 1),
                            lambda v: v[..., None]),
            "sliced": (K.reshape(y, K.concatenate([K.shape(y)[:2], K.constant([2, 2], "int32")])),
                       (None, None, 2, 2), lambda v: v.reshape(v.shape[:2] + (2, 2)))}
    for name, (out, static, _) in outs.items():
        assert K.int_shape(out) == static, name
    fn = K.function([y, x], [out for out, _, _ in outs.values()])
    for batch, time in [(2, 3), (3, 5)]:
        yv, xv = sample((batch, time, 4), "float32"), sample((batch, 8), "float32")
        for (name, (_, _, reference)), got in zip(outs.items(), fn([yv, xv])):
            np.testing.assert_array_equal(got, reference(xv if name == "known_entry" else yv),
                                          err_msg=name)


def test_reshape_checks_the_run_time_target():
    """A target of another size than x raised nowhere: one tensor entry among ints was
    taken for the -1 it would infer, and NumPy reads any negative entry as -1."""
    x, y = K.placeholder((None, 8)), K.placeholder((None, None))
    xv = sample((3, 8), "float32")
    doubled = K.function([x], [K.reshape(x, (K.shape(x)[0] * 2, 4, 2))])
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(3, 8\) "
                                         r"into \(6, 4, 2\)"):
        doubled([xv])
    other_batch = K.function([x, y], [K.reshape(x, (K.shape(y)[0], 2, 4))])
    np.testing.assert_array_equal(other_batch([xv, np.ones((3, 1), "float32")])[0],
                                  xv.reshape(3, 2, 4))
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(3, 8\) "
                                         r"into \(2, 2, 4\)"):
        other_batch([xv, np.ones((2, 1), "float32")])
    negative = K.function([x], [K.reshape(x, K.stack([K.shape(x)[0] - 5, 8]))])
    with pytest.raises(ValueError, match=r"reshape: cannot reshape .* into \(-2, 8\)"):
        negative([xv])


def test_reshape_target_errors_at_build_time():
    y = K.placeholder((None, None, 4))
    with pytest.raises(ValueError, match=r"reshape: bad target shape \(-1, -1, \?\)"):
        K.reshape(y, (-1, -1, K.shape(y)[0]))
    with pytest.raises(ValueError, match=r"reshape: bad target shape \(\?, -3\)"):
        K.reshape(y, (K.shape(y)[0], -3))
    with pytest.raises(TypeError, match="reshape: shape entries must be ints or scalar int tensors"):
        K.reshape(y, (K.shape(y)[0], 2.5))
    with pytest.raises(TypeError, match="reshape: .* entry 0 has dtype float32"):
        K.reshape(y, (K.cast(K.shape(y)[0], "float32"), -1))
    with pytest.raises(ValueError, match=r"reshape: .* entry 1 has shape \(3,\)"):
        K.reshape(y, (-1, K.shape(y)))
    with pytest.raises(ValueError, match=r"reshape: cannot reshape \(2, 3\) into \(4, 2\)"):
        K.reshape(K.placeholder((2, 3)), K.constant([4, 2], "int32"))


def test_repeat_elements():
    x = sample((2, 3, 2), "float32")
    for axis in (0, 1, -1):
        np.testing.assert_array_equal(run(lambda t, a=axis: K.repeat_elements(t, 3, a), x),
                                      np.repeat(x, 3, axis=axis))
    assert K.int_shape(K.repeat_elements(K.placeholder((None, 3)), 2, 1)) == (None, 6)


def test_repeat_elements_along_an_unknown_axis_carries_keras_shape():
    """As TensorFlow's backend (and Keras's backend test of repeat_elements) has it:
    the result of a repeat along an unknown axis carries ``_keras_shape``, the
    static shape; along a known axis it does not."""
    x = K.placeholder((2, None, 3))
    y = K.repeat_elements(x, 3, axis=1)
    assert y._keras_shape == (2, None, 3) == K.int_shape(y)
    assert not hasattr(K.repeat_elements(x, 3, axis=2), "_keras_shape")


def test_repeat():
    x = sample((3, 4), "float64")
    out = run(lambda t: K.repeat(t, 5), x)
    assert out.shape == (3, 5, 4)
    np.testing.assert_array_equal(out, np.stack([x] * 5, axis=1))


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
def test_batch_flatten_and_flatten(shape):
    x = sample(shape, "float32")
    np.testing.assert_array_equal(run(K.batch_flatten, x), x.reshape(shape[0], -1))
    np.testing.assert_array_equal(run(K.flatten, x), x.reshape(-1))


def test_batch_flatten_unknown_inner_dims():
    x = sample((2, 3, 4), "float32")
    xp = K.placeholder((None, None, 4))
    out_t = K.batch_flatten(xp)
    assert K.int_shape(out_t) == (None, None)
    np.testing.assert_array_equal(K.function([xp], [out_t])([x])[0], x.reshape(2, -1))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_expand_dims(axis):
    x = sample((3, 4), "float32")
    xp = placeholder_for(x)
    out_t = K.expand_dims(xp, axis)
    expected = np.expand_dims(x, axis)
    assert K.int_shape(out_t) == tuple(None if d == 3 else d for d in expected.shape)
    np.testing.assert_array_equal(K.function([xp], [out_t])([x])[0], expected)


def test_expand_dims_keras1_dim_and_unknown_dims():
    x = sample((3, 4), "float32")
    xp = K.placeholder((None, None))
    out_t = K.expand_dims(xp, dim=1)
    assert K.int_shape(out_t) == (None, 1, None)
    np.testing.assert_array_equal(K.function([xp], [out_t])([x])[0], x[:, None, :])
    assert K.int_shape(K.expand_dims(xp)) == (None, None, 1)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_squeeze(axis):
    shape = [3, 4, 5]
    shape[axis] = 1
    x = sample(tuple(shape), "float32")
    np.testing.assert_array_equal(run(lambda t: K.squeeze(t, axis), x, batch_unknown=axis != 0),
                                  np.squeeze(x, axis))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack(axis):
    a, b = sample((2, 3), "float32"), sample((2, 3), "float32")
    out = run(lambda s, t: K.stack([s, t], axis=axis), a, b)
    np.testing.assert_array_equal(out, np.stack([a, b], axis=axis))


@pytest.mark.parametrize("shape, reps", [((2, 3), 2), ((2, 3), (2, 3)), ((2, 3), [3]),
                                         ((2, 3, 2), (1, 2, 2))])
def test_tile(shape, reps):
    x = sample(shape, "float32")
    np.testing.assert_array_equal(run(lambda t: K.tile(t, reps), x), np.tile(x, reps))


def test_tile_keras_example():
    np.testing.assert_array_equal(K.eval(K.tile(K.eye(2), (2, 3))), np.tile(np.eye(2), (2, 3)))


@pytest.mark.parametrize("start, size", [((0, 1), (2, 2)), ((1, 0), (-1, 3)), ((0, 2), (1, -1))])
def test_slice(start, size):
    x = sample((3, 4), "float32")
    key = tuple(slice(b, None if n == -1 else b + n) for b, n in zip(start, size))
    np.testing.assert_array_equal(run(lambda t: K.slice(t, start, size), x), x[key])


@pytest.mark.parametrize("padding, pair", [((1, 1), (1, 1)), ((2, 0), (2, 0)), (3, (3, 3))])
def test_temporal_padding(padding, pair):
    x = sample((2, 3, 4), "float32")
    out = run(lambda t: K.temporal_padding(t, padding), x)
    np.testing.assert_array_equal(out, np.pad(x, [(0, 0), pair, (0, 0)]))


def test_temporal_padding_default():
    x = sample((2, 3, 4), "float32")
    np.testing.assert_array_equal(run(K.temporal_padding, x), np.pad(x, [(0, 0), (1, 1), (0, 0)]))


SPATIAL_2D = [
    ({}, [(0, 0), (1, 1), (1, 1), (0, 0)]),
    ({"padding": ((1, 2), (0, 3)), "data_format": "channels_last"}, [(0, 0), (1, 2), (0, 3), (0, 0)]),
    ({"padding": ((1, 2), (0, 3)), "data_format": "channels_first"}, [(0, 0), (0, 0), (1, 2), (0, 3)]),
    ({"padding": (2, 1), "dim_ordering": "th"}, [(0, 0), (0, 0), (2, 2), (1, 1)]),
    ({"padding": (2, 1), "dim_ordering": "tf"}, [(0, 0), (2, 2), (1, 1), (0, 0)]),
    ({"padding": (2, 1), "dim_ordering": "default"}, [(0, 0), (2, 2), (1, 1), (0, 0)]),
]


@pytest.mark.parametrize("kwargs, pads", SPATIAL_2D)
def test_spatial_2d_padding(kwargs, pads):
    x = sample((2, 3, 4, 5), "float32")
    np.testing.assert_array_equal(run(lambda t: K.spatial_2d_padding(t, **kwargs), x), np.pad(x, pads))


SPATIAL_3D = [
    ({}, [(0, 0), (1, 1), (1, 1), (1, 1), (0, 0)]),
    ({"padding": ((1, 0), (0, 2), (3, 1)), "data_format": "channels_first"},
     [(0, 0), (0, 0), (1, 0), (0, 2), (3, 1)]),
    ({"padding": (1, 2, 0), "dim_ordering": "tf"}, [(0, 0), (1, 1), (2, 2), (0, 0), (0, 0)]),
]


@pytest.mark.parametrize("kwargs, pads", SPATIAL_3D)
def test_spatial_3d_padding(kwargs, pads):
    x = sample((2, 3, 2, 4, 2), "float32")
    np.testing.assert_array_equal(run(lambda t: K.spatial_3d_padding(t, **kwargs), x), np.pad(x, pads))


# ---------------------------------------------------------------------------
# Gradients of the composite functions, against finite differences of NumPy formulas


def _pad_2d(x):
    return np.pad(x.reshape(-1, 2, 3, 1), [(0, 0), (1, 1), (1, 1), (0, 0)])


GRADIENT_CASES = {
    "logsumexp": (lambda t: K.logsumexp(t, axis=-1), lambda x: scipy_logsumexp(x, axis=-1)),
    "var": (lambda t: K.var(t, axis=0), lambda x: np.var(x, axis=0)),
    "std": (lambda t: K.std(t, axis=-1, keepdims=True), lambda x: np.std(x, axis=-1, keepdims=True)),
    "clip": (lambda t: K.clip(t, -0.5, 0.6), lambda x: np.clip(x, -0.5, 0.6)),
    "dot_nd": (lambda t: K.dot(t, K.constant(W_DOT, dtype="float64")), lambda x: _theano_dot(x, W_DOT)),
    "batch_dot": (lambda t: K.batch_dot(K.reshape(t, (-1, 3, 2)), K.reshape(t, (-1, 2, 3)), axes=(1, 2)),
                  lambda x: _reference_batch_dot(x.reshape(-1, 3, 2), x.reshape(-1, 2, 3), (1, 2))),
    "expand_squeeze": (lambda t: K.squeeze(K.expand_dims(t, 1), 1) * 3, lambda x: x * 3),
    "slice": (lambda t: K.slice(t, (0, 1), (-1, 3)), lambda x: x[:, 1:4]),
    "padding": (lambda t: K.spatial_2d_padding(K.reshape(t, (-1, 2, 3, 1))), _pad_2d),
    "repeat": (lambda t: K.repeat(t, 2) * K.arange(1, 3, dtype="float64")[None, :, None],
               lambda x: np.stack([x, 2 * x], axis=1)),
    "batch_flatten": (lambda t: K.batch_flatten(K.reshape(t, (K.shape(t)[0], 2, 3))) ** 2,
                      lambda x: x ** 2),
}
W_DOT = RNG.uniform(-1, 1, size=(2, 6, 3))


@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_gradient(name):
    fn, reference = GRADIENT_CASES[name]
    x = RNG.uniform(-1, 1, size=(3, 6))
    xp = K.placeholder((None, 6), dtype="float64")
    (grad,) = K.function([xp], K.gradients(K.sum(K.square(fn(xp))), [xp]))([x])
    expected = numeric_gradient(lambda v: np.sum(np.square(reference(v))), x)
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------
# Bad input: the error names the function and the shapes


def test_elementwise_errors():
    a, b = K.placeholder((None, 3)), K.placeholder((4,))
    with pytest.raises(ValueError, match=r"maximum.*\(None, 3\).*\(4,\)"):
        K.maximum(a, b)
    with pytest.raises(ValueError, match=r"less.*\(None, 3\)"):
        K.lesser(a, b)
    with pytest.raises(ValueError, match=r"clip.*\(None, 3\).*\(4,\)"):
        K.clip(a, b, 1.0)


def test_reduction_errors():
    x = K.placeholder((None, 3))
    for fn in (K.sum, K.max, K.mean, K.var, K.std, K.logsumexp, K.any):
        name = fn.__name__
        with pytest.raises(ValueError, match=f"{name}: axis 2 is out of range .* rank 2"):
            fn(x, axis=2)
    with pytest.raises(ValueError, match="prod: repeated axis"):
        K.prod(x, axis=[1, -1])
    with pytest.raises(ValueError, match="argmax: axis -3"):
        K.argmax(x, axis=-3)
    with pytest.raises(ValueError, match="cumsum: axis 2"):
        K.cumsum(x, axis=2)


def test_linear_algebra_errors():
    with pytest.raises(ValueError, match=r"dot: cannot contract shapes \(2, 3\) and \(4, 5\)"):
        K.dot(K.placeholder((2, 3)), K.placeholder((4, 5)))
    with pytest.raises(ValueError, match=r"dot: cannot contract shapes \(2, 3\) and \(4, 2, 5\)"):
        K.dot(K.placeholder((2, 3)), K.placeholder((4, 2, 5)))
    # dimensions known only at run time: the same message, from the call
    a, b = K.placeholder((None, None)), K.placeholder((None, 4))
    fn = K.function([a, b], [K.dot(a, b)])
    with pytest.raises(ValueError, match=r"dot: cannot contract shapes \(2, 3\) and \(5, 4\) \(3 != 5\)"):
        fn([np.ones((2, 3)), np.ones((5, 4))])
    v = K.placeholder((None,))
    fn = K.function([a, v], [K.dot(a, v)])
    with pytest.raises(ValueError, match=r"dot: cannot contract shapes \(2, 3\) and \(5,\)"):
        fn([np.ones((2, 3)), np.ones(5)])
    x3, y3 = K.placeholder((None, None, None)), K.placeholder((None, None, None))
    fn = K.function([x3, y3], [K.batch_dot(x3, y3)])
    with pytest.raises(ValueError, match=r"matmul: cannot multiply shapes \(2, 3, 4\) and \(2, 5, 6\)"):
        fn([np.ones((2, 3, 4)), np.ones((2, 5, 6))])
    with pytest.raises(ValueError, match=r"matmul: cannot multiply shapes \(2, 3, 4\) and \(3, 4, 6\)"):
        fn([np.ones((2, 3, 4)), np.ones((3, 4, 6))])
    with pytest.raises(ValueError, match=r"batch_dot: .*rank >= 2.*\(3,\)"):
        K.batch_dot(K.placeholder((3,)), K.placeholder((3, 2)))
    with pytest.raises(ValueError, match=r"batch_dot: .*batch sizes.*\(3, 2\) and \(4, 2\)"):
        K.batch_dot(K.placeholder((3, 2)), K.placeholder((4, 2)))
    with pytest.raises(ValueError, match="batch_dot: cannot reduce over the batch axis"):
        K.batch_dot(K.placeholder((3, 2)), K.placeholder((3, 2)), axes=0)
    with pytest.raises(ValueError, match=r"batch_dot: .*\(2 != 5\).*\(None, 2\) and \(None, 5\)"):
        K.batch_dot(K.placeholder((None, 2)), K.placeholder((None, 5)))
    with pytest.raises(TypeError, match="gather: indices must be integers"):
        K.gather(K.placeholder((4, 3)), K.placeholder((2,)))
    with pytest.raises(TypeError, match=r"one_hot: indices must be integers.*\(None, 2\)"):
        K.one_hot(K.placeholder((None, 2)), 3)
    with pytest.raises(ValueError, match="reverse: axis 3"):
        K.reverse(K.placeholder((2, 3)), 3)
    with pytest.raises(ValueError, match=r"in_top_k: .*\(3,\)"):
        K.in_top_k(K.placeholder((3,)), K.placeholder((3,), dtype="int32"), 1)
    with pytest.raises(TypeError, match="in_top_k: targets must be integers .*float32"):
        K.in_top_k(K.placeholder((3, 4)), K.placeholder((3,)), 1)
    with pytest.raises(ValueError, match=r"in_top_k: .*\(3, 4\).*\(2,\) have different batch sizes"):
        K.in_top_k(K.placeholder((3, 4)), K.placeholder((2,), dtype="int32"), 1)
    with pytest.raises(ValueError, match="arange: step must not be zero"):
        K.arange(0, 5, 0)


def test_shape_errors():
    x = K.placeholder((None, 3, 4))
    with pytest.raises(ValueError, match=r"concatenate: shapes differ.*\(None, 3, 4\), \(None, 5, 4\)"):
        K.concatenate([x, K.placeholder((None, 5, 4))], axis=-1)
    with pytest.raises(ValueError, match=r"reshape: cannot reshape \(2, 3\)"):
        K.reshape(K.placeholder((2, 3)), (4, 2))
    with pytest.raises(ValueError, match=r"permute_dimensions: .*\(None, 3, 4\)"):
        K.permute_dimensions(x, (0, 1))
    with pytest.raises(ValueError, match=r"expand_dims: axis 4 .*\(None, 3, 4\)"):
        K.expand_dims(x, 4)
    with pytest.raises(ValueError, match=r"squeeze: axis 1 .*\(None, 3, 4\) has length 3"):
        K.squeeze(x, 1)
    with pytest.raises(ValueError, match=r"tile: .*\(None, 3, 4\)"):
        K.tile(x, (1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"slice: .*\(None, 3, 4\)"):
        K.slice(x, (0, 0), (1, 1))
    with pytest.raises(ValueError, match=r"slice: start 2 and size 2 .*axis 1"):
        K.slice(x, (0, 2, 0), (1, 2, 1))
    with pytest.raises(ValueError, match=r"repeat: .*\(None, 3, 4\)"):
        K.repeat(x, 2)
    with pytest.raises(ValueError, match=r"stack: .*\(None, 3, 4\)"):
        K.stack([x, K.placeholder((None, 3))])
    with pytest.raises(ValueError, match=r"temporal_padding: .*rank 3.*\(2, 3\)"):
        K.temporal_padding(K.placeholder((2, 3)))
    with pytest.raises(ValueError, match=r"spatial_2d_padding: .*rank 4.*\(None, 3, 4\)"):
        K.spatial_2d_padding(x)
    with pytest.raises(ValueError, match="spatial_2d_padding: padding must give 2 entries"):
        K.spatial_2d_padding(K.placeholder((1, 2, 3, 4)), padding=(1, 2, 3))
    with pytest.raises(ValueError, match="data_format"):
        K.spatial_3d_padding(K.placeholder((1, 2, 3, 4, 5)), data_format="channels_middle")


# ---------------------------------------------------------------------------
# Random element-wise expression trees against the same tree in NumPy


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


BINARY_TREE_OPS = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "maximum": (K.maximum, np.maximum),
    "minimum": (K.minimum, np.minimum),
}
UNARY_TREE_OPS = {
    "abs": (K.abs, np.abs),
    "square": (K.square, np.square),
    "exp": (K.exp, np.exp),
    "tanh": (lambda t: ops.apply("tanh", t), np.tanh),
    "sigmoid": (lambda t: ops.apply("sigmoid", t), _np_sigmoid),
}
COMPARISONS = {
    "greater": (K.greater, np.greater),
    "less_equal": (K.less_equal, np.less_equal),
    "equal": (K.equal, np.equal),
}


def _trees():
    leaves = st.one_of(st.sampled_from([("input", 0), ("input", 1), ("input", 2)]),
                       st.sampled_from([("constant", 0.5), ("constant", -1.5), ("constant", 2.0)]))

    def extend(children):
        return st.one_of(
            st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY_TREE_OPS)), children),
            st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY_TREE_OPS)), children, children),
            st.tuples(st.just("where"), st.sampled_from(sorted(COMPARISONS)),
                      children, children, children, children),
        )

    return st.recursive(leaves, extend, max_leaves=6)


def _evaluate(tree, inputs, graph, dtype):
    """The tree on ``inputs``: numbackend tensors when ``graph``, NumPy arrays otherwise,
    all in ``dtype``."""
    kind = tree[0]
    if kind == "input":
        return inputs[tree[1]]
    if kind == "constant":
        return K.constant(tree[1], dtype=dtype) if graph else np.asarray(tree[1], dtype)
    operands = [_evaluate(t, inputs, graph, dtype) for t in tree[2:]]
    pick = 0 if graph else 1
    if kind == "unary":
        return UNARY_TREE_OPS[tree[1]][pick](*operands)
    if kind == "binary":
        return BINARY_TREE_OPS[tree[1]][pick](*operands)
    left, right, then, otherwise = operands
    condition = COMPARISONS[tree[1]][pick](left, right)
    if graph:
        return ops.apply("where", condition, then, otherwise)
    return np.where(condition, then, otherwise)


@settings(max_examples=25, deadline=None)
@given(tree=_trees(), dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2 ** 16))
def test_random_elementwise_trees(tree, dtype, seed):
    rng = np.random.default_rng(seed)
    # a full input, a row and a column: the kernel sees all three broadcast patterns
    values = [rng.uniform(-2, 2, size=shape).astype(dtype) for shape in ((6, 5), (5,), (6, 1))]
    placeholders = [K.placeholder((None, 5), dtype=dtype), K.placeholder((5,), dtype=dtype),
                    K.placeholder((None, 1), dtype=dtype)]
    out = K.function(placeholders, [_evaluate(tree, placeholders, True, dtype)])(values)[0]
    with np.errstate(all="ignore"):
        expected = _evaluate(tree, values, False, dtype)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    rtol = 1e-4 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(out, expected, rtol=rtol, atol=rtol, equal_nan=True)
