"""``dst[...] = src`` for compiled code, without Numba's slice assignment.

Numba compiles an assignment of an array to a slice with an error path that
formats both arrays' shapes into its message: string formatting, compiled once
per pair of ranks in every process with a cold cache, which cost seconds where
the rest of a kernel or a scan's loop compiled in a fraction of that.
:func:`copy_into` checks the shapes itself and raises a fixed message.
"""
import numpy as np

from .compiling import njit_cached


@njit_cached(nogil=True)
def copy_into(dst, src):
    """``dst[...] = src`` for arrays of one shape (no broadcasting) of rank 1 or
    more, of any layout; ValueError where the shapes differ."""
    if dst.shape != src.shape:
        raise ValueError("jit_kernels.copying.copy_into: the arrays differ in shape")
    if dst.size == 0:
        return
    last = dst.shape[-1]
    for index in np.ndindex(dst.shape[:-1]):  # each line along the last axis
        dst_line, src_line = dst[index], src[index]
        for i in range(last):
            dst_line[i] = src_line[i]
