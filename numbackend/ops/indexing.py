"""Indexing: getitem (ints, slices, None, Ellipsis), gather on the first axis,
and the scatters of their gradients."""
import numpy as np

from ..graph import Tensor, format_shape
from . import batch
from .registry import apply, contiguous, library


def _getitem_infer(inputs, attrs):
    (x,) = inputs
    key = attrs["key"]
    shape, axis = [], 0
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"getitem: too many indices ({n_real}) for a tensor of shape "
                         f"{format_shape(x.shape)}")
    for k in key:
        if k is None:
            shape.append(1)
        elif k is Ellipsis:
            take = x.ndim - n_real
            shape.extend(x.shape[axis:axis + take])
            axis += take
        elif isinstance(k, slice):
            d = x.shape[axis]
            shape.append(None if d is None else len(range(*k.indices(d))))
            axis += 1
        else:
            d = x.shape[axis]
            if d is not None and not -d <= k < d:
                raise IndexError(f"getitem: index {k} is out of range for axis {axis} of size {d}")
            axis += 1
    shape.extend(x.shape[axis:])
    return tuple(shape), x.dtype


def _getitem_grad(g, n):
    return [apply("scatter_like", g, n.inputs[0], key=n.attrs["key"])]


def _scatter_like(g, like, key):
    out = np.zeros(like.shape, dtype=g.dtype)
    out[key] = g
    return out


library("getitem", _getitem_infer, lambda x, key: contiguous(x[key]),
        grad=_getitem_grad, rows=batch.getitem)
library("scatter_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _scatter_like,
        grad=lambda g, n: [apply("getitem", g, key=n.attrs["key"]), None])


def last_axis_window(key, shape):
    """(start, stop) when ``key`` slices only the last axis of an array of static
    ``shape`` (step 1, static bounds, nothing else indexed), else None."""
    if not key or not shape or shape[-1] is None:
        return None
    *lead, last = key
    if not isinstance(last, slice) or any(k is not Ellipsis and k != slice(None) for k in lead):
        return None
    if Ellipsis not in lead and len(key) != len(shape):
        return None
    start, stop, step = last.indices(shape[-1])
    return (start, stop) if step == 1 and start < stop else None


def getitem(x, key):
    """x[key] for ints, slices, None, Ellipsis; a tensor or int array index gathers on axis 0."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(isinstance(k, (Tensor, list, np.ndarray)) for k in key):
        if len(key) == 1:
            return apply("gather", x, key[0])
        raise IndexError("getitem: a tensor index is only supported alone, on the first axis")
    clean = []
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            clean.append(int(k))
        elif isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and not isinstance(part, (int, np.integer)):
                    raise TypeError(f"getitem: slice bounds must be ints, got {k}")
            if k.step == 0:
                raise ValueError("getitem: slice step cannot be zero")
            clean.append(slice(k.start, k.stop, k.step))
        elif k is None or k is Ellipsis:
            clean.append(k)
        else:
            raise TypeError(f"getitem: unsupported index {k!r}")
    if sum(1 for k in clean if k is Ellipsis) > 1:
        raise IndexError("getitem: at most one Ellipsis")
    return apply("getitem", x, key=tuple(clean))


def _gather_infer(inputs, attrs):
    ref, idx = inputs
    if ref.ndim == 0:
        raise ValueError("gather: reference must have rank >= 1")
    if np.dtype(idx.dtype).kind not in "iu":
        raise TypeError(f"gather: indices must be integers, got dtype {idx.dtype}")
    return idx.shape + ref.shape[1:], ref.dtype


def _gather(ref, idx):
    if idx.size and (idx.min() < -ref.shape[0] or idx.max() >= ref.shape[0]):
        raise IndexError(f"gather: index out of range for reference of shape {ref.shape}")
    return np.take(ref, idx, axis=0)


def _scatter_add(g, ref, idx):
    out = np.zeros(ref.shape, dtype=g.dtype)
    np.add.at(out, idx.reshape(-1), g.reshape((-1,) + ref.shape[1:]))
    return out


library("gather", _gather_infer, _gather,
        grad=lambda g, n: [apply("scatter_add", g, n.inputs[0], n.inputs[1]), None],
        rows=batch.gather)
library("scatter_add", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _scatter_add)
