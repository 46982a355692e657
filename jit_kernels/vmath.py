"""Vectorisable scalar math for generated element-wise kernels.

Numba lowers ``math.exp``, ``math.tanh``, ``np.log``... to calls into libm.
LLVM cannot vectorise a loop that calls them (the pip build of llvmlite has no
SVML), so a fused loop such as ``out[i] = tanh(a[i]*b[i] + c[i])`` runs one
element at a time, many times slower than it could.  This module provides
the same functions written as plain arithmetic: a range reduction, a
polynomial, a rebuild of the exponent by bit manipulation, and selects for the
special cases.  Once inlined into a loop, LLVM turns them into packed AVX
instructions.

Contract of every function here:

* declared ``@numba.njit(inline="always", error_model="numpy")``.
  ``inline="always"`` inlines at Numba IR level, so the loop vectoriser sees
  straight-line code; ``error_model="numpy"`` removes the division-by-zero
  check that would otherwise put a branch in the loop.  Call them from
  kernels compiled with ``error_model="numpy"`` too.
* inlined code takes the caller's fast-math flags.  ``fastmath={"contract"}``
  (fused multiply-add) is safe and was measured to keep the accuracy below;
  the other flags are not: ``reassoc`` folds away the rounding tricks
  (``(x + C) - C``), ``nnan``/``ninf`` remove the special-case selects.
* branch free: special cases are selects (``a if cond else b`` and float
  ``min``/``max`` on values already computed), no libm call, no loop.  Only
  operations that vectorise are used (fabs, rint, floor, copysign, fma, bit
  casts and 32/64-bit integer arithmetic).
* ``*_f32`` take and return float32 and compute in float32 (all constants are
  ``np.float32``), except ``pow_f32``, which works in float64 internally the
  way glibc's ``powf`` does: ``y * log(x)`` needs about 8 more bits than
  float32 has.  ``*_f64`` take and return float64.
* special values follow NumPy: nan propagates, overflow to inf and underflow
  to 0 happen at NumPy's thresholds, exp(-inf) = 0, log(0) = -inf,
  log(x < 0) = nan, tanh(+-inf) = +-1, sigmoid(+-inf) = 1/0, sin/cos(inf) =
  nan, odd functions keep the sign of zero, and ``pow`` has C99/NumPy
  semantics (negative base with an integral exponent works, with a
  non-integral one gives nan; pow(x, 0) = pow(1, y) = 1 even for nan).

Accuracy, measured by ``tests/test_vmath.py`` against NumPy in float64 (for
float32) or long double (for float64), in ulps of the exact result: for a
tiny result that is the error relative to the result itself, and denormal
results (produced with gradual underflow) are counted in denormal steps.
Largest errors seen over the whole range (float32: every 13th bit pattern
as well as the test's grids):

    function   exp   expm1  log   log1p  tanh  sigmoid  softplus  sin   cos   pow
    float32    0.96  1.46   0.83  0.86   5.90  2.34     1.60      2.41  2.33  0.5
    float64    0.94  1.90   0.77  0.77   2.49  2.17     1.49      2.02  1.92  1.7

exp_nonpositive (for softmax, whose arguments are x - max <= 0) is exp with
one scaling by 2**n instead of two: it equals exp wherever exp(x) is a normal
number and flushes smaller results to 0.

pow_f32 is correctly rounded but for rare double roundings.  pow_f64 carries
log|x| in double-double and multiplies it by y with an fma; its error grows
slowly with |y log x| (1.7 ulp near the overflow limit).  rint is exact.

sin/cos reduce the argument by pi/2 in four parts (Cody-Waite).  The
reduction, and the accuracy above, hold for |x| < 51471 (float32) and
|x| < 1.6e6 (float64; measured fine up to 3e6).  Past that the error grows
with |x| (float32: about 13 ulp at 1e5, no correct digits from about 1e6 on;
float64: none from about 1e7 on), but the reduced argument is clamped to the
polynomials' interval, so the result always stays in [-1, 1].

``FUNCTIONS`` maps ``(name, dtype name)`` to the function, for code
generators: ``FUNCTIONS["tanh", "float32"]`` is ``tanh_f32``.
"""

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

# Not cached: the code lives in the callers' caches, and a cache of its own costs
# a file-system check per function each time this module loads.
vectorisable = numba.njit(inline="always", error_model="numpy")
"""Decorator for the scalar functions of this module (see the module docstring)."""


# ---------------------------------------------------------------------------
# Bit casts.  Numba has no scalar bit cast; these reinterpret the bits of a
# value as another type of the same width (no conversion, no instruction).


def _bitcast_intrinsic(from_type, to_type, doc):
    @intrinsic
    def bitcast(typingctx, value):
        if isinstance(from_type, types.Integer):
            if not isinstance(value, types.Integer):
                return None
        elif value != from_type:
            return None

        def codegen(context, builder, signature, args):
            # Integers of another width are first converted to from_type.
            source = context.cast(builder, args[0], signature.args[0], from_type)
            return builder.bitcast(source, context.get_value_type(to_type))

        return to_type(value), codegen

    bitcast.__doc__ = doc
    return bitcast


f32_as_i32 = _bitcast_intrinsic(types.float32, types.int32, "Bits of a float32 as an int32.")
i32_as_f32 = _bitcast_intrinsic(types.int32, types.float32, "An int32's bits as a float32.")
f64_as_i64 = _bitcast_intrinsic(types.float64, types.int64, "Bits of a float64 as an int64.")
i64_as_f64 = _bitcast_intrinsic(types.int64, types.float64, "An int64's bits as a float64.")


@intrinsic
def fma(typingctx, a, b, c):
    """a*b + c with a single rounding (llvm.fma: one instruction with FMA3)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


# ---------------------------------------------------------------------------
# float32 constants

_F32_INF = np.float32(np.inf)
_F32_NAN = np.float32(np.nan)
_F32_MIN_NORMAL = np.float32(np.finfo(np.float32).tiny)
_F32_TWO_23 = np.float32(2.0**23)

_F32_LOG2E = np.float32(1.442695)
# ln 2 split so that n * _F32_LN2_HI is exact for |n| < 256 (16 significant bits).
_F32_LN2_HI = np.float32(0.693145751953125)
_F32_LN2_LO = np.float32(1.4286068e-06)
# Adding 1.5 * 2**23 rounds a float32 of magnitude < 2**22 to an integer, which
# then sits in the low mantissa bits: bits(t) - _F32_SHIFTER_BITS is that integer.
_F32_SHIFTER = np.float32(12582912.0)
_F32_SHIFTER_BITS = 0x4B400000

# Beyond these, exp overflows to inf (exp(88.7228394) > FLT_MAX) or rounds to
# 0 (exp(-104) < 2**-150); clamping keeps the exponent arithmetic in range.
_F32_EXP_MAX_ARG = np.float32(89.0)
_F32_EXP_MIN_ARG = np.float32(-104.0)
# exp_nonpositive_f32 clamps here: n = round(x log2 e) stays >= -127.
_F32_EXP_FLUSH_ARG = np.float32(-88.0)
# expm1(x) rounds to -1 for x < -17.33.
_F32_EXPM1_MIN_ARG = np.float32(-18.0)

# Minimax coefficients (relative error) for exp(r) = 1 + r + r^2 P(r) on
# |r| <= ln(2)/2, |error| < 2**-28.
_F32_EXP_P = (
    np.float32(0.4999999403953552),
    np.float32(0.16666515171527863),
    np.float32(0.041668470948934555),
    np.float32(0.008369321003556252),
    np.float32(0.0013811577809974551),
)
# expm1(r) = r + r^2 P(r) on |r| <= ln(2)/2, |relative error| < 2**-31.
_F32_EXPM1_P = (
    np.float32(0.5),
    np.float32(0.1666666567325592),
    np.float32(0.04166635125875473),
    np.float32(0.008333394303917885),
    np.float32(0.0013941507786512375),
    np.float32(0.00019843813788611442),
)
# tanh(x) = x P(z) / Q(z), z = x^2, for |x| <= _F32_TANH_CLAMP (fitted to
# |relative error| < 2**-26.8; float32 evaluation brings it to 5.9 ulp).  Past
# the clamp tanh rounds to +-1 in float32.
_F32_TANH_CLAMP = np.float32(9.2)
_F32_TANH_P = (
    np.float32(1.0),
    np.float32(0.13075391948223114),
    np.float32(0.003094322746619582),
    np.float32(1.1053281923523173e-05),
    np.float32(-1.9813654716926976e-08),
    np.float32(5.078887657661291e-11),
    np.float32(-7.975699500796171e-14),
)
_F32_TANH_Q = (
    np.float32(1.0),
    np.float32(0.46408718824386597),
    np.float32(0.02445683628320694),
    np.float32(0.000253210193477571),
)
# log(1 + f) = 2 atanh(s) = 2s + s z P(z), s = f / (2 + f), z = s^2, for
# 1 + f in [sqrt(1/2), sqrt(2)); |relative error| < 2**-30.
_F32_LOG_P = (
    np.float32(0.6666678190231323),
    np.float32(0.3997671902179718),
    np.float32(0.298957496881485),
)
_F32_SQRT_HALF_BITS = 0x3F3504F3
_F32_ONE_BITS = 0x3F800000
_F32_MANTISSA_MASK = 0x007FFFFF

# pi/2 in four parts, the first three of at most 9 significant bits so that
# n * part is exact for |n| < 2**15, i.e. |x| < 51471.
_F32_TWO_OVER_PI = np.float32(0.63661975)
_F32_PIO2_1 = np.float32(1.5703125)
_F32_PIO2_2 = np.float32(0.00048351288)
_F32_PIO2_3 = np.float32(3.138557e-07)
_F32_PIO2_4 = np.float32(6.0771006e-11)
# Bound on the reduced argument (a little above pi/4): the polynomials below
# are fitted up to it, and clamping to it keeps huge arguments in [-1, 1].
_F32_TRIG_MAX_REDUCED = np.float32(0.8)
# sin(r) = r + r^3 P(r^2), |relative error| < 2**-37 on |r| <= 0.8.
_F32_SIN_P = (
    np.float32(-0.1666666716337204),
    np.float32(0.008333329111337662),
    np.float32(-0.00019839168817270547),
    np.float32(2.71677527052816e-06),
)
# cos(r) = 1 - r^2/2 + r^4 P(r^2), |relative error| < 2**-32 on |r| <= 0.8.
_F32_COS_P = (
    np.float32(0.04166664183139801),
    np.float32(-0.001388720003888011),
    np.float32(2.4419821784249507e-05),
)


# ---------------------------------------------------------------------------
# float32 helpers


@vectorisable
def _pow2_f32(n):
    """2**n as a float32 for an integer n in [-126, 127], built from its bits."""
    return i32_as_f32((n + 127) << 23)


@vectorisable
def _ldexp_f32(value, n):
    """value * 2**n for n in [-252, 254].

    Two factors so that neither over- nor underflows by itself; a denormal
    result is rounded once, by the second multiplication.
    """
    half = n >> 1
    return value * _pow2_f32(half) * _pow2_f32(n - half)


@vectorisable
def _reduce_ln2_f32(x):
    """Split x = n ln2 + r with n integral and |r| <= ln2/2.

    Returns (n as an integer, r).  x must be within +-150 ln2 or nan;
    nan gives a nan r and a meaningless n, no undefined behaviour.
    """
    shifted = x * _F32_LOG2E + _F32_SHIFTER
    n = shifted - _F32_SHIFTER
    n_int = f32_as_i32(shifted) - _F32_SHIFTER_BITS
    # n * _F32_LN2_HI is exact and close to x, so the first subtraction is exact.
    r = (x - n * _F32_LN2_HI) - n * _F32_LN2_LO
    return n_int, r


@vectorisable
def _expm1_poly_f32(r):
    """expm1(r) for |r| <= ln2/2."""
    c = _F32_EXPM1_P
    p = c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * (c[4] + r * c[5]))))
    return r + r * r * p


@vectorisable
def _log_mantissa_f32(bits):
    """Split a positive normal float32, given by its bits, into x = 2**k (1 + f).

    1 + f is in [sqrt(1/2), sqrt(2)) so that log(1 + f) is small and its
    polynomial accurate.  Returns (k as float32, f).
    """
    # Offsetting by bits(1) - bits(sqrt(1/2)) moves the exponent boundary from
    # 1 to sqrt(1/2).
    shifted = bits + (_F32_ONE_BITS - _F32_SQRT_HALF_BITS)
    k = (shifted >> 23) - 127
    mantissa = i32_as_f32((shifted & _F32_MANTISSA_MASK) + _F32_SQRT_HALF_BITS)
    return np.float32(k), mantissa - np.float32(1.0)


@vectorisable
def _log1p_reduced_f32(f, k, correction):
    """log(2**k (1 + f) + correction) for 1 + f in [sqrt(1/2), sqrt(2)).

    Written as f - f^2/2 + s (f^2/2 + R) (as in fdlibm) so that the largest
    terms, f and k ln2, are added last and exactly.
    """
    s = f / (np.float32(2.0) + f)
    z = s * s
    c = _F32_LOG_P
    r = z * (c[0] + z * (c[1] + z * c[2]))
    half_f_squared = np.float32(0.5) * f * f
    return (
        s * (half_f_squared + r)
        + (k * _F32_LN2_LO + correction)
        - half_f_squared
        + f
        + k * _F32_LN2_HI
    )


@vectorisable
def _reduce_pio2_f32(x):
    """Split x = n pi/2 + r.  Returns (n mod 4 as float32, r).

    For nan or inf both are nan; past the exact range r is clamped to
    +-_F32_TRIG_MAX_REDUCED so the polynomials stay bounded.
    """
    n = np.rint(x * _F32_TWO_OVER_PI)
    r = x - n * _F32_PIO2_1
    r = r - n * _F32_PIO2_2
    r = r - n * _F32_PIO2_3
    r = r - n * _F32_PIO2_4
    r = max(min(r, _F32_TRIG_MAX_REDUCED), -_F32_TRIG_MAX_REDUCED)  # nan stays nan
    # n mod 4 in floating point: exact for every n, no integer overflow.
    quadrant = n - np.float32(4.0) * np.floor(n * np.float32(0.25))
    return quadrant, r


@vectorisable
def _sin_poly_f32(r, z):
    """sin(r) for |r| <= 0.8, z = r*r."""
    c = _F32_SIN_P
    return r + r * z * (c[0] + z * (c[1] + z * (c[2] + z * c[3])))


@vectorisable
def _cos_poly_f32(z):
    """cos(r) for |r| <= 0.8, z = r*r."""
    c = _F32_COS_P
    return np.float32(1.0) - np.float32(0.5) * z + z * z * (c[0] + z * (c[1] + z * c[2]))


# ---------------------------------------------------------------------------
# float32 functions


@vectorisable
def exp_f32(x):
    """exp(x) for float32."""
    # Python's min/max keep a nan first argument (and vectorise to vminps/vmaxps).
    x = max(min(x, _F32_EXP_MAX_ARG), _F32_EXP_MIN_ARG)
    n_int, r = _reduce_ln2_f32(x)
    c = _F32_EXP_P
    p = c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * c[4])))
    return _ldexp_f32(np.float32(1.0) + (r + r * r * p), n_int)


@vectorisable
def exp_nonpositive_f32(x):
    """exp(x) for float32 x <= 0 (a softmax's x - max), flushing tiny results to 0.

    One multiplication by 2**n instead of exp_f32's two: where n would be
    -127 (x < -87.68) the bit pattern of 2**n is that of 0.0, so the result
    is 0 instead of a denormal; above that it is exp_f32's, up to x = 88.
    """
    x = max(x, _F32_EXP_FLUSH_ARG)  # nan stays nan
    n_int, r = _reduce_ln2_f32(x)
    c = _F32_EXP_P
    p = c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * c[4])))
    return (np.float32(1.0) + (r + r * r * p)) * i32_as_f32((n_int + 127) << 23)


@vectorisable
def expm1_f32(x):
    """exp(x) - 1 for float32, accurate relative to the result near 0."""
    clamped = max(min(x, _F32_EXP_MAX_ARG), _F32_EXPM1_MIN_ARG)  # nan stays nan
    n_int, r = _reduce_ln2_f32(clamped)
    # expm1(x) = 2**n (expm1(r) + 1 - 2**-n); 1 - 2**-n is 1 in float32 for n > 24.
    n_small = min(n_int, 25)
    y = _expm1_poly_f32(r) + (np.float32(1.0) - _pow2_f32(-n_small))
    result = _ldexp_f32(y, n_int)
    return x if x == np.float32(0.0) else result  # keeps the sign of zero


@vectorisable
def log_f32(x):
    """Natural logarithm for float32: log(0) = -inf, log(x < 0) = nan."""
    # Denormals are scaled into the normal range so the exponent field is right.
    is_denormal = x < _F32_MIN_NORMAL
    scaled = x * _F32_TWO_23 if is_denormal else x
    k, f = _log_mantissa_f32(f32_as_i32(scaled))
    k = k - np.float32(23.0) if is_denormal else k
    result = _log1p_reduced_f32(f, k, np.float32(0.0))
    result = result if x < _F32_INF else x  # inf and nan
    result = -_F32_INF if x == np.float32(0.0) else result
    return _F32_NAN if x < np.float32(0.0) else result


@vectorisable
def log1p_f32(x):
    """log(1 + x) for float32, accurate relative to the result near 0."""
    u = np.float32(1.0) + x
    k, f = _log_mantissa_f32(f32_as_i32(u))
    # u is rounded; log(1 + x) = log(u) + (1 + x - u)/u to first order.  The
    # rounding error 1 + x - u is computed exactly with the larger operand
    # first; it is negligible once u >= 2**25.
    error = np.float32(1.0) - (u - x) if k >= np.float32(2.0) else x - (u - np.float32(1.0))
    correction = error / u if k < np.float32(25.0) else np.float32(0.0)
    result = _log1p_reduced_f32(f, k, correction)
    result = result if x < _F32_INF else x  # inf and nan
    result = x if x == np.float32(0.0) else result  # keeps the sign of zero
    result = -_F32_INF if x == np.float32(-1.0) else result
    return _F32_NAN if x < np.float32(-1.0) else result


@vectorisable
def tanh_f32(x):
    """Hyperbolic tangent for float32."""
    # A rational function, as Eigen and XLA (and so TensorFlow on CPUs) use for
    # float32: much faster than the expm1 form (tanh_f64) at up to 5.9 ulp
    # instead of 2.5.  Python's min/max keep a nan first argument; x = +-0 and
    # tiny x give x exactly (P(0) = Q(0) = 1).
    y = max(min(x, _F32_TANH_CLAMP), -_F32_TANH_CLAMP)
    z = y * y
    p, q = _F32_TANH_P, _F32_TANH_Q
    numerator = p[0] + z * (p[1] + z * (p[2] + z * (p[3] + z * (p[4] + z * (p[5] + z * p[6])))))
    denominator = q[0] + z * (q[1] + z * (q[2] + z * q[3]))
    # Rounding can take the quotient a few ulp past 1: clamp it (nan stays nan).
    return min(max(y * numerator / denominator, np.float32(-1.0)), np.float32(1.0))


@vectorisable
def sigmoid_f32(x):
    """Logistic function 1 / (1 + exp(-x)) for float32."""
    # With e = exp(-|x|) <= 1 nothing overflows: sigmoid(x) = 1/(1+e) for
    # x >= 0 and e/(1+e) for x < 0, which stays accurate down to denormals.
    e = exp_f32(-abs(x))
    numerator = np.float32(1.0) if x >= np.float32(0.0) else e
    return numerator / (np.float32(1.0) + e)


@vectorisable
def softplus_f32(x):
    """log(1 + exp(x)) for float32, computed as max(x, 0) + log1p(exp(-|x|))."""
    positive_part = max(x, np.float32(0.0))
    return positive_part + log1p_f32(exp_f32(-abs(x)))


@vectorisable
def sin_f32(x):
    """Sine for float32 (see the module docstring for the argument range)."""
    quadrant, r = _reduce_pio2_f32(x)
    z = r * r
    sin_r = _sin_poly_f32(r, z)
    cos_r = _cos_poly_f32(z)
    odd = (quadrant == np.float32(1.0)) | (quadrant == np.float32(3.0))
    result = cos_r if odd else sin_r
    result = -result if quadrant >= np.float32(2.0) else result
    return x if x == np.float32(0.0) else result  # keeps the sign of zero


@vectorisable
def cos_f32(x):
    """Cosine for float32 (see the module docstring for the argument range)."""
    quadrant, r = _reduce_pio2_f32(x)
    z = r * r
    sin_r = _sin_poly_f32(r, z)
    cos_r = _cos_poly_f32(z)
    odd = (quadrant == np.float32(1.0)) | (quadrant == np.float32(3.0))
    result = sin_r if odd else cos_r
    negative = (quadrant == np.float32(1.0)) | (quadrant == np.float32(2.0))
    return -result if negative else result


@vectorisable
def pow_f32(x, y):
    """x**y for float32 with NumPy semantics, computed in float64."""
    x64 = np.float64(x)
    y64 = np.float64(y)
    magnitude = exp_f64(y64 * log_f64(abs(x64)))
    return np.float32(_pow_special_cases(x64, y64, magnitude))


@vectorisable
def rint_f32(x):
    """Round to the nearest integer, halves to even (np.round / np.rint)."""
    return np.rint(x)


# ---------------------------------------------------------------------------
# float64 constants

_F64_INF = np.inf
_F64_NAN = np.nan
_F64_MIN_NORMAL = np.finfo(np.float64).tiny
_F64_TWO_54 = 2.0**54

_F64_LOG2E = 1.4426950408889634
# ln 2 split so that n * _F64_LN2_HI is exact for |n| < 2**21 (32 bits).
_F64_LN2_HI = 0.6931471803691238
_F64_LN2_LO = 1.9082149292705877e-10
# 1.5 * 2**52: see _F32_SHIFTER.
_F64_SHIFTER = 6755399441055744.0
_F64_SHIFTER_BITS = 0x4338000000000000

# exp(709.7827128933840) is the largest finite result; exp(-746) rounds to 0.
_F64_EXP_MAX_ARG = 710.0
_F64_EXP_MIN_ARG = -746.0
# exp_nonpositive_f64 clamps here: n = round(x log2 e) stays >= -1023.
_F64_EXP_FLUSH_ARG = -709.0
# expm1(x) rounds to -1 for x < -37.43.
_F64_EXPM1_MIN_ARG = -38.0

# exp(r) = 1 + r + r^2 P(r) on |r| <= ln(2)/2, |relative error| < 2**-63.
_F64_EXP_P = (
    0.5,
    0.16666666666666685,
    0.04166666666666603,
    0.008333333333315894,
    0.0013888888889136764,
    0.00019841269899249894,
    2.4801586897103238e-05,
    2.755723196072647e-06,
    2.7557599322557155e-07,
    2.5113059231494373e-08,
    2.082316915658928e-09,
)
# expm1(r) = r + r^2 P(r) on |r| <= ln(2)/2, |relative error| < 2**-61.
_F64_EXPM1_P = (
    0.5,
    0.16666666666666677,
    0.04166666666666649,
    0.00833333333332087,
    0.0013888888888971102,
    0.00019841269888311978,
    2.4801587158008193e-05,
    2.7557241776668983e-06,
    2.7557412764866976e-07,
    2.510995771602707e-08,
    2.0872899243610974e-09,
)
# log(1 + f) = 2s + (2/3) s^3 + s^5 P(z), s = f / (2 + f), z = s^2,
# |relative error| < 2**-63.  2/3 is kept apart, as a double-double, for pow.
_F64_TWO_THIRDS = 0.6666666666666666
_F64_TWO_THIRDS_LO = 3.700743415417188e-17
_F64_LOG_P = (
    0.4000000000000014,
    0.28571428571213975,
    0.22222222311594989,
    0.18181802768153013,
    0.15385924231668618,
    0.13275522995507352,
    0.13031225243198633,
)
_F64_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD
_F64_ONE_BITS = 0x3FF0000000000000
_F64_MANTISSA_MASK = 0x000FFFFFFFFFFFFF

# pi/2 in four parts of 33 bits (as in fdlibm): n * part is exact for
# |n| < 2**20, i.e. |x| < 1.6e6.
_F64_TWO_OVER_PI = 0.6366197723675814
_F64_PIO2_1 = 1.5707963267341256
_F64_PIO2_2 = 6.077100506303966e-11
_F64_PIO2_3 = 2.0222662487111665e-21
_F64_PIO2_4 = 8.4784276603689e-32
_F64_TRIG_MAX_REDUCED = 0.8
# sin(r) = r + r^3 P(r^2), |relative error| < 2**-66 on |r| <= 0.8.
_F64_SIN_P = (
    -0.16666666666666666,
    0.00833333333333333,
    -0.0001984126984126156,
    2.75573192169406e-06,
    -2.505210547367154e-08,
    1.605842056956648e-10,
    -7.580609281469366e-13,
)
# cos(r) = 1 - r^2/2 + r^4 P(r^2), |relative error| < 2**-61 on |r| <= 0.8.
_F64_COS_P = (
    0.04166666666666666,
    -0.001388888888888365,
    2.4801587295052788e-05,
    -2.7557315802391046e-07,
    2.087589623455092e-09,
    -1.1367348215662046e-11,
)


# ---------------------------------------------------------------------------
# float64 helpers


@vectorisable
def _horner11(r, c):
    """c[0] + c[1] r + ... + c[10] r^10."""
    high = c[6] + r * (c[7] + r * (c[8] + r * (c[9] + r * c[10])))
    return c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * (c[4] + r * (c[5] + r * high)))))


@vectorisable
def _pow2_f64(n):
    """2**n as a float64 for an integer n in [-1022, 1023], built from its bits."""
    return i64_as_f64((n + 1023) << 52)


@vectorisable
def _ldexp_f64(value, n):
    """value * 2**n for n in [-2044, 2046] (see _ldexp_f32)."""
    half = n >> 1
    return value * _pow2_f64(half) * _pow2_f64(n - half)


@vectorisable
def _reduce_ln2_f64(x, tail):
    """Split x + tail = n ln2 + r, |r| <= ln2/2 (see _reduce_ln2_f32).

    tail is a small correction to x (0 for exp; the low part of y*log(x) in pow).
    """
    shifted = x * _F64_LOG2E + _F64_SHIFTER
    n = shifted - _F64_SHIFTER
    n_int = f64_as_i64(shifted) - _F64_SHIFTER_BITS
    r = (x - n * _F64_LN2_HI) - (n * _F64_LN2_LO - tail)
    return n_int, r


@vectorisable
def _exp_with_tail_f64(x, tail):
    """exp(x + tail) for |tail| <= ulp(x)."""
    clamped = max(min(x, _F64_EXP_MAX_ARG), _F64_EXP_MIN_ARG)  # nan stays nan
    # Past the clamp the result is inf or 0 whatever the tail, which may be
    # large there (ulp(1e30) is 1e14).
    tail = tail if clamped == x else 0.0
    n_int, r = _reduce_ln2_f64(clamped, tail)
    return _ldexp_f64(1.0 + (r + r * r * _horner11(r, _F64_EXP_P)), n_int)


@vectorisable
def _log_mantissa_f64(bits):
    """Split a positive normal float64 into 2**k (1 + f), see _log_mantissa_f32."""
    shifted = bits + (_F64_ONE_BITS - _F64_SQRT_HALF_BITS)
    k = (shifted >> 52) - 1023
    mantissa = i64_as_f64((shifted & _F64_MANTISSA_MASK) + _F64_SQRT_HALF_BITS)
    return np.float64(k), mantissa - 1.0


@vectorisable
def _log_series_f64(z):
    """P(z) of log(1 + f) = 2s + (2/3) s^3 + s^5 P(z)."""
    c = _F64_LOG_P
    return c[0] + z * (c[1] + z * (c[2] + z * (c[3] + z * (c[4] + z * (c[5] + z * c[6])))))


@vectorisable
def _log1p_reduced_f64(f, k, correction):
    """log(2**k (1 + f) + correction), see _log1p_reduced_f32."""
    s = f / (2.0 + f)
    z = s * s
    r = z * (_F64_TWO_THIRDS + z * _log_series_f64(z))
    half_f_squared = 0.5 * f * f
    return (
        s * (half_f_squared + r)
        + (k * _F64_LN2_LO + correction)
        - half_f_squared
        + f
        + k * _F64_LN2_HI
    )


@vectorisable
def _log_dd_f64(x):
    """log(x) as an unevaluated sum hi + lo, about 2**-62 relative, for pow.

    x must be positive; 0, inf and nan give hi = -inf, inf and nan.
    pow multiplies log(x) by y, which multiplies its relative error by up to
    |y log x| ~ 700, so every term above 2**-60 relative is carried exactly.
    """
    is_denormal = x < _F64_MIN_NORMAL
    scaled = x * _F64_TWO_54 if is_denormal else x
    k, f = _log_mantissa_f64(f64_as_i64(scaled))
    k = k - 54.0 if is_denormal else k
    # log(1 + f) = 2 atanh(s) = 2s + (2/3) s^3 + s^5 P(z), s = f / (2 + f).
    # s + s_lo: d + d_lo = 2 + f exactly, and the division's remainder
    # f - s (d + d_lo) comes from an fma.
    d = 2.0 + f
    d_lo = f - (d - 2.0)
    s = f / d
    s_lo = (fma(-s, d, f) - s * d_lo) / d
    # s^3 = cube + cube_lo, with the rounding errors of s*s and s*z and the
    # first-order effect of s_lo.
    z = s * s
    z_lo = fma(s, s, -z)
    cube = s * z
    cube_lo = fma(s, z, -cube) + (s * z_lo + 3.0 * z * s_lo)
    # (2/3) s^3 = third + third_lo
    third = _F64_TWO_THIRDS * cube
    third_lo = fma(_F64_TWO_THIRDS, cube, -third) + (
        _F64_TWO_THIRDS * cube_lo + _F64_TWO_THIRDS_LO * cube
    )
    rest = cube * z * _log_series_f64(z)  # below 2**-10 of the result: plain double
    # Sum the large terms k ln2, 2s and (2/3) s^3 with their rounding errors
    # (Fast2Sum: the first operand is the larger or zero), then the rest.
    k_ln2 = k * _F64_LN2_HI
    hi = k_ln2 + 2.0 * s
    lo = 2.0 * s - (hi - k_ln2)
    hi_plus_third = hi + third
    lo = lo + (third - (hi_plus_third - hi))
    hi = hi_plus_third
    lo = lo + (third_lo + k * _F64_LN2_LO + 2.0 * s_lo + rest)
    total = hi + lo
    lo = lo - (total - hi)
    # log(0) = -inf and log(inf) = inf come out of the exponent range; set them.
    total = total if x < _F64_INF else x
    total = -_F64_INF if x == 0.0 else total
    return total, lo


@vectorisable
def _reduce_pio2_f64(x):
    """Split x = n pi/2 + r.  Returns (n mod 4, r), see _reduce_pio2_f32."""
    n = np.rint(x * _F64_TWO_OVER_PI)
    r = x - n * _F64_PIO2_1
    r = r - n * _F64_PIO2_2
    r = r - n * _F64_PIO2_3
    r = r - n * _F64_PIO2_4
    r = max(min(r, _F64_TRIG_MAX_REDUCED), -_F64_TRIG_MAX_REDUCED)  # nan stays nan
    quadrant = n - 4.0 * np.floor(n * 0.25)
    return quadrant, r


@vectorisable
def _sin_poly_f64(r, z):
    """sin(r) for |r| <= 0.8, z = r*r."""
    c = _F64_SIN_P
    p = c[0] + z * (c[1] + z * (c[2] + z * (c[3] + z * (c[4] + z * (c[5] + z * c[6])))))
    return r + r * z * p


@vectorisable
def _cos_poly_f64(z):
    """cos(r) for |r| <= 0.8, z = r*r."""
    c = _F64_COS_P
    p = c[0] + z * (c[1] + z * (c[2] + z * (c[3] + z * (c[4] + z * c[5]))))
    return 1.0 - 0.5 * z + z * z * p


@vectorisable
def _pow_special_cases(x, y, magnitude):
    """x**y from magnitude = |x|**y: sign, nan and the exact cases of C99 pow."""
    y_is_integer = np.floor(y) == y  # true for +-inf as well
    half_y = 0.5 * y
    y_is_odd = y_is_integer & (np.floor(half_y) != half_y)
    y_is_fractional = np.floor(y) != y  # false for nan too: nan propagates anyway
    x_is_negative = math.copysign(1.0, x) < 0.0  # -0 included
    result = -magnitude if x_is_negative & y_is_odd else magnitude
    # A finite negative base with a non-integral exponent has no real power.
    no_real_power = (x < 0.0) & (x > -_F64_INF) & y_is_fractional
    result = _F64_NAN if no_real_power else result
    # The cases where y * log|x| is 0 * inf or nan but the result is 1.
    result = 1.0 if (x == -1.0) & (abs(y) == _F64_INF) else result
    result = 1.0 if x == 1.0 else result
    return 1.0 if y == 0.0 else result


# ---------------------------------------------------------------------------
# float64 functions


@vectorisable
def exp_f64(x):
    """exp(x) for float64."""
    return _exp_with_tail_f64(x, 0.0)


@vectorisable
def exp_nonpositive_f64(x):
    """exp(x) for float64 x <= 0, flushing tiny results to 0 (see exp_nonpositive_f32;
    here the flush is below x = -708.75)."""
    x = max(x, _F64_EXP_FLUSH_ARG)  # nan stays nan
    n_int, r = _reduce_ln2_f64(x, 0.0)
    return (1.0 + (r + r * r * _horner11(r, _F64_EXP_P))) * i64_as_f64((n_int + 1023) << 52)


@vectorisable
def expm1_f64(x):
    """exp(x) - 1 for float64, accurate relative to the result near 0."""
    clamped = max(min(x, _F64_EXP_MAX_ARG), _F64_EXPM1_MIN_ARG)  # nan stays nan
    n_int, r = _reduce_ln2_f64(clamped, 0.0)
    expm1_r = r + r * r * _horner11(r, _F64_EXPM1_P)
    # 1 - 2**-n is 1 in float64 for n > 53.
    n_small = min(n_int, 54)
    result = _ldexp_f64(expm1_r + (1.0 - _pow2_f64(-n_small)), n_int)
    return x if x == 0.0 else result


@vectorisable
def log_f64(x):
    """Natural logarithm for float64: log(0) = -inf, log(x < 0) = nan."""
    is_denormal = x < _F64_MIN_NORMAL
    scaled = x * _F64_TWO_54 if is_denormal else x
    k, f = _log_mantissa_f64(f64_as_i64(scaled))
    k = k - 54.0 if is_denormal else k
    result = _log1p_reduced_f64(f, k, 0.0)
    result = result if x < _F64_INF else x
    result = -_F64_INF if x == 0.0 else result
    return _F64_NAN if x < 0.0 else result


@vectorisable
def log1p_f64(x):
    """log(1 + x) for float64, accurate relative to the result near 0."""
    u = 1.0 + x
    k, f = _log_mantissa_f64(f64_as_i64(u))
    error = 1.0 - (u - x) if k >= 2.0 else x - (u - 1.0)
    correction = error / u if k < 54.0 else 0.0
    result = _log1p_reduced_f64(f, k, correction)
    result = result if x < _F64_INF else x
    result = x if x == 0.0 else result
    result = -_F64_INF if x == -1.0 else result
    return _F64_NAN if x < -1.0 else result


@vectorisable
def tanh_f64(x):
    """Hyperbolic tangent for float64."""
    # tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): the expm1 is in (-1, 0], so
    # nothing overflows, and it keeps relative accuracy for tiny x.
    e = expm1_f64(-2.0 * abs(x))
    return math.copysign(-e / (2.0 + e), x)


@vectorisable
def sigmoid_f64(x):
    """Logistic function 1 / (1 + exp(-x)) for float64 (see sigmoid_f32)."""
    e = exp_f64(-abs(x))
    numerator = 1.0 if x >= 0.0 else e
    return numerator / (1.0 + e)


@vectorisable
def softplus_f64(x):
    """log(1 + exp(x)) for float64, computed as max(x, 0) + log1p(exp(-|x|))."""
    positive_part = max(x, 0.0)
    return positive_part + log1p_f64(exp_f64(-abs(x)))


@vectorisable
def sin_f64(x):
    """Sine for float64 (see the module docstring for the argument range)."""
    quadrant, r = _reduce_pio2_f64(x)
    z = r * r
    sin_r = _sin_poly_f64(r, z)
    cos_r = _cos_poly_f64(z)
    odd = (quadrant == 1.0) | (quadrant == 3.0)
    result = cos_r if odd else sin_r
    result = -result if quadrant >= 2.0 else result
    return x if x == 0.0 else result


@vectorisable
def cos_f64(x):
    """Cosine for float64 (see the module docstring for the argument range)."""
    quadrant, r = _reduce_pio2_f64(x)
    z = r * r
    sin_r = _sin_poly_f64(r, z)
    cos_r = _cos_poly_f64(z)
    odd = (quadrant == 1.0) | (quadrant == 3.0)
    result = sin_r if odd else cos_r
    negative = (quadrant == 1.0) | (quadrant == 2.0)
    return -result if negative else result


@vectorisable
def pow_f64(x, y):
    """x**y for float64 with NumPy semantics.

    log|x| is carried in double-double precision and multiplied by y with an
    fma, so the result loses only a few ulp even when |y log x| is large.
    """
    log_hi, log_lo = _log_dd_f64(abs(x))
    product = y * log_hi
    product_lo = fma(y, log_hi, -product) + y * log_lo
    # With an infinite product the low part is nan (inf - inf) and meaningless.
    product_lo = product_lo if abs(product) < _F64_INF else 0.0
    magnitude = _exp_with_tail_f64(product, product_lo)
    return _pow_special_cases(x, y, magnitude)


@vectorisable
def rint_f64(x):
    """Round to the nearest integer, halves to even (np.round / np.rint)."""
    return np.rint(x)


_NAMES = ("exp", "exp_nonpositive", "expm1", "log", "log1p", "tanh", "sigmoid", "softplus", "sin", "cos",
          "pow", "rint")
FUNCTIONS = {(name, f"float{bits}"): globals()[f"{name}_f{bits}"] for bits in (32, 64) for name in _NAMES}
"""(name, dtype name) -> scalar function; pow takes (x, y), the others x."""
