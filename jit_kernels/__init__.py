"""Precompiled Numba kernels on plain NumPy arrays.

This package knows nothing of numbackend's graph: every function takes and
returns NumPy arrays (or fills output arrays passed in).  Kernels are compiled
with :func:`njit_cached` (compiling.py), so a second process loads them from
disk.

Importing the package loads neither NumPy's kernels nor Numba: numbackend
reads :mod:`jit_kernels.tuning` when it is imported, and Numba loads with the
first kernel module.  The names below come from their modules on first use.
"""
import importlib as _importlib

_LAZY = {
    "njit_cached": "compiling",
    "njit_cached_twins": "compiling",
    "has_source_file": "compiling",
    "package_stamp": "compiling",
    "seed_dir": "compiling",
    "saving_to": "compiling",
    "fork_gate": "fork",
    "parallel_ok": "fork",
    "prefer_vector_width": "compiling",
    "arrays_apart": "compiling",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jit_kernels' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
