"""Products of a sparse matrix in coordinate form by a dense one, and their gradients.

The sparse matrix A of shape ``dense_shape`` (two ints) holds ``values[k]`` at
row ``indices[k, 0]`` and column ``indices[k, 1]``, as TensorFlow's
SparseTensor does; an index given twice adds its values, as scipy.sparse does.

* :func:`sparse_dense_matmul`: A @ B, or A' @ B (``adjoint_a``), as
  ``tf.sparse_tensor_dense_matmul``.
* :func:`sampled_products`: the dot products of the rows of G and B that the
  nonzeros of A pair up, ``G[indices[k, 0]] . B[indices[k, 1]]``: the gradient
  of A @ B with respect to ``values`` (G its output's gradient).

Numba does not check indices: every function checks them against
``dense_shape`` before a kernel runs.
"""

import numba
import numpy as np
from numba import prange

from . import tuning
from .compiling import njit_cached_twins
from .fork import parallel_ok
from .windows import JIT_OPTIONS, launch


@njit_cached_twins(**JIT_OPTIONS)
def _scatter_products(rows, cols, values, dense, out, width):
    """out[rows[k]] += values[k] * dense[cols[k]] for every k, out zeroed first.
    Parallel over blocks of ``width`` columns, so that no two tasks write one
    element; each block reads every nonzero."""
    n = out.shape[1]
    for block in prange((n + width - 1) // width):
        lo = block * width
        hi = min(lo + width, n)
        out[:, lo:hi] = 0
        for k in range(values.shape[0]):
            v = values[k]
            # on 1-D slices: indexing out[r, j] and dense[c, j] from lo to hi
            # in the loop ran it much slower
            target = out[rows[k], lo:hi]
            source = dense[cols[k], lo:hi]
            for j in range(hi - lo):
                target[j] += v * source[j]


@njit_cached_twins(**JIT_OPTIONS)
def _paired_dots(rows, cols, a, b, out):
    """out[k] = a[rows[k]] . b[cols[k]] for every k (rows of at least one item)."""
    n = a.shape[1]
    for k in prange(out.shape[0]):
        x = a[rows[k]]
        y = b[cols[k]]
        total = x[0] * y[0]
        for j in range(1, n):
            total += x[j] * y[j]
        out[k] = total


def check_indices(where, indices, dense_shape):
    """(rows, columns) of ``indices`` as int64 arrays, and ``dense_shape`` as two
    ints, after checking that every index lies inside the shape."""
    indices = np.asarray(indices)
    dense_shape = np.asarray(dense_shape)
    if indices.ndim != 2 or indices.shape[1] != 2 or dense_shape.shape != (2,):
        raise ValueError(f"{where}: expected indices of shape (nonzeros, 2) and a dense shape of "
                         f"two ints, got {indices.shape} and {dense_shape.shape}")
    if indices.dtype.kind not in "iu" or dense_shape.dtype.kind not in "iu":
        raise TypeError(f"{where}: indices and dense shape must be integers, got "
                        f"{indices.dtype} and {dense_shape.dtype}")
    shape = (int(dense_shape[0]), int(dense_shape[1]))
    if min(shape) < 0:
        raise ValueError(f"{where}: negative dense shape {shape}")
    rows = np.ascontiguousarray(indices[:, 0], dtype=np.int64)
    cols = np.ascontiguousarray(indices[:, 1], dtype=np.int64)
    if rows.size and (rows.min() < 0 or cols.min() < 0
                      or rows.max() >= shape[0] or cols.max() >= shape[1]):
        bad = int(np.flatnonzero((rows < 0) | (cols < 0) | (rows >= shape[0])
                                 | (cols >= shape[1]))[0])
        raise ValueError(f"{where}: index ({rows[bad]}, {cols[bad]}) of nonzero {bad} is "
                         f"outside the dense shape {shape}")
    return rows, cols, shape


def _float_operands(where, *arrays):
    dtype = arrays[0].dtype
    if dtype not in (np.float32, np.float64) or any(a.dtype != dtype for a in arrays):
        raise TypeError(f"{where}: expected float32 or float64 operands of one dtype, got "
                        + ", ".join(str(a.dtype) for a in arrays))
    return [np.ascontiguousarray(a) for a in arrays]


def sparse_dense_matmul(indices, values, dense_shape, dense, adjoint_a=False):
    """A @ dense, or A' @ dense with ``adjoint_a`` (A: see the module's docstring);
    ``values`` and ``dense`` of one float dtype."""
    where = "sparse_dense_matmul"
    rows, cols, shape = check_indices(where, indices, dense_shape)
    values, dense = _float_operands(where, np.asarray(values), np.asarray(dense))
    if values.shape != rows.shape or dense.ndim != 2:
        raise ValueError(f"{where}: expected {rows.size} values and a 2-D dense operand, got "
                         f"values of shape {values.shape} and a dense operand of shape "
                         f"{dense.shape}")
    if adjoint_a:
        rows, cols, shape = cols, rows, shape[::-1]
    if dense.shape[0] != shape[1]:
        raise ValueError(f"{where}: cannot multiply a sparse matrix of shape {shape} by a "
                         f"dense one of shape {dense.shape}")
    out = np.empty((shape[0], dense.shape[1]), dtype=dense.dtype)
    work = rows.size * dense.shape[1] + out.size
    if work >= tuning.LIBRARY_PARALLEL_MIN_WORK and parallel_ok():
        # a block of columns per thread, each nonzero's row of B read in long
        # stretches (blocks of 64 columns ran much slower than whole rows)
        width = max(16, -(-dense.shape[1] // numba.get_num_threads()))
        _scatter_products(rows, cols, values, dense, out, width)
    else:
        _scatter_products.serial(rows, cols, values, dense, out, max(1, dense.shape[1]))
    return out


def sampled_products(indices, dense_shape, a, b, adjoint_a=False):
    """``a[i] . b[j]`` for each nonzero (i, j) of A, or (j, i) with ``adjoint_a``:
    the gradient of ``values`` in :func:`sparse_dense_matmul`, ``a`` the
    gradient of its output and ``b`` its dense operand."""
    where = "sampled_products"
    rows, cols, shape = check_indices(where, indices, dense_shape)
    a, b = _float_operands(where, np.asarray(a), np.asarray(b))
    if adjoint_a:
        rows, cols, shape = cols, rows, shape[::-1]
    if a.ndim != 2 or b.ndim != 2 or a.shape != (shape[0], b.shape[1]) or b.shape[0] != shape[1]:
        raise ValueError(f"{where}: operands of shapes {a.shape} and {b.shape} do not pair up "
                         f"the rows and columns of a sparse matrix of shape {shape}")
    out = np.empty(rows.size, dtype=a.dtype)
    if a.shape[1] == 0:
        out[:] = 0
        return out
    launch(_paired_dots, rows.size * a.shape[1], rows, cols, a, b, out)
    return out
