"""The engine itself: fusion, common sub-expressions, constant folding, the plan,
the kernel cache across processes, call-boundary checks and update atomicity."""
import gc
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import weakref

import numpy as np
import pytest

import numbackend
from numbackend import codegen, lowering, ops, tuning
from numbackend import core as K
from tests.kernel_helpers import llvm_fills_512_bits_by_default, needs_blas


def relu_sum_fn():
    a = K.placeholder((None, 8), name="a")
    b = K.placeholder((8,), name="b")
    y = ops.apply("maximum", a * b + 1.0, 0.0) * 2.0 - a
    return a, b, y


def test_elementwise_chain_is_one_kernel():
    a, b, y = relu_sum_fn()
    f = K.function([a, b], [y])
    kernels = [s for s in f.plan.steps if s.kind == "kernel"]
    assert len(f.plan.steps) == 1 and len(kernels) == 1
    assert [n.op for n in kernels[0].nodes] == ["multiply", "add", "maximum", "multiply", "subtract"]
    x = np.arange(24, dtype=np.float32).reshape(3, 8) - 12
    w = np.linspace(-1, 1, 8).astype(np.float32)
    np.testing.assert_allclose(f([x, w])[0], np.maximum(x * w + 1, 0) * 2 - x, rtol=1e-6)


def test_shared_subexpression_is_computed_once():
    a = K.placeholder((None, 8))
    # the same expression built twice: one node after rewriting, used by both outputs
    s1 = a * 3.0 + 1.0
    s2 = a * 3.0 + 1.0
    f = K.function([a], [s1 * s2, ops.apply("sum", s2, axis=-1)])
    members = [n.op for s in f.plan.steps for n in s.nodes]
    assert members.count("multiply") == 2  # a*3 once, plus s1*s2
    assert members.count("add") == 1
    x = np.ones((2, 8), np.float32)
    out = f([x])
    np.testing.assert_allclose(out[0], (x * 3 + 1) ** 2)
    np.testing.assert_allclose(out[1], (x * 3 + 1).sum(-1))


def test_constants_are_folded():
    a = K.placeholder((4,))
    c = K.constant(np.arange(4.0)) * 2.0 + 1.0  # folds to one constant
    f = K.function([a], [a + c])
    steps = f.plan.steps
    assert len(steps) == 1 and [n.op for n in steps[0].nodes] == ["add"]
    np.testing.assert_allclose(f([np.ones(4)])[0], 1 + np.arange(4.0) * 2 + 1)


def test_softmax_is_one_row_kernel():
    x = K.placeholder((None, 7))
    e = ops.apply("exp", x - ops.apply("max", x, axis=-1, keepdims=True))
    y = e / ops.apply("sum", e, axis=-1, keepdims=True)
    f = K.function([x], [y])
    assert len(f.plan.steps) == 1
    v = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32) * 30
    want = np.exp(v - v.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(f([v])[0], want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("rows", [1, 70])
def test_lone_row_buffer_lives_in_the_output_row(rows):
    # the exps are kept in the output's row, then read back and overwritten there,
    # element by element, by an expression that reads each one twice
    x = K.placeholder((None, 9))
    e = ops.apply("exp", x - ops.apply("max", x, axis=-1, keepdims=True))
    f = K.function([x], [e * 2 / ops.apply("sum", e, axis=-1, keepdims=True) + e * e])
    (source,) = f.kernel_sources()
    assert "= o0[r]" in source and "np.empty((min(R" not in source
    v = np.random.default_rng(2).standard_normal((rows, 9)).astype(np.float32) * 5
    ev = np.exp(v.astype(np.float64) - v.max(-1, keepdims=True))
    want = ev * 2 / ev.sum(-1, keepdims=True) + ev * ev
    np.testing.assert_allclose(f([v])[0], want, rtol=2e-6, atol=1e-7)


def test_softmax_scales_its_exps_in_place():
    x = K.placeholder((None, 7))
    (source,) = K.function([x], [numbackend.softmax(x)]).kernel_sources()
    assert "= o0[r]" in source and "np.empty((min(R" not in source


def test_a_softmaxs_shift_is_a_max_without_nan_handling(tmp_path, monkeypatch):
    """A softmax's shift, folded into its exp loop, is llvm.maxnum with nnan (one
    packed max a vector on x86, where NaN-propagating llvm.maximum takes three),
    and the fold's result goes through the never-inlined freeze (jit_kernels.
    reduce.settled) before anything reads it.  Results are NumPy's."""
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))  # compiled here: inspectable
    # a kernel of its own (kernels take any row length): one another test already
    # built in this process would be loaded, not compiled
    x = K.placeholder((None, 293))
    f = K.function([x], [numbackend.softmax(x) * 3.0 - x * 0.125])
    v = np.random.default_rng(3).standard_normal((40, 293)).astype(np.float32) * 20
    v64 = v.astype(np.float64)
    want = np.exp(v64 - v64.max(-1, keepdims=True))
    want = want / want.sum(-1, keepdims=True) * 3.0 - v64 * 0.125
    np.testing.assert_allclose(f([v])[0], want, rtol=2e-6, atol=1e-6)
    (kernel,) = f.plan.kernels
    assert "rd.shift_maximum(m0," in kernel.SOURCE and "rd.settled(m0)" in kernel.SOURCE
    loop = kernel.kernel_ser
    ir = loop.inspect_llvm(loop.signatures[0])
    assert re.search(r"call nnan nsz[^\n]*@llvm\.maxnum\.v\d+f32\(", ir)
    assert "@llvm.maximum" not in ir
    assert re.search(r"call [^\n]*@\"?jit_kernels\.settle\.float\"?\(", ir)


def packed_floats_on_zmm(dispatcher):
    """The packed float32 arithmetic on 512-bit registers in the compiled code of
    ``dispatcher`` (every signature: the functions of its code, and those linked in)."""
    assembly = "\n".join(dispatcher.inspect_asm().values())
    return re.findall(r"^\s*v(?:add|sub|mul|div|fn?m(?:add|sub)\d+|max|min)ps\s[^\n]*%zmm",
                      assembly, re.MULTILINE)


@pytest.mark.parametrize("bits", [512, None])
def test_fused_loops_take_the_vector_width_of_the_setting(bits, tuned, tmp_path, monkeypatch):
    """With FUSED_VECTOR_BITS=512 on an AVX-512 CPU, a fused kernel's loops fill 512-bit
    registers, both the parallel loop (in the function Numba outlines its body into)
    and the serial one, for a flat chain and a kernel over rows; with None, they take LLVM's
    own choice for the CPU (256 bits on Intel's AVX-512 CPUs, 512 on AMD's Zen 4).  The
    results are NumPy's either way."""
    from jit_kernels.compiling import target_vector_bytes
    if target_vector_bytes() < 64:
        pytest.skip("the CPU target has no AVX-512")
    # compiled in this test: code loaded from a cache cannot be inspected
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))
    tuned(FUSED_VECTOR_BITS=bits)
    from jit_kernels import parts
    # large calls run Numba's parallel loop, as where NumPy has no OpenBLAS pool
    monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 0)
    wide_wanted = bits == 512 or llvm_fills_512_bits_by_default()
    a, b, c = (K.placeholder((None, 256)) for _ in range(3))
    chain = K.function([a, b, c], [numbackend.tanh(a * b + c) + 0.375 * b * a])
    x = K.placeholder((None, 300))
    centred = K.function([x], [x * 1.5 - numbackend.mean(x, axis=-1, keepdims=True)])
    rng = np.random.default_rng(5)
    for rows in (3, 2048):  # the serial loop, then the parallel one
        va, vb, vc = (rng.standard_normal((rows, 256)).astype(np.float32) for _ in range(3))
        a64, b64, c64 = (v.astype(np.float64) for v in (va, vb, vc))
        want = np.tanh(a64 * b64 + c64) + 0.375 * b64 * a64
        np.testing.assert_allclose(chain([va, vb, vc])[0], want, rtol=1e-5, atol=1e-6)
        vx = rng.standard_normal((rows, 300)).astype(np.float32) * 4
        x64 = vx.astype(np.float64)
        want = x64 * 1.5 - x64.mean(-1, keepdims=True)
        np.testing.assert_allclose(centred([vx])[0], want, rtol=1e-5, atol=1e-5)
    for kernel in chain.plan.kernels + centred.plan.kernels:
        assert ("prefer_vector_width(512)" in kernel.SOURCE) == (bits == 512)
        for loop in (kernel.kernel_par, kernel.kernel_ser):
            assert loop.signatures, f"{loop} was not called"
            wide = packed_floats_on_zmm(loop)
            assert bool(wide) == wide_wanted, (loop, wide[:3])


def test_a_fused_kernels_loops_need_no_overlap_checks(tmp_path, monkeypatch):
    """The arrays of a fused kernel's serial loop are marked apart (noalias), so
    LLVM vectorises it without run-time overlap checks between its outputs and
    inputs (which took about half of a large kernel's compile); results are NumPy's."""
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(tmp_path))  # compiled here: inspectable
    a, b, c, d = (K.placeholder((None, 96)) for _ in range(4))
    t = numbackend.tanh(a * b + c)
    f = K.function([a, b, c, d], [t * d, t - a, (a + d) * 0.5])
    rng = np.random.default_rng(7)
    values = [rng.standard_normal((5, 96)).astype(np.float32) for _ in range(4)]
    va, vb, vc, vd = (v.astype(np.float64) for v in values)
    tv = np.tanh(va * vb + vc)
    for got, want in zip(f(values), [tv * vd, tv - va, (va + vd) * 0.5]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert f.plan.kernels
    for kernel in f.plan.kernels:
        loop = kernel.kernel_ser
        ir = loop.inspect_llvm(loop.signatures[0])
        assert re.search(r"noalias[^,]*%\"?arg\.o0\.4", ir), "an output is not marked apart"
        assert "vector.body" in ir and "vector.memcheck" not in ir


def test_broadcast_patterns_rows_columns_scalars():
    x = K.placeholder((None, 5))
    col = K.placeholder((None, 1))
    row = K.placeholder((5,))
    s = K.placeholder(())
    f = K.function([x, col, row, s], [(x - col) * row + s])
    r = np.random.default_rng(1)
    xv, cv, rv = r.standard_normal((3, 5)), r.standard_normal((3, 1)), r.standard_normal(5)
    np.testing.assert_allclose(f([xv, cv, rv, 2.5])[0], (xv - cv) * rv + 2.5, rtol=1e-6)


def test_runtime_broadcast_of_unknown_dim_falls_back_correctly():
    # static shapes say both inputs are (None, 4); at run time one has a single row
    a = K.placeholder((None, 4))
    b = K.placeholder((None, 4))
    f = K.function([a, b], [a * b + 1.0])
    av = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    bv = np.full((1, 4), 2.0, np.float32)
    np.testing.assert_allclose(f([av, bv])[0], av * bv + 1)


def record_loops(monkeypatch, kernel):
    """The list of kernel_par / kernel_ser calls of a kernel module, as they happen."""
    calls = []
    for variant in ("kernel_par", "kernel_ser"):
        original = getattr(kernel, variant)
        monkeypatch.setattr(kernel, variant,
                            lambda *a, variant=variant, original=original: calls.append(variant)
                            or original(*a))
    return calls


def record_row_parts(monkeypatch):
    """The list of (parts, rows) of each jit_kernels.parts.run_rows call, as they happen."""
    from jit_kernels import parts
    calls, original = [], parts.run_rows
    monkeypatch.setattr(parts, "run_rows", lambda part, count, rows, numbers:
                        calls.append((count, rows)) or original(part, count, rows, numbers))
    return calls


def row_part_functions():
    """(function, inputs, NumPy's outputs in float64) of kernels of every kind of
    argument a row part reads: flat; full, per-column and scalar inputs with row
    buffers (a softmax); a window, a per-row input and a per-row output."""
    rng = np.random.default_rng(3)
    x = K.placeholder((None,))
    flat = K.function([x], [ops.apply("tanh", x) * 2.0 - x])
    v = np.linspace(-3, 3, 100_003).astype(np.float32)
    v64 = v.astype(np.float64)
    yield flat, [v], [np.tanh(v64) * 2.0 - v64]

    x = K.placeholder((None, 300))
    bias = np.linspace(-1, 1, 300).astype(np.float32)
    softmax = K.function([x], [numbackend.softmax(ops.apply("tanh", x) * 2.0 + K.variable(bias))])
    v = rng.standard_normal((1001, 300)).astype(np.float32)
    z = np.tanh(v.astype(np.float64)) * 2.0 + bias
    want = np.exp(z - z.max(axis=1, keepdims=True))
    yield softmax, [v], [want / want.sum(axis=1, keepdims=True)]

    x, r = K.placeholder((None, 400)), K.placeholder((None, 1))
    scale = np.linspace(0.5, 2, 300).astype(np.float32)
    y = x[:, 50:350] * r + K.variable(scale)
    windows = K.function([x, r], [y, numbackend.max(y, axis=1)])
    v = rng.standard_normal((1001, 400)).astype(np.float32)
    rv = rng.standard_normal((1001, 1)).astype(np.float32)
    want = v[:, 50:350].astype(np.float64) * rv + scale
    yield windows, [v, rv], [want, want.max(axis=1)]


@pytest.mark.parametrize("count", [2, 3, 7])
def test_row_parts_give_the_serial_loops_values(monkeypatch, count):
    """Split into any number of row parts (more than the pool has threads run one
    after another on the calling thread), a kernel's values are the serial
    loop's, bit for bit, whatever arguments it takes."""
    from jit_kernels import parts
    for function, inputs, want in row_part_functions():
        monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 1)
        serial = function(inputs)
        monkeypatch.setattr(parts, "row_part_count", lambda work, rows: count)
        calls = record_row_parts(monkeypatch)
        split = function(inputs)
        assert [c for c, _ in calls] == [count], function.explain()
        for got, expected, values in zip(split, serial, want):
            np.testing.assert_array_equal(got, expected)
            np.testing.assert_allclose(got, values, rtol=2e-6, atol=1e-6)


@needs_blas
def test_a_large_call_runs_row_parts_on_the_blas_threads(monkeypatch):
    """A large call splits its rows (a flat kernel: its values) between
    OpenBLAS's threads, one part a thread where each gets PARTS_MIN_WORK."""
    from jit_kernels import blas, parts
    calls = record_row_parts(monkeypatch)
    for function, inputs, want in row_part_functions():
        calls.clear()
        for got, values in zip(function(inputs), want):
            np.testing.assert_allclose(got, values, rtol=2e-6, atol=1e-6)
        ((count, rows),) = calls if blas.threads() > 1 else [(1, None)]
        assert count == min(blas.threads(), rows or 1)
    # a kernel is never split on a pool of one thread
    monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 1)
    calls.clear()
    function(inputs)
    assert calls == []


def test_large_calls_run_on_one_thread_until_the_row_part_has_compiled(monkeypatch, tuned):
    """Where tiers compile in the background, a kernel's row part compiles on the
    tiers' worker from its first large call, which runs the serial loop on the
    calling thread meanwhile; the row parts then give the same bits."""
    import threading

    from jit_kernels import parts
    from numbackend import tiers
    tuned(TIER_COMPILE="background")
    monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 2)
    calls = record_row_parts(monkeypatch)
    hold = threading.Event()
    holding = tiers.submit("holding the worker", lambda: hold.wait(120))
    try:
        # a kernel of its own: a module loaded by another test may have compiled its part
        x = K.placeholder((None,))
        function = K.function([x], [ops.apply("tanh", x) * 2.0 - x * x * 0.5])
        v = np.linspace(-3, 3, 300_001).astype(np.float32)
        inputs, v64 = [v], v.astype(np.float64)
        (kernel,) = function.plan.kernels
        first = function(inputs)[0]
        np.testing.assert_allclose(first, np.tanh(v64) * 2.0 - v64 * v64 * 0.5, rtol=2e-6, atol=1e-6)
        np.testing.assert_array_equal(function(inputs)[0], first)
        assert calls == [] and not kernel.ROW_PART.compiled
    finally:
        hold.set()
    assert holding.wait(120) and kernel.ROW_PART.later.wait(300)
    np.testing.assert_array_equal(function(inputs)[0], first)
    assert [count for count, _ in calls] == [2] and kernel.ROW_PART.compiled


def test_a_row_part_that_does_not_compile_leaves_large_calls_on_one_thread():
    from numbackend.codegen import RowPart

    def part():
        raise RuntimeError("no compiler today")
    row_part = RowPart(part)
    with pytest.warns(UserWarning, match="row part did not compile.*no compiler today"):
        assert not row_part.ready()
    assert not row_part.ready() and not row_part.compiled


def test_without_the_blas_pool_large_calls_run_the_parallel_loop_once_compiled(
        monkeypatch, tuned):
    """Where NumPy has no OpenBLAS pool, large calls run the serial loop until
    the parallel loop (Numba's threads) has compiled: from the second large
    call, in the background; then the parallel loop, with the same bits."""
    import threading

    from jit_kernels import parts
    from numbackend import tiers
    monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 0)
    tuned(TIER_COMPILE="background")
    hold = threading.Event()
    holding = tiers.submit("holding the worker", lambda: hold.wait(120))
    try:
        function, inputs, want = next(row_part_functions())
        (kernel,) = function.plan.kernels
        calls = []
        for variant in ("kernel_par", "kernel_ser"):
            original = getattr(kernel, variant)
            monkeypatch.setattr(kernel, variant,
                                lambda *a, variant=variant, original=original:
                                calls.append(variant) or original(*a))
        first = function(inputs)[0]
        np.testing.assert_allclose(first, want[0], rtol=2e-6, atol=1e-6)
        assert calls == ["kernel_ser"] and kernel.PARALLEL._compiles == {}
        calls.clear()
        np.testing.assert_array_equal(function(inputs)[0], first)  # the second starts it, held
        assert calls == ["kernel_ser"] and len(kernel.PARALLEL._compiles) == 1
    finally:
        hold.set()
    assert holding.wait(120)
    (compile_job,) = kernel.PARALLEL._compiles.values()
    assert compile_job.wait(300) and compile_job.error is None
    calls.clear()
    np.testing.assert_array_equal(function(inputs)[0], first)
    assert calls == ["kernel_par"]


def test_the_loop_is_chosen_by_the_work(monkeypatch):
    """Cheap kernels stay on the calling thread up to FUSED_PARALLEL_MIN_WORK
    elements; one with a vmath function goes to row parts from a quarter of
    that."""
    from jit_kernels import parts
    monkeypatch.setattr(parts, "row_part_count", lambda work, rows: 2)
    a = K.placeholder((None,))
    cheap = K.function([a], [a * a - 3.0 * a])
    costly = K.function([a], [ops.apply("tanh", a) * 2.0])
    (cheap_kernel,), (costly_kernel,) = cheap.plan.kernels, costly.plan.kernels
    for kernel in (cheap_kernel, costly_kernel):
        kernel.ROW_PART.part()  # compiled before its serial loop is wrapped in Python
    cheap_calls = record_loops(monkeypatch, cheap_kernel)
    costly_calls = record_loops(monkeypatch, costly_kernel)
    parts_calls = record_row_parts(monkeypatch)
    for size in (tuning.FUSED_PARALLEL_MIN_WORK // 2, tuning.FUSED_PARALLEL_MIN_WORK + 3):
        v = np.linspace(-5, 5, size).astype(np.float32)
        np.testing.assert_allclose(cheap([v])[0], v * v - 3 * v, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(costly([v])[0], np.tanh(v) * 2.0, rtol=1e-6, atol=1e-6)
    half, more = tuning.FUSED_PARALLEL_MIN_WORK // 2, tuning.FUSED_PARALLEL_MIN_WORK + 3
    assert cheap_calls == ["kernel_ser"] and costly_calls == []
    assert parts_calls == [(2, half), (2, more), (2, more)]


@pytest.mark.parametrize("shape", [(None,), (None, 1)])
def test_one_value_per_sample_runs_numpy_for_small_batches(monkeypatch, shape):
    """A group of one value per sample (a loss's tail) is computed with NumPy up to
    NUMPY_MAX_SAMPLES samples, so small batches compile nothing; larger ones use the
    kernel."""
    a = K.placeholder(shape, dtype="float64")
    f = K.function([a], [ops.apply("log", a * a + 1.0) - 0.5 * a])
    (kernel,) = f.plan.kernels
    assert "numpy|kernel" in f.explain()
    calls = record_loops(monkeypatch, kernel)
    for size in (3, tuning.NUMPY_MAX_SAMPLES, tuning.NUMPY_MAX_SAMPLES + 1):
        v = np.linspace(-5, 5, size).reshape((size,) + shape[1:])
        np.testing.assert_allclose(f([v])[0], np.log(v * v + 1.0) - 0.5 * v, rtol=1e-12,
                                   atol=1e-14)
    assert calls == ["kernel_ser"]


def test_kernel_source_never_contains_user_strings():
    name = "x); import os #"
    a = K.placeholder((None, 3), name=name)
    f = K.function([a], [a * 2.0 + 1.0])
    np.testing.assert_allclose(f([np.ones((2, 3))])[0], np.full((2, 3), 3.0))
    for src in f.kernel_sources() + [f.plan.source]:
        assert name not in src and "import os" not in src


def test_same_structure_in_two_graphs_is_one_kernel():
    def build():
        a = K.placeholder((None, 6))
        return K.function([a], [a * 4.0 - 1.0])
    f1, f2 = build(), build()
    assert f1.plan.kernels[0] is f2.plan.kernels[0]


def test_explain_lists_steps():
    x = K.placeholder((None, 4))
    w = K.variable(np.ones((4, 3)))
    f = K.function([x], [ops.apply("maximum", ops.apply("dot", x, w) + 1.0, 0.0)])
    text = f.explain()
    assert "dot" in text and "add -> maximum" in text and "(None, 3)" in text
    assert K.explain(f) == text


def test_second_process_compiles_nothing(tmp_path):
    # ... and loads without Numba's registry refresh, which imports its array
    # math among much else; the loaded serial and parallel kernels still compute.
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from numbackend import core as K, ops, codegen
        a = K.placeholder((None, 16))
        f = K.function([a], [ops.apply("sum", a * 2.0 + 1.0, axis=-1, keepdims=True) - a])
        ok = True
        for rows in (4, 40000):
            x = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16) % 7
            expected = (x * 2 + 1).sum(axis=-1, keepdims=True) - x
            ok &= np.allclose(f([x])[0], expected)
        print(codegen.numba_stats()["compiled"], codegen.stats["generated"], ok,
              "numba.np.arraymath" in sys.modules)
    """)
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            check=True).stdout.split()
    assert int(first[0]) > 0 and int(first[1]) > 0 and first[2:] == ["True", "True"]
    assert second == ["0", "0", "True", "False"]


def test_kernels_load_without_importing_scipy_linalg():
    # Numba's array-math module imports scipy.linalg (about 0.2 s of every start)
    # only to probe for BLAS; jit_kernels skips the probe and restores it after.
    pytest.importorskip("scipy.linalg")
    script = textwrap.dedent("""
        import sys
        import numba
        import numpy as np
        from jit_kernels import reduce
        assert reduce.row_sum(np.arange(5.0), 5) == 10.0
        print("scipy.linalg" in sys.modules)
        product = numba.njit(lambda a, b: np.dot(a, b))  # other njit code keeps its BLAS
        a = np.arange(6.0).reshape(2, 3)
        print(np.array_equal(product(a, a.T), a @ a.T))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]


def test_jit_kernels_import_with_numba_jit_disabled():
    # njit_cached then gets a plain function back from Numba and must leave it be
    script = "import numpy as np; from jit_kernels import reduce; print(reduce.row_sum(np.arange(5.0), 4))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env=dict(os.environ, NUMBA_DISABLE_JIT="1")).stdout.split()
    assert out == ["6.0"]


def test_cache_dir_falls_back_when_unwritable(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("NUMBACKEND_CACHE_DIR", str(ro / "sub"))
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        assert codegen.cache_dir().startswith(os.path.realpath(os.path.dirname(tempfile.gettempdir())))
    finally:
        ro.chmod(0o700)


# --- the call boundary ------------------------------------------------------


def test_wrong_number_of_inputs():
    a = K.placeholder((2,), name="alpha")
    f = K.function([a], [a + 1.0])
    with pytest.raises(ValueError, match="expected 1 input"):
        f([])


def test_wrong_shape_names_the_placeholder():
    a = K.placeholder((None, 3), name="alpha")
    f = K.function([a], [a + 1.0])
    with pytest.raises(ValueError, match=re.escape(repr(a.name)) + r".*\(None, 3\).*\(2, 4\)"):
        f([np.ones((2, 4))])


def test_wrong_rank_names_the_placeholder():
    a = K.placeholder((None, 3), name="alpha")
    f = K.function([a], [a + 1.0])
    for value in (np.ones(3), np.ones((2, 3, 1)), 1.0):
        with pytest.raises(ValueError, match=re.escape(repr(a.name)) + r".*\(None, 3\)"):
            f([value])


def test_uncastable_dtype_names_the_placeholder():
    a = K.placeholder((3,), dtype="int32", name="idx")
    f = K.function([a], [a + 1])
    with pytest.raises(TypeError, match=re.escape(repr(a.name))):
        f([np.ones(3) * 0.5])
    np.testing.assert_array_equal(f([np.arange(3, dtype=np.int64)])[0], [1, 2, 3])
    # integral floats are accepted: Keras feeds the learning phase as 1.0
    np.testing.assert_array_equal(f([np.arange(3.0)])[0], [1, 2, 3])


def test_missing_placeholder_is_reported_at_construction():
    a = K.placeholder((3,), name="a")
    b = K.placeholder((3,), name="bee")
    with pytest.raises(ValueError, match=re.escape(repr(b.name))):
        K.function([a], [a + b])


def test_incompatible_shapes_raise_at_construction():
    a = K.placeholder((None, 3))
    b = K.placeholder((4,))
    with pytest.raises(ValueError, match=r"add: incompatible shapes.*\(None, 3\).*\(4,\)"):
        a + b


def test_axis_out_of_range_raises_at_construction():
    a = K.placeholder((2, 3))
    with pytest.raises(ValueError, match="sum: axis 2 is out of range"):
        ops.apply("sum", a, axis=2)


def test_unknown_dtype_raises():
    with pytest.raises(TypeError, match="placeholder"):
        K.placeholder((2,), dtype="complex128")


# --- updates ------------------------------------------------------------------


def test_updates_use_values_before_the_call():
    v = K.variable(np.array([1.0, 2.0]))
    w = K.variable(np.array([10.0, 20.0]))
    f = K.function([], [v + w], updates=[(v, w), (w, v)])  # a swap
    out = f([])
    np.testing.assert_allclose(out[0], [11, 22])
    np.testing.assert_allclose(K.get_value(v), [10, 20])
    np.testing.assert_allclose(K.get_value(w), [1, 2])


def test_failing_call_changes_no_variable():
    v = K.variable(np.zeros(3))
    x = K.placeholder((None,))
    # the update's shape is only known at run time: a wrong one must change nothing
    f = K.function([x], [x * 2.0], updates=[(v, v + 1.0), (v, x)])
    with pytest.raises(ValueError, match="no variable was changed"):
        f([np.ones(5)])
    np.testing.assert_array_equal(K.get_value(v), np.zeros(3))


def test_returned_arrays_belong_to_the_caller():
    v = K.variable(np.ones(3))
    x = K.placeholder((3,))
    f = K.function([x], [x * 2.0, v])
    first = f([np.ones(3)])
    first[0][:] = -1
    first[1][:] = -1
    second = f([np.ones(3)])
    np.testing.assert_array_equal(second[0], [2, 2, 2])
    np.testing.assert_array_equal(K.get_value(v), [1, 1, 1])


def test_set_value_checks_shape_and_batch_set_is_atomic():
    v = K.variable(np.zeros((2, 2)))
    w = K.variable(np.zeros(3))
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        K.set_value(v, np.ones(3))
    with pytest.raises(ValueError):
        K.batch_set_value([(v, np.ones((2, 2))), (w, np.ones(2))])
    np.testing.assert_array_equal(K.get_value(v), np.zeros((2, 2)))
    K.batch_set_value([(v, np.ones((2, 2))), (w, np.ones(3))])
    assert K.batch_get_value([v, w])[1].tolist() == [1, 1, 1]


def test_eval_variable_and_expression():
    v = K.variable(np.arange(3.0))
    np.testing.assert_allclose(K.eval(v * 2.0), [0, 2, 4])
    assert K.eval(v).dtype == np.float32


def test_learning_phase_defaults_to_zero_when_not_fed():
    lp = K.learning_phase()
    x = K.placeholder((2,))
    f = K.function([x], [ops.apply("where", lp, x, -x)])
    np.testing.assert_array_equal(f([np.ones(2)])[0], [-1, -1])
    g = K.function([x, lp], [ops.apply("where", lp, x, -x)])
    np.testing.assert_array_equal(g([np.ones(2), 1])[0], [1, 1])


def test_operators_and_slicing():
    a = K.placeholder((4, 6))
    f = K.function([a], [a[1:3, ::2], -a, 2.0 ** a[0], a // 2.0, a % 4.0, a[..., 0], a[:, None, 1]])
    v = np.arange(24.0, dtype=np.float32).reshape(4, 6) - 7
    out = f([v])
    for got, want in zip(out, [v[1:3, ::2], -v, 2.0 ** v[0], v // 2, v % 4, v[..., 0], v[:, None, 1]]):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_slicing_out_of_range_raises():
    a = K.placeholder((4, 6))
    with pytest.raises(IndexError, match="getitem"):
        a[4]
    with pytest.raises(IndexError, match="too many indices"):
        a[1, 2, 3]


# --- regressions ----------------------------------------------------------------


def test_scalar_values_stay_scalar():
    x = K.placeholder(())
    assert K.function([x], [x * 2.0])([np.float32(2)])[0].shape == ()
    v = K.variable(3.0)
    assert K.eval(ops.apply("transpose", v, axes=())).shape == ()
    assert K.eval(ops.apply("take_index", K.variable([1.0, 2.0]), axis=0, index=1)).shape == ()


def test_stack_rejects_unequal_shapes_at_construction():
    with pytest.raises(ValueError, match=r"stack: tensors of different shapes.*\(1, 3\).*\(2, 3\)"):
        ops.apply("stack", K.placeholder((1, 3)), K.placeholder((2, 3)), axis=0)


def test_dot_with_vector_right_operand_has_a_gradient():
    from numbackend.autodiff import gradients
    x = K.variable(np.arange(12.0).reshape(4, 3))
    y = K.variable(np.array([1.0, -2.0, 0.5]))
    loss = ops.apply("sum", ops.apply("dot", x, y) ** 2.0)
    gx, gy = gradients(loss, [x, y])
    xv, yv = np.arange(12.0).reshape(4, 3), np.array([1.0, -2.0, 0.5])
    r = xv @ yv
    np.testing.assert_allclose(K.eval(gx), 2 * r[:, None] * yv[None, :], rtol=1e-5)
    np.testing.assert_allclose(K.eval(gy), 2 * xv.T @ r, rtol=1e-5)


def test_debug_levels_print_the_plan_and_sources(monkeypatch, capsys):
    a = K.placeholder((None, 3))
    monkeypatch.setenv("NUMBACKEND_DEBUG", "1")
    K.function([a], [a * 5.0 - 2.0])
    level1 = capsys.readouterr().out
    assert "fused[" in level1 and "multiply -> subtract" in level1 and "def kernel_par" not in level1
    monkeypatch.setenv("NUMBACKEND_DEBUG", "2")
    K.function([a], [a * 5.0 - 2.0])
    level2 = capsys.readouterr().out
    assert "def plan(" in level2 and "def kernel_par" in level2


def test_kernel_cache_is_keyed_by_the_jit_kernels_it_calls():
    # Numba's cache checks only a kernel's own file; a kernel compiled against an
    # older vmath.py or reduce.py must not be loaded (it returned garbage once),
    # nor one compiled with other LLVM options (set in jit_kernels/compiling.py),
    # nor a scan loop linked against an older blas.py or packed.py, nor a whole
    # call against an older conv.py or parts.py: every source file of
    # jit_kernels, and the tuning entries compiled into kernels, are in the key
    import hashlib

    import jit_kernels
    from jit_kernels import tuning
    folder = os.path.dirname(jit_kernels.__file__)
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and name not in ("tuning.py", "manifest.py"):  # tuning: below; manifest: no kernel
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    digest.update(repr(tuning.compiled_values()).encode())
    assert codegen.cache_dir().endswith(f"-{digest.hexdigest()[:12]}")


def test_reshape_to_a_stacked_shape_keeps_constant_dims_static():
    from numbackend import math as KM
    x = K.placeholder((None, 8))
    y = KM.reshape(x, ops.apply("stack", ops.apply("getitem", K.shape(x), key=(0,)), 4, 2, axis=0))
    assert y.shape == (None, 4, 2)
    np.testing.assert_array_equal(K.function([x], [y])([np.arange(16.0).reshape(2, 8)])[0],
                                  np.arange(16.0).reshape(2, 4, 2))


@pytest.mark.parametrize("covering", [True, False])
def test_products_with_column_slices_of_one_matrix_merge(covering):
    # Keras's per-gate kernels: x @ w[:, a:b] for slices covering w become one x @ w
    rng = np.random.default_rng(5)
    w_value = rng.standard_normal((4, 9))
    w = K.variable(w_value, dtype="float64")
    x = K.placeholder((None, 2, 4), dtype="float64")  # 3-D: the product reshapes for BLAS
    bounds = [(0, 2), (2, 7), (7, 9)] if covering else [(0, 2), (2, 7)]
    products = [ops.apply("dot", x, w[:, a:b]) for a, b in bounds]
    fn = K.function([x], products)
    dots = [s for s in fn.plan.steps if s.label == "dot"]
    assert len(dots) == (1 if covering else 2)
    xv = rng.standard_normal((3, 2, 4))
    for got, (a, b) in zip(fn([xv]), bounds):
        np.testing.assert_allclose(got, np.einsum("btk,kn->btn", xv, w_value[:, a:b]), rtol=1e-12)


def test_last_axis_slices_are_read_in_place_by_kernels():
    x = K.placeholder((None, 10))
    b = K.placeholder((3,))
    left, right = x[:, 1:4], x[..., 6:9]
    # a window under a row reduction
    row_max = ops.apply("max", x[:, 2:8], axis=-1, keepdims=True)
    fn = K.function([x, b], [ops.apply("tanh", left) * right + b, x[:, 2:8] - row_max])
    assert [s.label for s in fn.plan.steps if s.kind == "library"] == []
    xv = np.random.default_rng(3).standard_normal((300, 10)).astype(np.float32)
    bv = np.arange(3, dtype=np.float32)
    got = fn([xv, bv])
    np.testing.assert_allclose(got[0], np.tanh(xv[:, 1:4]) * xv[:, 6:9] + bv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], xv[:, 2:8] - xv[:, 2:8].max(axis=1, keepdims=True))
    # a run-time broadcast the static shapes did not foresee takes the NumPy path
    y = K.placeholder((None, None))
    fn = K.function([x, y], [x[:, 0:4] * y])
    yv = np.full((1, 4), 2.0, np.float32)
    np.testing.assert_allclose(fn([xv, yv])[0], xv[:, 0:4] * 2.0)


def test_a_narrow_window_of_a_wide_array_runs_the_serial_loop(monkeypatch):
    """The loop is chosen by the elements the kernel computes (8 x 4), not by the size
    of the array its window is read from (8 x 80000, above FUSED_PARALLEL_MIN_WORK)."""
    x = K.placeholder((None, 80000))
    fn = K.function([x], [ops.apply("tanh", x[:, 0:4]) * 2.0])
    (kernel,) = fn.plan.kernels
    calls = record_loops(monkeypatch, kernel)
    xv = np.random.default_rng(4).standard_normal((8, 80000)).astype(np.float32)
    assert xv.size >= tuning.FUSED_PARALLEL_MIN_WORK
    np.testing.assert_allclose(fn([xv])[0], np.tanh(xv[:, 0:4]) * 2.0, rtol=1e-6)
    assert calls == ["kernel_ser"]


def test_a_slice_that_is_also_returned_is_copied_once():
    x = K.placeholder((None, 6))
    part = x[:, 2:5]
    fn = K.function([x], [part, part * 2.0])
    xv = np.arange(12, dtype=np.float32).reshape(2, 6)
    got = fn([xv])
    np.testing.assert_array_equal(got[0], xv[:, 2:5])
    np.testing.assert_array_equal(got[1], xv[:, 2:5] * 2)
    assert got[0].flags.c_contiguous


def test_zeros_and_ones_like_ignore_the_values_of_x():
    # x * 0 would turn inf and NaN into NaN
    x = K.placeholder((None, 3))
    fn = K.function([x], [K.zeros_like(x), K.ones_like(x, dtype="int32")])
    zeros, ones = fn([np.array([[np.inf, -np.inf, np.nan]], dtype=np.float32)])
    np.testing.assert_array_equal(zeros, np.zeros((1, 3), np.float32))
    assert ones.dtype == np.int32
    np.testing.assert_array_equal(ones, np.ones((1, 3), np.int32))


def test_kernels_take_strided_inputs():
    # a transpose is a strided view: kernels read it as it is (row loops) or
    # through a copy that NumPy's reshape makes (flat loops)
    import numbackend as NB
    x, b = K.placeholder((None, 6)), K.placeholder((5,))
    t = NB.permute_dimensions(x, (1, 0))
    f = K.function([x, b], [NB.exp(t) * 2.0 + 1.0, t * b, NB.sum(t * b, axis=1)])
    v = np.random.default_rng(11).standard_normal((5, 6)).astype(np.float32)
    bv = np.arange(5, dtype=np.float32)
    flat, rows, sums = f([v, bv])
    np.testing.assert_allclose(flat, np.exp(v.T) * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(rows, v.T * bv, rtol=1e-6)
    np.testing.assert_allclose(sums, (v.T * bv).sum(1), rtol=1e-5, atol=1e-6)


# --- the whole plan as one compiled call ----------------------------------------

@needs_blas
def test_a_small_mlp_called_often_runs_as_one_call(plan_runs):
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((6, 5)), rng.standard_normal(5)
    w2, b2 = rng.standard_normal((5, 3)), rng.standard_normal(3)
    x = K.placeholder((None, 6), dtype="float64")
    h = numbackend.relu(numbackend.dot(x, K.variable(w1, dtype="float64")) + K.variable(b1, dtype="float64"))
    f = K.function([x], [numbackend.softmax(numbackend.dot(h, K.variable(w2, dtype="float64"))
                                   + K.variable(b2, dtype="float64"))])
    runs = plan_runs(f)
    for batch in (1, 2, 1, 4):
        xv = rng.standard_normal((batch, 6))
        z = np.maximum(xv @ w1 + b1, 0) @ w2 + b2
        want = np.exp(z - z.max(axis=1, keepdims=True))
        np.testing.assert_allclose(f([xv])[0], want / want.sum(axis=1, keepdims=True),
                                   rtol=1e-12, atol=1e-15)
    assert runs[0] == 1  # the first call only
    assert "one compiled call" in f.explain()


@needs_blas
def test_one_call_reads_values_replaced_between_calls(plan_runs):
    """A variable's value set anew, in Fortran order too, is what the next whole
    call reads (it reads the values' addresses again); after a call whose
    updates replace a value, the call holds the value it read no longer."""
    rng = np.random.default_rng(3)
    w = K.variable(rng.standard_normal((6, 5)), dtype="float64")
    x = K.placeholder((None, 6), dtype="float64")
    f = K.function([x], [numbackend.dot(x, w) * 2.0])
    runs = plan_runs(f)
    few, many = rng.standard_normal((2, 6)), rng.standard_normal((tuning.PACKED_WEIGHTS_MAX_ROWS + 1, 6))
    for _ in range(2):
        np.testing.assert_allclose(f([few])[0], 2 * few @ K.get_value(w), rtol=1e-12)
    fortran = rng.standard_normal((5, 6)).T
    w.value = fortran
    for xv in (few, many):  # its panels, and the value itself
        np.testing.assert_allclose(f([xv])[0], 2 * xv @ fortran, rtol=1e-12)
    K.set_value(w, 3 * fortran)
    for xv in (few, many):
        np.testing.assert_allclose(f([xv])[0], 6 * xv @ fortran, rtol=1e-12)
    assert runs[0] == 1
    wider = rng.standard_normal((6, 7))
    w.value = wider  # not through set_value: the call was compiled for 6 x 5, the plan runs
    np.testing.assert_allclose(f([few])[0], 2 * few @ wider, rtol=1e-12)
    assert runs[0] == 2

    v = K.variable(np.ones(3), dtype="float64")
    y = K.placeholder((3,), dtype="float64")
    g = K.function([y], [y * v], updates=[(v, v + 1.0)])
    runs = plan_runs(g)
    for n in range(1, 4):
        before = weakref.ref(v.value)
        np.testing.assert_array_equal(g([np.ones(3)])[0], [n] * 3)
        gc.collect()
        assert before() is None
    assert runs[0] == 1


@needs_blas
def test_large_inputs_run_the_plan(plan_runs):
    x = K.placeholder((None, 4), dtype="float64")
    f = K.function([x], [numbackend.dot(x, K.variable(np.eye(4), dtype="float64")) * 2.0])
    runs = plan_runs(f)
    big = np.ones((tuning.ONE_CALL_MAX_ELEMENTS // 4 + 1, 4))
    for _ in range(3):
        np.testing.assert_array_equal(f([big])[0], 2 * big)
    assert runs[0] == 3


@needs_blas
def test_one_call_results_belong_to_the_caller_and_updates_see_new_values(plan_runs):
    v = K.variable(np.ones(3), dtype="float64")
    x = K.placeholder((3,), dtype="float64")
    f = K.function([x], [x * 2.0, v, numbackend.reshape(v, (3, 1))], updates=[(v, v + x)])
    runs = plan_runs(f)
    for n in range(1, 5):
        doubled, value, column = f([np.ones(3)])
        np.testing.assert_array_equal(value, [n] * 3)  # the value before the call
        np.testing.assert_array_equal(column, [[n]] * 3)
        np.testing.assert_array_equal(K.get_value(v), [n + 1] * 3)
        doubled[:] = value[:] = column[:] = -1  # the caller's arrays: nothing else changes
    np.testing.assert_array_equal(K.get_value(v), [5] * 3)
    np.testing.assert_array_equal(f([np.ones(3)])[0], [2] * 3)
    assert runs[0] == 1


@needs_blas
def test_one_call_falls_back_to_the_plan_for_what_it_refuses(plan_runs):
    # the kernel is compiled for x's rows broadcasting against b's; rows of one row
    # at run time, and a product whose shapes do not match, go back to the plan
    x = K.placeholder((None, None), dtype="float64")
    b = K.placeholder((None, 3), dtype="float64")
    f = K.function([x, b], [numbackend.dot(x, K.variable(np.ones((2, 3)), dtype="float64")) + b])
    runs = plan_runs(f)
    xv, bv = np.ones((4, 2)), np.arange(12.0).reshape(4, 3)
    for _ in range(2):
        np.testing.assert_array_equal(f([xv, bv])[0], 2 + bv)
    np.testing.assert_array_equal(f([xv, bv[:1]])[0], 2 + np.repeat(bv[:1], 4, axis=0))
    assert runs[0] == 2
    with pytest.raises(ValueError, match=r"dot: cannot contract shapes \(4, 5\) and \(2, 3\)"):
        f([np.ones((4, 5)), bv])


def test_products_by_weights_run_packed_from_their_first_call(monkeypatch, tuned):
    """x @ w by a variable's value: from the first call (the way a product runs
    depends on the shapes alone, never on the call count) on w packed once,
    split between BLAS's threads; a value set anew is packed anew; more rows
    than PACKED_WEIGHTS_MAX_ROWS go to BLAS; weights of fewer than
    PACKED_WEIGHTS_MIN_ITEMS items are read in place (neither BLAS nor parts)."""
    from jit_kernels import packed
    # the plan, not its one-call form
    tuned(PACKED_WEIGHTS_MIN_ITEMS=1, ONE_CALL_AFTER=10**9)
    # beyond a tile of rows, as where a thread would get no panels (the next test
    # takes the rule's other side)
    rule = packed.weights_run_packed
    monkeypatch.setattr(packed, "weights_run_packed",
                        lambda rows, *rest: rows <= tuning.PACKED_WEIGHTS_MAX_ROWS and rule(rows, *rest))
    # (only Python functions are wrapped: a compiled one read by another would
    # not compile while wrapped)
    in_parts, product = [], packed.matmul_packed_in_parts
    monkeypatch.setattr(packed, "matmul_packed_in_parts",
                        lambda *a: in_parts.append(a[0].shape) or product(*a))
    rng = np.random.default_rng(5)
    for dtype in ("float32", "float64"):
        in_parts.clear()
        value = rng.standard_normal((7, 37)).astype(dtype)
        w = K.variable(value, dtype=dtype)
        x = K.placeholder((None, 7), dtype=dtype)
        f = K.function([x], [ops.apply("dot", x, w)])
        (step,) = [v for v in f.plan.run.__globals__.values() if isinstance(v, lowering.ProductByWeights)]
        through_blas, fallback = [], step.fallback
        step.fallback = lambda a, b, seen=through_blas, blas_call=fallback: (
            seen.append(a.shape) or blas_call(a, b))
        tol = 1e-5 if dtype == "float32" else 1e-12
        panels, most = [], tuning.PACKED_WEIGHTS_MAX_ROWS
        for rows in range(1, most + 2):
            a = rng.standard_normal((rows, 7)).astype(dtype)
            np.testing.assert_allclose(f([a])[0], a.astype(float) @ value, rtol=tol, atol=tol)
            panels.append(None if step.packing is None else step.packing[1])
        assert through_blas == [(most + 1, 7)] and in_parts == [(r, 7) for r in range(1, most + 1)]
        assert panels[0] is not None and all(p is panels[0] for p in panels)
        value = rng.standard_normal((7, 37)).astype(dtype)
        K.set_value(w, value)
        a = rng.standard_normal((1, 7)).astype(dtype)
        np.testing.assert_allclose(f([a])[0], a.astype(float) @ value, rtol=tol, atol=tol)
        assert step.packing[1] is not panels[-1] and in_parts[most:] == [(1, 7)]
        with tuning.override(PACKED_WEIGHTS_MIN_ITEMS=7 * 37 + 1):
            for rows in (2, most + 1):
                a = rng.standard_normal((rows, 7)).astype(dtype)
                np.testing.assert_allclose(f([a])[0], a.astype(float) @ value, rtol=tol, atol=tol)
        assert len(in_parts) == most + 1 and through_blas == [(most + 1, 7)] * 2


@needs_blas
def test_more_rows_than_a_tile_run_packed_where_every_thread_gets_panels_unless_written(
        monkeypatch, plan_runs):
    """Beyond PACKED_WEIGHTS_MAX_ROWS rows, a product by weights runs on its panels in
    parts where every thread gets some, in the plan and in the whole call alike,
    with the same bits; a function that writes the weights at every call (a
    training step) sends them through BLAS."""
    from jit_kernels import packed
    in_parts, product = [], packed.matmul_packed_in_parts
    monkeypatch.setattr(packed, "matmul_packed_in_parts",
                        lambda *a: in_parts.append(a[0].shape) or product(*a))
    rng = np.random.default_rng(8)
    rows = tuning.PACKED_WEIGHTS_MAX_ROWS + 2
    value = rng.standard_normal((128, 640)).astype("float32")  # PACKED_WEIGHTS_MIN_ITEMS and more
    w = K.variable(value)
    x = K.placeholder((None, 128))
    predict = K.function([x], [ops.apply("dot", x, w)])
    runs = plan_runs(predict)
    a = rng.standard_normal((rows, 128)).astype("float32")
    want = a.astype(float) @ value.astype(float)
    results = [predict([a])[0] for _ in range(3)]  # the plan, then the whole call
    assert runs[0] == 1 and in_parts == [(rows, 128)]
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5)
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])

    in_parts.clear()
    train = K.function([x], [ops.apply("dot", x, w)], updates=[(w, w * 1.0)])
    (step,) = [v for v in train.plan.run.__globals__.values() if isinstance(v, lowering.ProductByWeights)]
    through_blas, fallback = [], step.fallback
    step.fallback = lambda p, q: through_blas.append(p.shape) or fallback(p, q)
    np.testing.assert_allclose(train([a])[0], want, rtol=1e-5, atol=1e-5)
    assert in_parts == [] and through_blas == [(rows, 128)]


def test_products_by_weights_run_packed_up_to_one_tile_of_rows():
    """By default a product by weights runs packed up to one register tile of rows
    (tuning.PACKED_WEIGHTS_MAX_ROWS derived from jit_kernels.packed.TILE_ROWS)."""
    from jit_kernels import packed
    assert {e.name: e for e in tuning.entries()}["PACKED_WEIGHTS_MAX_ROWS"].default == packed.TILE_ROWS


@pytest.fixture
def registered():
    """Ops a test defines, removed from the registry after it."""
    names = []
    yield names
    for name in names:
        ops.OPS.pop(name, None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_new_elementwise_op_is_one_entry(registered, plan_runs, dtype):
    """One ``elementwise`` entry is all an element-wise op needs: it fuses with its
    neighbours into one kernel, differentiates, and runs compiled, in the plan and
    in the whole call."""
    from numbackend.ops.elementwise import elementwise
    registered.append("test_cube_plus_one")
    elementwise("test_cube_plus_one", 1, "({0} * {0} * {0} + {ct}(1))", lambda x: x ** 3 + 1,
                out="float",
                grad=lambda g, n: [ops.apply("multiply", g, ops.apply(
                    "multiply", ops.apply("square", n.inputs[0]), 3.0))])
    x = K.placeholder((None, 5), dtype=dtype)
    y = ops.apply("test_cube_plus_one", x * 2.0) - x
    (gx,) = numbackend.gradients(numbackend.sum(y), [x])
    f = K.function([x], [y, gx])
    # the value and its gradient: one fused kernel
    (step,) = f.plan.steps
    assert step.kind == "kernel"
    assert [n.op for n in step.nodes][:3] == ["multiply", "test_cube_plus_one", "subtract"]
    assert "(t0 * t0 * t0 + np." in f.kernel_sources()[0]
    runs = plan_runs(f)
    rng = np.random.default_rng(3)
    rtol = 1e-5 if dtype == "float32" else 1e-12
    for batch in (3, 2):  # the plan, then the whole call
        xv = rng.standard_normal((batch, 5)).astype(dtype)
        value, grad = f([xv])
        x64 = xv.astype(np.float64)
        np.testing.assert_allclose(value, (2 * x64) ** 3 + 1 - x64, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(grad, 3 * (2 * x64) ** 2 * 2 - 1, rtol=rtol, atol=rtol)
        assert value.dtype == grad.dtype == dtype
    assert runs[0] == 1 and "one compiled call" in f.explain()


def test_a_reduction_is_fused_by_its_entry(registered):
    """The code generator reads a reduction's fused form from its entry: a new
    reduction (the row max under another name, with its exact fold) fuses into a
    softmax's row kernel, the fold inlined, as ``max`` does."""
    from numbackend.ops.reductions import reduction
    registered.append("test_row_max")
    reduction("test_row_max", np.max, "rd.row_max({row}, {n})", fold="rd.maximum({acc}, {x})",
              grad=lambda g, n: [None])
    x = K.placeholder((None, 7))
    e = ops.apply("exp", x - ops.apply("test_row_max", x, axis=-1, keepdims=True))
    f = K.function([x], [e / ops.apply("sum", e, axis=-1, keepdims=True)])
    (source,) = f.kernel_sources()
    assert len(f.plan.steps) == 1 and "rd.maximum(" in source
    v = np.random.default_rng(4).standard_normal((70, 7)).astype(np.float32) * 30
    want = np.exp(v.astype(np.float64) - v.max(-1, keepdims=True))
    np.testing.assert_allclose(f([v])[0], want / want.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)
