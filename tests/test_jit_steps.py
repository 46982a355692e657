"""jit_kernels.steps: a scan's steps as blocks called by one precompiled loop."""
import time

import numpy as np
import pytest

from jit_kernels import blas, packed, parts, steps, tuning
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
            _address(out), int(transpose_a), 0, -1]
    block = steps.block_address(steps.PRODUCT_BLOCKS[np.dtype(dtype).itemsize])
    steps.run_steps(0, 1, 1, False, np.array([block], np.int64), d, _no_moves())
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_product_block_on_a_range_of_panels_writes_those_columns_alone(dtype):
    # three parts of the panels of a 5 x 7 @ 7 x (4 panels and a bit) product,
    # each into its columns of one out, the last with the part-filled panel
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64")
    r = np.random.default_rng(2)
    m, k = 5, 7
    width = packed.panel_width(np.dtype(dtype).itemsize)
    n = 4 * width + 3
    a, b = r.standard_normal((m, k)).astype(dtype), r.standard_normal((k, n)).astype(dtype)
    panels = packed.pack(b, False)
    out = np.full((m, n), np.nan, dtype)
    block = steps.block_address(steps.PRODUCT_BLOCKS[np.dtype(dtype).itemsize])
    for first, end in ((1, 3), (3, 5)):  # panel 0 left alone
        d = np.array([[_address(a), m, k, _address(b), k, n, 0, _address(panels), panels.shape[0],
                       _address(out), 0, first, end]], np.int64)
        steps.run_steps(0, 1, 1, False, np.array([block], np.int64), d, _no_moves())
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isnan(out[:, :width]).all()
    np.testing.assert_allclose(out[:, width:], want[:, width:],
                               rtol=1e-5 if dtype == np.float32 else 1e-12,
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


@njit_cached(nogil=True)
def _mean_plus_one_block(d):
    """A block: the mean of the d[2] float64 items at d[0], plus one, written to d[1]."""
    source = parts.array_at(d[0], (d[2],), np.float64)
    target = parts.array_at(d[1], (1,), np.float64)
    target[0] = source.sum() / d[2] + 1.0


def _shared_chain(threads, steps_count, fails=False):
    """A run_steps_shared of two groups of ``threads`` tasks a step: task j of the
    first writes y[j] = mean(acc) + 1 (reading all of acc), task j of the second
    copies y[j] to acc[j].  Each step then adds exactly one to every acc[j]
    where the second group waits for the whole first, and the first for the
    step before; a task reading acc while another writes it sees a mean with a
    fraction.  Returns (acc, the arguments of run_steps_shared); where
    ``fails``, task 0's block raises from step 1 on."""
    acc, y = np.zeros(threads), np.zeros(threads)
    mean, copy = steps.block_address(_mean_plus_one_block), steps.block_address(steps.copy_block)
    blocks = np.array([mean] * threads + [copy] * threads, np.int64)
    descriptors = np.zeros((2 * threads, 6), np.int64)
    tasks = np.zeros((2 * threads, steps.TASK_WIDTH), np.int64)
    for j in range(threads):
        descriptors[j, :3] = _address(acc), _address(y) + 8 * j, threads
        descriptors[threads + j, :4] = _address(y) + 8 * j, _address(acc) + 8 * j, 1, 8
        tasks[j, [steps.TASK_CALLS, steps.TASK_CALLS + 1]] = j, j + 1
        tasks[threads + j, [steps.TASK_CALLS, steps.TASK_CALLS + 1]] = threads + j, threads + j + 1
        tasks[threads + j, steps.TASK_AFTER] = threads
    moving = _no_moves()
    if fails:  # task 0's block adds one, and raises where its d[2], moved to t, is not 0
        blocks[0] = steps.block_address(_add_one_block)
        descriptors[0, :3] = _address(y), _address(y), 0
        moving = np.array([[0, 2, 0, 1, 0]], np.int64)
        tasks[0, [steps.TASK_MOVES, steps.TASK_MOVES + 1]] = 0, 1
    calls = np.arange(2 * threads, dtype=np.int64)
    counters = np.zeros(steps.SHARED_COUNTERS, np.int64)
    return acc, (0, steps_count, steps_count, False, blocks, descriptors, moving, calls, tasks,
                 counters)


def _run_on_threads(threads, arguments):
    """run_steps_shared(*arguments) from ``threads`` Python threads at once (it
    releases the GIL); the exceptions each raised (None where none)."""
    import threading
    errors = [None] * threads

    def run(i):
        try:
            steps.run_steps_shared(*arguments)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            errors[i] = exc
    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers), "a thread of a shared run never returned"
    return errors


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_threads_sharing_steps_run_each_task_after_those_it_waits_for(threads):
    # more threads than this machine may have cores: a waiting thread gives up
    # its core, so the one it waits for runs
    acc, arguments = _shared_chain(threads, 2000)
    assert _run_on_threads(threads, arguments) == [None] * threads
    np.testing.assert_array_equal(acc, np.full(threads, 2000.0))
    counters = arguments[-1]
    assert counters[steps.SHARED_DONE] == 2000 * 2 * threads


def test_calls_of_a_shared_run_one_after_another_run_every_task_in_the_first():
    # a thread that starts late finds its work done: on one thread, the first
    # call runs every task and the others return at once
    acc, arguments = _shared_chain(4, 50)
    steps.run_steps_shared(*arguments)
    np.testing.assert_array_equal(acc, np.full(4, 50.0))
    for _ in range(3):
        steps.run_steps_shared(*arguments)
    np.testing.assert_array_equal(acc, np.full(4, 50.0))


def test_an_exception_in_a_shared_run_is_raised_and_stops_the_other_threads():
    _, arguments = _shared_chain(3, 100, fails=True)
    errors = _run_on_threads(3, arguments)
    raised = [e for e in errors if e is not None]
    assert len(raised) == 1 and isinstance(raised[0], ValueError), errors
    assert "d[2] is not 0" in str(raised[0])
    counters = arguments[-1]
    assert counters[steps.SHARED_FAILED] == 1
    assert counters[steps.SHARED_DONE] < 100 * 2 * 3  # the steps after it did not run


@njit_cached(nogil=True)
def _slow_block(d):
    """A block: runs for d[0] ns at step 0 (d[1], moved to t, is 0), else returns."""
    if d[1] == 0:
        start = parts.now_ns()
        while parts.now_ns() - start < d[0]:
            pass


def test_a_wait_longer_than_a_late_start_is_counted():
    # two threads, 2 groups of 2 tasks a step; the first step's task 0 runs
    # 30 ms: the thread that did not take it waits for it at the next group
    slow = steps.block_address(_slow_block)
    blocks = np.full(4, slow, np.int64)
    descriptors = np.zeros((4, 2), np.int64)
    descriptors[0, 0] = 30_000_000
    descriptors[1:, 1] = 1  # never slow
    tasks = np.zeros((4, steps.TASK_WIDTH), np.int64)
    for task in range(4):
        tasks[task, [steps.TASK_CALLS, steps.TASK_CALLS + 1]] = task, task + 1
        tasks[task, steps.TASK_AFTER] = 2 * (task // 2)
    tasks[0, [steps.TASK_MOVES, steps.TASK_MOVES + 1]] = 0, 1
    moving = np.array([[0, 1, 0, 1, 0]], np.int64)  # d[1] = t
    counters = np.zeros(steps.SHARED_COUNTERS, np.int64)
    arguments = (0, 20, 20, False, blocks, descriptors, moving, np.arange(4, dtype=np.int64),
                 tasks, counters)
    assert _run_on_threads(2, arguments) == [None, None]
    assert counters[steps.SHARED_DONE] == 20 * 4
    assert counters[steps.SHARED_LONG_WAITS] >= 1
    counters[:] = 0
    steps.run_steps_shared(*arguments)  # on one thread: no wait at all
    assert counters[steps.SHARED_LONG_WAITS] == 0


def test_runs_that_waited_long_twice_in_a_row_put_the_parts_on_one_thread(monkeypatch):
    # as late starts do (parts.run_on_pool): a long wait in steps shorter than
    # it on average, two runs in a row; not in long steps, nor in turns
    saved = blas.pool_state.copy()  # the compiled code's array: restored in place
    try:
        monkeypatch.setattr(parts, "_late_shared_runs", 0)
        blas.pool_state[0] = 0
        late = tuning.PARTS_LATE_START_NS
        parts.note_shared_run(1, 10 * late, 100)  # 100 short steps with a long wait
        parts.note_shared_run(0, 10 * late, 100)  # then one without: the count starts again
        parts.note_shared_run(1, 200 * late, 100)  # long steps: not late
        parts.note_shared_run(1, 10 * late, 100)
        assert blas.pool_state[0] == 0
        parts.note_shared_run(1, 10 * late, 100)
        assert blas.pool_state[0] > time.monotonic_ns()
    finally:
        blas.pool_state[:] = saved

