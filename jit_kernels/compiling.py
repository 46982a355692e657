"""How jit_kernels compiles: :func:`njit_cached` (a disk cache of ours, loaded
cheaply, portable and keyed by content), its parallel/serial twins, the
process-wide LLVM options every kernel is compiled with, one function's
vector width (:func:`prefer_vector_width`), and the CPU target
(``NUMBACKEND_CPU_TARGET``).  Imported by every kernel module, so the options
are set before any compile.

Where compiled code is cached: under a *cache root* (``NUMBACKEND_CACHE_DIR``,
else ``~/.cache/numbackend``, else ``<tmp>/numbackend-<uid>``, else a private
folder of the process), in ``numba/<target key>/``, one file per function and
signature (see :class:`KernelCache`).  Read-only *seeds* (``NUMBACKEND_CACHE_SEED``,
the package's own :func:`seed_dir`, a read-only ``NUMBACKEND_CACHE_DIR``) have
the same layout and are searched first.
"""

import contextlib as _contextlib
import functools as _functools
import hashlib as _hashlib
import os as _os
import re as _re
import sys as _sys
import types as _types
import warnings as _warnings
import weakref as _weakref


def _apply_cpu_target():
    """Make ``NUMBACKEND_CPU_TARGET`` (an LLVM CPU name such as ``x86-64-v3`` or
    ``generic``) Numba's CPU, with that CPU's own features rather than the
    host's, so that compiled code, and the cache holding it, run on every CPU
    of the family.  Before Numba is imported: it reads NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES when it loads."""
    target = _os.environ.get("NUMBACKEND_CPU_TARGET", "").strip()
    if not target:
        return
    if not _re.fullmatch(r"[A-Za-z0-9_.-]+", target):
        raise ValueError(f"jit_kernels: NUMBACKEND_CPU_TARGET must be an LLVM CPU name "
                         f"(such as x86-64-v3 or generic), got {target!r}")
    named = _os.environ.get("NUMBA_CPU_NAME")
    if named is not None and named != target:
        raise ValueError(f"jit_kernels: NUMBACKEND_CPU_TARGET={target!r} and "
                         f"NUMBA_CPU_NAME={named!r} disagree; set one of them")
    _os.environ["NUMBA_CPU_NAME"] = target
    _os.environ.setdefault("NUMBA_CPU_FEATURES", "")  # the target's features, not the host's
    if "numba" in _sys.modules:
        from numba.core import config
        config.reload_config()
        from numba.core.registry import cpu_target
        context = vars(cpu_target).get("_toplevel_target_context")
        if context is not None and context.codegen()._tm_features != config.CPU_FEATURES:
            raise RuntimeError(f"jit_kernels: NUMBACKEND_CPU_TARGET={target!r} came after Numba "
                               "had set up its CPU; set it before the process starts")


_apply_cpu_target()

import llvmlite
import llvmlite.binding as _llvm
import llvmlite.ir as _llvm_ir
import numba as _numba
from numba.core import compiler as _compiler
from numba.core import lowering as _lowering
from numba.core import typed_passes as _typed_passes
from numba.core import types as _nbtypes
from numba.core.caching import CompileResultCacheImpl as _CompileResultCacheImpl
from numba.core.caching import FunctionCache as _FunctionCache
from numba.core.caching import _CacheLocator
from numba.core.callwrapper import PyCallWrapper as _PyCallWrapper
from numba.core.compiler_machinery import register_pass as _register_pass
from numba.core.errors import TypingError as _TypingError
from numba.extending import intrinsic as _intrinsic

# LLVM's loop vectoriser gives up on a loop that needs more than 128 run-time
# checks that its arrays do not overlap.  Numba cannot tell LLVM that a
# kernel's freshly allocated outputs overlap nothing, so a fused kernel with
# many outputs needs more (an LSTM backward step: 11 outputs, 12 inputs) and
# ran far slower as scalar code.  The option is process-wide; all it does is
# let more loops vectorise.
_llvm.set_option("", "-vectorize-memory-check-threshold=1024")

# Interleave every vectorised loop four times (four independent vector chains
# per iteration).  LLVM's cost model leaves a long loop body such as an inlined
# exp or tanh at one chain, whose latency then bounds the loop (softmax and
# the W1 chain gained: PERFORMANCE.md, W1).
_llvm.set_option("", "-force-vector-interleave=4")


def _load_numba_array_math_without_scipy():
    """Import Numba's array-math lowering without its SciPy BLAS probe.

    numba.np.arraymath imports scipy.linalg when it loads (a noticeable part of
    a process's first compile where SciPy is installed, as it is with Keras)
    only to decide whether np.correlate/np.convolve may call
    BLAS.  No kernel here uses Numba's BLAS: matrix products run through
    NumPy.  The probe answers "no BLAS" while the module loads and is restored
    right after, so np.dot in other njit code still finds SciPy's BLAS.
    """
    import sys
    if "numba.np.arraymath" in sys.modules:
        return
    from numba.np import linalg
    probe = getattr(linalg, "ensure_blas", None)
    if probe is None:  # another Numba layout: load as it comes
        return

    def no_blas():
        raise ImportError("jit_kernels: skipped the SciPy BLAS probe")

    linalg.ensure_blas = no_blas
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        linalg.ensure_blas = probe


# --- where compiled code is cached: jit_kernels.cache_folders (no Numba) --------

from . import cache_folders as _cache_folders
from .cache_folders import (  # noqa: F401 - this module's API as before
    entry_mode,
    saving_to,
    seed_dir,
    seed_folders,
    seed_roots,
    usable_folder,
    warn_once,
    write_atomically,
)

# --- the CPU target and the key of compiled code ---------------------------------


def cpu_target():
    """(LLVM CPU name, feature string) that Numba compiles for: NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES (see NUMBACKEND_CPU_TARGET) where set, else the host's."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features
    name = config.CPU_NAME or _llvm.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return name, features


def target_vector_bytes():
    """The width in bytes of the vector registers of the CPU target: 64 where it
    has AVX-512 (by its features, or where a CPU is named without features,
    such as ``x86-64-v4`` or ``skylake-avx512``, by that CPU's own), else 32
    (AVX; narrower machines split each vector in two)."""
    name, features = cpu_target()
    if features:
        return 64 if "+avx512f" in features.split(",") else 32
    return 64 if _has_avx512(name) else 32


# A 512-bit vector operation, which LLVM compiles to one instruction on zmm
# registers where the CPU has AVX-512, else splits
_WIDE_VECTOR_IR = """
define void @wide(<16 x float>* %a) {
  %v = load <16 x float>, <16 x float>* %a
  %w = fadd <16 x float> %v, %v
  store <16 x float> %w, <16 x float>* %a
  ret void
}
"""


@_functools.cache
def _has_avx512(cpu_name):
    """Whether the CPU LLVM knows as ``cpu_name`` (with its own features) has
    AVX-512: LLVM's word, from the code it makes for a 512-bit vector (a few ms,
    once).  Not from a list of names, which would miss the CPUs LLVM adds."""
    _llvm.initialize_native_target()
    _llvm.initialize_native_asmprinter()
    machine = _llvm.Target.from_default_triple().create_target_machine(cpu=cpu_name, features="")
    return "zmm" in machine.emit_assembly(_llvm.parse_assembly(_WIDE_VECTOR_IR))


# --- the vector width of one function's loops ------------------------------------

# The widths LLVM's X86 backend takes as a function's "prefer-vector-width"
VECTOR_WIDTHS = (128, 256, 512)


@_intrinsic(prefer_literal=True)
def prefer_vector_width(typingctx, bits):
    """In compiled code, ``prefer_vector_width(512)`` (a constant, one of
    :data:`VECTOR_WIDTHS`) has LLVM's loop vectoriser fill vectors of up to
    that many bits in the function it is compiled into, where the CPU
    target's own choice may be narrower (LLVM's tuning of Intel's AVX-512
    CPUs prefers 256-bit vectors).  It generates no code: it sets the LLVM
    function's attribute ``"prefer-vector-width"``, which LLVM's X86 backend
    reads per function.  Called in the body of a ``prange`` loop, it marks
    the function that Numba outlines that body into, where the loop runs.
    A copy of the function that LLVM inlines into another before it
    vectorises takes the other's width.  A width wider than the target's
    registers is split into registers it has.  TypingError where the width
    is not a constant of VECTOR_WIDTHS."""
    if not isinstance(bits, _nbtypes.IntegerLiteral) or bits.literal_value not in VECTOR_WIDTHS:
        raise _TypingError(f"prefer_vector_width: the width must be a constant, one of "
                           f"{VECTOR_WIDTHS} (bits), got {bits}")
    attribute = f'"prefer-vector-width"="{bits.literal_value}"'

    def codegen(context, builder, signature, args):
        attributes = builder.function.attributes
        # llvmlite's FunctionAttributes take the attributes it lists alone; an LLVM
        # string attribute, "name"="value", is written into the IR as it is
        attributes._known = attributes._known | {attribute}
        attributes.add(attribute)
        return context.get_dummy_value()

    return _nbtypes.none(bits), codegen


# The name Numba gives the parameter of an array argument's data pointer: an
# array's fields are passed one by one (meminfo, parent, nitems, itemsize,
# data, shape..., strides...), named arg.<argument>.<field>
_ARRAY_DATA_PARAMETER = _re.compile(r"arg\.[A-Za-z_]\w*\.4")


@_intrinsic
def arrays_apart(typingctx):
    """In compiled code, ``arrays_apart()`` tells LLVM that the array arguments
    of the function it is compiled into share no memory that the function
    writes: their data pointers become ``noalias`` parameters.  The loop
    vectoriser then needs no run-time overlap checks (a fused kernel with 12
    outputs and 17 inputs had hundreds, whose code took about half of its
    compile).  Only for functions whose arguments are arrays and scalars, none
    of them written through one array and read through another (an output
    that is also an input must not be one of them): LLVM may otherwise reorder
    a read after a write.  Called in the body of a ``prange`` loop, it marks
    the function that Numba outlines that body into (whose pointers Numba
    marks so already).  It generates no code."""
    def codegen(context, builder, signature, args):
        for parameter in builder.function.args:
            if (isinstance(parameter.type, _llvm_ir.PointerType)
                    and _ARRAY_DATA_PARAMETER.fullmatch(parameter.name)):
                parameter.add_attribute("noalias")
        return context.get_dummy_value()

    return _nbtypes.none(), codegen


def target_key():
    """The folder name of compiled code under a cache root's ``numba`` folder:
    the CPU name and a hash of what compiled code depends on beyond a
    function's own source: this package's sources and compiled tuning values
    (:func:`package_stamp`), Numba's and llvmlite's versions, the target
    triple, the CPU's name and features, and the vector width the packed
    products are compiled for.  Never a path: a cache moved elsewhere is used
    there.  Memoised."""
    global _target_key
    if _target_key is None:
        from . import tuning
        name, features = cpu_target()
        parts = (package_stamp(), _numba.__version__, llvmlite.__version__,
                 _llvm.get_process_triple(), name, features,
                 tuning.PACKED_VECTOR_BYTES or target_vector_bytes())
        digest = _hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
        _target_key = f"{_re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest}"
    return _target_key


_target_key = None


# --- the cache of compiled code ------------------------------------------------

_ENTRY_MAGIC = b"numbackend-compiled-1\n"


@_functools.cache
def _file_digest(path, mtime_ns, size):
    """sha256 of the file's bytes (memoised by its path, modification time and size)."""
    with open(path, "rb") as f:
        return _hashlib.sha256(f.read()).hexdigest()


class _KernelLocator(_CacheLocator):
    """Numba's locator for a function of ours: compiled code lives in
    ``<cache root>/numba/<target key>/`` (see :func:`target_key`), never beside
    the source or under a folder named by its path; the source's stamp is a
    hash of its bytes."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno

    def get_cache_path(self):
        return _compiled_folders()[1]

    def get_source_stamp(self):
        status = _os.stat(self._py_file)
        return _file_digest(self._py_file, status.st_mtime_ns, status.st_size)

    def get_disambiguator(self):
        return str(self._lineno)

    def ensure_cache_path(self):
        pass  # usable_folder made it

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func, py_file)


class _KernelCacheImpl(_CompileResultCacheImpl):
    """Numba's CompileResult (de)serialisation with our locator, chosen
    directly (NUMBA_CACHE_LOCATOR_CLASSES and NUMBA_CACHE_DIR do not apply),
    and file names from the function's module and qualified name."""

    def __init__(self, py_func):
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = _KernelLocator(py_func, py_func.__code__.co_filename)
        module = getattr(py_func, "__module__", None) or "__main__"
        fullname = _re.sub(r"[^A-Za-z0-9_.-]", "", f"{module}.{py_func.__qualname__}")
        self._filename_base = self.get_filename_base(fullname, getattr(_sys, "abiflags", ""))


def _compiled_folders():
    """(seed folders, writable folder or None) of compiled code for the current
    configuration, memoised per configuration.  Where nothing can be written,
    compiled code stays in memory, after one warning."""
    names = ("numba", target_key())
    config = _cache_folders.configuration()
    found = _folders_by_config.get(config)
    if found is None:
        try:
            writable = usable_folder(*names)
        except OSError as error:
            warn_once(None, f"{error}; compiling without a cache")
            writable = None
        seeds = [f for f in seed_folders(*names) if f != writable]
        found = _folders_by_config[config] = (seeds, writable)
    return found


_folders_by_config = {}


class KernelCache(_FunctionCache):
    """The disk cache of every :func:`njit_cached` function: one file per
    function and signature, found by name, without an index.

    A file is ``<module>.<qualname>-<line>.py<version>.<hash>.nbc`` where the
    hash is of the entry's key (the signature, the CPU target, the function's
    bytecode and closure, and a hash of its source file), in the folders of
    :func:`_compiled_folders`: the seeds first, then the writable one.  It
    holds a hash of its contents and the key itself, both checked when it is
    read: an entry cut short, garbled, or another's is compiled again (after a
    warning), never loaded.  It also names the kernels its code calls through
    :func:`by_address`, bound before the code is loaded.  Saves go through a
    temporary file of a unique name renamed over the entry, so concurrent
    writers each leave a whole one.

    A load does not refresh Numba's registries: on the first load of a process
    that imports and installs every typing and lowering registry, though loaded
    machine code needs none of them, only the runtime's symbols, which
    ``rtsys.initialize`` provides.  A miss is followed by a compile, whose
    pipeline refreshes the context itself.
    """

    def __init__(self, py_func):  # Numba's resolves folders and stamps now; ours when used
        self._name = repr(py_func)
        self._py_func = py_func
        self._impl = _KernelCacheImpl(py_func)
        self._enabled = True
        self._flushed = False  # after flush(), entries on disk are not loaded

    @property
    def cache_path(self):
        return _compiled_folders()[1]

    def flush(self):
        self._flushed = True

    def _entry_key(self, sig, codegen):
        """(the key the entry holds, its file name)."""
        key = (self._index_key(sig, codegen), self._impl.locator.get_source_stamp())
        digest = _hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        return key, f"{self._impl.filename_base}.{digest}.nbc"

    def load_overload(self, sig, target_context):
        from numba.core.runtime import rtsys
        rtsys.initialize(target_context)
        loaded = None
        if self._enabled and not self._flushed:
            seeds, writable = _compiled_folders()
            key, name = self._entry_key(sig, target_context.codegen())
            for folder in [*seeds, writable]:
                if folder is not None:
                    loaded = self._load_entry(_os.path.join(folder, name), key, target_context,
                                              writable=folder == writable)
                    if loaded is not None:
                        break
        if loaded is None:  # a compile follows: load array math as it should be loaded
            _load_numba_array_math_without_scipy()
        return loaded

    def _load_entry(self, path, key, target_context, writable):
        """The compile result in the entry at ``path``, or None where there is none
        or it is not whole and ours (then, after a warning, deleted where
        ``writable``, so that the compile that follows saves it anew)."""
        import pickle
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            return self._unreadable(path, f"{type(error).__name__}: {error}", writable)
        body = data[len(_ENTRY_MAGIC) + 32:]
        if not data.startswith(_ENTRY_MAGIC) or \
                data[len(_ENTRY_MAGIC):len(_ENTRY_MAGIC) + 32] != _hashlib.sha256(body).digest():
            return self._unreadable(path, "its contents do not match their hash", writable)
        try:
            stored_key, bindings, payload = pickle.loads(body)
            if stored_key != key:
                return self._unreadable(path, "it holds another function's code", writable)
            for binding in bindings:  # before the code is loaded: it calls these symbols
                _bind_by_address(*binding)
            return self._impl.rebuild(target_context, payload)
        except Exception as error:  # noqa: BLE001 - any entry that cannot be rebuilt: compile instead
            return self._unreadable(path, f"{type(error).__name__}: {error}", writable)

    def _unreadable(self, path, reason, writable):
        name = getattr(self._py_func, "__qualname__", self._name)
        _warnings.warn(f"jit_kernels: an unreadable cache entry of {name}, {path} ({reason}); "
                       "compiling it again", stacklevel=4)
        if writable:
            with _contextlib.suppress(OSError):
                _os.remove(path)

    def save_overload(self, sig, data):
        """Save compiled code to the writable folder; where it cannot take it (a
        full disk), it is used unsaved, after a warning (once per folder), where
        Numba fails the call that compiled it."""
        if not self._enabled or not self._impl.check_cachable(data):
            return
        folder = _compiled_folders()[1]
        if folder is None:
            return
        from numba.core.serialize import dumps
        key, name = self._entry_key(sig, data.codegen)
        payload = self._impl.reduce(data)  # the code whole: its callees' linked in
        body = dumps((key, by_address_bindings(data.library), payload))
        try:
            write_atomically(_os.path.join(folder, name),
                             _ENTRY_MAGIC + _hashlib.sha256(body).digest() + body)
        except OSError as error:
            if folder not in _unsaved_folders:
                _unsaved_folders.add(folder)
                _warnings.warn(f"jit_kernels: cannot save compiled code to {folder} "
                               f"({error}); compiling again in each process", stacklevel=2)


_unsaved_folders = set()  # the cache folders already warned of


def has_source_file(function):
    """Whether ``function`` was defined in a file, which the disk cache needs
    (a numbackend kernel whose module could not be written is run from memory)."""
    return _os.path.isfile(function.__code__.co_filename)


def _no_extensions_needed():
    pass


def package_stamp():
    """A hash of every source file of this package and of the tuning entries
    compiled into kernels (see tuning.compiled_values), memoised.  tuning.py
    itself is left out: its other entries are read at run time, and changing
    one must not recompile every kernel; so is manifest.py, which compiles
    kernels but holds none.  Part of :func:`target_key`: Numba
    compares only a function's own file, but kernels inline jit functions of
    other files of the package (conv.py packed.py's micro-kernels, pool.py and
    resize.py conv.py's helpers): one compiled against an older copy of those
    was loaded as it was, and corrupted the heap."""
    global _package_stamp
    if _package_stamp is None:
        folder = _os.path.dirname(_os.path.abspath(__file__))
        digest = _hashlib.sha256()
        for name in sorted(_os.listdir(folder)):
            if name.endswith(".py") and name not in ("tuning.py", "manifest.py"):
                with open(_os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
        from . import tuning
        digest.update(repr(tuning.compiled_values()).encode())
        _package_stamp = digest.hexdigest()[:16]
    return _package_stamp


_package_stamp = None


def install_cache(dispatcher, function):
    """Give ``dispatcher`` (a Numba dispatcher or C callback of ``function``) the
    disk cache of :class:`KernelCache`, where ``function`` has a source file."""
    if has_source_file(function):
        dispatcher._cache = KernelCache(function)


def njit_cached(optimised_entry=True, **options):
    """``numba.njit(**options)`` with our disk cache (:class:`KernelCache`),
    loaded as cheaply as it can be.

    Every cached kernel of jit_kernels and numbackend is declared with this;
    Numba functions of other code are untouched.  A function without a source
    file compiles uncached.  Numba's own ``cache=True`` is not used: it looks
    for a folder when the function is declared and fails the import where
    none can be written (a read-only install without a writable home).

    ``optimised_entry=False``: the function's entry from Python (Numba's
    wrapper, which unboxes each argument) is compiled without optimisation
    (:class:`_PlainEntryCompiler`), its body as usual.  For a function of many
    arguments called once for much work (a scan's loop over time): the
    optimisation of its entry took a quarter of its compile, and saves a few
    nanoseconds an argument a call.
    """
    if not optimised_entry:
        options["pipeline_class"] = _PlainEntryCompiler

    def decorate(function):
        dispatcher = _numba.njit(**options)(function)
        # NUMBA_DISABLE_JIT's plain function: as it comes
        if hasattr(dispatcher, "_cache"):
            install_cache(dispatcher, function)
            # Nor does a load need third-party Numba extensions, which Numba looks
            # up among all installed packages' entry points before a first call;
            # the registry refresh of a compile still loads them.
            dispatcher._compilation_chain_init_hook = _no_extensions_needed
        return dispatcher
    return decorate


class _PlainEntryLower(_lowering.Lower):
    """Numba's lowering, but the CPython wrapper it builds is marked
    ``optnone``, which LLVM's passes skip and its code generator lowers
    without optimising (see :func:`njit_cached`)."""

    def create_cpython_wrapper(self, release_gil=False):
        if self.genlower:  # a generator's two wrappers: as Numba builds them
            return super().create_cpython_wrapper(release_gil)
        # numba.core.cpu.CPUContext.create_cpython_wrapper, but marking the wrapper
        context, fndesc = self.context, self.fndesc
        module = context.create_module("wrapper")
        callee = _llvm_ir.Function(
            module, context.call_conv.get_function_type(fndesc.restype, fndesc.argtypes),
            fndesc.llvm_func_name)
        _PyCallWrapper(context, module, callee, fndesc, self.env, call_helper=self.call_helper,
                       release_gil=release_gil).build()
        wrapper = module.get_global(fndesc.llvm_cpython_wrapper_name)
        wrapper.attributes.add("noinline")  # optnone requires it
        wrapper.attributes.add("optnone")
        self.library.add_ir_module(module)


@_register_pass(mutates_CFG=True, analysis_only=False)
class _PlainEntryLowering(_typed_passes.NativeLowering):
    _name = "numbackend_plain_entry_lowering"

    @property
    def lowering_class(self):
        return _PlainEntryLower


class _PlainEntryCompiler(_compiler.CompilerBase):
    """Numba's nopython pipeline with :class:`_PlainEntryLowering` for its lowering."""

    def define_pipelines(self):
        pipeline = _compiler.DefaultPassBuilder.define_nopython_pipeline(self.state)
        pipeline.passes = [(_PlainEntryLowering, description)
                           if pass_class is _typed_passes.NativeLowering
                           else (pass_class, description)
                           for pass_class, description in pipeline.passes]
        pipeline.finalize()
        return [pipeline]


def njit_cached_twins(**options):
    """:func:`njit_cached` with ``parallel=True``, with a ``serial`` attribute: the
    same function compiled without it, for work too small to share between
    threads.  A parallel kernel held to one thread still goes through Numba's
    threading layer on every call, which costs more than small work itself
    (mnist_cnn's max pooling at batch 1: PERFORMANCE.md, W4).  The twin is named
    ``<name>_serial`` so that the two keep apart in the disk cache, whose keys
    do not include the parallel flag.
    """
    def decorate(function):
        parallel = njit_cached(parallel=True, **options)(function)
        twin = _types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                   function.__defaults__, function.__closure__)
        twin.__qualname__ = f"{function.__qualname__}_serial"
        parallel.serial = njit_cached(**options)(twin)
        return parallel
    return decorate


# --- calling a kernel through its address --------------------------------------

# The kernels bound to symbols in this process (see by_address), both ways:
# (module, qualified name, argument types) -> symbol, and symbol -> that key;
# and symbol -> (the kernel's code library, its function's name there)
_bound_symbols, _bindings, _bound_code = {}, {}, {}
_BY_ADDRESS_PREFIX = "numbackend_by_address."


def _bind_by_address(module, qualname, argument_types):
    """Compile or load the kernel ``module.qualname`` for ``argument_types`` and
    bind the address of its compiled code to a symbol of that kernel and
    signature, whose name this returns; once per process for each.  Run when a
    caller compiles (:func:`by_address`), and before a cached caller is loaded
    (:meth:`KernelCache._load_entry`)."""
    key = (module, qualname, argument_types)
    symbol = _bound_symbols.get(key)
    # bound again where the kernel's code was freed (a generated module dropped
    # and loaded again): the code of the first binding stays in memory (Numba
    # never unloads machine code), but the export needs a code library of it
    if symbol is None or _bound_code[symbol][0]() is None:
        kernel = _kernel_named(module, qualname)
        kernel.compile(argument_types)
        result = kernel.overloads[argument_types]
        signature = _hashlib.sha256(repr(argument_types).encode()).hexdigest()[:16]
        symbol = f"{_BY_ADDRESS_PREFIX}{module}.{qualname}.{signature}"
        _llvm.add_symbol(symbol, result.library.get_pointer_to_function(result.fndesc.mangled_name))
        _bound_symbols[key], _bindings[symbol] = symbol, key
        # weakly: a generated module's code is freed with the module
        _bound_code[symbol] = (_weakref.ref(result.library), result.fndesc.mangled_name)
    return symbol


def _kernel_named(module, qualname):
    """The kernel ``module.qualname`` (see :func:`_module_named`)."""
    kernel = _module_named(module)
    for name in qualname.split("."):
        kernel = getattr(kernel, name)
    return kernel


# {prefix of a module's name: a function loading the module of that name} for
# modules that are not imported by name (see register_module_loader)
_module_loaders = {}


def register_module_loader(prefix, load):
    """Have :func:`by_address` find a module whose name starts with ``prefix``
    through ``load(name)`` (which returns the module, or raises LookupError)
    where it is not in ``sys.modules``: numbackend's generated kernel modules,
    which it runs from source rather than imports, register their loader so
    that a cached caller of one of their kernels can be bound in a new
    process."""
    _module_loaders[prefix] = load


def _module_named(name):
    """The module ``name``: loaded already, else through a loader registered for
    its name (:func:`register_module_loader`), else imported."""
    module = _sys.modules.get(name)
    if module is not None:
        return module
    for prefix, load in _module_loaders.items():
        if name.startswith(prefix):
            return load(name)
    import importlib
    return importlib.import_module(name)


def is_by_address_symbol(name):
    """Whether ``name`` is a symbol through which compiled code calls a kernel
    (:func:`by_address`)."""
    return name.startswith(_BY_ADDRESS_PREFIX)


def bound_kernel(symbol):
    """(Numba code library, the name of the kernel's function in it) of the
    kernel bound to ``symbol`` in this process (:func:`by_address`), for code
    that must hold the kernel's code rather than call an address of this
    process (numbackend's export links it in).  The library's
    ``_get_module_for_linking()`` is that code as Numba links it into a caller
    (its functions linkonce_odr), also for a kernel loaded from the cache,
    whose entry keeps it.  LookupError where no kernel is bound to
    ``symbol``."""
    library, name = _bound_code.get(symbol, (lambda: None, None))
    if library() is None:
        raise LookupError(f"bound_kernel: no kernel is bound to {symbol!r} in this process")
    return library(), name


def by_address_bindings(library):
    """The (module, qualified name, argument types) of each kernel that the
    compiled code of ``library`` (a Numba code library, finalised: its
    callees' code linked in) calls through :func:`by_address`: saved with it
    in the cache, and bound before it is loaded again."""
    symbols = _re.findall(r'^declare [^\n]*@"?(' + _re.escape(_BY_ADDRESS_PREFIX) + r'[^"(]+)"?\(',
                          library.get_llvm_str(), _re.MULTILINE)
    return [_bindings[symbol] for symbol in sorted(set(symbols))]


def by_address(kernel):
    """``kernel`` (a dispatcher of :func:`njit_cached`) for compiled callers, called
    through its address rather than compiled into each of them.

    Numba compiles a caller together with the code of every kernel it calls
    (see ARCHITECTURE.md, Keeping compiles short), so a small function calling
    large kernels took as long to compile as all of them, and a kernel called
    from several callers was compiled again in each.  In compiled code,
    ``by_address(kernel)(*args)`` compiles (or loads) ``kernel`` for the
    arguments' types, as a direct call does, and calls that compiled code
    through a symbol bound to its address in this process
    (:func:`_bind_by_address`); the cache entry of a caller (or of a caller of
    a caller: the code of a direct callee is part of its own) names the
    kernels it so calls, which are bound again before it is loaded.  The call
    follows Numba's own calling convention: the result, and an exception
    raised in ``kernel``, reach the caller as from a direct call.  The price:
    the two are not optimised together (no inlining across the call), so
    small helpers in hot loops stay direct calls.  Under NUMBA_DISABLE_JIT,
    ``kernel`` itself.
    """
    if not hasattr(kernel, "py_func"):
        return kernel
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
    module, qualname = kernel.py_func.__module__, kernel.py_func.__qualname__

    # The intrinsic lives as long as the process (Numba registers it for good):
    # it finds the kernel by name, so that a generated module's kernel is freed
    # with its module
    @intrinsic
    def call(typingctx, *args):
        kernel = _kernel_named(module, qualname)
        signature = typingctx.resolve_function_type(types.Dispatcher(kernel), args, {})
        if signature is None:
            return None
        argument_types = tuple(signature.args)

        def codegen(context, builder, call_signature, call_args):
            symbol = _bind_by_address(module, qualname, argument_types)
            values = [context.cast(builder, value, given, expected) for value, given, expected in
                      zip(cgutils.unpack_tuple(builder, call_args[0]), args, argument_types)]
            function_type = context.call_conv.get_function_type(signature.return_type, argument_types)
            function = cgutils.get_or_insert_function(builder.module, function_type, symbol)
            status, result = context.call_conv.call_function(builder, function, signature.return_type,
                                                             argument_types, values)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return result

        return signature.return_type(types.StarArgTuple.from_types(args)), codegen

    call.kernel = _weakref.ref(kernel)  # what it calls, for checks of compiled callers' calls
    return call


@_functools.cache
def by_address_module(module):
    """``module`` (a module of kernels, such as jit_kernels.packed) as generated
    callers name it: a module of the same names in which each compiled kernel
    is ``by_address(kernel)`` and every other name (constants, functions of
    plain Python, helpers declared ``inline='always'``, which are meant to be
    compiled into their callers) is the module's own.  A generated caller's
    ``packed.matmul_packed(...)`` then calls the kernel through its address.
    One per module."""
    from numba.core.dispatcher import Dispatcher
    view = _types.ModuleType(module.__name__, module.__doc__)
    for name, value in vars(module).items():
        if (isinstance(value, Dispatcher) and value.targetoptions.get("inline", "never") == "never"
                and _found_by_name(value)):
            value = by_address(value)
        setattr(view, name, value)
    return view


def _found_by_name(kernel):
    """Whether ``kernel`` is found by its module's and qualified name, as
    :func:`by_address` finds it (a twin's serial dispatcher is not)."""
    try:
        return _kernel_named(kernel.py_func.__module__, kernel.py_func.__qualname__) is kernel
    except (AttributeError, ImportError, LookupError):
        return False
