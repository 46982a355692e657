"""Row reductions for fused kernels: sum, max, min, prod, any, all over x[:n].

A floating-point reduction vectorises only when the compiler may reorder it,
so each loop that accumulates floats is compiled with reassociation allowed.
These functions are called, never inlined, so the flags stay here and cannot
reach the exactly-rounded math of the kernels that call them.  The result of
a vectorised sum is deterministic for a given machine; it differs from a
sequential sum by rounding only.  max/min need no such flag: they use LLVM's
NaN-propagating maximum/minimum, which vectorise as they are.
"""
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from .compiling import njit_cached

_exact = njit_cached(error_model="numpy", nogil=True)
_reordered = njit_cached(error_model="numpy", nogil=True,
                          fastmath={"reassoc", "nsz", "contract"})


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


def _select_intrinsic(kind):
    """An intrinsic ``f(a, b)`` for max or min of two scalars of one type.

    Floats use llvm.maximum/llvm.minimum, which propagate NaN (like np.maximum)
    and which the loop vectoriser turns into packed max/min without any
    fast-math flag, so a row max is one vectorised pass with NumPy's NaN rule.
    They carry ``nsz``: of a tie of -0.0 and 0.0 either may come back (as from
    NumPy's own vectorised max), which spares x86 two of the five instructions
    per vector that order the zeros.
    """
    def typer(typingctx, a, b):
        if a != b or not isinstance(a, (types.Float, types.Integer, types.Boolean)):
            return None

        def codegen(context, builder, signature, args):
            lty = args[0].type
            flags = ()
            if isinstance(a, types.Float):
                name = f"llvm.{kind}imum"
                flags = ("nsz",)
            elif isinstance(a, types.Boolean) or not a.signed:
                name = f"llvm.u{kind}"
            else:
                name = f"llvm.s{kind}"
            fn = builder.module.declare_intrinsic(name, [lty], ir.FunctionType(lty, [lty, lty]))
            return builder.call(fn, args, fastmath=flags)
        return a(a, b), codegen
    typer.__name__ = f"{kind}imum"
    return intrinsic(typer)


# also called by kernels that fold a row's max or min into a loop of their own
maximum = _select_intrinsic("max")
minimum = _select_intrinsic("min")


@_exact
def row_max(x, n):
    """max(x[:n]); NaN if any element is NaN (like np.max); -inf when n == 0 (floats)."""
    if n == 0:
        return x.dtype.type(-np.inf)
    m = x[0]
    for i in range(1, n):
        m = maximum(m, x[i])
    return m


@_exact
def row_min(x, n):
    """min(x[:n]); NaN if any element is NaN (like np.min); inf when n == 0 (floats)."""
    if n == 0:
        return x.dtype.type(np.inf)
    m = x[0]
    for i in range(1, n):
        m = minimum(m, x[i])
    return m


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
