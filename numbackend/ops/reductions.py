"""Reductions (fused as a kernel's last stage: each declares its fused form
here) and the library ops along one axis: argmax/argmin, cumsum/cumprod, in_top_k."""
import numpy as np

from ..graph import format_shape
from . import batch
from .registry import (
    Op,
    apply,
    float_dtype,
    library,
    normalize_axes,
    normalize_axis,
    not_differentiable,
    register,
)


def _reduce_infer(name, out_dtype):
    def infer(inputs, attrs):
        (x,) = inputs
        axes = normalize_axes(name, attrs.get("axis"), x.ndim)
        attrs["axis"] = axes
        keepdims = bool(attrs.get("keepdims", False))
        attrs["keepdims"] = keepdims
        shape = tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(x.shape))
        if not keepdims:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return shape, out_dtype(x.dtype)
    return infer


def reduction(name, impl, row, fold=None, settle=None, out_dtype=None, compute_dtype=None,
              grad=None):
    """Define a reduction over ``axis`` (a tuple) with ``keepdims``.

    Its fused form, inlined by the code generator into the kernel that computes
    its operand: ``row``, the scalar code reducing the first ``{n}`` elements of
    the 1-D row ``{row}`` (``rd`` is jit_kernels.reduce); ``fold``, for a
    reduction exact in any order and grouping (max, min), the code combining an
    accumulator ``{acc}`` with one more element ``{x}``, which lets a kernel fold
    a row's reduction into a loop of its own; ``settle``, where the fold needs
    it, the code that makes the accumulator ``{acc}`` the result once the loop
    is done (the softmax's shift: see jit_kernels.reduce.shift_maximum).
    ``out_dtype`` maps the operand's dtype to the result's (default: the same);
    ``compute_dtype`` to the dtype the operand is converted to before it is
    reduced (default: the result's)."""
    out_dtype = out_dtype or (lambda dtype: dtype)
    compute_dtype = compute_dtype or out_dtype

    def run(x, axis, keepdims):
        return np.asarray(impl(x, axis=axis, keepdims=keepdims))
    return register(Op(name, "reduce", _reduce_infer(name, out_dtype), run, grad=grad,
                       reduce_row=row, reduce_fold=fold, reduce_settle=settle,
                       compute_dtype=lambda inputs, attrs: compute_dtype(inputs[0].dtype),
                       rows=batch.reduction))


def _sum_dtype(dtype):
    return "int64" if np.dtype(dtype).kind in "biu" and dtype != "uint64" else dtype


def _keep(g, n):
    """A reduction's gradient (or result) ``g`` with the reduced axes put back as
    axes of length 1, so that it broadcasts against the input."""
    if n.attrs["keepdims"]:
        return g
    shape = list(n.inputs[0].shape)
    for a in n.attrs["axis"]:
        shape[a] = 1
    if shape.count(None) <= 1:
        # a static reshape, which the compiled whole call and scan loops know
        return apply("reshape", g, shape=tuple(-1 if d is None else d for d in shape))
    # several unknown dims: only the run-time shape tells them apart
    return apply("expand_dims", g, axes=n.attrs["axis"])


def _grad_sum(g, n):
    x = n.inputs[0]
    g = _keep(g, n)
    if g.dtype != x.dtype:  # a no-op cast would be a kernel of its own
        g = apply("cast", g, dtype=x.dtype)
    return [apply("broadcast_like", g, x)]


def _grad_mean(g, n):
    x = n.inputs[0]
    count = apply("axes_size", x, axis=n.attrs["axis"], dtype=x.dtype)
    return [apply("broadcast_like", apply("divide", _keep(g, n), count), x)]


def _grad_extreme(g, n):
    x = n.inputs[0]
    red = n if n.attrs["keepdims"] else _keep(n, n)
    hit = apply("cast", apply("equal", x, red), dtype=x.dtype)
    count = apply("sum", hit, axis=n.attrs["axis"], keepdims=True)
    return [apply("multiply", apply("divide", hit, count), _keep(g, n))]


def _grad_prod(g, n):
    x = n.inputs[0]
    red = n if n.attrs["keepdims"] else _keep(n, n)
    return [apply("multiply", _keep(g, n), apply("divide", red, x))]


reduction("sum", np.sum, "rd.row_sum({row}, {n})", out_dtype=_sum_dtype, grad=_grad_sum)
reduction("prod", np.prod, "rd.row_prod({row}, {n})", out_dtype=_sum_dtype, grad=_grad_prod)
reduction("max", np.max, "rd.row_max({row}, {n})", fold="rd.maximum({acc}, {x})",
          grad=_grad_extreme)
reduction("min", np.min, "rd.row_min({row}, {n})", fold="rd.minimum({acc}, {x})",
          grad=_grad_extreme)
# The shift of a softmax or log-softmax: the row's max where the row holds no NaN
# (the max's value then); on a row with a NaN, any value, as the shifted row's sum
# is NaN whatever it is.  One packed max a vector where max takes three.
reduction("shift_max", np.max, "rd.row_shift_max({row}, {n})", fold="rd.shift_maximum({acc}, {x})",
          settle="rd.settled({acc})", grad=not_differentiable)
reduction("mean", np.mean, "rd.row_sum({row}, {n}) / {n}", out_dtype=float_dtype,
          grad=_grad_mean)
reduction("any", np.any, "rd.row_any({row}, {n})", out_dtype=lambda dtype: "bool",
          grad=lambda g, n: [None])
reduction("all", np.all, "rd.row_all({row}, {n})", out_dtype=lambda dtype: "bool",
          grad=lambda g, n: [None])


# ---------------------------------------------------------------------------
# Library ops along one axis


def _arg_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        axis = normalize_axis(name, attrs.get("axis", -1), x.ndim)
        attrs["axis"] = axis
        return x.shape[:axis] + x.shape[axis + 1:], "int64"
    return infer


library("argmax", _arg_infer("argmax"), lambda x, axis: np.argmax(x, axis=axis),
        grad=not_differentiable)
library("argmin", _arg_infer("argmin"), lambda x, axis: np.argmin(x, axis=axis),
        grad=not_differentiable)


def _cum_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        attrs["axis"] = normalize_axis(name, attrs.get("axis", 0), x.ndim)
        return x.shape, _sum_dtype(x.dtype)
    return infer


def _cumsum_grad(g, n):
    axis = n.attrs["axis"]
    rev = apply("reverse", g, axes=(axis,))
    return [apply("reverse", apply("cumsum", rev, axis=axis), axes=(axis,))]


library("cumsum", _cum_infer("cumsum"), lambda x, axis: np.cumsum(x, axis=axis), grad=_cumsum_grad)


def _cumprod_grad(g, n):
    # TensorFlow's rule: the reversed cumulative sum of g * y, divided by x (so
    # not finite where x has a zero, as in TensorFlow)
    (x,) = n.inputs
    return [apply("divide", _cumsum_grad(apply("multiply", g, n), n)[0], x)]


library("cumprod", _cum_infer("cumprod"), lambda x, axis: np.cumprod(x, axis=axis),
        grad=_cumprod_grad)


def _in_top_k_infer(inputs, attrs):
    pred, targets = inputs
    if pred.ndim != 2 or targets.ndim != 1:
        raise ValueError(f"in_top_k: predictions must be (batch, classes) and targets (batch,), got "
                         f"{format_shape(pred.shape)} and {format_shape(targets.shape)}")
    if np.dtype(targets.dtype).kind not in "iu":
        raise TypeError(f"in_top_k: targets must be integers (class indices), got {targets.dtype}")
    if None not in (pred.shape[0], targets.shape[0]) and pred.shape[0] != targets.shape[0]:
        raise ValueError(f"in_top_k: predictions {format_shape(pred.shape)} and targets "
                         f"{format_shape(targets.shape)} have different batch sizes")
    return (pred.shape[0],), "bool"


def _in_top_k(pred, targets, k):
    """TensorFlow's in_top_k: a target is in the top k when fewer than k classes
    score strictly higher, so ties at the k-th largest value are all in; a row
    with any non-finite prediction is False (TensorFlow cannot say)."""
    if pred.shape[0] != targets.shape[0]:
        raise ValueError(f"in_top_k: {pred.shape[0]} rows of predictions but {targets.shape[0]} targets")
    out_of_range = (targets < 0) | (targets >= pred.shape[1])
    if out_of_range.any():
        b = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"in_top_k: targets[{b}] = {targets[b]} is out of range for "
                         f"{pred.shape[1]} classes")
    target_scores = pred[np.arange(pred.shape[0]), targets]
    higher = (pred > target_scores[:, None]).sum(axis=1)
    return (higher < k) & np.isfinite(pred).all(axis=1)


library("in_top_k", _in_top_k_infer, _in_top_k, grad=not_differentiable)
