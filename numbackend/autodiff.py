"""Reverse-mode differentiation over the graph.

Each op's gradient rule lives with the op (the ops package); this module walks the
graph from the loss back to the variables, applies the rules, undoes
broadcasting (a broadcast input's gradient is summed back to its shape) and
adds up the gradients of tensors used more than once.  The result is an
ordinary graph: it goes through the same compiler, so a backward chain of
element-wise ops fuses like a forward one, and forward values are shared by
common sub-expression merging rather than recomputed.
"""
import itertools

import numpy as np

from .graph import Constant, SparseTensor, Tensor, toposort
from .ops import OPS, apply, as_tensor, is_float, last_axis_window


def gradients(loss, variables):
    """Symbolic gradients of ``loss`` with respect to each of ``variables``.

    A non-scalar loss is summed first, as TensorFlow does.  A variable the
    loss does not depend on (or reaches only through non-differentiable ops
    such as argmax, comparisons, rounding or integer casts) gets None."""
    loss = as_tensor(loss)
    single = isinstance(variables, Tensor)
    variables = [variables] if single else list(variables)
    for v in variables:
        if not isinstance(v, Tensor):
            raise TypeError(f"gradients: expected tensors to differentiate against, got {v!r}")
        if isinstance(v, SparseTensor):
            raise TypeError(f"gradients: cannot differentiate against the sparse tensor {v.name!r} "
                            f"of shape {v.shape}; differentiate against a dense tensor")
    if isinstance(loss, SparseTensor):
        raise TypeError(f"gradients: the loss {loss.name!r} is a sparse tensor; make it dense with "
                        "K.to_dense first")
    if not is_float(loss):
        raise TypeError(f"gradients: the loss must be a float tensor, got dtype {loss.dtype}")
    order = toposort([loss])
    relevant = _depends_on(order, {v.id for v in variables})
    if loss.ndim == 0:
        seed = Constant(np.ones((), dtype=loss.dtype))
    else:
        seed = apply("broadcast_like", Constant(np.ones((), dtype=loss.dtype)), loss)
    grads = {loss.id: seed}
    uses = {}  # tensor id -> the gradient contributions of its uses, added up on first read

    def gradient_of(node):
        if node.id in uses:
            grads[node.id] = _add_up(uses.pop(node.id), node)
        return grads.get(node.id)

    for node in reversed(order):
        g = gradient_of(node)
        if g is None or not node.inputs:
            continue
        op = OPS[node.op]
        if op.grad is None:
            _refuse_missing_gradient(node, relevant)
            continue  # only non-float inputs lead to the variables: nothing to add
        options = {}
        if op.grad_takes_wanted:
            options["wanted"] = [i.id in relevant for i in node.inputs]
        if op.grad_differentiates:
            options["gradients"] = gradients
        input_grads = op.grad(g, node, **options)
        for inp, gi in zip(node.inputs, input_grads):
            if gi is None or inp.id not in relevant:
                continue
            if inp.op in OPS and OPS[inp.op].multi_output:  # gi: the gradient of one item
                parts = grads.setdefault(inp.id, {})
                k = node.attrs["index"]
                parts[k] = gi if k not in parts else apply("add", parts[k], gi)
                continue
            if not is_float(inp):
                continue
            uses.setdefault(inp.id, []).append(_fit(gi, inp))
    result = [gradient_of(v) for v in variables]
    return result[0] if single else result


def _refuse_missing_gradient(node, relevant):
    """Raise where a gradient would have to go through an op that has no rule (as
    TensorFlow's LookupError), rather than treat it as zero: a second derivative
    through a gradient's helper op, or through ctc_batch_cost's fused gradient."""
    # the data is input 0; the gradient helpers' later inputs only give shapes
    inp = node.inputs[0]
    if inp.id in relevant and is_float(inp):
        raise LookupError(f"gradients: no gradient is defined for op {node.op!r} (tensor "
                          f"{node.name!r} of shape {node.shape}), which the gradient must go "
                          f"through to reach {inp.name!r}")


def _add_up(parts, x):
    """The sum of x's gradient contributions.  Those of slices that tile x's last
    axis are joined by one concatenation (not a zero-filled scatter and an add
    per slice: an LSTM's gates are slices of one product)."""
    windows = {}  # (start, stop) -> the scattered contributions to that slice
    for p in parts:
        if p.op == "scatter_like" and p.inputs[1] is x:
            window = last_axis_window(p.attrs["key"], x.shape)
            if window is not None:
                windows.setdefault(window, []).append(p)
    spans = sorted(windows)
    if (len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == x.shape[-1]
            and all(a[1] == b[0] for a, b in itertools.pairwise(spans))):
        pieces = [_sum([p.inputs[0] for p in windows[s]]) for s in spans]
        joined = {id(p) for ps in windows.values() for p in ps}
        rest = [p for p in parts if id(p) not in joined]
        parts = [apply("concatenate", *pieces, axis=x.ndim - 1), *rest]
    return _sum(parts)


def _sum(parts):
    total = parts[0]
    for p in parts[1:]:
        total = apply("add", total, p)
    return total


def _depends_on(order, targets):
    """Ids of the nodes that depend on any of ``targets`` (the targets included)."""
    relevant = set()
    for node in order:
        if node.id in targets or any(i.id in relevant for i in node.inputs):
            relevant.add(node.id)
    return relevant


def _fit(g, x):
    """The gradient g made to match x: broadcasting summed out, dtype cast.

    Where the static shapes tell which axes were broadcast, the sums are
    ordinary reductions (which fuse when the axes are trailing); otherwise
    the axes are found at run time."""
    if g.shape != x.shape:
        lead = g.ndim - x.ndim
        tail = g.shape[lead:]
        if lead >= 0 and all(d is not None or t is None for d, t in zip(x.shape, tail)):
            axes = [lead + i for i, (d, t) in enumerate(zip(x.shape, tail)) if d == 1 and t != 1]
            if axes:
                g = apply("sum", g, axis=axes, keepdims=True)
            if lead:
                g = apply("sum", g, axis=tuple(range(lead)))
        else:
            g = apply("sum_to", g, x)
    if g.dtype != x.dtype:
        g = apply("cast", g, dtype=x.dtype)
    return g


__all__ = ["gradients"]
