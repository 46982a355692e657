"""A function's body as one typed program: the steps it runs, in order.

:func:`build` rewrites the targets' graph (rewrite.py), partitions it into
fused groups and library steps (partition.py) and writes each as a step:

- :class:`ReadVariable`: a variable's value, read once per call;
- :class:`FusedGroup`: a group of element-wise ops (and trailing-axis
  reductions ending them) run as one generated kernel, with its NumPy
  fallback;
- :class:`LibraryCall`: one library op (a product, a convolution, a scan...),
  run by its lowering (lowering.py);
- :class:`LibraryWithEpilogue`: a library op that runs a fused group on each
  block of its result while in cache (a convolution's bias and activation),
  and may pool its result too.

Values are named in the program's own namespace: ``p0, p1...`` the
placeholders, ``v..`` computed values, ``c..`` and ``s..`` constants (their
values in ``Program.constants``).  Three consumers run a program: the Python
plan (plan.py), the whole compiled call and the scan's compiled loop
(compiled_plan.py, scan_loop.py).  None of them decides anything the program
says.
"""
from dataclasses import dataclass, field

from jit_kernels import tuning

from .graph import Tensor, Variable, consumers_of, toposort
from .lowering import lowering_of
from .partition import (
    Group,
    KernelSpec,
    fusible_dtype,
    group_inputs,
    index_of,
    kernel_spec,
    layout,
    partition,
    rises_with,
    unit_members,
    windows_of,
)
from .rewrite import rewrite


@dataclass(eq=False)
class ReadVariable:
    """``out = variable.value``: read once per call, on first use."""
    variable: Variable
    out: str


@dataclass(eq=False)
class KernelCall:
    """A call of a generated kernel: ``outs = kernel(*args)``.  ``args`` are
    argument expressions in the program's names: a value, a scalar constant,
    or ``name.reshape(-1)[0]``, the one item of an array the kernel takes as
    a scalar."""
    spec: KernelSpec
    args: list
    outs: list


@dataclass(eq=False)
class FusedGroup:
    """A fused group.  ``kernel``: its compiled call, or None where the inputs'
    layout has no compiled form (an input broadcast along both rows and
    columns).  The Python plan runs ``plan_kernel`` instead, the same kernel
    after broadcasting the inputs ``materialise`` (their indices) to the
    domain; it runs NumPy alone (``fallback_args``, window slices spelled
    out) where ``numpy_only``, and up to NUMPY_MAX_SAMPLES samples where
    ``per_sample``."""
    group: Group
    inputs: list
    fallback_args: list
    outs: list
    kernel: KernelCall
    plan_kernel: KernelCall
    materialise: list
    numpy_only: bool
    per_sample: bool
    size_expr: str


@dataclass(eq=False)
class LibraryCall:
    """``out = node's op(*ins)``, run by ``lowering``."""
    node: Tensor
    lowering: object
    ins: list
    out: str


@dataclass(eq=False)
class LibraryWithEpilogue:
    """Library ``node`` (inputs ``ins``) whose result the group ``group`` reads
    as its input ``position`` (its other inputs ``others``), run by
    ``lowering`` on each block of node's result (``rows_spec``: the group's
    kernel over (rows, last axis) blocks, ``patterns`` its inputs' layouts);
    with ``pool`` (a 'pool' node after the group), pooled as well: first,
    where ``pool_first``, else after the group.  ``out`` is the result of
    the last of them.  The compiled form, where there is one: the library
    op into ``unfused``, then ``kernel`` over it; with a pool after the
    group, ``kernel`` writes ``unpooled``, which the pool reads (compiled in
    an export only)."""
    node: Tensor
    lowering: object
    ins: list
    group: Group
    inputs: list
    position: int
    others: list
    patterns: list
    rows_spec: KernelSpec
    pool: Tensor
    pool_first: bool
    out: str
    unfused: str = None
    kernel: KernelCall = None
    unpooled: str = None

    @property
    def members(self):
        """The graph nodes the step computes, in the order it computes them."""
        pool = [] if self.pool is None else [self.pool]
        if self.pool_first:
            return [self.node] + pool + list(self.group.members)
        return [self.node] + list(self.group.members) + pool

    @property
    def result(self):
        return self.group.outputs[0] if self.pool is None else self.pool


@dataclass(eq=False)
class Program:
    """The steps, the constants they read by name, and the names of the
    targets' values; ``result_fresh[j]``: whether target j is a new array the
    caller may keep (else it is copied: a leaf, a view of one, or a value
    another target returns too); ``written``: the ids of the variables the
    function writes at every call (its updates)."""
    placeholders: list
    targets: list
    written: frozenset = frozenset()
    steps: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)
    result_names: list = field(default_factory=list)
    result_fresh: list = field(default_factory=list)


def build(placeholders, targets, written=frozenset()):
    """The program computing ``targets`` from ``placeholders``' values, for a
    function writing the variables whose ids are ``written``."""
    program = _Builder(list(placeholders), rewrite(targets)).program
    program.written = frozenset(written)
    return program


class _Builder:
    def __init__(self, placeholders, targets):
        self.program = Program(placeholders, targets)
        order = toposort(targets)
        self.unit_of = partition(order, targets)
        self.consumers = consumers_of(order)
        self.windows = windows_of(order, targets, self.unit_of, self.consumers)
        self.names, self.fresh, self.counter = {}, {}, 0
        for i, ph in enumerate(placeholders):
            self.names[ph.id] = f"p{i}"
            self.fresh[ph.id] = False
        self._steps(self._schedule(targets))
        p = self.program
        p.result_names = [self.value_of(t) for t in targets]
        p.result_fresh = [self.fresh.get(t.id, False) and name not in p.result_names[:j]
                          for j, (t, name) in enumerate(zip(targets, p.result_names))]

    def new_name(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def value_of(self, node):
        """The program's name for a value, reading leaves on first use."""
        if node.id in self.names:
            return self.names[node.id]
        if node.op == "constant":
            name = self.new_name("c")
            self.program.constants[name] = node.value
        elif node.op == "variable":
            name = self.new_name("v")
            self.program.steps.append(ReadVariable(node, name))
        elif node.op == "placeholder":
            raise ValueError(f"function: the outputs depend on placeholder {node.name!r}, "
                             "which is not among the inputs")
        else:
            raise AssertionError(f"{node!r} used before the step computing it")
        self.names[node.id] = name
        self.fresh[node.id] = False
        return name

    def _schedule(self, targets):
        """The units in an order where each runs after the units it reads from."""
        unit_of = self.unit_of
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
            for m in unit_members(unit):
                for i in m.inputs:
                    u = unit_of.get(i.id)
                    if u is not None and u is not unit and id(u) not in done:
                        stack.append((u, False))
        return schedule

    def _steps(self, schedule):
        taken = set()  # ids of units run inside the library step before them
        for k, unit in enumerate(schedule):
            if id(unit) in taken:
                continue
            if isinstance(unit, Group):
                self._group(unit)
                continue
            node = unit
            if node.id in self.windows:
                continue  # read in place by the kernels that use it
            following = schedule[k + 1] if k + 1 < len(schedule) else None
            after = schedule[k + 2] if k + 2 < len(schedule) else None
            step = self._with_epilogue(node, following, self._pool_after(node, following, after))
            if step is not None:
                taken.add(id(following))
                if step.pool is not None:
                    taken.add(id(step.pool))
                continue
            lowering = lowering_of(node)
            out = self.new_name("v")
            self.program.steps.append(LibraryCall(node, lowering, [self.value_of(i) for i in node.inputs],
                                                  out))
            self.names[node.id] = out
            # a view of a leaf is not the caller's to keep
            self.fresh[node.id] = not lowering.returns_view or self.fresh.get(node.inputs[0].id, False)

    def _pool_after(self, node, g, pool):
        """``pool``, the unit after ``node``'s epilogue group ``g``, where node's
        lowering can pool g's result itself: a 2x2 'pool' with stride 2,
        'valid', its only reader, and not a result of the function; else None."""
        if not (lowering_of(node).pools and isinstance(g, Group) and isinstance(pool, Tensor)
                and pool.op == "pool" and len(g.outputs) == 1 and pool.inputs[0] is g.outputs[0]):
            return None
        out, attrs = g.outputs[0], pool.attrs
        if (out.ndim != 4 or attrs["pool_size"] != (2, 2) or attrs["strides"] != (2, 2)
                or attrs["padding"] != "valid" or out.id in self.windows or pool.id in self.windows
                or [c.id for c in self.consumers.get(out.id, [])] != [pool.id]
                or any(t is out for t in self.program.targets)):
            return None
        return pool

    def _with_epilogue(self, node, g, pool):
        """The step running library ``node`` with group ``g`` as its epilogue
        (and ``pool`` after it, where given), added to the program; None,
        adding nothing, where g cannot run so: it must read nothing but node's
        result in full and values along the last axis or scalars, and be
        node's only reader."""
        targets = self.program.targets
        lowering = lowering_of(node)
        if (not lowering.takes_epilogue(node) or not isinstance(g, Group) or g.k or len(g.outputs) != 1
                or node.id in self.windows or any(t is node for t in targets)):
            return None
        out = g.outputs[0]
        members = {m.id: j for j, m in enumerate(g.members)}
        inputs = group_inputs(g)
        if (out.shape != node.shape or out.dtype != node.dtype or node.ndim < 2
                or node.dtype not in ("float32", "float64")
                or any(c.id not in members for c in self.consumers.get(node.id, []))
                or any(t.id in self.windows for t in inputs)
                or not all(fusible_dtype(x.dtype) for x in inputs + g.members)):
            return None
        split, patterns, flat = layout(g, inputs)
        position = index_of(inputs, node)
        if (patterns[position] != "F" or (not flat and split != len(g.domain) - 1)
                or any(p not in ("C", "S") for j, p in enumerate(patterns) if j != position)):
            return None
        ins = [self.value_of(i) for i in node.inputs]
        others = [self.value_of(t) for j, t in enumerate(inputs) if j != position]
        pool_first = pool is not None and pool.attrs["mode"] == "max" and rises_with(g, node)
        name = self.new_name("v")
        step = LibraryWithEpilogue(node, lowering, ins, g, inputs, position, others, patterns,
                                   kernel_spec(g, inputs, members, 1, patterns, flat, {}, on_rows=True),
                                   pool, pool_first, name)
        # the compiled form: the library op, then the group's kernel over its
        # result (pooled first where pool_first, else after the kernel)
        step.unfused = self.new_name("v")
        if pool is not None and not pool_first:
            step.unpooled = self.new_name("v")
        args = list(others)
        args.insert(position, step.unfused)
        step.kernel = KernelCall(kernel_spec(g, inputs, members, split, patterns, flat, {}),
                                 self._kernel_args(args, patterns, inputs), [step.unpooled or name])
        self.program.steps.append(step)
        self.names[step.result.id] = name
        self.fresh[step.result.id] = True
        return step

    def _group(self, g):
        members = {m.id: j for j, m in enumerate(g.members)}
        inputs = group_inputs(g)
        windows = {j: self.windows[t.id] for j, t in enumerate(inputs) if t.id in self.windows}
        args, fallback_args = [], []
        for t in inputs:
            if t.id in self.windows:
                base = self.value_of(t.inputs[0])
                offset, width = self.windows[t.id]
                args.append(base)
                fallback_args.append(f"{base}[..., {offset}:{offset + width}]")
            else:
                args.append(self.value_of(t))
                fallback_args.append(args[-1])
        outs = [self.new_name("v") for _ in g.outputs]
        for node, name in zip(g.outputs, outs):
            self.names[node.id] = name
            self.fresh[node.id] = True
        fusible = all(fusible_dtype(x.dtype) for x in inputs + g.members)
        split, patterns, flat = layout(g, inputs, windows) if fusible else (0, [None], False)
        kernel = None
        if None not in patterns:
            kernel = KernelCall(kernel_spec(g, inputs, members, split, patterns, flat, windows),
                                self._kernel_args(args, patterns, inputs), outs)
        size = g.known_size()
        numpy_only = not fusible or (size is not None and size <= tuning.NUMPY_MAX_SIZE)
        plan_kernel, materialise = kernel, []
        if not numpy_only and kernel is None:
            # an input broadcast along both rows and columns: the plan broadcasts
            # it to the domain first (a compiled loop does not)
            materialise = [i for i, p in enumerate(patterns) if p is None]
            patterns = ["F" if p is None else p for p in patterns]
            wide = list(args)
            for i in materialise:
                wide[i] = self.new_name("w")
            flat = g.k == 0 and all(p in ("F", "S") for p in patterns)
            plan_kernel = KernelCall(kernel_spec(g, inputs, members, split, patterns, flat, windows),
                                     self._kernel_args(wide, patterns, inputs), outs)
        self.program.steps.append(FusedGroup(
            g, inputs, fallback_args, outs, kernel, plan_kernel, materialise, numpy_only,
            g.per_sample(), _size_expr(plan_kernel.args if plan_kernel else args, patterns, windows)))

    def _kernel_args(self, names, patterns, inputs):
        """A kernel call's argument expressions: the array's name, or for an input
        the kernel takes as a scalar ('S'), a constant's value by name or the
        array's one element."""
        args = []
        for name, p, t in zip(names, patterns, inputs):
            if p == "S" and t.op == "constant":
                scalar = self.new_name("s")
                self.program.constants[scalar] = t.value.reshape(-1)[0]
                args.append(scalar)
            elif p == "S":
                args.append(f"{name}.reshape(-1)[0]")
            else:
                args.append(name)
        return args


def _size_expr(names, patterns, windows):
    """Python expression for the number of elements a kernel loops over."""
    if None in patterns:
        return "0"
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
