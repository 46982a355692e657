"""jit_kernels.blas: matrix products from compiled code against NumPy's formula."""
import numpy as np
import pytest

from jit_kernels import blas, parts

pytestmark = pytest.mark.skipif(not blas.AVAILABLE, reason="NumPy's BLAS is not OpenBLAS ILP64")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m, n", [(5, 3), (1, 3), (5, 1), (1, 1)])  # one row or column: gemv
def test_matmul_matches_the_definition(dtype, transpose_a, transpose_b, m, n):
    rng = np.random.default_rng(3)
    k = 7
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    blas.matmul(a, b, out, transpose_a, transpose_b)
    left = a.T if transpose_a else a
    right = b.T if transpose_b else b
    want = np.array([[sum(float(left[i, j]) * float(right[j, c]) for j in range(k))
                      for c in range(n)] for i in range(m)])
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_matmul_of_empty_operands_is_zeros():
    out = np.ones((2, 3), np.float32)
    blas.matmul(np.empty((2, 0), np.float32), np.empty((0, 3), np.float32), out, False, False)
    np.testing.assert_array_equal(out, 0)
    with pytest.raises(ValueError, match="differ in type"):
        blas.matmul(np.ones((2, 4), np.float32), np.ones((4, 3)), out, False, False)
    blas.matmul(np.empty((0, 4)), np.empty((4, 3)), np.empty((0, 3)), False, False)


def test_matmul_rejects_shapes_or_types_that_do_not_match():
    out = np.zeros((2, 3))
    with pytest.raises(ValueError, match="shapes of a product do not match"):
        blas.matmul(np.ones((2, 4)), np.ones((5, 3)), out, False, False)
    with pytest.raises(ValueError, match="shapes of a product do not match"):
        blas.matmul(np.ones((2, 4)), np.ones((4, 3)), np.zeros((3, 3)), False, False)
    np.testing.assert_array_equal(out, 0)
    with pytest.raises(ValueError, match="differ in type"):
        blas.matmul(np.ones((2, 4), np.float32), np.ones((4, 3)), out, False, False)


needs_two_threads = pytest.mark.skipif(blas.threads() < 2, reason="OpenBLAS runs one thread here")


@needs_two_threads
def test_run_parts_runs_each_part_at_once_on_its_own_thread_with_single_threaded_products():
    import threading
    count = blas.threads()
    before = blas.threads()
    started = threading.Barrier(count, timeout=10)  # passes only if all parts run at once
    a = np.random.default_rng(0).standard_normal((300, 300))

    def part(i):
        started.wait()
        out = np.empty_like(a)
        blas.matmul(a, a * i, out, False, False)
        return i, threading.get_ident(), blas.threads(), out

    results = parts.run_parts(count, part)
    assert [r[0] for r in results] == list(range(count))
    assert results[0][1] == threading.get_ident()  # the first part on the calling thread
    assert len({r[1] for r in results}) == count
    assert all(r[2] == 1 for r in results)
    for i, r in enumerate(results):
        np.testing.assert_allclose(r[3], a @ (a * i), rtol=1e-12, atol=1e-9)
    assert blas.threads() == before


@needs_two_threads
def test_run_parts_raises_a_part_s_error_and_restores_the_thread_count():
    before = blas.threads()

    def part(i):
        if i == 1:
            raise KeyError("part 1")
        return i

    with pytest.raises(KeyError, match="part 1"):
        parts.run_parts(2, part)
    assert blas.threads() == before
    assert parts.run_parts(2, lambda i: i * 10) == [0, 10]


@needs_two_threads
def test_run_parts_lets_go_of_its_parts_when_it_returns():
    # held until the garbage collector ran, megabytes of arrays made malloc hand
    # the next arrays fresh pages, each a page fault
    import gc
    import weakref

    def run_on_an_array():
        held = np.ones(1000)
        parts.run_parts(2, lambda i: held.sum())
        return weakref.ref(held)

    enabled = gc.isenabled()
    gc.disable()
    try:
        assert run_on_an_array()() is None
    finally:
        if enabled:
            gc.enable()


def test_run_parts_refuses_more_parts_than_threads():
    with pytest.raises(ValueError, match="cannot run"):
        parts.run_parts(blas.threads() + 1, lambda i: i)
    with pytest.raises(ValueError, match="cannot run"):
        parts.run_parts(0, lambda i: i)
