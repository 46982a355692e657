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


def test_log_of_softmax_is_a_log_softmax():
    """log(softmax(z)) in float32 with logits 200 apart: the softmax underflows to 0, and
    its log was -inf with nan gradients; it is computed as a log-softmax from z."""
    z = np.array([[100.0, -100.0, 50.0], [-100.0, 100.0, 0.0]], dtype="float32")
    zt = K.placeholder((None, 3), dtype="float32")
    log_p = K.log(K.softmax(zt))
    (grad,) = K.gradients(K.sum(log_p[:, 0]), [zt])
    got, got_grad = K.function([zt], [log_p, grad])([z])
    shifted = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    p = np.exp(expected)
    np.testing.assert_allclose(got_grad, np.eye(3)[[0, 0]] - p, atol=1e-6)


def test_binary_crossentropy_gradient_at_zero_logits():
    """At a logit of exactly 0 (a zero-initialised output layer) the gradient is
    sigmoid(0) - t = 0.5 - t; the stable form's |z| had gradient 0 there, giving 1 - t."""
    t = np.array([[0.0, 1.0, 0.25], [1.0, 0.0, 0.5]])
    zt, tt = K.placeholder((None, 3), dtype="float64"), K.placeholder((None, 3), dtype="float64")
    losses = [K.binary_crossentropy(tt, zt, from_logits=True),
              K.binary_crossentropy(tt, K.sigmoid(zt))]
    grads = [K.gradients(K.sum(loss), [zt])[0] for loss in losses]
    for got in K.function([zt, tt], grads)([np.zeros((2, 3)), t]):
        np.testing.assert_allclose(got, 0.5 - t, atol=1e-15)


def test_sum_gradient_has_no_cast_to_the_same_dtype():
    """The gradient of a sum cast g to x's dtype even when they agreed: an extra kernel
    (one pass, one launch) in every backward pass through a sum, e.g. a cross-entropy."""
    x = K.placeholder((None, 10))
    (grad,) = K.gradients(K.sum(K.square(x), axis=-1), [x])
    stack, seen, ops = [grad], set(), []
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen.add(node.id)
            ops.append(node.op)
            stack.extend(node.inputs)
    assert "cast" not in ops, ops
    got = K.function([x], [grad])([np.full((2, 10), 1.5, dtype="float32")])[0]
    np.testing.assert_array_equal(got, np.full((2, 10), 3.0, dtype="float32"))
