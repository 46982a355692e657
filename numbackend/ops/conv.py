"""Convolutions: conv, depthwise_conv and local_conv (unshared weights), with
their backward ops, channels_last on the jit_kernels.conv kernels (imported
when first run, so that importing numbackend does not import Numba).  Shapes
are (N, *spatial, C); conv kernels (*k, C, OC), depthwise kernels (*k, C, M);
conv_transpose is conv_backward_input with an explicit output shape."""
import numpy as np

from ..graph import format_shape
from . import batch
from .registry import apply, library
from .windows import (
    ShapeOnly,
    check_sweep,
    conv_dtype,
    spatial_tuple,
    sweep_shape,
    window_attrs,
    window_out,
)


def _check_kernel(where, x, w, depthwise=False):
    what = "depthwise kernel" if depthwise else "kernel"
    rank = w.ndim - 2
    if not 1 <= rank <= 3 or x.ndim != w.ndim:
        raise ValueError(f"{where}: input of shape {format_shape(x.shape)} and {what} of shape "
                         f"{format_shape(w.shape)} do not match: expected (batch, *spatial, "
                         f"channels) and (*kernel_size, channels, ...) with 1 to 3 spatial axes")
    if any(d is None for d in w.shape):
        raise ValueError(f"{where}: the {what} shape must be fully known, got {format_shape(w.shape)}")
    if x.shape[-1] is not None and x.shape[-1] != w.shape[-2]:
        raise ValueError(f"{where}: input of shape {format_shape(x.shape)} has {x.shape[-1]} "
                         f"channels, the {what} of shape {format_shape(w.shape)} expects {w.shape[-2]}")
    return rank


def _window_of(n):
    return {k: n.attrs[k] for k in ("strides", "padding", "dilation")}


def _runtime_shape(static, like_batch, shape=None):
    """A full shape from the static one, the runtime ``shape`` array when given,
    else the batch of ``like_batch`` where the static batch is None."""
    if shape is not None:
        return tuple(int(d) for d in shape)
    return (like_batch,) + tuple(static[1:])


def _shape_input(target, static):
    """The extra inputs a backward op needs for a shape: none when the static
    shape is known but for the batch, else the runtime shape of ``target``."""
    return [] if all(d is not None for d in static[1:]) else [apply("shape", target)]


def _out_shape_infer(where, inputs, attrs, channels_of):
    """Shape/dtype of a backward-input op: attrs ``x_shape`` with the runtime
    shape (an optional last input) where it has None."""
    dy, w = inputs[:2]
    x_shape = tuple(attrs["x_shape"])
    if len(x_shape) != dy.ndim:
        raise ValueError(f"{where}: output shape {x_shape} does not have the rank of the input "
                         f"{format_shape(dy.shape)}")
    if x_shape[0] is None:
        x_shape = (dy.shape[0],) + x_shape[1:]
    if x_shape[-1] is not None and x_shape[-1] != channels_of(w):
        raise ValueError(f"{where}: output shape {x_shape} has {x_shape[-1]} channels, the kernel "
                         f"of shape {format_shape(w.shape)} gives {channels_of(w)}")
    if len(inputs) == 2 and any(d is None for d in x_shape[1:]):
        raise ValueError(f"{where}: output shape {x_shape} is not known; pass it as a tensor")
    check_sweep(where, x_shape, dy.shape, w.shape[:-2], attrs)
    return x_shape, conv_dtype(inputs[:2])


# conv: x (N, *s, C), w (*k, C, OC) -> (N, *out, OC); attrs strides, padding, dilation

def _conv_infer(inputs, attrs):
    x, w = inputs
    rank = _check_kernel("conv", x, w)
    window_attrs("conv", attrs, rank)
    return (x.shape[0],) + sweep_shape("conv", x, w.shape[:-2], attrs) + (w.shape[-1],), \
        conv_dtype(inputs)


def _conv(x, w, strides, padding, dilation, epilogue=None, pool=None, pool_first=False):
    from jit_kernels import conv
    return conv.conv_forward(x, w, strides, padding, dilation, epilogue, pool, pool_first)


def _conv_grad(g, n):
    x, w = n.inputs
    a = _window_of(n)
    gx = apply("conv_backward_input", g, w, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    gw = apply("conv_backward_kernel", x, g, w_shape=w.shape, **a)
    return [gx, gw]


def _conv_backward_input_infer(inputs, attrs):
    dy, w = inputs[:2]
    _check_kernel("conv_backward_input", dy, _swap_io(w))
    window_attrs("conv_backward_input", attrs, w.ndim - 2)
    return _out_shape_infer("conv_backward_input", inputs, attrs, lambda k: k.shape[-2])


def _swap_io(w):
    """w (*k, C, OC) seen from dy's side: (*k, OC, C)."""
    return ShapeOnly(w.shape[:-2] + (w.shape[-1], w.shape[-2]))


def _conv_backward_input(dy, w, *shape, x_shape, strides, padding, dilation):
    from jit_kernels import conv
    full = _runtime_shape(x_shape, dy.shape[0], shape[0] if shape else None)
    return conv.conv_backward_input(dy, w, full, strides, padding, dilation)


def _conv_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    a = _window_of(n)
    gdy = apply("conv", g, w, **a)
    gw = apply("conv_backward_kernel", g, dy, w_shape=w.shape, **a)
    return [gdy, gw] + [None] * (len(n.inputs) - 2)


def _conv_backward_kernel_infer(inputs, attrs):
    x = inputs[0]
    w_shape = tuple(attrs["w_shape"])
    rank = _check_kernel("conv_backward_kernel", x, ShapeOnly(w_shape))
    window_attrs("conv_backward_kernel", attrs, rank)
    return w_shape, conv_dtype(inputs)


def _conv_backward_kernel(x, dy, w_shape, strides, padding, dilation):
    from jit_kernels import conv
    return conv.conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)


def _conv_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = _window_of(n)
    gx = apply("conv_backward_input", dy, g, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    return [gx, apply("conv", x, g, **a)]


library("conv", _conv_infer, _conv, grad=_conv_grad, rows=batch.first_axis_only)
library("conv_backward_input", _conv_backward_input_infer, _conv_backward_input,
        grad=_conv_backward_input_grad)
library("conv_backward_kernel", _conv_backward_kernel_infer, _conv_backward_kernel,
        grad=_conv_backward_kernel_grad)


# depthwise_conv: x (N, *s, C), w (*k, C, M) -> (N, *out, C*M)

def _depthwise_infer(inputs, attrs):
    x, w = inputs
    rank = _check_kernel("depthwise_conv", x, w, depthwise=True)
    window_attrs("depthwise_conv", attrs, rank, ("valid", "same"))
    return (x.shape[0],) + sweep_shape("depthwise_conv", x, w.shape[:-2], attrs) + \
        (w.shape[-2] * w.shape[-1],), conv_dtype(inputs)


def _depthwise(x, w, strides, padding, dilation):
    from jit_kernels import conv
    return conv.depthwise_conv_forward(x, w, strides, padding, dilation)


def _depthwise_grad(g, n):
    x, w = n.inputs
    a = _window_of(n)
    gx = apply("depthwise_conv_backward_input", g, w, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    gw = apply("depthwise_conv_backward_kernel", x, g, w_shape=w.shape, **a)
    return [gx, gw]


def _depthwise_backward_input_infer(inputs, attrs):
    dy, w = inputs[:2]
    if dy.ndim != w.ndim or (dy.shape[-1] is not None
                             and dy.shape[-1] != w.shape[-2] * w.shape[-1]):
        raise ValueError(f"depthwise_conv_backward_input: gradient {format_shape(dy.shape)} does "
                         f"not match the depthwise kernel {format_shape(w.shape)}")
    window_attrs("depthwise_conv_backward_input", attrs, w.ndim - 2, ("valid", "same"))
    return _out_shape_infer("depthwise_conv_backward_input", inputs, attrs, lambda k: k.shape[-2])


def _depthwise_backward_input(dy, w, *shape, x_shape, strides, padding, dilation):
    from jit_kernels import conv
    full = _runtime_shape(x_shape, dy.shape[0], shape[0] if shape else None)
    return conv.depthwise_conv_backward_input(dy, w, full, strides, padding, dilation)


def _depthwise_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    a = _window_of(n)
    gdy = apply("depthwise_conv", g, w, **a)
    gw = apply("depthwise_conv_backward_kernel", g, dy, w_shape=w.shape, **a)
    return [gdy, gw] + [None] * (len(n.inputs) - 2)


def _depthwise_backward_kernel_infer(inputs, attrs):
    x = inputs[0]
    w_shape = tuple(attrs["w_shape"])
    rank = _check_kernel("depthwise_conv_backward_kernel", x, ShapeOnly(w_shape), depthwise=True)
    window_attrs("depthwise_conv_backward_kernel", attrs, rank, ("valid", "same"))
    return w_shape, conv_dtype(inputs)


def _depthwise_backward_kernel(x, dy, w_shape, strides, padding, dilation):
    from jit_kernels import conv
    return conv.depthwise_conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)


def _depthwise_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = _window_of(n)
    gx = apply("depthwise_conv_backward_input", dy, g, *_shape_input(x, x.shape),
               x_shape=x.shape, **a)
    return [gx, apply("depthwise_conv", x, g, **a)]


library("depthwise_conv", _depthwise_infer, _depthwise, grad=_depthwise_grad)
library("depthwise_conv_backward_input", _depthwise_backward_input_infer,
        _depthwise_backward_input, grad=_depthwise_backward_input_grad)
library("depthwise_conv_backward_kernel", _depthwise_backward_kernel_infer,
        _depthwise_backward_kernel, grad=_depthwise_backward_kernel_grad)


# local_conv: x (N, *s, C), w (P, taps*C, F) -> (N, *out, F), 'valid' windows with
# unshared weights; attrs kernel_size, strides, feature_order (the order of a patch's
# features in w: 'channels_last' (taps, C) or 'channels_first' (C, taps))

def _local_infer(inputs, attrs):
    x, w = inputs
    rank = x.ndim - 2
    if not 1 <= rank <= 3 or w.ndim != 3:
        raise ValueError(f"local_conv: expected an input (batch, *spatial, channels) and a kernel "
                         f"(positions, features, filters), got {format_shape(x.shape)} and "
                         f"{format_shape(w.shape)}")
    attrs["kernel_size"] = spatial_tuple("local_conv", "kernel_size", attrs["kernel_size"], rank)
    attrs["strides"] = spatial_tuple("local_conv", "strides", attrs["strides"], rank)
    if attrs.get("feature_order") not in ("channels_last", "channels_first"):
        raise ValueError("local_conv: feature_order must be 'channels_last' or 'channels_first'")
    if any(d is None for d in x.shape[1:]):
        raise ValueError(f"local_conv: the input shape but the batch must be known, got "
                         f"{format_shape(x.shape)}")
    out = tuple(window_out("local_conv", s, k, st, 1, "valid", x.shape)
                for s, k, st in zip(x.shape[1:-1], attrs["kernel_size"], attrs["strides"]))
    want = (int(np.prod(out)), int(np.prod(attrs["kernel_size"])) * x.shape[-1])
    if tuple(w.shape[:2]) != want:
        raise ValueError(f"local_conv: kernel of shape {format_shape(w.shape)} does not match the "
                         f"input of shape {format_shape(x.shape)}: expected ({want[0]}, {want[1]}, "
                         f"filters)")
    return (x.shape[0],) + out + (w.shape[-1],), conv_dtype(inputs)


def _local(x, w, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_forward(x, w, kernel_size, strides, feature_order)


def _local_backward_input(dy, w, x, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_backward_input(dy, w, x.shape, kernel_size, strides, feature_order)


def _local_backward_kernel(x, dy, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_backward_kernel(x, dy, kernel_size, strides, feature_order)


def _local_grad(g, n):
    x, w = n.inputs
    return [apply("local_conv_backward_input", g, w, x, **n.attrs),
            apply("local_conv_backward_kernel", x, g, w_shape=w.shape, **n.attrs)]


library("local_conv", _local_infer, _local, grad=_local_grad)
def _local_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    return [apply("local_conv", g, w, **n.attrs),
            apply("local_conv_backward_kernel", g, dy, w_shape=w.shape, **n.attrs), None]


def _local_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = {k: v for k, v in n.attrs.items() if k != "w_shape"}
    return [apply("local_conv_backward_input", dy, g, x, **a), apply("local_conv", x, g, **a)]


library("local_conv_backward_input",
        lambda inputs, attrs: (inputs[2].shape, conv_dtype(inputs[:2])), _local_backward_input,
        grad=_local_backward_input_grad)
library("local_conv_backward_kernel",
        lambda inputs, attrs: (tuple(attrs["w_shape"]), conv_dtype(inputs)),
        lambda x, dy, w_shape, **a: _local_backward_kernel(x, dy, **a),
        grad=_local_backward_kernel_grad)
