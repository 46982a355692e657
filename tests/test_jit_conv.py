"""jit_kernels.conv against brute-force NumPy definitions.

Forward kernels are compared with explicit loops over output positions and
kernel taps.  Backward kernels are checked as the adjoints of those
brute-force forward maps: for a linear map A, <dy, A x> == <A^T dy, x> for
random x and dy.  Arrays are tiny and dtypes few, so each Numba kernel
compiles only once or twice.
"""

import collections

import numpy as np
import pytest

from jit_kernels import blas, conv, direct, parts, winograd
from tests.kernel_helpers import all_threads, inner, random_arrays  # noqa: F401 - all_threads is an autouse fixture

random = random_arrays(1234)


def axis_padding(size, k, stride, dilation, padding):
    """(output size, padding before) written out from TensorFlow's rules."""
    span = (k - 1) * dilation + 1
    if padding == 'valid':
        return (size - span) // stride + 1, 0
    if padding == 'causal':
        return (size - 1) // stride + 1, span - 1
    out = -(-size // stride)
    return out, max((out - 1) * stride + span - size, 0) // 2


def windows(spatial, kernel, strides, dilation, padding):
    """Yield (output index, tap index, input index) for every tap that lands
    inside the input."""
    rank = len(spatial)
    strides = strides if isinstance(strides, tuple) else (strides,) * rank
    dilation = dilation if isinstance(dilation, tuple) else (dilation,) * rank
    out, pad = zip(*(axis_padding(*a, padding) for a in zip(spatial, kernel, strides, dilation)))
    for o in np.ndindex(*out):
        for t in np.ndindex(*kernel):
            i = tuple(o[a] * strides[a] + t[a] * dilation[a] - pad[a] for a in range(rank))
            if all(0 <= i[a] < spatial[a] for a in range(rank)):
                yield o, t, i


def out_spatial(spatial, kernel, strides, dilation, padding):
    rank = len(spatial)
    strides = strides if isinstance(strides, tuple) else (strides,) * rank
    dilation = dilation if isinstance(dilation, tuple) else (dilation,) * rank
    return tuple(axis_padding(*a, padding)[0]
                 for a in zip(spatial, kernel, strides, dilation))


def reference_conv(x, w, strides, padding, dilation):
    spatial, kernel = x.shape[1:-1], w.shape[:-2]
    y = np.zeros((x.shape[0],) + out_spatial(spatial, kernel, strides, dilation, padding)
                 + (w.shape[-1],))
    for o, t, i in windows(spatial, kernel, strides, dilation, padding):
        y[(slice(None),) + o] += x[(slice(None),) + i] @ w[t]
    return y


def reference_conv_transpose(x, w, output_shape, strides, padding, dilation):
    """Scatter form: every input position adds x @ w[t].T at o*stride + t*dilation - pad."""
    y = np.zeros(output_shape)
    for o, t, i in windows(output_shape[1:-1], w.shape[:-2], strides, dilation, padding):
        y[(slice(None),) + i] += x[(slice(None),) + o] @ w[t].T
    return y


def reference_depthwise(x, w, strides, padding, dilation):
    spatial, kernel = x.shape[1:-1], w.shape[:-2]
    channels, mult = w.shape[-2:]
    y = np.zeros((x.shape[0],) + out_spatial(spatial, kernel, strides, dilation, padding)
                 + (channels * mult,))
    for o, t, i in windows(spatial, kernel, strides, dilation, padding):
        product = x[(slice(None),) + i][:, :, None] * w[t][None]
        y[(slice(None),) + o] += product.reshape(x.shape[0], -1)
    return y


# (input shape, kernel shape, strides, padding, dilation): ranks 1-3, odd
# sizes, both paddings (and causal), several strides and dilations, in_ch=1
# (im2col a tap at a time); 1x1 stride-1 kernels take the plain matmul, the
# rest im2col.
CONV_CASES = [
    ((2, 11, 3), (3, 3, 4), 1, 'valid', 1),
    ((2, 11, 3), (3, 3, 4), 2, 'same', 1),
    ((2, 10, 3), (3, 3, 2), 3, 'causal', 2),
    ((1, 9, 5), (4, 5, 3), 1, 'same', 2),
    ((2, 7, 9, 3), (3, 3, 3, 4), 1, 'valid', 1),
    ((2, 7, 9, 3), (3, 2, 3, 4), (2, 1), 'same', (1, 2)),
    ((2, 8, 7, 2), (2, 3, 2, 3), (3, 2), 'same', 1),
    ((1, 9, 7, 6), (3, 3, 6, 5), 2, 'valid', (2, 1)),
    ((2, 7, 9, 1), (3, 3, 1, 4), 1, 'same', 1),
    ((2, 9, 11, 1), (3, 5, 1, 3), (2, 1), 'valid', (1, 2)),
    ((2, 5, 7, 3), (1, 1, 3, 4), 1, 'same', 1),
    ((2, 7, 5, 3), (1, 1, 3, 4), 2, 'valid', 1),
    ((2, 7, 9, 8), (3, 3, 8, 5), 1, 'same', 1),
    ((2, 8, 7, 8), (3, 3, 8, 9), 1, 'valid', 1),
    ((2, 5, 6, 7, 2), (2, 3, 2, 2, 3), 2, 'same', 1),
    ((1, 3, 6, 5, 8), (1, 3, 3, 8, 4), 1, 'same', 1),
    ((1, 5, 5, 6, 3), (3, 2, 3, 3, 2), 1, 'valid', (1, 2, 1)),
]


@pytest.mark.parametrize('x_shape, w_shape, strides, padding, dilation', CONV_CASES)
def test_conv(x_shape, w_shape, strides, padding, dilation):
    x, w = random(x_shape), random(w_shape)
    y = conv.conv_forward(x, w, strides, padding, dilation)
    expected = reference_conv(x, w, strides, padding, dilation)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)

    dy = random(expected.shape)
    dx = conv.conv_backward_input(dy, w, x_shape, strides, padding, dilation)
    dw = conv.conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)
    assert dx.shape == x_shape and dw.shape == w_shape
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-11)


def test_conv_backward_matches_jacobian_columns():
    """The adjoint identity for every unit vector: dx is exactly the transpose
    of the brute-force map applied to dy (a small 2-D strided 'same' case)."""
    x_shape, w = (1, 5, 4, 2), random((3, 3, 2, 2))
    dy = random((1, 3, 2, 2))
    dx = conv.conv_backward_input(dy, w, x_shape, 2, 'same', 1)
    for index in np.ndindex(*x_shape):
        unit = np.zeros(x_shape)
        unit[index] = 1
        assert dx[index] == pytest.approx(inner(dy, reference_conv(unit, w, 2, 'same', 1)),
                                          abs=1e-12)


@pytest.mark.parametrize('channels', [1, 4])
def test_conv_batch_chunks(monkeypatch, channels, tune):
    """Several im2col chunks (one image each) give the same results as one."""
    x, w = random((3, 6, 7, channels)), random((3, 3, channels, 8))
    expected = reference_conv(x, w, 1, 'same', 1)
    dy = random(expected.shape)
    whole = (conv.conv_backward_input(dy, w, x.shape, 1, 'same'),
             conv.conv_backward_kernel(x, dy, w.shape, 1, 'same'))
    tune(CONV_COLUMN_CHUNK_BYTES=1)
    np.testing.assert_allclose(conv.conv_forward(x, w, 1, 'same'), expected, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(conv.conv_backward_input(dy, w, x.shape, 1, 'same'), whole[0],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.conv_backward_kernel(x, dy, w.shape, 1, 'same'), whole[1],
                               rtol=1e-12, atol=1e-12)


def _split_results(x, w, dy):
    return (conv.conv_forward(x, w, 1, 'same'),
            conv.conv_backward_input(dy, w, x.shape, 1, 'same'),
            conv.conv_backward_kernel(x, dy, w.shape, 1, 'same'))


@pytest.mark.parametrize('threads, count', [(2, 2), (4, 3)])  # 5 images: 3 + 2, 2 + 2 + 1
def test_conv_batch_split_between_threads(monkeypatch, threads, count, tune):
    """The batch splits into parts of whole images, one per thread, none empty,
    whose results are those of the whole batch at once."""
    x, w = random((5, 6, 7, 3)), random((3, 3, 3, 4))
    dy = random((5, 6, 7, 4))
    whole = _split_results(x, w, dy)
    calls = []

    def one_after_another(count, part):
        calls.append(count)
        return [part(i) for i in range(count)]

    tune(CONV_COLUMN_CHUNK_BYTES=1)  # one image a chunk
    tune(PARTS_PYTHON_HANDOFF_WORK=1)  # split however little the work
    monkeypatch.setattr(blas, 'threads', lambda: threads)
    monkeypatch.setattr(parts, 'run_parts', one_after_another)
    split = _split_results(x, w, dy)
    assert calls == [count] * 3
    np.testing.assert_allclose(split[0], reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)
    for got, expected in zip(split[1:], whole[1:]):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(blas.threads() < 2, reason='OpenBLAS runs one thread here')
def test_conv_batch_split_runs_on_blas_threads(monkeypatch, tune):
    x, w = random((4, 6, 7, 3)), random((3, 3, 3, 4))
    dy = random((4, 6, 7, 4))
    whole = _split_results(x, w, dy)
    calls = []
    run_parts = parts.run_parts
    monkeypatch.setattr(parts, 'run_parts', lambda count, part: calls.append(count) or run_parts(count, part))
    tune(CONV_COLUMN_CHUNK_BYTES=1)
    tune(PARTS_PYTHON_HANDOFF_WORK=1)
    split = _split_results(x, w, dy)
    assert calls == [min(blas.threads(), 4)] * 3
    for got, expected in zip(split, whole):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.fixture
def direct_passes(monkeypatch, tune):
    """Every convolution with a window of up to 72 values runs the direct loop;
    yields the list of its chunks' passes (nine window values each)."""
    passes = []
    chunk = direct._window_chunk

    def counted(*args):
        passes.append(args[4].shape[0])  # the offsets, a row of nine a pass
        return chunk(*args)

    tune(CONV_DIRECT_MAX_PATCH=72)
    tune(CONV_DIRECT_MIN_ROW_BYTES=0)
    monkeypatch.setattr(direct, '_window_chunk', counted)
    return passes


@pytest.mark.parametrize('x_shape, w_shape, strides, padding, dilation',
                         [c for c in CONV_CASES if c[1][:-2] != (1,) * (len(c[1]) - 2)])
def test_conv_direct_loop(direct_passes, x_shape, w_shape, strides, padding, dilation):
    """The direct loop over small windows: ranks 1-3, paddings, strides,
    dilations, windows of 3 to 72 values (one pass of nine, several, a last
    pass padded with zero weights)."""
    x, w = random(x_shape), random(w_shape)
    y = conv.conv_forward(x, w, strides, padding, dilation)
    patch = int(np.prod(w_shape[:-1]))
    assert direct_passes == [-(-patch // 9)]
    np.testing.assert_allclose(y, reference_conv(x, w, strides, padding, dilation),
                               rtol=1e-12, atol=1e-12)


def test_conv_path_follows_a_changed_limit(monkeypatch, tune):
    """The path a convolution of given shapes takes is kept (it costs more than a
    batch-1 layer to work out), but not past a change of the limits that chose
    it: the same shapes after raising tuning.CONV_DIRECT_MAX_PATCH run the direct loop."""
    x, w = random((2, 6, 5, 2)), random((3, 3, 2, 4))  # 18 values a window, 4 channels
    chunks = []
    chunk = direct._window_chunk
    monkeypatch.setattr(direct, '_window_chunk', lambda *a: chunks.append(1) or chunk(*a))
    conv.conv_forward(x, w)
    assert chunks == []  # 4 float64 channels are 32 bytes a row: im2col
    tune(CONV_DIRECT_MIN_ROW_BYTES=0)
    y = conv.conv_forward(x, w)
    assert chunks == [1]
    np.testing.assert_allclose(y, reference_conv(x, w, 1, 'valid', 1), rtol=1e-12, atol=1e-12)


def test_conv_direct_loop_padding_values_read_zeros(direct_passes):
    """The values a last pass lacks are read as zeros times zero weights, never
    as input values: an inf in the input makes inf only where a window covers
    it (a zero weight times that inf would make NaN)."""
    x, w = random((2, 6, 7, 1)), np.abs(random((1, 5, 1, 3))) + 0.5  # 5 values a window
    x[0, 2, 2, 0] = np.inf  # in three windows, the first value of one
    y = conv.conv_forward(x, w, 1, 'valid')
    assert direct_passes == [1]
    expected = reference_conv(x, w, 1, 'valid', 1)
    assert np.isinf(expected).sum() == 3 * 3 and not np.isnan(expected).any()  # 3 windows
    np.testing.assert_array_equal(np.isinf(y), np.isinf(expected))
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def _chunked_with_epilogue(monkeypatch, tune, chunk_bytes, threads, x, w):
    """conv_forward(x, w, 'same') through a bias + relu epilogue, with the chunk
    size ``chunk_bytes`` at 1 byte and the parts on ``threads`` (run one after
    another), checked against the brute-force convolution; returns the rows of
    each block the epilogue got."""
    bias, blocks = random(w.shape[-1]), []

    def epilogue(block, out):
        blocks.append(block.shape[0])
        np.maximum(block + bias, 0, out=out)

    tune(**{chunk_bytes: 1})
    tune(PARTS_PYTHON_HANDOFF_WORK=1)
    monkeypatch.setattr(blas, 'threads', lambda: threads)
    monkeypatch.setattr(parts, 'run_parts', lambda count, part: [part(i) for i in range(count)])
    y = conv.conv_forward(x, w, 1, 'same', epilogue=epilogue)
    expected = np.maximum(reference_conv(x, w, 1, 'same', 1) + bias, 0)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    return blocks


@pytest.mark.parametrize('threads', [1, 2])
def test_conv_direct_loop_chunks_and_epilogue(monkeypatch, direct_passes, threads, tune):
    """Chunks of one image, split between threads, each block through the
    epilogue into its own rows of the result."""
    blocks = _chunked_with_epilogue(monkeypatch, tune, 'CONV_DIRECT_CHUNK_BYTES', threads,
                                    random((5, 7, 6, 2)), random((3, 3, 2, 4)))
    assert blocks == [42] * 5 and direct_passes == [2] * 5


def test_conv_direct_loop_is_taken_for_small_windows(monkeypatch, tune):
    """With the default limits mnist_cnn's first layer (9 values a window, 32
    float32 channels) runs the direct loop, its second (288 values) Winograd."""
    taken = []
    chunk = direct._window_chunk
    monkeypatch.setattr(direct, '_window_chunk', lambda *a: taken.append(1) or chunk(*a))
    x, w = random((2, 10, 9, 1), np.float32), random((3, 3, 1, 32), np.float32)
    y = conv.conv_forward(x, w)
    assert taken == [1] and y.dtype == np.float32
    np.testing.assert_allclose(y, reference_conv(x, w, 1, 'valid', 1), rtol=1e-4, atol=1e-5)
    winograd_runs = []
    in_parts = winograd.winograd_in_parts
    monkeypatch.setattr(winograd, 'winograd_in_parts', lambda *a, **k: winograd_runs.append(1) or in_parts(*a, **k))
    conv.conv_forward(random((8, 10, 9, 32), np.float32), random((3, 3, 32, 64), np.float32))
    assert taken == [1] and winograd_runs == [1]  # 8 images of 2 x 2 blocks of 4x4 outputs
    # fewer blocks than tuning.CONV_WINOGRAD_MIN_BLOCKS, or than one per 1024 channel pairs
    conv.conv_forward(random((7, 10, 9, 32), np.float32), random((3, 3, 32, 64), np.float32))
    tune(CONV_WINOGRAD_MIN_BLOCKS=0)
    conv.conv_forward(random((1, 10, 9, 128), np.float32), random((3, 3, 128, 64), np.float32))
    assert winograd_runs == [1]
    conv.conv_forward(random((2, 10, 9, 128), np.float32), random((3, 3, 128, 64), np.float32))
    assert winograd_runs == [1, 1]  # 8 blocks, 8192 / 1024 channel pairs
    # float16, which Numba's loops do not take, through im2col and NumPy's matmul
    x, w = random((2, 10, 9, 1), np.float16), random((3, 3, 1, 64), np.float16)
    y = conv.conv_forward(x, w)
    assert taken == [1] and y.dtype == np.float16
    np.testing.assert_allclose(y, reference_conv(x, w, 1, 'valid', 1), rtol=2e-2, atol=2e-2)


@pytest.fixture
def winograd_chunks(monkeypatch, tune):
    """Every 3x3 convolution with stride 1 over 8 channels or more runs Winograd,
    however few its blocks; yields the list of bands of every chunk it
    transforms (4 output rows of an image a band): the chunks of
    ``_winograd_chunk`` calls, or all the bands at once where they go to
    ``_winograd_in_parts``."""
    tune(CONV_WINOGRAD_MIN_BLOCKS=0)
    tune(CONV_WINOGRAD_MIN_ROWS=1)
    chunks = []
    bands, in_parts = winograd._winograd_chunk, winograd.winograd_in_parts

    def counted(rows, width, tiles_h, tiles_w, first, end, *rest):
        chunks.append(end - first)
        return bands(rows, width, tiles_h, tiles_w, first, end, *rest)

    def counted_in_parts(rows, width, tiles_h, tiles_w, *rest, **options):
        chunks.append(rows.shape[0] // ((4 * tiles_h + 2) * width) * tiles_h)
        return in_parts(rows, width, tiles_h, tiles_w, *rest, **options)

    monkeypatch.setattr(winograd, '_winograd_chunk', counted)
    monkeypatch.setattr(winograd, 'winograd_in_parts', counted_in_parts)
    return chunks


WINOGRAD_CASES = [  # (N, H, W, C), out channels, padding: outputs of 4k, 4k + 1..3 rows
    ((2, 10, 11, 8), 8, 'valid'),     # 8 x 9 outputs: a last column of blocks of 1
    ((1, 9, 7, 9), 12, 'same'),       # 9 x 7: rows and columns of partial blocks
    ((2, 3, 8, 8), 9, 'valid'),       # one output row
    ((1, 4, 3, 16), 8, 'same'),       # 4 x 3: one block, 3 columns of it
    ((3, 6, 6, 8), 8, 'same'),        # 6 x 6
    ((2, 1, 6, 7, 8), 8, 'same'),     # a 3-D convolution of one depth slice, kernel (1, 3, 3)
    # out channels over whole panels of the products (jit_kernels.packed) and past them
    ((1, 6, 5, 8), 32, 'same'),
    ((1, 5, 6, 8), 37, 'valid'),
]


@pytest.mark.parametrize('dtype', ['float64', 'float32'])
@pytest.mark.parametrize('x_shape, out_ch, padding', WINOGRAD_CASES)
def test_conv_winograd(winograd_chunks, x_shape, out_ch, padding, dtype):
    """Winograd F(4x4, 3x3) for 3x3 kernels with stride 1 and 8 channels or more,
    on outputs that fill their 4x4 blocks and outputs that do not."""
    x = random(x_shape).astype(dtype)
    w = random((1,) * (len(x_shape) - 4) + (3, 3, x_shape[-1], out_ch)).astype(dtype)
    y = conv.conv_forward(x, w, 1, padding)
    assert sum(winograd_chunks) == x_shape[0] * -(-y.shape[-3] // 4) and y.dtype == dtype
    expected = reference_conv(x.astype(float), w.astype(float), 1, padding, 1)
    # float32's rounding, grown by Winograd's transforms (entries up to 8 and 1/24)
    tol = 1e-12 if dtype == 'float64' else 1e-4 * np.abs(expected).max()
    np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize('x_shape, padding', [((2, 9, 10, 8), 'valid'), ((2, 9, 10, 8), 'same'),
                                               ((1, 6, 7, 16), 'same'), ((2, 1, 6, 7, 8), 'same')])
def test_conv_backward_input_through_winograd(winograd_chunks, x_shape, padding):
    """The input gradient of a 3x3 convolution with stride 1, as Winograd's
    convolution of the output gradient by the kernel turned half a turn: the
    adjoint of the brute-force convolution."""
    x = random(x_shape)
    w = random((1,) * (len(x_shape) - 4) + (3, 3, x_shape[-1], 8))
    expected = reference_conv(x, w, 1, padding, 1)
    dy = random(expected.shape)
    dx = conv.conv_backward_input(dy, w, x.shape, 1, padding)
    assert winograd_chunks and dx.shape == x.shape
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)
    # and of an inf in dy, inf only at the inputs whose windows reach it
    dy[0, ..., 2, 3, :] = np.inf
    dx = conv.conv_backward_input(dy, np.abs(w) + 0.5, x.shape, 1, padding)
    assert np.isinf(dx).any() and not np.isnan(dx).any()


def test_conv_3d_over_several_slices_is_not_winograd(winograd_chunks):
    """A (1, 3, 3) kernel over several depth slices: each slice its own 2-D
    convolution, which Winograd's loop (one slice) does not take."""
    x, w = random((2, 3, 10, 9, 8)), random((1, 3, 3, 8, 8))
    y = conv.conv_forward(x, w, 1, 'same')
    assert winograd_chunks == []
    np.testing.assert_allclose(y, reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)


def test_conv_winograd_float32(winograd_chunks):
    """mnist_cnn's second layer in float32: off by a few float32 ulps of the
    largest output (Winograd's transforms add to im2col's rounding)."""
    x, w = random((2, 26, 26, 32), np.float32), random((3, 3, 32, 64), np.float32) / 16
    y = conv.conv_forward(x, w)
    expected = reference_conv(x.astype(np.float64), w.astype(np.float64), 1, 'valid', 1)
    assert y.dtype == np.float32 and winograd_chunks
    assert np.abs(y - expected).max() < 2e-5 * np.abs(expected).max()


@pytest.mark.parametrize('threads', [1, 2])
def test_conv_winograd_bands_in_parts(monkeypatch, winograd_chunks, threads):
    """All the bands at once (fewer than two chunks' worth), split between BLAS's
    threads as compiled parts (jit_kernels.parts): 3 bands on 2 threads are
    2 + 1; with one thread the one part runs on the calling thread."""
    if threads > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    monkeypatch.setattr(blas, 'threads', lambda: threads)
    for dtype in (np.float64, np.float32):
        x, w = random((1, 11, 10, 8), dtype), random((3, 3, 8, 12), dtype)
        y = conv.conv_forward(x, w, 1, 'same')
        expected = reference_conv(x.astype(float), w.astype(float), 1, 'same', 1)
        tol = 1e-12 if dtype == np.float64 else 1e-4 * np.abs(expected).max()
        np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)
        for mode in ('max', 'avg'):  # each part pooling its own bands
            pooled = conv.conv_forward(x, w, 1, 'same', pool=mode)
            assert pooled.dtype == dtype
            np.testing.assert_allclose(pooled, reference_pool_2x2(expected, mode), rtol=tol, atol=tol)
    assert winograd_chunks == [3] * 6


def test_conv_winograd_kernel_transform_is_kept_until_the_kernel_changes(monkeypatch, winograd_chunks):
    """The kernel's transform is made once for a kernel used again, and made
    anew when the kernel's values change in place (same array, same address)."""
    made = []
    transform = winograd._winograd_kernel_transform
    monkeypatch.setattr(winograd, '_winograd_kernel_transform', lambda *a: made.append(1) or transform(*a))
    x, w = random((2, 6, 7, 8)), random((3, 3, 8, 9))
    for _ in range(2):
        np.testing.assert_allclose(conv.conv_forward(x, w, 1, 'same'),
                                   reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)
    assert made == [1]
    w[1, 2, 3, 4] += 1.0
    np.testing.assert_allclose(conv.conv_forward(x, w, 1, 'same'),
                               reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)
    assert made == [1, 1] and winograd_chunks == [4, 4, 4]  # 2 images of 2 bands


@pytest.mark.parametrize('threads', [1, 2])
def test_conv_winograd_chunks_and_epilogue(monkeypatch, winograd_chunks, threads, tune):
    """Chunks of one band (an image's band split from the next), split between
    threads, each block of output rows through the epilogue."""
    blocks = _chunked_with_epilogue(monkeypatch, tune, 'CONV_WINOGRAD_CHUNK_BYTES', threads,
                                    random((3, 7, 6, 8)), random((3, 3, 8, 8)))
    assert winograd_chunks == [1] * 6 and blocks == [24, 18] * 3  # 4 rows of 6, then 3


def test_conv_winograd_chunks_hold_at_least_min_rows_blocks(monkeypatch, winograd_chunks, tune):
    """However small the chunk's bytes, each product has _WINOGRAD_MIN_ROWS rows
    (blocks) where the batch has them: 8 rows are 4 bands of 2 blocks (the
    chunks from Python, which an epilogue of Python's takes)."""
    tune(CONV_WINOGRAD_CHUNK_BYTES=1)
    tune(CONV_WINOGRAD_MIN_ROWS=8)
    monkeypatch.setattr(blas, 'threads', lambda: 1)  # the bands in order, on one thread
    x, w = random((5, 7, 6, 8)), random((3, 3, 8, 8))  # 7 x 6 outputs: 2 bands of 2 blocks
    y = conv.conv_forward(x, w, 1, 'same', epilogue=lambda block, out: np.copyto(out, block))
    assert winograd_chunks == [4, 4, 2]
    np.testing.assert_allclose(y, reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('pool', [None, 'max'])
@pytest.mark.parametrize('chunked', [True, False])
def test_conv_winograd_non_finite_inputs_go_through_im2col(monkeypatch, winograd_chunks, chunked, pool, tune):
    """An inf in the input makes inf only in the outputs whose windows hold it,
    and a NaN NaN only there: in Winograd's transforms they would reach every
    output of their blocks, so such a chunk (from Python, which an epilogue of
    Python's takes), or the parts' bands, switch the convolution to im2col,
    pooled after it where asked."""
    x, w = random((2, 9, 10, 8)), np.abs(random((3, 3, 8, 8))) + 0.5
    x[1, 4, 5, 3] = np.inf
    x[1, 8, 9, 0] = np.nan  # a corner: in 4 windows
    epilogue = None
    if chunked:
        tune(CONV_WINOGRAD_CHUNK_BYTES=1)
        epilogue = lambda block, out: np.copyto(out, block)
    y = conv.conv_forward(x, w, 1, 'same', epilogue=epilogue, pool=pool)
    # image 0's 3 bands, then image 1's first stops it; or all 6 bands at once
    assert winograd_chunks == ([1] * 3 if chunked else [6])
    expected = reference_conv(x, w, 1, 'same', 1)
    assert np.isinf(expected).sum() == 9 * 8 and np.isnan(expected).sum() == 4 * 8
    if pool is not None:
        expected = reference_pool_2x2(expected, pool)
        assert np.isinf(expected).any() and np.isnan(expected).any()
    np.testing.assert_array_equal(np.isinf(y), np.isinf(expected))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def reference_pool_2x2(y, mode):
    """2x2 windows with stride 2, 'valid': an odd last row or column is left out."""
    n, h, w, c = y.shape
    windows = y[:, :h // 2 * 2, :w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c)
    return windows.max(axis=(2, 4)) if mode == 'max' else windows.mean(axis=(2, 4))


POOLED_CONV_CASES = [  # x shape, kernel shape, padding: each convolution path
    ((3, 9, 7, 5), (1, 1, 5, 4), 'valid'),    # the 1x1 product
    ((3, 9, 8, 2), (3, 3, 2, 32), 'same'),    # the direct loop
    ((3, 9, 10, 8), (3, 3, 8, 8), 'same'),    # Winograd
    ((3, 10, 7, 5), (3, 3, 5, 4), 'valid'),   # im2col
]


@pytest.mark.parametrize('chunked', [True, False])
@pytest.mark.parametrize('mode', ['max', 'avg'])
@pytest.mark.parametrize('x_shape, w_shape, padding', POOLED_CONV_CASES)
def test_conv_pooled(monkeypatch, winograd_chunks, x_shape, w_shape, padding, mode, chunked, tune):
    """A convolution pooled 2x2 after its epilogue, block by block: chunks of one
    image (im2col, the direct loop) or two bands (Winograd: of 3 an image, so
    that chunks cross images), or blocks of the whole batch; odd output rows
    and columns left out."""
    if chunked:
        tune(CONV_COLUMN_CHUNK_BYTES=1, CONV_DIRECT_CHUNK_BYTES=1, CONV_WINOGRAD_CHUNK_BYTES=1)
        tune(CONV_WINOGRAD_MIN_ROWS=2 * 3)  # 2 bands of 3 blocks; 3 an image
    x, w, bias = random(x_shape), random(w_shape), random(w_shape[-1])

    def epilogue(block, out):
        np.maximum(block + bias, 0, out=out)

    y = conv.conv_forward(x, w, 1, padding, epilogue=epilogue, pool=mode)
    conv_out = np.maximum(reference_conv(x, w, 1, padding, 1) + bias, 0)
    np.testing.assert_allclose(y, reference_pool_2x2(conv_out, mode), rtol=1e-12, atol=1e-12)
    plain = conv.conv_forward(x, w, 1, padding, pool=mode)
    np.testing.assert_allclose(plain, reference_pool_2x2(reference_conv(x, w, 1, padding, 1), mode),
                               rtol=1e-12, atol=1e-12)
    assert bool(winograd_chunks) == (w_shape[2] == 8)


def _vector_minus_block(d):
    """A compiled epilogue (parts.CompiledEpilogue) of float64 blocks: out = v - block,
    v the row vector at the descriptor's first number."""
    rows, columns = d[1], d[2]
    block = parts.array_at(d[3], (rows, columns), np.float64)
    out = parts.array_at(d[4], (rows, columns), np.float64)
    vector = parts.array_at(d[parts.EPILOGUE_HEAD], (columns,), np.float64)
    for i in range(rows):
        for j in range(columns):
            out[i, j] = vector[j] - block[i, j]


_vector_minus_block_part = parts.compiled_part(_vector_minus_block)


@pytest.mark.parametrize('compiled', [True, False])
@pytest.mark.parametrize('chunked', [True, False])
@pytest.mark.parametrize('x_shape, w_shape, padding', POOLED_CONV_CASES)
def test_conv_pooled_first(monkeypatch, winograd_chunks, x_shape, w_shape, padding, chunked, compiled, tune):
    """With pool_first, the epilogue runs on the max-pooled values (a decreasing
    one here, so that the other order gives other numbers): in Winograd's parts
    where they pool a compiled epilogue's blocks (however many chunks their
    bands make), else after the pooling."""
    if chunked:
        tune(CONV_COLUMN_CHUNK_BYTES=1, CONV_DIRECT_CHUNK_BYTES=1, CONV_WINOGRAD_CHUNK_BYTES=1)
        tune(CONV_WINOGRAD_MIN_ROWS=2 * 3)
    x, w, vector = random(x_shape), random(w_shape), random(w_shape[-1])
    from_python = []
    if compiled:
        epilogue = parts.CompiledEpilogue(_vector_minus_block_part, np.float64, [parts.address(vector)],
                                          keep=(vector,), widths=[vector.size])
        run = parts.CompiledEpilogue.__call__
        monkeypatch.setattr(parts.CompiledEpilogue, '__call__',
                            lambda self, block, out: from_python.append(block.shape) or run(self, block, out))
    else:
        def epilogue(block, out):
            from_python.append(block.shape)
            np.subtract(vector, block, out=out)
    y = conv.conv_forward(x, w, 1, padding, epilogue=epilogue, pool='max', pool_first=True)
    pooled = reference_pool_2x2(reference_conv(x, w, 1, padding, 1), 'max')
    np.testing.assert_allclose(y, vector - pooled, rtol=1e-12, atol=1e-12)
    in_parts = compiled and w_shape[2] == 8
    assert from_python == ([] if in_parts else [(pooled.size // w_shape[-1], w_shape[-1])])


@pytest.mark.parametrize('pool', [None, 'max', 'avg'])
@pytest.mark.parametrize('chunked', [True, False])
def test_conv_winograd_runs_a_compiled_epilogue_in_its_parts(monkeypatch, winograd_chunks, chunked, pool, tune):
    """A compiled epilogue (a decreasing one: pooling it first would give other
    numbers) runs in Winograd's parts on their bands' outputs, before their
    pooling, however many chunks their bands make: never from Python."""
    if chunked:
        tune(CONV_WINOGRAD_CHUNK_BYTES=1)
        tune(CONV_WINOGRAD_MIN_ROWS=2 * 3)
    x, w, vector = random((3, 9, 10, 8)), random((3, 3, 8, 8)), random(8)
    epilogue = parts.CompiledEpilogue(_vector_minus_block_part, np.float64, [parts.address(vector)],
                                      keep=(vector,), widths=[vector.size])
    from_python = []
    run = parts.CompiledEpilogue.__call__
    monkeypatch.setattr(parts.CompiledEpilogue, '__call__',
                        lambda self, block, out: from_python.append(1) or run(self, block, out))
    y = conv.conv_forward(x, w, 1, 'same', epilogue=epilogue, pool=pool)
    expected = vector - reference_conv(x, w, 1, 'same', 1)
    if pool is not None:
        expected = reference_pool_2x2(expected, pool)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    assert winograd_chunks == [9] and not from_python


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_direct_forward(dtype):
    """The direct loop's compiled form (for whole compiled calls), against the
    reference, for the sizes compiled_path gives: one input channel; three,
    with zero weights padding the last pass of nine; 'same' padding, strides
    and dilation."""
    random = random_arrays(31)
    for x_shape, w_shape, strides, padding, dilation in (
            ((3, 9, 8, 1), (3, 3, 1, 32), 1, 'valid', 1), ((2, 7, 6, 3), (2, 2, 3, 32), 1, 'valid', 1),
            ((2, 9, 8, 2), (3, 3, 2, 32), (2, 1), 'same', 1), ((1, 9, 10, 1), (3, 3, 1, 32), 1, 'same', 2)):
        x, w = random(x_shape, dtype), random(w_shape, dtype)
        path = conv.compiled_path(x.shape, w.shape, x.dtype, strides, padding, dilation)
        assert path.algorithm == 'direct'
        got = conv.direct_forward(x, w, path.compiled.sizes, path.compiled.offsets)
        want = reference_conv(x.astype(np.float64), w.astype(np.float64), strides, padding, dilation)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_paths():
    """Only a direct loop, or Winograd over whole 4x4 blocks without padding
    (at batch 1 already: more images only add blocks), have compiled forms."""
    f32 = np.dtype(np.float32)
    assert conv.compiled_path((None, 26, 26, 32), (3, 3, 32, 64), f32, 1, 'valid', 1).algorithm == 'winograd'
    assert conv.compiled_path((None, 26, 25, 32), (3, 3, 32, 64), f32, 1, 'valid', 1) is None
    assert conv.compiled_path((None, 24, 24, 32), (3, 3, 32, 64), f32, 1, 'same', 1) is None
    assert conv.compiled_path((None, 10, 10, 32), (3, 3, 32, 64), f32, 1, 'valid', 1) is None  # 4 blocks
    assert conv.compiled_path((None, 26, 26, 32), (3, 3, 32, 64), f32, 2, 'valid', 1) is None
    assert conv.compiled_path((None, None, 26, 32), (3, 3, 32, 64), f32, 1, 'valid', 1) is None
    assert conv.compiled_path((None, 9, 9, 8), (3, 3, 8, 16), f32, 1, 'valid', 1) is None  # im2col


@pytest.mark.skipif(not parts.pool_from_compiled(), reason="OpenBLAS's thread pool is not bound")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_winograd_forward(dtype):
    """Winograd's compiled form, pooled or not, its parts taking their bands
    one, four or all at a time, against the reference; the kernel's transform
    made again for a kernel changed in place; an inf refused before anything
    runs."""
    random = random_arrays(32)
    x, w = random((2, 26, 22, 8), dtype), random((3, 3, 8, 12), dtype)  # 12 bands of 5 blocks
    kept, u = np.full_like(w, np.nan), np.empty((36, 8, 12), dtype)
    address = conv.winograd_parts[np.dtype(dtype).itemsize]()[0]
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for chunk in (1, 4, 100):
        want = reference_conv(x.astype(np.float64), w.astype(np.float64), 1, 'valid', 1)
        with blas._parts_lock:
            got, pooled = (conv.winograd_forward(x, w, kept, u, address, mode, chunk) for mode in (0, 1))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        np.testing.assert_allclose(pooled, reference_pool_2x2(want, 'max'), rtol=tol,
                                   atol=tol * np.abs(want).max())
        np.testing.assert_array_equal(kept, w)
        w[1, 2] += 1  # in place: the next call's transform must follow
    x[1, 3, 4, 5] = np.inf
    with pytest.raises(ValueError, match="an inf or a NaN"):
        conv.winograd_forward(x, w, kept, u, address, 0, 4)


@pytest.mark.parametrize('x_shape', [(2, 3, 8, 2), (2, 8, 3, 2), (2, 3, 3, 2)])
def test_conv_pooled_to_nothing(x_shape):
    """A convolution with one output row or column pools to none (2x2, 'valid')."""
    y = conv.conv_forward(random(x_shape), random((3, 3, 2, 32)), pool='max')
    assert y.shape == (2, (x_shape[1] - 2) // 2, (x_shape[2] - 2) // 2, 32)


def test_conv_pooled_errors():
    x, w = random((1, 6, 6, 2)), random((3, 3, 2, 4))
    with pytest.raises(ValueError, match="conv_forward: pool must be 'max' or 'avg'.*'min'"):
        conv.conv_forward(x, w, pool='min')
    with pytest.raises(ValueError, match=r"after a 2-D convolution.*\(1, 6, 2\)"):
        conv.conv_forward(random((1, 6, 2)), random((3, 2, 4)), pool='max')


@pytest.mark.parametrize('kernel, channels', [((3, 3), 3), ((1, 1), 3), ((3, 3), 1)])
def test_conv_float32(kernel, channels):
    """float32 in, float32 out, through im2col (one and several channels)
    and through the 1x1 matmul."""
    x = random((2, 9, 8, channels), np.float32)
    w = random(kernel + (channels, 8), np.float32)
    y = conv.conv_forward(x, w, 1, 'same')
    assert y.dtype == np.float32
    expected = reference_conv(x, w, 1, 'same', 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    dy = random(y.shape, np.float32)
    dx = conv.conv_backward_input(dy, w, x.shape, 1, 'same')
    dw = conv.conv_backward_kernel(x, dy, w.shape, 1, 'same')
    assert dx.dtype == dw.dtype == np.float32
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-4)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-4)


@pytest.mark.parametrize('kernel, channels, out_ch',
                         [((3, 3), 2, 4), ((3, 3), 2, 32), ((1, 1), 2, 4), ((3, 3), 8, 8)])
def test_conv_of_an_empty_batch(monkeypatch, kernel, channels, out_ch, tune):
    """No images in, none out, and zero kernel gradients (im2col, the direct loop,
    the 1x1 product, Winograd)."""
    tune(CONV_WINOGRAD_MIN_BLOCKS=0)
    x, w = np.zeros((0, 6, 7, channels), np.float32), random(kernel + (channels, out_ch), np.float32)
    y = conv.conv_forward(x, w, 1, 'same')
    assert y.shape == (0, 6, 7, out_ch) and y.dtype == np.float32
    dx = conv.conv_backward_input(y, w, x.shape, 1, 'same')
    dw = conv.conv_backward_kernel(x, y, w.shape, 1, 'same')
    assert dx.shape == x.shape and dw.shape == w.shape and not dw.any()


@pytest.mark.parametrize('x_dtype, w_dtype, out_dtype', [
    (np.float32, np.float64, np.float64), (np.int32, np.int32, np.float64),
    (np.float32, np.float32, np.float32)])
def test_conv_input_types(x_dtype, w_dtype, out_dtype):
    """Inputs of two float types run in the wider one, integers in float64,
    and a strided view of the input as its values."""
    x = np.round(random((2, 9, 8, 2)) * 4).astype(x_dtype)
    w = np.round(random((3, 3, 2, 5)) * 4).astype(w_dtype)
    view = np.ascontiguousarray(np.swapaxes(x, 1, 2)).swapaxes(1, 2)  # not C-contiguous
    y = conv.conv_forward(view, w, 1, 'same')
    assert y.dtype == out_dtype
    np.testing.assert_allclose(y, reference_conv(x.astype(np.float64), w.astype(np.float64), 1, 'same', 1),
                               rtol=1e-6, atol=1e-4)


def test_conv_output_shape():
    assert conv.conv_output_shape((28, 28), (3, 3)) == (26, 26)
    assert conv.conv_output_shape((7, 8), (3, 3), 2, 'same') == (4, 4)
    assert conv.conv_output_shape((10,), (3,), 1, 'causal', 4) == (10,)
    assert conv.conv_output_shape((9, 9, 9), (3, 3, 3), 1, 'valid', 2) == (5, 5, 5)
    g = conv.geometry((7, 8), (3, 3), 2, 'same')
    assert g.pad == (0, 1, 0)  # 7: total 2 -> 1 before; 8: total 1 -> 0 before


@pytest.mark.parametrize('call, message', [
    (lambda: conv.conv_forward(np.zeros((1, 5, 5, 2)), np.zeros((3, 3, 3, 4))), 'match'),
    (lambda: conv.conv_forward(np.zeros((1, 2, 5, 2)), np.zeros((3, 3, 2, 4))), 'fit'),
    (lambda: conv.conv_forward(np.zeros((1, 5, 2)), np.zeros((3, 2, 4)), 1, 'full'),
     'padding'),
    (lambda: conv.conv_forward(np.zeros((1, 5, 2)), np.zeros((3, 2, 4)), (1, 1)), 'strides'),
    (lambda: conv.conv_backward_input(np.zeros((1, 4, 4)), np.zeros((3, 2, 4)), (1, 5, 2)),
     'gradient'),
])
def test_conv_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Transposed convolution: (input shape, kernel (*k, out_ch, in_ch), output
# shape, strides, padding, dilation).  The output shape is one from which the
# forward convolution gives the input's spatial shape.
TRANSPOSE_CASES = [
    ((2, 4, 5, 3), (3, 3, 2, 3), (2, 8, 9, 2), 2, 'same', 1),
    ((2, 4, 3, 3), (3, 2, 2, 3), (2, 10, 8, 2), (2, 3), 'valid', 1),
    ((1, 5, 4, 2), (3, 3, 3, 2), (1, 9, 8, 3), 1, 'valid', 2),
    ((1, 3, 2, 3, 2), (2, 3, 2, 3, 2), (1, 6, 4, 5, 3), 2, 'same', 1),
]


@pytest.mark.parametrize('x_shape, w_shape, output_shape, strides, padding, dilation',
                         TRANSPOSE_CASES)
def test_conv_transpose(x_shape, w_shape, output_shape, strides, padding, dilation):
    x, w = random(x_shape), random(w_shape)
    y = conv.conv_transpose_forward(x, w, (None,) + output_shape[1:], strides, padding, dilation)
    expected = reference_conv_transpose(x, w, output_shape, strides, padding, dilation)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)

    dy = random(output_shape)
    dx = conv.conv_transpose_backward_input(dy, w, strides, padding, dilation)
    dw = conv.conv_transpose_backward_kernel(x, dy, w_shape, strides, padding, dilation)
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-11)


def test_conv_transpose_rejects_mismatched_output_shape():
    with pytest.raises(ValueError, match='gradient spatial shape'):
        conv.conv_transpose_forward(np.zeros((1, 4, 4, 3)), np.zeros((3, 3, 2, 3)),
                                    (1, 10, 8, 2), 2, 'same')


DEPTHWISE_CASES = [
    ((2, 11, 3), (3, 3, 2), 2, 'same', 1),
    ((2, 7, 9, 3), (3, 3, 3, 1), 1, 'valid', 1),
    ((2, 8, 7, 2), (3, 2, 2, 3), (2, 1), 'same', (1, 2)),
    ((1, 9, 9, 4), (3, 3, 4, 2), 2, 'valid', 2),
    ((1, 4, 5, 6, 2), (2, 3, 2, 2, 2), (1, 2, 1), 'same', 1),
]


@pytest.mark.parametrize('x_shape, w_shape, strides, padding, dilation', DEPTHWISE_CASES)
def test_depthwise_conv(x_shape, w_shape, strides, padding, dilation):
    x, w = random(x_shape), random(w_shape)
    y = conv.depthwise_conv_forward(x, w, strides, padding, dilation)
    expected = reference_depthwise(x, w, strides, padding, dilation)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)

    dy = random(expected.shape)
    dx = conv.depthwise_conv_backward_input(dy, w, x_shape, strides, padding, dilation)
    dw = conv.depthwise_conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-11)


def test_depthwise_conv_float32():
    x, w = random((2, 7, 6, 3), np.float32), random((3, 3, 3, 2), np.float32)
    y = conv.depthwise_conv_forward(x, w, 1, 'same')
    assert y.dtype == np.float32
    expected = reference_depthwise(x, w, 1, 'same', 1)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    dy = random(y.shape, np.float32)
    dx = conv.depthwise_conv_backward_input(dy, w, x.shape, 1, 'same')
    dw = conv.depthwise_conv_backward_kernel(x, dy, w.shape, 1, 'same')
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-4)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-4)


def test_separable_conv():
    x = random((2, 7, 8, 3))
    depthwise, pointwise = random((3, 3, 3, 2)), random((1, 1, 6, 4))
    y = conv.separable_conv_forward(x, depthwise, pointwise, 2, 'same', 1)
    expected = reference_conv(reference_depthwise(x, depthwise, 2, 'same', 1), pointwise,
                              1, 'valid', 1)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def reference_local_conv(x, w, kernel_size, strides, feature_order):
    """Keras 2.2.5's local_conv1d/2d: flatten each 'valid' window (channels
    innermost for channels_last kernels, outermost for channels_first ones)
    and multiply it by that output position's own kernel."""
    rank = x.ndim - 2
    strides = strides if isinstance(strides, tuple) else (strides,) * rank
    out = out_spatial(x.shape[1:-1], kernel_size, strides, (1,) * rank, 'valid')
    y = np.zeros((x.shape[0],) + out + (w.shape[-1],))
    for position, o in enumerate(np.ndindex(*out)):
        window = tuple(slice(o[a] * strides[a], o[a] * strides[a] + kernel_size[a])
                       for a in range(rank))
        patch = x[(slice(None),) + window]
        if feature_order == 'channels_first':
            patch = np.moveaxis(patch, -1, 1)
        y[(slice(None),) + o] = patch.reshape(x.shape[0], -1) @ w[position]
    return y


LOCAL_CASES = [
    ((2, 9, 3), (3,), 2, 'channels_last'),
    ((2, 8, 2), (2,), 1, 'channels_last'),
    ((2, 7, 6, 3), (3, 2), (2, 1), 'channels_last'),
    ((2, 7, 6, 3), (2, 3), (1, 2), 'channels_first'),
]


@pytest.mark.parametrize('x_shape, kernel_size, strides, feature_order', LOCAL_CASES)
def test_local_conv(x_shape, kernel_size, strides, feature_order):
    x = random(x_shape)
    rank = len(kernel_size)
    stride_tuple = strides if isinstance(strides, tuple) else (strides,) * rank
    out = out_spatial(x_shape[1:-1], kernel_size, stride_tuple, (1,) * rank, 'valid')
    w_shape = (int(np.prod(out)), int(np.prod(kernel_size)) * x_shape[-1], 4)
    w = random(w_shape)
    y = conv.local_conv_forward(x, w, kernel_size, strides, feature_order)
    expected = reference_local_conv(x, w, kernel_size, strides, feature_order)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)

    dy = random(expected.shape)
    dx = conv.local_conv_backward_input(dy, w, x_shape, kernel_size, strides, feature_order)
    dw = conv.local_conv_backward_kernel(x, dy, kernel_size, strides, feature_order)
    assert dw.shape == w_shape
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)
    np.testing.assert_allclose(inner(dw, w), inner(dy, expected), rtol=1e-11)


def test_local_conv_rejects_wrong_kernel():
    with pytest.raises(ValueError, match='expected'):
        conv.local_conv_forward(np.zeros((1, 9, 3)), np.zeros((4, 8, 2)), (3,), 2)



def test_conv_winograd_kernel_transform_is_dropped_with_its_kernel(winograd_chunks):
    """A kept transform goes when the array holding its kernel is freed (the
    weights a training step replaced), a view's as well as an array's own."""
    x = random((1, 6, 7, 8))
    for make in (lambda: random((3, 3, 8, 9)), lambda: random((3 * 3 * 8 * 9,)).reshape(3, 3, 8, 9)):
        w = make()
        before = len(winograd._kernel_transforms)
        conv.conv_forward(x, w, 1, 'same')
        assert len(winograd._kernel_transforms) == before + 1
        del w
        assert len(winograd._kernel_transforms) == before


def test_conv_winograd_kernel_transforms_keep_to_their_bytes(monkeypatch, winograd_chunks, tune):
    """Past CONV_WINOGRAD_KEPT_BYTES the oldest kept transforms go first; the
    newest stays however large."""
    monkeypatch.setattr(winograd, '_kernel_transforms', collections.OrderedDict())
    each = (9 + 36) * 8 * 9 * 8  # a kernel's copy and its transform, float64
    tune(CONV_WINOGRAD_KEPT_BYTES=2 * each)
    x = random((1, 6, 7, 8))
    kernels = [random((3, 3, 8, 9)) for _ in range(4)]
    for w in kernels:
        np.testing.assert_allclose(conv.conv_forward(x, w, 1, 'same'),
                                   reference_conv(x, w, 1, 'same', 1), rtol=1e-12, atol=1e-12)
    assert len(winograd._kernel_transforms) == 2
    assert all(np.array_equal(kept, w) for (kept, _), w in zip(winograd._kernel_transforms.values(), kernels[2:]))
    tune(CONV_WINOGRAD_KEPT_BYTES=1)
    conv.conv_forward(x, kernels[0], 1, 'same')
    assert len(winograd._kernel_transforms) == 1


@pytest.mark.parametrize('algorithm', conv.ALGORITHMS)
@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_conv_path_pin_runs_each_algorithm(tune, algorithm, dtype):
    """tuning.CONV_PATH makes forward_path take each algorithm where it can run
    the convolution, plain, pooled and through an epilogue, and leaves the usual
    choice where it cannot (a 3x3 kernel is no 1x1 product; strides are not
    Winograd's)."""
    tune(CONV_PATH=algorithm)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for kernel, strides in (((1, 1), 1), ((3, 3), 1), ((3, 3), 2)):
        x, w = random((2, 10, 9, 8), dtype), random(kernel + (8, 16), dtype)
        path = conv.forward_path(x.shape, w.shape, dtype, strides, 'valid', 1)
        runs = {'pointwise': kernel == (1, 1), 'winograd': kernel == (3, 3) and strides == 1}
        assert (path.algorithm == algorithm) == runs.get(algorithm, True)
        want = reference_conv(x.astype(np.float64), w.astype(np.float64), strides, 'valid', 1)
        scale = tol * np.abs(want).max()
        np.testing.assert_allclose(conv.conv_forward(x, w, strides), want, rtol=tol, atol=scale)
        np.testing.assert_allclose(conv.conv_forward(x, w, strides, pool='max'), reference_pool_2x2(want, 'max'),
                                   rtol=tol, atol=scale)
        relu = conv.conv_forward(x, w, strides, epilogue=lambda block, out: np.maximum(block, 0, out=out))
        np.testing.assert_allclose(relu, np.maximum(want, 0), rtol=tol, atol=scale)


def test_conv_path_pin_reaches_the_compiled_forms(tune):
    """compiled_path follows the pin too: a convolution pinned to im2col has no
    compiled form; one with too few blocks for Winograd gets it when pinned."""
    f32 = np.dtype(np.float32)
    shapes = ((None, 10, 10, 32), (3, 3, 32, 64), f32, 1, 'valid', 1)  # 4 blocks: im2col unpinned
    assert conv.compiled_path(*shapes) is None
    tune(CONV_PATH='winograd')
    assert conv.compiled_path(*shapes).algorithm == 'winograd'
    tune(CONV_PATH='columns')
    assert conv.compiled_path((None, 26, 26, 32), (3, 3, 32, 64), f32, 1, 'valid', 1) is None
    with pytest.raises(ValueError, match="CONV_PATH must be one of"):
        tune(CONV_PATH='fft')


def test_direct_loop_arrays_are_typed_as_a_whole_call_reads_them():
    # a whole call reads the loop's sizes and offsets as writeable arrays (by
    # their addresses); read-only ones from Python compiled the loops once more
    import numba

    from jit_kernels import direct
    from jit_kernels.windows import geometry
    loop = direct.direct_loop(geometry((1, 28, 28), (1, 3, 3)), 1, 32, 4)
    for array in (loop.sizes, loop.offsets):
        assert numba.typeof(array) == numba.typeof(np.empty(array.shape, np.int64))
