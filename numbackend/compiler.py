"""Compile a sub-graph into a plan: rewrite, partition, generate, run.

1. rewrite: merge common sub-expressions and fold constants;
2. partition: element-wise nodes (and trailing-axis reductions ending them)
   are grouped into fused kernels; every other op is one library step;
3. generate: each fused group gets a Numba kernel (codegen.py); the plan
   itself is a short generated Python function that calls the steps in
   order, so a call costs one Python frame plus one call per step.
"""
import functools
import itertools
import os
import threading
import weakref

import numpy as np

from . import codegen, tuning
from .graph import (
    Constant,
    Placeholder,
    Tensor,
    Update,
    Variable,
    consumers_of,
    format_shape,
    substitute,
    toposort,
)
from .ops import OPS, is_float_matrix_product, last_axis_window

LEAVES = ("placeholder", "variable", "constant")
_VIEW_OPS = ("reshape", "reshape_like", "print_tensor", "reshape_dynamic", "expand_dims")


def debug_level():
    try:
        return int(os.environ.get("NUMBACKEND_DEBUG", "0") or 0)
    except ValueError:
        return 0


# ---------------------------------------------------------------------------
# Rewrite


def _attrs_key(attrs):
    return repr(sorted(attrs.items()))


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


def read_shared_results(targets):
    """Nodes whose value an item of a multi-output node on the same inputs already
    holds (an op's ``computed_by``, e.g. a loss next to its loss-and-gradient
    pass) read it from there rather than computing it again."""
    order = toposort(targets)
    multi = {(n.op, tuple(i.id for i in n.inputs), _attrs_key(n.attrs)): n
             for n in order if n.op in OPS and OPS[n.op].multi_output}
    replacements = {}
    for node in order:
        shared = OPS[node.op].computed_by if node.op in OPS else None
        if shared is None:
            continue
        source = multi.get((shared[0], tuple(i.id for i in node.inputs), _attrs_key(node.attrs)))
        if source is not None:
            replacements[node.id] = Tensor("tuple_item", (source,),
                                           {"index": shared[1], "shape": node.shape,
                                            "dtype": node.dtype}, node.shape, node.dtype)
    return substitute(targets, replacements) if replacements else list(targets)


def rewrite(targets):
    """Merge common sub-expressions and fold constants; returns the new targets."""
    from .scan import drop_unread_histories  # scan builds on this module
    targets = read_shared_results(merge_sibling_dots(drop_unread_histories(targets)))
    replaced = {}
    seen = {}
    constants = {}
    for node in toposort(targets):
        if node.op in ("placeholder", "variable"):
            replaced[node.id] = node
            continue
        if node.op == "constant":
            key = None
            if node.value.size <= 64:
                key = (node.dtype, node.value.shape, node.value.tobytes())
                if key in constants:
                    replaced[node.id] = constants[key]
                    continue
                constants[key] = node
            replaced[node.id] = node
            continue
        inputs = [replaced[i.id] for i in node.inputs]
        if node.op in ("stop_gradient", "identity"):
            # only K.gradients reads stop_gradient, and identity is a copy (Keras's
            # layers that return their input): a plan step would split a fused
            # kernel and keep the function from its whole call.  A result that is
            # a leaf, a view of one or another result is still copied (Plan._build).
            replaced[node.id] = inputs[0]
            continue
        chosen = _branch_of_constant_switch(node, inputs)
        if chosen is not None:
            replaced[node.id] = chosen
            continue
        op = OPS[node.op]
        if (not op.stateful and not op.multi_output and node.op != "print_tensor" and inputs
                and all(i.op == "constant" for i in inputs)):
            value = evaluate(node, [i.value for i in inputs])
            new = Constant(value, dtype=node.dtype)
            replaced[node.id] = new
            continue
        if op.stateful:
            key = ("stateful", node.id)
        else:
            key = (node.op, tuple(i.id for i in inputs), _attrs_key(node.attrs))
        if key in seen:
            replaced[node.id] = seen[key]
            continue
        if all(a is b for a, b in zip(inputs, node.inputs)):
            new = node
        else:
            new = _copy_node(node, inputs)
        seen[key] = new
        replaced[node.id] = new
    return [replaced[t.id] for t in targets]


def _branch_of_constant_switch(node, inputs):
    """The branch a 'where' node takes as it is, where its condition (``inputs[0]``)
    is one constant value and that branch has the node's static shape and dtype
    (K.switch on a learning phase fixed for the plan, see Function): TensorFlow's
    switch on a scalar runs the chosen branch alone.  Else None."""
    if node.op != "where" or inputs[0].op != "constant" or inputs[0].ndim != 0:
        return None
    branch = inputs[1] if inputs[0].value else inputs[2]
    return branch if branch.shape == node.shape and branch.dtype == node.dtype else None


def _copy_node(node, inputs):
    return Tensor(node.op, inputs, node.attrs, node.shape, node.dtype, node.name)


def evaluate(node, arrays):
    """NumPy semantics of one node (the reference, folding and fallback path)."""
    return node_function(node)(*arrays)


def node_function(node):
    """``f(*arrays)`` computing ``node`` with NumPy, its dtypes and attributes worked
    out once: groups of a few values run this on every call, where working them
    out again cost more than the arithmetic."""
    op = OPS[node.op]
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



def _multiplies_weights(node):
    """Whether ``node`` is a product of a matrix by a variable's or a constant's
    value, 2-D, untransposed, of float32 or float64 (see
    :class:`_ProductByWeights`)."""
    return (node.op == "dot" and isinstance(node.inputs[1], (Variable, Constant))
            and is_float_matrix_product(node)
            and not node.attrs.get("transpose_a") and not node.attrs.get("transpose_b"))


class _ProductByWeights:
    """A plan step ``x @ w`` for a node of :func:`_multiplies_weights`: with few
    rows of x, on jit_kernels.packed's micro-kernel, large weights packed once
    per value (a variable's value is replaced, never written in place:
    Variable.assign and the updates store new arrays) and split between BLAS's
    threads; else through BLAS.

    The choice depends on the shapes alone, never on how often the function was
    called: a product's summation order differs between the micro-kernel and
    BLAS, and every call, and the whole compiled call, must give the same bits
    for the same input (the whole call takes the same choice)."""

    def __init__(self, node):
        self.fallback = library_call(node)
        self.dtype = np.dtype(node.dtype)
        self.packed = None  # jit_kernels.packed, from the first packed call
        self.packing = None  # (weak reference to the value packed, its panels)

    def __call__(self, x, w):
        if (x.shape[0] > tuning.PACKED_WEIGHTS_MAX_ROWS or x.dtype != self.dtype or w.dtype != self.dtype
                or x.shape[1] != w.shape[0] or not x.flags.c_contiguous or not w.flags.c_contiguous):
            return self.fallback(x, w)
        if self.packed is None:
            from jit_kernels import packed
            self.packed = packed
        small = w.size < tuning.PACKED_WEIGHTS_MIN_ITEMS
        out = np.empty((x.shape[0], w.shape[1]), self.dtype)
        if small:
            self.packed.matmul(x, w, out)
            return out
        packing = self.packing
        if packing is None or packing[0]() is not w:
            packing = self.packing = (weakref.ref(w), self.packed.pack(w, False))
        self.packed.matmul_packed_in_parts(x, packing[1], out)
        return out


# ---------------------------------------------------------------------------
# Partition


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


def _fusible_dtype(dtype):
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
            if not _trailing_axes(node.attrs["axis"], x.ndim) or not _fusible_dtype(x.dtype):
                unit_of[node.id] = node  # a library step: NumPy's reduction
                continue
            g = Group(node, x.shape, len(node.attrs["axis"]))
        else:
            g = Group(node, node.shape, 0)
        unit_of[node.id] = g
    for g in {id(u): u for u in unit_of.values() if isinstance(u, Group)}.values():
        g.members.reverse()  # topological order
    return unit_of


def _unit_members(unit):
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
        for m in _unit_members(unit):
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
    if not _fusible_dtype(node.dtype) or any(not _fusible_dtype(i.dtype) for i in node.inputs):
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


class Step:
    """One line of the plan, for explain()."""

    def __init__(self, kind, label, nodes, outputs, kernel=None):
        self.kind = kind
        self.label = label
        self.nodes = nodes
        self.outputs = outputs
        self.kernel = kernel


class Plan:
    """A compiled function body: ``run(*placeholder_arrays) -> tuple of target values``."""

    def __init__(self, placeholders, targets):
        self.placeholders = list(placeholders)
        targets = rewrite(targets)
        self.targets = targets
        order = toposort(targets)
        unit_of = partition(order, targets)
        self.consumers = consumers_of(order)
        self.windows = _windows(order, targets, unit_of, self.consumers)
        self.steps = []
        self.kernels = []
        # the plan again, as data, for compiled code to run (compiled_plan.py):
        # ("kernel", spec, argument expressions, out names), ("library", node,
        # in names, out name), ("conv", node, in names, out name, pool mode: a
        # convolution pooled by 'max' or not, see _program_with_epilogue),
        # ("variable", node, name) or ("unsupported", why); with the constants
        # the expressions name
        self.program = []
        self.constants = {}
        self._build(self._schedule(targets, unit_of), unit_of)
        codegen.hold(self.kernels, self)

    @staticmethod
    def _schedule(targets, unit_of):
        """The steps in an order where each runs after the steps it reads from."""
        schedule, done = [], set()
        stack = [(unit_of[t.id], False) for t in reversed(targets) if t.id in unit_of]
        while stack:
            unit, expanded = stack.pop()
            if expanded:
                if id(unit) not in done:
                    done.add(id(unit))
                    schedule.append(unit)
                continue
            if id(unit) in done:
                continue
            stack.append((unit, True))
            for m in _unit_members(unit):
                for i in m.inputs:
                    u = unit_of.get(i.id)
                    if u is not None and u is not unit and id(u) not in done:
                        stack.append((u, False))
        return schedule

    def _build(self, schedule, unit_of):
        ns = {"np": np, "_bshape": _broadcast_runtime}
        lines = []
        names = {}
        fresh = {}
        counter = [0]

        def new_name(prefix):
            counter[0] += 1
            return f"{prefix}{counter[0]}"

        def value_of(node):
            """The plan's name for a value, reading leaves on first use."""
            if node.id in names:
                return names[node.id]
            if node.op == "constant":
                name = new_name("c")
                ns[name] = node.value
                self.constants[name] = node.value
            elif node.op == "variable":
                holder = new_name("V")
                ns[holder] = node
                name = new_name("v")
                lines.append(f"{name} = {holder}.value")
                self.program.append(("variable", node, name))
            elif node.op == "placeholder":
                raise ValueError(f"function: the outputs depend on placeholder {node.name!r}, "
                                 "which is not among the inputs")
            else:
                raise AssertionError(f"{node!r} used before the step computing it")
            names[node.id] = name
            fresh[node.id] = False
            return name

        args = []
        for i, ph in enumerate(self.placeholders):
            names[ph.id] = f"p{i}"
            fresh[ph.id] = False
            args.append(f"p{i}")
        run_as_epilogue = set()  # ids of groups run inside the library step before them
        for k, unit in enumerate(schedule):
            if id(unit) in run_as_epilogue:
                continue
            if isinstance(unit, Group):
                self._emit_group(unit, value_of, names, ns, lines, new_name)
                for out in unit.outputs:
                    fresh[out.id] = True
                continue
            node = unit
            if node.id in self.windows:
                continue  # read in place by the kernels that use it
            following = schedule[k + 1] if k + 1 < len(schedule) else None
            pool = self._pool_after(node, following, schedule[k + 2] if k + 2 < len(schedule) else None)
            if isinstance(following, Group) and self._emit_with_epilogue(
                    node, following, value_of, names, ns, lines, new_name, pool):
                run_as_epilogue.add(id(following))
                fresh[following.outputs[0].id] = True
                if pool is not None:
                    run_as_epilogue.add(id(pool))
                    fresh[pool.id] = True
                continue
            call = ", ".join(value_of(i) for i in node.inputs)
            fname, name = new_name("L"), new_name("v")
            ns[fname] = _ProductByWeights(node) if _multiplies_weights(node) else library_call(node)
            lines.append(f"{name} = {fname}({call})")
            names[node.id] = name
            self.program.append(("library", node, [value_of(i) for i in node.inputs], name))
            # a view of a leaf is not the caller's to keep
            fresh[node.id] = node.op not in _VIEW_OPS or fresh.get(node.inputs[0].id, False)
            self.steps.append(Step("library", node.op, [node], [node]))
        self.result_names = [value_of(t) for t in self.targets]
        # a result that is not new (a leaf or a view of one) is copied: the caller owns
        # it; so is one that another result already returns (y and K.identity(y))
        self.result_fresh = [fresh.get(t.id, False) and name not in self.result_names[:j]
                             for j, (t, name) in enumerate(zip(self.targets, self.result_names))]
        outs = [name if new else f"np.array({name})"
                for name, new in zip(self.result_names, self.result_fresh)]
        source = [f"def plan({', '.join(args)}):"]
        source += ["    " + line for line in lines]
        source.append("    return (" + "".join(o + ", " for o in outs) + ")")
        self.source = "\n".join(source) + "\n"
        exec(compile(self.source, "<numbackend plan>", "exec"), ns)  # noqa: S102 - our own source
        self.run = ns["plan"]

    def _pool_after(self, node, g, pool):
        """``pool``, the unit after ``node``'s epilogue group ``g``, where node can
        pool g's result itself (see Op.pools): a 2x2 'pool' with stride 2, 'valid',
        its only reader, and not a result of the function; else None."""
        if not (OPS[node.op].pools and isinstance(g, Group) and isinstance(pool, Tensor)
                and pool.op == "pool" and len(g.outputs) == 1 and pool.inputs[0] is g.outputs[0]):
            return None
        out, attrs = g.outputs[0], pool.attrs
        if (out.ndim != 4 or attrs["pool_size"] != (2, 2) or attrs["strides"] != (2, 2)
                or attrs["padding"] != "valid" or out.id in self.windows or pool.id in self.windows
                or [c.id for c in self.consumers.get(out.id, [])] != [pool.id]
                or any(t is out for t in self.targets)):
            return None
        return pool

    def _emit_with_epilogue(self, node, g, value_of, names, ns, lines, new_name, pool=None):
        """Emit library ``node`` with group ``g`` as its epilogue (see Op.epilogue),
        run on each block of its result's rows while in cache, and where given
        the 'pool' node after it (see :meth:`_pool_after`); False, emitting
        nothing, where g cannot run so: it must read nothing but node's result in
        full and values along the last axis or scalars, and be node's only reader."""
        if (not OPS[node.op].epilogue or g.k or len(g.outputs) != 1
                or node.id in self.windows or any(t is node for t in self.targets)):
            return False
        out = g.outputs[0]
        members = {m.id: j for j, m in enumerate(g.members)}
        inputs = _group_inputs(g)
        if (out.shape != node.shape or out.dtype != node.dtype or node.ndim < 2
                or node.dtype not in ("float32", "float64")
                or any(c.id not in members for c in self.consumers.get(node.id, []))
                or any(t.id in self.windows for t in inputs)
                or not all(_fusible_dtype(x.dtype) for x in inputs + g.members)):
            return False
        split, patterns, flat = layout(g, inputs)
        position = _index(inputs, node)
        if (patterns[position] != "F" or (not flat and split != len(g.domain) - 1)
                or any(p not in ("C", "S") for j, p in enumerate(patterns) if j != position)):
            return False
        spec = _kernel_spec(g, inputs, members, 1, patterns, flat, {}, on_rows=True)
        module = codegen.load_kernel(codegen.generate_source(spec, into=True))
        others = [value_of(t) for j, t in enumerate(inputs) if j != position]
        call, name = new_name("L"), new_name("v")
        pool_first = pool is not None and pool.attrs["mode"] == "max" and rises_with(g, node)
        ns[call] = _library_with_epilogue(node, module, patterns, [t.dtype for t in inputs], position,
                                          _numpy_group(g, inputs), pool, pool_first)
        lines.append(f"{name} = {call}({', '.join([value_of(i) for i in node.inputs] + others)})")
        result = out if pool is None else pool
        names[result.id] = name
        self._program_with_epilogue(node, g, inputs, position, pool, pool_first,
                                    [value_of(i) for i in node.inputs], others, name, new_name)
        self.kernels.append(module)
        members = ([node, pool] + list(g.members) if pool_first else
                   [node] + list(g.members) + ([] if pool is None else [pool]))
        label = (f"{node.op}+pool+fused[{module.KEY[:8]}]" if pool_first else
                 f"{node.op}+fused[{module.KEY[:8]}]" + ("" if pool is None else "+pool"))
        self.steps.append(Step("library", label, members, [result], module))
        return True

    def _program_with_epilogue(self, node, g, inputs, position, pool, pool_first, ins, others, name,
                               new_name):
        """The program's entries (see __init__) for library ``node`` with its
        epilogue group ``g``, as :meth:`_emit_with_epilogue` emits them, into
        ``name`` (its inputs named ``ins``, the group's other inputs ``others``):
        a ("conv", node, in names, out name, pool mode) entry, the
        group's kernel after it, for a convolution that pools, if at all,
        before its epilogue; else "unsupported"."""
        split, patterns, flat = layout(g, inputs)
        if node.op != "conv" or (pool is not None and not pool_first) or None in patterns:
            self.program.append(("unsupported", "a library step with an element-wise epilogue"))
            return
        conv_out = new_name("v")
        self.program.append(("conv", node, ins, conv_out, None if pool is None else pool.attrs["mode"]))
        kernel_args = list(others)
        kernel_args.insert(position, conv_out)
        members = {m.id: j for j, m in enumerate(g.members)}
        spec = _kernel_spec(g, inputs, members, split, patterns, flat, {})
        # (a namespace of its own: the plan's Python lines do not read these scalars)
        self.program.append(("kernel", spec, self._call_args(kernel_args, patterns, inputs, {}, new_name),
                             [name]))

    def _emit_group(self, g, value_of, names, ns, lines, new_name):
        members = {m.id: j for j, m in enumerate(g.members)}
        inputs = _group_inputs(g)
        windows = {j: self.windows[t.id] for j, t in enumerate(inputs) if t.id in self.windows}
        kernel_args, in_names = [], []
        for t in inputs:
            if t.id in self.windows:
                base = value_of(t.inputs[0])
                offset, width = self.windows[t.id]
                kernel_args.append(base)
                in_names.append(f"{base}[..., {offset}:{offset + width}]")
            else:
                kernel_args.append(value_of(t))
                in_names.append(kernel_args[-1])
        out_names = [new_name("v") for _ in g.outputs]
        for node, name in zip(g.outputs, out_names):
            names[node.id] = name
        targets = "(" + "".join(n + ", " for n in out_names) + ")"
        fallback = new_name("G")
        ns[fallback] = _numpy_group(g, inputs)
        fusible = all(_fusible_dtype(x.dtype) for x in inputs + g.members)
        split, patterns, flat = layout(g, inputs, windows) if fusible else (0, [None], False)
        if None in patterns:
            # not fusible, or an input that broadcasts along both rows and columns:
            # materialised below, which a compiled loop does not do
            self.program.append(("unsupported", "a group the loop cannot call as it is"))
        else:
            spec = _kernel_spec(g, inputs, members, split, patterns, flat, windows)
            call_args = self._call_args(kernel_args, patterns, inputs, ns, new_name)
            self.program.append(("kernel", spec, call_args, out_names))
        size = g.known_size()
        if not fusible or (size is not None and size <= tuning.NUMPY_MAX_SIZE):
            lines.append(f"{targets} = {fallback}({', '.join(in_names)})")
            self.steps.append(Step("numpy", "numpy", list(g.members), list(g.outputs)))
            return
        if any(p is None for p in patterns):
            dom = new_name("d")
            lines.append(f"{dom} = _bshape({', '.join(in_names)})")
            for i, p in enumerate(patterns):
                if p is None:
                    wide = new_name("w")
                    lines.append(f"{wide} = np.ascontiguousarray(np.broadcast_to({in_names[i]}, {dom}))")
                    kernel_args[i] = wide
                    patterns[i] = "F"
            flat = g.k == 0 and all(p in ("F", "S") for p in patterns)
            spec = _kernel_spec(g, inputs, members, split, patterns, flat, windows)
            call_args = self._call_args(kernel_args, patterns, inputs, ns, new_name)
        module = codegen.load_kernel(codegen.generate_source(spec))
        kname = new_name("K")
        ns[kname] = module
        self.kernels.append(module)
        block = ["try:",
                 f"    {targets} = {kname}.run({', '.join(call_args)})",
                 "except ValueError:  # run-time shapes broadcast unlike the static ones",
                 f"    {targets} = {fallback}({', '.join(in_names)})"]
        kind = "kernel"
        if g.per_sample():
            kind = "numpy|kernel"
            size_expr = _size_expr(kernel_args, patterns, windows)
            block = [f"if {size_expr} <= {tuning.NUMPY_MAX_SAMPLES}:",
                     f"    {targets} = {fallback}({', '.join(in_names)})",
                     "else:"] + ["    " + line for line in block]
        lines.extend(block)
        self.steps.append(Step(kind, f"fused[{module.KEY[:8]}]", list(g.members),
                               list(g.outputs), module))

    def _call_args(self, kernel_args, patterns, inputs, ns, new_name):
        """A kernel call's argument expressions: the array's name, or for an input the
        kernel takes as a scalar ('S'), a constant's value by name or the array's one
        element."""
        args = []
        for name, p, t in zip(kernel_args, patterns, inputs):
            if p == "S" and t.op == "constant":
                scalar = new_name("s")
                ns[scalar] = self.constants[scalar] = t.value.reshape(-1)[0]
                args.append(scalar)
            elif p == "S":
                args.append(f"{name}.reshape(-1)[0]")
            else:
                args.append(name)
        return args

    def explain(self):
        """One line per step: the kernel, the graph ops it runs, its outputs' shapes."""
        out = []
        for i, step in enumerate(self.steps):
            ops = " -> ".join(n.op for n in step.nodes)
            shapes = ", ".join(f"{format_shape(o.shape)} {o.dtype}" for o in step.outputs)
            out.append(f"{i:3d}  {step.kind:8s} {step.label:18s} {ops}  out={shapes}")
        return "\n".join(out)


def _window_of(node):
    """(offset, width) when ``node`` slices only the last axis of its input, with
    step 1 and static bounds: a kernel can read it in place."""
    if node.op != "getitem" or node.ndim == 0 or node.ndim != node.inputs[0].ndim:
        return None
    window = last_axis_window(node.attrs["key"], node.inputs[0].shape)
    return None if window is None else (window[0], window[1] - window[0])


def _windows(order, targets, unit_of, consumers):
    """The last-axis slices every consumer of which is a kernel over the slice's own
    shape: {node id: (offset, width)}; those kernels read the slice in place."""
    target_ids = {t.id for t in targets}
    windows = {}
    for node in order:
        window = _window_of(node)
        if window is None or node.id in target_ids or not _fusible_dtype(node.dtype):
            continue
        groups = [unit_of.get(c.id) for c in consumers.get(node.id, [])]
        if groups and all(isinstance(g, Group) and g.k <= 1 and g.domain == node.shape
                          for g in groups):
            windows[node.id] = window
    return windows


def _group_inputs(g):
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


def _library_with_epilogue(node, module, patterns, dtypes, position, fallback, pool=None,
                           pool_first=False):
    """A plan step's callable for library ``node`` running a group's kernel as its
    epilogue, and pooling the result where ``pool`` (a 'pool' node) is given:
    ``call(*node_inputs, *group_inputs_but_node)``.  With ``pool_first`` (max
    pooling, a group that :func:`rises_with` node), node's value is pooled and
    the group runs on the pooled values.  The kernel runs as a compiled part
    (jit_kernels.parts.CompiledEpilogue), which compiled loops call on their
    blocks.  Run-time shapes it does not take (a last axis of another length)
    run the node, then the group with NumPy, then the pool."""
    from jit_kernels import parts  # not at import: it loads BLAS
    unpooled = functools.partial(OPS[node.op].impl, **node.attrs) if node.attrs else OPS[node.op].impl
    impl = unpooled if pool is None else functools.partial(unpooled, pool=pool.attrs["mode"])
    pool_call = None if pool is None else library_call(pool)
    own = len(node.inputs)
    others = [(p == "C", np.dtype(t)) for j, (p, t) in enumerate(zip(patterns, dtypes)) if j != position]
    dtype = np.dtype(node.dtype)

    last = [(), None]  # the last call's group inputs and their epilogue, while it can serve again

    def compiled_epilogue(inputs):
        """The CompiledEpilogue of the group's other inputs: the last one where they
        are the same arrays, read in place (a layer's weights, on each call)."""
        known, epilogue = last
        if epilogue is not None and len(known) == len(inputs):
            for a, b in zip(known, inputs):
                if a is not b:
                    break
            else:
                return epilogue
        keep, numbers, widths, in_place = [], [], [], True
        for (row, kind), a in zip(others, inputs):
            # C-contiguous and in the kernel's types: it reads them by address
            in_place = in_place and type(a) is np.ndarray and a.dtype == kind and a.flags.c_contiguous
            a = np.asarray(a, dtype=kind).reshape(-1)
            keep.append(a)
            numbers.append(parts.address(a))
            if row:
                widths.append(a.size)
        epilogue = parts.CompiledEpilogue(module.EPILOGUE_PART, dtype, numbers, keep, widths)
        # a copy would miss a change made in place to the array it came from
        last[:] = (inputs, epilogue) if in_place else ((), None)
        return epilogue

    def call(*arrays):
        epilogue = compiled_epilogue(arrays[own:])
        try:
            if pool_first:
                return impl(*arrays[:own], epilogue=epilogue, pool_first=True)
            return impl(*arrays[:own], epilogue=epilogue)
        except parts.EpilogueMismatch:  # checked before any block ran
            group_inputs = list(arrays[own:])
            group_inputs.insert(position, unpooled(*arrays[:own]))
            result = fallback(*group_inputs)[0]
            return result if pool_call is None else pool_call(result)
    return call


def _kernel_spec(g, inputs, members, split, patterns, flat, windows, on_rows=False):
    """The canonical description of a group's kernel (see codegen.KernelSpec).
    ``on_rows``: over (rows, last axis) blocks of the domain instead, rank 2, its
    inputs 'F' blocks, 'C' vectors and 'S' scalars."""
    spec_inputs = [(p, {"F": 2, "C": 1, "S": 0}[p] if on_rows else len(t.shape), t.dtype)
                   for p, t in zip(patterns, inputs)]
    spec_nodes = []
    for m in g.members:
        refs = [("node", members[i.id]) if i.id in members else ("in", _index(inputs, i))
                for i in m.inputs]
        op = OPS[m.op]
        if op.kind == "reduce":
            ct = "bool" if m.op in ("any", "all") else m.dtype
        else:
            ct = op.compute_dtype(m.inputs, m.attrs)
        spec_nodes.append((m.op, m.attrs, refs, ct, m.dtype))
    spec_outputs = []
    for out in g.outputs:
        if OPS[out.op].kind == "reduce":
            spec_outputs.append((members[out.id], "reduced", out.attrs["keepdims"]))
        else:
            spec_outputs.append((members[out.id], "full", False))
    return codegen.KernelSpec(2 if on_rows else len(g.domain), split, g.k, flat, spec_inputs,
                              spec_nodes, spec_outputs, windows)


def _numpy_group(g, inputs):
    """A callable evaluating a group node by node with NumPy; returns its outputs."""
    steps = [(m.id, [i.id for i in m.inputs], node_function(m)) for m in g.members]

    def run(*arrays):
        values = {t.id: a for t, a in zip(inputs, arrays)}
        for member, reads, compute in steps:
            values[member] = compute(*[values[i] for i in reads])
        return tuple(values[o.id] for o in g.outputs)
    return run


def _index(seq, item):
    for i, x in enumerate(seq):
        if x is item:
            return i
    raise KeyError(item)


def _size_expr(names, patterns, windows):
    """Python expression for the number of elements a kernel loops over."""
    for n, p in zip(names, patterns):
        if p == "F":
            return f"{n}.size"
    for i, (n, p) in enumerate(zip(names, patterns)):
        if p == "W":  # the array is wider than the window the kernel reads
            return f"{n}.size // max({n}.shape[-1], 1) * {windows[i][1]}"
    rows = next((n for n, p in zip(names, patterns) if p == "R"), None)
    cols = next((n for n, p in zip(names, patterns) if p == "C"), None)
    parts = [f"{n}.size" for n in (rows, cols) if n is not None]
    return " * ".join(parts) if parts else "0"


def _broadcast_runtime(*arrays):
    return np.broadcast_shapes(*[np.shape(a) for a in arrays])


# ---------------------------------------------------------------------------
# Function


class Function:
    """A compiled ``K.function``: call it with a list of arrays, one per input.

    Where Keras's learning phase is an input, each value fed has a plan of its
    own, built on its first call, with the phase a constant: K.in_train_phase
    takes its branch there and the other is never computed (a predict function
    fed 0 draws no dropout mask).  ``plan`` and :meth:`explain` show the plan of
    the value last fed."""

    def __init__(self, inputs, outputs, updates=(), name=None, input_numbers=None):
        """``input_numbers``: the number that messages give each input, where it
        is not its position (sparse.SparseFunction's inputs, a sparse input's
        three parts in its place)."""
        from . import ops
        self.inputs = list(inputs)
        self._input_numbers = list(input_numbers or range(len(self.inputs)))
        for i, x in enumerate(self.inputs):
            if not isinstance(x, Placeholder):
                raise TypeError(f"function: input {self._input_numbers[i]} must be a placeholder, "
                                f"got {x!r}")
        # per input: its dtype, rank and known (axis, size) pairs, checked on every call
        self._expected = [(np.dtype(x.dtype), len(x.shape),
                           tuple((a, d) for a, d in enumerate(x.shape) if d is not None))
                          for x in self.inputs]
        self.single_output = not isinstance(outputs, (list, tuple))
        self.outputs = [ops.as_tensor(o, where="function") for o in
                        ([outputs] if self.single_output else list(outputs))]
        self.update_vars = []
        update_values = []
        for u in updates or ():
            var, value = _unpack_update(u)
            value = ops.as_tensor(value, dtype=var.dtype, where="function")
            if value.shape != var.shape and None not in value.shape:
                raise ValueError(f"function: update of variable {var.name!r} of shape "
                                 f"{format_shape(var.shape)} with a value of shape "
                                 f"{format_shape(value.shape)}")
            if value.dtype != var.dtype:
                value = ops.apply("cast", value, dtype=var.dtype)
            self.update_vars.append(var)
            update_values.append(value)
        self.outputs, update_values = lift_updates(self.outputs, self.update_vars, update_values)
        placeholders = list(self.inputs)
        self._defaults = []
        for node in toposort(self.outputs + update_values):
            if isinstance(node, Placeholder) and all(node is not p for p in placeholders):
                if node.default is None:
                    raise ValueError(f"function: the outputs depend on placeholder {node.name!r}, "
                                     "which is not among the inputs")
                placeholders.append(node)
                self._defaults.append(node.default)
        targets = self.outputs + update_values
        # A placeholder with a plan per value (Keras's learning phase): fed, its
        # value picks the plan, built on first use; else it is always its default.
        self._per_value = None  # its position among the arrays of a call
        for i, p in enumerate(placeholders):
            if p.plan_per_value and i >= len(self.inputs):
                targets = substitute(targets, {p.id: Constant(p.default, dtype=p.dtype)})
                del placeholders[i], self._defaults[i - len(self.inputs)]
                break
            if p.plan_per_value:
                self._per_value = i
                break
        self._placeholders, self._targets = placeholders, targets
        self._runners = {}  # the value fed: its runner, where a placeholder has a plan per value
        self._runner = None if self._per_value is not None else self._new_runner(targets)
        # held from reading the variables to writing their new values, so that
        # calls from several threads lose no update (see core.function)
        self._update_lock = threading.Lock() if self.update_vars else None
        self.name = name

    def _new_runner(self, targets, placeholders=None):
        runner = _PlanRunner(Plan(self._placeholders if placeholders is None else placeholders,
                                  targets))
        level = debug_level()
        if level >= 1:
            print(runner.explain())
        if level >= 2:
            print(runner.plan.source)
            for k in runner.plan.kernels:
                print(k.SOURCE)
        return runner

    def _runner_for(self, value):
        """The runner of the plan where the placeholder with a plan per value is
        ``value``, a constant there (K.in_train_phase then takes its branch alone)."""
        runner = self._runners.get(value)
        if runner is None:
            fixed = self._placeholders[self._per_value]
            targets = substitute(self._targets, {fixed.id: Constant(value, dtype=fixed.dtype)})
            others = [p for p in self._placeholders if p is not fixed]
            runner = self._runners[value] = self._new_runner(targets, others)
        return runner

    def _current(self):
        """The runner of the last call (before any call, that of the default value)."""
        if self._runner is None:
            default = self._placeholders[self._per_value].default
            self._runner = self._runner_for(0 if default is None else int(default))
        return self._runner

    @property
    def plan(self):
        """The plan of the last call (see :meth:`_current`)."""
        return self._current().plan

    @property
    def _one_call(self):
        return self._current().one_call

    def _check(self, values):
        # Loops rather than generator expressions: at batch 1 each costs about a
        # microsecond, a tenth of the W3 MLP's whole call on a fast machine.
        if not isinstance(values, (list, tuple)):
            raise TypeError("function: call with a list of input arrays, "
                            f"got {type(values).__name__}")
        if len(values) != len(self.inputs):
            raise ValueError(f"function: expected {len(self.inputs)} input(s), got {len(values)}")
        arrays = []
        for i, value in enumerate(values):
            dtype, ndim, known = self._expected[i]
            if type(value) is np.ndarray:
                arr = value
            elif type(value) is float or type(value) is int:
                # Keras feeds the learning phase as 0. or 1.: made an array of the
                # input's dtype at once, not through float64 and the general check
                arr = _number_as(value, dtype)
            else:
                arr = np.asarray(value)
            if arr.dtype != dtype and not _castable(arr, dtype):
                _refuse_sparse(self._input_numbers[i], self.inputs[i], value)
                raise TypeError(f"function: input {self._input_numbers[i]} "
                                f"({self.inputs[i].name!r}) has dtype "
                                f"{dtype}; cannot cast a {arr.dtype} array to it")
            shape = arr.shape
            fits = len(shape) == ndim
            for axis, size in known:
                fits = fits and shape[axis] == size
            if not fits:
                raise ValueError(f"function: input {self._input_numbers[i]} "
                                 f"({self.inputs[i].name!r}) expects shape "
                                 f"{format_shape(self.inputs[i].shape)}, got {shape}")
            if arr.dtype != dtype or not arr.flags.c_contiguous:
                arr = np.array(arr, dtype=dtype, order="C")
            arrays.append(arr)
        return arrays

    def __call__(self, values=()):
        arrays = self._check(values)
        # A fork waits for calls under way: OpenBLAS's pool does not survive one
        # made while a product runs on it (see jit_kernels.fork).
        gate = _fork_gate()
        gate.enter()
        try:
            return self._serve(arrays)
        finally:
            gate.leave()

    def _serve(self, arrays):
        """The outputs for checked inputs, updates written where there are any."""
        if self._defaults:
            arrays += self._defaults
        if self._update_lock is not None:
            with self._update_lock:  # see core.function: one call with updates at a time
                return self._run_and_update(arrays)
        results = self._run(arrays)
        return results[0] if self.single_output else list(results)

    def _run(self, arrays):
        """The targets' values, from the plan of the value fed where a placeholder
        has a plan per value."""
        if self._per_value is None:
            return self._runner.run(arrays)
        runner = self._runner = self._runner_for(int(arrays.pop(self._per_value)))
        return runner.run(arrays)

    def _run_and_update(self, arrays):
        """The outputs, after writing the updates' new values (all computed from the
        values before the call, none written where one has the wrong shape)."""
        results = self._run(arrays)
        n = len(self.outputs)
        new_values = results[n:]
        for var, value in zip(self.update_vars, new_values):
            if value.shape != var.shape:
                raise ValueError(f"function: update of variable {var.name!r} of shape "
                                 f"{var.shape} computed a value of shape {value.shape}; "
                                 "no variable was changed")
        for var, value in zip(self.update_vars, new_values):
            var.value = value
        if self._runner.one_call:
            self._runner.one_call.forget()  # the values it read are replaced: hold them no longer
        outputs = results[:n]
        written = {id(value) for value in new_values}
        if any(id(out) in written for out in outputs):
            # an output that is an update's new value (K.update's result among the
            # outputs) is the caller's copy: writing into it must not change the variable
            outputs = [out.copy() if id(out) in written else out for out in outputs]
        return outputs[0] if self.single_output else list(outputs)

    def explain(self):
        """The compiled plan, one line per step (where a placeholder has a plan per
        value, the plan of the value last fed: before any call, of its default)."""
        return self._current().explain()

    def kernel_sources(self):
        """The generated source of each kernel the plan calls."""
        return [k.SOURCE for k in self.plan.kernels]


class _PlanRunner:
    """A plan and, once called ONE_CALL_AFTER times with small inputs, the plan
    compiled as one call: ``run(arrays)`` gives the targets' values."""

    def __init__(self, plan):
        self.plan = plan
        self.small_calls = 0
        self.one_call = None  # compiled_plan.Call once compiled; False where it cannot be

    def run(self, arrays):
        """The targets' values: from the plan compiled as one call where it serves,
        else from the plan."""
        one_call = self.one_call
        if one_call is not False:
            size = 0
            for a in arrays:
                size += a.size
            if size <= tuning.ONE_CALL_MAX_ELEMENTS:
                results = one_call.run(*arrays) if one_call else self._count_small_call(arrays)
                if results is not None:
                    return results
        return self.plan.run(*arrays)

    def _count_small_call(self, arrays):
        """The results from the plan compiled as one call once called with small
        inputs ONE_CALL_AFTER times; None where the plan runs instead (not yet
        called often enough, or not compiled)."""
        self.small_calls += 1
        if self.small_calls < tuning.ONE_CALL_AFTER:
            return None
        from .compiled_plan import compile_call
        self.one_call = compile_call(self.plan) or False
        return self.one_call.run(*arrays) if self.one_call else None

    def explain(self):
        """The plan, one line per step."""
        text = self.plan.explain()
        if self.one_call:
            text += (f"\n     (inputs of at most {tuning.ONE_CALL_MAX_ELEMENTS} elements: "
                     "these steps run as one compiled call)")
        return text


@functools.cache
def _fork_gate():
    # jit_kernels is loaded on a function's first call, not when numbackend is imported
    from jit_kernels import fork_gate
    return fork_gate


def _refuse_sparse(i, placeholder, value):
    """Raise where a scipy.sparse matrix is fed to dense input ``i``: as
    TensorFlow, numbackend does not make it dense (Keras does, before its calls)."""
    from .sparse import is_scipy_sparse
    if is_scipy_sparse(value):
        raise TypeError(f"function: input {i} ({placeholder.name!r}) is dense, of shape "
                        f"{format_shape(placeholder.shape)}: got a scipy.sparse matrix of shape "
                        f"{value.shape}; feed value.toarray(), or make the input sparse "
                        "(K.placeholder(..., sparse=True), Input(..., sparse=True))")


def _number_as(value, dtype):
    """A Python int or float fed to an input of ``dtype``: a 0-d array of that dtype
    where it fits as it is (a whole float for an integer input), else the
    float64 or int64 array that :func:`_castable` judges."""
    if dtype.kind in "biu" and type(value) is float:
        if not value.is_integer():
            return np.asarray(value)  # which _castable refuses
        value = int(value)
    try:
        return np.array(value, dtype)
    except OverflowError:  # out of dtype's range
        return np.asarray(value)


def _castable(arr, dtype):
    """May an input array of another dtype than its placeholder's (``dtype``) be cast to it?"""
    return (np.can_cast(arr.dtype, dtype, "same_kind")
            or (arr.dtype.kind in "biu" and dtype.kind in "iuf")
            # Keras feeds e.g. the learning phase as 1.0: integral floats are fine
            or (arr.dtype.kind == "f" and dtype.kind in "biu"
                and np.array_equal(arr, np.trunc(arr))))


def lift_updates(outputs, update_vars, update_values):
    """The outputs and update values with each graph.Update they depend on read as
    its new value, and the updates of the call (``update_vars`` is extended in
    place) with those Updates' assignments added: evaluating an Update writes its
    variable once per call, as TensorFlow's assign ops do, even where it is also
    among the updates or read several times."""
    # an Update passed as an update is not added again
    given = {id(value) for var, value in zip(update_vars, update_values)
             if isinstance(value, Update) and value.variable is var}
    replacements = {}
    for node in toposort(outputs + update_values):
        if isinstance(node, Update):
            (new_value,) = substitute([node.new_value], replacements)  # inner Updates first
            replacements[node.id] = new_value
            if id(node) not in given:
                update_vars.append(node.variable)
                update_values.append(node)
    if not replacements:
        return outputs, update_values
    lifted = substitute(outputs + update_values, replacements)
    return lifted[:len(outputs)], lifted[len(outputs):]


def _unpack_update(u):
    if isinstance(u, Update):
        return u.variable, u
    if isinstance(u, (list, tuple)) and len(u) == 2:
        var, value = u
    else:
        raise TypeError(f"function: an update must be a (variable, new_value) pair, got {u!r}")
    if not isinstance(var, Variable):
        raise TypeError(f"function: updates must target variables, got {var!r}")
    return var, value
