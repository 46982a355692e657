"""A model exported by numbackend (``numbackend.export``): ``predict(x)`` with NumPy alone.

``predict(x, batch_size=None, threads=None)`` gives the model's outputs for
the batch ``x`` (an array, or a list of arrays for a model of several
inputs): one array, or a list for several outputs.  manifest.json describes
the inputs and outputs; model.so is the compiled plan, model.h its C API.
An output whose size along an axis depends on the data (CTC's decodings,
padded to the batch's longest) has a "trim" entry in manifest.json: the
library writes it at its bound, and predict drops the padding (see _trimmed).
The library runs the batch in chunks of manifest.json's ``chunk_rows`` rows on
``threads`` threads (None: NUMBACKEND_NUM_THREADS, else every CPU this process
may use); the results do not depend on the thread count.

This file is numbackend's export_files/loader.py, copied into each export.
"""
import ctypes
import glob
import json
import os
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "manifest.json")) as _file:
    MANIFEST = json.load(_file)

# The messages of the library's failures start with an exception's class
_ERRORS = {e.__name__: e for e in (ValueError, IndexError, TypeError, MemoryError,
                                   ZeroDivisionError, OverflowError, RuntimeError)}


def cpu_flags(path="/proc/cpuinfo"):
    """The flags of the first CPU in ``path`` (a set), or None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def check_cpu(flags=None):
    """Raise RuntimeError where this CPU lacks a feature the library was built
    for (manifest.json's target); ``flags``: the CPU's /proc/cpuinfo flags,
    read where not given (a warning where they cannot be)."""
    target = MANIFEST["target"]
    flags = cpu_flags() if flags is None else set(flags)
    if flags is None:
        warnings.warn(f"{__name__}: cannot read this CPU's features (/proc/cpuinfo); the library "
                      f"needs {', '.join(target['cpuinfo_flags'])} (target {target['name']!r})",
                      stacklevel=2)
        return
    missing = sorted(set(target["cpuinfo_flags"]) - flags)
    if missing:
        raise RuntimeError(f"{__name__}: this export was built for CPU target {target['name']!r}, "
                           f"and this CPU lacks {', '.join(missing)}: export the model again "
                           "with an older target or target='host' on this machine")


def _numpy_blas():
    """The CBLAS functions (sgemm, dgemm, sgemv, dgemv) of NumPy's OpenBLAS
    (64-bit integers), or None where NumPy's BLAS is another one."""
    root = os.path.dirname(np.__file__)
    names = {"sgemm": ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
             "dgemm": ("scipy_cblas_dgemm64_", "cblas_dgemm64_"),
             "sgemv": ("scipy_cblas_sgemv64_", "cblas_sgemv64_"),
             "dgemv": ("scipy_cblas_dgemv64_", "cblas_dgemv64_")}
    for folder in (os.path.join(root, os.pardir, "numpy.libs"), os.path.join(root, ".dylibs")):
        for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
            try:
                library = ctypes.CDLL(path)
            except OSError:
                continue
            found = [next((getattr(library, n) for n in options if hasattr(library, n)), None)
                     for options in names.values()]
            if all(f is not None for f in found):
                return [ctypes.cast(f, ctypes.c_void_p) for f in found]
    return None


def _open():
    check_cpu()
    library = ctypes.CDLL(os.path.join(HERE, MANIFEST["library"]))
    library.numbackend_model_open.restype = ctypes.c_void_p
    library.numbackend_model_open.argtypes = [ctypes.c_char_p]
    library.numbackend_model_predict.restype = ctypes.c_int
    library.numbackend_model_predict.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                 ctypes.c_void_p, ctypes.c_int]
    library.numbackend_model_error.restype = ctypes.c_char_p
    library.numbackend_model_error.argtypes = [ctypes.c_void_p]
    library.numbackend_model_set_blas.argtypes = [ctypes.c_void_p] * 4
    blas = _numpy_blas()
    if blas is not None:
        library.numbackend_model_set_blas(*blas)
    model = library.numbackend_model_open(os.path.join(HERE, MANIFEST["weights"]).encode())
    if not model:
        raise OSError(library.numbackend_model_error(None).decode(errors="replace"))
    return library, model


_library, _model = _open()


def _as_input(i, value):
    """Input ``i`` as a C-contiguous array of its dtype, checked."""
    entry = MANIFEST["inputs"][i]
    array = np.asarray(value)
    dtype = np.dtype(entry["dtype"])
    if array.ndim != len(entry["shape"]) or list(array.shape[1:]) != entry["shape"][1:]:
        shape = tuple(entry["shape"])
        raise ValueError(f"predict: input {i} ({entry['name']!r}) expects shape {shape} (None: "
                         f"the batch), got {array.shape}")
    if array.dtype != dtype and not (np.can_cast(array.dtype, dtype, "same_kind")
                                     or (array.dtype.kind in "biu" and dtype.kind in "iuf")):
        raise TypeError(f"predict: input {i} ({entry['name']!r}) has dtype {dtype}; cannot cast "
                        f"a {array.dtype} array to it")
    return np.ascontiguousarray(array, dtype)


def predict(x, batch_size=None, threads=None):
    """The model's outputs for the batch ``x`` (see the module's docstring);
    ``batch_size``: at most this many rows per call of the library."""
    inputs = MANIFEST["inputs"]
    values = list(x) if isinstance(x, (list, tuple)) else [x]
    if len(values) != len(inputs):
        raise ValueError(f"predict: the model has {len(inputs)} input(s), got {len(values)}")
    arrays = [_as_input(i, v) for i, v in enumerate(values)]
    rows = arrays[0].shape[0]
    if any(a.shape[0] != rows for a in arrays):
        raise ValueError("predict: the inputs differ in batch size: "
                         + ", ".join(str(a.shape) for a in arrays))
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"predict: batch_size must be a positive int, got {batch_size!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"predict: threads must be a positive int, got {threads!r}")
    outputs = [np.empty([rows] + e["shape"][1:], e["dtype"]) for e in MANIFEST["outputs"]]
    step = batch_size or max(rows, 1)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        ins = (ctypes.c_void_p * max(len(arrays), 1))(*[a[start:].ctypes.data for a in arrays])
        outs = (ctypes.c_void_p * max(len(outputs), 1))(*[o[start:].ctypes.data for o in outputs])
        status = _library.numbackend_model_predict(_model, end - start, ins, outs, threads or 0)
        if status != 0:
            message = _library.numbackend_model_error(_model).decode(errors="replace")
            kind, _, text = message.partition(": ")
            raise _ERRORS.get(kind, RuntimeError)(text if kind in _ERRORS else message)
    outputs = [_trimmed(o, e["trim"]) if "trim" in e else o
               for o, e in zip(outputs, MANIFEST["outputs"])]
    return outputs[0] if len(outputs) == 1 else outputs


def _trimmed(array, trim):
    """``array`` (an output of the whole batch) without the trailing positions
    along ``trim["axis"]`` that hold ``trim["pad"]`` in every row: an output
    whose size along that axis depends on the data, written at its bound with
    each row padded, cut to the batch's longest as the model gives it."""
    axis = trim["axis"]
    others = tuple(a for a in range(array.ndim) if a != axis)
    used = np.flatnonzero((array != trim["pad"]).any(axis=others))
    size = int(used[-1]) + 1 if used.size else 0
    return np.ascontiguousarray(array[(slice(None),) * axis + (slice(0, size),)])
