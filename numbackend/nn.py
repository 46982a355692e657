"""Neural-network functions: activations, cross-entropies, dropout, normalisation,
and the switches on the learning phase.

Signatures and meanings are Keras 2.2.5's (its TensorFlow backend).  The
cross-entropies take ``(target, output)`` positionally, Keras 2's order; Keras 1
code that passes them by keyword (``output=``, ``target=``) works unchanged.

Stable cross-entropies: when ``output`` is the result of ``softmax`` (or of the
``exp(x) / sum(exp(x), axis, keepdims=True)`` form Keras builds for inputs of
rank 3 and more) and ``from_logits`` is False, the categorical cross-entropies
are computed from the softmax's input with a log-softmax; likewise
``binary_crossentropy`` of a ``sigmoid`` uses the sigmoid's input.  The result
is the exact cross-entropy of the probabilities, finite for any finite logits,
where the TensorFlow backend clips the probabilities to [epsilon, 1 - epsilon]
(so it caps each term at -log(epsilon) and stops the gradient there).
"""
import numbers

import numpy as np

from . import config, core
from . import random as _random
from .graph import is_tensor
from .math import log_softmax
from .ops import apply, as_tensor, normalize_axes, normalize_axis

# ---------------------------------------------------------------------------
# Activations


def relu(x, alpha=0., max_value=None, threshold=0.):
    """Rectified linear unit.

    With the default values it is ``max(x, 0)``; otherwise
    ``f(x) = max_value`` for ``x >= max_value``,
    ``f(x) = x`` for ``threshold <= x < max_value``,
    ``f(x) = alpha * (x - threshold)`` otherwise.

    # Arguments
        x: a tensor.
        alpha: slope of the negative part.
        max_value: saturation threshold (None: no saturation).
        threshold: threshold of the thresholded activation.
    """
    x = as_tensor(x)
    if alpha != 0:
        if max_value is None and threshold == 0:
            return apply("maximum", apply("multiply", x, alpha), x)  # leaky relu
        shifted = apply("subtract", threshold, x) if threshold != 0 else apply("negative", x)
        negative_part = apply("maximum", shifted, 0)
    if threshold != 0:
        y = apply("multiply", x, apply("cast", apply("greater", x, threshold), dtype=x.dtype))
    else:
        y = apply("maximum", 0, x)  # 0 first: a tie sends the gradient to 0, as TF's relu does
    if max_value is not None:
        y = _clip(y, 0, max_value)
    if alpha != 0:
        y = apply("subtract", y, apply("multiply", negative_part, alpha))
    return y


def elu(x, alpha=1.):
    """Exponential linear unit: ``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise."""
    x = as_tensor(x)
    negative = apply("expm1", apply("minimum", x, 0))
    if alpha != 1:
        negative = apply("multiply", negative, alpha)
    return apply("where", apply("greater", x, 0), x, negative)


def softmax(x, axis=-1):
    """Softmax of a tensor along ``axis`` (default: the last axis)."""
    x = as_tensor(x)
    axis = normalize_axis("softmax", axis, x.ndim)
    # the max only shifts: no gradient flows through it (it would be exactly zero)
    peak = apply("stop_gradient", apply("shift_max", x, axis=axis, keepdims=True))
    e = apply("exp_nonpositive", apply("subtract", x, peak))
    out = apply("times_reciprocal", e, apply("sum", e, axis=axis, keepdims=True))
    out._softmax_of = (x, axis)  # lets the cross-entropies work from the logits
    return out


def softplus(x):
    """Softplus: ``log(1 + exp(x))``."""
    return apply("softplus", x)


def softsign(x):
    """Softsign: ``x / (1 + abs(x))``."""
    x = as_tensor(x)
    return apply("divide", x, apply("add", apply("abs", x), 1))


def sigmoid(x):
    """Element-wise sigmoid: ``1 / (1 + exp(-x))``."""
    return apply("sigmoid", x)


def hard_sigmoid(x):
    """Segment-wise linear approximation of sigmoid: ``clip(0.2 * x + 0.5, 0, 1)``."""
    x = as_tensor(x)
    return _clip(apply("add", apply("multiply", x, 0.2), 0.5), 0, 1)


def tanh(x):
    """Element-wise hyperbolic tangent."""
    return apply("tanh", x)


def _clip(x, low, high):
    return apply("minimum", apply("maximum", x, low), high)


# ---------------------------------------------------------------------------
# Cross-entropies


def _softmax_logits(output, axis):
    """The input of the softmax that made ``output`` along ``axis``, or None."""
    marked = getattr(output, "_softmax_of", None)
    if marked is not None:
        logits, softmax_axis = marked
    elif output.op == "divide" and output.inputs[0].op == "exp" and output.inputs[1].op == "sum":
        e, s = output.inputs
        if s.inputs[0] is not e or not s.attrs["keepdims"] or len(s.attrs["axis"]) != 1:
            return None
        logits, softmax_axis = e.inputs[0], s.attrs["axis"][0]
    else:
        return None
    if softmax_axis != axis:
        return None
    return logits if logits.dtype == output.dtype else apply("cast", logits, dtype=output.dtype)


def _check_channels_axis(axis, output):
    if axis != -1 and axis not in range(output.ndim):
        raise ValueError(f"Unexpected channels axis {axis}. Expected to be -1 or one of the axes "
                         f"of `output`, which has {output.ndim} dimensions.")


def _same_dtype(x, like):
    x = as_tensor(x)
    return x if x.dtype == like.dtype else apply("cast", x, dtype=like.dtype)


def categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical cross-entropy between an output tensor and a target tensor.

    # Arguments
        target: a tensor of the same shape as ``output``.
        output: a tensor resulting from a softmax (unless ``from_logits`` is True,
            in which case ``output`` holds the logits).
        from_logits: whether ``output`` holds logits.
        axis: the channels axis (-1: channels last, 1: channels first).

    # Returns
        The loss, with ``axis`` reduced.  The output of a softmax is used
        through its logits (see the module documentation).
    """
    output = as_tensor(output)
    _check_channels_axis(axis, output)
    axis = normalize_axis("categorical_crossentropy", axis, output.ndim)
    target = _same_dtype(target, output)
    logits = output if from_logits else _softmax_logits(output, axis)
    if logits is not None:
        log_p = log_softmax(logits, axis)
    else:
        p = apply("divide", output, apply("sum", output, axis=axis, keepdims=True))
        eps = config.epsilon()
        log_p = apply("log", _clip(p, eps, 1 - eps))
    return apply("negative", apply("sum", apply("multiply", target, log_p), axis=axis))


def sparse_categorical_crossentropy(target, output, from_logits=False, axis=-1):
    """Categorical cross-entropy with integer targets.

    # Arguments
        target: an integer tensor of class indices (any shape holding one index
            per position of ``output`` outside ``axis``, e.g. (batch,) or (batch, 1)).
        output: a tensor resulting from a softmax (unless ``from_logits`` is True,
            in which case ``output`` holds the logits).
        from_logits: whether ``output`` holds logits.
        axis: the channels axis (-1: channels last, 1: channels first).

    # Returns
        The loss, of the shape of ``output`` without ``axis``; NaN where a target
        is not a valid class index.
    """
    output = as_tensor(output)
    _check_channels_axis(axis, output)
    axis = normalize_axis("sparse_categorical_crossentropy", axis, output.ndim)
    logits = output if from_logits else _softmax_logits(output, axis)
    if logits is None:
        eps = config.epsilon()
        logits = apply("log", _clip(output, eps, 1 - eps))
    if axis != output.ndim - 1:
        perm = tuple(a for a in range(output.ndim) if a != axis) + (axis,)
        logits = apply("transpose", logits, axes=perm)
    log_p = log_softmax(logits, -1)
    labels = _class_indices(as_tensor(target), logits)
    classes = _class_range(log_p)
    one_hot = apply("equal", apply("getitem", labels, key=(Ellipsis, None)), classes)
    picked = apply("sum", apply("where", one_hot, log_p, 0), axis=-1)
    valid = apply("any", one_hot, axis=-1)  # the target is one of the classes
    return apply("where", valid, apply("negative", picked), np.nan)


def _class_indices(target, logits):
    """The targets as int64 indices of the shape of ``logits`` without its last axis."""
    if target.ndim == logits.ndim and target.shape[-1] == 1:
        target = apply("getitem", target, key=(Ellipsis, 0))
    elif target.ndim != logits.ndim - 1:
        batch_shape = apply("getitem", apply("shape", logits), key=(slice(None, -1),))
        target = apply("reshape_dynamic", target, batch_shape)
    return apply("cast", target, dtype="int64") if target.dtype != "int64" else target


def _class_range(log_p):
    """0, 1, ..., classes - 1 along the last axis of ``log_p``."""
    classes = log_p.shape[-1]
    if classes is not None:
        return as_tensor(np.arange(classes, dtype=np.int64))
    return apply("subtract", apply("cumsum", core.ones_like(log_p, dtype="int64"), axis=-1), 1)


def binary_crossentropy(target, output, from_logits=False):
    """Binary cross-entropy between an output tensor and a target tensor.

    # Arguments
        target: a tensor of the same shape as ``output``.
        output: a tensor of probabilities (unless ``from_logits`` is True, in
            which case ``output`` holds the logits).
        from_logits: whether ``output`` holds logits.

    # Returns
        The element-wise loss.  The output of a sigmoid is used through its
        logits (see the module documentation).
    """
    output = as_tensor(output)
    target = _same_dtype(target, output)
    if from_logits:
        logits = output
    elif output.op == "sigmoid":
        logits = _same_dtype(output.inputs[0], output)
    else:
        eps = config.epsilon()
        p = _clip(output, eps, 1 - eps)
        logits = apply("log", apply("divide", p, apply("subtract", 1, p)))
    # max(x, 0) - x * z + log(1 + exp(-|x|)): the stable form of TensorFlow's
    # sigmoid_cross_entropy_with_logits.  -|x| is where(x >= 0, -x, x), whose gradient
    # at x = 0 matches maximum's (both take the x >= 0 side), so that the gradient there
    # is sigmoid(0) - z; abs's gradient at 0 is 0, which would give 1 - z.
    negative_abs = apply("where", apply("greater_equal", logits, 0), apply("negative", logits), logits)
    return apply("add", apply("subtract", apply("maximum", logits, 0), apply("multiply", logits, target)),
                 apply("log1p", apply("exp", negative_abs)))


# ---------------------------------------------------------------------------
# Dropout and normalisation


def dropout(x, level, noise_shape=None, seed=None):
    """Sets a fraction ``level`` of the entries of ``x`` to zero at random and
    scales the others by ``1 / (1 - level)``; each call of a compiled function
    draws a new mask.

    # Arguments
        x: a tensor.
        level: the fraction of entries set to zero, in [0, 1).
        noise_shape: the shape of the keep/drop mask, which must broadcast
            to the shape of ``x`` (None entries take the size of ``x``).
        seed: random seed.
    """
    x = as_tensor(x)
    if is_tensor(level) or not isinstance(level, numbers.Real):
        raise TypeError(f"dropout: level must be a Python number, got {level!r}")
    if not 0 <= level < 1:
        raise ValueError(f"dropout: level must be in [0, 1), got {level}")
    if noise_shape is None:
        noise_shape = core.shape(x) if None in x.shape else x.shape
    elif is_tensor(noise_shape):
        pass
    else:
        noise_shape = tuple(noise_shape)
        if len(noise_shape) != x.ndim:
            raise ValueError(f"dropout: noise_shape {noise_shape} must have one entry per axis "
                             f"of x, whose shape is {x.shape}")
    if not is_tensor(noise_shape) and any(d is None for d in noise_shape):
        noise_shape = [_size(x, i) if d is None else d for i, d in enumerate(noise_shape)]
    dtype = x.dtype if np.dtype(x.dtype).kind == "f" else config.floatx()
    u = _random.random_uniform(noise_shape, dtype=dtype, seed=seed)
    return apply("where", apply("greater_equal", u, level), apply("divide", x, 1 - level), 0)


def _size(x, i):
    """The size of axis ``i`` of ``x``: an int when known, else a scalar tensor."""
    return x.shape[i] if x.shape[i] is not None else apply("getitem", core.shape(x), key=(i,))


def l2_normalize(x, axis=None):
    """``x`` divided by its L2 norm along ``axis`` (all axes when None); norms
    below 1e-6 count as 1e-6."""
    x = as_tensor(x)
    axes = normalize_axes("l2_normalize", axis, x.ndim)
    square_sum = apply("sum", apply("square", x), axis=axes, keepdims=True)
    return apply("divide", x, apply("sqrt", apply("maximum", square_sum, 1e-12)))


def _expand_to(p, ndim, kept_axes):
    """A parameter over the kept axes, given the rank of ``x`` with size-1 axes elsewhere."""
    if p is None:
        return None
    p = as_tensor(p)
    if p.ndim != len(kept_axes) or p.ndim in (0, ndim):
        return p
    return apply("getitem", p, key=tuple(slice(None) if a in kept_axes else None for a in range(ndim)))


def _normalize(x, mean, var, beta, gamma, epsilon):
    inv = apply("divide", 1, apply("sqrt", apply("add", var, epsilon)))
    if gamma is not None:
        inv = apply("multiply", inv, gamma)
    out = apply("multiply", apply("subtract", x, mean), inv)
    return out if beta is None else apply("add", out, beta)


def normalize_batch_in_training(x, gamma, beta, reduction_axes, epsilon=1e-3):
    """Normalises a batch by its own mean and variance over ``reduction_axes``.

    # Arguments
        x: a tensor.
        gamma: scale applied after normalising (None: 1); its shape is that of
            ``x`` without the reduced axes, or one that broadcasts against ``x``.
        beta: offset applied after scaling (None: 0), shaped like ``gamma``.
        reduction_axes: the axes to normalise over.
        epsilon: added to the variance.

    # Returns
        ``(normalized, mean, variance)``; mean and variance have the shape of
        ``x`` without the reduced axes.
    """
    x = as_tensor(x)
    axes = normalize_axes("normalize_batch_in_training", reduction_axes, x.ndim)
    kept = tuple(a for a in range(x.ndim) if a not in axes)
    broadcast = tuple(None if a in axes else slice(None) for a in range(x.ndim))
    mean = apply("mean", x, axis=axes)
    mean_b = apply("getitem", mean, key=broadcast)
    centered = apply("subtract", x, apply("stop_gradient", mean_b))
    var = apply("mean", apply("square", centered), axis=axes)
    var_b = apply("getitem", var, key=broadcast)
    normed = _normalize(x, mean_b, var_b, _expand_to(beta, x.ndim, kept),
                        _expand_to(gamma, x.ndim, kept), epsilon)
    return normed, mean, var


def batch_normalization(x, mean, var, beta, gamma, axis=-1, epsilon=1e-3):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta``.

    # Arguments
        x: a tensor.
        mean, var: the mean and variance to normalise with.
        beta: offset (None: 0).  gamma: scale (None: 1).
        axis: the features axis; parameters of rank 1 apply along it.
        epsilon: added to the variance.
    """
    x = as_tensor(x)
    if not isinstance(axis, (numbers.Integral, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"batch_normalization: axis must be an int, got {axis!r} (Keras 2 puts "
                        "axis before epsilon: pass epsilon by keyword)")
    axis = normalize_axis("batch_normalization", axis, x.ndim)

    def along_axis(p):
        if p is None:
            return None
        p = as_tensor(p)
        if p.ndim == 1 and x.ndim > 1:
            p = _expand_to(p, x.ndim, (axis,))
        return p

    return _normalize(x, along_axis(mean), along_axis(var), along_axis(beta), along_axis(gamma),
                      epsilon)


# ---------------------------------------------------------------------------
# Control on the learning phase


def switch(condition, then_expression, else_expression):
    """``then_expression`` where ``condition`` holds, else ``else_expression``.

    # Arguments
        condition: a scalar (int or bool) tensor, or a tensor of rank up to that
            of the expressions, which selects along the leading axes.
        then_expression: a tensor, or a callable returning one.
        else_expression: a tensor, or a callable returning one.
    """
    if not is_tensor(condition):
        if isinstance(condition, (bool, np.bool_, numbers.Integral)):
            chosen = then_expression if condition else else_expression
            return chosen() if callable(chosen) else chosen
        condition = as_tensor(condition)
    if condition.dtype != "bool":
        condition = apply("not_equal", condition, 0)
    then_expression = then_expression() if callable(then_expression) else then_expression
    else_expression = else_expression() if callable(else_expression) else else_expression
    then_expression = as_tensor(then_expression)
    expr_ndim = then_expression.ndim
    if condition.ndim > expr_ndim:
        raise ValueError("Rank of `condition` should be less than or equal to rank of "
                         f"`then_expression` and `else_expression`. ndim(condition)={condition.ndim}, "
                         f"ndim(then_expression)={expr_ndim}")
    if 0 < condition.ndim < expr_ndim:
        condition = apply("getitem", condition, key=(Ellipsis,) + (None,) * (expr_ndim - condition.ndim))
    return apply("where", condition, then_expression, else_expression)


def _is_python_flag(x):
    return isinstance(x, (bool, np.bool_, numbers.Integral)) and not is_tensor(x)


def in_train_phase(x, alt, training=None):
    """``x`` in the training phase, ``alt`` otherwise.

    # Arguments
        x: what to return in the training phase (a tensor or a callable returning one).
        alt: what to return otherwise (a tensor or a callable returning one).
        training: a scalar tensor or a Python bool/int; defaults to ``learning_phase()``.
    """
    uses_learning_phase = training is None
    if training is None:
        training = core.learning_phase()
    if _is_python_flag(training):
        chosen = x if training else alt
        return chosen() if callable(chosen) else chosen
    out = switch(training, x, alt)
    if uses_learning_phase:
        out._uses_learning_phase = True
    return out


def in_test_phase(x, alt, training=None):
    """``x`` in the test phase, ``alt`` otherwise.

    # Arguments
        x: what to return in the test phase (a tensor or a callable returning one).
        alt: what to return otherwise (a tensor or a callable returning one).
        training: a scalar tensor or a Python bool/int; defaults to ``learning_phase()``.
    """
    return in_train_phase(alt, x, training=training)


__all__ = ["batch_normalization", "binary_crossentropy", "categorical_crossentropy", "dropout",
           "elu", "hard_sigmoid", "in_test_phase", "in_train_phase", "l2_normalize",
           "normalize_batch_in_training", "relu", "sigmoid", "softmax", "softplus", "softsign",
           "sparse_categorical_crossentropy", "switch", "tanh"]
