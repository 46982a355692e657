"""Ops Keras inserts on the way (K.identity where a layer returns its input,
K.in_train_phase / K.switch on the learning phase) cost no step of a plan and
keep a function on its fast paths: fused kernels and the whole compiled call."""

import numpy as np
import pytest

import numbackend as K
from jit_kernels import blas
from numbackend import compiler

needs_blas = pytest.mark.skipif(not blas.AVAILABLE,
                                reason="NumPy's BLAS is not OpenBLAS ILP64: plans run from Python")


@pytest.fixture
def plan_runs(monkeypatch):
    """Functions compile their plan as one call from their second small call on;
    returns a function counting how often a Function's plan ran from Python."""
    monkeypatch.setattr(compiler, "ONE_CALL_AFTER", 2)

    def count(fn):
        runs, run = [0], fn.plan.run

        def counted(*arrays):
            runs[0] += 1
            return run(*arrays)
        fn.plan.run = counted
        return runs
    return count


def test_identity_inside_an_elementwise_chain_fuses():
    x = K.placeholder((None, 5))
    y = K.exp(K.identity(x * 2.0) - 1.0) + K.identity(x)
    f = K.function([x], [y])
    assert [s.kind for s in f.plan.steps] == ["kernel"]
    assert "identity" not in K.explain(f)
    a = np.linspace(-2, 2, 15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_allclose(f([a])[0], np.exp(a * 2 - 1) + a, rtol=1e-6)


def test_identity_of_an_input_or_a_variable_is_a_copy():
    x = K.placeholder((2, 3), dtype="float64")
    v = K.variable(np.arange(6.0).reshape(2, 3), dtype="float64")
    y = x * 3.0
    f = K.function([x], [K.identity(x), K.identity(v), y, K.identity(y),
                         K.identity(K.reshape(x, (3, 2)))])
    a = np.ones((2, 3))
    for _ in range(3):
        same_x, same_v, tripled, tripled_again, reshaped = f([a])
        np.testing.assert_array_equal(same_x, np.ones((2, 3)))
        np.testing.assert_array_equal(same_v, np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(tripled_again, np.full((2, 3), 3.0))
        same_x[:] = same_v[:] = tripled_again[:] = reshaped[:] = -1
        np.testing.assert_array_equal(a, np.ones((2, 3)))
        np.testing.assert_array_equal(K.get_value(v), np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(tripled, np.full((2, 3), 3.0))  # a result of its own


@needs_blas
def test_identity_results_are_copies_in_the_whole_call_too(plan_runs):
    x = K.placeholder((None, 3), dtype="float64")
    v = K.variable(np.eye(3), dtype="float64")
    h = K.dot(x, v)
    f = K.function([x], [K.identity(x), K.identity(v), h, K.identity(h)])
    runs = plan_runs(f)
    a = np.arange(6.0).reshape(2, 3)
    for _ in range(4):
        same_x, same_v, product, product_again = f([a])
        np.testing.assert_array_equal(product_again, np.arange(6.0).reshape(2, 3))
        same_x[:] = same_v[:] = product_again[:] = -1
        np.testing.assert_array_equal(a, np.arange(6.0).reshape(2, 3))
        np.testing.assert_array_equal(K.get_value(v), np.eye(3))
        np.testing.assert_array_equal(product, np.arange(6.0).reshape(2, 3))
    assert runs[0] == 1 and f._one_call
