"""Every call of one function gives the same bits for the same input, whichever
tier runs it: the plan's first calls, products on packed weights, the whole
compiled call of a function called often, and a scan's loop over time.
(Results are checked against NumPy as well; bits may differ across thread
counts, as BLAS's own do.)"""
import itertools

import numpy as np

import numbackend as K
from numbackend import tuning

RNG = np.random.default_rng(7)


def _calls(f, inputs, count):
    return [[np.array(out, copy=True) for out in f(inputs)] for _ in range(count)]


def _assert_all_equal(outputs):
    first = outputs[0]
    for i, other in enumerate(outputs[1:], start=2):
        for a, b in zip(first, other):
            assert np.array_equal(a, b), f"call {i} differs from call 1 by {np.abs(a - b).max()}"


def test_an_mlp_at_batch_1_gives_the_same_bits_on_every_call():
    sizes = (784, 512, 512, 10)
    weights = [(RNG.standard_normal((m, n)).astype("f4") / np.sqrt(m),
                RNG.standard_normal(n).astype("f4")) for m, n in itertools.pairwise(sizes)]
    x = K.placeholder((None, 784))
    h = x
    for i, (w, b) in enumerate(weights):
        h = K.dot(h, K.variable(w)) + K.variable(b)
        h = K.relu(h) if i < 2 else K.softmax(h)
    f = K.function([x], [h])
    xv = RNG.random((1, 784), dtype=np.float32)
    outputs = _calls(f, [xv], tuning.ONE_CALL_AFTER + 3)
    assert f.whole_call, "the later calls should have run as one compiled call"
    _assert_all_equal(outputs)
    want = xv.astype(float)
    for i, (w, b) in enumerate(weights):
        want = want @ w + b
        want = np.maximum(want, 0) if i < 2 else np.exp(want - want.max()) / np.exp(want - want.max()).sum()
    np.testing.assert_allclose(outputs[0][0], want, rtol=1e-4, atol=1e-6)


def test_a_long_recurrent_scan_gives_the_same_bits_on_every_call():
    steps, batch, dim, units = 40, 2, 64, 128
    seq = K.placeholder((None, steps, dim))
    w = RNG.standard_normal((dim, units)).astype("f4") / np.sqrt(dim)
    r = RNG.standard_normal((units, units)).astype("f4") * (0.5 / np.sqrt(units))  # contracting

    def step(inp, states):
        h = K.tanh(K.dot(inp, K.constant(w)) + K.dot(states[0], K.constant(r)))
        return h, [h]
    outs = K.rnn(step, seq, [K.zeros((batch, units))])[1]
    f = K.function([seq], [outs, K.gradients(K.sum(outs * outs), [seq])[0]])
    sv = RNG.standard_normal((batch, steps, dim)).astype("f4")
    outputs = _calls(f, [sv], 3)
    _assert_all_equal(outputs)
    h, want = np.zeros((batch, units)), []
    for t in range(steps):
        h = np.tanh(sv[:, t] @ w.astype(float) + h @ r.astype(float))
        want.append(h)
    np.testing.assert_allclose(outputs[0][0], np.stack(want, 1), rtol=1e-4, atol=1e-5)


def test_a_small_cnn_at_batch_1_gives_the_same_bits_on_every_call():
    k1 = K.variable(RNG.standard_normal((3, 3, 1, 8)).astype("f4") * 0.3)
    k2 = K.variable(RNG.standard_normal((3, 3, 8, 16)).astype("f4") * 0.1)
    dense = K.variable(RNG.standard_normal((12 * 12 * 16, 10)).astype("f4") * 0.05)
    x = K.placeholder((None, 28, 28, 1))
    h = K.relu(K.conv2d(K.relu(K.conv2d(x, k1)), k2))
    h = K.pool2d(h, (2, 2), (2, 2))
    f = K.function([x], [K.softmax(K.dot(K.batch_flatten(h), dense))])
    outputs = _calls(f, [RNG.random((1, 28, 28, 1), dtype=np.float32)], tuning.ONE_CALL_AFTER + 3)
    _assert_all_equal(outputs)
