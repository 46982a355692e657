"""jit_kernels.parts: compiled parts run on OpenBLAS's threads or one after another."""
import numpy as np
import pytest

from jit_kernels import blas, parts


def _fill_row(d):
    """Row d[1] of the (d[2], d[3]) float64 matrix at d[0] gets d[1] + 0.5 in every column."""
    out = parts.array_at(d[0], (d[2], d[3]), np.float64)
    for j in range(d[3]):
        out[d[1], j] = d[1] + 0.5


_fill_row_part = parts.compiled_part(_fill_row)


@pytest.mark.parametrize('count', [1, 2, 3])
@pytest.mark.parametrize('threads', [1, 2])
def test_parts_run_every_row_once(monkeypatch, count, threads):
    """Each descriptor row runs once, on the pool where it has as many threads
    as rows, else one after another (3 rows on 2 threads, or on 1)."""
    if threads > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    monkeypatch.setattr(blas, 'threads', lambda: threads)
    out = np.zeros((count, 5))
    descriptors = [[out.ctypes.data, i, count, 5] for i in range(count)]
    parts.run(_fill_row_part, np.array(descriptors, np.int64))
    np.testing.assert_array_equal(out, np.arange(count)[:, None] + np.full((count, 5), 0.5))


def _scaled_plus_row(d):
    """A compiled epilogue (see parts.CompiledEpilogue): out = block * s + v, the
    float32 row vector v (from the block's first column on) and the float32
    scalar s at the descriptor's first two numbers; the block's and out's rows
    d[5] and d[6] items apart."""
    rows, columns, first = d[1], d[2], d[7]
    block = parts.array_at(d[3], (rows, d[5]), np.float32)
    out = parts.array_at(d[4], (rows, d[6]), np.float32)
    vector = parts.array_at(d[parts.EPILOGUE_HEAD], (first + columns,), np.float32)
    scale = parts.array_at(d[parts.EPILOGUE_HEAD + 1], (1,), np.float32)[0]
    for i in range(rows):
        for j in range(columns):
            out[i, j] = block[i, j] * scale + vector[first + j]


_scaled_plus_row_part = parts.compiled_part(_scaled_plus_row)


def _scaled_plus_row_epilogue(columns=4):
    """The epilogue of :func:`_scaled_plus_row` with a scale of 2; and its vector."""
    vector, scale = np.arange(columns, dtype=np.float32), np.array([2.0], np.float32)
    epilogue = parts.CompiledEpilogue(_scaled_plus_row_part, np.float32,
                                      [parts.address(vector), parts.address(scale)],
                                      keep=(vector, scale), widths=[vector.size])
    return epilogue, vector


def test_compiled_epilogue_from_python_and_from_compiled_code():
    """The epilogue's part gets each block's rows, columns and addresses and the
    numbers it was made with, called from Python or from compiled code."""
    epilogue, vector = _scaled_plus_row_epilogue()
    block = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.zeros_like(block)
    epilogue(block, out)
    np.testing.assert_array_equal(out, block * 2 + vector)
    out[:] = 0
    parts.run_epilogue(epilogue.template, block[1:], out[1:])  # as compiled loops call it
    np.testing.assert_array_equal(out, np.vstack([np.zeros(4), block[1:] * 2 + vector]))


def test_compiled_epilogue_on_a_block_of_columns():
    """run_epilogue_rows hands the part the rows' distances in the block and in
    out, and the first column its row vectors start from: a part of a
    product's columns, written from a block of its own."""
    epilogue, vector = _scaled_plus_row_epilogue(columns=10)
    block = np.arange(21, dtype=np.float32).reshape(3, 7) - 5
    out = np.zeros((3, 10), np.float32)
    parts.run_epilogue_rows(epilogue.template, block[:, :4], out[:, 6:], 6)
    want = np.zeros((3, 10), np.float32)
    want[:, 6:] = block[:, :4] * 2 + vector[6:]
    np.testing.assert_array_equal(out, want)


def test_compiled_epilogue_refuses_blocks_it_does_not_fit():
    """Other columns than its row vectors', another type, or arrays it cannot
    read by address raise before the part runs."""
    epilogue, _ = _scaled_plus_row_epilogue()
    out = np.zeros((2, 5), np.float32)
    with pytest.raises(parts.EpilogueMismatch, match="rows of 5"):
        epilogue(np.ones((2, 5), np.float32), out)
    with pytest.raises(parts.EpilogueMismatch, match="float64"):
        epilogue(np.ones((2, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="C-contiguous"):
        epilogue(np.ones((4, 8), np.float32)[:, ::2], np.zeros((4, 4), np.float32))
    assert not out.any()


def _row_thread_count(d):
    """Row d[1] of the (d[2],) int64 vector at d[0] gets OpenBLAS's thread count as
    a part sees it (what a product inside the part would use)."""
    out = parts.array_at(d[0], (d[2],), np.int64)
    out[d[1]] = parts.threads_from_compiled()


_row_thread_count_part = parts.compiled_part(_row_thread_count)


def test_parts_run_on_the_calling_thread_while_the_pool_is_contended():
    """After runs that found a thread late (another process had its core),
    parts run one after another on the calling thread, each once, with
    OpenBLAS held to one thread inside them (its threads would wait for the
    busy core too), and OpenBLAS's count is restored after."""
    if blas.threads() < 2 or not parts.pool_from_compiled():
        pytest.skip("OpenBLAS has fewer than two threads here")
    import time
    count, before = blas.threads(), blas.threads()
    saved = blas.pool_state.copy()
    try:
        blas.pool_state[0] = time.monotonic_ns() + 10**10  # contended for ten seconds
        assert time.monotonic_ns() < blas.pool_state[0]
        out = np.zeros((count, 5))
        parts.run(_fill_row_part, np.array([[out.ctypes.data, i, count, 5] for i in range(count)],
                                           np.int64))
        np.testing.assert_array_equal(out, np.arange(count)[:, None] + np.full((count, 5), 0.5))
        seen = np.zeros(count, np.int64)
        parts.run(_row_thread_count_part,
                  np.array([[seen.ctypes.data, i, count] for i in range(count)], np.int64))
        assert seen.tolist() == [1] * count and blas.threads() == before
        blas.pool_state[0] = 0
        assert time.monotonic_ns() >= blas.pool_state[0]
        seen[:] = 0
        parts.run(_row_thread_count_part,
                  np.array([[seen.ctypes.data, i, count] for i in range(count)], np.int64))
        assert (seen > 0).all()
    finally:
        blas.pool_state[:] = saved
