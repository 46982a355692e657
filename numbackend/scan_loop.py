"""A scan's loop over time as one compiled function: no Python per step.

The body of a scan (scan.py) is compiled into a plan (compiler.py) whose steps
are fused kernels and library calls.  Where every step is a fused kernel, a
2-D matrix product of floats, a reshape or a concatenation, this module
writes the plan again as the body of one Numba function that loops over the
steps: the kernels are called through their compiled ``run_serial`` and the
products through NumPy's BLAS (jit_kernels.blas).  The function is cached on
disk like the kernels.

The first step still runs the Python plan, which checks the shapes; every later
step has the same shapes (the states keep theirs, the sequences' slices and the
invariants do not change), so the loop repeats what that step did.
"""
import numbers
import re
import warnings

import numba
import numpy as np

from jit_kernels import blas

from . import codegen

_PRODUCT = "blas.matmul"  # of float32 or float64 matrices


class Loop:
    """``run(first, steps, reverse, seqs, states, invariants, stacked)``: steps
    ``first..steps-1`` of a scan, writing the stacked per-step values into
    ``stacked`` (arrays of shape (steps,) + the step's); returns the final
    states, or None where the steps must run from Python."""

    def __init__(self, source, constants, where):
        self.source = source
        self.constants = constants
        self.where = where
        self._function = None
        self._compiles = True

    def run(self, first, steps, reverse, seqs, states, invariants, stacked):
        if not self._compiles:
            return None
        if self._function is None:
            self._function = codegen.load_kernel(self.source).loop
        arrays = [np.ascontiguousarray(a) for a in (*seqs, *states, *invariants)]
        try:
            return self._function(first, steps, reverse, *arrays, *self.constants, *stacked)
        except numba.core.errors.NumbaError as exc:
            warnings.warn(f"{self.where}: the loop over time did not compile, so it runs a "
                          f"step at a time from Python ({type(exc).__name__}: {str(exc)[:200]})",
                          stacklevel=4)
            self._compiles = False
            return None
        except ValueError:  # shapes that broadcast unlike the kernels' compiled patterns
            return None


def compile_loop(plan, n_seq, n_state, n_stacked, where):
    """The Loop of a body's plan (placeholders: sequence slices, states, invariants;
    targets: per-step outputs, then new states, the first ``n_stacked`` targets
    stacked per step), or None where a step has no compiled form."""
    if not blas.AVAILABLE:
        return None
    n_inv = len(plan.placeholders) - n_seq - n_state
    if any(p.ndim == 0 for p in plan.placeholders[:n_seq + n_state]) or any(
            plan.targets[k].ndim == 0 for k in range(n_stacked)):
        return None  # a step's scalar is a NumPy scalar in the plan, not an array
    body, kernels = [], {}
    for entry in plan.program:
        if entry[0] == "unsupported":
            return None
        if entry[0] == "kernel":
            _, spec, args, outs = entry
            module = codegen.load_kernel(codegen.generate_source(spec))
            kernel = kernels.setdefault(module.KEY, f"kernel{len(kernels)}")
            body.append(f"({''.join(o + ', ' for o in outs)}) = {kernel}({', '.join(args)})")
            continue
        _, node, ins, out = entry
        line = _library_line(node, ins, out)
        if line is None:
            return None
        body += line
    used = set(re.findall(r"\w+", "\n".join(body + plan.result_names)))
    constant_names = sorted(c for c in plan.constants if c in used)
    # the plan's names are a letter and a number: the loop's own are longer
    seq_names = [f"seq{i}" for i in range(n_seq)]
    init_names = [f"init{j}" for j in range(n_state)]
    inv_names = [f"inv{m}" for m in range(n_inv)]
    stacked_names = [f"stacked{k}" for k in range(n_stacked)]
    state_names = [f"p{n_seq + j}" for j in range(n_state)]
    results = plan.result_names
    lines = ["import numpy as np", "", "from jit_kernels import blas, njit_cached",
             "from numbackend.codegen import loaded_kernel", ""]
    lines += [f"{name} = loaded_kernel({key!r}).run_serial" for key, name in kernels.items()]
    params = ["first", "steps", "reverse"] + seq_names + init_names + inv_names
    lines += ["", "", "@njit_cached()",
              f"def loop({', '.join(params + constant_names + stacked_names)}):"]
    lines += [f"    p{n_seq + n_state + m} = {name}" for m, name in enumerate(inv_names)]
    lines += [f"    {state} = {init}" for state, init in zip(state_names, init_names)]
    lines += ["    for n in range(first, steps):",
              "        t = steps - 1 - n if reverse else n"]
    lines += [f"        p{i} = {name}[t]" for i, name in enumerate(seq_names)]
    lines += ["        " + line for line in body]
    lines += [f"        {h}[t] = {r}" for h, r in zip(stacked_names, results)]
    if n_state:
        lines.append(f"        {', '.join(state_names)}, = {', '.join(results[-n_state:])},")
    lines.append(f"    return ({''.join(s + ', ' for s in state_names)})")
    return Loop("\n".join(lines) + "\n", [plan.constants[c] for c in constant_names], where)


def _library_line(node, ins, out):
    """The loop's lines for a library step, or None where it has no compiled form."""
    if node.op == "dot":
        a, b = node.inputs
        if (a.ndim != 2 or b.ndim != 2 or node.dtype not in ("float32", "float64")
                or a.dtype != node.dtype or b.dtype != node.dtype):
            return None
        ta, tb = bool(node.attrs.get("transpose_a")), bool(node.attrs.get("transpose_b"))
        rows = f"{ins[0]}.shape[{1 if ta else 0}]"
        cols = f"{ins[1]}.shape[{0 if tb else 1}]"
        return [f"{out} = np.empty(({rows}, {cols}), dtype=np.{node.dtype})",
                f"{_PRODUCT}({ins[0]}, {ins[1]}, {out}, {ta}, {tb})"]
    if node.op == "concatenate":  # the gradient of per-gate slices
        if any(i.dtype != node.dtype or i.ndim == 0 for i in node.inputs):
            return None
        parts = "".join(i + ", " for i in ins)
        return [f"{out} = np.concatenate(({parts}), axis={int(node.attrs['axis'])})"]
    if node.op == "reshape":
        shape = node.attrs["shape"]
        if not all(isinstance(d, numbers.Integral) for d in shape):
            return None
        return [f"{out} = {ins[0]}.reshape(({''.join(f'{int(d)}, ' for d in shape)}))"]
    return None

