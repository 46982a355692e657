"""How jit_kernels compiles: :func:`njit_cached` (Numba's disk cache, loaded
cheaply and keyed by the whole package's sources), its parallel/serial twins,
and the process-wide LLVM options every kernel is compiled with.  Imported by
every kernel module, so the options are set before any compile.
"""

import contextlib as _contextlib
import os as _os
import types as _types
import warnings as _warnings

import llvmlite.binding as _llvm
import numba as _numba
from numba.core.caching import FunctionCache as _FunctionCache

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


class LoadWithoutRegistries(_FunctionCache):
    """Numba's per-function disk cache, minus the registry refresh on a load.

    Before each load Numba refreshes its target context: on the first load of a
    process that imports and installs every typing and lowering registry (a
    good part of a new process's first warm-cache call), though loaded
    machine code needs none of them, only the runtime's symbols, which
    ``rtsys.initialize`` provides.  A miss is followed by a compile, whose
    pipeline refreshes the context itself.
    """

    def load_overload(self, sig, target_context):
        from numba.core.runtime import rtsys
        rtsys.initialize(target_context)
        try:
            with self._guard_against_spurious_io_errors():
                loaded = self._load_overload(sig, target_context)
        except Exception as error:  # noqa: BLE001 - any unreadable entry: compile instead
            self._drop_unreadable(error)
            loaded = None
        if loaded is None:  # a compile follows: load array math as it should be loaded
            _load_numba_array_math_without_scipy()
        return loaded

    def _drop_unreadable(self, error):
        """Delete this function's cache index that could not be read (a file cut
        short or garbled), after a warning, so that the compile that follows
        saves a new one; Numba would raise on it in every process."""
        index = getattr(self._cache_file, "_index_path", None)
        name = getattr(self._py_func, "__qualname__", self._name)
        _warnings.warn(f"jit_kernels: an unreadable cache entry of {name} in "
                       f"{self.cache_path} ({type(error).__name__}: {error}); compiling it again",
                       stacklevel=3)
        if index is not None:
            with _contextlib.suppress(OSError):
                _os.remove(index)

    def save_overload(self, sig, data):
        """Numba's save, except that compiled code the cache folder cannot take
        (a full disk) is used unsaved, after a warning (once per folder), where
        Numba fails the call that compiled it."""
        try:
            super().save_overload(sig, data)
        except OSError as error:
            if self.cache_path not in _unsaved_folders:
                _unsaved_folders.add(self.cache_path)
                _warnings.warn(f"jit_kernels: cannot save compiled code to {self.cache_path} "
                               f"({error}); compiling again in each process", stacklevel=2)


_unsaved_folders = set()  # the cache folders already warned of


def has_source_file(function):
    """Whether ``function`` was defined in a file, which Numba's disk cache needs
    (a numbackend kernel whose module could not be written is run from memory)."""
    return _os.path.isfile(function.__code__.co_filename)


def _no_extensions_needed():
    pass


def package_stamp():
    """A hash of every source file of this package and of the tuning entries
    compiled into kernels (see tuning.compiled_values), memoised.  tuning.py
    itself is left out: its other entries are read at run time, and changing
    one must not recompile every kernel; so is manifest.py, which compiles
    kernels but holds none."""
    global _package_stamp
    if _package_stamp is None:
        import hashlib
        folder = _os.path.dirname(_os.path.abspath(__file__))
        digest = hashlib.sha256()
        for name in sorted(_os.listdir(folder)):
            if name.endswith(".py") and name not in ("tuning.py", "manifest.py"):
                with open(_os.path.join(folder, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
        from . import tuning
        digest.update(repr(tuning.compiled_values()).encode())
        _package_stamp = digest.hexdigest()[:16]
    return _package_stamp


_package_stamp = None


def stamp_with_package(cache):
    """Make a Numba disk cache take its entries as fresh only where they were saved
    with this package's sources as they are now.  Numba compares only the
    stamp of the function's own file, but kernels inline jit functions of
    other files of the package (conv.py packed.py's micro-kernels, pool.py and
    resize.py conv.py's helpers): one compiled against an older copy of those
    was loaded as it was, and corrupted the heap."""
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = (cache_file._source_stamp, package_stamp())


def njit_cached(**options):
    """``numba.njit(cache=True, **options)``, loading from the cache as cheaply as it can.

    Every cached kernel of jit_kernels and numbackend is declared with this, so
    no cache load of theirs refreshes Numba's registries (see
    :class:`LoadWithoutRegistries`); Numba functions of other code are untouched.
    A function without a source file compiles uncached.
    """
    def decorate(function):
        if not has_source_file(function):
            return _numba.njit(**options)(function)
        dispatcher = _numba.njit(cache=True, **options)(function)
        # another Numba layout, or NUMBA_DISABLE_JIT's plain function: as it comes
        if type(getattr(dispatcher, "_cache", None)) is _FunctionCache:
            dispatcher._cache.__class__ = LoadWithoutRegistries
            stamp_with_package(dispatcher._cache)
            # Nor does a load need third-party Numba extensions, which Numba looks
            # up among all installed packages' entry points before a first call;
            # the registry refresh of a compile still loads them.
            dispatcher._compilation_chain_init_hook = _no_extensions_needed
        return dispatcher
    return decorate


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
