"""Pooling and resizing, channels_last on the jit_kernels pool and resize
kernels (imported when first run, so that importing numbackend does not import
Numba)."""
from ..graph import format_shape
from . import batch
from .registry import apply, contiguous, library
from .windows import conv_dtype, spatial_tuple, sweep_shape, window_attrs

# pool: x (N, *s, C); attrs pool_size, strides, padding, mode ('max' | 'avg')

def _pool_attrs(where, x, attrs):
    rank = x.ndim - 2
    if not 1 <= rank <= 3:
        raise ValueError(f"{where}: expected an input of shape (batch, *spatial, channels) with "
                         f"1 to 3 spatial axes, got {format_shape(x.shape)}")
    if attrs.get("mode") not in ("max", "avg"):
        raise ValueError(f"{where}: pool_mode must be 'max' or 'avg', got {attrs.get('mode')!r}")
    attrs["pool_size"] = spatial_tuple(where, "pool_size", attrs["pool_size"], rank)
    window_attrs(where, attrs, rank, ("valid", "same"))
    if max(attrs["dilation"]) > 1:
        raise ValueError(f"{where}: pooling has no dilation")


def _pool_infer(inputs, attrs):
    (x,) = inputs
    _pool_attrs("pool", x, attrs)
    return (x.shape[0],) + sweep_shape("pool", x, attrs["pool_size"], attrs) + (x.shape[-1],), \
        conv_dtype(inputs)


def _pool(x, pool_size, strides, padding, mode, dilation=None):
    from jit_kernels import pool
    forward = pool.max_pool_forward if mode == "max" else pool.avg_pool_forward
    return forward(x, pool_size, strides, padding)


def _pool_backward_infer(inputs, attrs):
    x = inputs[1]
    _pool_attrs("pool_backward", x, attrs)
    return x.shape, conv_dtype(inputs)


def _pool_backward(dy, x, pool_size, strides, padding, mode, dilation=None):
    from jit_kernels import pool
    if mode == "max":
        return pool.max_pool_backward(dy, x, pool_size, strides, padding)
    return pool.avg_pool_backward(dy, x.shape, pool_size, strides, padding)


def _pool_backward_grad(g, n):
    """avg: the backward op is linear in dy, its adjoint is the pooling itself; max:
    zero w.r.t. x almost everywhere, and w.r.t. dy has no rule (yet)."""
    if n.attrs["mode"] != "avg":
        raise NotImplementedError("gradients: the second derivative of max pooling (pool2d / "
                                  "pool3d with pool_mode='max') is not implemented")
    return [apply("pool", g, **n.attrs), None]


library("pool", _pool_infer, _pool,
        grad=lambda g, n: [apply("pool_backward", g, n.inputs[0], **n.attrs)],
        rows=batch.first_axis_only)
library("pool_backward", _pool_backward_infer, _pool_backward, grad=_pool_backward_grad)


# resize: x (N, *s, C) -> (N, *(s * factors), C); attrs factors, interpolation
# ('nearest': each element repeated; 'bilinear': TensorFlow's old resize_bilinear)

def _resize_infer(inputs, attrs):
    (x,) = inputs
    rank = x.ndim - 2
    if not 1 <= rank <= 3:
        raise ValueError(f"resize: expected an input of shape (batch, *spatial, channels) with "
                         f"1 to 3 spatial axes, got {format_shape(x.shape)}")
    attrs["factors"] = spatial_tuple("resize", "factors", attrs["factors"], rank)
    if attrs.get("interpolation", "nearest") not in ("nearest", "bilinear"):
        raise ValueError(f"resize: interpolation must be 'nearest' or 'bilinear', "
                         f"got {attrs['interpolation']!r}")
    attrs["interpolation"] = attrs.get("interpolation", "nearest")
    spatial = tuple(None if s is None else s * f for s, f in zip(x.shape[1:-1], attrs["factors"]))
    return (x.shape[0],) + spatial + (x.shape[-1],), conv_dtype(inputs)


def _resize(x, factors, interpolation):
    from jit_kernels import resize
    if interpolation == "nearest":
        return contiguous(resize.upsample_nearest_forward(x, factors))
    size = tuple(s * f for s, f in zip(x.shape[1:-1], factors))
    return resize.resize_bilinear_forward(x, size)


def _resize_backward(dy, x, factors, interpolation):
    from jit_kernels import resize
    if interpolation == "nearest":
        return resize.upsample_nearest_backward(dy, factors)
    return resize.resize_bilinear_backward(dy, x.shape)


library("resize", _resize_infer, _resize,
        grad=lambda g, n: [apply("resize_backward", g, n.inputs[0], **n.attrs)])
library("resize_backward", lambda inputs, attrs: (inputs[1].shape, conv_dtype(inputs)),
        _resize_backward, grad=lambda g, n: [apply("resize", g, **n.attrs), None])
