"""jit_kernels.packed: products by a right operand packed or read in place, against
the definition."""
import numpy as np
import pytest

from jit_kernels import blas, packed, tuning
from tests.kernel_helpers import report_threads

WIDTH32 = packed.panel_width(4)


def definition(a, b):
    """a @ b summed element by element in float64."""
    return np.array([[sum(float(a[i, j]) * float(b[j, c]) for j in range(a.shape[1]))
                      for c in range(b.shape[1])] for i in range(a.shape[0])]).reshape(
                          a.shape[0], b.shape[1])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("k, n", [(3, 1), (7, 32), (5, 3 * 32 + 5), (2, 64), (37, 70), (0, 4), (4, 0)])
def test_pack_lays_the_columns_out_in_panels_padded_with_zeros(dtype, transpose_b, k, n):
    """panels[j, i, x] = op(b)[i, j * width + x], and 0 past op(b)'s last column,
    also where the memory it is given held NaN before."""
    width = packed.panel_width(np.dtype(dtype).itemsize)
    b = np.random.default_rng(k * 100 + n).standard_normal((n, k) if transpose_b else (k, n))
    b = b.astype(dtype)
    op_b = b.T if transpose_b else b
    for _ in range(3):
        freed = np.full(-(-n // width) * k * width, np.nan, dtype)
        del freed  # the panels may take its memory
        panels = packed.pack(b, transpose_b)
        assert panels.shape == (-(-n // width), k, width)
        for j in range(panels.shape[0]):
            for i in range(k):
                for x in range(width):
                    column = j * width + x
                    assert panels[j, i, x] == (op_b[i, column] if column < n else 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m, k, n", [
    (1, 3, 1), (5, 7, 3), (6, 2, WIDTH32), (7, 9, WIDTH32 + 1), (13, 5, 2 * WIDTH32 - 1),
    (packed.TILE_ROWS * 9 + 4, 3, 5),  # several tiles of rows, a last one of 4
    # one row: ONE_ROW_PANELS panels at a time, then one by one, then a narrow one
    (1, 11, 5 * WIDTH32 + 3), (1, 6, 4 * WIDTH32),
    (packed.TILE_ROWS * 8 + 1, 3, 4 * WIDTH32 + 1),  # a last tile of one row
    (4, 0, 6), (0, 4, 6), (4, 5, 0)])  # empty operands
def test_matmul_packed_matches_the_definition(dtype, transpose_b, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    panels = packed.pack(np.ascontiguousarray(b.T) if transpose_b else b, transpose_b)
    width = packed.panel_width(a.itemsize)
    assert panels.shape == (-(-n // width), k, width)
    out = np.full((m, n), np.nan, dtype)
    packed.matmul_packed(a, panels, out)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, definition(a, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, k, n", [
    (1, 3, 1), (5, 7, 3), (6, 2, WIDTH32), (7, 9, WIDTH32 + 1), (13, 5, 2 * WIDTH32 - 1),
    (1, 11, 5 * WIDTH32 + 3), (4, 0, 6), (0, 4, 6), (4, 5, 0)])
def test_matmul_in_place_matches_the_definition(dtype, m, k, n):
    # b's rows further apart than their length: a view of a wider array
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n + 3)).astype(dtype)[:, 2:2 + n]
    out = np.full((m, n), np.nan, dtype)
    packed.matmul(a, b, out)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, definition(a, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("on_panels", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_a_scan_steps_product_is_the_hoisted_one_or_computed(on_panels, transpose_b):
    rng = np.random.default_rng(5)
    sequence = rng.standard_normal((4, 7, 5)).astype(np.float32)
    b = rng.standard_normal((5, WIDTH32 + 3)).astype(np.float32)
    operand = np.ascontiguousarray(b.T) if transpose_b else b
    panels = packed.pack_where(operand, np.bool_(transpose_b), on_panels)
    assert panels.shape[0] == (2 if on_panels else 0)
    hoisted = packed.steps_product(sequence, 1, 4, 2, 6, operand, np.bool_(transpose_b), True)
    assert hoisted.shape == (3, 4, WIDTH32 + 3)
    for t in range(1, 4):
        want = definition(sequence[t, 2:6], b)
        got = packed.hoisted_or_step_product(hoisted, t - 1, sequence[t, 2:6], operand, panels,
                                             np.bool_(transpose_b), on_panels, True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        stepped = packed.hoisted_or_step_product(hoisted[:0], 0, sequence[t, 2:6], operand, panels,
                                                 np.bool_(transpose_b), on_panels, False)
        np.testing.assert_allclose(stepped, want, rtol=1e-5, atol=1e-5)


def test_matmul_each_multiplies_each_pair_of_a_stack():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 8, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5, 2 * WIDTH32 + 3)).astype(np.float32)
    out = np.full((3, 8, b.shape[2]), np.nan, np.float32)
    packed.matmul_each(a, b, out)
    for i in range(3):
        np.testing.assert_allclose(out[i], definition(a[i], b[i]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stacks of a product differ in length"):
        packed.matmul_each(a[:2], b, out)


def test_products_read_and_write_rows_apart():
    # rows of a and out further apart than their length: views of bigger arrays
    rng = np.random.default_rng(1)
    a_whole = rng.standard_normal((14, 11)).astype(np.float32)
    b = rng.standard_normal((5, 19)).astype(np.float32)
    a = a_whole[::2, 3:8]
    for multiply in (lambda out: packed.matmul_packed(a, packed.pack(b, False), out),
                     lambda out: packed.matmul(a, b, out)):
        out_whole = np.full((7, 40), np.nan, np.float32)
        out = out_whole[:, 10:29]
        multiply(out)
        np.testing.assert_allclose(out, definition(a, b), rtol=1e-5, atol=1e-5)
        assert np.isnan(out_whole[:, :10]).all() and np.isnan(out_whole[:, 29:]).all()


def test_products_reject_what_does_not_match():
    b = np.ones((4, 3))
    panels = packed.pack(b, False)
    out = np.zeros((2, 3))
    for multiply, right in ((packed.matmul_packed, panels), (packed.matmul, b)):
        with pytest.raises(ValueError, match="shapes of a product do not match"):
            multiply(np.ones((2, 5)), right, out)
        with pytest.raises(ValueError, match="shapes of a product do not match"):
            multiply(np.ones((2, 4)), right, np.zeros((3, 3)))
        with pytest.raises(ValueError, match="shapes of a product do not match"):
            multiply(np.ones((2, 4)), right, np.zeros((2, 3 + packed.panel_width(8))))
        with pytest.raises(ValueError, match="differ in type"):
            multiply(np.ones((2, 4), np.float32), right, out)
        with pytest.raises(ValueError, match="not contiguous"):
            multiply(np.ones((2, 8))[:, ::2], right, out)
    with pytest.raises(ValueError, match="not contiguous"):
        packed.matmul(np.ones((2, 4)), np.ones((4, 6))[:, ::2], out)
    np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, k, n", [
    (1, 9, 1), (1, 7, WIDTH32), (3, 5, 2 * WIDTH32 + 1), (2, 4, 5 * WIDTH32 - 3),
    (1, 6, 9 * WIDTH32 + 2), (4, 0, 6), (0, 4, 6), (4, 5, 0)])
def test_matmul_packed_in_parts_matches_the_definition(monkeypatch, threads, dtype, m, k, n):
    """The panels split between 1, 2 or 3 parts (3 run one after another on 2
    threads), a last part of fewer panels, or of a narrow last panel."""
    if min(threads, 2) > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    report_threads(monkeypatch, threads)
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    packed.matmul_packed_in_parts(a, packed.pack(b, False), out)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, definition(a, b), rtol=tol, atol=tol)


def test_matmul_packed_in_parts_rejects_what_does_not_match():
    a, b = np.ones((2, 3), np.float32), np.ones((3, 5), np.float32)
    with pytest.raises(ValueError, match="shapes of a product do not match"):
        packed.matmul_packed_in_parts(a, packed.pack(np.ones((4, 5), np.float32), False),
                                      np.empty((2, 5), np.float32))
    with pytest.raises(ValueError, match="differ in type"):
        packed.matmul_packed_in_parts(a, packed.pack(b.astype(np.float64), False),
                                      np.empty((2, 5), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        packed.matmul_packed_in_parts(np.ones((2, 6), np.float32)[:, ::2], packed.pack(b, False),
                                      np.empty((2, 5), np.float32))


def test_packed_products_call_their_helpers_with_one_signature():
    # no literal arguments (each pattern of literals compiles a callee again), and
    # the packed panels passed to _product as the matrix that matmul passes
    from numba import types

    from tests.source_checks import compiled_calls, literal_calls
    matrix, panels = types.float32[:, ::1], types.float32[:, :, ::1]
    epilogue = types.int64[::1]
    then = (matrix, panels, matrix, epilogue, types.int64)
    for function, args in [(packed.matmul, (matrix, matrix, matrix)),
                           (packed.matmul_packed, (matrix, panels, matrix)),
                           (packed.matmul_packed_then, then),
                           (packed._last_panel_product, (matrix, types.int64, types.int64, matrix, matrix,
                                                          types.int64, types.int64))]:
        assert literal_calls(function, args) == [], function.py_func.__name__
    columns = types.float32[:, :]  # a part's columns of out (parts of matmul_packed_in_parts)
    products = {signature for function, args in [(packed.matmul, (matrix, matrix, matrix)),
                                                      (packed.matmul_packed_then, then),
                                                      (packed.matmul_packed_then,
                                                       (matrix, panels, columns, epilogue, types.int64))]
                for callee, signature in compiled_calls(function, args) if callee is packed._product}
    assert len(products) == 1, products
    (product,) = products
    tiles = {str(signature) for callee, signature in compiled_calls(packed._product, product.args)
             if callee is packed._tile}
    tiles |= {str(signature) for callee, signature in compiled_calls(
        packed._last_panel_product, (matrix, types.int64, types.int64, matrix, columns, types.int64,
                                     types.int64))
        if callee is packed._tile}
    assert len(tiles) == 1, tiles


def test_weights_run_packed_up_to_a_tile_then_where_every_thread_gets_panels(tune):
    """A product by weights runs packed up to PACKED_WEIGHTS_MAX_ROWS rows; beyond,
    where every thread gets panels; never where the function writes the weights
    at every call, nor for weights under PACKED_WEIGHTS_MIN_ITEMS."""
    tile = tuning.PACKED_WEIGHTS_MAX_ROWS
    assert packed.weights_run_packed(tile, 784, 512, 4, 2, True)
    assert packed.weights_run_packed(tile + 1, 784, 512, 4, 2, False)
    assert packed.weights_run_packed(256, 784, 512, 4, 2, False)
    assert packed.weights_run_packed(256, 4096, 4096, 4, 1, False)  # 64 MB, on one thread
    assert not packed.weights_run_packed(256, 784, 512, 4, 2, True)  # a training step
    assert not packed.weights_run_packed(256, 784, 10, 4, 2, False)  # one panel: a thread idle
    # as many threads as panels, and one more
    panels = 512 // packed.panel_width(4)
    assert packed.weights_run_packed(256, 784, 512, 4, panels, False)
    assert not packed.weights_run_packed(256, 784, 512, 4, panels + 1, False)
    tune(PACKED_WEIGHTS_MIN_ITEMS=784 * 512 + 1)
    assert not packed.weights_run_packed(256, 784, 512, 4, 1, False)
    assert packed.weights_run_packed(tile, 784, 512, 4, 1, False)


def test_runs_packed_up_to_a_block_then_where_alone():
    """packed.runs_packed: up to a block of rows (of a whole chunk of k) always
    packed; beyond, only where BLAS would have no more threads."""
    for itemsize in (4, 8):
        block = packed.block_rows(packed.chunk_depth(itemsize), itemsize)
        assert block >= packed.TILE_ROWS and block % packed.TILE_ROWS == 0
        for alone in (False, True):
            assert packed.runs_packed(1, itemsize, alone)
            assert packed.runs_packed(block, itemsize, alone)
            for rows in (block + 1, 100 * block):
                assert packed.runs_packed(rows, itemsize, alone) == alone


def test_chunks_and_blocks_follow_the_cache_entries():
    """A chunk of k spans PACKED_CHUNK_BYTES of a panel, a block of rows over it
    PACKED_BLOCK_BYTES of the left operand (whole tiles), more rows where k is
    shorter than a chunk."""
    for itemsize in (4, 8):
        width = packed.panel_width(itemsize)
        depth = packed.chunk_depth(itemsize)
        assert depth == tuning.PACKED_CHUNK_BYTES // (width * itemsize)
        rows = tuning.PACKED_BLOCK_BYTES // (depth * itemsize) // packed.TILE_ROWS * packed.TILE_ROWS
        assert packed.block_rows(10 * depth, itemsize) == packed.block_rows(depth, itemsize) == rows
        assert packed.block_rows(depth // 2, itemsize) >= 2 * rows - packed.TILE_ROWS
        assert packed.block_rows(1, itemsize) % packed.TILE_ROWS == 0


CHUNK32 = packed.chunk_depth(4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m, n", [(7, WIDTH32 + 5), (7, 5 * WIDTH32 + 3), (1, 5 * WIDTH32 + 3)])
def test_products_over_several_chunks_of_k_match_numpy(dtype, transpose_b, m, n):
    """k over two chunks and a part of a third, and rows over two blocks and a
    last block of one row (ONE_ROW_PANELS panels at a time), or one row: on
    packed panels, in parts and read in place, against NumPy in float64."""
    itemsize = np.dtype(dtype).itemsize
    depth = packed.chunk_depth(itemsize)
    k = 2 * depth + 3
    if m > 1:
        m = 2 * packed.block_rows(k, itemsize) + 1
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dtype == "float32" else 1e-11
    panels = packed.pack(np.ascontiguousarray(b.T) if transpose_b else b, transpose_b)
    for product, operand in [(packed.matmul_packed, panels), (packed.matmul_packed_in_parts, panels),
                             (packed.matmul, b)]:
        out = np.full((m, n), np.nan, dtype)
        product(a, operand, out)
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.sqrt(k))


def test_a_value_sums_its_chunks_alike_whatever_rows_and_panels_surround_it():
    """The bits of out[i, c] do not depend on which rows and panels a product
    covers: a block's rows alone, a range of panels, or column c in the narrow
    last panel rather than a full one (a scan's threads share a step's product
    by its panels and must give one thread's bits)."""
    width = WIDTH32
    k = 2 * CHUNK32 + 7
    rows = packed.block_rows(k, 4)
    rng = np.random.default_rng(3)
    # a last block of two rows: a tile of few rows keeps several sets of sums,
    # folded at the end of each chunk, so that there the chunks show in the bits
    a = rng.standard_normal((rows + 2, k)).astype("float32")
    b = rng.standard_normal((k, 3 * width)).astype("float32")
    whole = np.empty((a.shape[0], 3 * width), "float32")
    panels = packed.pack(b, False)
    packed.matmul_packed(a, panels, whole)
    part = np.empty((2, width), "float32")
    packed.matmul_packed(np.ascontiguousarray(a[rows:]), panels[1:2], part)
    np.testing.assert_array_equal(part, whole[rows:, width:2 * width])
    narrow = np.empty((a.shape[0], width + 3), "float32")  # columns width.. in a last panel
    packed.matmul_packed(a, packed.pack(np.ascontiguousarray(b[:, :width + 3]), False), narrow)
    np.testing.assert_array_equal(narrow, whole[:, :width + 3])
    # and not by chance: summed in another order the bits differ
    assert not np.array_equal(whole, (a.astype(np.float64) @ b).astype("float32"))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 2 * 6 + 1, None])
def test_products_run_an_epilogue_on_each_block_of_their_columns(monkeypatch, threads, m):
    """With a compiled epilogue (out = product * 2 + v here), each part runs it on
    its columns of each block of rows, reading the row vector from its first
    column on: the bits of the parts' product then the epilogue, over several blocks
    and chunks, a narrow last panel, and one row (ONE_ROW_PANELS panels at a
    time)."""
    from tests.test_jit_parts import _scaled_plus_row_epilogue
    if min(threads, 2) > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    report_threads(monkeypatch, threads)
    k = 2 * CHUNK32 + 3
    m = 2 * packed.block_rows(k, 4) + 1 if m is None else m
    n = 7 * WIDTH32 + 3
    rng = np.random.default_rng(m + threads)
    a = rng.standard_normal((m, k)).astype("float32")
    panels = packed.pack(rng.standard_normal((k, n)).astype("float32"), False)
    epilogue, vector = _scaled_plus_row_epilogue(columns=n)
    out, plain = np.full((m, n), np.nan, "float32"), np.empty((m, n), "float32")
    packed.matmul_packed_in_parts(a, panels, out, epilogue.template)
    packed.matmul_packed_in_parts(a, panels, plain)
    np.testing.assert_array_equal(out, plain * np.float32(2) + vector)
    want = (a.astype(np.float64) @ packed_columns(panels, n)) * 2 + vector
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def packed_columns(panels, n):
    """The k x n matrix whose panels :func:`packed.pack` laid out in ``panels``."""
    return np.concatenate(list(panels), axis=1)[:, :n].astype(np.float64)
