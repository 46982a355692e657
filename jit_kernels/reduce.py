"""Row reductions for fused kernels: sum, max, min, prod, any, all over a 1-D array.

Floating-point sums do not vectorise unless the compiler may reassociate, and
reassociation (fastmath) must not leak into the inlined math of the caller, so
the reductions keep eight partial accumulators by hand: LLVM packs them into
one vector register, and the result is deterministic.
"""
import numba
import numpy as np

_jit = numba.njit(cache=True, error_model="numpy", nogil=True)


@_jit
def row_sum(x, n):
    """sum(x[:n]) with eight partial sums."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = x.dtype.type(0)
    n8 = n - n % 8
    for i in range(0, n8, 8):
        s0 += x[i]
        s1 += x[i + 1]
        s2 += x[i + 2]
        s3 += x[i + 3]
        s4 += x[i + 4]
        s5 += x[i + 5]
        s6 += x[i + 6]
        s7 += x[i + 7]
    for i in range(n8, n):
        s0 += x[i]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@_jit
def row_prod(x, n):
    """prod(x[:n])."""
    p = x.dtype.type(1)
    for i in range(n):
        p *= x[i]
    return p


@_jit
def row_max(x, n):
    """max(x[:n]); NaN if any element is NaN (like np.max); -inf when n == 0."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = -np.inf
    nan = False
    n8 = n - n % 8
    for i in range(0, n8, 8):
        m0 = max(m0, x[i])
        m1 = max(m1, x[i + 1])
        m2 = max(m2, x[i + 2])
        m3 = max(m3, x[i + 3])
        m4 = max(m4, x[i + 4])
        m5 = max(m5, x[i + 5])
        m6 = max(m6, x[i + 6])
        m7 = max(m7, x[i + 7])
    for i in range(n8, n):
        m0 = max(m0, x[i])
    for i in range(n):
        nan |= x[i] != x[i]
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    return x.dtype.type(np.nan) if nan else x.dtype.type(m)


@_jit
def row_min(x, n):
    """min(x[:n]); NaN if any element is NaN (like np.min); inf when n == 0."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.inf
    nan = False
    n8 = n - n % 8
    for i in range(0, n8, 8):
        m0 = min(m0, x[i])
        m1 = min(m1, x[i + 1])
        m2 = min(m2, x[i + 2])
        m3 = min(m3, x[i + 3])
        m4 = min(m4, x[i + 4])
        m5 = min(m5, x[i + 5])
        m6 = min(m6, x[i + 6])
        m7 = min(m7, x[i + 7])
    for i in range(n8, n):
        m0 = min(m0, x[i])
    for i in range(n):
        nan |= x[i] != x[i]
    m = min(min(min(m0, m1), min(m2, m3)), min(min(m4, m5), min(m6, m7)))
    return x.dtype.type(np.nan) if nan else x.dtype.type(m)


@_jit
def row_any(x, n):
    """True if any of x[:n] is non-zero."""
    found = False
    for i in range(n):
        found |= x[i] != 0
    return found


@_jit
def row_all(x, n):
    """True if all of x[:n] are non-zero."""
    ok = True
    for i in range(n):
        ok &= x[i] != 0
    return ok


ROW_REDUCERS = {"sum": row_sum, "mean": row_sum, "prod": row_prod, "max": row_max,
                "min": row_min, "any": row_any, "all": row_all}
