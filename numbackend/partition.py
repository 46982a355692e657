"""Partition a rewritten graph into fused groups and library steps, and lay
out each group's kernel.

Element-wise nodes, and trailing-axis reductions ending them, join groups
over one domain; every other op is a library step.  A group's layout says
how each input is read (a full block 'F', a row 'R' or column 'C' vector, a
scalar 'S', a window 'W' of a wider array) and gives the kernel's canonical
description (:class:`KernelSpec`), from which codegen writes its source.
"""
import numpy as np

from .graph import consumers_of
from .ops import OPS, last_axis_window

LEAVES = ("placeholder", "variable", "constant")


class Group:
    """Element-wise members computed over one domain, ending in reductions over
    its trailing ``k`` axes; ``outputs`` are the members whose values leave it."""

    def __init__(self, root, domain, k):
        self.domain = domain
        self.k = k
        self.members = [root]
        self.outputs = [root]

    def known_size(self):
        if any(d is None for d in self.domain):
            return None
        return int(np.prod(self.domain, dtype=np.int64))

    def per_sample(self):
        """Is the domain one unknown (batch) dimension, every other dimension 1?"""
        return self.domain.count(None) == 1 and all(d in (None, 1) for d in self.domain)


def _trailing_axes(axes, ndim):
    return len(axes) > 0 and tuple(axes) == tuple(range(ndim - len(axes), ndim))


def fusible_dtype(dtype):
    return dtype != "float16"


def partition(order, targets):
    """Assign element-wise and reduce nodes to fused groups, in reverse topological
    order: a node joins a group of one of its consumers when the shapes allow and no
    cycle between steps results; it is an output of that group when something outside
    it also needs the value.  Returns {node id: unit}, a unit being a Group or, for a
    library step, the node itself."""
    users = consumers_of(order)
    target_ids = {t.id for t in targets}
    unit_of = {}
    for node in reversed(order):
        if node.op in LEAVES:
            continue
        op = OPS[node.op]
        if op.kind == "library":
            unit_of[node.id] = node
            continue
        consumers = users.get(node.id, [])
        candidates = []
        for c in consumers:
            g = unit_of.get(c.id)
            if isinstance(g, Group) and all(g is not x for x in candidates):
                candidates.append(g)
        joined = None
        for g in candidates:
            outside = [c for c in consumers if unit_of.get(c.id) is not g]
            if _can_join(g, node) and not _feeds(outside, g, unit_of):
                joined = g
                break
        if joined is not None:
            if op.kind == "reduce":
                joined.k = len(node.attrs["axis"])
            joined.members.append(node)
            if node.id in target_ids or len(outside) > 0:
                joined.outputs.append(node)
            unit_of[node.id] = joined
            continue
        if op.kind == "reduce":
            x = node.inputs[0]
            if not _trailing_axes(node.attrs["axis"], x.ndim) or not fusible_dtype(x.dtype):
                unit_of[node.id] = node  # a library step: NumPy's reduction
                continue
            g = Group(node, x.shape, len(node.attrs["axis"]))
        else:
            g = Group(node, node.shape, 0)
        unit_of[node.id] = g
    for g in {id(u): u for u in unit_of.values() if isinstance(u, Group)}.values():
        g.members.reverse()  # topological order
    return unit_of


def unit_members(unit):
    return unit.members if isinstance(unit, Group) else [unit]


def _feeds(nodes, group, unit_of):
    """Would the group depend on the steps holding ``nodes``?  (Joining would then make
    a cycle between steps.)  Only already-assigned, downstream steps can be involved."""
    if not nodes:
        return False
    bad = {id(unit_of[n.id]) for n in nodes if n.id in unit_of}
    seen, stack = {id(group)}, [group]
    while stack:
        unit = stack.pop()
        for m in unit_members(unit):
            for i in m.inputs:
                u = unit_of.get(i.id)
                if u is None or id(u) in seen:
                    continue
                if id(u) in bad:
                    return True
                seen.add(id(u))
                stack.append(u)
    return False


def _can_join(g, node):
    if not fusible_dtype(node.dtype) or any(not fusible_dtype(i.dtype) for i in node.inputs):
        return False
    op = OPS[node.op]
    if op.kind == "elementwise":
        return node.shape == g.domain
    x = node.inputs[0]
    axes = node.attrs["axis"]
    return (node.attrs["keepdims"] and x.shape == g.domain and _trailing_axes(axes, x.ndim)
            and g.k in (0, len(axes)))


# ---------------------------------------------------------------------------
# Layout of a fused group


def _full_mask(shape, domain):
    """Per domain axis: does this input vary along it (True) or broadcast (False)?"""
    off = len(domain) - len(shape)
    mask = []
    for j, d in enumerate(domain):
        if j < off:
            mask.append(False)
        else:
            mask.append(not (shape[j - off] == 1 and d != 1))
    return mask


def _pattern(mask, domain, split):
    def uniform(part, dims):
        vals = {m for m, d in zip(part, dims) if d != 1}
        if not vals:
            return "any"
        return vals.pop() if len(vals) == 1 else None
    outer = uniform(mask[:split], domain[:split])
    inner = uniform(mask[split:], domain[split:])
    if outer is None or inner is None:
        return None
    outer = outer if outer != "any" else (inner if inner != "any" else False)
    inner = inner if inner != "any" else outer
    return {(True, True): "F", (True, False): "R", (False, True): "C", (False, False): "S"}[(outer, inner)]


def layout(group, inputs, windows=None):
    """Choose the split and each input's pattern; returns (split, patterns, flat).
    Window inputs (their index in ``windows``) need the last axis to be the columns."""
    domain = group.domain
    d = len(domain)
    if windows:
        patterns = ["W" if j in windows else _pattern(_full_mask(t.shape, domain), domain, d - 1)
                    for j, t in enumerate(inputs)]
        return d - 1, patterns, False
    masks = [_full_mask(t.shape, domain) for t in inputs]
    splits = [d - group.k] if group.k else [d] + list(range(d - 1, -1, -1))
    best = None
    for s in splits:
        patterns = [_pattern(m, domain, s) for m in masks]
        misfits = sum(p is None for p in patterns)
        flat = group.k == 0 and all(p in ("F", "S", None) for p in patterns)
        score = (misfits, not flat)
        if best is None or score < best[0]:
            best = (score, s, patterns, flat)
    _, s, patterns, flat = best
    return s, patterns, flat


# ---------------------------------------------------------------------------
# Plan


def _window_of(node):
    """(offset, width) when ``node`` slices only the last axis of its input, with
    step 1 and static bounds: a kernel can read it in place."""
    if node.op != "getitem" or node.ndim == 0 or node.ndim != node.inputs[0].ndim:
        return None
    window = last_axis_window(node.attrs["key"], node.inputs[0].shape)
    return None if window is None else (window[0], window[1] - window[0])


def windows_of(order, targets, unit_of, consumers):
    """The last-axis slices every consumer of which is a kernel over the slice's own
    shape: {node id: (offset, width)}; those kernels read the slice in place."""
    target_ids = {t.id for t in targets}
    windows = {}
    for node in order:
        window = _window_of(node)
        if window is None or node.id in target_ids or not fusible_dtype(node.dtype):
            continue
        groups = [unit_of.get(c.id) for c in consumers.get(node.id, [])]
        if groups and all(isinstance(g, Group) and g.k <= 1 and g.domain == node.shape
                          for g in groups):
            windows[node.id] = window
    return windows


def group_inputs(g):
    """The values a group reads from outside it, in order of first use."""
    members = {m.id for m in g.members}
    inputs = []
    for m in g.members:
        for i in m.inputs:
            if i.id not in members and all(i is not x for x in inputs):
                inputs.append(i)
    return inputs


def rises_with(g, node):
    """Whether group ``g``'s output is non-decreasing in ``node``'s value, element
    by element, its other inputs held fixed: each member on a path from node to
    the output is so in the operands on such paths (Op.rising).  Max pooling
    then commutes with g (a bias and a ReLU): pooled first, node's value leaves
    g a quarter of the values.  The one difference: a window holding -inf,
    where g adds +inf, pools to inf rather than to the NaN of -inf + inf."""
    on_path = {node.id}
    for m in g.members:  # in the order they are computed
        operands = [j for j, i in enumerate(m.inputs) if i.id in on_path]
        if not operands:
            continue
        if any(j not in OPS[m.op].rising for j in operands):
            return False
        on_path.add(m.id)
    return g.outputs[0].id in on_path


def kernel_spec(g, inputs, members, split, patterns, flat, windows, on_rows=False):
    """The canonical description of a group's kernel (see :class:`KernelSpec`).
    ``on_rows``: over (rows, last axis) blocks of the domain instead, rank 2, its
    inputs 'F' blocks, 'C' vectors and 'S' scalars."""
    spec_inputs = [(p, {"F": 2, "C": 1, "S": 0}[p] if on_rows else len(t.shape), t.dtype)
                   for p, t in zip(patterns, inputs)]
    spec_nodes = []
    for m in g.members:
        refs = [("node", members[i.id]) if i.id in members else ("in", index_of(inputs, i))
                for i in m.inputs]
        ct = OPS[m.op].compute_dtype(m.inputs, m.attrs)
        spec_nodes.append((m.op, m.attrs, refs, ct, m.dtype))
    spec_outputs = []
    for out in g.outputs:
        if OPS[out.op].kind == "reduce":
            spec_outputs.append((members[out.id], "reduced", out.attrs["keepdims"]))
        else:
            spec_outputs.append((members[out.id], "full", False))
    return KernelSpec(2 if on_rows else len(g.domain), split, g.k, flat, spec_inputs,
                              spec_nodes, spec_outputs, windows)


def index_of(seq, item):
    for i, x in enumerate(seq):
        if x is item:
            return i
    raise KeyError(item)


class KernelSpec:
    """Everything the generator needs, in canonical form.

    nodes: list of (op name, attrs, [operand refs], compute dtype, out dtype), where a
    ref is ('in', i) for external input i or ('node', j) for an earlier member;
    reduce members have op kind 'reduce'.
    """

    def __init__(self, rank, split, k, flat, inputs, nodes, outputs, windows=None):
        self.rank = rank          # domain rank
        self.split = split        # s: rows = axes [0, s), columns = axes [s, rank)
        self.k = k                # trailing reduced axes (0: none)
        self.flat = flat          # one flat loop (no reductions, inputs 'F'/'S' only)
        self.inputs = inputs      # list of (pattern, rank of the array, dtype)
        self.nodes = nodes
        self.outputs = outputs    # list of (node index, output shape kind, keepdims)
        self.windows = windows or {}  # input index -> (offset, width) of a 'W' input
