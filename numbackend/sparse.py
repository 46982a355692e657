"""Sparse tensors as Keras 2.2.5's TensorFlow backend has them.

A sparse tensor (graph.SparseTensor) is 2-D: the indices, values and dense
shape of its nonzeros, as TensorFlow's SparseTensor.  ``K.variable`` of a
scipy.sparse matrix and ``K.placeholder(..., sparse=True)`` (Keras's
``Input(sparse=True)``) make one; ``K.to_dense``, ``K.dot`` (sparse times
dense, differentiable with respect to both operands) and ``K.concatenate``
read one; every other op refuses it, as TensorFlow's do.

At the boundary, a scipy.sparse matrix of any format (or a
:class:`SparseTensorValue`) becomes the three arrays, an index given twice
with its values added as scipy.sparse does; ``K.function`` returns a sparse
output, and ``K.get_value`` a sparse tensor's value, as a
:class:`SparseTensorValue` in row-major order, as TensorFlow's session does.
SciPy is not a dependency: scipy.sparse matrices are recognised only where
scipy.sparse is already imported.
"""
from collections import namedtuple

import numpy as np

from . import config
from .graph import Constant, Placeholder, SparseTensor, canonical_dtype, format_shape
from .ops import apply, as_tensor, normalize_axis
from .runtime import Function, is_scipy_sparse, pickled

SparseTensorValue = namedtuple("SparseTensorValue", "indices values dense_shape")
SparseTensorValue.__doc__ = """The value of a sparse tensor, as TensorFlow's: ``indices``
(nonzeros, 2) int64 in row-major order, ``values`` (nonzeros,), ``dense_shape`` (2,) int64."""


def is_sparse(x):
    """Whether x is a sparse tensor."""
    return isinstance(x, SparseTensor)


def sparse_parts(where, value, dtype):
    """(indices, values, dense_shape) arrays of a scipy.sparse matrix or a
    SparseTensorValue: int64 indices in row-major order, each once (the values
    of an index given twice added), ``values`` of ``dtype``, int64 dense shape."""
    if is_scipy_sparse(value):
        if value.ndim != 2:
            raise ValueError(f"{where}: sparse tensors are 2-D, got a scipy.sparse value of shape "
                             f"{value.shape}")
        coo = value.tocoo()
        indices = np.stack([coo.row, coo.col], axis=1).astype(np.int64)
        values, dense_shape = coo.data, coo.shape
    elif isinstance(value, SparseTensorValue):
        indices, values, dense_shape = value
        indices = np.asarray(indices)
        if indices.ndim != 2 or indices.shape[1:] != (2,) or indices.dtype.kind not in "iu":
            raise ValueError(f"{where}: sparse indices must be integers of shape (nonzeros, 2), "
                             f"got {indices.dtype} of shape {indices.shape}")
        indices = indices.astype(np.int64)
    else:
        raise TypeError(f"{where}: expected a scipy.sparse matrix or a SparseTensorValue, got "
                        f"{_describe(value)}")
    values = np.asarray(values)
    dense_shape = np.array(dense_shape, dtype=np.int64).reshape(-1)
    if values.shape != indices.shape[:1] or dense_shape.shape != (2,) or dense_shape.min() < 0:
        raise ValueError(f"{where}: {indices.shape[0]} sparse indices, values of shape "
                         f"{values.shape} and dense shape {tuple(dense_shape)} do not fit")
    if values.dtype.kind not in "biuf" or (np.dtype(dtype).kind in "biu" and values.dtype.kind == "f"
                                           and not np.array_equal(values, np.trunc(values))):
        raise TypeError(f"{where}: cannot cast sparse values of dtype {values.dtype} to {dtype}")
    rows, cols = indices[:, 0], indices[:, 1]
    outside = (rows < 0) | (cols < 0) | (rows >= dense_shape[0]) | (cols >= dense_shape[1])
    if outside.any():
        k = int(np.flatnonzero(outside)[0])
        raise ValueError(f"{where}: sparse index {tuple(indices[k])} is outside the dense shape "
                         f"{tuple(dense_shape)}")
    indices, values = _row_major(indices, values.astype(dtype))
    return indices, values, dense_shape


def _row_major(indices, values):
    """The indices sorted in row-major order, each once, with their values (those
    of an index given twice added, as scipy.sparse does)."""
    rows, cols = indices[:, 0], indices[:, 1]
    if len(rows) > 1 and not np.all((rows[1:] > rows[:-1])
                                    | ((rows[1:] == rows[:-1]) & (cols[1:] > cols[:-1]))):
        order = np.lexsort((cols, rows))
        indices, values = indices[order], values[order]
        rows, cols = indices[:, 0], indices[:, 1]
        first = np.ones(len(rows), dtype=bool)
        first[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        if not first.all():
            starts = np.flatnonzero(first)
            indices, values = indices[starts], np.add.reduceat(values, starts)
    return np.ascontiguousarray(indices), np.ascontiguousarray(values)


def _describe(value):
    shape = getattr(value, "shape", None)
    return type(value).__name__ + ("" if shape is None else f" of shape {tuple(shape)}")


def variable(value, dtype=None, name=None):
    """A sparse tensor holding a scipy.sparse matrix's nonzeros, of ``dtype``
    (floatx by default; TensorFlow keeps the matrix's).  As with TensorFlow's
    backend it is not a variable: its value is fixed, and not trainable."""
    dtype = canonical_dtype(config.floatx() if dtype is None else dtype, "variable")
    indices, values, dense_shape = sparse_parts("variable", value, dtype)
    return SparseTensor(Constant(indices, name=_part_name(name, "indices")),
                        Constant(values, dtype=dtype, name=_part_name(name, "values")),
                        Constant(dense_shape, name=_part_name(name, "dense_shape")),
                        tuple(int(d) for d in dense_shape), name=name)


def placeholder(shape, dtype, name=None):
    """A 2-D sparse input of compiled functions, fed with a scipy.sparse matrix
    of ``shape`` (whose entries may be None)."""
    if len(shape) != 2:
        raise ValueError(f"placeholder: sparse placeholders are 2-D, got shape {format_shape(shape)}")
    return SparseTensor(Placeholder((None, 2), "int64", name=_part_name(name, "indices")),
                        Placeholder((None,), dtype, name=_part_name(name, "values")),
                        Placeholder((2,), "int64", name=_part_name(name, "dense_shape")),
                        shape, name=name)


def _part_name(name, part):
    # as TensorFlow names a sparse placeholder's parts: 'Placeholder/indices:0'
    if name is None:
        return None
    base, colon, index = name.rpartition(":")
    return f"{base}/{part}:{index}" if colon else f"{name}/{part}"


def to_dense(x):
    """The dense tensor of sparse tensor x; any other tensor as it is."""
    if not is_sparse(x):
        return x
    return apply("sparse_to_dense", *x.inputs, shape=x.shape)


def matmul(x, y):
    """sparse x times dense y (2-D), as ``tf.sparse_tensor_dense_matmul``; the
    operands take their common dtype, which must be float32 or float64."""
    y = as_tensor(y, where="dot")
    if is_sparse(y):
        raise TypeError(f"dot: both operands are sparse (shapes {format_shape(x.shape)} and "
                        f"{format_shape(y.shape)}); convert one with K.to_dense")
    if y.ndim != 2:
        raise ValueError(f"dot: a sparse tensor of shape {format_shape(x.shape)} multiplies 2-D "
                         f"tensors only, got shape {format_shape(y.shape)}")
    dtype = np.result_type(x.dtype, y.dtype).name
    values = x.values if x.values.dtype == dtype else apply("cast", x.values, dtype=dtype)
    y = y if y.dtype == dtype else apply("cast", y, dtype=dtype)
    return apply("sparse_dense_matmul", x.indices, values, x.dense_shape, y, adjoint_a=False,
                 sparse_shape=x.shape)


def concatenate(tensors, axis):
    """The sparse tensors joined along ``axis``, as ``tf.sparse_concat``."""
    axis = normalize_axis("concatenate", axis, 2)
    shape = []
    for i in range(2):
        dims = [t.shape[i] for t in tensors]
        if i == axis:
            shape.append(None if None in dims else sum(dims))
            continue
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise ValueError(f"concatenate: shapes differ outside axis {axis}: "
                             + ", ".join(format_shape(t.shape) for t in tensors))
        shape.append(known.pop() if known else None)
    parts = [p for t in tensors for p in (t.indices, t.dense_shape)]
    values = apply("concatenate", *[t.values for t in tensors], axis=0)
    return SparseTensor(apply("sparse_concat_indices", *parts, axis=axis), values,
                        apply("sparse_concat_shape", *[t.dense_shape for t in tensors], axis=axis),
                        tuple(shape))


class SparseFunction:
    """A compiled function with sparse inputs or outputs (see ``K.function``):
    a :class:`~numbackend.runtime.Function` of their parts.  Each sparse input
    is fed a scipy.sparse matrix (or a SparseTensorValue); each sparse output
    comes back as a SparseTensorValue in row-major order."""

    def __init__(self, inputs, outputs, updates=(), name=None):
        self.inputs = list(inputs)
        self.single_output = not isinstance(outputs, (list, tuple))
        self.outputs = [outputs] if self.single_output else list(outputs)
        parts_in, numbers = [], []
        for i, x in enumerate(self.inputs):
            if is_sparse(x):
                if not x.is_placeholder:
                    raise TypeError(f"function: input {i} must be a placeholder, got the sparse "
                                    f"tensor {x.name!r} of shape {format_shape(x.shape)}")
                parts_in += x.inputs
                numbers += [i] * len(x.inputs)
            else:
                parts_in.append(x)
                numbers.append(i)
        parts_out = [p for o in self.outputs for p in (o.inputs if is_sparse(o) else (o,))]
        self.updates = list(updates)
        self.function = Function(parts_in, parts_out, self.updates, name=name,
                                 input_numbers=numbers)
        self.name = name

    def __reduce__(self):
        """Pickles as runtime.Function does: built again from its graph where unpickled."""
        return pickled(SparseFunction, (self.inputs, self.outputs[0] if self.single_output
                                        else self.outputs, self.updates, self.name),
                       "function (pickled)")

    def __call__(self, values=()):
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"function: call with a list of input arrays, got {type(values).__name__}")
        if len(values) != len(self.inputs):
            raise ValueError(f"function: expected {len(self.inputs)} input(s), got {len(values)}")
        arrays = []
        for i, (x, value) in enumerate(zip(self.inputs, values)):
            if not is_sparse(x):
                arrays.append(value)
                continue
            where = f"function: input {i} ({x.name!r})"
            if not (is_scipy_sparse(value) or isinstance(value, SparseTensorValue)):
                raise TypeError(f"{where} is sparse, of shape {format_shape(x.shape)}: feed a "
                                f"scipy.sparse matrix, got {_describe(value)}")
            indices, parts, dense_shape = sparse_parts(where, value, x.dtype)
            if any(s is not None and s != d for s, d in zip(x.shape, dense_shape)):
                raise ValueError(f"{where} expects shape {format_shape(x.shape)}, got "
                                 f"{tuple(int(d) for d in dense_shape)}")
            arrays += [indices, parts, dense_shape]
        results = iter(self.function(arrays))
        outputs = []
        for o in self.outputs:
            if is_sparse(o):
                indices, parts, dense_shape = next(results), next(results), next(results)
                outputs.append(SparseTensorValue(*_row_major(indices, parts), dense_shape.copy()))
            else:
                outputs.append(next(results))
        return outputs[0] if self.single_output else outputs

    def explain(self):
        """The compiled plan of the function of the parts, one line per step."""
        return self.function.explain()

    def kernel_sources(self):
        """The generated source of each kernel the plan calls."""
        return self.function.kernel_sources()


def shape(x):
    """The dense shape of sparse tensor x, as an int32 tensor."""
    return apply("cast", x.dense_shape, dtype="int32")


def uses_sparse(inputs, outputs):
    """Whether a function of these inputs and outputs has a sparse one."""
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return any(is_sparse(x) for x in list(inputs) + list(outputs))


__all__ = ["SparseTensorValue"]
