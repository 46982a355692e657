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

from . import codegen, graph
from .ops import is_float_matrix_product

# of float32 or float64 matrices; the second with its right operand packed
# before the lines run (jit_kernels.packed; a scan loop picks one by the rows)
_PRODUCT, _PRODUCT_PACKED = "blas.matmul", "packed.matmul_packed"

# the generated module's first lines
HEADER = ["import numpy as np", "", "from jit_kernels import blas, njit_cached, packed, parts",
          "from numbackend.codegen import loaded_kernel", ""]
# after it, in a whole call running convolutions (see _conv_lines)
CONV_HEADER = ["from jit_kernels import conv", ""]

Rendered = namedtuple("Rendered", "lines kernel_lines kernel_modules constant_names variables "
                                   "packing_lines hoisting_lines call_constants call_arguments")
Rendered.__doc__ = """A plan's steps as source: ``lines`` (in the plan's names: p0.. for
placeholders, v.. for values, c../s.. for constants), ``kernel_lines`` binding
the kernels the lines call (after :data:`HEADER`) and ``kernel_modules``,
their modules, which whatever runs the lines holds (see codegen.hold: the
lines look them up by key, and codegen's bound on loaded modules may have
dropped them), the constants the lines read
(to pass as arguments), the (variable, name) pairs whose values they read, and
the lines that pack the right operands of products and those that compute
products over all steps (to run before ``lines``; see :func:`render`), and
for a whole call, {name: value} of the constants that its convolutions and
products by weights read besides (see :func:`_conv_lines` and
:func:`_weights_product_lines`), and {name: (variable, function)} of the
arguments it takes besides, each the function of the variable's value,
worked out again where the value is another array."""


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
    lines, kernels, modules, variables, packings, hoistings = [], {}, {}, [], {}, []
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
            modules[module.KEY] = module
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
    return Rendered(lines, kernel_lines, list(modules.values()), constant_names, variables,
                    packing_lines, hoistings, call_constants, call_arguments)


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
    path = conv.compiled_path(x.shape, w.shape, np.dtype(node.dtype), attrs["strides"],
                              attrs["padding"], attrs["dilation"])
    if path is None:
        return None
    k = len(constants)
    if path.algorithm == "direct" and pool is None:
        constants[f"conv_sizes{k}"], constants[f"conv_offsets{k}"] = path.compiled.sizes, path.compiled.offsets
        return [f"{out} = conv.direct_forward({ins[0]}, {ins[1]}, conv_sizes{k}, conv_offsets{k})"]
    if path.algorithm != "winograd" or pool not in (None, "max") or not parts.pool_from_compiled():
        return None
    # the kernel that conv_transform is the transform of: none yet (NaN differs from all)
    constants[f"conv_kernel{k}"] = np.full(w.shape, np.nan, node.dtype)
    constants[f"conv_transform{k}"] = np.empty((36,) + w.shape[2:], node.dtype)
    constants[f"conv_part{k}"] = conv.winograd_parts[np.dtype(node.dtype).itemsize]()[0]
    return [(f"{out} = conv.winograd_forward({ins[0]}, {ins[1]}, conv_kernel{k}, conv_transform{k}, "
             f"conv_part{k}, {conv.POOL_MODES[pool]}, {path.compiled.chunk})")]


def _weights_product_lines(node, ins, out, weights, constants, arguments):
    """The lines of a product by the value of the variable ``weights``: with few
    rows, by its panels packed once per value (adding them to ``arguments``; a
    variable's value is replaced, never written in place, as _ProductByWeights
    relies on too), split between BLAS's threads where the weights are many
    (adding the part's address to ``constants``), else through BLAS; None
    where the plan runs it through BLAS alone.  Small weights too: BLAS took
    2.4 us of the W3 MLP's whole call for its 1 x 512 by 512 x 10 product, and
    the panels 0.8 us."""
    from jit_kernels import packed, parts

    from .compiler import PACKED_WEIGHTS_MAX_ROWS, PACKED_WEIGHTS_MIN_ITEMS, _multiplies_weights
    if weights is None or not _multiplies_weights(node) or not compiles_product(node):
        return None
    in_parts = math.prod(weights.shape) >= PACKED_WEIGHTS_MIN_ITEMS
    if in_parts and not parts.pool_from_compiled():
        return None
    k = len(arguments)
    arguments[f"weights_panels{k}"] = (weights, _panels)
    if in_parts:
        constants[f"weights_part{k}"] = packed.product_parts[np.dtype(node.dtype).itemsize]()[0]
        product = f"packed.matmul_packed_from_compiled({ins[0]}, weights_panels{k}, {out}, weights_part{k})"
    else:
        product = f"packed.matmul_packed({ins[0]}, weights_panels{k}, {out})"
    return [f"{out} = np.empty(({ins[0]}.shape[0], {ins[1]}.shape[1]), dtype=np.{node.dtype})",
            f"if {ins[0]}.shape[0] <= {PACKED_WEIGHTS_MAX_ROWS}:",
            f"    {product}",
            "else:",
            f"    {_PRODUCT}({ins[0]}, {ins[1]}, {out}, False, False)"]


def _panels(weights):
    """The panels of jit_kernels.packed of a product's right operand ``weights``."""
    from jit_kernels import packed
    return packed.pack(weights, False)


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
    unlike a kernel's compiled pattern, or that a product refuses, or values
    of other shapes than the variables': the plan's own steps then say what is
    wrong).

    The call takes the placeholders' arrays and the int64 addresses of the
    arrays it reads besides (``held``: :class:`_Held`, in the order of the
    source's ``addresses``; a scalar is an array of one item).  The addresses
    are read again only where a variable's value has been replaced since the
    last call (graph.values_version): each array argument of a Numba function
    costs about 0.15 us to pass, and the W3 MLP's whole call read nine besides
    its four scalars.  The arrays stay referenced until the addresses are
    read again."""

    def __init__(self, source, held, kernel_modules, lock=None):
        self.source = source
        self.held = held
        self.kernel_modules = kernel_modules  # those the source looks up by key
        codegen.hold(kernel_modules, self)
        self.lock = lock  # held while the call runs, where it runs parts on BLAS's threads
        self._function = None
        self._compiles = True
        self._read = (None, (), None)  # (values_version, the arrays, their addresses)

    def _read_addresses(self):
        version = graph.values_version
        arrays = tuple(h.array() for h in self.held)
        addresses = np.array([a.__array_interface__["data"][0] for a in arrays], np.int64)
        self._read = (version, arrays, addresses)
        return self._read

    def forget(self):
        """Drop the references to the arrays of the last call (read again on the next)."""
        self._read = (None, (), None)

    def run(self, *arrays):
        if not self._compiles:
            return None
        try:
            if self._function is None:
                module = codegen.load_kernel(self.source)
                codegen.hold([module], self)
                self._function = module.call
            read = self._read  # one read: another thread may replace it
            if read[0] != graph.values_version:
                read = self._read_addresses()
            if self.lock is None:
                return self._function(*arrays, read[2])
            self.lock.acquire()  # half the time of a with statement
            try:
                return self._function(*arrays, read[2])
            finally:
                self.lock.release()
        except numba.core.errors.NumbaError as exc:
            warnings.warn("function: the plan did not compile as one call, so it runs from "
                          f"Python ({type(exc).__name__}: {str(exc)[:200]})", stacklevel=3)
            self._compiles = False
            return None
        except ValueError:
            return None


class _Held:
    """An array a whole call reads through its address: a constant (a scalar
    as an array of one item, read as its item), a variable's value, or
    ``function`` of it (worked out again only where the value is another
    array).  ``shape`` and ``dtype`` are those the call's source gives it;
    ``array()`` raises ValueError where a value has others."""

    def __init__(self, name, shape, dtype, constant=None, variable=None, function=None):
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)
        self.constant, self.variable, self.function = constant, variable, function
        self._result = None  # (weak reference to the value, function of it)

    def array(self):
        if self.variable is None:
            return self.constant
        value = self.variable.value
        if self.function is not None:
            result = self._result
            if result is None or result[0]() is not value:
                result = self._result = (weakref.ref(value), self.function(value))
            value = result[1]
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ValueError(f"{self.name}: an array of {value.shape} {value.dtype}, compiled "
                             f"for {self.shape} {self.dtype}")
        return np.ascontiguousarray(value)

    def line(self, index, scalar=False):
        """The source line binding the array (or its ``scalar`` item) to its name."""
        dtype = "bool_" if self.dtype == np.bool_ else self.dtype.name
        shape = tuple(int(d) for d in self.shape)
        item = "[0]" if scalar else ""
        return f"{self.name} = parts.array_at(addresses[{index}], {shape!r}, np.{dtype}){item}"


def compile_call(plan):
    """The plan as one :class:`Call`, or None where a step has no compiled form."""
    rendered = render(plan, whole_call=True)
    if rendered is None or any(p.ndim == 0 for p in plan.placeholders) or any(
            t.ndim == 0 for t in plan.targets):
        return None  # a scalar is a NumPy scalar in the plan, not an array
    held = [_Held(name, v.shape, v.dtype, variable=v) for v, name in rendered.variables]
    for name, (variable, function) in rendered.call_arguments.items():
        result = function(variable.value)  # its shape and type, as the source gives them
        held.append(_Held(name, result.shape, result.dtype, variable=variable, function=function))
    scalars = set()
    constants = {c: plan.constants[c] for c in rendered.constant_names}
    for name, value in {**constants, **rendered.call_constants}.items():
        if not isinstance(value, np.ndarray):
            # a Python or NumPy scalar: its item, of the type Numba gives it
            value = np.asarray(value).reshape(1)
            scalars.add(name)
        held.append(_Held(name, value.shape, value.dtype, constant=np.ascontiguousarray(value)))
    params = [f"p{i}" for i in range(len(plan.placeholders))] + ["addresses"]
    results = [name if new else f"{name}.copy()"  # the caller owns what it gets
               for name, new in zip(plan.result_names, plan.result_fresh)]
    runs_convs = any(c.startswith("conv_") for c in rendered.call_constants)
    lines = HEADER + (CONV_HEADER if runs_convs else []) + rendered.kernel_lines
    lines += ["", "", "@njit_cached(nogil=True)", f"def call({', '.join(params)}):"]
    lines += ["    " + h.line(i, h.name in scalars) for i, h in enumerate(held)]
    lines += ["    " + line for line in rendered.lines]
    lines.append(f"    return ({''.join(r + ', ' for r in results)})")
    # parts on BLAS's threads (jit_kernels.parts.run_compiled) run under its lock
    runs_parts = any(c.startswith(("conv_part", "weights_part")) for c in rendered.call_constants)
    return Call("\n".join(lines) + "\n", held, rendered.kernel_modules,
                blas._parts_lock if runs_parts else None)
