"""A plan (compiler.py) written again as the body of one Numba function.

A plan runs its steps from Python: each kernel call, product and check costs a
few microseconds of interpreter, which is most of a small model's time at batch
1.  Where every step has a compiled form (a fused kernel, called through its
compiled ``run_serial``; a 2-D product of floats, through NumPy's BLAS
(jit_kernels.blas); a reshape; a concatenation), the same steps can run inside
one compiled function: :func:`render` writes them as its lines.  The scan's
loop over time (scan_loop.py) is one such function; :func:`compile_call` makes
another, the whole plan as one call.  Both are cached on disk like the kernels.

The kernels run serially there (``run_serial``): the whole-plan call is for
small inputs, where a parallel region would cost more than it saves.
"""
import numbers
import re
import warnings
from collections import namedtuple

import numba

from jit_kernels import blas

from . import codegen
from .ops import is_float_matrix_product

# of float32 or float64 matrices; the second with its right operand packed
# before the lines run (jit_kernels.packed: a scan's loop times both)
_PRODUCT, _PRODUCT_PACKED = "blas.matmul", "packed.matmul_packed"

# the generated module's first lines
HEADER = ["import numpy as np", "", "from jit_kernels import blas, njit_cached, packed",
          "from numbackend.codegen import loaded_kernel", ""]

Rendered = namedtuple("Rendered", "lines kernel_lines constant_names variables packing_lines "
                                   "hoisting_lines")
Rendered.__doc__ = """A plan's steps as source: ``lines`` (in the plan's names: p0.. for
placeholders, v.. for values, c../s.. for constants), ``kernel_lines`` binding
the kernels the lines call (after :data:`HEADER`), the constants the lines read
(to pass as arguments), the (variable, name) pairs whose values they read, and
the lines that pack the right operands of products and those that compute
products over all steps (to run before ``lines``; see :func:`render`)."""


def render(plan, packable=(), sliced=None):
    """The plan's steps as a :class:`Rendered`, or None where a step has no
    compiled form (or NumPy's BLAS is not one jit_kernels.blas can call).
    ``packable``: the names of placeholders that keep their values while the
    lines run again and again; each product by one of them (not transposing its
    left operand) runs as :data:`_PRODUCT_PACKED`, its right operand packed by
    the packing lines, where a variable ``packed_products`` of the lines'
    function is true.  ``sliced``: {placeholder name: the name of the array
    whose rows ``lo:hi`` of step ``t`` it is}, for a scan's loop; a product of
    one of them by a packable placeholder is computed for steps ``first`` to
    ``stop`` at once by the hoisting lines where ``hoisted_products`` is true,
    and read from there."""
    if not blas.AVAILABLE:
        return None
    lines, kernels, variables, packings, hoistings = [], {}, [], {}, []
    for entry in plan.program:
        if entry[0] == "unsupported":
            return None
        if entry[0] == "variable":
            variables.append(entry[1:])
            continue
        if entry[0] == "kernel":
            _, spec, args, outs = entry
            module = codegen.load_kernel(codegen.generate_source(spec))
            kernel = kernels.setdefault(module.KEY, f"kernel{len(kernels)}")
            lines.append(f"({''.join(o + ', ' for o in outs)}) = {kernel}({', '.join(args)})")
            continue
        _, node, ins, out = entry
        library = _library_lines(node, ins, out, packable, packings, sliced or {}, hoistings)
        if library is None:
            return None
        lines += library
    used = set(re.findall(r"\w+", "\n".join(lines + plan.result_names)))
    constant_names = sorted(c for c in plan.constants if c in used)
    kernel_lines = [f"{name} = loaded_kernel({key!r}).run_serial" for key, name in kernels.items()]
    packing_lines = [f"{name} = (packed.pack({b}, {tb}) if packed_products else "
                     f"np.empty((0, 0, 0), dtype={b}.dtype))"
                     for (b, tb), name in packings.items()]
    return Rendered(lines, kernel_lines, constant_names, variables, packing_lines, hoistings)


def compiles_product(node):
    """Whether a ``dot`` node has a compiled form: a product of two float32 or two
    float64 matrices, through a BLAS that jit_kernels.blas can call."""
    return blas.AVAILABLE and is_float_matrix_product(node)


def _library_lines(node, ins, out, packable=(), packings=None, sliced=None, hoistings=None):
    """The lines of a library step, or None where it has no compiled form.  A
    product by a ``packable`` placeholder adds the name of its packed form to
    ``packings``, under (placeholder, whether transposed); one of a ``sliced``
    placeholder by it adds the lines that compute it over all steps to
    ``hoistings``."""
    if node.op == "dot":
        if not compiles_product(node):
            return None
        ta, tb = bool(node.attrs.get("transpose_a")), bool(node.attrs.get("transpose_b"))
        rows = f"{ins[0]}.shape[{1 if ta else 0}]"
        cols = f"{ins[1]}.shape[{0 if tb else 1}]"
        operands = f"({ins[0]}, {ins[1]}, {out}, {ta}, {tb})"
        lines = [f"{out} = np.empty(({rows}, {cols}), dtype=np.{node.dtype})"]
        if ta or ins[1] not in packable:
            return lines + [_PRODUCT + operands]
        panels = packings.setdefault((ins[1], tb), f"packed{len(packings)}")
        lines += ["if packed_products:", f"    {_PRODUCT_PACKED}({ins[0]}, {panels}, {out})",
                  "else:", f"    {_PRODUCT}{operands}"]
        if ins[0] not in sliced:
            return lines
        whole, steps = sliced[ins[0]], f"hoisted{len(hoistings)}"
        depth = f"{whole}.shape[2]"
        allocate = (f"{steps} = np.empty(((last - earliest) if hoisted_products else 0, "
                    f"min(hi, {whole}.shape[1]) - lo, {cols}), dtype=np.{node.dtype})")
        multiply = (f"    {_PRODUCT}(np.ascontiguousarray({whole}[earliest:last, lo:hi]).reshape("
                    f"-1, {depth}), {ins[1]}, {steps}.reshape(-1, {cols}), False, {tb})")
        hoistings += [allocate, "if hoisted_products:", multiply]
        return ["if hoisted_products:", f"    {out} = {steps}[t - earliest]", "else:"] + [
            "    " + line for line in lines]
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


class Call:
    """``run(*placeholder_arrays)``: the plan's results from one compiled call, or
    None where the plan must run from Python (run-time shapes that broadcast
    unlike a kernel's compiled pattern, or that a product refuses: the plan's
    own steps then say what is wrong)."""

    def __init__(self, source, constants, variables):
        self.source = source
        self.constants = constants
        self.variables = variables
        self._function = None
        self._compiles = True

    def run(self, *arrays):
        if not self._compiles:
            return None
        try:
            if self._function is None:
                self._function = codegen.load_kernel(self.source).call
            values = [v.value for v in self.variables]
            return self._function(*arrays, *values, *self.constants)
        except numba.core.errors.NumbaError as exc:
            warnings.warn("function: the plan did not compile as one call, so it runs from "
                          f"Python ({type(exc).__name__}: {str(exc)[:200]})", stacklevel=3)
            self._compiles = False
            return None
        except ValueError:
            return None


def compile_call(plan):
    """The plan as one :class:`Call`, or None where a step has no compiled form."""
    rendered = render(plan)
    if rendered is None or any(p.ndim == 0 for p in plan.placeholders) or any(
            t.ndim == 0 for t in plan.targets):
        return None  # a scalar is a NumPy scalar in the plan, not an array
    variable_names = [name for _, name in rendered.variables]
    params = [f"p{i}" for i in range(len(plan.placeholders))] + variable_names
    results = [name if new else f"{name}.copy()"  # the caller owns what it gets
               for name, new in zip(plan.result_names, plan.result_fresh)]
    lines = HEADER + rendered.kernel_lines
    lines += ["", "", "@njit_cached(nogil=True)",
              f"def call({', '.join(params + rendered.constant_names)}):"]
    lines += ["    " + line for line in rendered.lines]
    lines.append(f"    return ({''.join(r + ', ' for r in results)})")
    return Call("\n".join(lines) + "\n", [plan.constants[c] for c in rendered.constant_names],
                [v for v, _ in rendered.variables])
