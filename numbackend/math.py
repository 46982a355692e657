"""Math, reductions, linear algebra and shape manipulation: the Keras backend API.

Each function has the signature and meaning of Keras 2.2.5's TensorFlow
backend, and also accepts the Keras 1 keyword spellings where they are
unambiguous (``dim=`` in ``expand_dims``, ``nb_classes=`` in ``one_hot``,
``dim_ordering=`` in the padding functions, ``lesser``/``lesser_equal``).
Every function builds graph nodes through ``ops.apply``; bad arguments raise
at once, naming the function and the shapes involved.
"""
import builtins
import functools
import numbers
import operator

import numpy as np

from . import config, ops, sparse
from .graph import canonical_dtype, format_shape, is_tensor
from .ops import apply, as_tensor

# ---------------------------------------------------------------------------
# Element-wise


def abs(x):
    """Element-wise absolute value."""
    return apply("abs", x)


def square(x):
    """Element-wise square."""
    return apply("square", x)


def sqrt(x):
    """Element-wise square root; negative inputs are clipped to 0 first (as Keras does)."""
    return apply("sqrt", apply("maximum", x, 0))


def exp(x):
    """Element-wise exponential."""
    return apply("exp", x)


def log(x):
    """Element-wise natural logarithm.

    The log of a ``softmax`` output is computed from the softmax's input z as
    ``z - max(z) - log(sum(exp(z - max(z))))``, which stays finite (with finite
    gradients) where the softmax underflows to 0."""
    marked = getattr(x, "_softmax_of", None)
    if marked is None:
        return apply("log", x)
    logits, axis = marked
    if logits.dtype != x.dtype:
        logits = apply("cast", logits, dtype=x.dtype)
    return log_softmax(logits, axis)


def log_softmax(logits, axis):
    """``log(softmax(logits))`` along ``axis``, as ``z - log(sum(exp(z)))`` with
    ``z = logits - max(logits)``: finite where the softmax underflows to 0.

    The result does not depend on the shift, so no gradient flows through the
    max (it would be exactly zero, at the cost of routing it to the argmax)."""
    peak = apply("stop_gradient", apply("shift_max", logits, axis=axis, keepdims=True))
    shifted = apply("subtract", logits, peak)
    total = apply("sum", apply("exp_nonpositive", shifted), axis=axis, keepdims=True)
    return apply("subtract", shifted, apply("log", total))


def round(x):
    """Element-wise rounding to the closest integer; ties go to the even integer."""
    return apply("round", x)


def sign(x):
    """Element-wise sign: -1, 0 or 1."""
    return apply("sign", x)


def pow(x, a):
    """Element-wise exponentiation: x ** a."""
    return apply("power", x, a)


def clip(x, min_value, max_value):
    """Element-wise value clipping to [min_value, max_value].

    A bound of None means no bound on that side; when both bounds are numbers
    and ``max_value < min_value``, ``max_value`` is raised to ``min_value``.
    The bounds may be tensors that broadcast against x.
    """
    if (isinstance(min_value, numbers.Real) and isinstance(max_value, numbers.Real)
            and max_value < min_value):
        max_value = min_value
    x = as_tensor(x)
    bounds = [b for b in (min_value, max_value) if b is not None]
    ops.broadcast_shapes("clip", x.shape, *[np.shape(b) if not is_tensor(b) else b.shape
                                           for b in bounds])
    if min_value is not None:
        x = apply("maximum", x, min_value)
    if max_value is not None:
        x = apply("minimum", x, max_value)
    return x


def equal(x, y):
    """Element-wise x == y, as a bool tensor."""
    return apply("equal", x, y)


def not_equal(x, y):
    """Element-wise x != y, as a bool tensor."""
    return apply("not_equal", x, y)


def greater(x, y):
    """Element-wise x > y, as a bool tensor."""
    return apply("greater", x, y)


def greater_equal(x, y):
    """Element-wise x >= y, as a bool tensor."""
    return apply("greater_equal", x, y)


def less(x, y):
    """Element-wise x < y, as a bool tensor."""
    return apply("less", x, y)


def less_equal(x, y):
    """Element-wise x <= y, as a bool tensor."""
    return apply("less_equal", x, y)


def lesser(x, y):
    """Keras 1 name of ``less``: element-wise x < y."""
    return less(x, y)


def lesser_equal(x, y):
    """Keras 1 name of ``less_equal``: element-wise x <= y."""
    return less_equal(x, y)


def maximum(x, y):
    """Element-wise maximum of two tensors."""
    return apply("maximum", x, y)


def minimum(x, y):
    """Element-wise minimum of two tensors."""
    return apply("minimum", x, y)


def sin(x):
    """Element-wise sine."""
    return apply("sin", x)


def cos(x):
    """Element-wise cosine."""
    return apply("cos", x)


# ---------------------------------------------------------------------------
# Reductions


def max(x, axis=None, keepdims=False):
    """Maximum over ``axis`` (an int, a list of ints, negative counts from the end;
    None: all axes); ``keepdims`` keeps the reduced axes with length 1."""
    return apply("max", x, axis=axis, keepdims=keepdims)


def min(x, axis=None, keepdims=False):
    """Minimum over ``axis`` (int, list or None: all axes), optionally keeping dims."""
    return apply("min", x, axis=axis, keepdims=keepdims)


def sum(x, axis=None, keepdims=False):
    """Sum over ``axis`` (int, list or None: all axes), optionally keeping dims."""
    return apply("sum", x, axis=axis, keepdims=keepdims)


def prod(x, axis=None, keepdims=False):
    """Product over ``axis`` (int, list or None: all axes), optionally keeping dims."""
    return apply("prod", x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    """Mean over ``axis`` (int, list or None: all axes), optionally keeping dims.
    Booleans and integers give a floatx result."""
    return apply("mean", x, axis=axis, keepdims=keepdims)


def var(x, axis=None, keepdims=False):
    """Variance (mean squared deviation from the mean) over ``axis``."""
    return _variance("var", x, axis, keepdims)


def std(x, axis=None, keepdims=False):
    """Standard deviation (square root of the variance) over ``axis``."""
    return apply("sqrt", _variance("std", x, axis, keepdims))


def _variance(where, x, axis, keepdims):
    x = as_tensor(x)
    axes = ops.normalize_axes(where, axis, x.ndim)
    if np.dtype(x.dtype).kind != "f":  # booleans and integers: floatx
        x = apply("cast", x, dtype=config.floatx())
    deviation = apply("subtract", x, apply("mean", x, axis=axes, keepdims=True))
    return apply("mean", apply("square", deviation), axis=axes, keepdims=keepdims)


def any(x, axis=None, keepdims=False):
    """Logical OR over ``axis``: True where any value is non-zero (a bool tensor)."""
    return apply("any", x, axis=axis, keepdims=keepdims)


def all(x, axis=None, keepdims=False):
    """Logical AND over ``axis``: True where all values are non-zero (a bool tensor)."""
    return apply("all", x, axis=axis, keepdims=keepdims)


def logsumexp(x, axis=None, keepdims=False):
    """log(sum(exp(x))) over ``axis``, computed stably as
    max + log(sum(exp(x - max))) so that large inputs do not overflow."""
    x = as_tensor(x)
    axes = ops.normalize_axes("logsumexp", axis, x.ndim)
    peak = apply("max", x, axis=axes, keepdims=True)
    # Where the maximum is inf or nan, shift by 0: the sum then gives inf, 0 or nan as it should.
    finite = apply("less", apply("abs", peak), np.inf)
    peak = apply("stop_gradient", apply("where", finite, peak, 0))
    total = apply("sum", apply("exp", apply("subtract", x, peak)), axis=axes, keepdims=True)
    result = apply("add", apply("log", total), peak)
    if keepdims:
        return result
    return reshape(result, [d for i, d in enumerate(_dims(x)) if i not in axes])


def argmax(x, axis=-1):
    """Index of the maximum value along ``axis`` (int64)."""
    return apply("argmax", x, axis=axis)


def argmin(x, axis=-1):
    """Index of the minimum value along ``axis`` (int64)."""
    return apply("argmin", x, axis=axis)


def cumsum(x, axis=0):
    """Cumulative sum along ``axis``."""
    return apply("cumsum", x, axis=axis)


def cumprod(x, axis=0):
    """Cumulative product along ``axis``."""
    return apply("cumprod", x, axis=axis)


# ---------------------------------------------------------------------------
# Linear algebra and indexing


def dot(x, y):
    """Matrix product of x and y; for N-D operands it contracts the last axis of x
    with the second-to-last axis of y, as Theano does: (2, 3) . (4, 3, 5) -> (2, 4, 5).

    A sparse x times a 2-D dense y is dense (``tf.sparse_tensor_dense_matmul``),
    differentiable with respect to y and to x's values; a sparse y is refused,
    as with TensorFlow."""
    if sparse.is_sparse(x):
        return sparse.matmul(x, y)
    x, y = as_tensor(x), as_tensor(y)
    if y.ndim <= 2:
        return apply("dot", x, y)
    if x.ndim == 0 or _known_and_different(x.shape[-1], y.shape[-2]):
        raise ValueError(f"dot: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)}")
    # As a matrix product: y's contracted axis first, the others flattened after it.
    x_dims, y_dims = _dims(x), _dims(y)
    rank = y.ndim
    pattern = [rank - 2] + list(range(rank - 2)) + [rank - 1]
    y_matrix = reshape(permute_dimensions(y, pattern), [y_dims[-2], -1])
    product = apply("dot", x, y_matrix)
    return reshape(product, x_dims[:-1] + y_dims[:-2] + y_dims[-1:])


def batch_dot(x, y, axes=None):
    """Batch-wise dot product: for each sample b, the dot product of x[b] and y[b]
    over the axes ``axes`` (an int for both, or an (axis of x, axis of y) pair).

    The result has x's axes (less the reduced one), then y's (less the batch axis
    and the reduced one); a result of rank 1 is expanded to (batch, 1).
    ``axes=None`` reduces the last axis of x with the last axis of y when y has
    rank 2, else with its second-to-last axis. Example: for
    x = [[1, 2], [3, 4]] and y = [[5, 6], [7, 8]], ``batch_dot(x, y, axes=1)``
    is [[17], [53]]; x of shape (32, 20, 1) and y of shape (32, 30, 20) with
    ``axes=(1, 2)`` give shape (32, 1, 30).
    """
    x, y = as_tensor(x), as_tensor(y)
    shapes = f"{format_shape(x.shape)} and {format_shape(y.shape)}"
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"batch_dot: inputs must have rank >= 2, got shapes {shapes}")
    if _known_and_different(x.shape[0], y.shape[0]):
        raise ValueError(f"batch_dot: inputs have different batch sizes: {shapes}")
    if axes is None:
        axes = (x.ndim - 1, y.ndim - 1 if y.ndim == 2 else y.ndim - 2)
    elif isinstance(axes, (int, np.integer)):
        axes = (axes, axes)
    if len(axes) != 2 or builtins.any(isinstance(a, (list, tuple)) for a in axes):
        raise ValueError(f"batch_dot: axes must be None, an int or a pair of ints, got {axes}")
    x_axis = ops.normalize_axis("batch_dot", axes[0], x.ndim)
    y_axis = ops.normalize_axis("batch_dot", axes[1], y.ndim)
    if x_axis == 0 or y_axis == 0:
        raise ValueError(f"batch_dot: cannot reduce over the batch axis 0 (axes={axes}, "
                         f"shapes {shapes}); add a batch axis with expand_dims(x, 0)")
    if _known_and_different(x.shape[x_axis], y.shape[y_axis]):
        raise ValueError(f"batch_dot: cannot reduce axis {x_axis} of x with axis {y_axis} of y "
                         f"({x.shape[x_axis]} != {y.shape[y_axis]}) for shapes {shapes}")
    # As a batched matrix product (batch, m, k) @ (batch, k, n).
    x_rest = [i for i in range(1, x.ndim) if i != x_axis]
    y_rest = [i for i in range(1, y.ndim) if i != y_axis]
    x_dims, y_dims = _dims(x), _dims(y)
    batch = x_dims[0] if x.shape[0] is not None else y_dims[0]
    x_rest_dims = [x_dims[i] for i in x_rest]
    y_rest_dims = [y_dims[i] for i in y_rest]
    x3 = _permute_if_needed(x, [0] + x_rest + [x_axis])
    x3 = _reshape_if_needed(x3, [batch, _product(x_rest_dims), x_dims[x_axis]])
    y3 = _permute_if_needed(y, [0, y_axis] + y_rest)
    y3 = _reshape_if_needed(y3, [batch, y_dims[y_axis], _product(y_rest_dims)])
    result = apply("matmul", x3, y3)
    out_dims = [batch] + x_rest_dims + y_rest_dims
    if len(out_dims) == 1:
        out_dims.append(1)
    return _reshape_if_needed(result, out_dims)


def transpose(x):
    """The tensor with its axes reversed (a matrix's transpose)."""
    x = as_tensor(x)
    return apply("transpose", x, axes=tuple(reversed(range(x.ndim))))


def gather(reference, indices):
    """The slices ``reference[i]`` for each integer i in ``indices``:
    shape indices.shape + reference.shape[1:]."""
    return apply("gather", reference, indices)


def one_hot(indices, num_classes=None, nb_classes=None):
    """One-hot encoding of an integer tensor: shape indices.shape + (num_classes,),
    floatx; indices outside [0, num_classes) give rows of zeros.
    Keras 1 spelled ``num_classes`` as ``nb_classes``."""
    num_classes = _one_of("one_hot", "num_classes", num_classes, "nb_classes", nb_classes)
    indices = as_tensor(indices)
    if np.dtype(indices.dtype).kind not in "iu":
        raise TypeError(f"one_hot: indices must be integers, got dtype {indices.dtype} "
                        f"of shape {format_shape(indices.shape)}")
    classes = np.arange(int(num_classes), dtype=indices.dtype)
    hits = apply("equal", expand_dims(indices, -1), classes)
    return apply("cast", hits, dtype=config.floatx())


def reverse(x, axes):
    """x reversed along ``axes`` (an int or a list of ints)."""
    if isinstance(axes, (int, np.integer)):
        axes = [axes]
    return apply("reverse", x, axes=tuple(axes))


def arange(start, stop=None, step=1, dtype="int32"):
    """A 1-D tensor of evenly spaced values from ``start`` to ``stop`` (excluded) by
    ``step``; with one argument, the values 0 .. start - 1 (empty when start < 0).
    The arguments may be numbers or scalar tensors."""
    if stop is None:
        start, stop = 0, start
    return apply("arange", start, stop, step, dtype=canonical_dtype(dtype, "arange"))


def in_top_k(predictions, targets, k):
    """For each sample i, whether ``predictions[i, targets[i]]`` is among the ``k``
    largest values of ``predictions[i]`` (a bool tensor of shape (batch,))."""
    return apply("in_top_k", predictions, targets, k=int(k))


# ---------------------------------------------------------------------------
# Shape manipulation


def concatenate(tensors, axis=-1):
    """The tensors joined along ``axis``.  As with TensorFlow's backend, sparse
    tensors joined make a sparse tensor (``tf.sparse_concat``), sparse tensors
    among dense ones are made dense first."""
    tensors = list(tensors)
    if tensors and builtins.all(sparse.is_sparse(t) for t in tensors):
        return sparse.concatenate(tensors, axis)
    return apply("concatenate", *[sparse.to_dense(t) for t in tensors], axis=axis)


def reshape(x, shape):
    """x with a new shape, as TensorFlow's reshape.

    ``shape`` is a 1-D int tensor, or a list or tuple of ints and scalar int
    tensors such as ``shape(x)[0]`` (packed into one tensor, as ``tf.stack``
    would); one entry may be -1, inferred from the size of x.  The result's
    static shape has the entries known when the graph is built (ints,
    constants, dims of static shapes read through ``shape``); the others are
    read at run time, where a target of another size than x raises."""
    x = as_tensor(x)
    if is_tensor(shape):
        return apply("reshape_dynamic", x, shape)
    entries = list(shape)
    for i, d in enumerate(entries):
        if is_tensor(d):
            if d.ndim != 0:
                raise ValueError(f"reshape: shape entries must be ints or scalar int tensors, "
                                 f"entry {i} has shape {format_shape(d.shape)}")
            if np.dtype(d.dtype).kind not in "iu":
                raise TypeError(f"reshape: shape entries must be ints or scalar int tensors, "
                                f"entry {i} has dtype {d.dtype}")
        elif not isinstance(d, numbers.Integral):
            raise TypeError(f"reshape: shape entries must be ints or scalar int tensors, "
                            f"entry {i} is {d!r}")
    values = [ops.static_int(d) if is_tensor(d) else int(d) for d in entries]
    if builtins.sum(1 for v in values if v == -1) > 1 or builtins.any(
            v is not None and v < -1 for v in values):
        raise ValueError(f"reshape: bad target shape {_show_entries(entries)} for a tensor of shape "
                         f"{format_shape(x.shape)} (at most one -1, no other negatives)")
    unknown = [i for i, v in enumerate(values) if v is None]
    if not unknown:
        return apply("reshape", x, shape=tuple(values))
    if len(unknown) == 1 and _rearranges_dims(x, entries[unknown[0]], values):
        # the entries are x's own dims, its one unknown dim read at run time:
        # what -1 infers, so a static reshape (which scan loops know)
        values[unknown[0]] = -1
        return apply("reshape", x, shape=tuple(values))
    target = apply("stack", *[d if is_tensor(d) else as_tensor(d, dtype="int32") for d in entries],
                   axis=0)
    return apply("reshape_dynamic", x, target)


def _rearranges_dims(x, entry, values):
    """Whether a target shape whose only unknown entry is ``entry`` and whose
    other entries are ``values`` has x's size whatever x's run-time shape: x has
    one unknown dim, ``entry`` reads it, and the other entries multiply to the
    product of x's known dims."""
    read = ops.dim_read_at_run_time(entry)
    unknown_dims = [a for a, d in enumerate(x.shape) if d is None]
    return (read is not None and read[0] is x and unknown_dims == [read[1]] and -1 not in values
            and _product(v for v in values if v is not None)
            == _product(d for d in x.shape if d is not None))


def _show_entries(entries):
    return "(" + ", ".join("?" if is_tensor(d) else str(int(d)) for d in entries) + ")"


def permute_dimensions(x, pattern):
    """x with its axes permuted: output axis i is input axis ``pattern[i]``."""
    return apply("transpose", x, axes=tuple(pattern))


def repeat_elements(x, rep, axis):
    """Each element repeated ``rep`` times along ``axis``, like ``np.repeat``:
    (s1, s2, s3) with axis=1 gives (s1, s2 * rep, s3)."""
    result = apply("repeat_elements", x, repeats=int(rep), axis=axis)
    if result.shape[result.attrs["axis"]] is None:
        # as TensorFlow's backend, which sets it where the axis is unknown
        # (Keras's own backend tests read it)
        result._keras_shape = result.shape
    return result


def repeat(x, n):
    """A 2-D tensor (samples, dim) repeated n times: (samples, n, dim)."""
    x = as_tensor(x)
    if x.ndim != 2:
        raise ValueError(f"repeat: x must have rank 2 (samples, dim), got shape "
                         f"{format_shape(x.shape)}")
    return apply("tile", expand_dims(x, 1), reps=(1, int(n), 1))


def tile(x, n):
    """x tiled ``n[i]`` times along each axis i; ``n`` is an int or a list of ints,
    padded with leading 1s when shorter than the rank of x."""
    x = as_tensor(x)
    reps = [n] if isinstance(n, (int, np.integer)) else list(n)
    if builtins.any(is_tensor(r) for r in reps):
        raise TypeError("tile: the repeat counts must be Python ints, not tensors")
    if len(reps) > x.ndim:
        raise ValueError(f"tile: {len(reps)} repeat counts for a tensor of shape "
                         f"{format_shape(x.shape)}")
    reps = [1] * (x.ndim - len(reps)) + reps
    return apply("tile", x, reps=tuple(int(r) for r in reps))


def batch_flatten(x):
    """x reshaped to 2-D (batch, everything else)."""
    x = as_tensor(x)
    return reshape(x, [-1, _product(_dims(x)[1:])])


def flatten(x):
    """x reshaped to 1-D."""
    return apply("reshape", x, shape=(-1,))


def expand_dims(x, axis=-1, dim=None):
    """x with a new axis of length 1 inserted at ``axis`` (-1: at the end).
    Keras 1 spelled ``axis`` as ``dim``."""
    if dim is not None:
        axis = dim
    x = as_tensor(x)
    if not -x.ndim - 1 <= axis <= x.ndim:
        raise ValueError(f"expand_dims: axis {axis} is out of range for a tensor of shape "
                         f"{format_shape(x.shape)}")
    dims = _dims(x)
    dims.insert(axis % (x.ndim + 1), 1)
    return reshape(x, dims)


def squeeze(x, axis):
    """x without its axis ``axis``, which must have length 1."""
    x = as_tensor(x)
    axis = ops.normalize_axis("squeeze", axis, x.ndim)
    if x.shape[axis] not in (1, None):
        raise ValueError(f"squeeze: axis {axis} of a tensor of shape {format_shape(x.shape)} "
                         f"has length {x.shape[axis]}, not 1")
    dims = _dims(x)
    del dims[axis]
    return reshape(x, dims)


def stack(x, axis=0):
    """A list of tensors of rank R stacked into one tensor of rank R + 1 along ``axis``."""
    return apply("stack", *x, axis=axis)


def slice(x, start, size):
    """``x[start[0]:start[0] + size[0], ..., start[-1]:start[-1] + size[-1]]``; a size
    of -1 takes everything from the start on. ``start`` and ``size`` are lists of ints."""
    x = as_tensor(x)
    if is_tensor(start) or is_tensor(size):
        raise TypeError("slice: start and size must be lists of ints; tensors are not supported")
    start, size = [int(s) for s in start], [int(s) for s in size]
    if not len(start) == len(size) == x.ndim:
        raise ValueError(f"slice: need one start and one size per axis of a tensor of shape "
                         f"{format_shape(x.shape)}, got start={start}, size={size}")
    key = []
    for axis, (begin, count, length) in enumerate(zip(start, size, x.shape)):
        end = None if count == -1 else begin + count
        last = begin if end is None else end
        if begin < 0 or count < -1 or (length is not None and last > length):
            raise ValueError(f"slice: start {begin} and size {count} are out of range for axis "
                             f"{axis} of a tensor of shape {format_shape(x.shape)}")
        key.append(builtins.slice(begin, end))
    return ops.getitem(x, tuple(key))


def temporal_padding(x, padding=(1, 1)):
    """Zeros added at the start and end of axis 1 of a 3-D tensor:
    ``padding`` = (before, after), or one int for both (Keras 1)."""
    x = _check_rank("temporal_padding", x, 3)
    (pair,) = _padding_pairs("temporal_padding", [padding], 1)
    return apply("pad", x, pads=((0, 0), pair, (0, 0)))


def spatial_2d_padding(x, padding=((1, 1), (1, 1)), data_format=None, dim_ordering=None):
    """Zeros added around the rows and columns of a 4-D tensor of images.

    ``padding`` = ((top, bottom), (left, right)); Keras 1's flat pair (rows, cols)
    pads both sides of each by that much. ``data_format`` is 'channels_last'
    or 'channels_first' (Keras 1: ``dim_ordering`` 'tf' or 'th'), default the
    configured image data format.
    """
    return _spatial_padding("spatial_2d_padding", x, padding, 2, data_format, dim_ordering)


def spatial_3d_padding(x, padding=((1, 1), (1, 1), (1, 1)), data_format=None,
                       dim_ordering=None):
    """Zeros added around the depth, rows and columns of a 5-D tensor of volumes.

    ``padding`` = ((before, after) per spatial axis), or Keras 1's flat triple
    padding both sides of each spatial axis; ``data_format`` as in
    ``spatial_2d_padding``.
    """
    return _spatial_padding("spatial_3d_padding", x, padding, 3, data_format, dim_ordering)


# ---------------------------------------------------------------------------
# Helpers


def _dims(x):
    """The dims of x: an int where the static shape knows it, else a scalar tensor."""
    if builtins.all(d is not None for d in x.shape):
        return list(x.shape)
    runtime = apply("shape", x)
    return [d if d is not None else ops.getitem(runtime, i) for i, d in enumerate(x.shape)]


def _known_and_different(a, b):
    """Two static dims that are both known and differ."""
    return a is not None and b is not None and a != b


def _product(dims):
    """The product of ints and scalar tensors (an int when all are ints)."""
    return functools.reduce(operator.mul, dims, 1)


def _permute_if_needed(x, pattern):
    if list(pattern) == list(range(x.ndim)):
        return x
    return permute_dimensions(x, pattern)


def _reshape_if_needed(x, dims):
    """reshape(x, dims) unless x has that shape already; ``dims`` come from ``_dims``,
    so a tensor entry stands where the static shape has None."""
    same = len(dims) == x.ndim and builtins.all(
        (d is None) if is_tensor(want) else (d == want) for want, d in zip(dims, x.shape))
    return x if same else reshape(x, dims)


def _one_of(where, name, value, old_name, old_value):
    """The argument given under its Keras 2 name or its Keras 1 name."""
    if value is not None and old_value is not None:
        raise TypeError(f"{where}: give {name} or {old_name}, not both")
    if value is None and old_value is None:
        raise TypeError(f"{where}: missing argument {name}")
    return value if value is not None else old_value


def _check_rank(where, x, rank):
    x = as_tensor(x)
    if x.ndim != rank:
        raise ValueError(f"{where}: expected a tensor of rank {rank}, got shape "
                         f"{format_shape(x.shape)}")
    return x


def _padding_pairs(where, padding, count):
    """``count`` (before, after) pairs from an int, or a sequence of ``count`` ints or pairs."""
    if isinstance(padding, (int, np.integer)):
        padding = [padding] * count
    padding = list(padding)
    if len(padding) != count:
        raise ValueError(f"{where}: padding must give {count} entries, got {padding}")
    pairs = []
    for p in padding:
        pair = (p, p) if isinstance(p, (int, np.integer)) else tuple(p)
        if len(pair) != 2 or builtins.any(int(v) < 0 for v in pair):
            raise ValueError(f"{where}: each padding entry must be an int or a (before, after) "
                             f"pair of non-negative ints, got {padding}")
        pairs.append((int(pair[0]), int(pair[1])))
    return pairs


def _spatial_padding(where, x, padding, spatial_rank, data_format, dim_ordering):
    x = _check_rank(where, x, spatial_rank + 2)
    if data_format is None or data_format == "default":
        data_format = None if dim_ordering in (None, "default") else dim_ordering
    data_format = config.normalize_data_format(data_format)
    pairs = _padding_pairs(where, padding, spatial_rank)
    if data_format == "channels_first":
        pads = [(0, 0), (0, 0)] + pairs
    else:
        pads = [(0, 0)] + pairs + [(0, 0)]
    return apply("pad", x, pads=tuple(pads))


__all__ = [
    "abs", "all", "any", "arange", "argmax", "argmin", "batch_dot", "batch_flatten",
    "clip", "concatenate", "cos", "cumprod", "cumsum", "dot", "equal", "exp", "expand_dims",
    "flatten", "gather", "greater", "greater_equal", "in_top_k", "less", "less_equal",
    "lesser", "lesser_equal", "log", "logsumexp", "max", "maximum", "mean", "min", "minimum",
    "not_equal", "one_hot", "permute_dimensions", "pow", "prod", "repeat", "repeat_elements",
    "reshape", "reverse", "round", "sign", "sin", "slice", "spatial_2d_padding",
    "spatial_3d_padding", "sqrt", "square", "squeeze", "stack", "std", "sum",
    "temporal_padding", "tile", "transpose", "var",
]
