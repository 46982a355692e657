"""Shape ops: transpose, reshape (static and run-time targets), expand_dims,
concatenate, stack, tile, repeat_elements, pad, reverse, shape, arange, and the
backward ops of their gradients."""
import math

import numpy as np

from ..graph import Constant, format_shape
from . import batch
from .registry import (
    apply,
    contiguous,
    library,
    normalize_axes,
    normalize_axis,
    not_differentiable,
    promote_dtype,
)


def _transpose_infer(inputs, attrs):
    (x,) = inputs
    axes = tuple(int(a) for a in attrs["axes"])
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)) or len(axes) != x.ndim:
        raise ValueError(f"permute_dimensions: pattern {axes} is not a permutation of the axes "
                         f"of a tensor of shape {format_shape(x.shape)}")
    axes = tuple(a % x.ndim for a in axes)
    attrs["axes"] = axes
    return tuple(x.shape[a] for a in axes), x.dtype


library("transpose", _transpose_infer, lambda x, axes: contiguous(np.transpose(x, axes)),
        grad=lambda g, n: [apply("transpose", g, axes=tuple(np.argsort(n.attrs["axes"])))],
        rows=batch.transpose)


def _reshape_infer(inputs, attrs):
    (x,) = inputs
    shape = tuple(int(d) for d in attrs["shape"])
    if sum(1 for d in shape if d == -1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: bad target shape {shape} (at most one -1, no other negatives)")
    known = [d for d in x.shape]
    total = None if any(d is None for d in known) else int(np.prod(known, dtype=np.int64))
    target = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if -1 in shape:
        if total is not None and (target == 0 or total % target):
            raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} into {shape}")
        fill = total // target if total is not None and target else None
        out = tuple(fill if d == -1 else d for d in shape)
    else:
        if total is not None and total != target:
            raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} "
                             f"({total} elements) into {shape} ({target} elements)")
        out = shape
    attrs["shape"] = shape
    return out, x.dtype


library("reshape", _reshape_infer, lambda x, shape: x.reshape(shape),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0])], rows=batch.reshape)
library("reshape_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda x, like: x.reshape(like.shape),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0]), None])


def _expand_dims_infer(inputs, attrs):
    (x,) = inputs
    axes = tuple(int(a) for a in attrs["axes"])
    ndim = x.ndim + len(axes)
    if sorted(set(axes)) != list(axes) or any(not 0 <= a < ndim for a in axes):
        raise ValueError(f"expand_dims: axes {axes} must be increasing and within the "
                         f"{ndim} axes of the result for a tensor of shape {format_shape(x.shape)}")
    attrs["axes"] = axes
    rest = iter(x.shape)
    return tuple(1 if a in axes else next(rest) for a in range(ndim)), x.dtype


# x with axes of length 1 inserted at ``axes`` (positions in the result, sorted):
# a view whatever x's run-time shape
library("expand_dims", _expand_dims_infer, lambda x, axes: np.expand_dims(x, axes),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0])],
        rows=batch.expand_dims)


def sum_to_shape(g, shape):
    """Sum a broadcast gradient back to ``shape`` (NumPy broadcasting undone)."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


library("sum_to", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda g, like: sum_to_shape(g, like.shape),
        grad=lambda g, n: [apply("broadcast_like", g, n.inputs[0]), None])


def _axes_size_infer(inputs, attrs):
    return (), attrs["dtype"]


library("axes_size", _axes_size_infer,
        lambda x, axis, dtype: np.asarray(math.prod(x.shape[a] for a in axis), dtype=dtype),
        grad=not_differentiable)


def _concat_infer(inputs, attrs):
    if not inputs:
        raise ValueError("concatenate: no tensors given")
    ndim = inputs[0].ndim
    if any(t.ndim != ndim for t in inputs):
        raise ValueError("concatenate: tensors of different ranks: "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    if ndim == 0:
        raise ValueError("concatenate: cannot concatenate scalars")
    axis = normalize_axis("concatenate", attrs.get("axis", -1), ndim)
    attrs["axis"] = axis
    shape = []
    for i in range(ndim):
        dims = [t.shape[i] for t in inputs]
        if i == axis:
            shape.append(None if None in dims else sum(dims))
        else:
            known = {d for d in dims if d is not None}
            if len(known) > 1:
                raise ValueError(f"concatenate: shapes differ outside axis {axis}: "
                                 + ", ".join(format_shape(t.shape) for t in inputs))
            shape.append(known.pop() if known else None)
    return tuple(shape), promote_dtype(inputs)


def _concat_grad(g, n):
    axis = n.attrs["axis"]
    grads, start = [], 0
    for t in n.inputs:
        grads.append(apply("slice_axis_like", g, t, axis=axis, start=start))
        size = t.shape[axis]
        if size is None:
            grads = [apply("split_part", g, *n.inputs, axis=axis, index=i) for i in range(len(n.inputs))]
            return grads
        start += size
    return grads


library("concatenate", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis),
        grad=_concat_grad, rows=batch.concatenate)
library("slice_axis_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda g, like, axis, start: contiguous(
            np.take(g, np.arange(start, start + like.shape[axis]), axis=axis)))


def _split_part(g, *parts, axis, index):
    start = sum(p.shape[axis] for p in parts[:index])
    return contiguous(np.take(g, np.arange(start, start + parts[index].shape[axis]), axis=axis))


library("split_part", lambda inputs, attrs: (inputs[1 + attrs["index"]].shape, inputs[0].dtype),
        _split_part)


def _stack_infer(inputs, attrs):
    if not inputs:
        raise ValueError("stack: no tensors given")
    if any(t.ndim != inputs[0].ndim for t in inputs):
        raise ValueError("stack: tensors of different ranks: "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    shape = []
    for dims in zip(*[t.shape for t in inputs]):
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise ValueError("stack: tensors of different shapes: "
                             + ", ".join(format_shape(t.shape) for t in inputs))
        shape.append(known.pop() if known else None)
    shape = tuple(shape)
    axis = normalize_axis("stack", attrs.get("axis", 0), len(shape) + 1)
    attrs["axis"] = axis
    return shape[:axis] + (len(inputs),) + shape[axis:], promote_dtype(inputs)


library("stack", _stack_infer, lambda *xs, axis: np.stack(xs, axis=axis),
        grad=lambda g, n: [apply("take_index", g, axis=n.attrs["axis"], index=i)
                           for i in range(len(n.inputs))])
library("take_index",
        lambda inputs, attrs: (inputs[0].shape[:attrs["axis"]] + inputs[0].shape[attrs["axis"] + 1:],
                               inputs[0].dtype),
        lambda x, axis, index: contiguous(np.take(x, index, axis=axis)))


def _reverse_infer(inputs, attrs):
    (x,) = inputs
    attrs["axes"] = normalize_axes("reverse", attrs["axes"], x.ndim)
    return x.shape, x.dtype


library("reverse", _reverse_infer, lambda x, axes: contiguous(np.flip(x, axes)),
        grad=lambda g, n: [apply("reverse", g, axes=n.attrs["axes"])], rows=batch.reverse)


def _tile_infer(inputs, attrs):
    (x,) = inputs
    reps = tuple(int(r) for r in attrs["reps"])
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ValueError(f"tile: need one non-negative repeat count per axis of "
                         f"{format_shape(x.shape)}, got {reps}")
    attrs["reps"] = reps
    return tuple(None if d is None else d * r for d, r in zip(x.shape, reps)), x.dtype


def _tile_grad(g, n):
    x = n.inputs[0]
    return [apply("untile", g, x, reps=n.attrs["reps"])]


def _untile(g, x, reps):
    shape = []
    for r, d in zip(reps, x.shape):
        shape += [r, d]
    return g.reshape(shape).sum(axis=tuple(range(0, 2 * len(reps), 2)))


library("tile", _tile_infer, lambda x, reps: np.tile(x, reps), grad=_tile_grad, rows=batch.tile)
library("untile", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _untile)


def _repeat_infer(inputs, attrs):
    (x,) = inputs
    axis = normalize_axis("repeat_elements", attrs["axis"], x.ndim)
    attrs["axis"] = axis
    rep = int(attrs["repeats"])
    if rep < 0:
        raise ValueError(f"repeat_elements: rep must be >= 0, got {rep}")
    d = x.shape[axis]
    return x.shape[:axis] + (None if d is None else d * rep,) + x.shape[axis + 1:], x.dtype


def _repeat_grad(g, n):
    axis, rep = n.attrs["axis"], n.attrs["repeats"]
    return [apply("unrepeat", g, axis=axis, repeats=rep)]


def _unrepeat(g, axis, repeats):
    shape = g.shape[:axis] + (g.shape[axis] // repeats, repeats) + g.shape[axis + 1:]
    return g.reshape(shape).sum(axis=axis + 1)


def _unrepeat_infer(inputs, attrs):
    (g,) = inputs
    axis = attrs["axis"]
    d = g.shape[axis]
    return g.shape[:axis] + (None if d is None else d // attrs["repeats"],) + g.shape[axis + 1:], g.dtype


library("repeat_elements", _repeat_infer, lambda x, axis, repeats: np.repeat(x, repeats, axis=axis),
        grad=_repeat_grad)
library("unrepeat", _unrepeat_infer, _unrepeat)


def _pad_infer(inputs, attrs):
    (x,) = inputs
    pads = tuple((int(a), int(b)) for a, b in attrs["pads"])
    if len(pads) != x.ndim or any(a < 0 or b < 0 for a, b in pads):
        raise ValueError(f"pad: need a non-negative (before, after) pair per axis of "
                         f"{format_shape(x.shape)}, got {pads}")
    attrs["pads"] = pads
    return tuple(None if d is None else d + a + b for d, (a, b) in zip(x.shape, pads)), x.dtype


def _unpad(g, pads):
    return contiguous(g[tuple(slice(a, g.shape[i] - b) for i, (a, b) in enumerate(pads))])


library("pad", _pad_infer, lambda x, pads: np.pad(x, pads),
        grad=lambda g, n: [apply("unpad", g, pads=n.attrs["pads"])])
library("unpad", lambda inputs, attrs: (
    tuple(None if d is None else d - a - b for d, (a, b) in zip(inputs[0].shape, attrs["pads"])),
    inputs[0].dtype), _unpad)


def _shape_infer(inputs, attrs):
    return (inputs[0].ndim,), "int32"


library("shape", _shape_infer, lambda x: np.asarray(x.shape, dtype=np.int32),
        grad=not_differentiable)


def dim_read_at_run_time(t):
    """(x, axis) where the scalar tensor ``t`` is ``shape(x)[axis]``, else None."""
    if t.op == "getitem" and t.inputs[0].op == "shape":
        key = t.attrs["key"]
        if len(key) == 1 and isinstance(key[0], int):
            x = t.inputs[0].inputs[0]
            return x, key[0] % x.ndim
    return None


def static_int(t):
    """The value of the scalar int tensor ``t`` where the graph tells it (a
    constant, or ``shape(x)[i]`` of a dim that x's static shape knows), else None."""
    if t.op == "constant":
        return int(t.value)
    read = dim_read_at_run_time(t)
    return None if read is None else read[0].shape[read[1]]


def _static_target(shape):
    """The entries of a 1-D int shape tensor known when the graph is built, None
    for the others, as TensorFlow's reshape reads them: constants, static dims
    read through ``shape(x)``, and stacks, slices and concatenations of those.
    A -1 (inferred at run time) is None."""
    if shape.op == "concatenate" and all(part.ndim == 1 for part in shape.inputs):
        return [d for part in shape.inputs for d in _static_target(part)]
    if shape.op == "constant":
        known = [int(d) for d in shape.value]
    elif shape.op == "shape":
        known = list(shape.inputs[0].shape)
    elif (shape.op == "getitem" and shape.inputs[0].op == "shape" and len(shape.attrs["key"]) == 1
          and isinstance(shape.attrs["key"][0], slice)):
        known = list(shape.inputs[0].inputs[0].shape[shape.attrs["key"][0]])
    elif shape.op == "stack" and all(e.ndim == 0 for e in shape.inputs):
        known = [static_int(e) for e in shape.inputs]
    else:
        known = [None] * shape.shape[0]
    return [d if d is not None and d >= 0 else None for d in known]


def _reshape_dynamic_infer(inputs, attrs):
    """``known`` (optional): target dims known when the graph is built, None
    elsewhere; those the target tensor itself tells are added (_static_target)."""
    x, shape = inputs
    if shape.ndim != 1 or shape.shape[0] is None:
        raise ValueError("reshape: a symbolic target shape must be a 1-D tensor of known length, "
                         f"got shape {format_shape(shape.shape)}")
    if np.dtype(shape.dtype).kind not in "iu":
        raise TypeError(f"reshape: a symbolic target shape must be of an int type, got {shape.dtype}")
    given = tuple(attrs.get("known") or (None,) * shape.shape[0])
    if len(given) != shape.shape[0]:
        raise ValueError(f"reshape: {len(given)} known dims given for a target shape of "
                         f"length {shape.shape[0]}")
    known = tuple(g if g is not None else k for g, k in zip(given, _static_target(shape)))
    if None not in known and None not in x.shape and math.prod(known) != math.prod(x.shape):
        raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} into {known}")
    attrs["known"] = known
    return known, x.dtype


def _reshape_dynamic(x, shape, known):
    """x reshaped to the run-time ``shape``, checked as TensorFlow does (NumPy
    takes any negative entry for -1); ``known``: the static shape it must have."""
    target = tuple(int(d) for d in shape)
    rest = math.prod(d for d in target if d != -1)
    inferred = target.count(-1)
    if (inferred > 1 or any(d < -1 for d in target)
            or (inferred == 0 and rest != x.size) or (inferred == 1 and (rest == 0 or x.size % rest))):
        raise ValueError(f"reshape: cannot reshape a tensor of shape {format_shape(x.shape)} "
                         f"into {target}")
    out = x.reshape(target)
    if any(k is not None and k != d for k, d in zip(known, out.shape)):
        raise ValueError(f"reshape: the target shape {target} differs from the static shape "
                         f"{format_shape(known)} of the result")
    return out


library("reshape_dynamic", _reshape_dynamic_infer, _reshape_dynamic,
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0]), None])


def _arange_infer(inputs, attrs):
    """inputs: scalar start, stop, step; the length is known when all three are constants."""
    if any(t.ndim != 0 for t in inputs):
        raise ValueError("arange: start, stop and step must be scalars, got shapes "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    if all(isinstance(t, Constant) for t in inputs):
        start, stop, step = (t.value.item() for t in inputs)
        if step == 0:
            raise ValueError("arange: step must not be zero")
        return (len(np.arange(start, stop, step)),), attrs["dtype"]
    return (None,), attrs["dtype"]


library("arange", _arange_infer,
        lambda start, stop, step, dtype: np.arange(start, stop, step).astype(dtype),
        grad=not_differentiable)
