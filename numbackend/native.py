"""A function's inference plan as an entry of the cache, served without Numba.

A new process's first call spends most of its time importing Numba and
loading its kernels from the cache.  A *native entry* is the function's
export (numbackend/exporting.py: one shared library, its values, a NumPy
loader), kept in the cache; a later process that builds the same function
with the same values serves its small calls from it, with ctypes and NumPy.

- **Built** once a function without updates has its whole call due (the
  plan compiled as one call, after tuning.ONE_CALL_AFTER small calls): a
  thread pickles the function and starts ``python -m numbackend
  native-build`` (numbackend/__main__.py) at low priority, which exports it for this CPU (verified
  against the function in a process of its own), adds the hash of each file
  and renames the folder into place as ``<cache root>/native/<key>/``.  An
  export refused leaves ``<key>.refused`` (its reason), which no later
  process tries again; ``<key>.building`` marks a build under way.
- **Key**: a hash of the predict plan's graph as it pickles
  (Function.inference_graph, with its variables' values; see _KeyPickler),
  numbackend's and jit_kernels' sources, the tuning entries that shape a plan
  (not the pins), and this CPU (its model and flags).
- **Found** when a function is built, where a native folder (the writable
  cache's, or a seed's) holds entries: the key costs a pickle of that graph.  An entry whose files do not match their hashes, or that does
  not load, is not used (and removed from the writable cache, to be built
  again).
- **Served**: calls whose inputs have at most tuning.ONE_CALL_MAX_ELEMENTS
  elements (and, where Keras's learning phase is an input, fed 0), while no
  variable has been assigned since the key was taken (graph.values_version).
  Other calls, and every call after an assignment, run the function's plan,
  built then.  The entry computes what the whole call does, in the same
  kernels; its products may sum in another order (verified within
  exporting.VERIFY_TOLERANCE when built).

- **Not built** in a process that has trained (run a function with updates):
  its values are those of one moment of the training, which no later process
  loads.  A process that loads the trained weights and predicts builds it.
- **Trimmed**: each build, once its entry is in place, removes the least
  recently used entries of the writable folder beyond
  tuning.NATIVE_CACHE_MAX_BYTES (finding an entry marks it used).

Function.warmup builds the entry at once and waits for it.
tuning.NATIVE_TIER = "off" turns both the builds and the lookups off.
"""
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import pickle
import shutil
import sys
import threading
import time
import zlib

import numpy as np

from jit_kernels import cache_folders, tuning

from . import graph
from .graph import Tensor

FORMAT = 2
SUBFOLDER = "native"
# each file's CRC-32, written last, before the folder is renamed into place
HASHES = "hashes.json"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_KERNELS = os.path.join(os.path.dirname(_PACKAGE), "jit_kernels")


def enabled():
    return tuning.NATIVE_TIER == "on"


_trained = False  # whether a function with updates has run in this process


def trained():
    """Note that this process trains (a function with updates ran): the entries
    it would build hold values no later process loads, so it builds none
    (other than by Function.warmup)."""
    global _trained
    _trained = True


# --- the key ---------------------------------------------------------------------

_stamp = None


def _sources_stamp():
    """A hash of numbackend's and jit_kernels' sources and this CPU's model and
    flags: an entry built by other code, or for another CPU, has another key."""
    global _stamp
    if _stamp is None:
        digest = _hash(f"native {FORMAT} {sys.version}".encode())
        paths = []
        for root in (_PACKAGE, _KERNELS):
            for folder, folders, files in os.walk(root):
                folders[:] = [f for f in folders if not f.startswith(("_", "."))]  # no seed, no pyc
                paths += [os.path.join(folder, name) for name in files
                          if name.endswith((".py", ".c", ".h"))]
        for path in sorted(paths):
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, _PACKAGE).encode() + b"\0" + f.read())
        try:
            with open("/proc/cpuinfo") as f:
                lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
        except OSError:
            lines = []
        digest.update("".join(lines).encode())
        _stamp = digest.digest()
    return _stamp


def key_of(function):
    """``(key, pickled)``: the key of ``function``'s entry and a function giving
    its pickled form; ``(None, None)`` where it cannot be pickled or is larger
    than tuning.NATIVE_MAX_BYTES."""
    buffers = []  # the arrays' data, hashed where they are rather than copied into the pickle
    stream = io.BytesIO()
    try:
        _KeyPickler(stream, protocol=5, buffer_callback=buffers.append).dump(
            function.inference_graph())
    except Exception:  # noqa: BLE001 - a graph that does not pickle simply has no entry
        return None, None
    pickled = stream.getvalue()
    views = [b.raw() for b in buffers]
    if len(pickled) + sum(v.nbytes for v in views) > tuning.NATIVE_MAX_BYTES:
        return None, None
    digest = _hash(_sources_stamp())
    # the entries that shape the plan; not those of when tiers come (pins) or of entries
    digest.update(repr([(e.name, getattr(tuning, e.name)) for e in tuning.entries()
                        if not e.decides and not e.name.startswith("NATIVE_")]).encode())
    digest.update(pickled)
    for view in views:
        digest.update(len(view).to_bytes(8, "little"))
        digest.update(view)
    return digest.hexdigest(), lambda: pickle.dumps(function, protocol=5)


class _KeyPickler(pickle.Pickler):
    """A pickler for keys, whose bytes are equal for equal graphs however they
    were made: a node without its name (``<op>_<id>`` where not given, which
    counts the nodes the process made before), an array as its dtype's code,
    its shape and its data (an array read from a file holds a dtype object of
    its own, which a plain pickle writes out where another's is referred to)."""

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            return _node, (type(obj),), {name: value for name, value in vars(obj).items()
                                         if name not in ("id", "name", "_keras_history")}
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            return _array, (obj.dtype.str, obj.shape,
                            pickle.PickleBuffer(np.ascontiguousarray(obj)))
        return NotImplemented


# what _KeyPickler names as the makers of nodes and arrays (keys are never unpickled)


def _node(cls):
    return cls.__new__(cls)


def _array(dtype, shape, data):
    return np.frombuffer(data, dtype).reshape(shape)


def _hash(data=b""):
    # BLAKE2b: the fastest of hashlib's secure hashes where the CPU has no SHA
    # instructions, and a key that two functions cannot share by chance
    return hashlib.blake2b(data, digest_size=20)


# --- finding and loading an entry --------------------------------------------------


def _writable_folder():
    """``<writable cache root>/native``, or None where none can be used."""
    try:
        return cache_folders.usable_folder(SUBFOLDER)
    except OSError:
        return None


def _folders():
    """The folders searched for entries: the seeds', then the writable one."""
    writable = _writable_folder()
    return [f for f in cache_folders.seed_folders(SUBFOLDER) if f != writable] + (
        [writable] if writable else [])


def _holds_entries(folder):
    try:
        return any(not name.startswith(".") and "." not in name for name in os.listdir(folder))
    except OSError:
        return False


def lookup(function, inputs, per_value):
    """The :class:`Entry` of ``function`` (``inputs``: its input count;
    ``per_value``: the position of its learning-phase input, or None), or None
    where no folder holds one for it."""
    if not enabled():
        return None
    folders = [f for f in _folders() if _holds_entries(f)]
    if not folders:
        return None
    version = graph.values_version
    key, _ = key_of(function)
    if key is None:
        return None
    for folder in folders:
        path = os.path.join(folder, key)
        if not os.path.isdir(path):
            continue
        try:
            entry = Entry(path, inputs, per_value, version)
        except Exception as error:  # noqa: BLE001 - a bad entry is not used, and built again
            cache_folders.warn_once(path, f"numbackend: the native entry {path} is not used "
                                          f"({type(error).__name__}: {error})")
            if folder == _writable_folder():
                _remove(folder, os.path.basename(path))
            continue
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last that trim removes (a seed's stays as it is)
        return entry
    return None


def file_hashes(path):
    """{name: CRC-32} of the files of the entry folder ``path`` (its loader's
    bytecode and the hashes file aside).  They catch a file damaged or cut
    short since the build, which the key cannot (it hashes the function, not
    the files): a checksum does that, at several times the speed of a secure
    hash over the weights, which a warm process's start reads once."""
    hashes = {}
    for name in sorted(os.listdir(path)):
        if name != HASHES and name != "__pycache__":
            with open(os.path.join(path, name), "rb") as f:
                hashes[name] = zlib.crc32(f.read())
    return hashes


class Entry:
    """A native entry, loaded: :meth:`run` serves a function's small calls."""

    def __init__(self, path, inputs, per_value, values_version):
        with open(os.path.join(path, HASHES)) as f:
            recorded = json.load(f)
        if file_hashes(path) != recorded:
            raise ValueError("its files do not match their recorded hashes")
        name = f"numbackend_native_{os.path.basename(path)}"
        spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if len(module.MANIFEST["inputs"]) != inputs - (per_value is not None):
            raise ValueError(f"it has {len(module.MANIFEST['inputs'])} inputs")
        self.path = path
        self._predict = module.predict
        self._inputs = inputs
        self._per_value = per_value
        self._values_version = values_version
        self._lock = threading.Lock()  # one call at a time: the library's scratch is its own

    @property
    def current(self):
        """Whether no variable has been assigned since the entry was found."""
        return graph.values_version == self._values_version

    def run(self, arrays):
        """The outputs for a call's arrays (its inputs, checked, then the
        function's defaults), or None where the entry does not serve it (see
        the module's docstring)."""
        inputs = list(arrays[:self._inputs])
        if self._per_value is not None and inputs.pop(self._per_value) != 0:
            return None  # the learning phase fed 1: the training plan
        size = 0
        for a in inputs:
            size += a.size
        if size > tuning.ONE_CALL_MAX_ELEMENTS or not self.current:
            return None
        with self._lock:
            outputs = self._predict(inputs)
        return outputs if isinstance(outputs, list) else [outputs]


# --- building an entry -------------------------------------------------------------


def build_later(function):
    """Start a build of ``function``'s entry (where it has none, and none is
    under way or refused) from a thread of its own: the pickle and the start of
    the process take milliseconds, which the call does not wait for.  Not a
    daemon: a process that ends at once still starts its build."""
    if not enabled() or _trained:
        return
    threading.Thread(target=_start_build_or_warn, args=(function,), name="numbackend-native",
                     daemon=False).start()


def _start_build_or_warn(function):
    try:
        _start_build(function)
    except Exception as error:  # noqa: BLE001 - the function serves on without an entry
        cache_folders.warn_once(("native", type(error)), "numbackend: a native entry's build "
                                f"did not start ({type(error).__name__}: {error})")


def build_now(function):
    """Build ``function``'s entry, where it has none and none is under way or
    refused, and wait for it (Function.warmup)."""
    process = _start_build(function)
    if process is not None:
        process.wait()


def _start_build(function):
    """Start ``python -m numbackend native-build`` for ``function``; the
    process it started, or None where nothing is to be built."""
    if not enabled():
        return None
    folder = _writable_folder()
    if folder is None:
        return None
    key, pickled = key_of(function)
    if key is None:
        return None
    for searched in _folders():
        if os.path.exists(os.path.join(searched, key)):
            return None
    if os.path.exists(os.path.join(folder, key + ".refused")) or not _claim(folder, key):
        return None
    import subprocess  # here: a process serving from an entry never builds one
    try:
        cache_folders.write_atomically(os.path.join(folder, key + ".pickle"), pickled())
        environment = dict(os.environ, NUMBACKEND_TUNE_NATIVE_TIER="off")
        root = os.path.dirname(_PACKAGE)
        environment["PYTHONPATH"] = os.pathsep.join(
            [root] + [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p])
        with open(os.path.join(folder, key + ".log"), "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "numbackend", "native-build", folder, key],
                env=environment, cwd=folder, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)  # not stopped with this process, nor by its Ctrl-C
    except BaseException:
        release(folder, key)
        raise
    threading.Thread(target=process.wait, daemon=True).start()  # reaped when it ends
    return process


def _claim(folder, key):
    """Mark a build of ``key`` as under way: False where another is (a mark
    older than tuning.NATIVE_BUILD_STALE_S is of a build that died)."""
    mark = os.path.join(folder, key + ".building")
    for _ in range(2):
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - os.path.getmtime(mark) < tuning.NATIVE_BUILD_STALE_S:
                    return False
                os.remove(mark)
            except OSError:
                return False
    return False


def release(folder, key):
    """Remove the pickle and the mark of a build of ``key`` (it ended)."""
    for suffix in (".pickle", ".building"):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, key + suffix))


# --- the folder's size ----------------------------------------------------------


def _folder_bytes(path):
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(folder, name))
    return total


def _remove(folder, key):
    """Remove the entry ``key`` of ``folder``: renamed first, so that a process
    looking for it finds it whole or not at all."""
    hidden = os.path.join(folder, f".{key}.{os.getpid()}.removed")
    try:
        os.rename(os.path.join(folder, key), hidden)
    except OSError:
        return  # gone already, or another process removes it
    shutil.rmtree(hidden, ignore_errors=True)


def _left_over(name, path):
    """Whether the hidden folder ``name`` is what a removal or a build left
    behind: one being removed that rmtree could not finish, or a build's
    staging folder older than tuning.NATIVE_BUILD_STALE_S (its process died)."""
    if name.endswith(".removed"):
        return True
    try:
        return (name.endswith(".staging")
                and time.time() - os.path.getmtime(path) > tuning.NATIVE_BUILD_STALE_S)
    except OSError:
        return False


def trim(folder, keep):
    """Remove the least recently used entries of ``folder`` (the writable one)
    until those left hold at most tuning.NATIVE_CACHE_MAX_BYTES; the entry
    ``keep`` (the one just built) stays whatever its size.  Also removes what
    earlier removals and dead builds left (:func:`_left_over`).  The time an entry
    was last used is its folder's modification time (set by lookup)."""
    entries = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith("."):
            if os.path.isdir(path) and _left_over(name, path):
                shutil.rmtree(path, ignore_errors=True)
            continue
        if "." in name or not os.path.isdir(path):  # a mark, a log, a refusal
            continue
        try:
            used = os.path.getmtime(path)
        except OSError:
            continue
        entries.append((name == keep, used, name, _folder_bytes(path)))
    total = sum(size for *_, size in entries)
    for kept, _, name, size in sorted(entries):
        if total <= tuning.NATIVE_CACHE_MAX_BYTES or kept:
            break
        _remove(folder, name)
        total -= size
