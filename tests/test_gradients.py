"""K.gradients against central finite differences, in float64."""
import numpy as np
import pytest

import numbackend as K

RNG = np.random.default_rng(20240603)


def uniform(shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape)


# ---------------------------------------------------------------------------
# Regressions


@pytest.mark.parametrize("known", [True, False], ids=["static_dims", "unknown_dims"])
def test_dot_gradient_with_a_left_operand_of_rank_3(known):
    """dot((batch, time, k), (k, n)), a Dense layer on a sequence: the gradient of the
    left operand was built with a transposed product of a 3-D tensor (ValueError)."""
    x, w, c = uniform((2, 3, 4)), uniform((4, 5)), uniform((2, 3, 5))
    xt = K.placeholder((None, 3, 4) if known else (None, None, None), dtype="float64")
    wt = K.placeholder((4, 5) if known else (None, None), dtype="float64")
    loss = K.sum(K.dot(xt, wt) * K.constant(c, dtype="float64"))
    gx, gw = K.function([xt, wt], K.gradients(loss, [xt, wt]))([x, w])
    np.testing.assert_allclose(gx, c @ w.T, rtol=1e-12)
    np.testing.assert_allclose(gw, np.einsum("btk,btn->kn", x, c), rtol=1e-12)


@pytest.mark.parametrize("x_shape", [(None, None), (None, None, 4), ()], ids=["2d", "3d", "1d"])
def test_dot_gradient_with_a_vector_right_operand_and_unknown_dims(x_shape):
    """dot(x, vector) with several unknown dims: the gradient reshaped to (-1, -1)."""
    x = uniform((2, 3, 4)[3 - max(len(x_shape), 1):])
    y, c = uniform(4), uniform(x.shape[:-1])
    xt = K.placeholder(x_shape or (None,), dtype="float64")
    yt = K.placeholder((None,), dtype="float64")
    loss = K.sum(K.dot(xt, yt) * K.constant(c, dtype="float64"))
    gx, gy = K.function([xt, yt], K.gradients(loss, [xt, yt]))([x, y])
    np.testing.assert_allclose(gx, c[..., None] * y, rtol=1e-12)
    np.testing.assert_allclose(gy, np.tensordot(c, x, axes=c.ndim), rtol=1e-12)
