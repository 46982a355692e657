"""What the convolution and pooling ops share: the attributes of a window
sliding over the spatial axes (strides, padding, dilation) and the output
shapes it gives, as TensorFlow computes them.  Shapes are channels_last,
(N, *spatial, C)."""
import numpy as np

from ..graph import format_shape
from .registry import float_dtype, promote_dtype

CONV_PADDINGS = ("valid", "same", "causal")


def spatial_tuple(where, what, value, rank):
    """``value`` (an int, or one int per spatial axis) as a tuple of ``rank``
    positive ints; raises naming ``where`` and ``what`` otherwise."""
    if isinstance(value, (int, np.integer)):
        value = (int(value),) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank or min(value, default=1) < 1:
        raise ValueError(f"{where}: {what} must be {rank} positive integer(s), got {value}")
    return value


def window_out(where, size, kernel, stride, dilation, padding, x_shape):
    """Output size of one spatial axis (None when ``size`` is unknown), as TensorFlow."""
    if size is None:
        return None
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        out = -(-size // stride)
    elif padding == "causal":
        out = (size - 1) // stride + 1
    else:
        out = (size - span) // stride + 1
    if out < 1:
        raise ValueError(f"{where}: a window of {kernel} (dilation {dilation}) does not fit "
                         f"the input of shape {format_shape(x_shape)} with {padding!r} padding")
    return out


def window_attrs(where, attrs, rank, paddings=CONV_PADDINGS):
    """Check ``attrs``' padding (one of ``paddings``) and set its strides and
    dilation to tuples of ``rank`` ints (both may not exceed 1)."""
    if attrs.get("padding") not in paddings:
        raise ValueError(f"{where}: padding must be one of {paddings}, got {attrs.get('padding')!r}")
    attrs["strides"] = spatial_tuple(where, "strides", attrs.get("strides", 1), rank)
    attrs["dilation"] = spatial_tuple(where, "dilation", attrs.get("dilation", 1), rank)
    if max(attrs["strides"]) > 1 and max(attrs["dilation"]) > 1:
        raise ValueError(f"{where}: strides {attrs['strides']} and dilation {attrs['dilation']} "
                         f"cannot both exceed 1")


def sweep_shape(where, x, kernel, attrs):
    """The spatial output shape of sliding ``kernel`` over ``x`` (a tensor or a
    ShapeOnly) with ``attrs``' strides, padding and dilation."""
    return tuple(window_out(where, s, k, st, d, attrs["padding"], x.shape)
                 for s, k, st, d in zip(x.shape[1:-1], kernel, attrs["strides"], attrs["dilation"]))


def conv_dtype(inputs):
    """The dtype a convolution, pooling or resizing of ``inputs`` computes in."""
    return float_dtype(promote_dtype(inputs))


def check_sweep(where, x_shape, y_shape, kernel, attrs):
    """Raise unless sliding ``kernel`` over ``x_shape`` gives the spatial shape of
    ``y_shape`` (where both are known): the output shape of a transposed convolution."""
    swept = sweep_shape(where, ShapeOnly(x_shape), kernel, attrs)
    if any(a is not None and b is not None and a != b for a, b in zip(swept, y_shape[1:-1])):
        raise ValueError(f"{where}: output shape {format_shape(x_shape)} does not match the input "
                         f"of shape {format_shape(y_shape)}: a convolution with kernel size "
                         f"{tuple(kernel)}, strides {attrs['strides']}, {attrs['padding']!r} "
                         f"padding and dilation {attrs['dilation']} of that shape gives spatial "
                         f"shape {swept}")


class ShapeOnly:
    """A stand-in with only ``shape``/``ndim`` (for the kernel checks)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(self.shape)
