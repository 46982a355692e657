"""Random draws from a NumPy generator (attrs ``rng``), of a static shape or of a
shape given as a run-time 1-D int tensor.  Stateful: never folded or merged."""
import numpy as np

from ..graph import format_shape
from .registry import library, not_differentiable


def _random_infer(inputs, attrs):
    return tuple(attrs["shape"]), attrs["dtype"]


def _random(kind):
    def draw(rng, shape, dtype, **params):
        if kind == "normal":
            out = rng.standard_normal(shape) * params["stddev"] + params["mean"]
        elif kind == "truncated_normal":
            out = rng.standard_normal(shape)
            bad = np.abs(out) > 2
            while bad.any():  # redraw beyond two standard deviations, as TensorFlow does
                out[bad] = rng.standard_normal(int(bad.sum()))
                bad = np.abs(out) > 2
            out = out * params["stddev"] + params["mean"]
        elif kind == "uniform":
            out = rng.uniform(params["minval"], params["maxval"], shape)
        elif kind == "binomial":
            out = (rng.uniform(0.0, 1.0, shape) < params["p"])
        else:
            raise AssertionError(kind)
        return np.asarray(out, dtype=dtype)
    return draw


for _kind in ("normal", "truncated_normal", "uniform", "binomial"):
    library("random_" + _kind, _random_infer, _random(_kind), stateful=True,
            grad=not_differentiable)


def _random_shaped_infer(inputs, attrs):
    (dims,) = inputs
    static = tuple(attrs["shape"])
    if dims.ndim != 1 or np.dtype(dims.dtype).kind not in "iu" or dims.shape[0] not in (None, len(static)):
        raise ValueError(f"random: a symbolic shape must be a 1-D integer tensor of length {len(static)}, "
                         f"got shape {format_shape(dims.shape)} and dtype {dims.dtype}")
    return static, attrs["dtype"]


# A random draw whose shape is a runtime 1-D int tensor (attrs: kind, the static shape with
# None where unknown, dtype, rng and the kind's parameters).
library("random_shaped", _random_shaped_infer,
        lambda dims, kind, shape, rng, dtype, **params: _random(kind)(
            rng, tuple(int(d) for d in dims), dtype, **params),
        grad=lambda g, n: [None], stateful=True)
