"""Sparse tensors: ops on the three parts of a graph.SparseTensor (indices
(nonzeros, 2) int64, values (nonzeros,), dense_shape (2,) int64), each index
once; numbackend.sparse builds them.  ``shape``/``sparse_shape``: the sparse
tensor's static shape, checked against its dense_shape at run time.  The
kernels (jit_kernels.sparse) are imported when first run, so that importing
numbackend does not import Numba."""
import numpy as np

from ..graph import format_shape
from .registry import apply, library


def _sparse_kernels():
    from jit_kernels import sparse
    return sparse


def _check_sparse_parts(where, indices, values, dense_shape):
    if (indices.ndim != 2 or indices.shape[1] not in (None, 2) or values.ndim != 1
            or dense_shape.shape != (2,)):
        raise ValueError(f"{where}: expected sparse parts of shapes (nonzeros, 2), (nonzeros,) and "
                         f"(2,), got {format_shape(indices.shape)}, {format_shape(values.shape)} "
                         f"and {format_shape(dense_shape.shape)}")
    if indices.dtype != "int64" or dense_shape.dtype != "int64":
        raise TypeError(f"{where}: sparse indices and dense shape must be int64, got "
                        f"{indices.dtype} and {dense_shape.dtype}")


def _sparse_dims(where, indices, dense_shape, static, values=None):
    """The rows, columns and (rows, columns) size of a sparse tensor's parts, checked
    against each other and against its static shape."""
    rows, cols, dims = _sparse_kernels().check_indices(where, indices, dense_shape)
    if any(s is not None and s != d for s, d in zip(static, dims)):
        raise ValueError(f"{where}: a sparse tensor of shape {format_shape(static)} has dense "
                         f"shape {dims}")
    if values is not None and values.shape != rows.shape:
        raise ValueError(f"{where}: {rows.size} sparse indices but values of shape {values.shape}")
    return rows, cols, dims


def _sparse_to_dense_infer(inputs, attrs):
    indices, values, dense_shape = inputs
    _check_sparse_parts("to_dense", indices, values, dense_shape)
    return tuple(attrs["shape"]), values.dtype


def _sparse_to_dense(indices, values, dense_shape, shape):
    rows, cols, dims = _sparse_dims("to_dense", indices, dense_shape, shape, values)
    out = np.zeros(dims, dtype=values.dtype)
    out[rows, cols] = values  # each index once
    return out


library("sparse_to_dense", _sparse_to_dense_infer, _sparse_to_dense,
        grad=lambda g, n: [None, apply("sparse_gather", g, n.inputs[0], n.inputs[2]), None])


def _sparse_gather_infer(inputs, attrs):
    dense, indices, _ = inputs
    if dense.ndim != 2:
        raise ValueError(f"sparse_gather: expected a 2-D tensor, got shape "
                         f"{format_shape(dense.shape)}")
    return (indices.shape[0],), dense.dtype


def _sparse_gather(dense, indices, dense_shape):
    """dense[i, j] for each index (i, j) of a sparse tensor of dense's shape."""
    rows, cols, _ = _sparse_dims("sparse_gather", indices, dense_shape, dense.shape)
    return dense[rows, cols]


library("sparse_gather", _sparse_gather_infer, _sparse_gather,
        grad=lambda g, n: [apply("sparse_to_dense", n.inputs[1], g, n.inputs[2],
                                 shape=n.inputs[0].shape), None, None])


def _sparse_matmul_infer(inputs, attrs):
    indices, values, dense_shape, dense = inputs
    _check_sparse_parts("dot", indices, values, dense_shape)
    outer, inner = attrs["sparse_shape"][::-1] if attrs["adjoint_a"] else attrs["sparse_shape"]
    if dense.ndim != 2 or (inner is not None and dense.shape[0] not in (None, inner)):
        raise ValueError(f"dot: cannot multiply a sparse tensor of shape "
                         f"{format_shape(attrs['sparse_shape'])}{' transposed' * attrs['adjoint_a']} "
                         f"by a dense one of shape {format_shape(dense.shape)}")
    if values.dtype != dense.dtype or values.dtype not in ("float32", "float64"):
        raise TypeError(f"dot: a sparse product needs float32 or float64 operands of one dtype, "
                        f"got {values.dtype} and {dense.dtype}")
    return (outer, dense.shape[1]), dense.dtype


def _sparse_matmul(indices, values, dense_shape, dense, adjoint_a, sparse_shape):
    _sparse_dims("dot", indices, dense_shape, sparse_shape, values)
    return _sparse_kernels().sparse_dense_matmul(indices, values, dense_shape, dense, adjoint_a)


def _sparse_matmul_grad(g, n, wanted):
    indices, values, dense_shape, dense = n.inputs
    adjoint, static = n.attrs["adjoint_a"], n.attrs["sparse_shape"]
    g_values = g_dense = None
    if wanted[1]:
        g_values = apply("sparse_sampled_products", indices, dense_shape, g, dense,
                         adjoint_a=adjoint, sparse_shape=static)
    if wanted[3]:
        g_dense = apply("sparse_dense_matmul", indices, values, dense_shape, g,
                        adjoint_a=not adjoint, sparse_shape=static)
    return [None, g_values, None, g_dense]


# A @ dense (A' @ dense with adjoint_a) for the sparse A of the first three inputs
library("sparse_dense_matmul", _sparse_matmul_infer, _sparse_matmul, grad=_sparse_matmul_grad,
        grad_takes_wanted=True)


def _sampled_products_infer(inputs, attrs):
    indices, _, a, b = inputs
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype:
        raise ValueError(f"sparse_sampled_products: expected two 2-D tensors of one dtype, got "
                         f"{format_shape(a.shape)} {a.dtype} and {format_shape(b.shape)} {b.dtype}")
    return (indices.shape[0],), a.dtype


def _sampled_products(indices, dense_shape, a, b, adjoint_a, sparse_shape):
    _sparse_dims("dot", indices, dense_shape, sparse_shape)
    return _sparse_kernels().sampled_products(indices, dense_shape, a, b, adjoint_a)


def _sampled_products_grad(g, n):
    indices, dense_shape, a, b = n.inputs
    adjoint, static = n.attrs["adjoint_a"], n.attrs["sparse_shape"]
    return [None, None,
            apply("sparse_dense_matmul", indices, g, dense_shape, b, adjoint_a=adjoint,
                  sparse_shape=static),
            apply("sparse_dense_matmul", indices, g, dense_shape, a, adjoint_a=not adjoint,
                  sparse_shape=static)]


# a[i] . b[j] for each index (i, j) of the sparse tensor (a[j] . b[i] with
# adjoint_a): the gradient of sparse_dense_matmul's values
library("sparse_sampled_products", _sampled_products_infer, _sampled_products,
        grad=_sampled_products_grad)


def _sparse_concat_dims(dense_shapes, axis):
    """The (rows, columns) of each part and of their concatenation along ``axis``."""
    dims = [(int(s[0]), int(s[1])) for s in dense_shapes]
    if any(d[1 - axis] != dims[0][1 - axis] for d in dims):
        raise ValueError(f"concatenate: sparse tensors of dense shapes {dims} differ outside "
                         f"axis {axis}")
    joint = list(dims[0])
    joint[axis] = sum(d[axis] for d in dims)
    return dims, np.array(joint, dtype=np.int64)


def _sparse_concat_indices(*parts, axis):
    """The indices of the concatenation of the sparse tensors with indices
    ``parts[0::2]`` and dense shapes ``parts[1::2]``."""
    dims, _ = _sparse_concat_dims(parts[1::2], axis)
    moved, offset = [], 0
    for indices, d in zip(parts[0::2], dims):
        shifted = np.array(indices, dtype=np.int64)
        shifted[:, axis] += offset
        moved.append(shifted)
        offset += d[axis]
    return np.concatenate(moved, axis=0)


library("sparse_concat_indices", lambda inputs, attrs: ((None, 2), "int64"),
        _sparse_concat_indices)
library("sparse_concat_shape", lambda inputs, attrs: ((2,), "int64"),
        lambda *dense_shapes, axis: _sparse_concat_dims(dense_shapes, axis)[1])
