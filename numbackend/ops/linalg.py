"""Products: dot (BLAS, with transposed operands for gradients) and matmul."""
import itertools

import numpy as np

from ..graph import Constant, Tensor, format_shape, substitute, toposort
from . import batch
from .indexing import last_axis_window
from .registry import OPS, apply, broadcast_shapes, library, promote_dtype


def _dot_infer(inputs, attrs):
    x, y = inputs
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"dot: operands must have rank >= 1, got shapes {format_shape(x.shape)} "
                         f"and {format_shape(y.shape)}")
    xs, ys = x.shape, y.shape
    # transpose_a/transpose_b (2-D operands only) let gradients use BLAS's transposed
    # products instead of copying a transpose first
    if attrs.get("transpose_a") or attrs.get("transpose_b"):
        if x.ndim != 2 or y.ndim != 2:
            raise ValueError("dot: transpose_a/transpose_b need 2-D operands")
        xs = xs[::-1] if attrs.get("transpose_a") else xs
        ys = ys[::-1] if attrs.get("transpose_b") else ys
    k_x = xs[-1]
    k_y = ys[-2] if len(ys) >= 2 else ys[0]
    if k_x is not None and k_y is not None and k_x != k_y:
        raise ValueError(f"dot: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)} ({k_x} != {k_y})")
    shape = xs[:-1] + (ys[:-2] + ys[-1:] if len(ys) >= 2 else ())
    return shape, promote_dtype(inputs)


def _dot(x, y, transpose_a=False, transpose_b=False):
    # the shapes known only at run time are checked here, as at construction
    k_x = x.shape[0 if transpose_a else -1]
    k_y = y.shape[1 if transpose_b else (-2 if y.ndim >= 2 else 0)]
    if k_x != k_y:
        raise ValueError(f"dot: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)} ({k_x} != {k_y})")
    if x.ndim > 2 and y.ndim == 2 and x.flags.c_contiguous:
        # np.dot runs a slow loop, not BLAS, for a 3-D and up left operand
        return np.dot(x.reshape(-1, x.shape[-1]), y).reshape(x.shape[:-1] + y.shape[-1:])
    x, y = (x.T if transpose_a else x), (y.T if transpose_b else y)
    if x.ndim == 2 and y.ndim == 2:
        return np.matmul(x, y)  # the same product, a few percent less overhead
    return np.dot(x, y)


def _as_matrix(t):
    """t with its leading axes flattened: (-1, last axis), also when that axis is unknown."""
    if t.ndim == 2:
        return t
    if t.shape[-1] is not None:
        return apply("reshape", t, shape=(-1, t.shape[-1]))
    last = apply("getitem", apply("shape", t), key=(-1,))
    target = apply("stack", Constant(np.asarray(-1, dtype=np.int32)), last, axis=0)
    return apply("reshape_dynamic", t, target, known=(None, None))


def _dot_grad(g, n):
    x, y = n.inputs
    ta, tb = n.attrs.get("transpose_a", False), n.attrs.get("transpose_b", False)
    if x.ndim == 2 and y.ndim == 2:
        if not ta and not tb:      # out = x y
            return [apply("dot", g, y, transpose_b=True), apply("dot", x, g, transpose_a=True)]
        if not ta:                 # out = x y'
            return [apply("dot", g, y), apply("dot", g, x, transpose_a=True)]
        if not tb:                 # out = x' y
            return [apply("dot", y, g, transpose_b=True), apply("dot", x, g)]
        return [apply("dot", y, g, transpose_a=True, transpose_b=True),   # out = x' y'
                apply("dot", g, x, transpose_a=True, transpose_b=True)]
    if y.ndim == 2:  # (..., k) . (k, n): flatten the leading axes of x and g
        x2, g2 = _as_matrix(x), _as_matrix(g)
        gx = apply("reshape_like", apply("dot", g2, y, transpose_b=True), x)
        return [gx, apply("dot", x2, g2, transpose_a=True)]
    if y.ndim == 1:  # (..., k) . (k,) -> (...): an outer product back
        gx = apply("multiply", apply("getitem", g, key=(Ellipsis, None)), y)
        gy = apply("dot", apply("reshape", g, shape=(-1,)), _as_matrix(x))
        return [gx, gy]
    raise NotImplementedError("gradients: dot with a right operand of rank 3 or more has no "
                              "gradient rule; math.dot rewrites it on 2-D products")


library("dot", _dot_infer, _dot, grad=_dot_grad, rows=batch.dot)


def is_float_matrix_product(node):
    """Whether a ``dot`` node multiplies two 2-D float32 or float64 matrices of its
    own dtype: the products with compiled forms (compiled_plan, and the packed
    products of lowering.ProductByWeights)."""
    a, b = node.inputs
    return (a.ndim == 2 and b.ndim == 2 and node.dtype in ("float32", "float64")
            and a.dtype == b.dtype == node.dtype)


def _matmul_infer(inputs, attrs):
    x, y = inputs
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"matmul: operands must have rank >= 2, got {format_shape(x.shape)} "
                         f"and {format_shape(y.shape)}")
    if x.shape[-1] is not None and y.shape[-2] is not None and x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)}")
    batch = broadcast_shapes("matmul", x.shape[:-2], y.shape[:-2])
    return batch + (x.shape[-2], y.shape[-1]), promote_dtype(inputs)


def _swap_last(t):
    axes = tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2)
    return apply("transpose", t, axes=axes)


def _matmul(x, y):
    # the shapes known only at run time are checked here, as at construction
    batch = [(a, b) for a, b in zip(x.shape[-3::-1], y.shape[-3::-1]) if a != b and 1 not in (a, b)]
    if x.shape[-1] != y.shape[-2] or batch:
        raise ValueError(f"matmul: cannot multiply shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)}")
    return np.matmul(x, y)


library("matmul", _matmul_infer, _matmul,
        grad=lambda g, n: [apply("sum_to", apply("matmul", g, _swap_last(n.inputs[1])), n.inputs[0]),
                           apply("sum_to", apply("matmul", _swap_last(n.inputs[0]), g), n.inputs[1])])


def merge_sibling_dots(targets):
    """Products of one left operand with column slices of one matrix that together
    cover it (Keras's per-gate kernels) become one product with the whole
    matrix, sliced afterwards: one larger BLAS call instead of several small ones."""
    groups = {}
    for node in toposort(targets):
        if node.op != "dot" or node.attrs.get("transpose_a") or node.attrs.get("transpose_b"):
            continue
        right = node.inputs[1]
        if right.op != "getitem" or right.ndim != 2 or right.inputs[0].ndim != 2:
            continue
        base = right.inputs[0]
        window = last_axis_window(right.attrs["key"], base.shape)
        if window is not None:
            groups.setdefault((node.inputs[0].id, base.id), []).append((*window, node))
    replacements = {}
    for members in groups.values():
        spans = sorted({(start, stop) for start, stop, _ in members})
        left, base = members[0][2].inputs[0], members[0][2].inputs[1].inputs[0]
        if (len(spans) < 2 or spans[0][0] != 0 or spans[-1][1] != base.shape[1]
                or any(a[1] != b[0] for a, b in itertools.pairwise(spans))):
            continue
        whole = Tensor("dot", (left, base), {}, *OPS["dot"].infer([left, base], {}))
        for start, stop, node in members:
            replacements[node.id] = Tensor(
                "getitem", (whole,), {"key": (Ellipsis, slice(start, stop))},
                node.shape, node.dtype)
    return substitute(targets, replacements) if replacements else list(targets)
