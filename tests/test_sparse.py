"""Sparse tensors as Keras 2.2.5's TensorFlow backend has them: K.variable of a
scipy.sparse matrix, K.placeholder(sparse=True), is_sparse, to_dense, dot and
concatenate, against scipy's dense arrays and NumPy formulas; gradients against
finite differences."""
import numpy as np
import pytest
import scipy.sparse as sp

import numbackend as K
from tests.finite_differences import numeric_gradient

RNG = np.random.default_rng(20261127)


def random_sparse(rows, cols, density=0.3, fmt="csr", dtype=np.float64):
    return sp.random(rows, cols, density=density, format=fmt, dtype=dtype, random_state=RNG)


def with_duplicates():
    """A COO matrix with an index given three times and one explicit zero."""
    rows = np.array([2, 0, 2, 1, 2, 3])
    cols = np.array([1, 4, 1, 0, 1, 2])
    data = np.array([1.0, 2.0, 3.0, 0.0, -0.5, 7.0])
    return sp.coo_matrix((data, (rows, cols)), shape=(4, 5)), rows, cols, data


def brute_force_dense(rows, cols, data, shape):
    dense = np.zeros(shape)
    for r, c, v in zip(rows, cols, data):
        dense[r, c] += v
    return dense


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr"])
def test_variable_of_any_scipy_format_is_sparse_and_evaluates_dense(fmt):
    m = random_sparse(6, 7, fmt=fmt)
    v = K.variable(m)
    assert K.is_sparse(v) and not K.is_placeholder(v)
    assert K.int_shape(v) == (6, 7) and K.ndim(v) == 2 and K.dtype(v) == K.floatx()
    np.testing.assert_array_equal(K.eval(v), m.toarray().astype(K.floatx()))


def test_get_value_is_the_row_major_value_with_duplicates_added():
    m, rows, cols, data = with_duplicates()
    v = K.variable(m, dtype="float64")
    value = K.get_value(v)
    assert isinstance(value, K.SparseTensorValue)
    dense = brute_force_dense(rows, cols, data, (4, 5))
    # every index once, row-major, the explicit zero kept (TensorFlow keeps stored zeros)
    expected = sorted({(r, c) for r, c in zip(rows, cols)})
    assert value.indices.dtype == np.int64 and value.indices.tolist() == [list(i) for i in expected]
    np.testing.assert_array_equal(value.values, [dense[i] for i in expected])
    assert value.values.dtype == np.float64
    assert value.dense_shape.tolist() == [4, 5] and value.dense_shape.dtype == np.int64
    np.testing.assert_array_equal(K.eval(v), dense)
    assert K.batch_get_value([v])[0].indices.tolist() == value.indices.tolist()


def test_to_dense_and_is_sparse_of_dense_tensors():
    x = K.placeholder((None, 3))
    w = K.variable(np.ones((2, 2)))
    assert K.to_dense(x) is x and K.to_dense(w) is w
    assert not K.is_sparse(x) and not K.is_sparse(w)
    s = K.placeholder((None, 3), sparse=True)
    assert K.is_sparse(s) and K.is_placeholder(s) and K.int_shape(s) == (None, 3)
    assert not K.is_sparse(K.to_dense(s)) and K.int_shape(K.to_dense(s)) == (None, 3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sparse_placeholder_fed_with_any_format(dtype):
    x = K.placeholder((None, 5), sparse=True, dtype=dtype)
    w_value = RNG.standard_normal((5, 3))
    w = K.variable(w_value, dtype=dtype)
    f = K.function([x], [K.dot(x, w), K.to_dense(x), x, K.shape(x)])
    m, rows, cols, data = with_duplicates()
    dense_dup = brute_force_dense(rows, cols, data, (4, 5))
    tol = 1e-6 if dtype == "float32" else 1e-12
    feeds = [(m, dense_dup)] + [(random_sparse(n, 5, fmt=fmt), None)
                                for n, fmt in ((6, "csr"), (1, "csc"), (3, "lil"))]
    for value, dense in feeds:
        dense = value.toarray() if dense is None else dense
        product, as_dense, as_sparse, shape = f([value])
        assert product.dtype == dtype and as_dense.dtype == dtype
        np.testing.assert_allclose(product, dense @ w_value, rtol=tol, atol=tol)
        np.testing.assert_array_equal(as_dense, dense.astype(dtype))
        assert isinstance(as_sparse, K.SparseTensorValue)
        assert as_sparse.dense_shape.tolist() == list(dense.shape) == shape.tolist()
        rebuilt = brute_force_dense(*as_sparse.indices.T, as_sparse.values, dense.shape)
        np.testing.assert_array_equal(rebuilt, dense.astype(dtype))
    # the value a function returns feeds it again
    product, *_ = f([as_sparse])
    np.testing.assert_allclose(product, dense @ w_value, rtol=tol, atol=tol)


def test_empty_sparse_matrix():
    x = K.placeholder((None, 4), sparse=True, dtype="float64")
    w = K.variable(RNG.standard_normal((4, 3)), dtype="float64")
    loss = K.sum(K.dot(x, w))
    f = K.function([x], [K.dot(x, w), K.to_dense(x), K.gradients(loss, [w])[0]])
    product, dense, grad = f([sp.csr_matrix((2, 4))])
    np.testing.assert_array_equal(product, np.zeros((2, 3)))
    np.testing.assert_array_equal(dense, np.zeros((2, 4)))
    np.testing.assert_array_equal(grad, np.zeros((4, 3)))


def test_feeding_errors_name_the_input_and_shapes():
    x = K.placeholder((None, 5), sparse=True, name="sparse_in")
    d = K.placeholder((None, 5), name="dense_in")
    f = K.function([x, d], [K.dot(x, K.variable(np.ones((5, 2)))) + K.sum(d)])
    good = random_sparse(3, 5)
    with pytest.raises(TypeError, match=r"function: input 0 \('sparse_in:0'\) is sparse.*"
                                        r"scipy.sparse.*ndarray of shape \(3, 5\)"):
        f([good.toarray(), np.ones((3, 5))])
    # the dense input keeps its number in messages after a sparse one (of three parts)
    with pytest.raises(TypeError, match=r"function: input 1 \('dense_in:0'\) is dense, of shape "
                                        r"\(None, 5\).*scipy.sparse matrix of shape \(3, 5\)"):
        f([good, good])
    with pytest.raises(ValueError, match=r"function: input 1 \('dense_in:0'\) expects shape "
                                         r"\(None, 5\), got \(3, 4\)"):
        f([good, np.ones((3, 4))])
    with pytest.raises(ValueError, match=r"input 0 \('sparse_in:0'\) expects shape \(None, 5\), "
                                         r"got \(3, 4\)"):
        f([random_sparse(3, 4), np.ones((3, 5))])
    with pytest.raises(ValueError, match="expected 2 input"):
        f([good])
    with pytest.raises(ValueError, match=r"sparse placeholders are 2-D, got shape \(None, 2, 3\)"):
        K.placeholder((None, 2, 3), sparse=True)


def test_ops_refuse_sparse_tensors():
    x = K.placeholder((None, 5), sparse=True, name="s")
    with pytest.raises(TypeError, match=r"add: 's:0' of shape \(None, 5\) is a sparse tensor; "
                                        "convert it with K.to_dense"):
        x + 1
    with pytest.raises(TypeError, match="sparse tensor"):
        K.relu(x)
    with pytest.raises(TypeError, match="dot: a sparse product needs float32 or float64"):
        K.dot(K.placeholder((None, 5), sparse=True, dtype="int32"),
              K.variable(np.ones((5, 2)), dtype="int32"))
    with pytest.raises(TypeError, match="sparse tensor"):
        K.dot(K.placeholder((2, 3)), x)
    with pytest.raises(TypeError, match="both operands are sparse"):
        K.dot(x, K.placeholder((5, 2), sparse=True))
    with pytest.raises(ValueError, match=r"multiplies 2-D tensors only, got shape \(5, 2, 3\)"):
        K.dot(x, K.placeholder((5, 2, 3)))
    with pytest.raises(ValueError, match=r"cannot multiply a sparse tensor of shape \(None, 5\) "
                                         r"by a dense one of shape \(4, 2\)"):
        K.dot(x, K.placeholder((4, 2)))
    with pytest.raises(TypeError, match="cannot differentiate against the sparse tensor 's:0'"):
        K.gradients(K.sum(K.dot(x, K.variable(np.ones((5, 2))))), [x])
    v = K.variable(random_sparse(2, 3))
    with pytest.raises(TypeError, match="set_value: expected a variable, got the sparse tensor"):
        K.set_value(v, np.ones((2, 3)))
    with pytest.raises(TypeError, match="input 0 must be a placeholder"):
        K.function([v], [K.to_dense(v)])


def test_dot_of_a_sparse_variable_matches_the_dense_product():
    # Keras's backend_test.test_sparse_dot
    m = random_sparse(4, 5, fmt="csr", dtype=np.float32)
    w = RNG.random((5, 4))
    assert K.is_sparse(K.variable(m))
    got = K.eval(K.dot(K.variable(m), K.variable(w)))
    np.testing.assert_allclose(got, m.toarray() @ w.astype(np.float32), rtol=1e-6)
    # operands of two float types take the wider
    got = K.eval(K.dot(K.variable(m, dtype="float32"), K.variable(w, dtype="float64")))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, m.toarray().astype(np.float32).astype(np.float64) @ w,
                               rtol=1e-12)


def test_dot_gradients_match_finite_differences():
    """loss = sum(C * tanh(S @ W)) in float64: its gradients with respect to W and
    to S's values, and, a second order, those of sum(D * dloss/dW)."""
    m, rows, cols, _ = with_duplicates()
    m = sp.coo_matrix((RNG.standard_normal(len(rows)), (rows, cols)), shape=(4, 5)).tocsr()
    coo = m.tocoo()
    nz_rows, nz_cols = coo.row, coo.col  # row-major, each index once: the order of the values
    values0 = coo.data.copy()
    w0 = RNG.standard_normal((5, 3))
    c = RNG.standard_normal((4, 3))
    d = RNG.standard_normal((5, 3))

    def dense_of(values):
        s = np.zeros((4, 5))
        s[nz_rows, nz_cols] = values
        return s

    def loss(values, w):
        return np.sum(c * np.tanh(dense_of(values) @ w))

    def grad_w(values, w):  # dloss/dW = S' (C * (1 - tanh^2))
        s = dense_of(values)
        return s.T @ (c * (1 - np.tanh(s @ w) ** 2))

    x = K.placeholder((None, 5), sparse=True, dtype="float64")
    w = K.variable(w0, dtype="float64")
    total = K.sum(K.constant(c, dtype="float64") * K.tanh(K.dot(x, w)))
    g_w, g_values = K.gradients(total, [w, x.values])
    second = K.sum(K.constant(d, dtype="float64") * g_w)
    h_w, h_values = K.gradients(second, [w, x.values])
    f = K.function([x], [total, g_w, g_values, h_w, h_values])
    got_loss, got_gw, got_gv, got_hw, got_hv = f([m])
    np.testing.assert_allclose(got_loss, loss(values0, w0), rtol=1e-12)
    np.testing.assert_allclose(got_gw, numeric_gradient(lambda v: loss(values0, v), w0),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got_gv, numeric_gradient(lambda v: loss(v, w0), values0),
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got_gw, grad_w(values0, w0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        got_hw, numeric_gradient(lambda v: np.sum(d * grad_w(values0, v)), w0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(
        got_hv, numeric_gradient(lambda v: np.sum(d * grad_w(v, w0)), values0), rtol=1e-6, atol=1e-8)


def test_gradient_through_to_dense_matches_finite_differences():
    x = K.placeholder((None, 6), sparse=True, dtype="float64")
    m = random_sparse(5, 6, density=0.4)
    coo = m.tocoo()
    values0, c = coo.data.copy(), RNG.standard_normal((5, 6))

    def loss(values):
        s = np.zeros((5, 6))
        s[coo.row, coo.col] = values
        return np.sum(c * np.sin(s))

    total = K.sum(K.constant(c, dtype="float64") * K.sin(K.to_dense(x)))
    f = K.function([x], [total, K.gradients(total, [x.values])[0]])
    got_loss, got_grad = f([m])
    np.testing.assert_allclose(got_loss, loss(values0), rtol=1e-12)
    np.testing.assert_allclose(got_grad, numeric_gradient(loss, values0), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate_of_sparse_tensors_is_sparse(axis):
    # Keras's backend_test.test_sparse_concat, on each axis
    a, b = random_sparse(4, 5), random_sparse(4, 5, fmt="coo")
    joined = K.concatenate([K.variable(a), K.variable(b)], axis=axis)
    assert K.is_sparse(joined)
    assert K.int_shape(joined) == ((8, 5) if axis == 0 else (4, 10))
    expected = np.concatenate([a.toarray(), b.toarray()], axis=axis).astype(K.floatx())
    np.testing.assert_array_equal(K.eval(joined), expected)
    value = K.get_value(joined)
    order = np.lexsort((value.indices[:, 1], value.indices[:, 0]))
    np.testing.assert_array_equal(order, np.arange(len(order)))  # row-major, as tf.sparse_concat
    np.testing.assert_array_equal(brute_force_dense(*value.indices.T, value.values, expected.shape),
                                  expected)


def test_concatenate_of_sparse_placeholders_and_of_mixed_tensors():
    x = K.placeholder((None, 3), sparse=True, dtype="float64")
    y = K.placeholder((None, 2), sparse=True, dtype="float64")
    d = K.placeholder((None, 4), dtype="float64")
    joined = K.concatenate([x, y])
    mixed = K.concatenate([x, d, y], axis=-1)
    assert K.is_sparse(joined) and K.int_shape(joined) == (None, 5)
    assert not K.is_sparse(mixed) and K.int_shape(mixed) == (None, 9)
    w = RNG.standard_normal((5, 2))
    f = K.function([x, y, d], [joined, mixed, K.dot(joined, K.constant(w, dtype="float64"))])
    a, b, dense = random_sparse(3, 3), random_sparse(3, 2), RNG.standard_normal((3, 4))
    got_joined, got_mixed, got_product = f([a, b, dense])
    expected = np.hstack([a.toarray(), b.toarray()])
    np.testing.assert_array_equal(brute_force_dense(*got_joined.indices.T, got_joined.values,
                                                    got_joined.dense_shape), expected)
    np.testing.assert_array_equal(got_mixed, np.hstack([a.toarray(), dense, b.toarray()]))
    np.testing.assert_allclose(got_product, expected @ w, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"concatenate: sparse tensors of dense shapes "
                                         r"\[\(3, 3\), \(2, 2\)\] differ outside axis 1"):
        f([a, random_sparse(2, 2), np.ones((3, 4))])
    with pytest.raises(ValueError, match="shapes differ outside axis 0"):
        K.concatenate([x, y], axis=0)


def test_kernels_check_indices_and_add_repeated_ones():
    from jit_kernels import sparse as kernels
    from jit_kernels import tuning
    indices = np.array([[0, 1], [2, 0], [0, 1]])
    values = np.array([1.0, 2.0, 3.0])
    dense = RNG.standard_normal((2, 70))
    expected = brute_force_dense(*indices.T, values, (3, 2)) @ dense
    got = kernels.sparse_dense_matmul(indices, values, np.array([3, 2]), dense)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    rows, cols = indices[:, 0].astype(np.int64), indices[:, 1].astype(np.int64)
    parallel = np.full_like(expected, np.nan)
    # the parallel twin, on blocks of 16 columns (the last of 6 columns)
    kernels._scatter_products(rows, cols, values, dense, parallel, 16)
    np.testing.assert_allclose(parallel, expected, rtol=1e-14)
    with tuning.override(LIBRARY_PARALLEL_MIN_WORK=0):  # the threads' share of the columns
        np.testing.assert_allclose(kernels.sparse_dense_matmul(indices, values, np.array([3, 2]), dense),
                                   expected, rtol=1e-14)
    g = RNG.standard_normal((3, 70))
    np.testing.assert_allclose(kernels.sampled_products(indices, np.array([3, 2]), g, dense),
                               [g[r] @ dense[c] for r, c in indices], rtol=1e-13)
    with pytest.raises(ValueError, match=r"index \(2, 0\) of nonzero 1 is outside the dense "
                                         r"shape \(2, 2\)"):
        kernels.sparse_dense_matmul(indices, values, np.array([2, 2]), dense)
    with pytest.raises(ValueError, match=r"index \(0, -1\) of nonzero 0"):
        kernels.sparse_dense_matmul(-indices, values, np.array([3, 2]), dense)
    with pytest.raises(ValueError, match=r"cannot multiply a sparse matrix of shape \(3, 2\) by "
                                         r"a dense one of shape \(3, 70\)"):
        kernels.sparse_dense_matmul(indices, values, np.array([3, 2]), g)
