"""jit_kernels.pool and jit_kernels.resize against brute-force NumPy definitions.

Pooling is compared with explicit loops over output windows; the average
pooling gradient is checked as the adjoint of that linear map, the max
pooling gradient by finite differences (random data, so no ties) and on a
hand-made case with ties.  Resizing is compared with per-pixel formulas.
"""

import numpy as np
import pytest

from jit_kernels import blas, parts, pool, resize
from tests.kernel_helpers import all_threads, inner, random_arrays  # noqa: F401 - all_threads is an autouse fixture

random = random_arrays(4321)


def window_slices(spatial, pool_size, strides, padding):
    """Yield (output index, tuple of input slices clipped to the input),
    with TensorFlow's padding rules written out."""
    bounds = []
    for size, k, s in zip(spatial, pool_size, strides):
        if padding == 'valid':
            out, pad = (size - k) // s + 1, 0
        else:
            out = -(-size // s)
            pad = max((out - 1) * s + k - size, 0) // 2
        bounds.append([(max(o * s - pad, 0), min(o * s - pad + k, size)) for o in range(out)])
    for o in np.ndindex(*(len(b) for b in bounds)):
        yield o, tuple(slice(*bounds[a][o[a]]) for a in range(len(o)))


def reference_pool(x, pool_size, strides, padding, mode):
    results = {}
    for o, window in window_slices(x.shape[1:-1], pool_size, strides, padding):
        patch = x[(slice(None),) + window].reshape(x.shape[0], -1, x.shape[-1])
        results[o] = patch.max(axis=1) if mode == 'max' else patch.mean(axis=1)
    out = max(results) if results else ()
    y = np.zeros((x.shape[0],) + tuple(i + 1 for i in out) + (x.shape[-1],))
    for o, value in results.items():
        y[(slice(None),) + o] = value
    return y


# (input shape, pool size, strides, padding): ranks 1-3, odd sizes,
# overlapping and non-overlapping windows.
POOL_CASES = [
    ((2, 11, 3), (3,), (2,), 'valid'),
    ((2, 11, 3), (2,), (2,), 'same'),
    ((2, 7, 9, 3), (2, 2), (2, 2), 'valid'),
    ((2, 7, 9, 3), (3, 3), (2, 2), 'same'),
    ((1, 8, 7, 2), (3, 2), (1, 3), 'same'),
    ((2, 9, 8, 2), (2, 3), (3, 1), 'valid'),
    ((1, 5, 6, 7, 2), (2, 2, 2), (2, 2, 2), 'same'),
    ((2, 5, 7, 6, 2), (3, 2, 3), (1, 2, 2), 'valid'),
]


@pytest.mark.parametrize('x_shape, pool_size, strides, padding', POOL_CASES)
def test_avg_pool(x_shape, pool_size, strides, padding):
    x = random(x_shape)
    y = pool.avg_pool_forward(x, pool_size, strides, padding)
    expected = reference_pool(x, pool_size, strides, padding, 'avg')
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    dy = random(expected.shape)
    dx = pool.avg_pool_backward(dy, x_shape, pool_size, strides, padding)
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)


@pytest.mark.parametrize('x_shape, pool_size, strides, padding', POOL_CASES)
def test_max_pool(x_shape, pool_size, strides, padding):
    x = random(x_shape)
    y = pool.max_pool_forward(x, pool_size, strides, padding)
    expected = reference_pool(x, pool_size, strides, padding, 'max')
    np.testing.assert_array_equal(y, expected)

    # Central differences of <dy, maxpool(x)>: exact up to rounding while no
    # window's maximum changes place, which a step of 1e-6 on normal random
    # data does not cause.
    dy = random(expected.shape)
    dx = pool.max_pool_backward(dy, x, pool_size, strides, padding)
    step = 1e-6
    numeric = np.empty_like(x)
    for index in np.ndindex(*x_shape):
        shifted = x.copy()
        shifted[index] += step
        up = inner(dy, reference_pool(shifted, pool_size, strides, padding, 'max'))
        shifted[index] -= 2 * step
        down = inner(dy, reference_pool(shifted, pool_size, strides, padding, 'max'))
        numeric[index] = (up - down) / (2 * step)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(blas.threads() < 2, reason='OpenBLAS runs one thread here')
@pytest.mark.parametrize('mode', ['max', 'avg'])
def test_pool_split_by_images_between_blas_threads(monkeypatch, mode, tune):
    x = random((5, 7, 6, 3))
    expected = reference_pool(x, (2, 3), (2, 2), 'same', mode)
    dy = random(expected.shape)
    forward, backward = getattr(pool, f'{mode}_pool_forward'), getattr(pool, f'{mode}_pool_backward')
    whole = backward(dy, x if mode == 'max' else x.shape, (2, 3), (2, 2), 'same')
    calls = []
    run_parts = parts.run_parts
    monkeypatch.setattr(parts, 'run_parts', lambda count, part: calls.append(count) or run_parts(count, part))
    tune(LIBRARY_IMAGE_PARTS_MIN_WORK=0, PARTS_PYTHON_HANDOFF_WORK=1)
    np.testing.assert_allclose(forward(x, (2, 3), (2, 2), 'same'), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(backward(dy, x if mode == 'max' else x.shape, (2, 3), (2, 2), 'same'),
                               whole, rtol=1e-12, atol=1e-12)
    assert len(calls) == 2 and min(calls) >= 2


class _ParallelForbidden:
    """Stands in for a parallel kernel: only its serial twin may run."""

    def __init__(self, kernel):
        self.serial = kernel.serial

    def __call__(self, *args):
        raise AssertionError('the parallel kernel ran for a small pooling')


@pytest.mark.parametrize('mode', ['max', 'avg'])
def test_small_pooling_runs_the_serial_twin(monkeypatch, mode, tune):
    """Below tuning.LIBRARY_PARALLEL_MIN_WORK the kernels' serial twins run: the same code
    compiled without parallel=True, with cache files of their own."""
    tune(LIBRARY_PARALLEL_MIN_WORK=1 << 24)
    for name in (f'_{mode}_pool', f'_{mode}_pool_backward'):
        kernel = getattr(pool, name)
        assert kernel.serial.py_func.__qualname__ == f'{name}_serial'
        monkeypatch.setattr(pool, name, _ParallelForbidden(kernel))
    x = random((2, 7, 6, 3))
    expected = reference_pool(x, (2, 3), (2, 2), 'same', mode)
    forward, backward = getattr(pool, f'{mode}_pool_forward'), getattr(pool, f'{mode}_pool_backward')
    np.testing.assert_allclose(forward(x, (2, 3), (2, 2), 'same'), expected, rtol=1e-12, atol=1e-12)
    dy = random(expected.shape)
    dx = backward(dy, x if mode == 'max' else x.shape, (2, 3), (2, 2), 'same')
    if mode == 'avg':  # the adjoint of the pooling's linear map
        np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-12)
    else:
        assert dx.shape == x.shape and np.isclose(dx.sum(), dy.sum())


def test_max_pool_gradient_goes_to_first_maximum():
    """Ties: the first maximum in row-major window order gets the gradient."""
    x = np.array([[1., 3., 3.],
                  [3., 0., 2.],
                  [3., 3., 1.]]).reshape(1, 3, 3, 1)
    dy = np.array([[10., 20.],
                   [30., 40.]]).reshape(1, 2, 2, 1)
    dx = pool.max_pool_backward(dy, x, (2, 2), (1, 1), 'valid')
    # Window (0,0) -> x[0,1]; (0,1) -> x[0,1]; (1,0) -> x[1,0]; (1,1) -> x[2,1].
    expected = np.array([[0., 30., 0.],
                         [30., 0., 0.],
                         [0., 40., 0.]])
    np.testing.assert_array_equal(dx[0, :, :, 0], expected)


def test_max_pool_propagates_nan_like_np_max():
    """A NaN anywhere in a window, first or not, makes its maximum NaN; the
    gradient passes over it to the window's largest other value."""
    x = np.arange(2 * 4 * 4 * 16, dtype=np.float32).reshape(2, 4, 4, 16) % 7
    x[0, 0, 0, 3] = np.nan   # first position of window (0, 0)
    x[1, 3, 2, 5] = np.nan   # last row of window (1, 1)
    want = x.reshape(2, 2, 2, 2, 2, 16).max(axis=(2, 4))  # NumPy propagates NaN
    got = pool.max_pool_forward(x, (2, 2))
    assert np.isnan(got).sum() == 2
    np.testing.assert_array_equal(got, want)
    dx = pool.max_pool_backward(np.ones_like(got), x, (2, 2))
    assert not np.isnan(dx).any() and dx[0, :2, :2, 3].sum() == 1 and dx[0, 0, 0, 3] == 0


def test_pool_float32_and_defaults():
    """float32 stays float32; strides default to the pool size; an int pool
    size means the same size on every axis."""
    x = random((3, 24, 24, 8), np.float32)
    y = pool.max_pool_forward(x, 2)
    assert y.dtype == np.float32 and y.shape == (3, 12, 12, 8)
    np.testing.assert_array_equal(y, x.reshape(3, 12, 2, 12, 2, 8).max(axis=(2, 4)))
    a = pool.avg_pool_forward(x, (2, 2), padding='same')
    np.testing.assert_allclose(a, x.reshape(3, 12, 2, 12, 2, 8).mean(axis=(2, 4)), rtol=1e-6)
    dy = random(y.shape, np.float32)
    dx = pool.max_pool_backward(dy, x, 2)
    assert dx.dtype == np.float32
    np.testing.assert_allclose(dx.reshape(3, 12, 2, 12, 2, 8).sum(axis=(2, 4)), dy)
    da = pool.avg_pool_backward(dy, x.shape, 2)
    np.testing.assert_allclose(da, np.repeat(np.repeat(dy / 4, 2, 1), 2, 2), rtol=1e-6)


def test_pool_errors():
    with pytest.raises(ValueError, match='padding'):
        pool.max_pool_forward(np.zeros((1, 4, 4, 1)), 2, padding='causal')
    with pytest.raises(ValueError, match='does not match'):
        pool.avg_pool_backward(np.zeros((1, 3, 3, 1)), (1, 4, 4, 1), 2)


# ---------------------------------------------------------------------------
# Resizing.

@pytest.mark.parametrize('x_shape, factors', [
    ((2, 5, 3), (3,)),
    ((2, 3, 4, 2), (2, 3)),
    ((1, 2, 3, 2, 2), (2, 1, 3)),
])
def test_upsample_nearest(x_shape, factors):
    x = random(x_shape)
    y = resize.upsample_nearest_forward(x, factors)
    expected = x
    for axis, factor in enumerate(factors, start=1):
        expected = np.repeat(expected, factor, axis=axis)  # Keras' repeat_elements
    np.testing.assert_array_equal(y, expected)
    dy = random(y.shape)
    dx = resize.upsample_nearest_backward(dy, factors)
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-12)


def reference_bilinear(x, size):
    """tf.image.resize_bilinear(align_corners=False) before half-pixel centres,
    pixel by pixel: source position o * (in / out) and its fraction in float32
    as TensorFlow 1's kernel computes them, the values in x's dtype."""
    n, height, width, channels = x.shape
    y = np.zeros((n, size[0], size[1], channels), x.dtype)
    for i in range(size[0]):
        src_y = np.float32(i) * (np.float32(height) / np.float32(size[0]))
        top = int(src_y)
        y_lerp = x.dtype.type(src_y - np.float32(top))
        bottom = min(top + 1, height - 1)
        for j in range(size[1]):
            src_x = np.float32(j) * (np.float32(width) / np.float32(size[1]))
            left = int(src_x)
            x_lerp = x.dtype.type(src_x - np.float32(left))
            right = min(left + 1, width - 1)
            upper = x[:, top, left] + (x[:, top, right] - x[:, top, left]) * x_lerp
            lower = x[:, bottom, left] + (x[:, bottom, right] - x[:, bottom, left]) * x_lerp
            y[:, i, j] = upper + (lower - upper) * y_lerp
    return y


@pytest.mark.parametrize('x_shape, size', [
    ((2, 3, 5, 2), (6, 10)),    # Keras' factor-2 up-sampling
    ((1, 4, 3, 3), (12, 6)),
    ((2, 7, 5, 1), (4, 5)),     # down-sampling, one axis unchanged
])
def test_resize_bilinear(x_shape, size):
    x = random(x_shape)
    y = resize.resize_bilinear_forward(x, size)
    expected = reference_bilinear(x, size)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    dy = random(expected.shape)
    dx = resize.resize_bilinear_backward(dy, x_shape)
    assert dx.shape == x_shape
    np.testing.assert_allclose(inner(dx, x), inner(dy, expected), rtol=1e-11)


@pytest.mark.parametrize('x_shape, size', [
    ((2, 3, 4, 5), (6, 12)),    # Keras' factors 2 and 3
    ((1, 7, 6, 2), (49, 30)),   # factors 7 and 5
    ((2, 9, 5, 3), (4, 7)),     # down-sampling one axis, up-sampling the other
])
def test_resize_bilinear_float32_is_tensorflows_to_the_bit(x_shape, size):
    x = random(x_shape, np.float32)
    y = resize.resize_bilinear_forward(x, size)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, reference_bilinear(x, size))


def test_resize_float32():
    x = random((2, 4, 5, 3), np.float32)
    y = resize.resize_bilinear_forward(x, (8, 10))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference_bilinear(x, (8, 10)), rtol=1e-5, atol=1e-6)
    dy = random(y.shape, np.float32)
    dx = resize.resize_bilinear_backward(dy, x.shape)
    assert dx.dtype == np.float32
    np.testing.assert_allclose(inner(dx, x), inner(dy, y), rtol=1e-4)
    up = resize.upsample_nearest_forward(x, (2, 2))
    assert up.dtype == np.float32
    assert resize.upsample_nearest_backward(up, (2, 2)).dtype == np.float32
