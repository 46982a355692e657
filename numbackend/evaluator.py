"""The NumPy evaluator: each op's NumPy semantics, node by node.

The reference every compiled path is tested against, the constant folder's
arithmetic, and the plan's fallback where a kernel does not take the
run-time shapes.  :func:`evaluate_graph` runs a whole graph so (a scan's
NumPy form runs its step that way).

It reads only the op registry (ops.registry): the scan op's NumPy form,
defined in the ops package, builds on it.
"""
import functools

import numpy as np

from .graph import toposort
from .ops.registry import OPS


def evaluate(node, arrays):
    """NumPy semantics of one node (the reference, folding and fallback path)."""
    return node_function(node)(*arrays)


def node_function(node):
    """``f(*arrays)`` computing ``node`` with NumPy, its dtypes and attributes worked
    out once: groups of a few values run this on every call, where working them
    out again cost more than the arithmetic."""
    op = OPS[node.op]
    if op.impl is None:
        raise NotImplementedError(f"{node.op}: has no NumPy form; it runs inside a function "
                                  "(K.function), by its lowering")
    impl = functools.partial(op.impl, **node.attrs) if node.attrs else op.impl
    if op.multi_output:
        return impl
    dtype = np.dtype(node.dtype)

    def as_result(out):
        # C-contiguous and of the node's dtype, so kernels run their C-contiguous
        # compile (np.broadcast_to, for one, returns a stride-0 view)
        if type(out) is np.ndarray and out.dtype == dtype and out.flags.c_contiguous:
            return out
        return np.require(out, dtype=dtype, requirements="C")

    if op.kind != "elementwise":
        return lambda *arrays: as_result(impl(*arrays))
    compute = np.dtype(op.compute_dtype(node.inputs, node.attrs))

    def elementwise(*arrays):
        arrays = [np.asarray(a).astype(compute, copy=False) for a in arrays]
        with np.errstate(all="ignore"):
            return as_result(impl(*arrays))
    return elementwise


def library_call(node):
    """A plan step's callable for a library node: its op's NumPy/BLAS code with the
    attributes bound, the result in the node's dtype (one call, no dispatch)."""
    impl = functools.partial(OPS[node.op].impl, **node.attrs) if node.attrs else OPS[node.op].impl
    if OPS[node.op].multi_output:
        return impl
    dtype = np.dtype(node.dtype)

    def call(*arrays):
        out = impl(*arrays)
        return out if getattr(out, "dtype", None) == dtype else np.asarray(out).astype(dtype)
    return call


def evaluate_graph(targets, feeds):
    """The targets' values, node by node with each op's NumPy form; ``feeds``:
    {placeholder id: array}.  Variables and constants give their values."""
    values = {}
    for node in toposort(targets):
        if node.id in feeds:
            values[node.id] = feeds[node.id]
        elif node.op in ("variable", "constant"):
            values[node.id] = node.value
        elif node.op == "placeholder":
            raise ValueError(f"evaluate_graph: no value fed for placeholder {node.name!r}")
        else:
            values[node.id] = evaluate(node, [values[i.id] for i in node.inputs])
    return [values[t.id] for t in targets]
