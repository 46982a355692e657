"""Row reductions for fused kernels: sum, max, min, prod, any, all over x[:n].

A floating-point reduction vectorises only when the compiler may reorder it,
so each loop that accumulates floats is compiled with reassociation allowed.
These functions are called, never inlined, so the flags stay here and cannot
reach the exactly-rounded math of the kernels that call them.  The result of
a vectorised sum is deterministic for a given machine; it differs from a
sequential sum by rounding only.  max/min need no such flag: they use LLVM's
NaN-propagating maximum/minimum, which vectorise as they are.  A softmax's
shift (row_shift_max) need not see NaN at all, and takes a cheaper max.
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


def _select_intrinsic(kind, name, float_intrinsic, float_flags):
    """An intrinsic ``name(a, b)`` for max or min of two scalars of one type:
    for floats LLVM's ``float_intrinsic`` with the fast-math ``float_flags``,
    for integers and booleans the exact llvm.smax/umax (smin/umin)."""
    def typer(typingctx, a, b):
        if a != b or not isinstance(a, (types.Float, types.Integer, types.Boolean)):
            return None

        def codegen(context, builder, signature, args):
            lty = args[0].type
            flags = ()
            if isinstance(a, types.Float):
                function, flags = float_intrinsic, float_flags
            elif isinstance(a, types.Boolean) or not a.signed:
                function = f"llvm.u{kind}"
            else:
                function = f"llvm.s{kind}"
            fn = builder.module.declare_intrinsic(function, [lty], ir.FunctionType(lty, [lty, lty]))
            return builder.call(fn, args, fastmath=flags)
        return a(a, b), codegen
    typer.__name__ = name
    return intrinsic(typer)


# Row max and min, also called by kernels that fold a row's max or min into a
# loop of their own.  llvm.maximum/llvm.minimum propagate NaN (like np.maximum)
# and the loop vectoriser turns them into packed max/min without any fast-math
# flag, so a row max is one vectorised pass with NumPy's NaN rule.  They carry
# ``nsz``: of a tie of -0.0 and 0.0 either may come back (as from NumPy's own
# vectorised max), which spares x86 two of the five instructions per vector
# that order the zeros.
maximum = _select_intrinsic("max", "maximum", "llvm.maximum", ("nsz",))
minimum = _select_intrinsic("min", "minimum", "llvm.minimum", ("nsz",))

# max(a, b) for the shift of a softmax, one packed max a vector on x86.  A softmax
# (or log-softmax) only needs its shift to be the row's max where the row holds no
# NaN: a NaN anywhere makes the row's sum NaN, so every output of that row is NaN
# whatever the shift.  So floats use llvm.maxnum with ``nnan`` and ``nsz``, which
# x86 gives in one instruction where maximum takes three.  Where an operand is NaN,
# ``nnan`` makes the result poison: only the accumulator of a fold may carry it,
# and settled() must make it a value after the fold's loop, before anything else
# reads it.  Integers: the exact max.
shift_maximum = _select_intrinsic("max", "shift_maximum", "llvm.maxnum", ("nnan", "nsz"))


@intrinsic
def settled(typingctx, a):
    """``a``, or where ``a`` is poison (a :func:`shift_maximum` fold that met a NaN)
    some fixed value of its type: LLVM's freeze, after which the value is an
    ordinary one for all code that reads it."""
    if not isinstance(a, (types.Float, types.Integer, types.Boolean)):
        return None

    def codegen(context, builder, signature, args):
        return builder.call(_settle_function(builder.module, args[0].type), args)
    return a(a), codegen


def _settle_function(module, lty):
    """The function of ``module`` that freezes a value of type ``lty`` (llvmlite's
    builder has no freeze of its own).  It is never inlined: in its caller,
    LLVM would push the freeze back into the fold's loop and drop the loop's
    ``nnan`` to do so; a call's argument may be poison."""
    name = f"jit_kernels.settle.{lty}"
    if name in module.globals:
        return module.globals[name]
    function = ir.Function(module, ir.FunctionType(lty, [lty]), name)
    function.linkage = "linkonce_odr"
    function.attributes.add("noinline")
    builder = ir.IRBuilder(function.append_basic_block())
    frozen = ir.Instruction(builder.block, lty, "freeze", [function.args[0]])
    builder._insert(frozen)
    builder.ret(frozen)
    return function


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
def row_shift_max(x, n):
    """The shift of a softmax of x[:n]: max(x[:n]) where no element is NaN, and
    some value (not always NaN) where one is, the softmax of that row being NaN
    anyway (see :func:`shift_maximum`); -inf when n == 0 (floats)."""
    if n == 0:
        return x.dtype.type(-np.inf)
    m = x[0]
    for i in range(1, n):
        m = shift_maximum(m, x[i])
    return settled(m)


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
