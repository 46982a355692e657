"""Tests for jit_kernels.vmath: accuracy, special values, vectorisation.

How accuracy is measured.  The exact value comes from NumPy in a wider type:
float64 for the float32 functions, long double (64-bit mantissa on x86) for
the float64 ones; the reference's own error is then below 2**-10 ulp of the
type under test.  The error of a result is

    |result - exact| / ulp(exact),  ulp(exact) = 2**(e - p) for 2**(e-1) <= |exact| < 2**e,

with p the precision of the type (24 or 53), floored at the smallest
denormal.  So for a tiny result (tanh, expm1, log1p, sigmoid and softplus of
tiny or very negative x, sin near its zeros) the error is relative to the
result itself, the strictest reading; in the denormal range it is counted in
denormal steps.  Results that are equal, or both nan, count as exact.

Every function is compiled once, inside a serial loop over an array, and that
loop is both evaluated for accuracy and inspected for packed AVX
instructions.  Set NUMBACKEND_VMATH_BENCH=1 to also print the W1 timing.
"""

import math
import os
import re
import time

import numba
import numpy as np
import pytest

from jit_kernels import vmath

F32_FUNCTIONS = ["exp", "expm1", "log", "log1p", "tanh", "sigmoid", "softplus", "sin", "cos"]
LONG_DOUBLE_IS_EXTENDED = np.finfo(np.longdouble).nmant >= 63

# Bounds asserted, in ulps (see the module docstring), for results anywhere in
# the range; the measured maxima are listed in jit_kernels/vmath.py.
MAX_ULP = {
    # float32 tanh is a rational approximation, like Eigen's and XLA's.
    "float32": {name: 6.0 if name == "tanh" else 4.0 for name in F32_FUNCTIONS + ["pow"]},
    "float64": {
        "exp": 1.5,
        "log": 1.5,
        "log1p": 1.5,
        "expm1": 3.0,
        "softplus": 3.0,
        "tanh": 3.0,
        "sigmoid": 3.0,
        "sin": 3.0,
        "cos": 3.0,
        "pow": 3.0,
    },
}
# Where sin/cos reduce their argument exactly (the float32 pieces of pi/2
# allow |n| < 2**15, the float64 ones |n| < 2**20).
TRIG_EXACT_RANGE = {"float32": 51471.0, "float64": 1.6e6}

_LOOPS = {}


def _unary_loop(function):
    @numba.njit(error_model="numpy")
    def loop(values, out):
        for i in range(values.shape[0]):
            out[i] = function(values[i])

    return loop


def _binary_loop(function):
    @numba.njit(error_model="numpy")
    def loop(x, y, out):
        for i in range(x.shape[0]):
            out[i] = function(x[i], y[i])

    return loop


def compiled_loop(name, dtype):
    """The loop out[i] = f(x[i]) (or f(x[i], y[i]) for pow), compiled once per session."""
    key = (name, dtype)
    if key not in _LOOPS:
        function = vmath.FUNCTIONS[key]
        _LOOPS[key] = _binary_loop(function) if name == "pow" else _unary_loop(function)
    return _LOOPS[key]


def evaluate(name, dtype, *args):
    args = [np.ascontiguousarray(a, dtype=dtype) for a in args]
    out = np.empty_like(args[0])
    compiled_loop(name, dtype)(*args, out)
    return out


def reference(name, x):
    """The exact value of the function at x, computed by NumPy in x's (wide) type."""
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            e = np.exp(-np.abs(x))
            return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
        if name == "softplus":
            return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
        return getattr(np, name)(x)


def wide_type(dtype):
    return np.float64 if dtype == "float32" else np.longdouble


def ulp_error(result, exact, dtype):
    """|result - exact| in ulps of exact in dtype (see the module docstring)."""
    info = np.finfo(dtype)
    exact = exact.astype(np.longdouble)
    _, exponent = np.frexp(np.abs(exact))
    ulp = np.ldexp(np.longdouble(1), (exponent - (info.nmant + 1)).astype(np.int32))
    ulp = np.maximum(ulp, np.longdouble(info.smallest_subnormal))
    with np.errstate(all="ignore"):
        error = np.abs(result.astype(np.longdouble) - exact) / ulp
        exact_in_type = exact.astype(dtype)
    same = (result == exact_in_type) | (np.isnan(result) & np.isnan(exact_in_type))
    return np.where(same, 0.0, error).astype(np.float64)


def whole_range_inputs(dtype, seed=0):
    """Finite values over the whole range of dtype: log-spaced magnitudes of both
    signs, random bit patterns, and (float32) every 4099th bit pattern."""
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):  # inside geomspace, for the float64 maximum
        magnitudes = np.geomspace(float(info.smallest_subnormal), float(info.max), 100_000)
    parts = [magnitudes, -magnitudes]
    if dtype == "float32":
        parts.append(rng.integers(0, 2**32, 500_000, dtype=np.uint32).view(np.float32))
        parts.append(np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32))
    else:
        parts.append(rng.integers(0, 2**64, 300_000, dtype=np.uint64).view(np.float64))
    x = np.concatenate([np.asarray(p).astype(dtype) for p in parts])
    return x[np.isfinite(x)]


def dense_inputs(dtype, seed=1):
    """Where the functions do their interesting work: |x| up to about 800."""
    rng = np.random.default_rng(seed)
    parts = [
        np.linspace(-30, 30, 200_001),
        rng.uniform(-800, 800, 100_000),
        rng.uniform(-1, 1, 100_000) * np.exp(rng.uniform(-20, 0, 100_000)),
    ]
    return np.concatenate(parts).astype(dtype)


def dtype_params():
    long_double_missing = pytest.mark.skipif(
        not LONG_DOUBLE_IS_EXTENDED, reason="no extended long double for a float64 reference"
    )
    return ["float32", pytest.param("float64", marks=long_double_missing)]


def assert_within_ulps(name, dtype, x, result, exact, bound):
    error = ulp_error(result, exact, dtype)
    worst = int(np.argmax(error))
    assert error[worst] <= bound, (
        f"{name}_{dtype}: {error[worst]:.2f} ulp at x={x[worst]!r}: "
        f"got {result[worst]!r}, exact {exact[worst]!r}"
    )


# ---------------------------------------------------------------------------
# accuracy


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("name", ["exp", "expm1", "log", "log1p", "tanh", "sigmoid", "softplus"])
def test_accuracy_over_whole_range(name, dtype):
    x = np.concatenate([whole_range_inputs(dtype), dense_inputs(dtype)])
    result = evaluate(name, dtype, x)
    exact = reference(name, x.astype(wide_type(dtype)))
    assert_within_ulps(name, dtype, x, result, exact, MAX_ULP[dtype][name])


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_accuracy_in_exact_range(name, dtype):
    limit = TRIG_EXACT_RANGE[dtype]
    x = np.concatenate([whole_range_inputs(dtype), dense_inputs(dtype)])
    if dtype == "float32":
        # every 1021st float32 in [0, limit), positive and negative
        top = int(np.float32(limit).view(np.uint32))
        strided = np.arange(0, top, 1021, dtype=np.uint32).view(np.float32)
        x = np.concatenate([x, strided, -strided])
    else:
        rng = np.random.default_rng(2)
        x = np.concatenate([x, rng.uniform(-limit, limit, 300_000)])
    x = x[np.abs(x) < limit].astype(dtype)
    result = evaluate(name, dtype, x)
    exact = reference(name, x.astype(wide_type(dtype)))
    assert_within_ulps(name, dtype, x, result, exact, MAX_ULP[dtype][name])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_stays_bounded_past_exact_range(name, dtype):
    x = whole_range_inputs(dtype)
    result = evaluate(name, dtype, x)
    assert np.all(np.abs(result) <= 1), "sin/cos must stay in [-1, 1] for every finite x"


@pytest.mark.parametrize("dtype", dtype_params())
def test_pow_accuracy(dtype):
    rng = np.random.default_rng(3)
    info = np.finfo(dtype)
    n = 300_000
    # Bases over the whole range, exponents of all sizes; negative bases get
    # integral exponents (the only ones with a real power).
    x = np.exp(rng.uniform(np.log(float(info.smallest_subnormal)), np.log(float(info.max)), n))
    y = rng.uniform(-1, 1, n) * np.exp(rng.uniform(-5, 8, n))
    negative = rng.random(n) < 0.3
    x = np.where(negative, -x, x)
    y = np.where(negative, np.round(y), y)
    # Bases near 1 with exponents that push |y log x| up to the overflow limit,
    # where an error in log(x) is magnified most.
    near_one = 1 + rng.uniform(-0.5, 0.5, n).astype(dtype)
    with np.errstate(divide="ignore"):
        big_y = rng.uniform(-1, 1, n) * np.log(float(info.max)) / np.abs(np.log(near_one))
    x = np.concatenate([x, near_one]).astype(dtype)
    y = np.concatenate([y, big_y]).astype(dtype)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    result = evaluate("pow", dtype, x, y)
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(wide_type(dtype)), y.astype(wide_type(dtype)))
    error = ulp_error(result, exact, dtype)
    worst = int(np.argmax(error))
    assert error[worst] <= MAX_ULP[dtype]["pow"], (
        f"pow_{dtype}: {error[worst]:.2f} ulp at x={x[worst]!r}, y={y[worst]!r}: "
        f"got {result[worst]!r}, exact {exact[worst]!r}"
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rint_rounds_half_to_even(dtype):
    halves = np.arange(-20, 20) + 0.5
    big = np.array([2.0**23 - 0.5, 2.0**23 + 1, 2.0**52 - 0.5, 2.0**52 + 1, 1e30, -1e30])
    x = np.concatenate([halves, big, np.linspace(-1e6, 1e6, 100_001)]).astype(dtype)
    x = np.concatenate([x, [np.inf, -np.inf, -0.0, 0.0, np.float32(np.finfo(np.float32).max)]])
    x = x.astype(dtype)
    result = evaluate("rint", dtype, x)
    expected = np.round(x)
    np.testing.assert_array_equal(result, expected)
    assert np.array_equal(np.signbit(result), np.signbit(expected))
    assert np.isnan(evaluate("rint", dtype, np.array([np.nan]))[0])


# ---------------------------------------------------------------------------
# special values


INF = np.inf
NAN = np.nan
SPECIAL_CASES = {
    "exp": [(-INF, 0.0), (INF, INF), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "exp_nonpositive": [(-INF, 0.0), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "expm1": [(-INF, -1.0), (INF, INF), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "log": [
        (0.0, -INF),
        (-0.0, -INF),
        (-1.0, NAN),
        (-INF, NAN),
        (INF, INF),
        (NAN, NAN),
        (1.0, 0.0),
    ],
    "log1p": [
        (-1.0, -INF),
        (-2.0, NAN),
        (-INF, NAN),
        (INF, INF),
        (NAN, NAN),
        (0.0, 0.0),
        (-0.0, -0.0),
    ],
    "tanh": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (NAN, NAN), (0.0, 0.5)],
    "softplus": [(INF, INF), (-INF, 0.0), (NAN, NAN)],
    "sin": [(INF, NAN), (-INF, NAN), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "cos": [(INF, NAN), (-INF, NAN), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "rint": [(INF, INF), (-INF, -INF), (NAN, NAN), (-0.0, -0.0)],
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(SPECIAL_CASES))
def test_special_values(name, dtype):
    x, expected = (np.array(column, dtype=dtype) for column in zip(*SPECIAL_CASES[name]))
    result = evaluate(name, dtype, x)
    np.testing.assert_array_equal(result, expected)  # nan matches nan
    numbers = ~np.isnan(expected)
    assert np.array_equal(np.signbit(result[numbers]), np.signbit(expected[numbers])), "sign"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_is_odd_and_within_one(dtype):
    x = np.concatenate([np.linspace(0, 20, 200001), np.geomspace(1e-30, 1, 20001)]).astype(dtype)
    positive, negative = evaluate("tanh", dtype, x), evaluate("tanh", dtype, -x)
    np.testing.assert_array_equal(negative, -positive)
    assert np.all(np.abs(positive) <= 1)
    assert np.all(positive[x >= (9.2 if dtype == "float32" else 19.1)] == 1)  # tanh rounds to 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["exp", "expm1", "sigmoid", "softplus"])
def test_overflow_and_underflow_thresholds(name, dtype):
    """Around the thresholds where NumPy's exact result turns inf or 0, ours
    must turn at the same float (near +-1 a one-ulp difference is allowed, as
    everywhere)."""
    info = np.finfo(dtype)
    max_log = np.log(float(info.max))
    min_log = np.log(float(info.smallest_subnormal))
    centres = [max_log, -max_log, min_log, -min_log, 9.0, -9.0, 17.0, -17.0, 37.5, -37.5]
    steps = np.arange(-3000, 3001, 3)
    x = np.concatenate(
        [
            np.nextafter(np.asarray(c, dtype=dtype), np.asarray(np.inf, dtype=dtype))
            + steps * np.spacing(np.asarray(c, dtype=dtype))
            for c in centres
        ]
    ).astype(dtype)
    result = evaluate(name, dtype, x)
    with np.errstate(over="ignore"):
        exact = reference(name, x.astype(wide_type(dtype))).astype(dtype)
    for property_ in (np.isinf, lambda v: v == 0):
        mismatch = property_(result) != property_(exact)
        assert not np.any(mismatch), f"{name}_{dtype} differs at x={x[mismatch][:5]!r}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_propagates_everywhere(dtype):
    for name in F32_FUNCTIONS + ["rint"]:
        assert np.isnan(evaluate(name, dtype, np.array([NAN]))[0]), name
    nan = np.array([NAN, NAN, 2.0, 1.0, NAN])
    other = np.array([2.0, NAN, NAN, NAN, 0.0])
    result = evaluate("pow", dtype, nan, other)
    # C99/NumPy: pow(1, nan) = 1 and pow(nan, 0) = 1
    np.testing.assert_array_equal(result, np.array([NAN, NAN, NAN, 1.0, 1.0]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_special_values_match_numpy(dtype):
    values = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.0,
        -1.0,
        2.0,
        -2.0,
        3.0,
        -3.0,
        2.5,
        -2.5,
        1e30,
        -1e30,
        1e-30,
        -1e-30,
        INF,
        -INF,
        NAN,
    ]
    x, y = np.meshgrid(np.array(values, dtype=dtype), np.array(values, dtype=dtype))
    x, y = x.ravel(), y.ravel()
    result = evaluate("pow", dtype, x, y)
    with np.errstate(all="ignore"):
        expected = np.power(x, y)
        exact = np.power(x.astype(wide_type(dtype)), y.astype(wide_type(dtype)))
    numbers = ~np.isnan(expected)
    for property_ in (np.isnan, np.isinf, lambda v: v == 0, lambda v: np.signbit(v) & numbers):
        mismatch = property_(result) != property_(expected)
        assert not np.any(mismatch), (
            f"pow_{dtype} differs from NumPy at x={x[mismatch][:5]!r}, y={y[mismatch][:5]!r}: "
            f"{result[mismatch][:5]!r} vs {expected[mismatch][:5]!r}"
        )
    assert np.max(ulp_error(result, exact, dtype)) <= MAX_ULP[dtype]["pow"]


# ---------------------------------------------------------------------------
# vectorisation

# Packed arithmetic on 256-bit registers, e.g. "vmulps %ymm1, %ymm2, %ymm3".
_PACKED_ARITHMETIC = (
    r"\bv(?:add|sub|mul|div|fn?madd\d+|fn?msub\d+|round|cvtpd2){suffix}\s[^\n]*%[yz]mm"
)
# A call to a math routine (libm or Numba's helpers) by name.
_MATH_CALL = re.compile(
    r"\bcall\w*\s+\S*(?:exp|log|tanh|sin|cos|pow|rint|round|floor|fma)", re.IGNORECASE
)


@pytest.mark.parametrize("dtype", dtype_params())
def test_exp_nonpositive_is_exp_with_tiny_results_flushed(dtype):
    """Within exp's bound wherever exp(x) is a normal number; where it is not, 0 or
    a denormal within one least-normal of the exact value."""
    x = np.concatenate([whole_range_inputs(dtype), dense_inputs(dtype)])
    x = x[x <= 0]
    result = evaluate("exp_nonpositive", dtype, x)
    exact = reference("exp", x.astype(wide_type(dtype)))
    tiny = np.finfo(dtype).tiny
    normal = exact >= tiny
    assert_within_ulps("exp_nonpositive", dtype, x[normal], result[normal], exact[normal],
                       MAX_ULP[dtype]["exp"])
    assert np.all(np.abs(result[~normal] - exact[~normal]) <= tiny)
    flushed = x < (-87.7 if dtype == "float32" else -708.8)
    assert np.all(result[flushed] == 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", F32_FUNCTIONS + ["exp_nonpositive", "pow", "rint"])
def test_function_vectorises(name, dtype):
    loop = compiled_loop(name, dtype)
    args = (np.ones(16, dtype),) * (2 if name == "pow" else 1)
    evaluate(name, dtype, *args)  # compiles for these argument types
    assembly = loop.inspect_asm(loop.signatures[0])
    # pow_f32 does its arithmetic in float64 (see vmath), hence "pd" there.
    suffix = "ps" if dtype == "float32" and name != "pow" else "pd"
    assert re.search(_PACKED_ARITHMETIC.format(suffix=suffix), assembly), (
        f"{name}_{dtype}: no packed {suffix} arithmetic on ymm or zmm registers"
    )
    calls = _MATH_CALL.findall(assembly)
    assert not calls, f"{name}_{dtype} calls {calls}"


def test_functions_table_is_complete():
    names = {
        "exp",
        "exp_nonpositive",
        "expm1",
        "log",
        "log1p",
        "tanh",
        "sigmoid",
        "softplus",
        "sin",
        "cos",
        "pow",
        "rint",
    }
    assert set(vmath.FUNCTIONS) == {(n, d) for n in names for d in ("float32", "float64")}
    for (name, dtype), function in vmath.FUNCTIONS.items():
        assert function.__name__ == f"{name}_{dtype[0]}{dtype[-2:]}"
        assert function.targetoptions.get("inline") == "always"
        assert function.targetoptions.get("error_model") == "numpy"


# ---------------------------------------------------------------------------
# timing of workload W1 (printed, never asserted)


@pytest.mark.skipif(
    os.environ.get("NUMBACKEND_VMATH_BENCH") != "1",
    reason="set NUMBACKEND_VMATH_BENCH=1 to time W1",
)
def test_print_w1_timing():
    half = np.float32(0.5)
    one = np.float32(1.0)

    @numba.njit(parallel=True, error_model="numpy")
    def with_vmath(a, b, c, out):
        for i in numba.prange(a.shape[0]):
            out[i] = vmath.tanh_f32(a[i] * b[i] + c[i]) * vmath.sigmoid_f32(a[i] - c[i]) + (
                half * b[i] * b[i]
            )

    @numba.njit(parallel=True, error_model="numpy")
    def with_libm(a, b, c, out):
        for i in numba.prange(a.shape[0]):
            sigmoid = one / (one + math.exp(-(a[i] - c[i])))
            out[i] = math.tanh(a[i] * b[i] + c[i]) * sigmoid + half * b[i] * b[i]

    def with_numpy(a, b, c):
        return np.tanh(a * b + c) * (one / (one + np.exp(c - a))) + half * b * b

    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((1024, 4096)).astype(np.float32).ravel() for _ in range(3))
    out = np.empty_like(a)

    def median_ms(run, repeats=15):
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    timings = {
        "vmath": median_ms(lambda: with_vmath(a, b, c, out)),
        "libm": median_ms(lambda: with_libm(a, b, c, out)),
        "numpy": median_ms(lambda: with_numpy(a, b, c)),
    }
    print(
        f"\nW1 4M float32, {numba.get_num_threads()} threads "
        f"({numba.threading_layer()}): " + ", ".join(f"{k} {v:.2f} ms" for k, v in timings.items())
    )


def test_loops_with_many_outputs_vectorise():
    """Importing jit_kernels lets LLVM add the run-time overlap checks that a loop
    writing 11 fresh arrays from 12 needs (a fused LSTM backward step)."""
    import jit_kernels  # noqa: F401 - sets the LLVM option
    inputs = [f"a{i}" for i in range(12)]
    source = "def loop(" + ", ".join(inputs) + "):\n"
    source += "".join(f"    o{k} = np.empty_like(a0)\n" for k in range(11))
    source += "    for i in range(a0.size):\n        s = a0[i]\n"
    source += "".join(f"        s = s * np.float32(0.5) + a{i}[i]\n" for i in range(1, 12))
    source += "".join(f"        o{k}[i] = s + np.float32({k})\n" for k in range(11))
    source += "    return (" + ", ".join(f"o{k}" for k in range(11)) + ",)\n"
    namespace = {"np": np}
    exec(source, namespace)  # noqa: S102 - our own source
    loop = numba.njit(error_model="numpy")(namespace["loop"])
    arrays = [np.full(64, i, np.float32) for i in range(12)]
    outputs = loop(*arrays)
    expected = np.float32(0)
    for i in range(12):
        expected = expected * np.float32(0.5) + np.float32(i)
    np.testing.assert_allclose(outputs[10], expected + 10)
    assert "vector.body" in loop.inspect_llvm(loop.signatures[0])


def test_vectorised_loops_are_interleaved():
    """Importing jit_kernels makes LLVM run four independent vector chains per loop
    iteration: a loop of one exp each was bound by the latency of a single chain."""
    import jit_kernels  # noqa: F401 - sets the LLVM option

    @numba.njit(error_model="numpy")
    def exp_loop(x, out):
        for i in range(x.size):
            out[i] = vmath.exp_f32(x[i])

    x = np.linspace(-5, 5, 100, dtype=np.float32)
    out = np.empty_like(x)
    exp_loop(x, out)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)), rtol=2e-7)
    assembly = exp_loop.inspect_asm(exp_loop.signatures[0])
    # exp clamps its argument first, one packed vminps per vector chain
    assert len(re.findall(r"\bvminps\s+[^\n]*[xyz]mm", assembly)) >= 4
