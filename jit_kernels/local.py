"""Locally connected (unshared weights) convolution, as Keras 2.2.5's
local_conv1d / local_conv2d: kernel (P, taps*C, F) with P the output
positions in row-major order and 'valid' windows without dilation; one
product per output position over im2col's columns.
"""

import numpy as np

from .columns import add_columns, fill_columns
from .windows import (
    as_5d,
    batch_output_shape,
    check_output_gradient,
    float_arrays,
    geometry,
    int_tuple,
    window_patches,
)

_FEATURE_ORDERS = ('channels_last', 'channels_first')


def _local_setup(x_shape, w_shape, kernel_size, strides, feature_order, what):
    """(geometry, kernel size) of a locally connected convolution, its shapes checked."""
    rank = len(x_shape) - 2
    kernel_size = int_tuple(kernel_size, rank, 'kernel_size')
    g = geometry(x_shape[1:-1], kernel_size, strides, 'valid', 1)
    positions = g.out[0] * g.out[1] * g.out[2]
    patch = int(np.prod(kernel_size)) * x_shape[-1]
    if len(w_shape) != 3 or tuple(w_shape[:2]) != (positions, patch):
        raise ValueError(f'{what}: kernel {tuple(w_shape)} does not match input '
                         f'{tuple(x_shape)}; expected ({positions}, {patch}, filters)')
    if feature_order not in _FEATURE_ORDERS:
        raise ValueError(f'feature_order must be one of {_FEATURE_ORDERS}')
    return g, kernel_size


def _kernel_to_channels_last(w, kernel_size, channels, feature_order):
    """Keras orders a patch (taps, C) for channels_last inputs and (C, taps)
    for channels_first ones; the columns here are always (taps, C)."""
    if feature_order == 'channels_last':
        return w
    rank = len(kernel_size)
    split = w.reshape((w.shape[0], channels) + kernel_size + (w.shape[-1],))
    order = (0,) + tuple(range(2, 2 + rank)) + (1, rank + 2)
    return np.ascontiguousarray(split.transpose(order)).reshape(w.shape)


def _kernel_from_channels_last(dw, kernel_size, channels, feature_order):
    """The inverse of :func:`_kernel_to_channels_last`."""
    if feature_order == 'channels_last':
        return dw
    rank = len(kernel_size)
    split = dw.reshape((dw.shape[0],) + kernel_size + (channels, dw.shape[-1]))
    order = (0, rank + 1) + tuple(range(1, rank + 1)) + (rank + 2,)
    return np.ascontiguousarray(split.transpose(order)).reshape(dw.shape)


def local_conv_forward(x, w, kernel_size, strides=1, feature_order='channels_last'):
    """Locally connected convolution of x (N, *spatial, C) with w (P, taps*C, F).

    ``feature_order`` is the order of a patch's features in w: 'channels_last'
    (taps, C) as Keras uses for channels_last inputs, 'channels_first'
    (C, taps) as Keras' local_conv2d uses for channels_first inputs (x itself
    is channels_last here in both cases).  Returns (N, *out, F).
    """
    x, w = float_arrays(x, w)
    g, kernel_size = _local_setup(x.shape, w.shape, kernel_size, strides, feature_order,
                                  'local_conv_forward')
    batch, channels, filters = x.shape[0], x.shape[-1], w.shape[-1]
    w = _kernel_to_channels_last(w, kernel_size, channels, feature_order)
    positions = w.shape[0]
    cols = np.empty((batch * positions, w.shape[1]), x.dtype)
    fill_columns(window_patches(as_5d(x, g), g), 0, cols)
    # (P, N, taps*C) @ (P, taps*C, F): one product per output position.
    y = np.matmul(cols.reshape(batch, positions, -1).transpose(1, 0, 2), w)
    return np.ascontiguousarray(y.transpose(1, 0, 2)).reshape(batch_output_shape(g, batch, filters))


def local_conv_backward_input(dy, w, x_shape, kernel_size, strides=1,
                              feature_order='channels_last'):
    """Gradient of :func:`local_conv_forward` with respect to its input."""
    dy, w = float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    g, kernel_size = _local_setup(x_shape, w.shape, kernel_size, strides, feature_order,
                                  'local_conv_backward_input')
    check_output_gradient(g, dy.shape, 'local_conv_backward_input')
    batch, positions = x_shape[0], w.shape[0]
    w = _kernel_to_channels_last(w, kernel_size, x_shape[-1], feature_order)
    dy3 = dy.reshape(batch, positions, -1).transpose(1, 0, 2)
    cols = np.matmul(dy3, w.transpose(0, 2, 1))
    cols = np.ascontiguousarray(cols.transpose(1, 0, 2)).reshape(batch * positions, -1)
    dx = np.empty(x_shape, dy.dtype)
    add_columns(cols, 0, as_5d(dx, g), g)
    return dx


def local_conv_backward_kernel(x, dy, kernel_size, strides=1, feature_order='channels_last'):
    """Gradient of :func:`local_conv_forward` with respect to its kernel (P, taps*C, F)."""
    x, dy = float_arrays(x, dy)
    rank = x.ndim - 2
    kernel_size = int_tuple(kernel_size, rank, 'kernel_size')
    batch, channels, filters = x.shape[0], x.shape[-1], dy.shape[-1]
    positions = int(np.prod(dy.shape[1:-1]))
    w_shape = (positions, int(np.prod(kernel_size)) * channels, filters)
    g, _ = _local_setup(x.shape, w_shape, kernel_size, strides, feature_order,
                        'local_conv_backward_kernel')
    check_output_gradient(g, dy.shape, 'local_conv_backward_kernel')
    cols = np.empty((batch * positions, w_shape[1]), x.dtype)
    fill_columns(window_patches(as_5d(x, g), g), 0, cols)
    # (P, taps*C, N) @ (P, N, F)
    dw = np.matmul(cols.reshape(batch, positions, -1).transpose(1, 2, 0),
                   dy.reshape(batch, positions, filters).transpose(1, 0, 2))
    return _kernel_from_channels_last(dw, kernel_size, channels, feature_order)
