"""The Keras 1 face of numbackend: the backend API of the Keras 1 documentation.

``import numbackend.keras1 as K`` gives code written against Keras 1 the names,
argument orders and defaults it expects: the cross-entropies take
``(output, target)``, images are laid out by ``dim_ordering`` ('th': channels
first, 'tf': channels last; 'th' is the default where Keras 1 says so),
convolutions and pooling take ``border_mode``, ``expand_dims`` takes ``dim``,
``one_hot`` takes ``nb_classes``, the random functions take ``std`` /
``low`` / ``high``, and the normalisation functions default to
``epsilon=1e-4``.

There is one implementation: names that mean the same in Keras 1 and Keras 2
are the flat ``numbackend`` functions themselves, and the others are small
wrappers that map their arguments onto the Keras 2.2.5 signature and call the
flat function.

Convolutions follow the TensorFlow backend: they compute a cross-correlation
(the kernel is not flipped).  A 'th' kernel has the layout
(out_channels, in_channels, rows, cols) and a 'tf' kernel
(rows, cols, in_channels, out_channels); both are passed to Keras 2 in its own
layout.
"""
import numbackend as _package

from . import config as _config
from . import core as _core
from . import math as _math
from . import nn as _nn
from . import random as _random
from .config import (
    backend,
    cast_to_floatx,
    epsilon,
    floatx,
    image_dim_ordering,
    set_epsilon,
    set_floatx,
    set_image_dim_ordering,
)
from .core import (
    batch_set_value,
    cast,
    count_params,
    dtype,
    eval,
    eye,
    get_value,
    get_variable_shape,
    int_shape,
    learning_phase,
    manual_variable_initialization,
    ndim,
    ones,
    print_tensor,
    set_learning_phase,
    set_value,
    shape,
    zeros,
)
from .math import (
    abs,
    all,
    any,
    argmax,
    argmin,
    batch_dot,
    batch_flatten,
    clip,
    concatenate,
    cos,
    dot,
    equal,
    exp,
    flatten,
    gather,
    greater,
    greater_equal,
    lesser,
    lesser_equal,
    log,
    max,
    maximum,
    mean,
    min,
    minimum,
    not_equal,
    permute_dimensions,
    pow,
    prod,
    repeat,
    repeat_elements,
    reshape,
    reverse,
    round,
    sign,
    sin,
    sqrt,
    square,
    squeeze,
    std,
    sum,
    tile,
    transpose,
    var,
)
from .nn import elu, hard_sigmoid, sigmoid, softplus, softsign, switch, tanh
from .random import random_binomial, random_normal_variable, random_uniform_variable
from .updates import moving_average_update, stop_gradient, update, update_add, update_sub

_DATA_FORMATS = {"th": "channels_first", "tf": "channels_last"}


def _data_format(dim_ordering):
    """The Keras 2 ``data_format`` for a Keras 1 ``dim_ordering``: 'th' (channels
    first) or 'tf' (channels last); 'default' is the configured image layout."""
    if dim_ordering == "default":
        return _config.image_data_format()
    if dim_ordering not in _DATA_FORMATS:
        raise ValueError(f"dim_ordering must be 'th' or 'tf', got {dim_ordering!r}")
    return _DATA_FORMATS[dim_ordering]


def _flat(name):
    """The flat API's function ``name``, looked up when called (so that a test or a
    user patching ``numbackend.<name>`` reaches the Keras 1 wrapper too)."""
    return getattr(_package, name)


# ---------------------------------------------------------------------------
# Variables and placeholders


def variable(value, dtype=None, name=None):
    """A variable holding ``value`` (a NumPy array); ``dtype`` defaults to floatx().
    Named as Keras 1's TensorFlow backend names it: ``'w'`` becomes ``'w:0'``
    (inside a ``name_scope``, ``'<scope>/w:0'``; a repeated name ``'w_1:0'``)."""
    return _core.variable(value, dtype=dtype, name=name)


def placeholder(shape=None, ndim=None, dtype=None, name=None):
    """An input placeholder of ``shape`` (None entries allowed) or of rank ``ndim``;
    one of them is required and ``shape`` wins.  ``dtype`` defaults to floatx().
    Named as ``variable`` is."""
    return _core.placeholder(shape=shape, ndim=ndim, dtype=dtype, name=name)


def zeros_like(x, name=None):
    """A tensor of zeros of the shape and dtype of ``x``."""
    return _core.zeros_like(x, name=name)


def ones_like(x, name=None):
    """A tensor of ones of the shape and dtype of ``x``."""
    return _core.ones_like(x, name=name)


def batch_get_value(xs):
    """The values of the variables ``xs``, as a list of NumPy arrays."""
    return _core.batch_get_value(xs)


# ---------------------------------------------------------------------------
# Shapes, indexing and padding


def one_hot(indices, nb_classes):
    """One-hot encoding of an integer tensor of shape (batch_size, dim1, ...):
    shape (batch_size, dim1, ..., nb_classes)."""
    return _math.one_hot(indices, num_classes=nb_classes)


def expand_dims(x, dim=-1):
    """``x`` with a new axis of length 1 at index ``dim``."""
    return _math.expand_dims(x, axis=dim)


def temporal_padding(x, padding=1):
    """Pads the middle axis of a 3D tensor with ``padding`` zeros on each side."""
    return _math.temporal_padding(x, padding)


def spatial_2d_padding(x, padding=(1, 1), dim_ordering="th"):
    """Pads the rows and columns of a 4D tensor with ``padding[0]`` and
    ``padding[1]`` zeros on each side; ``dim_ordering`` 'th' (channels first:
    axes 2 and 3) or 'tf' (channels last: axes 1 and 2)."""
    return _math.spatial_2d_padding(x, padding, data_format=_data_format(dim_ordering))


def spatial_3d_padding(x, padding=(1, 1, 1), dim_ordering="th"):
    """Pads the three spatial axes of a 5D tensor with ``padding[0]``,
    ``padding[1]`` and ``padding[2]`` zeros on each side; ``dim_ordering``
    'th' (axes 2, 3, 4) or 'tf' (axes 1, 2, 3)."""
    return _math.spatial_3d_padding(x, padding, data_format=_data_format(dim_ordering))


def pack(x):
    """The list of tensors ``x`` stacked along a new first axis."""
    return _math.stack(x, axis=0)


def resize_images(X, height_factor, width_factor, dim_ordering):
    """Nearest-neighbour upsampling of a 4D tensor of images by the positive
    integers (height_factor, width_factor); ``dim_ordering`` 'th'
    (batch, channels, height, width) or 'tf' (batch, height, width, channels)."""
    return _flat("resize_images")(X, height_factor, width_factor,
                                  data_format=_data_format(dim_ordering))


def resize_volumes(X, depth_factor, height_factor, width_factor, dim_ordering):
    """Nearest-neighbour upsampling of a 5D tensor of volumes by the positive
    integers (depth_factor, height_factor, width_factor); ``dim_ordering`` 'th'
    (batch, channels, depth, height, width) or 'tf' (batch, depth, height, width,
    channels)."""
    return _flat("resize_volumes")(X, depth_factor, height_factor, width_factor,
                                   data_format=_data_format(dim_ordering))


# ---------------------------------------------------------------------------
# Normalisation


def normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=1e-4):
    """Normalises ``x`` by its mean and variance over ``reduction_axes``, then
    scales by ``gamma`` and shifts by ``beta``; returns (normed, mean, var)."""
    return _nn.normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=epsilon)


def batch_normalization(x, mean, var, beta, gamma, epsilon=1e-4):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta``; the parameters
    broadcast against ``x`` (1D ones along its last axis)."""
    return _nn.batch_normalization(x, mean, var, beta, gamma, epsilon=epsilon)


# ---------------------------------------------------------------------------
# Graph and control


def function(inputs, outputs, updates=[]):  # noqa: B006 (Keras 1's signature; never modified)
    """A callable that takes a list of arrays for the placeholders ``inputs`` and
    returns the list of values of ``outputs``; ``updates`` are
    (variable, new_value) pairs, all computed from the values before the call."""
    return _core.function(inputs, outputs, updates=list(updates))


def gradients(loss, variables):
    """The gradients of ``loss`` with respect to the list ``variables``."""
    return _flat("gradients")(loss, variables)


def rnn(step_function, inputs, initial_states, go_backwards=False, mask=None,
        constants=None, unroll=False, input_length=None):
    """Iterates ``step_function(input_t, states) -> (output_t, new_states)`` over
    axis 1 of ``inputs`` (samples, time, ...); ``constants`` are appended to the
    states of every step, ``mask`` (samples, time[, 1]) keeps the previous
    output and states where it is 0.  Returns (last_output, outputs, new_states)."""
    return _flat("rnn")(step_function, inputs, initial_states, go_backwards=go_backwards,
                        mask=mask, constants=constants, unroll=unroll,
                        input_length=input_length)


def in_train_phase(x, alt):
    """``x`` in the training phase (learning_phase() 1), ``alt`` otherwise."""
    return _nn.in_train_phase(x, alt)


def in_test_phase(x, alt):
    """``x`` in the test phase (learning_phase() 0), ``alt`` otherwise."""
    return _nn.in_test_phase(x, alt)


# ---------------------------------------------------------------------------
# Neural-network functions


def relu(x, alpha=0., max_value=None):
    """Rectified linear unit: ``alpha * x`` below 0, ``x`` above, capped at
    ``max_value`` when it is given."""
    return _nn.relu(x, alpha=alpha, max_value=max_value)


def softmax(x):
    """Softmax over the last axis."""
    return _nn.softmax(x)


def categorical_crossentropy(output, target, from_logits=False):
    """Categorical cross-entropy of ``output`` (probabilities, or logits when
    ``from_logits``) against ``target`` of the same shape, over the last axis."""
    return _nn.categorical_crossentropy(target, output, from_logits=from_logits)


def sparse_categorical_crossentropy(output, target, from_logits=False):
    """Categorical cross-entropy of ``output`` (probabilities, or logits when
    ``from_logits``) against the integer class indices ``target``."""
    return _nn.sparse_categorical_crossentropy(target, output, from_logits=from_logits)


def binary_crossentropy(output, target, from_logits=False):
    """Element-wise binary cross-entropy of ``output`` (probabilities, or logits
    when ``from_logits``) against ``target``."""
    return _nn.binary_crossentropy(target, output, from_logits=from_logits)


def dropout(x, level, seed=None):
    """Sets a fraction ``level`` of the entries of ``x`` to zero at random and
    scales the others by 1 / (1 - level); ``seed`` fixes the random draws."""
    return _nn.dropout(x, level, seed=seed)


def l2_normalize(x, axis):
    """``x`` divided by its L2 norm along ``axis``."""
    return _nn.l2_normalize(x, axis=axis)


# ---------------------------------------------------------------------------
# Random tensors


def random_normal(shape, mean=0.0, std=1.0, dtype=None, seed=None):
    """Samples of a normal distribution of mean ``mean`` and standard deviation ``std``."""
    return _random.random_normal(shape, mean=mean, stddev=std, dtype=dtype, seed=seed)


def random_uniform(shape, low=0.0, high=1.0, dtype=None, seed=None):
    """Samples of a uniform distribution on [low, high)."""
    return _random.random_uniform(shape, minval=low, maxval=high, dtype=dtype, seed=seed)


# ---------------------------------------------------------------------------
# Convolution and pooling


def conv2d(x, kernel, strides=(1, 1), border_mode="valid", dim_ordering="th",
           image_shape=None, filter_shape=None):
    """2D convolution of ``x`` by ``kernel``.

    ``border_mode`` is 'valid' or 'same'.  With ``dim_ordering`` 'th', ``x`` is
    (samples, channels, rows, cols) and ``kernel`` (out_channels, in_channels,
    rows, cols); with 'tf', ``x`` is (samples, rows, cols, channels) and
    ``kernel`` (rows, cols, in_channels, out_channels).  ``image_shape`` and
    ``filter_shape`` are shape hints and are not needed.
    """
    data_format = _data_format(dim_ordering)
    if data_format == "channels_first":
        kernel = _math.permute_dimensions(kernel, (2, 3, 1, 0))
    return _flat("conv2d")(x, kernel, strides=strides, padding=border_mode,
                           data_format=data_format, dilation_rate=(1, 1))


def deconv2d(x, kernel, output_shape, strides=(1, 1), border_mode="valid", dim_ordering="th",
             image_shape=None, filter_shape=None):
    """2D transposed convolution (the gradient of ``conv2d`` with respect to its
    input) giving a tensor of ``output_shape`` (in the layout of ``dim_ordering``).

    ``kernel`` has the ``conv2d`` layout of ``dim_ordering``:
    (out_channels, in_channels, rows, cols) for 'th' and
    (rows, cols, in_channels, out_channels) for 'tf', where out_channels are the
    channels of the result and in_channels those of ``x``.  ``image_shape`` and
    ``filter_shape`` are shape hints.
    """
    data_format = _data_format(dim_ordering)
    if data_format == "channels_first":
        kernel = _math.permute_dimensions(kernel, (2, 3, 0, 1))
    else:
        kernel = _math.permute_dimensions(kernel, (0, 1, 3, 2))
    return _flat("conv2d_transpose")(x, kernel, output_shape, strides=strides,
                                     padding=border_mode, data_format=data_format,
                                     dilation_rate=(1, 1))


def conv3d(x, kernel, strides=(1, 1, 1), border_mode="valid", dim_ordering="th",
           volume_shape=None, filter_shape=None):
    """3D convolution of ``x`` by ``kernel``.

    With ``dim_ordering`` 'th', ``x`` is (samples, channels, dim1, dim2, dim3) and
    ``kernel`` (out_channels, in_channels, dim1, dim2, dim3); with 'tf', ``x`` is
    (samples, dim1, dim2, dim3, channels) and ``kernel``
    (dim1, dim2, dim3, in_channels, out_channels).  ``volume_shape`` and
    ``filter_shape`` are shape hints.
    """
    data_format = _data_format(dim_ordering)
    if data_format == "channels_first":
        kernel = _math.permute_dimensions(kernel, (2, 3, 4, 1, 0))
    return _flat("conv3d")(x, kernel, strides=strides, padding=border_mode,
                           data_format=data_format, dilation_rate=(1, 1, 1))


def pool2d(x, pool_size, strides=(1, 1), border_mode="valid", dim_ordering="th",
           pool_mode="max"):
    """2D pooling of windows of ``pool_size``; ``border_mode`` 'valid' or 'same',
    ``pool_mode`` 'max' or 'avg', ``dim_ordering`` 'th' or 'tf'."""
    return _flat("pool2d")(x, pool_size, strides=strides, padding=border_mode,
                           data_format=_data_format(dim_ordering), pool_mode=pool_mode)


def pool3d(x, pool_size, strides=(1, 1, 1), border_mode="valid", dim_ordering="th",
           pool_mode="max"):
    """3D pooling of windows of ``pool_size``; ``border_mode`` 'valid' or 'same',
    ``pool_mode`` 'max' or 'avg', ``dim_ordering`` 'th' or 'tf'."""
    return _flat("pool3d")(x, pool_size, strides=strides, padding=border_mode,
                           data_format=_data_format(dim_ordering), pool_mode=pool_mode)


# ---------------------------------------------------------------------------
# CTC


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """CTC loss of each sample, shape (samples, 1): ``y_true`` (samples,
    max_label_len) integer labels, ``y_pred`` (samples, time, classes) softmax
    output with the blank last, ``input_length`` and ``label_length`` (samples, 1)."""
    return _flat("ctc_batch_cost")(y_true, y_pred, input_length, label_length)


def ctc_decode(y_pred, input_length, greedy=True, beam_width=None, dict_seq_lens=None,
               dict_values=None):
    """Decodes the softmax output ``y_pred`` (samples, time, classes) whose
    sequences have the lengths ``input_length`` (samples, 1).

    ``greedy``: best path (argmax, merge repeats, drop blanks); otherwise a beam
    search of width ``beam_width`` (100 when None), constrained to the
    dictionary ``dict_values`` (a list of label lists, of lengths
    ``dict_seq_lens``) when one is given.  Returns (list of decoded
    (samples, max_len) tensors padded with -1, log-probabilities).
    """
    dictionary = {}
    if dict_seq_lens is not None or dict_values is not None:
        dictionary = {"dict_seq_lens": dict_seq_lens, "dict_values": dict_values}
    return _flat("ctc_decode")(y_pred, _math.flatten(input_length), greedy=greedy,
                               beam_width=100 if beam_width is None else beam_width,
                               top_paths=1, **dictionary)


__all__ = [
    "abs", "all", "any", "argmax", "argmin", "backend", "batch_dot", "batch_flatten",
    "batch_get_value", "batch_normalization", "batch_set_value", "binary_crossentropy", "cast",
    "cast_to_floatx", "categorical_crossentropy", "clip", "concatenate", "conv2d", "conv3d",
    "cos", "count_params", "ctc_batch_cost", "ctc_decode", "deconv2d", "dot", "dropout", "dtype",
    "elu", "epsilon", "equal", "eval", "exp", "expand_dims", "eye", "flatten", "floatx",
    "function", "gather", "get_value", "get_variable_shape", "gradients", "greater", "greater_equal", "hard_sigmoid",
    "image_dim_ordering", "in_test_phase", "in_train_phase", "int_shape", "l2_normalize",
    "learning_phase", "lesser", "lesser_equal", "log", "manual_variable_initialization", "max",
    "maximum", "mean", "min", "minimum", "moving_average_update", "ndim",
    "normalize_batch_in_training", "not_equal", "one_hot", "ones", "ones_like", "pack",
    "permute_dimensions", "placeholder", "pool2d", "pool3d", "pow", "print_tensor", "prod",
    "random_binomial", "random_normal", "random_normal_variable", "random_uniform",
    "random_uniform_variable", "relu", "repeat", "repeat_elements", "reshape", "resize_images",
    "resize_volumes", "reverse", "rnn", "round", "set_epsilon", "set_floatx",
    "set_image_dim_ordering", "set_learning_phase", "set_value", "shape", "sigmoid", "sign",
    "sin", "softmax", "softplus", "softsign", "sparse_categorical_crossentropy",
    "spatial_2d_padding", "spatial_3d_padding", "sqrt", "square", "squeeze", "std",
    "stop_gradient", "sum", "switch", "tanh", "temporal_padding", "tile", "transpose",
    "update", "update_add", "update_sub", "var", "variable", "zeros", "zeros_like",
]
