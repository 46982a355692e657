"""Allocation advice for large arrays that kernels allocate themselves.

Numba allocates an array with plain ``malloc``.  Once other code has freed
large blocks (NumPy's temporaries), glibc gives that memory back to the
system, and the next large array of a kernel is fresh memory: writing a
16 MB output then takes 4096 page faults, which cost 5 ms on a 2-core VM
against a 3 ms kernel.  NumPy asks Linux to back its arrays of 4 MB and up
with 2 MB pages (``madvise(MADV_HUGEPAGE)``); ``prefer_huge_pages`` does the
same for an array just allocated in a kernel, before anything is written to
it.  Elsewhere, or where the system does not offer transparent huge pages,
it does nothing.
"""
import mmap
import sys

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

# NumPy's threshold: below it the pages saved are not worth the system call.
HUGE_PAGE_MIN_BYTES = 4 << 20
_PAGE = mmap.PAGESIZE
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None) if sys.platform.startswith("linux") else None


@intrinsic
def _madvise(typingctx, address, length, advice):
    """libc's ``madvise(address, length, advice)``; its result is ignored by callers
    (an error only means the advice was not taken)."""
    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [i8p, ir.IntType(64), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "madvise")
        return builder.call(fn, [builder.inttoptr(args[0], i8p), args[1], args[2]])
    return types.int32(types.uintp, types.uintp, types.int32), codegen


if _MADV_HUGEPAGE is not None:
    @numba.njit(inline="always")
    def prefer_huge_pages(a):
        """Advise 2 MB pages for the whole pages inside a large, still untouched array."""
        nbytes = a.size * a.itemsize
        if nbytes >= HUGE_PAGE_MIN_BYTES:
            start = (a.ctypes.data + np.uintp(_PAGE - 1)) & ~np.uintp(_PAGE - 1)
            end = (a.ctypes.data + np.uintp(nbytes)) & ~np.uintp(_PAGE - 1)
            _madvise(start, end - start, np.int32(_MADV_HUGEPAGE))
else:
    @numba.njit(inline="always")
    def prefer_huge_pages(a):
        """Nothing to advise on this system."""
