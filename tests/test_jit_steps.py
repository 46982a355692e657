"""jit_kernels.steps: a scan's steps as blocks called by one precompiled loop."""
import numpy as np
import pytest

from jit_kernels import blas, packed, parts, steps
from jit_kernels.compiling import njit_cached


def _address(a):
    return a.__array_interface__["data"][0]


def _no_moves():
    return np.zeros((0, 5), np.int64)


@njit_cached(nogil=True)
def _add_one_block(d):
    """A block: the float64 item at d[0] plus one, written to d[1]; ValueError
    where d[2] is not 0."""
    if d[2] != 0:
        raise ValueError("add one: d[2] is not 0")
    source = parts.array_at(d[0], (1,), np.float64)
    target = parts.array_at(d[1], (1,), np.float64)
    target[0] = source[0] + 1.0


def test_each_step_reads_and_writes_where_its_moving_addresses_say():
    # x[t] + 1 into y[t], the addresses moved by t (t from 5 down to 2 where
    # reversed), and a state alternating between two items: the flip
    x, y = np.arange(10.0) * 3, np.zeros(10)
    block = steps.block_address(_add_one_block)
    for reverse in (False, True):
        y[:] = 0
        descriptors = np.zeros((1, 3), np.int64)
        moves = np.array([[0, 0, _address(x), 8, 0], [0, 1, _address(y), 8, 0]], np.int64)
        steps.run_steps(4, 8, 10, reverse, np.array([block], np.int64), descriptors, moves)
        ts = [10 - 1 - n for n in range(4, 8)] if reverse else list(range(4, 8))
        want = np.zeros(10)
        want[ts] = x[ts] + 1
        np.testing.assert_array_equal(y, want)
    pair = np.array([5.0, 0.0])  # a count: each step reads one item and writes the other
    descriptors = np.zeros((1, 3), np.int64)
    moves = np.array([[0, 0, _address(pair), 0, 8], [0, 1, _address(pair) + 8, 0, -8]], np.int64)
    steps.run_steps(0, 7, 7, False, np.array([block], np.int64), descriptors, moves)
    assert pair[7 % 2] == 5.0 + 7  # the last step, t = 6, wrote item 1 - 6 % 2


def test_an_exception_in_a_block_is_raised_by_the_loop():
    a, b = np.zeros(1), np.zeros(1)
    descriptors = np.array([[_address(a), _address(b), 1]], np.int64)
    with pytest.raises(ValueError, match="d\\[2\\] is not 0"):
        steps.run_steps(0, 3, 3, False, np.array([steps.block_address(_add_one_block)], np.int64),
                        descriptors, _no_moves())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a, transpose_b, on_panels",
                         [(False, False, False), (True, False, False), (False, True, False),
                          (False, False, True), (False, True, True)])
def test_a_product_block_multiplies_as_numpy(dtype, transpose_a, transpose_b, on_panels):
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64")
    r = np.random.default_rng(1)
    m, k, n = 5, 7, 19
    a = r.standard_normal((k, m) if transpose_a else (m, k)).astype(dtype)
    b = r.standard_normal((n, k) if transpose_b else (k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    panels = packed.pack(b, transpose_b) if on_panels else None
    d = np.zeros((1, steps.PRODUCT_WIDTH), np.int64)
    d[0] = [_address(a), m, k, _address(b), *b.shape, int(transpose_b),
            0 if panels is None else _address(panels), 0 if panels is None else panels.shape[0],
            _address(out), int(transpose_a)]
    block = steps.block_address(steps.PRODUCT_BLOCKS[np.dtype(dtype).itemsize])
    steps.run_steps(0, 1, 1, False, np.array([block], np.int64), d, _no_moves())
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_a_copy_block_copies_lines_between_strided_places():
    # columns 1:3 of a (4, 5) int16 matrix into columns 2:4 of a (4, 6) one
    source = np.arange(20, dtype=np.int16).reshape(4, 5)
    target = np.zeros((4, 6), np.int16)
    d = np.array([[_address(source) + 2, _address(target) + 4, 4, 4, 10, 12]], np.int64)
    steps.run_steps(0, 1, 1, False, np.array([steps.block_address(steps.copy_block)], np.int64), d,
                    _no_moves())
    want = np.zeros((4, 6), np.int16)
    want[:, 2:4] = source[:, 1:3]
    np.testing.assert_array_equal(target, want)
