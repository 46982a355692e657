"""A scan's loop over time as one compiled function: no Python per step.

The body of a scan (ops/scan.py) is built into a program (program.py) whose steps
are fused kernels and library calls.  Where every step has a compiled form
(compiled_plan.py), this module writes the program as the body of one Numba
function that loops over the steps, cached on disk like the kernels: a whole
call and an export compile it as part of theirs.  A call from Python runs the
steps as blocks of the library's precompiled loop instead, where every step
has one (scan_blocks.py, tuning.SCAN_LOOP_FORM): the same bits, and no loop
to compile.

The first step still runs the Python plan, which checks the shapes; every later
step has the same shapes (the states keep theirs, the sequences' slices and the
invariants do not change), so the loop repeats what that step did.

Where the step treats the rows of its states and sequence slices (axis 0: an
RNN's batch) each on its own, the rows are split between threads, each running
the whole loop over its rows with single-threaded products: the threads never
wait for each other, while a product shared between threads would synchronise
them at every step, and a batch's small product gains little from a second
thread (jit_kernels/blas.py).  Where the rows are too few for every thread (a
batch of 32 on 16 threads), the threads share each step instead, waiting for
each other twice a step (scan_blocks.py): a few rows a part leave most of the
micro-kernel's tile unused, so that the parts did more work in all than one
thread (tuning.SCAN_SHARE_MIN_WORK).
"""
import functools
import warnings

import numpy as np

from . import codegen, compiled_plan, program, scan_blocks, tiers, tuning
from .graph import toposort
from .ops import OPS

# The rows lo:hi of an unsplit loop: all of them.
_ALL_ROWS = np.iinfo(np.int64).max


class Loop:
    """``run(first, steps, reverse, seqs, states, invariants, stacked)``: steps
    ``first..steps-1`` of a scan, writing the stacked per-step values into
    ``stacked`` (arrays of shape (steps,) + the step's); returns the final
    states, or None where the steps must run from Python."""

    def __init__(self, source, kernel_modules, constants, where, row_aligned, packed_invariants,
                 product_columns, blocks=None):
        self.source = source
        # the steps as library blocks (scan_blocks.py), run rather than the
        # source's function where tuning.SCAN_LOOP_FORM says; None where a step has none
        self.blocks = blocks
        self.kernel_modules = kernel_modules  # those the source looks up by key
        codegen.hold(kernel_modules, self)
        self.constants = constants
        self.where = where
        # per invariant, whether it may line up with the rows (then its first axis
        # says: the rows' length, or 1 to be shared); None where a step mixes rows
        self.row_aligned = row_aligned
        # the invariants that the step multiplies by, packed once per loop
        self.packed_invariants = packed_invariants
        self.has_packable = bool(packed_invariants)
        self.product_columns = product_columns  # of all the step's products, per row
        self._function = None
        self._compiles = True
        self._job = tiers.Later(f"{where}: the loop over time",
                                f"{where}: the loop over time did not compile, so it runs a "
                                "step at a time from Python")

    def run(self, first, steps, reverse, seqs, states, invariants, stacked):
        """Steps first..steps-1 (see the class); None where they must run from
        Python: the loop does not compile, or its compile (started by the first
        call, in the background unless tuning.TIER_COMPILE says otherwise) is
        not done yet."""
        if not self._compiles:
            return None
        if self._function is None and not self._compiled(first, steps, reverse, seqs, states,
                                                         invariants, stacked):
            return None
        try:
            bounds, shared = self._split(steps - first, seqs, states, invariants)
            if bounds is not None:
                return self._run_split(bounds, first, steps, reverse, seqs, states, invariants,
                                       stacked)
            seqs, states, invariants = ([np.ascontiguousarray(a) for a in arrays]
                                        for arrays in (seqs, states, invariants))
            if shared > 1:
                # the products of a sequence's steps before the loop, on all of
                # BLAS's threads, as on one thread: the same bits
                return self._function(first, steps, steps, reverse, 0, _ALL_ROWS, True, True,
                                      *seqs, *states, *invariants, *self.constants, *stacked,
                                      shared=shared)
            return self._run_rows(first, steps, reverse, 0, _ALL_ROWS, seqs, states, invariants,
                                  stacked, 1)
        except codegen.numba_error() as exc:
            warnings.warn(f"{self.where}: the loop over time did not compile, so it runs a "
                          f"step at a time from Python ({type(exc).__name__}: {str(exc)[:200]})",
                          stacklevel=4)
            self._compiles = False
            return None
        except ValueError:  # shapes that broadcast unlike the kernels' compiled patterns
            return None

    def state(self):
        """The loop's tier in words: compiling, compiled, or why it did not compile."""
        if self._job.failure is not None or not self._compiles:
            return f"did not compile: {self._job.failure}"
        if self._function is not None or (self._job.started and not self._job.compiling):
            return "compiled"
        return "not compiled yet" if not self._job.started else "compiling in the background"

    def _compiled(self, first, steps, reverse, seqs, states, invariants, stacked):
        """Whether the loop's function is compiled: its compile is started where it
        is not, for the types of these arguments, and waited for only inside
        tiers.warming_up (or where it runs in this thread)."""
        def work():  # for the arguments of an unsplit run (a split one passes the same types)
            arrays = [np.ascontiguousarray(a) for a in (*seqs, *states, *invariants)]
            types = compiled_plan.argument_types(
                (first, steps, steps, reverse, 0, _ALL_ROWS, False, False, *arrays,
                 *self.constants, *stacked))
            return functools.partial(self._compile, types)

        if not self._job.ready(work):
            if self._job.failure is not None:
                self._compiles = False
            return False
        self._function = self._job.result
        return True

    def module(self):
        """The module of the loop's source (codegen.load_kernel), held while the
        loop lives; its function ``loop``."""
        module = codegen.load_kernel(self.source)
        codegen.hold([module], self)
        return module

    def _compile(self, argument_types):
        """The loop's function, compiled for ``argument_types`` (not run): its
        blocks' runner where it runs as blocks."""
        if self.blocks is not None and tuning.SCAN_LOOP_FORM == "blocks":
            codegen.hold(self.blocks.compile(), self)
            return self.blocks
        function = self.module().loop
        function.compile(argument_types)
        return function

    def _run_rows(self, first, steps, reverse, lo, hi, seqs, states, invariants, stacked, parts,
                  prepare=False):
        """Steps first..steps-1 over rows lo:hi (of states and invariants already
        cut to them), one of ``parts`` run at once; the final states (where
        ``prepare``, blocks' function returning them: scan_blocks.StepBlocks.prepare)."""
        rows = states[0].shape[0] if states else min(hi, seqs[0].shape[1]) - lo
        hoisted = parts == 1 or rows < tuning.SCAN_IN_LOOP_MIN_ROWS
        packed = self.has_packable and rows >= tuning.SCAN_PACKED_MIN_ROWS and self._runs_packed(
            rows, invariants, parts)
        function = self._function.prepare if prepare else self._function
        return function(first, steps, steps, reverse, lo, hi, packed, hoisted, *seqs, *states,
                        *invariants, *self.constants, *stacked)

    def _runs_packed(self, rows, invariants, parts):
        """Whether the step's products run on packed weights (jit_kernels.packed.runs_packed)
        rather than through BLAS, for ``rows`` rows of one of ``parts`` parts; alone where
        the parts take all of BLAS's threads."""
        from jit_kernels import blas, packed
        itemsize = max(invariants[m].itemsize for m in self.packed_invariants)
        return packed.runs_packed(rows, itemsize, parts >= max(1, blas.threads()))

    def _split(self, steps, seqs, states, invariants):
        """How the loop's rows go between BLAS's threads: (bounds, shared), the
        first row of each part then the number of rows, or None; and how many
        threads share each step (scan_blocks.StepBlocks.prepare), or 1.

        Where the step keeps its rows apart and the loop's work is large enough
        (tuning.SCAN_SPLIT_MIN_ELEMENTS), each thread runs the whole loop over
        its part of the rows, tuning.SCAN_SPLIT_MIN_ROWS_PER_THREAD rows at
        least, and never waits for another.  Where that leaves threads idle (few
        rows, many threads), the threads share each step instead where more of
        them can, tuning.SCAN_SHARE_MIN_THREADS at least: its products split by
        their panels, each thread getting tuning.SCAN_SHARE_MIN_WORK
        multiply-adds at least, its kernels by the rows, the threads waiting for
        each other between."""
        if self.row_aligned is None:
            return None, 1
        rows = (states[0] if states else seqs[0][0]).shape[0]
        from jit_kernels import blas
        threads = blas.threads()
        parts = min(threads, rows // tuning.SCAN_SPLIT_MIN_ROWS_PER_THREAD)
        elements = (sum(s.size for s in seqs) + steps * sum(s.size for s in states)
                    + steps * rows * self.product_columns)
        if (threads < 2 or elements < tuning.SCAN_SPLIT_MIN_ELEMENTS
                or not self._rows_match(rows, seqs, states, invariants)):
            return None, 1
        if parts < threads:
            shared = self._shared_threads(rows, threads, invariants)
            if shared > max(1, parts):
                return None, shared
        if parts < 2:
            return None, 1
        return [rows * i // parts for i in range(parts + 1)], 1

    def _shared_threads(self, rows, threads, invariants):
        """How many of ``threads`` can share the steps over ``rows`` rows (see
        _split), or 1."""
        if (not isinstance(self._function, scan_blocks.StepBlocks) or not self._function.can_share
                or not self.has_packable or rows < tuning.SCAN_PACKED_MIN_ROWS):
            return 1
        # each thread gets a part of the panels of every product in the steps
        panels, work_per_row = self._function.step_products(invariants)
        count = min(threads, rows, panels, rows * work_per_row // tuning.SCAN_SHARE_MIN_WORK)
        if count < max(2, tuning.SCAN_SHARE_MIN_THREADS) or not self._runs_packed(
                rows, invariants, count):
            return 1
        return count

    def _rows_match(self, rows, seqs, states, invariants):
        return (all(s.shape[1] == rows for s in seqs) and all(s.shape[0] == rows for s in states)
                and all(v.shape[0] in (1, rows)
                        for lined_up, v in zip(self.row_aligned, invariants) if lined_up))

    def _run_split(self, bounds, first, steps, reverse, seqs, states, invariants, stacked):
        """The loop run by one thread per part of the rows; the final states."""
        rows = bounds[-1]
        split = [lined_up and v.shape[0] == rows for lined_up, v in zip(self.row_aligned, invariants)]
        # Each part reads its rows of the sequences and writes its rows of the
        # stacked values in place: copying them out first made the W5 LSTM slower.
        # Rows cut from axis 0 of a contiguous array are contiguous: no copy.
        seqs = [np.ascontiguousarray(s) for s in seqs]
        states = [np.ascontiguousarray(s) for s in states]
        invariants = [np.ascontiguousarray(v) for v in invariants]

        def run_part(i, prepare=False):
            lo, hi = bounds[i], bounds[i + 1]
            return self._run_rows(first, steps, reverse, lo, hi, seqs, [s[lo:hi] for s in states],
                                  [v[lo:hi] if c else v for c, v in zip(split, invariants)],
                                  stacked, len(bounds) - 1, prepare)

        from jit_kernels.parts import run_parts  # not at import: it compiles its timing part
        if isinstance(self._function, scan_blocks.StepBlocks):
            runs = [run_part(i, prepare=True) for i in range(len(bounds) - 1)]
            if None in runs:
                return None
            parts = run_parts(len(runs), lambda i: runs[i]())
        else:
            parts = run_parts(len(bounds) - 1, run_part)
        return tuple(np.concatenate(finals) for finals in zip(*parts))


def compile_loop(plan, n_seq, n_state, n_stacked, where):
    """The Loop of a body's program ``plan`` (placeholders: sequence slices,
    states, invariants; targets: per-step outputs, then new states, the first
    ``n_stacked`` targets stacked per step), or None where a step has no
    compiled form."""
    n_inv = len(plan.placeholders) - n_seq - n_state
    if any(p.ndim == 0 for p in plan.placeholders[:n_seq + n_state]) or any(
            plan.targets[k].ndim == 0 for k in range(n_stacked)):
        return None  # a step's scalar is a NumPy scalar in the plan, not an array
    inv_names = [f"inv{m}" for m in range(n_inv)]
    seq_names = [f"seq{i}" for i in range(n_seq)]
    sliced = {f"p{i}": name for i, name in enumerate(seq_names)
              if plan.placeholders[i].ndim == 2}
    rendered = compiled_plan.render(plan, packable={f"p{n_seq + n_state + m}" for m in range(n_inv)},
                                    sliced=sliced, scan_body=True)
    if rendered is None or rendered.variables:  # a body reads its invariants as inputs
        return None
    body, constant_names = rendered.lines, rendered.constant_names
    # the plan's names are a letter and a number: the loop's own are longer
    init_names = [f"init{j}" for j in range(n_state)]
    stacked_names = [f"stacked{k}" for k in range(n_stacked)]
    state_names = [f"p{n_seq + j}" for j in range(n_state)]
    results = plan.result_names
    lines = compiled_plan.HEADER + rendered.kernel_lines
    # steps first..stop-1 of steps (reverse: counting from the last)
    params = (["first", "stop", "steps", "reverse", "lo", "hi", "packed_products",
               "hoisted_products"]
              + seq_names + init_names + inv_names)
    # called once for all the steps, with every array of the body: its entry
    # from Python, which unboxes them, is left unoptimised (see njit_cached)
    lines += ["", "", "@njit_cached(nogil=True, optimised_entry=False)",
              f"def loop({', '.join(params + constant_names + stacked_names)}):"]
    lines += [f"    p{n_seq + n_state + m} = {name}" for m, name in enumerate(inv_names)]
    lines += [f"    {state} = {init}" for state, init in zip(state_names, init_names)]
    lines += ["    " + line for line in rendered.packing_lines]
    # the steps first..stop-1 read these of the sequences
    lines += ["    earliest = steps - stop if reverse else first",
              "    last = steps - first if reverse else stop"]
    lines += ["    " + line for line in rendered.hoistings]
    lines += ["    for n in range(first, stop):",
              "        t = steps - 1 - n if reverse else n"]
    # Slicing and copying through library calls (by address): Numba's code for a
    # slice and for a slice assignment (whose error path formats strings), at
    # each sequence and stacked value, was much of a large loop's compile.
    lines += [f"        p{i} = copying.step_rows({name}, t, lo, hi)" for i, name in enumerate(seq_names)]
    lines += ["        " + line for line in body]
    lines += [f"        copying.copy_step({h}, t, lo, hi, {r})" for h, r in zip(stacked_names, results)]
    if n_state:
        lines.append(f"        {', '.join(state_names)}, = {', '.join(results[-n_state:])},")
    lines.append(f"    return ({''.join(s + ', ' for s in state_names)})")
    blocks = scan_blocks.plan_blocks(plan, n_seq, n_state, n_stacked,
                                     {name for name, _ in rendered.packings})
    if blocks is not None:
        blocks.constant_names = constant_names
    return Loop("\n".join(lines) + "\n", rendered.kernel_modules,
                [plan.constants[c] for c in constant_names], where,
                _row_aligned(plan, n_seq, n_state),
                sorted({int(name[1:]) - n_seq - n_state for name, _ in rendered.packings}),
                sum(step.node.shape[-1] or 0 for step in plan.steps
                    if isinstance(step, program.LibraryCall) and step.lowering.is_product),
                blocks)


def _row_aligned(plan, n_seq, n_state):
    """Per invariant, whether it lines up with the rows (axis 0) of the states and
    sequence slices (an element-wise operand of their full rank: a dropout mask)
    rather than being shared by all rows (a weight) — where every step keeps the
    rows apart: element-wise work, reductions and slices along the other axes,
    products with a shared right operand.  None where a step mixes rows."""
    rows = {p.id for p in plan.placeholders[:n_seq + n_state]}  # values with the rows
    invariants = plan.placeholders[n_seq + n_state:]
    leaves = {p.id for p in invariants}
    aligned, shared = set(), set()
    for node in toposort(plan.targets):
        if node.id in rows or node.id in leaves or node.op == "constant":
            continue
        ins = [i for i in node.inputs if i.id in rows]
        others = [i for i in node.inputs if i.id not in rows]
        kind = OPS[node.op].kind
        if not ins:
            return None
        if kind == "elementwise":
            if any(i.ndim != node.ndim for i in ins):
                return None
            for i in others:
                if i.ndim < node.ndim:  # broadcast along the rows
                    shared.add(i.id)
                elif i.id in leaves:
                    aligned.add(i.id)
                elif i.shape[0] != 1:
                    return None  # a constant with rows of its own
        elif kind == "reduce":
            if any(a % ins[0].ndim == 0 for a in node.attrs["axis"]):
                return None
        elif node.op == "dot":
            if others != [node.inputs[1]] or node.attrs.get("transpose_a") or node.ndim != 2:
                return None
            shared.add(node.inputs[1].id)
        elif others or not _keeps_rows(node):
            return None
        rows.add(node.id)
    if any(t.id not in rows for t in plan.targets) or aligned & shared:
        return None
    return [p.id in aligned and p.shape[0] != 1 for p in invariants]


def _keeps_rows(node):
    """Does a slice, reshape or concatenation leave axis 0 as it is?"""
    if node.op == "getitem":
        key = node.attrs["key"]
        if not key or key[0] == slice(None):
            return True
        indexed = [k for k in key[1:] if k is not None and k is not Ellipsis]
        return key[0] is Ellipsis and len(indexed) < node.inputs[0].ndim
    if node.op == "reshape":
        shape, (x,) = node.attrs["shape"], node.inputs
        return (len(shape) >= 1 and shape[0] == -1 and None not in x.shape[1:]
                and int(np.prod(x.shape[1:])) == int(np.prod(shape[1:])))
    if node.op == "concatenate":
        return node.attrs["axis"] % node.ndim != 0
    return False
