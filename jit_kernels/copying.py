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


@njit_cached(nogil=True)
def step_rows(sequence, t, lo, hi):
    """``sequence[t, lo:hi]``: a scan loop's slice of a sequence at step t, its
    rows lo:hi, by one call (Numba's slicing code, at each sequence of a loop,
    was much of the loop's own compile)."""
    return sequence[t, lo:hi]


@njit_cached(nogil=True)
def copy_step(stacked, t, lo, hi, value):
    """``stacked[t, lo:hi] = value`` (:func:`copy_into`): a scan loop's step
    value written into its stack."""
    copy_into(stacked[t, lo:hi], value)


@njit_cached(nogil=True)
def gather_rows(table, ids):
    """``np.take(table, ids, axis=0)`` for compiled code: the rows of ``table``
    (C-contiguous) picked by the integer array ``ids`` (C-contiguous), of shape
    ids.shape + table.shape[1:]; an id below 0 counts from the end, as
    numbackend's gather does.  IndexError where an id is outside
    [-len(table), len(table))."""
    rows = table.shape[0]
    lines = table.reshape((rows, -1))
    flat = ids.reshape(-1)
    out = np.empty((flat.size, lines.shape[1]), table.dtype)
    for i in range(flat.size):
        row = flat[i]
        if row < -rows or row >= rows:
            raise IndexError("jit_kernels.copying.gather_rows: an index is out of range for the "
                             "rows of the table")
        if row < 0:
            row += rows
        source = lines[row]
        target = out[i]
        for j in range(lines.shape[1]):
            target[j] = source[j]
    return out.reshape(ids.shape + table.shape[1:])
