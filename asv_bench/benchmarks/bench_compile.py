"""Compile time: each fresh process starts with empty caches.

- ``LibraryCompile.timeraw_<module>``: compiling the manifest's signatures
  (jit_kernels/signatures.txt) of one jit_kernels module, what ``python -m
  numbackend warmup`` does for it.
- ``WorkloadCompile.timeraw_cold_<workload>``: a workload of
  compile_workloads.py (W1-W7, the Keras models) with empty caches, library
  kernels included; ``timeraw_library_cached_<workload>``: with only the
  model's kernel cache empty, the library's as the machine has it (after a
  warm-up: only the model's own kernels compile).

A process's imports count in each time (as they do for a user).
"""
import os

from jit_kernels import manifest

from .compile_workloads import WORKLOADS

_SUITE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_EMPTY_KERNEL_CACHE = ("import os, tempfile; "
                       "os.environ['NUMBACKEND_CACHE_DIR'] = tempfile.mkdtemp(prefix='numbackend-asv-'); ")
_UNREAD_PACKAGE_SEED = "os.environ['NUMBACKEND_PACKAGE_SEED'] = '0'; "  # the package's seed left unread


class LibraryCompile:
    """The manifest's signatures of one jit_kernels module, compiled in a fresh process."""

    repeat = 1  # each sample compiles for seconds to minutes
    timeout = 900


class WorkloadCompile:
    """A workload's builds and calls in a fresh process, with empty caches."""

    repeat = 1
    timeout = 900


def _add_benchmarks():
    for module in sorted({name.split(".")[0] for name, _ in manifest.read_manifest()}):
        code = (_EMPTY_KERNEL_CACHE + _UNREAD_PACKAGE_SEED + "from jit_kernels import manifest; "
                f"manifest.compile_entries([e for e in manifest.read_manifest() "
                f"if e[0].startswith({module + '.'!r})])")
        setattr(LibraryCompile, f"timeraw_{module}", lambda self, code=code: code)
    for name in WORKLOADS:
        run = (f"import sys; sys.path.insert(0, {_SUITE!r}); "
               f"from benchmarks.compile_workloads import run; run({name!r})")
        cold = _EMPTY_KERNEL_CACHE + _UNREAD_PACKAGE_SEED + run
        cached = _EMPTY_KERNEL_CACHE + run
        setattr(WorkloadCompile, f"timeraw_cold_{name}", lambda self, code=cold: code)
        setattr(WorkloadCompile, f"timeraw_library_cached_{name}", lambda self, code=cached: code)


_add_benchmarks()
