"""numbackend.ctc (the CTC graph ops) against brute-force enumeration of alignments."""
import itertools

import numpy as np
import pytest

import numbackend as K
from numbackend import ctc

EPS = 1e-7  # config.epsilon() by default


def probs(y):
    """The per-frame distribution the CTC ops see: softmax(log(y + eps))."""
    p = y + EPS
    return p / p.sum(axis=-1, keepdims=True)


def collapse(path, blank):
    """Merge repeats, then drop blanks."""
    return tuple(c for i, c in enumerate(path) if c != blank and (i == 0 or c != path[i - 1]))


def labelings(y, length):
    """{label sequence: probability} over all alignments of the first ``length`` frames."""
    p = probs(y[:length])
    blank = y.shape[-1] - 1
    totals = {}
    for path in itertools.product(range(y.shape[-1]), repeat=length):
        seq = collapse(path, blank)
        totals[seq] = totals.get(seq, 0.0) + np.prod(p[np.arange(length), path])
    return totals


def run(outputs, feeds):
    placeholders = list(feeds)
    return K.function(placeholders, list(outputs))([feeds[p] for p in placeholders])


def tiny_case(dtype="float64"):
    rng = np.random.default_rng(1)
    y = rng.dirichlet(np.ones(3), size=(3, 5)).astype(dtype)   # 2 labels + blank
    labels = np.array([[0, 1], [1, 1], [0, 0]])
    label_length = np.array([[2], [2], [1]])
    input_length = np.array([[5], [4], [3]])
    return y, labels, label_length, input_length


def placeholders(dtype="float64"):
    return (K.placeholder((None, None, 3), dtype=dtype), K.placeholder((None, 2), dtype="int32"),
            K.placeholder((None, 1), dtype="int32"), K.placeholder((None, 1), dtype="int32"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ctc_batch_cost_against_enumeration(dtype):
    y, labels, label_length, input_length = tiny_case(dtype)
    py, pl, pll, pil = placeholders(dtype)
    loss = ctc.ctc_batch_cost(pl, py, pil, pll)
    assert K.int_shape(loss) == (None, 1)
    (out,) = run([loss], {py: y, pl: labels, pll: label_length, pil: input_length})
    assert out.shape == (3, 1) and out.dtype == dtype
    expected = [-np.log(labelings(y[b].astype(np.float64), input_length[b, 0])[
        tuple(labels[b, :label_length[b, 0]])]) for b in range(3)]
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(out[:, 0], expected, rtol=tol)


def test_ctc_batch_cost_gradient_against_finite_differences():
    y, labels, label_length, input_length = tiny_case()
    py, pl, pll, pil = placeholders()
    weights = np.array([[1.0], [0.5], [2.0]])
    loss = K.sum(ctc.ctc_batch_cost(pl, py, pil, pll) * weights)
    grad = K.gradients(loss, [py])[0]
    f = K.function([py, pl, pll, pil], [loss, grad])
    _, g = f([y, labels, label_length, input_length])
    numeric = np.zeros_like(y)
    h = 1e-6
    for idx in np.ndindex(y.shape):
        up, down = y.copy(), y.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (f([up, labels, label_length, input_length])[0]
                        - f([down, labels, label_length, input_length])[0]) / (2 * h)
    np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-7)
    assert np.all(g[1, 4] == 0) and np.all(g[2, 3:] == 0)  # frames past input_length
    # the loss and its gradient come from one pass of the lattice
    assert [s.label for s in f.plan.steps if s.label.startswith("ctc")] == ["ctc_loss_and_grad"]
    loss_only = K.function([py, pl, pll, pil], [loss])
    assert [s.label for s in loss_only.plan.steps if s.label.startswith("ctc")] == ["ctc_loss"]


def test_ctc_batch_cost_on_blank_labels_as_tensorflow_1():
    """Keras's image_ocr example trains on samples whose one-item label is the
    blank class (float labels, as Keras feeds them).  TensorFlow 1 scores a
    label of blanks only as P(empty labelling) * (1 + y_blank(T-1)) / y_blank(T-1)
    (tensorflow/tensorflow#13457), with a gradient (with respect to its logits
    log(y_pred + eps)) of softmax - onehot(blank), but y_blank / (1 + y_blank)
    for the last frame's blank occupancy."""
    rng = np.random.default_rng(5)
    y = rng.dirichlet(np.ones(3), size=(3, 5))
    labels = np.array([[2, 0], [0, 1], [2, 2]], dtype="float32")
    label_length = np.array([[1], [2], [2]], dtype="float32")
    input_length = np.array([[5], [4], [3]], dtype="float32")
    py, pl = K.placeholder((None, None, 3), dtype="float64"), K.placeholder((None, 2))
    pll, pil = K.placeholder((None, 1)), K.placeholder((None, 1))
    loss = ctc.ctc_batch_cost(pl, py, pil, pll)
    grad = K.gradients(K.sum(loss), [py])[0]
    out, g = K.function([py, pl, pll, pil], [loss, grad])([y, labels, label_length,
                                                           input_length])
    for b, frames in [(0, 5), (2, 3)]:
        p = probs(y[b, :frames])
        y_blank_last = p[-1, 2]
        expected = -np.log(labelings(y[b], frames)[()] * (1 + y_blank_last) / y_blank_last)
        np.testing.assert_allclose(out[b, 0], expected, rtol=1e-10)
        occupancy = np.ones(frames)
        occupancy[-1] = y_blank_last / (1 + y_blank_last)
        grad_logits = p.copy()
        grad_logits[:, 2] -= occupancy
        np.testing.assert_allclose(g[b, :frames], grad_logits / (y[b, :frames] + EPS),
                                   rtol=1e-8)
        assert not g[b, frames:].any()
    np.testing.assert_allclose(out[1, 0], -np.log(labelings(y[1], 4)[(0, 1)]), rtol=1e-10)


def test_ctc_batch_cost_raises_where_tensorflow_does():
    y, labels, label_length, input_length = tiny_case()
    py, pl, pll, pil = placeholders()
    f = K.function([py, pl, pll, pil], [ctc.ctc_batch_cost(pl, py, pil, pll)])
    with pytest.raises(ValueError, match="ctc_batch_cost: sample 1 has an empty label"):
        f([y, labels, np.array([[2], [0], [1]]), input_length])
    with pytest.raises(ValueError, match="ctc_batch_cost: sample 2 has more labels than input"):
        f([y, labels, label_length, np.array([[5], [4], [0]])])


def test_ctc_decode_greedy_hand_reading():
    blank = 3
    # frames' argmax: 0 0 blank 0 1 1 blank 2 | sample 2 uses 5 frames: 2 2 blank 2 1
    frames = [[0, 0, blank, 0, 1, 1, blank, 2], [2, 2, blank, 2, 1, 0, 0, 0]]
    y = np.full((2, 8, 4), 0.1)
    for b, row in enumerate(frames):
        y[b, np.arange(8), row] = 0.7
    input_length = np.array([8, 5])
    py = K.placeholder((None, None, 4), dtype="float64")
    pil = K.placeholder((None,), dtype="int32")
    decoded, log_prob = ctc.ctc_decode(py, pil)
    assert len(decoded) == 1 and K.int_shape(decoded[0]) == (None, None)
    out, lp = run([decoded[0], log_prob], {py: y, pil: input_length})
    np.testing.assert_array_equal(out, [[0, 0, 1, 2], [2, 2, 1, -1]])
    assert out.dtype == np.int64
    np.testing.assert_allclose(lp[:, 0], [-8 * np.log(0.7 + EPS), -5 * np.log(0.7 + EPS)])


@pytest.mark.parametrize("merge_repeated", [False, True])
def test_ctc_decode_beam_search_against_enumeration(merge_repeated):
    rng = np.random.default_rng(3)
    y = rng.dirichlet(np.full(3, 0.7), size=(2, 5))
    input_length = np.array([[5], [4]])
    py = K.placeholder((None, None, 3), dtype="float64")
    pil = K.placeholder((None, 1), dtype="int32")
    decoded, log_prob = ctc.ctc_decode(py, pil, greedy=False, beam_width=64, top_paths=3,
                                       merge_repeated=merge_repeated)
    outs = run(decoded + [log_prob], {py: y, pil: input_length})
    paths, lp = outs[:3], outs[3]
    assert lp.shape == (2, 3)
    for b in range(2):
        ranked = sorted(labelings(y[b], input_length[b, 0]).items(), key=lambda kv: -kv[1])[:3]
        for k, (seq, p) in enumerate(ranked):
            if merge_repeated:
                seq = collapse(seq, blank=-1)
            got = tuple(int(c) for c in paths[k][b] if c != -1)
            assert got == seq
            np.testing.assert_allclose(lp[b, k], np.log(p), rtol=1e-10)


def test_ctc_decode_beam_search_with_too_few_prefixes_raises():
    y = np.full((2, 3, 3), 1 / 3)
    py, pil = K.placeholder((None, None, 3), dtype="float64"), K.placeholder((None,))
    decoded, _ = ctc.ctc_decode(py, pil, greedy=False, beam_width=4, top_paths=2)
    f = K.function([py, pil], decoded)
    f([y, np.array([3, 1])])
    with pytest.raises(ValueError, match="ctc_decode: sample 1 has 1 prefixes"):
        f([y, np.array([3, 0])])


def test_ctc_decode_dictionary_exact_and_beam():
    rng = np.random.default_rng(4)
    y = rng.dirichlet(np.ones(4), size=(2, 5))
    words = [[0, 1], [2], [1, 1, 2], [0]]
    py = K.placeholder((None, None, 4), dtype="float64")
    il = np.array([5, 5])
    for beam_width in (None, 50):
        decoded, log_prob = ctc.ctc_decode(py, il, greedy=False, beam_width=beam_width,
                                           top_paths=2, dict_values=words)
        outs = run(decoded + [log_prob], {py: y})
        for b in range(2):
            table = labelings(y[b], 5)
            ranked = sorted(words, key=lambda w: -table.get(tuple(w), 0.0))[:2]
            for k, word in enumerate(ranked):
                assert [int(c) for c in outs[k][b] if c != -1] == word
                np.testing.assert_allclose(outs[2][b, k], np.log(table[tuple(word)]), rtol=1e-10)


def test_ctc_label_dense_to_sparse():
    labels = np.array([[3, 1, 0], [2, 0, 0], [1, 2, 3]], dtype=np.int32)
    indices, values, dense_shape = ctc.ctc_label_dense_to_sparse(
        K.constant(labels, dtype="int32"), K.constant([2, 1, 3], dtype="int32"))
    assert K.int_shape(indices) == (None, 2) and K.int_shape(values) == (None,)
    i, v, s = K.function([], [indices, values, dense_shape])([])
    np.testing.assert_array_equal(i, [[0, 0], [0, 1], [1, 0], [2, 0], [2, 1], [2, 2]])
    np.testing.assert_array_equal(v, [3, 1, 2, 1, 2, 3])
    np.testing.assert_array_equal(s, [3, 3])
    assert v.dtype == np.int32 and s.dtype == np.int64


def test_training_a_softmax_layer_with_ctc_batch_cost_lowers_the_loss():
    rng = np.random.default_rng(0)
    batch, time, features, classes = 4, 6, 5, 4
    x = rng.normal(size=(batch, time, features)).astype("float32")
    labels = np.array([[0, 1, 2], [2, 2, 0], [1, 0, 0], [0, 2, 1]], dtype="float32")
    label_length = np.array([[3], [3], [1], [2]], dtype="float32")
    input_length = np.full((batch, 1), time, dtype="float32")
    w = K.variable(rng.normal(scale=0.1, size=(features, classes)))
    px = K.placeholder((None, time, features))
    pl = K.placeholder((None, 3))
    pll, pil = K.placeholder((None, 1)), K.placeholder((None, 1))
    y_pred = K.softmax(K.dot(px, w))
    loss = K.mean(ctc.ctc_batch_cost(pl, y_pred, pil, pll))
    (gw,) = K.gradients(loss, [w])
    train = K.function([px, pl, pll, pil], [loss], updates=[(w, w - 0.5 * gw)])
    losses = [float(train([x, labels, label_length, input_length])[0]) for _ in range(15)]
    assert np.all(np.isfinite(losses))
    assert np.all(np.diff(losses) < 0), losses
    assert losses[-1] < 0.7 * losses[0], losses
