"""Random tensors and randomly initialised variables.

Every random tensor is a graph node that owns a NumPy ``Generator``: each
call of a compiled function draws fresh values from it.  A node made with a
``seed`` starts its generator from that seed, so two nodes made with the
same seed give the same first draw.  Without a seed, the seed is drawn from
NumPy's global generator (``np.random``) when the tensor or variable is made,
as Keras 2.2.5's TensorFlow backend does: Keras's recipe for reproducible runs,
``np.random.seed(n)`` first, then makes a process's initial weights, dropout
masks and other draws the same in every run.

``shape`` is a tuple of ints, or a symbolic shape: a 1-D integer tensor such
as ``K.shape(x)``, or a list that mixes ints and scalar integer tensors (as
Keras builds from ``K.shape(x)[i]``).
"""
import numbers

import numpy as np

from . import config
from .core import variable
from .graph import canonical_dtype, is_tensor
from .ops import apply, as_tensor

# The seeds drawn from np.random where none is given lie in [0, n), n as the
# TensorFlow backend has it: np.random.randint(10e6) for a random tensor,
# np.random.randint(10e8) for a randomly initialised variable.
TENSOR_SEEDS = 10 ** 7
VARIABLE_SEEDS = 10 ** 9


def _generator(seed, seeds=TENSOR_SEEDS):
    """A new Generator started from ``seed``, or where it is None from a seed
    in [0, seeds) drawn from NumPy's global generator."""
    if seed is None:
        seed = np.random.randint(seeds)
    return np.random.default_rng(int(seed))


def _float_dtype(dtype, where):
    dtype = canonical_dtype(config.floatx() if dtype is None else dtype, where)
    if np.dtype(dtype).kind != "f":
        raise TypeError(f"{where}: dtype must be a float type, got {dtype!r}")
    return dtype


def _static_dim(d):
    """The size a scalar shape entry is known to have, or None."""
    if not is_tensor(d):
        return int(d)
    if d.op == "constant":
        return int(d.value)
    if d.op == "getitem" and d.inputs[0].op == "shape" and isinstance(d.attrs["key"][0], int):
        return d.inputs[0].inputs[0].shape[d.attrs["key"][0]]
    return None


def _shape_arg(shape, where):
    """(static shape, None) for a tuple of ints; (static shape, 1-D int tensor) for a
    symbolic shape.  The static shape holds None where the size is only known at run time."""
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (shape,)
    if is_tensor(shape):
        if shape.ndim != 1 or shape.shape[0] is None:
            raise ValueError(f"{where}: a symbolic shape must be a 1-D integer tensor of known "
                             f"length, got {shape!r}")
        if shape.op == "constant":
            return tuple(int(d) for d in shape.value), None
        static = shape.inputs[0].shape if shape.op == "shape" else (None,) * shape.shape[0]
        return tuple(static), shape
    try:
        entries = list(shape)
    except TypeError:
        raise TypeError(f"{where}: shape must be a tuple of ints or an integer tensor, "
                        f"got {shape!r}") from None
    for d in entries:
        if is_tensor(d):
            if d.ndim != 0 or np.dtype(d.dtype).kind not in "iu":
                raise ValueError(f"{where}: a shape entry must be an int or a scalar integer "
                                 f"tensor, got {d!r}")
        elif not isinstance(d, (numbers.Integral, np.integer)) or d < 0:
            raise ValueError(f"{where}: bad dimension {d!r} in shape {tuple(entries)}")
    static = tuple(_static_dim(d) for d in entries)
    if not any(is_tensor(d) for d in entries):
        return static, None
    dims = apply("concatenate", *[apply("reshape", _int64(d), shape=(1,)) for d in entries], axis=0)
    return static, dims


def _int64(d):
    if not is_tensor(d):
        return as_tensor(int(d), dtype="int64")
    return d if d.dtype == "int64" else apply("cast", d, dtype="int64")


def _draw(kind, shape, dtype, seed, where, **params):
    static, dims = _shape_arg(shape, where)
    rng = _generator(seed)
    if dims is None:
        return apply("random_" + kind, shape=static, dtype=dtype, rng=rng, **params)
    return apply("random_shaped", dims, kind=kind, shape=static, dtype=dtype, rng=rng, **params)


def _is_number(x):
    return isinstance(x, (numbers.Real, np.number)) and not is_tensor(x)


_STANDARD = {"normal": {"mean": 0.0, "stddev": 1.0},
             "truncated_normal": {"mean": 0.0, "stddev": 1.0},
             "uniform": {"minval": 0.0, "maxval": 1.0}}


def _scaled(kind, shape, dtype, seed, where, scale, shift):
    """A standard draw times ``scale`` plus ``shift``, for parameters given as tensors."""
    out = _draw(kind, shape, dtype, seed, where, **_STANDARD[kind])
    return apply("add", apply("multiply", out, _param(scale, dtype)), _param(shift, dtype))


def _param(x, dtype):
    x = x if is_tensor(x) else as_tensor(x, dtype=dtype)
    return x if x.dtype == dtype else apply("cast", x, dtype=dtype)


def random_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """A tensor of samples from a normal distribution.

    # Arguments
        shape: tuple of ints (or a symbolic shape), the shape of the tensor.
        mean: float, mean of the normal distribution.
        stddev: float, standard deviation of the normal distribution.
        dtype: dtype of the tensor (default: floatx()).
        seed: int, random seed.
    """
    dtype = _float_dtype(dtype, "random_normal")
    if _is_number(mean) and _is_number(stddev):
        return _draw("normal", shape, dtype, seed, "random_normal",
                     mean=float(mean), stddev=float(stddev))
    return _scaled("normal", shape, dtype, seed, "random_normal", stddev, mean)


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    """A tensor of samples from a truncated normal distribution: values more than two
    standard deviations from the mean are dropped and drawn again.

    # Arguments
        shape: tuple of ints (or a symbolic shape), the shape of the tensor.
        mean: float, mean of the values.
        stddev: float, standard deviation of the values (before truncation).
        dtype: dtype of the tensor (default: floatx()).
        seed: int, random seed.
    """
    dtype = _float_dtype(dtype, "truncated_normal")
    if _is_number(mean) and _is_number(stddev):
        return _draw("truncated_normal", shape, dtype, seed, "truncated_normal",
                     mean=float(mean), stddev=float(stddev))
    return _scaled("truncated_normal", shape, dtype, seed, "truncated_normal", stddev, mean)


def random_uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    """A tensor of samples from a uniform distribution on [minval, maxval).

    An integer ``dtype`` gives integers in [minval, maxval).

    # Arguments
        shape: tuple of ints (or a symbolic shape), the shape of the tensor.
        minval: float, lower bound of the range.
        maxval: float, upper bound of the range (excluded).
        dtype: dtype of the tensor (default: floatx()).
        seed: int, random seed.
    """
    dtype = canonical_dtype(config.floatx() if dtype is None else dtype, "random_uniform")
    if np.dtype(dtype).kind in "iu":
        u = random_uniform(shape, minval, maxval, dtype="float64", seed=seed)
        return apply("cast", apply("floor", u), dtype=dtype)
    if np.dtype(dtype).kind != "f":
        raise TypeError(f"random_uniform: dtype must be a float or integer type, got {dtype!r}")
    if _is_number(minval) and _is_number(maxval):
        return _draw("uniform", shape, dtype, seed, "random_uniform",
                     minval=float(minval), maxval=float(maxval))
    width = apply("subtract", _param(maxval, dtype), _param(minval, dtype))
    return _scaled("uniform", shape, dtype, seed, "random_uniform", width, minval)


def random_binomial(shape, p=0.0, dtype=None, seed=None):
    """A tensor of 0s and 1s where each entry is 1 with probability ``p``.

    # Arguments
        shape: tuple of ints (or a symbolic shape), the shape of the tensor.
        p: float, 0 <= p <= 1, the probability of a 1.
        dtype: dtype of the tensor (default: floatx()).
        seed: int, random seed.
    """
    dtype = canonical_dtype(config.floatx() if dtype is None else dtype, "random_binomial")
    if _is_number(p):
        return _draw("binomial", shape, dtype, seed, "random_binomial", p=float(p))
    u = _draw("uniform", shape, "float32", seed, "random_binomial", minval=0.0, maxval=1.0)
    return apply("cast", apply("less", u, _param(p, "float32")), dtype=dtype)


def random_normal_variable(shape, mean, scale, dtype=None, name=None, seed=None):
    """A variable initialised with samples from a normal distribution.

    # Arguments
        shape: tuple of ints, the shape of the variable.
        mean: float, mean of the normal distribution.
        scale: float, standard deviation of the normal distribution.
        dtype: dtype of the variable (default: floatx()).
        name: name of the variable.
        seed: int, random seed.
    """
    shape = _int_shape(shape, "random_normal_variable")
    value = _generator(seed, VARIABLE_SEEDS).normal(float(mean), float(scale), shape)
    return variable(value, dtype=_float_dtype(dtype, "random_normal_variable"), name=name)


def random_uniform_variable(shape, low, high, dtype=None, name=None, seed=None):
    """A variable initialised with samples from a uniform distribution on [low, high).

    # Arguments
        shape: tuple of ints, the shape of the variable.
        low: float, lower bound of the range.
        high: float, upper bound of the range.
        dtype: dtype of the variable (default: floatx()).
        name: name of the variable.
        seed: int, random seed.
    """
    shape = _int_shape(shape, "random_uniform_variable")
    value = _generator(seed, VARIABLE_SEEDS).uniform(float(low), float(high), shape)
    return variable(value, dtype=_float_dtype(dtype, "random_uniform_variable"), name=name)


def _int_shape(shape, where):
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (shape,)
    if is_tensor(shape) or any(is_tensor(d) or d is None for d in shape):
        raise ValueError(f"{where}: the shape of a variable must be a tuple of ints, got {shape!r}")
    return tuple(int(d) for d in shape)


__all__ = ["random_binomial", "random_normal", "random_normal_variable", "random_uniform",
           "random_uniform_variable", "truncated_normal"]
