"""A product by weights runs the element-wise group after it (a Dense layer's
bias and activation) in its parts, on each block of rows while in cache
(program.LibraryWithEpilogue, packed.matmul_packed_then)."""
import numpy as np
import pytest

from numbackend import core as K
from numbackend import lowering, ops
from tests.kernel_helpers import needs_blas, report_threads

pytestmark = needs_blas

K_IN, N_OUT = 256, 9 * 32 + 5  # weights of PACKED_WEIGHTS_MIN_ITEMS and more, a narrow last panel


def _dense(dtype, bias=True, seed=0, bias_shape=(N_OUT,)):
    """``relu(x @ w + b) * 0.5`` (without b where not ``bias``): x, the result,
    the variable of w, and the NumPy formula of it in float64."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K_IN, N_OUT)).astype(dtype)
    b = rng.standard_normal(bias_shape).astype(dtype)
    x = K.placeholder((None, K_IN), dtype=dtype)
    weights = K.variable(w, dtype=dtype)
    z = ops.apply("dot", x, weights)
    if bias:
        z = z + K.variable(b, dtype=dtype)
    y = ops.apply("maximum", z, 0.0) * 0.5

    def formula(a):
        z = a.astype(np.float64) @ w.astype(np.float64) + (b if bias else 0)
        return np.maximum(z, 0) * 0.5
    return x, y, weights, formula


def _functions(dtype, bias=True, updates=False, bias_shape=(N_OUT,)):
    """The function with the group in the product's parts, the same function
    with it as a kernel of its own after the product, and the formula."""
    made = []
    for takes in (True, False):
        x, y, weights, formula = _dense(dtype, bias, bias_shape=bias_shape)
        with pytest.MonkeyPatch.context() as patch:
            if not takes:
                patch.setattr(lowering.Dot, "takes_epilogue", lambda self, node: False)
            made.append(K.function([x], [y], updates=[(weights, weights * 1.0)] if updates else []))
    return made[0], made[1], formula


@pytest.fixture
def epilogue_runs(monkeypatch):
    """The products that ran on their panels in parts, each as (rows, with an epilogue)."""
    from jit_kernels import packed
    runs, product = [], packed.matmul_packed_in_parts
    monkeypatch.setattr(packed, "matmul_packed_in_parts",
                        lambda a, p, out, *epilogue: runs.append((a.shape[0], bool(epilogue)))
                        or product(a, p, out, *epilogue))
    return runs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_dense_layers_bias_and_activation_run_in_its_product_parts(
        monkeypatch, epilogue_runs, dtype, bias, threads):
    """The group runs in each part on its columns of each block of rows: a row
    vector read from the part's first column, and a flat group (no bias) over
    rows that are not whole; the values are NumPy's formula's and the bits
    those of the group run after the product."""
    from jit_kernels import blas, packed
    if min(threads, 2) > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    report_threads(monkeypatch, threads)
    fused, apart, formula = _functions(dtype, bias)
    labels = [step.label for step in fused.plan.steps]
    assert len(labels) == 1 and labels[0].startswith("dot+fused")
    assert [step.kind for step in apart.plan.steps] == ["library", "kernel"]
    rng = np.random.default_rng(threads)
    fused([rng.standard_normal((1, K_IN)).astype(dtype)])  # the part, a later tier, from the second call
    tol = 1e-4 if dtype == "float32" else 1e-12
    blocks = 2 * packed.block_rows(K_IN, np.dtype(dtype).itemsize) + 1
    for rows in (1, 7, blocks):
        a = rng.standard_normal((rows, K_IN)).astype(dtype)
        epilogue_runs.clear()
        value = fused([a])[0]
        assert epilogue_runs == [(rows, True)]
        np.testing.assert_allclose(value, formula(a), rtol=tol, atol=tol)
        np.testing.assert_array_equal(value, apart([a])[0])
        assert value.dtype == dtype


@pytest.mark.parametrize("bias_shape", [(N_OUT,), (1, N_OUT)])
def test_the_group_runs_after_a_product_that_is_not_on_panels(epilogue_runs, bias_shape):
    """A training step writes the weights at every call: its product goes through
    BLAS, and the group (with its scalar, and its bias of either shape) runs
    after it, as its own kernel."""
    fused, apart, formula = _functions("float32", updates=True, bias_shape=bias_shape)
    assert fused.plan.steps[0].label.startswith("dot+fused")
    a = np.random.default_rng(1).standard_normal((20, K_IN)).astype("float32")
    value = fused([a])[0]
    assert epilogue_runs == []
    np.testing.assert_allclose(value, formula(a), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(value, apart([a])[0])


def test_the_plan_and_the_whole_call_give_the_same_bits(plan_runs, tuned, epilogue_runs):
    """The whole call runs the product, then the group's kernel: the bits of the
    plan's parts, and of its first call, which runs the group after the
    product (the part being a later tier)."""
    fused, _, formula = _functions("float32")
    runs = plan_runs(fused)
    tuned(ONE_CALL_AFTER=3)
    a = np.random.default_rng(2).standard_normal((5, K_IN)).astype("float32")
    results = [fused([a])[0] for _ in range(4)]  # the plan twice, then the whole call
    assert runs[0] == 2 and epilogue_runs == [(5, False), (5, True)]
    np.testing.assert_allclose(results[0], formula(a), rtol=1e-4, atol=1e-4)
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


def test_the_epilogue_part_is_a_later_tier(tuned, epilogue_runs):
    """The epilogue's part compiles from the second call, where tiers compile in
    the background on the tiers' worker: the group runs after its product
    meanwhile; the calls then run it in the product's parts, with the same
    bits."""
    import threading
    import time

    from numbackend import tiers
    tuned(TIER_COMPILE="background")
    hold = threading.Event()
    holding = tiers.submit("holding the worker", lambda: hold.wait(120))
    try:
        # a group of its own: a module loaded by another test may have compiled its part
        x, y, _, formula = _dense("float32", seed=5)
        f = K.function([x], [ops.apply("tanh", y) * 3.0])
        a = np.random.default_rng(3).standard_normal((7, K_IN)).astype("float32")
        first = f([a])[0]
        np.testing.assert_allclose(first, np.tanh(formula(a)) * 3.0, rtol=1e-5, atol=1e-5)
        for _ in range(3):
            np.testing.assert_array_equal(f([a])[0], first)
        assert epilogue_runs == [(7, False)] * 4
    finally:
        hold.set()
    assert holding.wait(120)
    deadline = time.monotonic() + 300
    while not epilogue_runs[-1][1] and time.monotonic() < deadline:
        time.sleep(0.01)  # the part's compile, queued behind the held job
        f([a])
    np.testing.assert_array_equal(f([a])[0], first)
    assert epilogue_runs[-1] == (7, True)
