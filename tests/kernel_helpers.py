"""Helpers shared by the jit_kernels tests, and the mark of tests that need OpenBLAS."""
import numpy as np
import pytest

from jit_kernels import blas, tuning

needs_blas = pytest.mark.skipif(not blas.AVAILABLE,
                                reason="NumPy's BLAS is not OpenBLAS ILP64: plans run from Python")


@pytest.fixture(autouse=True)
def all_threads():
    """Run every kernel on all threads, however small the arrays, so that the
    tests see the parallel loops (the serial fallback is the same code)."""
    with tuning.override(LIBRARY_PARALLEL_MIN_WORK=0):
        yield


def random_arrays(seed):
    """A ``random(shape, dtype=float64)`` drawing standard normal arrays from one seeded stream."""
    rng = np.random.default_rng(seed)

    def random(shape, dtype=np.float64):
        return rng.standard_normal(shape).astype(dtype)
    return random


def inner(a, b):
    """<a, b> in float64."""
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))
