"""Convolution-family API.  For now: bias_add (used by Dense and every conv layer)."""
from . import config
from .graph import format_shape
from .ops import apply, as_tensor


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


__all__ = ["bias_add"]
