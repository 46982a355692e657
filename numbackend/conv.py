"""Convolution-family API: bias_add, convolutions, pooling, resizing.

Keras 2.2.5 signatures and layouts: kernels are (*kernel_size, in_channels,
out_channels) whatever ``data_format`` is (transposed kernels
(*kernel_size, out_channels, in_channels), depthwise kernels
(*kernel_size, in_channels, depth_multiplier)); ``data_format`` says whether
x is channels_last (batch, *spatial, channels) or channels_first (batch,
channels, *spatial), default the configured image data format.  The Keras 1
spellings are accepted too: ``border_mode=`` for ``padding``,
``dim_ordering=`` ('th' / 'tf') for ``data_format``; the kernel layout stays
Keras 2's (``numbackend.keras1`` takes Keras 1 kernels).

The ops work on channels_last arrays (see the conv, depthwise_conv, pool,
resize and local_conv ops): channels_first inputs are transposed before and
the results after.  Shape errors are raised when the graph is built.
"""
import numpy as np

from . import config
from .evaluator import evaluate
from .graph import Tensor, format_shape
from .ops import OPS, apply, as_tensor, check_sweep


def bias_add(x, bias, data_format=None):
    """x + bias, with the bias along the channel axis of ``data_format``
    ('channels_last': the last axis; 'channels_first': axis 1).

    ``bias`` is 1-D (one value per channel) or has rank ndim(x) - 1 (a full
    per-position bias in the layout of x without its batch axis)."""
    data_format = config.normalize_data_format(data_format)
    x, bias = as_tensor(x), as_tensor(bias)
    if bias.ndim != 1 and bias.ndim != x.ndim - 1:
        raise ValueError(f"bias_add: unexpected bias rank {bias.ndim} (shape "
                         f"{format_shape(bias.shape)}) for x of shape {format_shape(x.shape)}; "
                         f"expected 1 or {x.ndim - 1}")
    if bias.ndim == 1:
        channels = x.shape[-1] if data_format == "channels_last" or x.ndim < 3 else x.shape[1]
        if channels is not None and bias.shape[0] is not None and channels != bias.shape[0]:
            raise ValueError(f"bias_add: bias of shape {format_shape(bias.shape)} does not match "
                             f"the {channels} channels of x of shape {format_shape(x.shape)}")
        if data_format == "channels_first" and x.ndim >= 3:
            bias = apply("reshape", bias, shape=(-1,) + (1,) * (x.ndim - 2))
    elif data_format == "channels_first" and x.ndim >= 3:
        # Keras 2.2.5 reshapes (not transposes) a full bias to (channels, *spatial)
        dims = tuple(-1 if d is None else d for d in bias.shape)
        bias = apply("reshape", bias, shape=dims[-1:] + dims[:-1])
    return apply("add", x, bias)


# ---------------------------------------------------------------------------
# Helpers


def _options(where, padding, data_format, border_mode, dim_ordering,
             paddings=("valid", "same")):
    """(padding, data_format) from the Keras 2 or Keras 1 spellings."""
    if border_mode is not None:
        padding = border_mode
    if dim_ordering is not None:
        data_format = dim_ordering
    if not isinstance(padding, str) or padding.lower() not in paddings:
        raise ValueError(f"{where}: padding must be one of {paddings}, got {padding!r}")
    try:
        data_format = config.normalize_data_format(data_format)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return padding.lower(), data_format


def _tuple(where, what, value, rank):
    if isinstance(value, (int, np.integer)):
        value = (int(value),) * rank
    try:
        value = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{where}: {what} must be an int or {rank} ints, got {value!r}") from None
    if len(value) != rank or min(value) < 1:
        raise ValueError(f"{where}: {what} must be {rank} positive integer(s), got {value}")
    return value


def _input(where, x, rank):
    x = as_tensor(x)
    if x.ndim != rank + 2:
        raise ValueError(f"{where}: expected an input of rank {rank + 2} (batch, {rank} spatial "
                         f"axes, channels), got shape {format_shape(x.shape)}")
    return x


def _kernel(where, kernel, rank, what="kernel", rank_of_kernel=None):
    kernel = as_tensor(kernel)
    if kernel.ndim != (rank_of_kernel or rank + 2):
        raise ValueError(f"{where}: expected a {what} of rank {rank_of_kernel or rank + 2}, got "
                         f"shape {format_shape(kernel.shape)}")
    return kernel


def _to_last(x, data_format):
    if data_format == "channels_first":
        return apply("transpose", x, axes=(0,) + tuple(range(2, x.ndim)) + (1,))
    return x


def _from_last(y, data_format):
    if data_format == "channels_first":
        return apply("transpose", y, axes=(0, y.ndim - 1) + tuple(range(1, y.ndim - 1)))
    return y


def _channels(x, data_format):
    return x.shape[1] if data_format == "channels_first" else x.shape[-1]


def _check_channels(where, x, kernel, data_format, axis=-2, what="kernel"):
    channels = _channels(x, data_format)
    if channels is not None and kernel.shape[axis] is not None and channels != kernel.shape[axis]:
        raise ValueError(f"{where}: input of shape {format_shape(x.shape)} ({data_format}) has "
                         f"{channels} channels, the {what} of shape {format_shape(kernel.shape)} "
                         f"expects {kernel.shape[axis]}")


def _conv(where, rank, x, kernel, strides, padding, data_format, dilation_rate, border_mode,
          dim_ordering, paddings=("valid", "same")):
    padding, data_format = _options(where, padding, data_format, border_mode, dim_ordering,
                                    paddings)
    x, kernel = _input(where, x, rank), _kernel(where, kernel, rank)
    _check_channels(where, x, kernel, data_format)
    y = apply("conv", _to_last(x, data_format), kernel, strides=_tuple(where, "strides", strides, rank),
              padding=padding, dilation=_tuple(where, "dilation_rate", dilation_rate, rank))
    return _from_last(y, data_format)


# ---------------------------------------------------------------------------
# Convolution


def conv1d(x, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1,
           border_mode=None, dim_ordering=None):
    """1D convolution (cross-correlation) of x (batch, steps, channels) with kernel
    (kernel_size, in_channels, out_channels).  ``padding`` is 'valid', 'same' or
    'causal' (zeros before only, channels_last inputs only, as in Keras)."""
    padding_, data_format_ = _options("conv1d", padding, data_format, border_mode, dim_ordering,
                                      ("valid", "same", "causal"))
    if padding_ == "causal" and data_format_ != "channels_last":
        raise ValueError('conv1d: causal padding needs data_format "channels_last" (temporal data)')
    return _conv("conv1d", 1, x, kernel, strides, padding_, data_format_, dilation_rate, None, None,
                 ("valid", "same", "causal"))


def conv2d(x, kernel, strides=(1, 1), padding="valid", data_format=None, dilation_rate=(1, 1),
           border_mode=None, dim_ordering=None, image_shape=None, filter_shape=None):
    """2D convolution (cross-correlation) of x with kernel (rows, cols, in_channels,
    out_channels); ``padding`` 'valid' or 'same' as TensorFlow.  ``image_shape``
    and ``filter_shape`` (Keras 1 shape hints) are not needed."""
    return _conv("conv2d", 2, x, kernel, strides, padding, data_format, dilation_rate,
                 border_mode, dim_ordering)


def conv3d(x, kernel, strides=(1, 1, 1), padding="valid", data_format=None,
           dilation_rate=(1, 1, 1), border_mode=None, dim_ordering=None, volume_shape=None,
           filter_shape=None):
    """3D convolution (cross-correlation) of x with kernel (d1, d2, d3, in_channels,
    out_channels)."""
    return _conv("conv3d", 3, x, kernel, strides, padding, data_format, dilation_rate,
                 border_mode, dim_ordering)


def _output_shape(where, x, output_shape, rank, data_format):
    """(static channels_last shape, extra inputs): ``output_shape`` may be a tuple of
    ints, None (the batch of x) and scalar tensors, or a 1-D int tensor."""
    if isinstance(output_shape, Tensor):
        if output_shape.ndim != 1 or output_shape.shape[0] not in (None, rank + 2):
            raise ValueError(f"{where}: output_shape must be a 1-D tensor of {rank + 2} ints, "
                             f"got shape {format_shape(output_shape.shape)}")
        entries = [apply("getitem", output_shape, key=(i,)) for i in range(rank + 2)]
    else:
        entries = list(output_shape)
        if len(entries) != rank + 2:
            raise ValueError(f"{where}: output_shape must have {rank + 2} entries (batch, "
                             f"{rank} spatial, channels), got {tuple(output_shape)}")
    if data_format == "channels_first":
        entries = [entries[0]] + entries[2:] + [entries[1]]
    static = tuple(_static_int(e) for e in entries)
    if all(d is not None for d in static[1:]):
        return static, []
    if entries[0] is None:
        entries[0] = apply("getitem", apply("shape", x), key=(0,))
    parts = [as_tensor(e, dtype="int32") if isinstance(e, Tensor) else as_tensor(np.int32(e))
             for e in entries]
    parts = [apply("cast", p, dtype="int32") if p.dtype != "int32" else p for p in parts]
    return static, [apply("stack", *parts, axis=0)]


def _static_value(t, depth=0):
    """The value of a small shape expression (constants, ``shape`` of tensors whose
    shape is known, arithmetic and indexing on them) when it is known before
    running, else None: Keras' Conv2DTranspose computes output_shape from
    K.shape(inputs)."""
    if t.op == "constant":
        return t.value
    if t.op == "shape":
        dims = t.inputs[0].shape
        return None if any(d is None for d in dims) else np.asarray(dims, dtype=np.int32)
    if (t.op == "getitem" and t.inputs[0].op == "shape" and len(t.attrs["key"]) == 1
            and isinstance(t.attrs["key"][0], (int, np.integer))):
        dim = t.inputs[0].inputs[0].shape[t.attrs["key"][0]]   # one known dim of a shape
        return None if dim is None else np.asarray(dim, dtype=np.int32)
    if depth > 16 or not t.inputs or OPS[t.op].stateful or t.op in ("placeholder", "variable"):
        return None
    values = [_static_value(i, depth + 1) for i in t.inputs]
    if any(v is None for v in values):
        return None
    return evaluate(t, values)


def _static_int(entry):
    if entry is None:
        return None
    if isinstance(entry, Tensor):
        value = _static_value(entry)
        return None if value is None or np.ndim(value) != 0 else int(value)
    return int(entry)


def _conv_transpose(where, rank, x, kernel, output_shape, strides, padding, data_format,
                    dilation_rate, border_mode, dim_ordering):
    padding, data_format = _options(where, padding, data_format, border_mode, dim_ordering)
    x, kernel = _input(where, x, rank), _kernel(where, kernel, rank)
    _check_channels(where, x, kernel, data_format, axis=-1)
    static, extra = _output_shape(where, x, output_shape, rank, data_format)
    x = _to_last(x, data_format)
    attrs = {"strides": _tuple(where, "strides", strides, rank), "padding": padding,
             "dilation": _tuple(where, "dilation_rate", dilation_rate, rank)}
    check_sweep(where, static, x.shape, kernel.shape[:-2], attrs)
    y = apply("conv_backward_input", x, kernel, *extra, x_shape=static, **attrs)
    return _from_last(y, data_format)


def conv2d_transpose(x, kernel, output_shape, strides=(1, 1), padding="valid", data_format=None,
                     dilation_rate=(1, 1), border_mode=None, dim_ordering=None):
    """2D transposed convolution (the input gradient of conv2d) of x with kernel
    (rows, cols, out_channels, in_channels), giving ``output_shape`` (in the layout
    of ``data_format``; its entries may be ints, None for the batch, or scalar
    tensors, or it may be a 1-D int tensor)."""
    return _conv_transpose("conv2d_transpose", 2, x, kernel, output_shape, strides, padding,
                           data_format, dilation_rate, border_mode, dim_ordering)


def conv3d_transpose(x, kernel, output_shape, strides=(1, 1, 1), padding="valid",
                     data_format=None, border_mode=None, dim_ordering=None):
    """3D transposed convolution of x with kernel (d1, d2, d3, out_channels,
    in_channels), giving ``output_shape`` (see conv2d_transpose)."""
    return _conv_transpose("conv3d_transpose", 3, x, kernel, output_shape, strides, padding,
                           data_format, (1, 1, 1), border_mode, dim_ordering)


def deconv2d(x, kernel, output_shape, strides=(1, 1), padding="valid", data_format=None,
             dilation_rate=(1, 1), border_mode=None, dim_ordering=None, image_shape=None,
             filter_shape=None):
    """Keras 1's name of conv2d_transpose (with Keras 2's kernel layout)."""
    return conv2d_transpose(x, kernel, output_shape, strides, padding, data_format, dilation_rate,
                            border_mode, dim_ordering)


def _depthwise(where, rank, x, depthwise_kernel, strides, padding, data_format, dilation_rate):
    x = _input(where, x, rank)
    kernel = _kernel(where, depthwise_kernel, rank, "depthwise kernel")
    _check_channels(where, x, kernel, data_format, what="depthwise kernel")
    return apply("depthwise_conv", _to_last(x, data_format), kernel,
                 strides=_tuple(where, "strides", strides, rank), padding=padding,
                 dilation=_tuple(where, "dilation_rate", dilation_rate, rank))


def depthwise_conv2d(x, depthwise_kernel, strides=(1, 1), padding="valid", data_format=None,
                     dilation_rate=(1, 1), border_mode=None, dim_ordering=None):
    """Depthwise 2D convolution with kernel (rows, cols, in_channels, depth_multiplier):
    output channel c * depth_multiplier + m is input channel c convolved with
    kernel[..., c, m]."""
    padding, data_format = _options("depthwise_conv2d", padding, data_format, border_mode,
                                    dim_ordering)
    y = _depthwise("depthwise_conv2d", 2, x, depthwise_kernel, strides, padding, data_format,
                   dilation_rate)
    return _from_last(y, data_format)


def _separable(where, rank, x, depthwise_kernel, pointwise_kernel, strides, padding,
               data_format, dilation_rate, border_mode, dim_ordering):
    padding, data_format = _options(where, padding, data_format, border_mode, dim_ordering)
    pointwise = _kernel(where, pointwise_kernel, rank, "pointwise kernel")
    if any(d != 1 for d in pointwise.shape[:-2]):
        raise ValueError(f"{where}: the pointwise kernel must be (1, ..., channels, filters), "
                         f"got shape {format_shape(pointwise.shape)}")
    y = _depthwise(where, rank, x, depthwise_kernel, strides, padding, data_format, dilation_rate)
    if y.shape[-1] is not None and pointwise.shape[-2] not in (None, y.shape[-1]):
        raise ValueError(f"{where}: the depthwise kernel of shape "
                         f"{format_shape(as_tensor(depthwise_kernel).shape)} gives {y.shape[-1]} "
                         f"channels, the pointwise kernel of shape "
                         f"{format_shape(pointwise.shape)} expects {pointwise.shape[-2]}")
    y = apply("conv", y, pointwise, strides=1, padding="valid", dilation=1)
    return _from_last(y, data_format)


def separable_conv1d(x, depthwise_kernel, pointwise_kernel, strides=1, padding="valid",
                     data_format=None, dilation_rate=1, border_mode=None, dim_ordering=None):
    """Depthwise 1D convolution (kernel (length, in_channels, depth_multiplier))
    followed by a pointwise one (kernel (1, in_channels * depth_multiplier, filters))."""
    return _separable("separable_conv1d", 1, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate, border_mode, dim_ordering)


def separable_conv2d(x, depthwise_kernel, pointwise_kernel, strides=(1, 1), padding="valid",
                     data_format=None, dilation_rate=(1, 1), border_mode=None, dim_ordering=None):
    """Depthwise 2D convolution followed by a pointwise (1, 1, in_channels *
    depth_multiplier, filters) one."""
    return _separable("separable_conv2d", 2, x, depthwise_kernel, pointwise_kernel, strides,
                      padding, data_format, dilation_rate, border_mode, dim_ordering)


# ---------------------------------------------------------------------------
# Pooling


def _pool(where, rank, x, pool_size, strides, padding, data_format, pool_mode, border_mode,
          dim_ordering):
    padding, data_format = _options(where, padding, data_format, border_mode, dim_ordering)
    if pool_mode not in ("max", "avg"):
        raise ValueError(f"{where}: pool_mode must be 'max' or 'avg', got {pool_mode!r}")
    x = _input(where, x, rank)
    y = apply("pool", _to_last(x, data_format), pool_size=_tuple(where, "pool_size", pool_size, rank),
              strides=_tuple(where, "strides", strides, rank), padding=padding, mode=pool_mode)
    return _from_last(y, data_format)


def pool2d(x, pool_size, strides=(1, 1), padding="valid", data_format=None, pool_mode="max",
           border_mode=None, dim_ordering=None):
    """2D max or average pooling ('max' / 'avg') over windows of ``pool_size``;
    'same' windows count only the input elements they cover, as TensorFlow."""
    return _pool("pool2d", 2, x, pool_size, strides, padding, data_format, pool_mode,
                 border_mode, dim_ordering)


def pool3d(x, pool_size, strides=(1, 1, 1), padding="valid", data_format=None, pool_mode="max",
           border_mode=None, dim_ordering=None):
    """3D max or average pooling over windows of ``pool_size``."""
    return _pool("pool3d", 3, x, pool_size, strides, padding, data_format, pool_mode,
                 border_mode, dim_ordering)


# ---------------------------------------------------------------------------
# Resizing


def _resize(where, rank, x, factors, data_format, dim_ordering, interpolation):
    if dim_ordering is not None:
        data_format = dim_ordering
    try:
        data_format = config.normalize_data_format(data_format)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"{where}: interpolation should be one of 'nearest' or 'bilinear', "
                         f"got {interpolation!r}")
    x = _input(where, x, rank)
    y = apply("resize", _to_last(x, data_format), factors=_tuple(where, "factors", factors, rank),
              interpolation=interpolation)
    return _from_last(y, data_format)


def resize_images(x, height_factor, width_factor, data_format=None, interpolation="nearest",
                  dim_ordering=None):
    """Images of a 4-D tensor scaled by the integer factors: 'nearest' repeats each
    pixel, 'bilinear' interpolates as TensorFlow 1's resize_bilinear
    (align_corners=False; float32 results equal TensorFlow's), keeping the
    input's dtype where TensorFlow returns float32.  Any other interpolation
    is a ValueError, as in Keras 2.2.5's TensorFlow backend."""
    return _resize("resize_images", 2, x, (height_factor, width_factor), data_format,
                   dim_ordering, interpolation)


def resize_volumes(x, depth_factor, height_factor, width_factor, data_format=None,
                   dim_ordering=None):
    """Volumes of a 5-D tensor scaled by the integer factors (each element repeated)."""
    return _resize("resize_volumes", 3, x, (depth_factor, height_factor, width_factor),
                   data_format, dim_ordering, "nearest")


# ---------------------------------------------------------------------------
# Locally connected (unshared weights)


def local_conv1d(inputs, kernel, kernel_size, strides, data_format=None):
    """1D convolution with unshared weights: inputs (batch, steps, input_dim), kernel
    (output_length, kernel_size * input_dim, filters) -> (batch, output_length,
    filters).  As in Keras 2.2.5's TensorFlow backend, inputs are channels_last
    unless ``data_format`` is given as 'channels_first' ((batch, input_dim, steps))."""
    data_format = "channels_last" if data_format is None else data_format
    return _local("local_conv1d", 1, inputs, kernel, kernel_size, strides, None, data_format)


def local_conv2d(inputs, kernel, kernel_size, strides, output_shape, data_format=None):
    """2D convolution with unshared weights: kernel (output_rows * output_cols,
    features, filters), a patch's features ordered (rows, cols, channels) for
    channels_last inputs and (channels, rows, cols) for channels_first ones, as
    Keras 2.2.5 builds them; ``output_shape`` is (output_rows, output_cols)."""
    return _local("local_conv2d", 2, inputs, kernel, kernel_size, strides, output_shape,
                  data_format)


def _local(where, rank, x, kernel, kernel_size, strides, output_shape, data_format):
    _, data_format = _options(where, "valid", data_format, None, None)
    x = _input(where, x, rank)
    kernel = _kernel(where, kernel, rank, rank_of_kernel=3)
    y = apply("local_conv", _to_last(x, data_format), kernel,
              kernel_size=_tuple(where, "kernel_size", kernel_size, rank),
              strides=_tuple(where, "strides", strides, rank), feature_order=data_format)
    if output_shape is not None and tuple(output_shape) != tuple(y.shape[1:-1]):
        raise ValueError(f"{where}: output_shape {tuple(output_shape)} does not match the "
                         f"{tuple(y.shape[1:-1])} positions of input {format_shape(x.shape)} "
                         f"with kernel_size {kernel_size} and strides {strides}")
    return _from_last(y, data_format)


__all__ = ["bias_add", "conv1d", "conv2d", "conv2d_transpose", "conv3d", "conv3d_transpose",
           "deconv2d", "depthwise_conv2d", "local_conv1d", "local_conv2d", "pool2d", "pool3d",
           "resize_images", "resize_volumes", "separable_conv1d", "separable_conv2d"]
