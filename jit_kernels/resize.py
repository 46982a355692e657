"""Image and volume resizing on channels_last NumPy arrays, forward and backward.

* Nearest-neighbour up-sampling by integer factors, as Keras' resize_images
  (interpolation='nearest') and resize_volumes: every element repeated
  ``factor`` times along each spatial axis.  Its gradient sums each block.
* Bilinear resizing as Keras 2.2.5's resize_images(interpolation='bilinear'),
  which calls ``tf.image.resize_bilinear`` with the old TensorFlow sampling
  (align_corners=False, no half-pixel offset): output index ``o`` reads input
  position ``o * in / out``, interpolating between ``floor`` of it and the
  next index, clamped to the last one; positions and weights in float32 as
  TensorFlow's.  Applied one spatial axis at a time (last axis first, so the
  rounding matches TensorFlow's top/bottom-then-vertical order: float32
  results are TensorFlow's to the bit); any spatial rank works.  TensorFlow
  returns float32 for any input; here the output keeps the input's dtype.
"""

import numpy as np
from numba import prange

from .compiling import njit_cached_twins
from .windows import JIT_OPTIONS, float_arrays, int_tuple, launch


def _split_spatial(shape, factors):
    """Shape with a factor axis after every spatial axis: (N, s1, f1, s2, f2, ..., C)."""
    split = [shape[0]]
    for size, factor in zip(shape[1:-1], factors):
        split += [size, factor]
    return tuple(split) + (shape[-1],)


def upsample_nearest_forward(x, factors):
    """Repeat x (N, *spatial, C) ``factors[i]`` times along spatial axis i."""
    x = np.asarray(x)
    factors = int_tuple(factors, x.ndim - 2, 'factors')
    split = _split_spatial(x.shape, factors)
    # Broadcasting a view with a length-1 axis after each spatial axis and
    # copying it once writes every output element exactly once.
    view = x.reshape(_split_spatial(x.shape, (1,) * len(factors)))
    out_shape = (x.shape[0],) + tuple(s * f for s, f in zip(x.shape[1:-1], factors)) + x.shape[-1:]
    return np.broadcast_to(view, split).reshape(out_shape)


def upsample_nearest_backward(dy, factors):
    """Gradient of :func:`upsample_nearest_forward`: the sum over each block."""
    dy = np.asarray(dy)
    rank = dy.ndim - 2
    factors = int_tuple(factors, rank, 'factors')
    sizes = []
    for size, factor in zip(dy.shape[1:-1], factors):
        if size % factor:
            raise ValueError(f'upsample_nearest_backward: gradient {dy.shape} is not a '
                             f'multiple of factors {factors}')
        sizes.append(size // factor)
    x_shape = (dy.shape[0],) + tuple(sizes) + dy.shape[-1:]
    return dy.reshape(_split_spatial(x_shape, factors)).sum(axis=tuple(range(2, 2 * rank + 1, 2)))


@njit_cached_twins(**JIT_OPTIONS)
def _interpolate_axis(x, low, high, frac, y):
    """y[a, o, b] = x[a, low[o], b] + (x[a, high[o], b] - x[a, low[o], b]) * frac[o]."""
    outer, size_out, inner = y.shape
    for line in prange(outer * size_out):
        a = line // size_out
        o = line % size_out
        lo = x[a, low[o]]
        hi = x[a, high[o]]
        f = frac[o]
        target = y[a, o]
        for b in range(inner):
            target[b] = lo[b] + (hi[b] - lo[b]) * f


@njit_cached_twins(**JIT_OPTIONS)
def _interpolate_axis_backward(dy, low, high, frac, dx):
    """Gradient of :func:`_interpolate_axis`; parallel over the outer axis,
    since several outputs scatter into the same input row."""
    outer, size_out, inner = dy.shape
    for a in prange(outer):
        dx[a] = 0
        for o in range(size_out):
            grad = dy[a, o]
            lo = dx[a, low[o]]
            hi = dx[a, high[o]]
            f = frac[o]
            for b in range(inner):
                hi[b] += grad[b] * f
                lo[b] += grad[b] - grad[b] * f


def _axis_samples(size_in, size_out, dtype):
    """Input indices below and above output sample o, and the weight of the one above.

    Computed in float32 as TensorFlow computes them, whatever the dtype: the
    scale in / out, o * scale, its integer part and the remainder.
    """
    scale = np.float32(size_in) / np.float32(size_out)
    position = np.arange(size_out, dtype=np.float32) * scale
    low = position.astype(np.int64)  # position >= 0: truncation is floor
    high = np.minimum(low + 1, size_in - 1)
    return low, high, (position - low.astype(np.float32)).astype(dtype)


def _as_outer_axis_inner(shape, axis):
    return int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))


def resize_bilinear_forward(x, size):
    """Resize x (N, *spatial, C) to spatial ``size`` by (bi)linear interpolation,
    with TensorFlow's old align_corners=False sampling."""
    (x,) = float_arrays(x)
    size = int_tuple(size, x.ndim - 2, 'size')
    for axis in range(x.ndim - 2, 0, -1):
        size_in, size_out = x.shape[axis], size[axis - 1]
        if size_in == size_out:
            continue
        shape = x.shape[:axis] + (size_out,) + x.shape[axis + 1:]
        y = np.empty(shape, x.dtype)
        outer, _, inner = _as_outer_axis_inner(x.shape, axis)
        launch(_interpolate_axis, y.size, x.reshape(outer, size_in, inner),
                *_axis_samples(size_in, size_out, x.dtype), y.reshape(outer, size_out, inner))
        x = y
    return x


def resize_bilinear_backward(dy, x_shape):
    """Gradient of :func:`resize_bilinear_forward` with respect to its input of shape ``x_shape``."""
    (dy,) = float_arrays(dy)
    x_shape = tuple(int(s) for s in x_shape)
    if len(x_shape) != dy.ndim or x_shape[0] != dy.shape[0] or x_shape[-1] != dy.shape[-1]:
        raise ValueError(f'resize_bilinear_backward: gradient {dy.shape} does not match '
                         f'input {x_shape}')
    # The forward pass went from the last axis to the first; undo it in reverse.
    for axis in range(1, dy.ndim - 1):
        size_out, size_in = dy.shape[axis], x_shape[axis]
        if size_in == size_out:
            continue
        shape = dy.shape[:axis] + (size_in,) + dy.shape[axis + 1:]
        dx = np.empty(shape, dy.dtype)
        outer, _, inner = _as_outer_axis_inner(dy.shape, axis)
        launch(_interpolate_axis_backward, dy.size, dy.reshape(outer, size_out, inner),
                *_axis_samples(size_in, size_out, dy.dtype), dx.reshape(outer, size_in, inner))
        dy = dx
    return dy
