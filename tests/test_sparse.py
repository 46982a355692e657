"""The products of jit_kernels.sparse against dense NumPy products."""
import numpy as np
import pytest

from jit_kernels import sparse as kernels

RNG = np.random.default_rng(20261127)


def brute_force_dense(rows, cols, data, shape):
    dense = np.zeros(shape)
    for r, c, v in zip(rows, cols, data):
        dense[r, c] += v
    return dense


def test_kernels_check_indices_and_add_repeated_ones():
    indices = np.array([[0, 1], [2, 0], [0, 1]])
    values = np.array([1.0, 2.0, 3.0])
    dense = RNG.standard_normal((2, 70))  # more columns than one block of the parallel kernel
    expected = brute_force_dense(*indices.T, values, (3, 2)) @ dense
    got = kernels.sparse_dense_matmul(indices, values, np.array([3, 2]), dense)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    rows, cols = indices[:, 0].astype(np.int64), indices[:, 1].astype(np.int64)
    parallel = np.full_like(expected, np.nan)
    kernels._scatter_products(rows, cols, values, dense, parallel)  # the parallel twin
    np.testing.assert_allclose(parallel, expected, rtol=1e-14)
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
