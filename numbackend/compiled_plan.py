"""A program (program.py) written again as the body of one Numba function.

A plan runs its steps from Python: each kernel call, product and check costs a
few microseconds of interpreter, which is most of a small model's time at batch
1.  Where every step has a compiled form (a fused kernel, called through its
compiled ``run_serial``; a 2-D product of floats, through NumPy's BLAS
(jit_kernels.blas); a reshape; a concatenation; a 2-D convolution with its
epilogue, through jit_kernels.conv), the same steps can run inside one
compiled function: :func:`render` writes them as its lines (each library
step's from its lowering's ``compiled_lines``).  The scan's
loop over time (scan_loop.py) is one such function; :func:`compile_call` makes
another, the whole plan as one call.  Both are cached on disk like the kernels.

The kernels run serially there (``run_serial``): the whole-plan call is for
small inputs, where a parallel region would cost more than it saves.
"""
import re
import warnings
import weakref

import numpy as np

from . import codegen, graph, program

# The generated module's first lines.  Its calls of large library kernels
# (packed's products, and conv's, pool's... where imported) and of other
# generated modules' functions go through their addresses
# (jit_kernels.compiling.by_address): each compiles once, on its own, rather
# than again inside every loop and whole call.  blas's and copying's thin
# wrappers (of a BLAS call, of a copy loop) and parts.array_at stay direct
# calls: through an address, their calls at every step cost more than their
# compile.
HEADER = ["import numpy as np", "", "from jit_kernels import blas, copying, njit_cached, packed, parts",
          "from jit_kernels.compiling import by_address, by_address_module",
          "from numbackend.codegen import loaded_kernel", "",
          "copying, packed = by_address_module(copying), by_address_module(packed)", ""]


class Render:
    """A program's steps as source lines for compiled code, in the program's
    names (p0.. placeholders, v.. values, c../s.. constants).

    ``lines``: the steps; ``kernel_lines``: bind the kernels the lines call
    (after :data:`HEADER`), whose modules ``kernel_modules`` whatever runs the
    lines holds (see codegen.hold: the lines look them up by key, and
    codegen's bound on loaded modules may have dropped them);
    ``constant_names``: the program's constants the lines read;
    ``variables``: the (variable, name) pairs whose values they read.

    For a scan's loop: ``packable``, the names of placeholders that keep
    their values while the lines run again and again (a product by one runs
    on its panels, packed by ``packing_lines``, where the loop's
    ``packed_products`` is true); ``sliced``, {placeholder name: the array
    whose rows ``lo:hi`` of step ``t`` it is} (a product of one by a
    packable value runs for all steps at once, in ``hoistings``, where
    ``hoisted_products`` is true).  For a whole call (``whole_call``): the
    ``call_constants`` ({name: value}) and ``call_arguments`` ({name:
    (variable, function of its value)}) that lowerings add.  For an export
    (``export``, numbackend/export.py: a whole call compiled into a library
    of its own): no parts on OpenBLAS's threads, whose pool and compiled parts
    are this process's addresses, and products by weights on their panels at
    every batch size; ``refused`` names the step that has no such form.
    """

    def __init__(self, program, packable=(), sliced=None, whole_call=False, export=False,
                 bodies=None, scan_body=False):
        self.program = program
        self.scan_body = scan_body  # a scan's body: its kernels' modules as its plan's
        self.bodies = bodies  # an export's plan.Bodies, which build the scans' loops
        self.packable = set(packable)
        self.sliced = sliced or {}
        self.whole_call = whole_call or export
        self.export = export
        self.refused = None  # the first step with no compiled form, where render refused
        self.lines, self.variables, self.packings, self.hoistings = [], [], {}, []
        self.call_constants, self.call_arguments = {}, {}
        self.kernels, self.modules = {}, {}
        self.functions = {}  # {(module key, attribute): name} of compiled functions the lines call
        self.runs_parts = False  # parts on BLAS's threads: the call holds its lock
        self.imports = set()  # the modules of jit_kernels the lines call besides HEADER's

    def variable_named(self, name):
        """The variable whose value the lines read as ``name``, or None."""
        return next((v for v, n in self.variables if n == name), None)

    def add_constant(self, prefix, value, runs_parts=False):
        """A name for ``value``, a constant of the whole call."""
        name = f"{prefix}{len(self.call_constants)}"
        self.call_constants[name] = value
        self.runs_parts = self.runs_parts or runs_parts
        return name

    def add_argument(self, prefix, variable, function):
        """A name for ``function(variable.value)``, worked out again where the
        value is another array."""
        name = f"{prefix}{len(self.call_arguments)}"
        self.call_arguments[name] = (variable, function)
        return name

    def kernel_line(self, call):
        """The line of a program.KernelCall."""
        module = codegen.load_kernel(codegen.kernel_source(call.spec, self.scan_body))
        kernel = self.kernels.setdefault(module.KEY, f"kernel{len(self.kernels)}")
        self.modules[module.KEY] = module
        return f"({''.join(o + ', ' for o in call.outs)}) = {kernel}({', '.join(call.args)})"

    def function_name(self, module, attribute, holder=None):
        """A name for ``module``'s compiled function ``attribute`` (a module of
        codegen.load_kernel: a scan's loop), bound by :attr:`kernel_lines`;
        ``holder`` (a scan_loop.Loop) holds the kernel modules it calls."""
        self.modules[module.KEY] = module
        if holder is not None:
            for held in holder.kernel_modules:
                self.modules[held.KEY] = held
        return self.functions.setdefault((module.KEY, attribute), f"function{len(self.functions)}")

    @property
    def import_lines(self):
        """The lines importing :attr:`imports` (after :data:`HEADER`)."""
        if not self.imports:
            return []
        return ([f"from jit_kernels import {', '.join(sorted(self.imports))}"]
                + [f"{name} = by_address_module({name})" for name in sorted(self.imports)] + [""])

    @property
    def kernel_lines(self):
        return ([f"{name} = by_address(loaded_kernel({key!r}).run_serial)"
                 for key, name in self.kernels.items()]
                + [f"{name} = by_address(loaded_kernel({key!r}).{attribute})"
                   for (key, attribute), name in self.functions.items()])

    @property
    def kernel_modules(self):
        return list(self.modules.values())

    @property
    def packing_lines(self):
        # np.bool_: a literal flag would compile pack again (see lowering._FLAG)
        return [f"{name} = packed.pack_where({b}, np.bool_({tb}), packed_products)"
                for (b, tb), name in self.packings.items()]

    @property
    def constant_names(self):
        used = set(re.findall(r"\w+", "\n".join(self.lines + self.program.result_names)))
        return sorted(c for c in self.program.constants if c in used)


def render(program_, packable=(), sliced=None, whole_call=False, scan_body=False):
    """The program's steps as a :class:`Render`, or None where a step has no
    compiled form (or NumPy's BLAS is not one jit_kernels.blas can call)."""
    from jit_kernels import blas  # loads NumPy's BLAS and Numba: not at import
    if not blas.AVAILABLE:
        return None
    out = Render(program_, packable, sliced, whole_call, scan_body=scan_body)
    return out if _render_steps(program_, out) else None


def render_export(program_, bodies):
    """The program's steps as a :class:`Render` for an export (see there); its
    ``refused`` is the first step without a compiled form, where one has none.
    ``bodies``: the plan.Bodies that build its scans' compiled loops."""
    from jit_kernels import blas  # binds the BLAS names the lines call
    out = Render(program_, export=True, bodies=bodies)
    if not blas.AVAILABLE:
        out.refused = "NumPy's BLAS (jit_kernels.blas binds none in this process)"
    elif not _render_steps(program_, out):
        out.lines = []
    return out


def _render_steps(program_, out):
    """Write the program's steps into ``out`` (a :class:`Render`); False, with
    ``out.refused`` the step's description, where a step has no compiled form."""
    for step in program_.steps:
        if isinstance(step, program.ReadVariable):
            out.variables.append((step.variable, step.out))
        elif isinstance(step, program.FusedGroup):
            if step.kernel is None:
                out.refused = f"{_describe(step.group.members)} (inputs broadcast along two axes)"
                return False
            out.lines.append(out.kernel_line(step.kernel))
        elif isinstance(step, program.LibraryWithEpilogue):
            lines = _with_epilogue_lines(step, out)
            if lines is None:
                out.refused = _describe(step.members)
                return False
            out.lines += lines
        else:
            lines = step.lowering.compiled_lines(step.node, step.ins, step.out, out)
            if lines is None:
                reason = step.lowering.no_compiled_form(step.node)
                out.refused = _describe([step.node]) + (f": {reason}" if reason else "")
                return False
            out.lines += lines
    return True


def _with_epilogue_lines(step, out):
    """The lines of a program.LibraryWithEpilogue: the library op (pooled by it
    where the pool comes first), the group's kernel, and in an export a pool
    after the group; None where it has no compiled form."""
    from .lowering import pool_export_lines
    if step.kernel is None:
        return None
    pooled_after = step.unpooled is not None
    if pooled_after and not out.export:
        return None
    pool = None if step.pool is None or pooled_after else step.pool.attrs["mode"]
    lines = step.lowering.compiled_lines(step.node, step.ins, step.unfused, out, pool=pool)
    if lines is None:
        return None
    lines = lines + [out.kernel_line(step.kernel)]
    if not pooled_after:
        return lines
    pooling = pool_export_lines(step.pool, step.unpooled, step.out)
    if pooling is None:
        return None
    out.imports.add("pool")
    return lines + pooling


def _describe(nodes):
    """Graph nodes in words: their ops and names, shapes and types."""
    return " -> ".join(f"{n.op} {n.name!r} {graph.format_shape(n.shape)} {n.dtype}" for n in nodes)


class Call:
    """``run(*placeholder_arrays)``: the plan's results from one compiled call, or
    None where the plan must run from Python (run-time shapes that broadcast
    unlike a kernel's compiled pattern, or that a product refuses, or values
    of other shapes than the variables': the plan's own steps then say what is
    wrong).

    The call takes the placeholders' arrays and the int64 addresses of the
    arrays it reads besides (``held``: :class:`Held`, in the order of the
    source's ``addresses``; a scalar is an array of one item).  The addresses
    are read again only where a variable's value has been replaced since the
    last call (graph.values_version): each array argument of a Numba function
    costs time to pass, and a small network's whole call reads many arrays
    besides its scalars (PERFORMANCE.md, W3).  The arrays stay referenced
    until the addresses are read again."""

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

    def compile(self, argument_types):
        """Compile the call for placeholder arrays of ``argument_types`` (see
        :func:`argument_types`) without running it: on the worker thread of
        numbackend.tiers, off the serving path."""
        module = codegen.load_kernel(self.source)
        codegen.hold([module], self)
        module.call.compile(tuple(argument_types) + (_addresses_type(),))
        self._function = module.call

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
        except codegen.numba_error() as exc:
            warnings.warn("function: the plan did not compile as one call, so it runs from "
                          f"Python ({type(exc).__name__}: {str(exc)[:200]})", stacklevel=3)
            self._compiles = False
            return None
        except ValueError:
            return None


def argument_types(values):
    """Numba's types of ``values``, as a compiled function called with them sees
    them: what a compile off the serving path compiles for."""
    import numba  # not at import: numbackend loads Numba on a function's first call
    return tuple(numba.typeof(v) for v in values)


def _addresses_type():
    import numba
    return numba.typeof(np.zeros(1, np.int64))


class Held:
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


def held_arrays(program_, rendered):
    """The arrays that the lines of ``rendered`` (a :class:`Render` of ``program_``)
    read besides the placeholders: a list of :class:`Held`, and the names of
    those that are scalars (an array of one item, read as its item)."""
    held = [Held(name, v.shape, v.dtype, variable=v) for v, name in rendered.variables]
    for name, (variable, function) in rendered.call_arguments.items():
        result = function(variable.value)  # its shape and type, as the source gives them
        held.append(Held(name, result.shape, result.dtype, variable=variable, function=function))
    scalars = set()
    constants = {c: program_.constants[c] for c in rendered.constant_names}
    for name, value in {**constants, **rendered.call_constants}.items():
        if not isinstance(value, np.ndarray):
            # a Python or NumPy scalar: its item, of the type Numba gives it
            value = np.asarray(value).reshape(1)
            scalars.add(name)
        held.append(Held(name, value.shape, value.dtype, constant=np.ascontiguousarray(value)))
    return held, scalars


def compile_call(program_):
    """The program as one :class:`Call`, or None where a step has no compiled form."""
    from jit_kernels import blas
    rendered = render(program_, whole_call=True)
    if rendered is None or any(p.ndim == 0 for p in program_.placeholders) or any(
            t.ndim == 0 for t in program_.targets):
        return None  # a scalar is a NumPy scalar in the plan, not an array
    held, scalars = held_arrays(program_, rendered)
    params = [f"p{i}" for i in range(len(program_.placeholders))] + ["addresses"]
    results = [name if new else f"{name}.copy()"  # the caller owns what it gets
               for name, new in zip(program_.result_names, program_.result_fresh)]
    lines = HEADER + rendered.import_lines + rendered.kernel_lines
    lines += ["", "", "@njit_cached(nogil=True)", f"def call({', '.join(params)}):"]
    lines += ["    " + h.line(i, h.name in scalars) for i, h in enumerate(held)]
    lines += ["    " + line for line in rendered.lines]
    lines.append(f"    return ({''.join(r + ', ' for r in results)})")
    return Call("\n".join(lines) + "\n", held, rendered.kernel_modules,
                blas.parts_lock() if rendered.runs_parts else None)
