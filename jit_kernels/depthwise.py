"""Depthwise convolution, forward and backward: direct Numba loops (it has no
matrix product worth the name).  Kernels are ``(*kernel_spatial, in_ch,
depth_multiplier)``; output channel ``c*M + m`` is input channel c convolved
with w[..., c, m], as ``tf.nn.depthwise_conv2d`` orders them.
"""

import numpy as np
from numba import prange

from .compiling import njit_cached_twins
from .windows import (
    JIT_OPTIONS,
    as_5d,
    as_5d_out,
    batch_output_shape,
    check_output_gradient,
    float_arrays,
    geometry,
    launch,
    taps_of,
)


@njit_cached_twins(**JIT_OPTIONS)
def _depthwise_forward(x, w, y, stride, dilation, pad):
    """y[..., c*M + m] = sum over taps of x[..., c] * w[tap, c, m]; w is (KD, KH, KW, C, M)."""
    _, size_d, size_h, size_w, channels = x.shape
    kd, kh, kw, _, mult = w.shape
    _, od, oh, ow, _ = y.shape
    for line in prange(y.shape[0] * od * oh):
        n = line // (od * oh)
        z = line // oh % od
        yo = line % oh
        for xo in range(ow):
            target = y[n, z, yo, xo]
            target[:] = 0
            for a in range(kd):
                iz = z * stride[0] + a * dilation[0] - pad[0]
                if not 0 <= iz < size_d:
                    continue
                for b in range(kh):
                    iy = yo * stride[1] + b * dilation[1] - pad[1]
                    if not 0 <= iy < size_h:
                        continue
                    for c in range(kw):
                        ix = xo * stride[2] + c * dilation[2] - pad[2]
                        if not 0 <= ix < size_w:
                            continue
                        source = x[n, iz, iy, ix]
                        taps = w[a, b, c]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch * mult + m] += source[ch] * taps[ch, m]


@njit_cached_twins(**JIT_OPTIONS)
def _depthwise_backward_input(dy, w, dx, stride, dilation, pad):
    """dx of :func:`_depthwise_forward`, as a gather over input positions."""
    _, size_d, size_h, size_w, channels = dx.shape
    kd, kh, kw, _, mult = w.shape
    _, od, oh, ow, _ = dy.shape
    for line in prange(dx.shape[0] * size_d * size_h):
        n = line // (size_d * size_h)
        iz = line // size_h % size_d
        iy = line % size_h
        for ix in range(size_w):
            target = dx[n, iz, iy, ix]
            target[:] = 0
            for a in range(kd):
                tz = iz + pad[0] - a * dilation[0]
                if tz < 0 or tz % stride[0] != 0 or tz // stride[0] >= od:
                    continue
                for b in range(kh):
                    ty = iy + pad[1] - b * dilation[1]
                    if ty < 0 or ty % stride[1] != 0 or ty // stride[1] >= oh:
                        continue
                    for c in range(kw):
                        tx = ix + pad[2] - c * dilation[2]
                        if tx < 0 or tx % stride[2] != 0 or tx // stride[2] >= ow:
                            continue
                        grad = dy[n, tz // stride[0], ty // stride[1], tx // stride[2]]
                        taps = w[a, b, c]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch] += grad[ch * mult + m] * taps[ch, m]


@njit_cached_twins(**JIT_OPTIONS)
def _depthwise_backward_kernel(x, dy, dw, stride, dilation, pad):
    """dw of :func:`_depthwise_forward`; parallel over taps, which own their slice of dw."""
    _, size_d, size_h, size_w, channels = x.shape
    kd, kh, kw, _, mult = dw.shape
    _, od, oh, ow, _ = dy.shape
    for tap in prange(kd * kh * kw):
        a = tap // (kh * kw)
        b = tap // kw % kh
        c = tap % kw
        target = dw[a, b, c]
        target[:] = 0
        for n in range(x.shape[0]):
            for z in range(od):
                iz = z * stride[0] + a * dilation[0] - pad[0]
                if not 0 <= iz < size_d:
                    continue
                for yo in range(oh):
                    iy = yo * stride[1] + b * dilation[1] - pad[1]
                    if not 0 <= iy < size_h:
                        continue
                    for xo in range(ow):
                        ix = xo * stride[2] + c * dilation[2] - pad[2]
                        if not 0 <= ix < size_w:
                            continue
                        source = x[n, iz, iy, ix]
                        grad = dy[n, z, yo, xo]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch, m] += source[ch] * grad[ch * mult + m]


# ---------------------------------------------------------------------------
# The entry points.

def _depthwise_setup(x_shape, w, strides, padding, dilation, what):
    """The geometry of a depthwise convolution, its shapes checked."""
    if len(x_shape) != w.ndim or x_shape[-1] != w.shape[-2]:
        raise ValueError(f'{what}: input {tuple(x_shape)} does not match depthwise kernel '
                         f'{w.shape}')
    return geometry(x_shape[1:-1], w.shape[:-2], strides, padding, dilation)


def depthwise_conv_forward(x, w, strides=1, padding='valid', dilation=1):
    """Depthwise convolution of x (N, *spatial, C) with w (*k, C, M) -> (N, *out, C*M).

    Output channel ``c*M + m`` is input channel c convolved with w[..., c, m],
    as ``tf.nn.depthwise_conv2d`` orders them.
    """
    x, w = float_arrays(x, w)
    g = _depthwise_setup(x.shape, w, strides, padding, dilation, 'depthwise_conv_forward')
    y = np.empty(batch_output_shape(g, x.shape[0], w.shape[-2] * w.shape[-1]), x.dtype)
    launch(_depthwise_forward, y.size * taps_of(g), as_5d(x, g),
            w.reshape(g.kernel + w.shape[-2:]), as_5d_out(y, g), g.stride, g.dilation, g.pad)
    return y


def depthwise_conv_backward_input(dy, w, x_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`depthwise_conv_forward` with respect to its input."""
    dy, w = float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    g = _depthwise_setup(x_shape, w, strides, padding, dilation, 'depthwise_conv_backward_input')
    check_output_gradient(g, dy.shape, 'depthwise_conv_backward_input')
    dx = np.empty(x_shape, dy.dtype)
    launch(_depthwise_backward_input, dy.size * taps_of(g), as_5d_out(dy, g),
            w.reshape(g.kernel + w.shape[-2:]), as_5d(dx, g), g.stride, g.dilation, g.pad)
    return dx


def depthwise_conv_backward_kernel(x, dy, w_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`depthwise_conv_forward` with respect to its kernel."""
    x, dy = float_arrays(x, dy)
    w_shape = tuple(int(s) for s in w_shape)
    dw = np.empty(w_shape, x.dtype)
    g = _depthwise_setup(x.shape, dw, strides, padding, dilation,
                         'depthwise_conv_backward_kernel')
    check_output_gradient(g, dy.shape, 'depthwise_conv_backward_kernel')
    launch(_depthwise_backward_kernel, dy.size * taps_of(g), as_5d(x, g), as_5d_out(dy, g),
            dw.reshape(g.kernel + w_shape[-2:]), g.stride, g.dilation, g.pad)
    return dw
