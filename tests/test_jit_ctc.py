"""Tests of jit_kernels.ctc against brute-force definitions.

Tiny cases (up to 5 frames, 4 classes) enumerate every path of classes over
the frames: the probability of a labelling is the sum over the paths that
collapse to it (merge repeats, drop blanks), which defines the CTC loss and
what an unpruned beam search must return.  Gradients are checked against
central finite differences.  Kernels are compiled for float64 (and float32 in
a few tests) only, to keep Numba's compile time down.
"""
import itertools

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jit_kernels import ctc_loss
from jit_kernels.ctc import (
    ctc_beam_search_decode,
    ctc_dictionary_decode,
    ctc_greedy_decode,
    ctc_label_dense_to_sparse,
    ctc_loss_and_grad,
)
from jit_kernels.ctc_decode import greedy_decode_packed

EPSILON = 1e-7  # Keras's default fuzz factor: Keras hands TF log(y_pred + epsilon)


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


def collapse(path, blank):
    """The labelling a path of classes stands for: merge repeats, then drop blanks."""
    merged = [c for i, c in enumerate(path) if i == 0 or c != path[i - 1]]
    return tuple(c for c in merged if c != blank)


def labelling_log_probs(logits, n_frames):
    """{labelling: log-probability} over the first n_frames frames of (time, classes) logits,
    by enumerating all classes ** n_frames paths."""
    n_classes = logits.shape[1]
    log_probs = log_softmax(logits[:n_frames])
    paths = np.array(list(itertools.product(range(n_classes), repeat=n_frames)),
                     dtype=np.int64).reshape(n_classes ** n_frames, n_frames)
    path_log_probs = log_probs[np.arange(n_frames), paths].sum(axis=1)
    totals = {}
    for path, value in zip(paths.tolist(), path_log_probs.tolist()):
        key = collapse(path, n_classes - 1)
        totals[key] = np.logaddexp(totals.get(key, -np.inf), value)
    return totals


def ranked(totals):
    """Labellings sorted by decreasing probability."""
    return sorted(totals.items(), key=lambda item: -item[1])


def dense_labels(label_list):
    width = max(1, max(len(label) for label in label_list))
    dense = np.full((len(label_list), width), -1, dtype=np.int64)
    for b, label in enumerate(label_list):
        dense[b, :len(label)] = label
    return dense, np.array([len(label) for label in label_list])


# Tiny batch: 5 frames, 4 classes (labels 0..2, blank 3), labels with repeats,
# lengths from empty to the longest the input allows.  The loss tests use the
# samples with a label (TensorFlow's CTC loss rejects an empty one).
TINY_CASES = [  # (label, input length)
    ((), 5),
    ((), 0),
    ((1,), 1),
    ((0, 0), 3),
    ((0, 1, 0), 5),
    ((2, 2, 2), 5),
    ((1, 2), 4),
    ((0, 1, 2, 1, 0), 5),
]
N_FRAMES, N_CLASSES = 5, 4


@pytest.fixture(scope="module")
def tiny_batch():
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=2.0, size=(len(TINY_CASES), N_FRAMES, N_CLASSES))
    labels, label_lengths = dense_labels([label for label, _ in TINY_CASES])
    input_lengths = np.array([n for _, n in TINY_CASES])
    return logits, labels, label_lengths, input_lengths


LOSS_CASES = [case for case in TINY_CASES if case[0]]


@pytest.fixture(scope="module")
def loss_batch(tiny_batch):
    """The tiny batch's samples that have a label."""
    rows = [b for b, (label, _) in enumerate(TINY_CASES) if label]
    return tuple(array[rows] for array in tiny_batch)


# ---------------------------------------------------------------------------
# Loss and gradient


def test_loss_matches_sum_over_all_alignments(loss_batch):
    logits, labels, label_lengths, input_lengths = loss_batch
    loss, grad = ctc_loss_and_grad(logits, labels, label_lengths, input_lengths)
    assert loss.dtype == np.float64 and grad.shape == logits.shape
    for b, (label, n_frames) in enumerate(LOSS_CASES):
        expected = -labelling_log_probs(logits[b], n_frames).get(label, -np.inf)
        np.testing.assert_allclose(loss[b], expected, rtol=1e-12, atol=1e-12)


def test_gradient_matches_finite_differences(loss_batch):
    logits, labels, label_lengths, input_lengths = loss_batch
    _, grad = ctc_loss_and_grad(logits, labels, label_lengths, input_lengths)
    # Every logit of every sample moved by +-step, all in one batch.
    step = 1e-6
    batch = logits.shape[0]
    coords = list(np.ndindex(logits.shape))
    moved = np.repeat(logits[None], 2 * len(coords), axis=0)
    for k, (b, t, c) in enumerate(coords):
        moved[2 * k, b, t, c] += step
        moved[2 * k + 1, b, t, c] -= step
    moved = moved.reshape(-1, N_FRAMES, N_CLASSES)
    copies = 2 * len(coords)
    loss, _ = ctc_loss_and_grad(moved, np.tile(labels, (copies, 1)),
                                np.tile(label_lengths, copies), np.tile(input_lengths, copies),
                                compute_grad=False)
    loss = loss.reshape(copies, batch)
    numeric = np.zeros_like(grad)
    for k, (b, t, c) in enumerate(coords):
        plus, minus = loss[2 * k, b], loss[2 * k + 1, b]
        if np.isfinite(plus):
            numeric[b, t, c] = (plus - minus) / (2 * step)
    np.testing.assert_allclose(grad, numeric, atol=1e-7)
    # Frames past the input length get no gradient; each used frame's sums to 0.
    for b, (_, n_frames) in enumerate(LOSS_CASES):
        assert not grad[b, n_frames:].any()
    np.testing.assert_allclose(grad.sum(axis=2), 0.0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(n_classes=st.integers(1, 4), n_frames=st.integers(0, 4), seed=st.integers(0, 2**32 - 1),
       label=st.lists(st.integers(0, 2), max_size=4))
def test_loss_matches_alignments_for_random_cases(n_classes, n_frames, seed, label):
    label = [c % max(n_classes - 1, 1) for c in label] if n_classes > 1 else []
    logits = np.random.default_rng(seed).normal(scale=3.0, size=(1, 4, n_classes))
    if not label or len(label) > n_frames:  # as TensorFlow: no label, or more than frames
        with pytest.raises(ValueError, match="sample 0"):
            ctc_loss_and_grad(logits, [label + [0]], [len(label)], [n_frames])
        return
    loss, _ = ctc_loss_and_grad(logits, [label + [0]], [len(label)], [n_frames])
    expected = -labelling_log_probs(logits[0], n_frames).get(tuple(label), -np.inf)
    np.testing.assert_allclose(loss[0], expected, rtol=1e-12, atol=1e-12)


def test_unalignable_label_gives_inf_and_the_softmax_as_gradient():
    """TensorFlow's calculator, "No valid path found": loss +inf, gradient
    softmax(logits) on the used frames."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 4, 3))
    labels = np.array([[1, 1, 0], [0, 0, 0], [0, 1, 0]])
    # 2 items in 2 frames, but needs 3 (a blank between the 1s); 3 items in 4
    # frames, needs 5; fits in 3.
    label_lengths = [2, 3, 3]
    input_lengths = [2, 4, 3]
    loss, grad = ctc_loss_and_grad(logits, labels, label_lengths, input_lengths)
    assert np.isposinf(loss[:2]).all() and np.isfinite(loss[2])
    softmax = np.exp(log_softmax(logits))
    np.testing.assert_allclose(grad[0, :2], softmax[0, :2], rtol=1e-12)
    assert not grad[0, 2:].any()
    np.testing.assert_allclose(grad[1], softmax[1], rtol=1e-12)
    # Logits of -inf for every label class: no alignment has any probability.
    dead = rng.normal(size=(1, 3, 3))
    dead[:, :, 0] = -np.inf
    loss, grad = ctc_loss_and_grad(dead, [[0]], [1], [3])
    assert np.isposinf(loss[0])
    np.testing.assert_allclose(grad[0], np.exp(log_softmax(dead[0])), rtol=1e-12)


def test_null_labels_end_the_label():
    """TensorFlow reads a class of classes - 1 (the blank) or more as a null
    label that ends the sequence: [1, blank] scores as [1], though it needs as
    many frames as it has items."""
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(3, 4, 3))
    labels = [[1, 2, 2], [0, 1, 5], [1, 0, 0]]
    loss, grad = ctc_loss_and_grad(logits, labels, [2, 3, 2], [4, 3, 4])
    scored = [(1,), (0, 1), (1, 0)]
    for b, frames in enumerate([4, 3, 4]):
        expected = -labelling_log_probs(logits[b], frames)[scored[b]]
        np.testing.assert_allclose(loss[b], expected, rtol=1e-12)
    # The gradient is the scored label's.
    dense, lengths = dense_labels(scored)
    _, expected_grad = ctc_loss_and_grad(logits, dense, lengths, [4, 3, 4])
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-12)


def tf1_all_null_label(logits, n_frames):
    """TensorFlow 1's loss and gradient for a label of null items only, from
    the empty labelling's probability by enumeration: its one-state lattice
    takes 1 + y_blank for y_blank at the last frame (frames >= 2), and its
    gradient's blank occupancy there is y_blank / (1 + y_blank), 1 elsewhere."""
    log_probs = log_softmax(logits[:n_frames])
    y_blank_last = np.exp(log_probs[-1, -1])
    log_p = labelling_log_probs(logits, n_frames)[()]
    occupancy = np.ones(n_frames)
    if n_frames >= 2:
        log_p += np.log(1 + y_blank_last) - np.log(y_blank_last)
        occupancy[-1] = y_blank_last / (1 + y_blank_last)
    grad = np.zeros_like(logits)
    grad[:n_frames] = np.exp(log_probs)
    grad[:n_frames, -1] -= occupancy
    return -log_p, grad


def test_all_null_label_as_tensorflow_1():
    # tensorflow/tensorflow#13457: 3 classes, zero logits, 2 frames, label
    # [blank]: TF 1 gives 0.81093 = -log(1/3 * 4/3).
    loss, _ = ctc_loss_and_grad(np.zeros((1, 2, 3)), [[2]], [1], [2])
    np.testing.assert_allclose(loss, [-np.log(4 / 9)], rtol=1e-12)
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(4, 4, 3))
    labels = [[2, 0, 0], [2, 2, 0], [3, 2, 9], [2, 1, 1]]
    label_lengths = [1, 2, 3, 1]
    input_lengths = [1, 2, 4, 3]
    loss, grad = ctc_loss_and_grad(logits, labels, label_lengths, input_lengths)
    for b, frames in enumerate(input_lengths):
        expected_loss, expected_grad = tf1_all_null_label(logits[b], frames)
        np.testing.assert_allclose(loss[b], expected_loss, rtol=1e-12)
        np.testing.assert_allclose(grad[b], expected_grad, atol=1e-12)
    loss32, _ = ctc_loss_and_grad(logits.astype(np.float32), labels, label_lengths,
                                  input_lengths, compute_grad=False)
    assert loss32.dtype == np.float32
    np.testing.assert_allclose(loss32, loss, rtol=1e-6)


def test_loss_with_minus_inf_logits_stays_finite_when_possible():
    logits = np.random.default_rng(3).normal(size=(1, 4, 3))
    logits[0, 0, 1] = -np.inf  # class 1 impossible at frame 0, fine later
    loss, grad = ctc_loss_and_grad(logits, [[1, 0]], [2], [4])
    expected = -labelling_log_probs(logits[0], 4)[(1, 0)]
    np.testing.assert_allclose(loss[0], expected, rtol=1e-12)
    assert np.isfinite(grad).all() and grad[0, 0, 1] == 0.0


def test_nan_logits_give_nan_loss():
    logits = np.zeros((1, 3, 3))
    logits[0, 1, 2] = np.nan
    loss, _ = ctc_loss_and_grad(logits, [[0]], [1], [3])
    assert np.isnan(loss[0])


def reference_log_likelihood(logits, label, n_frames):
    """-loss by the textbook log-space forward recursion on the extended label."""
    log_probs = log_softmax(logits[:n_frames])
    blank = logits.shape[1] - 1
    extended = [blank]
    for c in label:
        extended += [c, blank]
    alpha = np.full(len(extended), -np.inf)
    alpha[0] = log_probs[0, blank]
    if label:
        alpha[1] = log_probs[0, extended[1]]
    for t in range(1, n_frames):
        new = np.full_like(alpha, -np.inf)
        for s, c in enumerate(extended):
            total = alpha[s]
            if s >= 1:
                total = np.logaddexp(total, alpha[s - 1])
            if s >= 2 and c != blank and c != extended[s - 2]:
                total = np.logaddexp(total, alpha[s - 2])
            new[s] = total + log_probs[t, c]
        alpha = new
    return np.logaddexp(alpha[-1], alpha[-2]) if label else alpha[-1]


def test_longer_sequences_float32_and_float64():
    rng = np.random.default_rng(4)
    batch, n_frames, n_classes = 6, 40, 7
    logits = rng.normal(scale=3.0, size=(batch, n_frames, n_classes))
    label_lengths = np.array([12, 4, 19, 5, 8, 1])
    labels = rng.integers(0, n_classes - 1, size=(batch, 19))
    labels[3, :5] = [2, 2, 2, 2, 2]  # repeats need blanks: 9 frames
    input_lengths = np.array([40, 17, 40, 9, 23, 1])
    loss, grad = ctc_loss_and_grad(logits, labels, label_lengths, input_lengths)
    expected = [-reference_log_likelihood(logits[b], labels[b, :label_lengths[b]].tolist(),
                                          input_lengths[b]) for b in range(batch)]
    np.testing.assert_allclose(loss, expected, rtol=1e-10)
    np.testing.assert_allclose(grad.sum(axis=2), 0.0, atol=1e-10)

    loss32, grad32 = ctc_loss_and_grad(logits.astype(np.float32), labels, label_lengths,
                                       input_lengths)
    assert loss32.dtype == np.float32 and grad32.dtype == np.float32
    np.testing.assert_allclose(loss32, loss, rtol=1e-5)
    np.testing.assert_allclose(grad32, grad, atol=1e-5)


def test_keras_ctc_batch_cost_reference_values():
    """Keras 2.2.5's test_ctc: TF's ctc_loss on log(y_pred + epsilon)."""
    y_pred = np.asarray(
        [[[0.633766, 0.221185, 0.0917319, 0.0129757, 0.0142857, 0.0260553],
          [0.111121, 0.588392, 0.278779, 0.0055756, 0.00569609, 0.010436],
          [0.0357786, 0.633813, 0.321418, 0.00249248, 0.00272882, 0.0037688],
          [0.0663296, 0.643849, 0.280111, 0.00283995, 0.0035545, 0.00331533],
          [0.458235, 0.396634, 0.123377, 0.00648837, 0.00903441, 0.00623107]],
         [[0.30176, 0.28562, 0.0831517, 0.0862751, 0.0816851, 0.161508],
          [0.24082, 0.397533, 0.0557226, 0.0546814, 0.0557528, 0.19549],
          [0.230246, 0.450868, 0.0389607, 0.038309, 0.0391602, 0.202456],
          [0.280884, 0.429522, 0.0326593, 0.0339046, 0.0326856, 0.190345],
          [0.423286, 0.315517, 0.0338439, 0.0393744, 0.0339315, 0.154046]]],
        dtype=np.float32)
    labels = np.asarray([[0, 1, 2, 1, 0], [0, 1, 1, 0, -1]])
    loss, _ = ctc_loss_and_grad(np.log(y_pred + EPSILON), labels, [[5], [4]], [[5], [5]])
    np.testing.assert_allclose(loss, [3.34211, 5.42262], atol=1e-5)


def test_loss_rejects_what_tensorflow_rejects():
    logits = np.zeros((2, 4, 3))
    for labels, label_lengths, input_lengths, message in [
            ([[0, 0], [1, 0]], [1, 0], [4, 4], "sample 1 has an empty label"),
            ([[0, 0], [2, 1]], [1, 2], [4, 4], "sample 1 has a label below 2 after a null"),
            ([[0, 0], [-1, 0]], [1, 1], [4, 4], "sample 1 has a negative label"),
            ([[0, 1], [1, 0]], [2, 2], [1, 4], "sample 0 has more labels than input frames")]:
        with pytest.raises(ValueError, match=f"ctc_batch_cost: {message}"):
            ctc_loss_and_grad(logits, labels, label_lengths, input_lengths,
                              where="ctc_batch_cost")


def test_loss_rejects_bad_arguments():
    logits = np.zeros((2, 4, 3))
    with pytest.raises(ValueError, match="input_lengths"):
        ctc_loss_and_grad(logits, [[0], [0]], [1, 1], [5, 4])
    with pytest.raises(ValueError, match="label_lengths"):
        ctc_loss_and_grad(logits, [[0], [0]], [2, 1], [4, 4])
    # Padding past the label length is not checked.
    loss, _ = ctc_loss_and_grad(logits, [[0, -1], [1, 7]], [1, 1], [4, 4])
    assert np.isfinite(loss).all()


# ---------------------------------------------------------------------------
# Greedy decoding


def greedy_reading(logits, n_frames, merge_repeated=True):
    blank = logits.shape[1] - 1
    out, previous = [], None
    for t in range(n_frames):
        best = int(np.argmax(logits[t]))
        if best != blank and not (merge_repeated and best == previous):
            out.append(best)
        previous = best
    return out, -logits[np.arange(n_frames), logits[:n_frames].argmax(axis=1)].sum()


@pytest.mark.parametrize("merge_repeated", [True, False])
def test_greedy_decode_matches_reading(merge_repeated):
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(7, 12, 4))
    logits[:, :, 3] += 0.5  # more blanks
    input_lengths = np.array([12, 0, 5, 12, 1, 8, 3])
    decoded, neg_sum = ctc_greedy_decode(logits, input_lengths, merge_repeated=merge_repeated)
    readings = [greedy_reading(logits[b], n, merge_repeated) for b, n in enumerate(input_lengths)]
    longest = max(len(path) for path, _ in readings)
    assert decoded.shape == (7, longest) and decoded.dtype == np.int64
    for b, (path, total) in enumerate(readings):
        assert decoded[b].tolist() == path + [-1] * (longest - len(path))
        np.testing.assert_allclose(neg_sum[b, 0], total, rtol=1e-12)


def test_greedy_decode_keras_reference():
    """Keras 2.2.5's test_ctc_decode_greedy, from TF's ctc_decoder_ops_test."""
    first = np.asarray([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6], [0.0, 0.0, 0.4, 0.6],
                        [0.0, 0.9, 0.1, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    second = np.asarray([[0.1, 0.9, 0.0, 0.0], [0.0, 0.9, 0.1, 0.0], [0.0, 0.0, 0.1, 0.9],
                         [0.0, 0.9, 0.1, 0.1], [0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    y_pred = np.stack([first, second]).astype(np.float32)
    decoded, neg_sum = ctc_greedy_decode(np.log(y_pred + EPSILON), [4, 5])
    assert decoded.tolist() == [[0, 1, -1], [1, 1, 0]]
    assert neg_sum.dtype == np.float32 and neg_sum.shape == (2, 1)
    np.testing.assert_allclose(neg_sum[:, 0], [-np.log([1.0, 0.6, 0.6, 0.9]).sum(),
                                               -np.log([0.9] * 5).sum()], rtol=1e-5)


def test_greedy_decode_packed_gives_each_row_at_the_full_width():
    """The form an export runs: each row's labels padded with -1 to the time
    steps, its neg_sum_logits first; float lengths truncated as NumPy casts them."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(5, 6, 4)).astype(np.float32)
    logits[:, :, 3] += 0.3
    lengths = np.array([6.0, 0.0, 2.9, 5.0, -0.5], np.float32)
    packed = np.full((5, 1, 7), np.nan)
    greedy_decode_packed(logits, lengths, packed)
    for b, n in enumerate(lengths.astype(np.int64)):
        path, total = greedy_reading(logits[b].astype(np.float64), n)
        assert packed[b, 0, 1:].tolist() == path + [-1] * (6 - len(path))
        np.testing.assert_allclose(packed[b, 0, 0], total, rtol=1e-6)
    for bad in (np.array([7, 0, 0, 0, 0]), np.array([-1.0, 0, 0, 0, 0]), np.zeros(4)):
        with pytest.raises(ValueError, match="greedy_decode_packed"):
            greedy_decode_packed(logits, bad, packed)


def test_greedy_decode_all_empty():
    logits = np.zeros((3, 4, 3))
    logits[:, :, 2] = 1.0  # blank everywhere
    decoded, neg_sum = ctc_greedy_decode(logits, [4, 2, 0])
    assert decoded.shape == (3, 0)
    assert neg_sum[:, 0].tolist() == [-4.0, -2.0, 0.0]


# ---------------------------------------------------------------------------
# Beam search


def test_wide_beam_search_is_exact(tiny_batch):
    logits, _, _, input_lengths = tiny_batch
    with_frames = input_lengths > 0  # no frames: one prefix, fewer than top_paths
    logits, input_lengths = logits[with_frames], input_lengths[with_frames]
    top_paths = 4
    decoded, log_probs = ctc_beam_search_decode(logits, input_lengths, beam_width=1000,
                                                top_paths=top_paths)
    assert len(decoded) == top_paths and log_probs.shape == (len(logits), top_paths)
    for b, n_frames in enumerate(input_lengths):
        best = ranked(labelling_log_probs(logits[b], n_frames))
        for k in range(top_paths):
            label, expected = best[k]
            np.testing.assert_allclose(log_probs[b, k], expected, rtol=1e-10)
            row = decoded[k][b].tolist()
            assert row == list(label) + [-1] * (decoded[k].shape[1] - len(label))
    assert (log_probs[:, :-1] >= log_probs[:, 1:]).all()


def test_beam_search_with_fewer_prefixes_than_top_paths_raises():
    """As TensorFlow: "Less leaves in the beam search than requested"."""
    logits = np.random.default_rng(10).normal(size=(2, 2, 3))
    decoded, log_probs = ctc_beam_search_decode(logits, [2, 0], beam_width=5, top_paths=1)
    assert decoded[0][1].tolist() == [-1] and log_probs[1, 0] == 0.0
    with pytest.raises(ValueError, match=r"ctc_decode: sample 1 has 1 prefixes .* top_paths=2"):
        ctc_beam_search_decode(logits, [2, 0], beam_width=5, top_paths=2, where="ctc_decode")
    # One frame, two labels: the empty prefix and two one-label ones.
    ctc_beam_search_decode(logits, [1, 1], beam_width=5, top_paths=3)
    with pytest.raises(ValueError, match="sample 0 has 3 prefixes"):
        ctc_beam_search_decode(logits, [1, 1], beam_width=5, top_paths=4)


class TFBeamEntry:
    """A prefix of TensorFlow's beam search (BeamEntry): (total, blank, label)
    log-probabilities after the frame (new) and before it (old)."""

    def __init__(self, parent, label):
        self.parent, self.label, self.children = parent, label, {}
        self.new = [-np.inf] * 3
        self.old = [-np.inf] * 3

    def labels(self):
        return [] if self.parent is None else self.parent.labels() + [self.label]


def tf_is_candidate(log_prob, leaves, beam_width):
    """Nonzero, and the beam has room or its least probable entry is less probable."""
    return log_prob > -np.inf and (len(leaves) < beam_width or
                                   log_prob > min(e.new[0] for e in leaves))


def tf_beam_search(logits, beam_width):
    """TensorFlow's CTCBeamSearchDecoder::Step, line by line, on one sample's
    (frames, classes) logits: the beam a plain list, its least probable entry
    found by a scan.  Returns [(labels, log-probability)], best first."""
    blank = logits.shape[1] - 1
    root = TFBeamEntry(None, -1)
    root.new = [0.0, 0.0, -np.inf]
    leaves = [root]
    for frame in log_softmax(logits):
        branches = sorted(leaves, key=lambda entry: -entry.new[0])
        for entry in branches:
            entry.old = list(entry.new)
        leaves = []
        for entry in branches:
            if entry.parent is not None:
                parent = entry.parent
                if parent.new[0] > -np.inf:
                    previous = parent.old[1] if entry.label == parent.label else parent.old[0]
                    entry.new[2] = np.logaddexp(entry.new[2], previous)
                entry.new[2] += frame[entry.label]
            entry.new[1] = entry.old[0] + frame[blank]
            entry.new[0] = np.logaddexp(entry.new[1], entry.new[2])
            leaves.append(entry)

        for entry in branches:
            if not tf_is_candidate(entry.old[0], leaves, beam_width):
                continue
            for label in range(blank):
                child = entry.children.setdefault(label, TFBeamEntry(entry, label))
                if child.new[0] > -np.inf:  # in the beam
                    continue
                previous = entry.old[1] if label == entry.label else entry.old[0]
                child.new = [frame[label] + previous, -np.inf, frame[label] + previous]
                if tf_is_candidate(child.new[0], leaves, beam_width):
                    if len(leaves) == beam_width:
                        bottom = min(leaves, key=lambda e: e.new[0])
                        bottom.new = [-np.inf] * 3
                        leaves.remove(bottom)
                    leaves.append(child)
                else:
                    child.new = [-np.inf] * 3
                    child.old = [-np.inf] * 3
    return [(e.labels(), e.new[0]) for e in sorted(leaves, key=lambda e: -e.new[0])]


def test_beam_search_follows_tensorflow_step_by_step():
    for seed in range(300):
        rng = np.random.default_rng(seed)
        n_classes, n_frames = int(rng.integers(2, 5)), int(rng.integers(1, 7))
        beam_width = int(rng.integers(1, 6))
        logits = rng.normal(scale=2.0, size=(1, n_frames, n_classes))
        expected = tf_beam_search(logits[0], beam_width)
        top_paths = min(beam_width, len(expected))
        decoded, log_probs = ctc_beam_search_decode(logits, [n_frames], beam_width, top_paths)
        for k, (labels, log_prob) in enumerate(expected[:top_paths]):
            assert [c for c in decoded[k][0].tolist() if c >= 0] == labels, seed
            np.testing.assert_allclose(log_probs[0, k], log_prob, rtol=1e-12, atol=1e-12)


def test_beam_search_drops_an_entry_offered_again_after_leaving_the_beam():
    """A beam of 2 over 5 frames where TensorFlow's order matters: at the last
    frame [1, 0] (a child of [1]) pushes [1, 1] out of the beam; [1] then
    offers [1, 1] again as its extension by 1, too improbable to enter, which
    zeroes [1, 1]'s probabilities, so [1, 1] is not extended to the likely
    [1, 1, 0].  Keeping the 2 most probable prefixes would return [1, 1, 0]
    second."""
    probs = np.array([[0.176, 0.626, 0.198], [0.068, 0.801, 0.131], [0.0001, 0.663, 0.3369],
                      [0.08, 0.321, 0.6], [0.973, 0.001, 0.026]])
    expected = tf_beam_search(np.log(probs), 2)
    assert [labels for labels, _ in expected] == [[1, 0], [1]]
    decoded, log_probs = ctc_beam_search_decode(np.log(probs)[None], [5], 2, 2)
    assert decoded[0].tolist() == [[1, 0]] and decoded[1].tolist() == [[1]]
    np.testing.assert_allclose(log_probs[0], [log_prob for _, log_prob in expected],
                               rtol=1e-12)


def test_narrow_beam_keeps_fewer_alignments():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(3, 5, 4))
    decoded, narrow = ctc_beam_search_decode(logits, [5, 5, 5], beam_width=3, top_paths=3)
    for b in range(3):
        exact = labelling_log_probs(logits[b], 5)
        for k in range(3):
            label = tuple(c for c in decoded[k][b].tolist() if c >= 0)
            # A pruned beam sums over a subset of the alignments.
            assert narrow[b, k] <= exact[label] + 1e-12
    assert (narrow[:, :-1] >= narrow[:, 1:]).all()


def test_beam_search_keras_reference():
    """Keras 2.2.5's test_ctc_decode_beam_search (a beam of 2 that loses paths)."""
    probs = np.asarray(
        [[0.30999, 0.309938, 0.0679938, 0.0673362, 0.0708352, 0.173908],
         [0.215136, 0.439699, 0.0370931, 0.0393967, 0.0381581, 0.230517],
         [0.199959, 0.489485, 0.0233221, 0.0251417, 0.0233289, 0.238763],
         [0.279611, 0.452966, 0.0204795, 0.0209126, 0.0194803, 0.20655],
         [0.51286, 0.288951, 0.0243026, 0.0220788, 0.0219297, 0.129878]], dtype=np.float32)
    y_pred = np.exp(np.concatenate([probs + 2.0, np.zeros((2, 6), np.float32)]))[None]
    decoded, log_probs = ctc_beam_search_decode(np.log(y_pred + EPSILON), [5], beam_width=2,
                                                top_paths=2)
    assert decoded[0].tolist() == [[1, 0]] and decoded[1].tolist() == [[1]]
    assert log_probs.dtype == np.float32
    np.testing.assert_allclose(log_probs, [[-5.811451, -6.63339]], rtol=1e-5)


def test_beam_search_merge_repeated_keras_reference():
    """Keras 2.2.5's test_ctc_decode_beam_search_no_merge."""
    y_pred = np.array([[[0, 0, 1], [1, 0, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1],
                        [0, 1, 0]]], dtype=np.float32)
    logits = np.log(y_pred + EPSILON)
    merged, _ = ctc_beam_search_decode(logits, [7], beam_width=1, top_paths=1,
                                       merge_repeated=True)
    plain, _ = ctc_beam_search_decode(logits, [7], beam_width=1, top_paths=1)
    assert merged[0].tolist() == [[0, 1]]
    assert plain[0].tolist() == [[0, 0, 1, 1]]


def test_beam_search_rejects_bad_arguments():
    with pytest.raises(ValueError, match="top_paths"):
        ctc_beam_search_decode(np.zeros((1, 2, 3)), [2], beam_width=2, top_paths=3)
    with pytest.raises(ValueError, match="beam_width"):
        ctc_beam_search_decode(np.zeros((1, 2, 3)), [2], beam_width=0, top_paths=1)


# ---------------------------------------------------------------------------
# Dictionary-constrained decoding


DICTIONARY = [[0, 1], [2], [0, 0], [1, 2, 0], [], [0, 1], [2, 2, 2, 1]]


def dictionary_ranking(logits, n_frames):
    totals = labelling_log_probs(logits, n_frames)
    words = list(dict.fromkeys(tuple(w) for w in DICTIONARY))
    scored = [(w, totals.get(w, -np.inf)) for w in words]
    return [item for item in sorted(scored, key=lambda item: -item[1]) if item[1] > -np.inf]


@pytest.mark.parametrize("beam_width", [None, 1000])
def test_dictionary_decode_is_exact(tiny_batch, beam_width):
    logits, _, _, input_lengths = tiny_batch
    top_paths = 3
    decoded, log_probs = ctc_dictionary_decode(logits, input_lengths, None, DICTIONARY,
                                               beam_width=beam_width, top_paths=top_paths)
    for b, n_frames in enumerate(input_lengths):
        best = dictionary_ranking(logits[b], n_frames)
        for k in range(top_paths):
            word, expected = best[k] if k < len(best) else ((), -np.inf)
            np.testing.assert_allclose(log_probs[b, k], expected, rtol=1e-10)
            assert [c for c in decoded[k][b].tolist() if c >= 0] == list(word)


def test_dictionary_decode_with_lengths_and_narrow_beam():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(2, 5, 4))
    padded = np.array([[0, 1, 9], [2, 9, 9], [1, 2, 0]])  # 9: padding past the lengths
    decoded, log_probs = ctc_dictionary_decode(logits, [5, 4], [2, 1, 3], padded,
                                               beam_width=2, top_paths=2)
    words = {(0, 1), (2,), (1, 2, 0)}
    for b in range(2):
        exact = labelling_log_probs(logits[b], [5, 4][b])
        for k in range(2):
            word = tuple(c for c in decoded[k][b].tolist() if c >= 0)
            if log_probs[b, k] > -np.inf:
                assert word in words
                assert log_probs[b, k] <= exact[word] + 1e-12


def test_dictionary_decode_rejects_bad_words():
    with pytest.raises(ValueError, match="dictionary labels"):
        ctc_dictionary_decode(np.zeros((1, 3, 3)), [3], None, [[0, 2]])


# ---------------------------------------------------------------------------
# Dense labels to sparse


def test_label_dense_to_sparse():
    labels = np.array([[5, 6, 7], [8, 9, 10], [11, 12, 13]], dtype=np.int32)
    indices, values, shape = ctc_label_dense_to_sparse(labels, [[2], [0], [5]])
    assert indices.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1], [2, 2]]
    assert indices.dtype == np.int64
    assert values.tolist() == [5, 6, 11, 12, 13] and values.dtype == np.int32
    assert shape.tolist() == [3, 3] and shape.dtype == np.int64


# ---------------------------------------------------------------------------
# The vectorisable exp and log used by the loss


@numba.njit
def _apply_exp(x, out):
    for i in range(x.size):
        out[i] = ctc_loss._exp(x[i])


@numba.njit
def _apply_log(x, out):
    for i in range(x.size):
        out[i] = ctc_loss._log_1_to_3(x[i])


def ulps(value, expected):
    return np.abs(value - expected) / np.spacing(np.abs(expected))


def test_exp_accuracy_and_special_values():
    x = np.concatenate([-np.geomspace(1e-300, 708, 200_000), np.linspace(-708, 1, 200_000),
                        [0.0, -0.0, 1.0, -708.0]])
    out = np.empty_like(x)
    _apply_exp(x, out)
    assert ulps(out, np.exp(x)).max() <= 2
    special = np.array([-708.5, -1e308, -np.inf, np.nan])
    out = np.empty_like(special)
    _apply_exp(special, out)
    assert out[:3].tolist() == [0.0, 0.0, 0.0] and np.isnan(out[3])


def test_log_accuracy():
    x = np.concatenate([np.linspace(1.0, 3.0, 400_001), 1.0 + np.geomspace(1e-300, 1e-3, 1000),
                        [1.5, np.nextafter(1.5, 0)]])
    out = np.empty_like(x)
    _apply_log(x, out)
    expected = np.log(x)
    # Within 4 ulps of the result: 3 are seen near log(1.06), where the
    # result is small; the lattice adds it to a log-probability anyway.
    assert (np.abs(out - expected) <= 4 * np.spacing(np.maximum(expected, 1e-300))).all()
    out = np.empty(1)
    _apply_log(np.array([np.nan]), out)
    assert np.isnan(out[0])


def test_lattice_loops_vectorise():
    """The loss's loops over states and classes run as packed vector code: LLVM
    inlines _exp and _log_1_to_3 into them (Numba inlines _log_add3, which LLVM
    left as a call); a loop with a call left in it stays scalar."""
    rng = np.random.default_rng(0)
    n = 37
    same, beside, beyond, emit = (rng.uniform(-20.0, 0.0, n) for _ in range(4))
    can_skip = rng.random(n) < 0.5
    out = np.empty(n)
    ctc_loss._blank_step(same, beside, -0.5, out, n)
    np.testing.assert_allclose(out, np.logaddexp(same, beside) - 0.5, rtol=1e-14)
    ctc_loss._label_step(same, beside, beyond, can_skip, emit, out, n)
    expected = np.logaddexp(np.logaddexp(same, beside), np.where(can_skip, beyond, -np.inf)) + emit
    np.testing.assert_allclose(out, expected, rtol=1e-14)
    ctc_loss._shifted_exps(same, beside, 1.5, out, n)  # exp of values <= 0, as the loss passes
    np.testing.assert_allclose(out, np.exp(same + beside - 1.5), rtol=1e-14)
    scalar = [loop.__name__ for loop in (ctc_loss._blank_step, ctc_loss._label_step,
                                         ctc_loss._shifted_exps)
              if "vector.body" not in loop.inspect_llvm(loop.signatures[0])]
    assert not scalar, f"loops left scalar: {scalar}"
