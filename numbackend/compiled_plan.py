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
import math
import numbers
import re
import warnings
import weakref
from collections import namedtuple

import numba
import numpy as np

from jit_kernels import blas

from . import codegen
from .ops import is_float_matrix_product

# of float32 or float64 matrices; the second with its right operand packed
# before the lines run (jit_kernels.packed: a scan's loop times both)
_PRODUCT, _PRODUCT_PACKED = "blas.matmul", "packed.matmul_packed"

# the generated module's first lines
HEADER = ["import numpy as np", "", "from jit_kernels import blas, njit_cached, packed",
          "from numbackend.codegen import loaded_kernel", ""]
# after it, in a whole call running convolutions (see _conv_lines)
CONV_HEADER = ["from jit_kernels import conv", ""]

Rendered = namedtuple("Rendered", "lines kernel_lines constant_names variables packing_lines "
                                   "hoisting_lines call_constants call_arguments")
Rendered.__doc__ = """A plan's steps as source: ``lines`` (in the plan's names: p0.. for
placeholders, v.. for values, c../s.. for constants), ``kernel_lines`` binding
the kernels the lines call (after :data:`HEADER`), the constants the lines read
(to pass as arguments), the (variable, name) pairs whose values they read, and
the lines that pack the right operands of products and those that compute
products over all steps (to run before ``lines``; see :func:`render`), and
for a whole call, {name: value} of the constants that its convolutions and
products by weights read besides (see :func:`_conv_lines` and
:func:`_weights_product_lines`), and {name: a callable giving the value} of
the arguments it takes besides, worked out anew for each call."""


def render(plan, packable=(), sliced=None, whole_call=False):
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
    and read from there.  ``whole_call``: lines for :func:`compile_call`,
    which may run convolutions (see :func:`_conv_lines`) and products by a
    variable's value in parts (:func:`_weights_product_lines`)."""
    if not blas.AVAILABLE:
        return None
    lines, kernels, variables, packings, hoistings = [], {}, [], {}, []
    call_constants, call_arguments = {}, {}
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
        if entry[0] == "conv":
            conv_lines = _conv_lines(*entry[1:], call_constants) if whole_call else None
            if conv_lines is None:
                return None
            lines += conv_lines
            continue
        _, node, ins, out = entry
        library = None
        if whole_call and node.op == "dot":
            weights = next((v for v, name in variables if name == ins[1]), None)
            library = _weights_product_lines(node, ins, out, weights, call_constants, call_arguments)
        if library is None:
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
    return Rendered(lines, kernel_lines, constant_names, variables, packing_lines, hoistings,
                    call_constants, call_arguments)


def compiles_product(node):
    """Whether a ``dot`` node has a compiled form: a product of two float32 or two
    float64 matrices, through a BLAS that jit_kernels.blas can call."""
    return blas.AVAILABLE and is_float_matrix_product(node)


def _conv_lines(node, ins, out, pool, constants):
    """The line of a 2-D convolution (pooled by 'max' where ``pool`` says so) as
    jit_kernels.conv's compiled forms run it, adding the constants it reads to
    ``constants``; None where it has none for the node's shapes and attributes
    (see jit_kernels.conv.compiled_path)."""
    from jit_kernels import conv, parts
    x, w = node.inputs
    if x.dtype != node.dtype or w.dtype != node.dtype or None in w.shape:
        return None
    attrs = node.attrs
    path, extra = conv.compiled_path(x.shape, w.shape, np.dtype(node.dtype), attrs["strides"],
                                     attrs["padding"], attrs["dilation"])
    k = len(constants)
    if path == "direct" and pool is None:
        constants[f"conv_sizes{k}"], constants[f"conv_offsets{k}"] = extra
        return [f"{out} = conv.direct_forward({ins[0]}, {ins[1]}, conv_sizes{k}, conv_offsets{k})"]
    if path != "winograd" or pool not in (None, "max") or not parts.pool_from_compiled():
        return None
    # the kernel that conv_transform is the transform of: none yet (NaN differs from all)
    constants[f"conv_kernel{k}"] = np.full(w.shape, np.nan, node.dtype)
    constants[f"conv_transform{k}"] = np.empty((36,) + w.shape[2:], node.dtype)
    constants[f"conv_part{k}"] = conv.winograd_parts[np.dtype(node.dtype).itemsize]()[0]
    mode = 1 if pool == "max" else 0  # jit_kernels.conv._POOL_MODES
    return [(f"{out} = conv.winograd_forward({ins[0]}, {ins[1]}, conv_kernel{k}, conv_transform{k}, "
             f"conv_part{k}, {mode}, {int(extra[0])})")]


def _weights_product_lines(node, ins, out, weights, constants, arguments):
    """The lines of a product by the value of the variable ``weights`` as the
    plan runs it (numbackend.compiler._ProductByWeights): with few rows, by
    its panels packed once per value and split between BLAS's threads, adding
    the part's address to ``constants`` and the panels to ``arguments``; None
    where the plan runs it through BLAS alone."""
    from jit_kernels import packed, parts

    from .compiler import PACKED_WEIGHTS_MAX_ROWS, PACKED_WEIGHTS_MIN_ITEMS, _multiplies_weights
    if (weights is None or not _multiplies_weights(node) or not compiles_product(node)
            or math.prod(weights.shape) < PACKED_WEIGHTS_MIN_ITEMS or not parts.pool_from_compiled()):
        return None
    k = len(arguments)
    arguments[f"weights_panels{k}"] = _PackedValue(weights)
    constants[f"weights_part{k}"] = packed.product_parts[np.dtype(node.dtype).itemsize]()[0]
    return [f"{out} = np.empty(({ins[0]}.shape[0], {ins[1]}.shape[1]), dtype=np.{node.dtype})",
            f"if {ins[0]}.shape[0] <= {PACKED_WEIGHTS_MAX_ROWS}:",
            f"    packed.matmul_packed_from_compiled({ins[0]}, weights_panels{k}, {out}, weights_part{k})",
            "else:",
            f"    {_PRODUCT}({ins[0]}, {ins[1]}, {out}, False, False)"]


class _PackedValue:
    """``()``: a variable's value packed by jit_kernels.packed.pack, packed again
    only where the value is another array (a variable's value is replaced,
    never written in place, as _ProductByWeights relies on too)."""

    def __init__(self, variable):
        self.variable = variable
        self.packing = None  # (weak reference to the value packed, its panels)

    def __call__(self):
        value, packing = self.variable.value, self.packing
        if packing is None or packing[0]() is not value:
            from jit_kernels import packed
            packing = self.packing = (weakref.ref(value), packed.pack(value, False))
        return packing[1]


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

    def __init__(self, source, constants, variables, arguments=(), lock=None):
        self.source = source
        self.constants = constants
        self.variables = variables
        self.arguments = arguments  # callables giving the last arguments, on each call
        self.lock = lock  # held while the call runs, where it runs parts on BLAS's threads
        self._function = None
        self._compiles = True

    def run(self, *arrays):
        if not self._compiles:
            return None
        try:
            if self._function is None:
                self._function = codegen.load_kernel(self.source).call
            values = [v.value for v in self.variables]
            for argument in self.arguments:
                values.append(argument())
            if self.lock is None:
                return self._function(*arrays, *values, *self.constants)
            with self.lock:
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
    rendered = render(plan, whole_call=True)
    if rendered is None or any(p.ndim == 0 for p in plan.placeholders) or any(
            t.ndim == 0 for t in plan.targets):
        return None  # a scalar is a NumPy scalar in the plan, not an array
    variable_names = [name for _, name in rendered.variables]
    params = [f"p{i}" for i in range(len(plan.placeholders))] + variable_names
    results = [name if new else f"{name}.copy()"  # the caller owns what it gets
               for name, new in zip(plan.result_names, plan.result_fresh)]
    constants, arguments = rendered.call_constants, rendered.call_arguments
    params += list(arguments) + rendered.constant_names + list(constants)
    runs_convs = any(c.startswith("conv_") for c in constants)
    lines = HEADER + (CONV_HEADER if runs_convs else []) + rendered.kernel_lines
    lines += ["", "", "@njit_cached(nogil=True)", f"def call({', '.join(params)}):"]
    lines += ["    " + line for line in rendered.lines]
    lines.append(f"    return ({''.join(r + ', ' for r in results)})")
    # parts on BLAS's threads (jit_kernels.parts.run_compiled) run under its lock
    runs_parts = any(c.startswith(("conv_part", "weights_part")) for c in constants)
    return Call("\n".join(lines) + "\n", [plan.constants[c] for c in rendered.constant_names]
                + list(constants.values()), [v for v, _ in rendered.variables], list(arguments.values()),
                blas._parts_lock if runs_parts else None)
