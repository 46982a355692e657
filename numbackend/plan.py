"""The Python plan: a program (program.py) run as a short generated Python
function that calls its steps in order, so a call costs one Python frame plus
one call per step.  Fused groups call their generated kernels (codegen.py),
library steps their lowering's callable (lowering.py).
"""
import weakref

import numpy as np

from jit_kernels import tuning

from . import codegen, program
from .evaluator import node_function
from .scan_loop import compile_loop


class Step:
    """One line of :meth:`Plan.explain`: how the step runs, a label, the graph
    nodes it computes, its outputs, the kernel module it calls if any."""

    def __init__(self, kind, label, nodes, outputs, kernel=None):
        self.kind = kind
        self.label = label
        self.nodes = nodes
        self.outputs = outputs
        self.kernel = kernel


class Plan:
    """A compiled function body: ``run(*placeholder_arrays) -> tuple of target
    values``, from the program of ``targets`` (see program.build)."""

    def __init__(self, placeholders, targets, written=frozenset(), scan_body=False):
        self.program = program.build(placeholders, targets, written)
        self.scan_body = scan_body  # its kernels' modules have step blocks (codegen.kernel_source)
        self.placeholders = self.program.placeholders
        self.targets = self.program.targets
        self.constants = self.program.constants
        self.result_names = self.program.result_names
        self.result_fresh = self.program.result_fresh
        self.steps = []
        self.kernels = []
        self._write()
        codegen.hold(self.kernels, self)

    def _write(self):
        ns = {"np": np, "_bshape": _broadcast_runtime, **self.program.constants}
        lines = []
        counter = [0]

        def bind(prefix, value):
            counter[0] += 1
            name = f"_{prefix}{counter[0]}"
            ns[name] = value
            return name

        for step in self.program.steps:
            if isinstance(step, program.ReadVariable):
                lines.append(f"{step.out} = {bind('V', step.variable)}.value")
            elif isinstance(step, program.FusedGroup):
                lines += self._group(step, bind)
            elif isinstance(step, program.LibraryWithEpilogue):
                lines += self._with_epilogue(step, bind)
            else:
                call = bind("L", step.lowering.plan_callable(step.node, BODIES, self.program.written))
                lines.append(f"{step.out} = {call}({', '.join(step.ins)})")
                self.steps.append(Step("library", step.node.op, [step.node], [step.node]))
        outs = [name if new else f"np.array({name})"
                for name, new in zip(self.result_names, self.result_fresh)]
        args = [f"p{i}" for i in range(len(self.placeholders))]
        source = [f"def plan({', '.join(args)}):"]
        source += ["    " + line for line in lines]
        source.append("    return (" + "".join(o + ", " for o in outs) + ")")
        self.source = "\n".join(source) + "\n"
        exec(compile(self.source, "<numbackend plan>", "exec"), ns)  # noqa: S102 - our own source
        self.run = ns["plan"]

    def _group(self, step, bind):
        g = step.group
        targets = "(" + "".join(n + ", " for n in step.outs) + ")"
        fallback = bind("G", numpy_group(g, step.inputs))
        numpy_call = f"{targets} = {fallback}({', '.join(step.fallback_args)})"
        if step.numpy_only:
            self.steps.append(Step("numpy", "numpy", list(g.members), list(g.outputs)))
            return [numpy_call]
        kernel = step.plan_kernel
        module = codegen.load_kernel(codegen.kernel_source(kernel.spec, self.scan_body))
        self.kernels.append(module)
        lines = []
        if step.materialise:
            shape = bind("d", None)
            lines.append(f"{shape} = _bshape({', '.join(step.fallback_args)})")
            for i in step.materialise:
                lines.append(f"{kernel.args[i]} = np.ascontiguousarray("
                             f"np.broadcast_to({step.fallback_args[i]}, {shape}))")
        block = ["try:",
                 f"    {targets} = {bind('K', module)}.run({', '.join(kernel.args)})",
                 "except ValueError:  # run-time shapes broadcast unlike the static ones",
                 "    " + numpy_call]
        kind = "kernel"
        if step.per_sample:
            kind = "numpy|kernel"
            block = [f"if {step.size_expr} <= {tuning.NUMPY_MAX_SAMPLES}:",
                     "    " + numpy_call, "else:"] + ["    " + line for line in block]
        self.steps.append(Step(kind, f"fused[{module.KEY[:8]}]", list(g.members),
                               list(g.outputs), module))
        return lines + block

    def _with_epilogue(self, step, bind):
        module = codegen.load_kernel(codegen.generate_source(step.rows_spec, into=True))
        self.kernels.append(module)
        call = bind("L", step.lowering.plan_callable_with_epilogue(
            step, module, numpy_group(step.group, step.inputs), self.program.written))
        node = step.node.op
        label = (f"{node}+pool+fused[{module.KEY[:8]}]" if step.pool_first else
                 f"{node}+fused[{module.KEY[:8]}]" + ("" if step.pool is None else "+pool"))
        self.steps.append(Step("library", label, step.members, [step.result], module))
        return [f"{step.out} = {call}({', '.join(step.ins + step.others)})"]

    def explain(self):
        """One line per step: the kernel, the graph ops it runs, its outputs' shapes."""
        from .graph import format_shape
        out = []
        for i, step in enumerate(self.steps):
            ops = " -> ".join(n.op for n in step.nodes)
            shapes = ", ".join(f"{format_shape(o.shape)} {o.dtype}" for o in step.outputs)
            out.append(f"{i:3d}  {step.kind:8s} {step.label:18s} {ops}  out={shapes}")
            if step.nodes[0].op == "scan":
                out += [f"     (its steps after the first: the loop over time {state})"
                        for state in BODIES.loop_states(step.nodes[0].attrs["body"])]
        return "\n".join(out)


class Bodies:
    """The plans and compiled loops of scan bodies (lowering.Scan), built on
    first use and kept while the body lives: every function running one scan
    shares them."""

    def __init__(self):
        self._plans = weakref.WeakKeyDictionary()
        self._loops = weakref.WeakKeyDictionary()

    def plan(self, body):
        plan = self._plans.get(body)
        if plan is None:
            plan = self._plans[body] = Plan(
                body.seq_inputs + body.state_inputs + body.invariant_inputs,
                body.outputs + body.new_states, scan_body=True)
        return plan

    def loop(self, body, n_stacked):
        """The body's loop over time as one compiled function (scan_loop.py), or
        None where its program has a step without a compiled form."""
        loops = self._loops.setdefault(body, {})
        if n_stacked not in loops:
            loops[n_stacked] = compile_loop(self.plan(body).program, len(body.seq_inputs),
                                            len(body.state_inputs), n_stacked, body.where)
        return loops[n_stacked]


    def loop_states(self, body):
        """Each of the body's loops (one per number of stacked outputs) in words
        (scan_loop.Loop.state); none before its scan is due to run one."""
        return [("has no compiled form" if loop is None else loop.state())
                for loop in self._loops.get(body, {}).values()]


BODIES = Bodies()


def numpy_group(g, inputs):
    """A callable evaluating a group node by node with NumPy; returns its outputs."""
    steps = [(m.id, [i.id for i in m.inputs], node_function(m)) for m in g.members]

    def run(*arrays):
        values = {t.id: a for t, a in zip(inputs, arrays)}
        for member, reads, compute in steps:
            values[member] = compute(*[values[i] for i in reads])
        return tuple(values[o.id] for o in g.outputs)
    return run


def _broadcast_runtime(*arrays):
    return np.broadcast_shapes(*[np.shape(a) for a in arrays])
