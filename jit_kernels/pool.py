"""Max and average pooling on channels_last NumPy arrays, forward and backward.

Inputs are (N, *spatial, C) with spatial rank 1, 2 or 3; windows, strides and
'valid' / 'same' padding follow TensorFlow (see :mod:`jit_kernels.windows`).
Padded positions never take part: max pooling ignores them and average
pooling divides by the number of input elements inside the window, as
TensorFlow does.  Like the convolution kernels, every Numba kernel works on
5-D (N, D, H, W, C) views, so one compiled kernel serves every rank.

A NaN in a window makes its maximum NaN, as ``np.max`` and ``K.max`` do.

Max-pooling gradient: each window sends its gradient to the first position
holding the maximum, in row-major order over the window (depth, then rows,
then columns); windows that overlap add up.  NaNs are passed over there (a
window of NaNs alone sends its gradient to its first position).
"""

import numpy as np
from numba import prange

from .compiling import njit_cached, njit_cached_twins
from .reduce import maximum
from .windows import (
    JIT_OPTIONS,
    as_5d,
    as_5d_out,
    batch_output_shape,
    float_arrays,
    geometry,
    launch_by_images,
)


@njit_cached(**JIT_OPTIONS)
def _window(o, stride, pad, kernel, size):
    """First and one-past-last input index of window ``o``, clipped to the input."""
    start = o * stride - pad
    return max(start, 0), min(start + kernel, size)


@njit_cached_twins(**JIT_OPTIONS)
def _max_pool(x, y, kernel, stride, pad):
    _, size_d, size_h, size_w, channels = x.shape
    _, od, oh, ow, _ = y.shape
    for line in prange(y.shape[0] * od * oh):
        n = line // (od * oh)
        z = line // oh % od
        yo = line % oh
        z0, z1 = _window(z, stride[0], pad[0], kernel[0], size_d)
        y0, y1 = _window(yo, stride[1], pad[1], kernel[1], size_h)
        for xo in range(ow):
            x0, x1 = _window(xo, stride[2], pad[2], kernel[2], size_w)
            target = y[n, z, yo, xo]
            target[:] = -np.inf
            for iz in range(z0, z1):
                for iy in range(y0, y1):
                    for ix in range(x0, x1):
                        source = x[n, iz, iy, ix]
                        # LLVM's maximum vectorises as it is; a compare and select
                        # became a masked store, slow on AMD's cores
                        for ch in range(channels):
                            target[ch] = maximum(target[ch], source[ch])


@njit_cached_twins(**JIT_OPTIONS)
def _max_pool_backward(x, dy, dx, kernel, stride, pad):
    """Scatter dy to each window's first maximum; parallel over images,
    since windows of one image may overlap.  ``dx`` is (N, D*H*W*C).

    Each channel keeps its best value and the flat offset of where it was,
    updated with selects so that the loop over channels vectorises.  The
    selects read one pair of buffers and write the other, swapping them after
    each window position: written back to where they were read, LLVM turned
    them into masked stores, slow on AMD's cores."""
    _, size_d, size_h, size_w, channels = x.shape
    _, od, oh, ow, _ = dy.shape
    for n in prange(x.shape[0]):
        image = dx[n]
        image[:] = 0
        best, next_best = np.empty(channels, x.dtype), np.empty(channels, x.dtype)
        where, next_where = np.empty(channels, np.int64), np.empty(channels, np.int64)
        for z in range(od):
            z0, z1 = _window(z, stride[0], pad[0], kernel[0], size_d)
            for yo in range(oh):
                y0, y1 = _window(yo, stride[1], pad[1], kernel[1], size_h)
                for xo in range(ow):
                    x0, x1 = _window(xo, stride[2], pad[2], kernel[2], size_w)
                    best[:] = -np.inf
                    where[:] = ((z0 * size_h + y0) * size_w + x0) * channels
                    for iz in range(z0, z1):
                        for iy in range(y0, y1):
                            for ix in range(x0, x1):
                                source = x[n, iz, iy, ix]
                                offset = ((iz * size_h + iy) * size_w + ix) * channels
                                for ch in range(channels):
                                    value, kept, kept_at = source[ch], best[ch], where[ch]
                                    better = value > kept
                                    next_best[ch] = value if better else kept
                                    next_where[ch] = offset if better else kept_at
                                best, next_best = next_best, best
                                where, next_where = next_where, where
                    grad = dy[n, z, yo, xo]
                    for ch in range(channels):
                        image[where[ch] + ch] += grad[ch]


@njit_cached_twins(**JIT_OPTIONS)
def _avg_pool(x, y, kernel, stride, pad):
    _, size_d, size_h, size_w, channels = x.shape
    _, od, oh, ow, _ = y.shape
    for line in prange(y.shape[0] * od * oh):
        n = line // (od * oh)
        z = line // oh % od
        yo = line % oh
        z0, z1 = _window(z, stride[0], pad[0], kernel[0], size_d)
        y0, y1 = _window(yo, stride[1], pad[1], kernel[1], size_h)
        for xo in range(ow):
            x0, x1 = _window(xo, stride[2], pad[2], kernel[2], size_w)
            target = y[n, z, yo, xo]
            target[:] = 0
            for iz in range(z0, z1):
                for iy in range(y0, y1):
                    for ix in range(x0, x1):
                        source = x[n, iz, iy, ix]
                        for ch in range(channels):
                            target[ch] += source[ch]
            scale = 1.0 / ((z1 - z0) * (y1 - y0) * (x1 - x0))
            for ch in range(channels):
                target[ch] *= scale


@njit_cached_twins(**JIT_OPTIONS)
def _avg_pool_backward(dy, dx, kernel, stride, pad):
    """Scatter dy / window count to each window; parallel over images."""
    _, size_d, size_h, size_w, channels = dx.shape
    _, od, oh, ow, _ = dy.shape
    for n in prange(dx.shape[0]):
        dx[n] = 0
        for z in range(od):
            z0, z1 = _window(z, stride[0], pad[0], kernel[0], size_d)
            for yo in range(oh):
                y0, y1 = _window(yo, stride[1], pad[1], kernel[1], size_h)
                for xo in range(ow):
                    x0, x1 = _window(xo, stride[2], pad[2], kernel[2], size_w)
                    scale = 1.0 / ((z1 - z0) * (y1 - y0) * (x1 - x0))
                    grad = dy[n, z, yo, xo]
                    for iz in range(z0, z1):
                        for iy in range(y0, y1):
                            for ix in range(x0, x1):
                                target = dx[n, iz, iy, ix]
                                for ch in range(channels):
                                    target[ch] += grad[ch] * scale


# the serial kernels, which compiled code calls too (Winograd's parts pool their
# bands with them)
max_pool_serial = _max_pool.serial
avg_pool_serial = _avg_pool.serial


def block_finisher(g, out_ch, epilogue, y2, pool, pooled):
    """The ``finish(block, start, stop)`` the convolution paths call with each
    block of products, the values of output rows (positions) start..stop-1,
    whole output lines of one or more images, starting at an even line.

    Without ``pool``, ``epilogue(block, rows start..stop-1 of y2)``.  With
    ``pool`` ('max' or 'avg'), the block (through the epilogue where given)
    is pooled over 2x2 windows with stride 2 into its lines of ``pooled``:
    the full-size result is never written.
    """
    if pool is None:
        return lambda block, start, stop: epilogue(block, y2[start:stop])
    kernel = max_pool_serial if pool == 'max' else avg_pool_serial
    out_h, out_w = g.out[1], g.out[2]
    positions = out_h * out_w

    def finish(block, start, stop):
        if epilogue is not None:
            done = np.empty_like(block)
            epilogue(block, done)
            block = done
        while start < stop:  # lines first..last-1 of an image, or whole images
            n, first = divmod(start, positions)
            if first or stop - start < positions:
                images, end = 1, min(stop, (n + 1) * positions)
                first, last = first // out_w, (end - n * positions) // out_w
            else:
                images = (stop - start) // positions
                end, first, last = start + images * positions, 0, out_h
            lines = block[:end - start].reshape(images, 1, last - first, out_w, out_ch)
            target = pooled[n:n + images, first // 2:last // 2]
            kernel(lines, target.reshape(images, 1, target.shape[1], out_w // 2, out_ch),
                   (1, 2, 2), (1, 2, 2), (0, 0, 0))
            block, start = block[end - start:], end
    return finish


def _pool_geometry(x_shape, pool_size, strides, padding):
    rank = len(x_shape) - 2
    if isinstance(pool_size, (int, np.integer)):
        pool_size = (int(pool_size),) * rank
    if strides is None:
        strides = pool_size
    if padding not in ('valid', 'same'):
        raise ValueError(f"pooling padding must be 'valid' or 'same', got {padding!r}")
    return geometry(tuple(x_shape[1:-1]), tuple(pool_size), strides, padding, 1)


def _check_gradient(g, dy, x_shape, what):
    expected = batch_output_shape(g, x_shape[0], x_shape[-1])
    if dy.shape != expected:
        raise ValueError(f'{what}: gradient {dy.shape} does not match the pooled shape '
                         f'{expected}')


_max_pool_serial = _max_pool.serial  # a global: compiled code cannot look up its attribute


@njit_cached(**JIT_OPTIONS)
def max_pool_2x2(x):
    """Max pooling of x (N, H, W, C) over 2x2 windows with stride 2, 'valid', on
    the calling thread: for compiled code (an exported plan's pooled convolution)."""
    batch, height, width, channels = x.shape
    y = np.empty((batch, height // 2, width // 2, channels), x.dtype)
    window = (np.int64(1), np.int64(2), np.int64(2))  # the kernel and the stride
    pad = (np.int64(0), np.int64(0), np.int64(0))
    _max_pool_serial(x.reshape(batch, 1, height, width, channels),
                     y.reshape(batch, 1, height // 2, width // 2, channels), window, window, pad)
    return y


def max_pool_forward(x, pool_size, strides=None, padding='valid'):
    """Max pooling of x (N, *spatial, C); ``strides`` defaults to ``pool_size``."""
    (x,) = float_arrays(x)
    g = _pool_geometry(x.shape, pool_size, strides, padding)
    y = np.empty(batch_output_shape(g, x.shape[0], x.shape[-1]), x.dtype)
    launch_by_images(_max_pool, x.size, (as_5d(x, g), as_5d_out(y, g)), g.kernel, g.stride, g.pad)
    return y


def max_pool_backward(dy, x, pool_size, strides=None, padding='valid'):
    """Gradient of :func:`max_pool_forward` with respect to x: each window's
    gradient goes to its first maximum (row-major order in the window)."""
    x, dy = float_arrays(x, dy)
    g = _pool_geometry(x.shape, pool_size, strides, padding)
    _check_gradient(g, dy, x.shape, 'max_pool_backward')
    dx = np.empty_like(x)
    launch_by_images(_max_pool_backward, x.size,
                      (as_5d(x, g), as_5d_out(dy, g), dx.reshape(x.shape[0], int(np.prod(x.shape[1:])))),
                      g.kernel, g.stride, g.pad)
    return dx


def avg_pool_forward(x, pool_size, strides=None, padding='valid'):
    """Average pooling of x (N, *spatial, C) over the input elements of each window."""
    (x,) = float_arrays(x)
    g = _pool_geometry(x.shape, pool_size, strides, padding)
    y = np.empty(batch_output_shape(g, x.shape[0], x.shape[-1]), x.dtype)
    launch_by_images(_avg_pool, x.size, (as_5d(x, g), as_5d_out(y, g)), g.kernel, g.stride, g.pad)
    return y


def avg_pool_backward(dy, x_shape, pool_size, strides=None, padding='valid'):
    """Gradient of :func:`avg_pool_forward` with respect to its input of shape ``x_shape``."""
    (dy,) = float_arrays(dy)
    x_shape = tuple(int(s) for s in x_shape)
    g = _pool_geometry(x_shape, pool_size, strides, padding)
    _check_gradient(g, dy, x_shape, 'avg_pool_backward')
    dx = np.empty(x_shape, dy.dtype)
    launch_by_images(_avg_pool_backward, dx.size, (as_5d_out(dy, g), as_5d(dx, g)),
                      g.kernel, g.stride, g.pad)
    return dx
