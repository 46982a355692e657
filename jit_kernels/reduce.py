"""Row reductions for fused kernels: sum, max, min, prod, any, all over x[:n].

A floating-point reduction vectorises only when the compiler may reorder it,
so each loop that accumulates floats is compiled with reassociation allowed.
These functions are called, never inlined, so the flags stay here and cannot
reach the exactly-rounded math of the kernels that call them.  The result of
a vectorised sum is deterministic for a given machine; it differs from a
sequential sum by rounding only.  max/min ignore NaN in their fast loop and
then look for NaN separately, so a NaN anywhere still gives NaN (as np.max).
"""
import numba
import numpy as np

_exact = numba.njit(cache=True, error_model="numpy", nogil=True)
_reordered = numba.njit(cache=True, error_model="numpy", nogil=True,
                        fastmath={"reassoc", "nsz", "contract"})
_reordered_nonan = numba.njit(cache=True, error_model="numpy", nogil=True,
                              fastmath={"reassoc", "nsz", "contract", "nnan"})


@_reordered
def row_sum(x, n):
    """sum(x[:n])."""
    s = x.dtype.type(0)
    for i in range(n):
        s += x[i]
    return s


@_reordered
def row_prod(x, n):
    """prod(x[:n])."""
    p = x.dtype.type(1)
    for i in range(n):
        p *= x[i]
    return p


@_exact
def _has_nan(x, n):
    found = False
    for i in range(n):
        found |= x[i] != x[i]
    return found


@_reordered_nonan
def _max_ignoring_nan(x, n):
    if n == 0:
        return x.dtype.type(-np.inf)
    m = x[0]  # not an infinity: integers have none
    for i in range(1, n):
        m = x[i] if x[i] > m else m  # noqa: FURB136 - a select vectorises; Numba's max() does not
    return m


@_reordered_nonan
def _min_ignoring_nan(x, n):
    if n == 0:
        return x.dtype.type(np.inf)
    m = x[0]  # not an infinity: integers have none
    for i in range(1, n):
        m = x[i] if x[i] < m else m  # noqa: FURB136 - a select vectorises; Numba's min() does not
    return m


@_exact
def row_max(x, n):
    """max(x[:n]); NaN if any element is NaN (like np.max); -inf when n == 0 (floats)."""
    if _has_nan(x, n):
        return x.dtype.type(np.nan)
    return _max_ignoring_nan(x, n)


@_exact
def row_min(x, n):
    """min(x[:n]); NaN if any element is NaN (like np.min); inf when n == 0 (floats)."""
    if _has_nan(x, n):
        return x.dtype.type(np.nan)
    return _min_ignoring_nan(x, n)


@_exact
def row_any(x, n):
    """True if any of x[:n] is non-zero."""
    found = False
    for i in range(n):
        found |= x[i] != 0
    return found


@_exact
def row_all(x, n):
    """True if all of x[:n] are non-zero."""
    ok = True
    for i in range(n):
        ok &= x[i] != 0
    return ok
