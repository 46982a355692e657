"""CTC (connectionist temporal classification) kernels on plain NumPy arrays.

These reproduce the TensorFlow CTC ops that Keras 2.2.5's ``ctc_batch_cost``
and ``ctc_decode`` call (``tf.nn.ctc_loss``, ``tf.nn.ctc_greedy_decoder``,
``tf.nn.ctc_beam_search_decoder``), plus the dictionary-constrained decoding
of the Keras 1 ``ctc_decode`` form.  Conventions shared by every function:

* ``logits`` is (batch, time, classes), batch-major: Keras's order (TF's ops
  are time-major; Keras transposes before calling them).  The values are
  unnormalised log-probabilities and every function here applies log-softmax
  over the class axis itself, as TF does.  Keras hands TF
  ``log(y_pred + epsilon)``; the graph op that wraps these kernels does that.
* The blank is the LAST class, ``classes - 1``.  Real labels are
  ``0 .. classes - 2``.
* ``input_lengths[b]`` (shape (batch,) or (batch, 1)) frames of sample b are
  used; later frames are ignored.  It must lie in ``0 .. time`` (TF raises
  for longer sequences too).
* float32 and float64 logits are accepted (other dtypes are converted to
  float64); outputs have the logits' dtype.  The loss lattice is computed in
  float64 whatever the input dtype, so float32 results are rounded float64
  results.

The loss and the greedy decoder are Numba kernels, parallel over the batch.
The beam searches are a serial Numba kernel per sample: TensorFlow's beam
search updates its entries one after another, and its result depends on
that order.
"""
import math

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic

from .compiling import njit_cached, njit_cached_twins
from .fork import parallel_ok

_NEG_INF = -np.inf


# ---------------------------------------------------------------------------
# Argument checks shared by the public functions


def _as_logits(logits, where="ctc"):
    """(batch, time, classes) float32/float64 C-contiguous array."""
    logits = np.asarray(logits)
    if logits.ndim != 3:
        raise ValueError(f"{where}: logits must be (batch, time, classes), got shape "
                         f"{logits.shape}")
    if logits.shape[2] < 1:
        raise ValueError(f"{where}: logits need at least one class (the blank)")
    if logits.dtype not in (np.float32, np.float64):
        logits = logits.astype(np.float64)
    return np.ascontiguousarray(logits)


def _as_lengths(lengths, batch, upper, what, where="ctc"):
    """(batch,) int64 array of lengths in 0 .. upper; accepts (batch, 1) as Keras passes."""
    lengths = np.asarray(lengths)
    if lengths.size != batch or (lengths.ndim > 1 and lengths.shape[0] != batch):
        raise ValueError(f"{where}: {what} must hold one length per sample ({batch}), "
                         f"got shape {lengths.shape}")
    lengths = np.ascontiguousarray(lengths.reshape(batch), dtype=np.int64)
    if batch and (lengths.min() < 0 or lengths.max() > upper):
        raise ValueError(f"{where}: {what} must lie in 0..{upper}, got {lengths.tolist()}")
    return lengths


def _pad_paths(paths, batch):
    """Dense (batch, longest) int64 array from a list of label sequences, padded with -1."""
    longest = max((len(p) for p in paths), default=0)
    dense = np.full((batch, longest), -1, dtype=np.int64)
    for b, path in enumerate(paths):
        dense[b, :len(path)] = path
    return dense


def _log_softmax(logits_2d):
    """Log-softmax over the last axis, in float64."""
    x = logits_2d.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


# ---------------------------------------------------------------------------
# Loss and gradient


# The lattice needs a few exp and log per state and frame.  Numba turns
# math.exp / math.log into scalar libm calls that LLVM cannot vectorise (the
# pip llvmlite has no SVML), which made them most of the loss's run time; these
# two polynomial versions, exact to about 1 ulp on the ranges used here, let
# the loops over states and classes run 4 doubles at a time.

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_LN2_HI = 0.6931471803691238     # ln 2 = _LN2_HI + _LN2_LO; _LN2_HI has 32 trailing zero
_LN2_LO = 1.9082149292705877e-10  # bits, so k * _LN2_HI is exact for |k| <= 1022
_ROUNDER = 6755399441055744.0    # 1.5 * 2**52: adding it rounds to an integer kept in the low bits
_ROUNDER_BITS = 0x4338000000000000
_FASTMATH = {"contract"}         # fused multiply-add only: no reassociation, inf and nan kept


@intrinsic
def _float_bits(typingctx, x):
    """The bits of a float64 as an int64 (a bit cast, not a conversion)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _bits_float(typingctx, x):
    """The float64 whose bits are the given int64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.DoubleType())
    return types.float64(types.int64), codegen


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _exp(x):
    """exp(x) for x <= 1 (callers pass x <= 0, up to rounding).

    0 below -708 (where exp becomes subnormal), -inf -> 0, nan -> nan.

    x = k ln2 + r with |r| <= ln2 / 2; exp(r) by its Taylor series to r**13
    (truncation below 2**-56); 2**k built in the exponent bits.  Branch-free
    so that loops calling it vectorise.
    """
    clamped = min(max(x, -708.0), 1.0)
    shifted = clamped * _LOG2E + _ROUNDER
    k = shifted - _ROUNDER
    r = (clamped - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    two_to_k = _bits_float((_float_bits(shifted) - _ROUNDER_BITS + 1023) << 52)
    out = p * two_to_k if x >= -708.0 else 0.0
    return x if math.isnan(x) else out


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _log_1_to_3(x):
    """log(x) for 1 <= x <= 3 (a sum of three exps, the largest 1); nan -> nan.

    x is halved when >= 1.5 so that m lies in [0.75, 1.5); then
    log(m) = 2 atanh(z), z = (m - 1) / (m + 1) in [-1/7, 1/5], by its series
    to z**21 (truncation below 2**-56).
    """
    big = x >= 1.5
    m = 0.5 * x if big else x
    z = (m - 1.0) / (m + 1.0)
    z2 = z * z
    p = 1.0 / 21.0
    p = p * z2 + 1.0 / 19.0
    p = p * z2 + 1.0 / 17.0
    p = p * z2 + 1.0 / 15.0
    p = p * z2 + 1.0 / 13.0
    p = p * z2 + 1.0 / 11.0
    p = p * z2 + 1.0 / 9.0
    p = p * z2 + 1.0 / 7.0
    p = p * z2 + 1.0 / 5.0
    p = p * z2 + 1.0 / 3.0
    p = p * z2 + 1.0
    return 2.0 * z * p + (_LN2 if big else 0.0)


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _log_add2(a, b):
    """log(exp(a) + exp(b)), branch-free; exact for -inf terms, no overflow."""
    top = max(a, b)
    out = top + _log_1_to_3(1.0 + _exp(min(a, b) - top))
    # Both -inf: the difference above is nan; the answer is -inf.
    return top if top == _NEG_INF else out


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _log_add3(a, b, c):
    """log(exp(a) + exp(b) + exp(c)), branch-free; exact for -inf terms, no overflow."""
    top_ab = max(a, b)
    top = max(top_ab, c)
    out = top + _log_1_to_3(1.0 + _exp(min(a, b) - top) + _exp(min(top_ab, c) - top))
    return top if top == _NEG_INF else out


# The lattice loops.  Blank and label states live in separate arrays so that
# each loop does the same work for every state, and each loop takes 1-D views
# that start at the first state of the band: indices from 0 let Numba drop its
# negative-index handling, and LLVM then vectorises the loop.


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _forward_blanks(prev_blank, prev_label_before, emit, out, n):
    """Blank state i is entered from itself or from the label before it."""
    for k in range(n):
        out[k] = _log_add2(prev_blank[k], prev_label_before[k]) + emit


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _forward_labels(prev_label, prev_blank_before, prev_label_before, can_skip, emit, out, n):
    """Label state i is entered from itself, the blank before it, or the label
    before that blank when the two labels differ."""
    for k in range(n):
        skip = prev_label_before[k] if can_skip[k] else _NEG_INF
        out[k] = _log_add3(prev_label[k], prev_blank_before[k], skip) + emit[k]


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _backward_blanks(next_blank, next_label_after, out, n):
    """Blank state i goes on to itself or to the label after it."""
    for k in range(n):
        out[k] = _log_add2(next_blank[k], next_label_after[k])


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _backward_labels(next_label, next_blank_after, next_label_after, can_skip_after, out, n):
    """Label state i goes on to itself, the blank after it, or the label after
    that blank when the two labels differ."""
    for k in range(n):
        skip = next_label_after[k] if can_skip_after[k] else _NEG_INF
        out[k] = _log_add3(next_label[k], next_blank_after[k], skip)


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _shifted_exps(values, shift, out):
    for k in range(values.shape[0]):
        out[k] = _exp(float(values[k]) - shift)


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _occupancies(alpha, beta, log_prob, out, n):
    for k in range(n):
        out[k] = _exp(alpha[k] + beta[k] - log_prob)


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _add_emission(beta, emit, emit_step, out, n):
    """out[k] = beta[k] + emit[k * emit_step] (emit_step 0: one emission for all)."""
    for k in range(n):
        out[k] = beta[k] + emit[k * emit_step]


@numba.njit(error_model="numpy", fastmath=_FASTMATH)
def _ctc_row(logits, label, n_frames, compute_grad, grad):
    """CTC loss of one label sequence on one sample's (time, classes) logits.

    Returns -log p(label); when compute_grad, fills grad (time, classes) with
    d loss / d logits (grad may be empty otherwise).  A label with no
    alignment of nonzero probability gives +inf and, as TensorFlow's
    calculator ("No valid path found"), the softmax of the used frames as its
    gradient.

    The extended label puts a blank before, between and after the L labels:
    states s = 0 .. 2L, blank i is s = 2i and label i is s = 2i + 1.  alpha is
    the log-probability of frames 0..t ending in a state (emission at t
    included); beta that of frames t+1 .. end given the state at t (emission
    at t excluded), so that exp(alpha + beta - log_prob) is the posterior
    occupancy of the state at t.  Only the band of states reachable from the
    start by frame t that can still reach the end in time is computed.
    """
    n_classes = logits.shape[1]
    blank = n_classes - 1
    n_labels = label.shape[0]
    n_states = 2 * n_labels + 1

    # Two equal labels in a row need a blank frame between them.
    required_frames = n_labels
    for i in range(1, n_labels):
        if label[i] == label[i - 1]:
            required_frames += 1
    if n_frames == 0:
        # An empty label on an empty input has probability 1; any other
        # label none.  Either way no frame gets a gradient.
        grad[:, :] = 0.0
        return np.inf if required_frames > 0 else 0.0
    # can_skip[i]: label i may directly follow label i - 1 (no blank
    # between) because they differ.  One spare False at the end.
    can_skip = np.zeros(n_labels + 1, dtype=np.bool_)
    for i in range(1, n_labels):
        can_skip[i] = label[i] != label[i - 1]

    # Log-softmax of the blank and of each label at each frame (one spare
    # -inf column).  When the gradient is wanted, grad[t] is set to
    # softmax(logits[t]) here and the occupancies are subtracted below.
    emit_blank = np.empty(n_frames)
    emit_label = np.full((n_frames, n_labels + 1), _NEG_INF)
    exps = np.empty(n_classes)
    for t in range(n_frames):
        top = _NEG_INF
        for c in range(n_classes):
            top = max(top, float(logits[t, c]))
        _shifted_exps(logits[t], top, exps)
        total = 0.0
        for c in range(n_classes):
            total += exps[c]
        log_norm = top + math.log(total)
        if compute_grad:
            scale = 1.0 / total
            for c in range(n_classes):
                grad[t, c] = exps[c] * scale
        emit_blank[t] = float(logits[t, blank]) - log_norm
        for i in range(n_labels):
            emit_label[t, i] = float(logits[t, label[i]]) - log_norm
    if compute_grad:
        grad[n_frames:, :] = 0.0
    if n_frames < required_frames:
        # No alignment exists: grad holds the softmax of the used frames.
        return np.inf

    # Forward.  alpha_label[t, i + 1] holds label i: column 0 is a -inf
    # "label before the first blank".
    alpha_blank = np.full((n_frames, n_labels + 1), _NEG_INF)
    alpha_label = np.full((n_frames, n_labels + 1), _NEG_INF)
    alpha_blank[0, 0] = emit_blank[0]
    if n_labels > 0:
        alpha_label[0, 1] = emit_label[0, 0]
    for t in range(1, n_frames):
        lo = max(0, n_states - 2 * (n_frames - t))
        hi = min(n_states - 1, 2 * t + 1)
        first, last_blank = (lo + 1) // 2, hi // 2
        prev_blank, prev_label = alpha_blank[t - 1], alpha_label[t - 1]
        _forward_blanks(prev_blank[first:], prev_label[first:], emit_blank[t],
                        alpha_blank[t, first:], last_blank + 1 - first)
        first, last_label = lo // 2, (hi - 1) // 2
        _forward_labels(prev_label[first + 1:], prev_blank[first:], prev_label[first:],
                        can_skip[first:], emit_label[t, first:], alpha_label[t, first + 1:],
                        last_label + 1 - first)
    last = n_frames - 1
    log_prob = np.logaddexp(alpha_blank[last, n_labels], alpha_label[last, n_labels])
    if log_prob == _NEG_INF:
        # Every alignment has probability zero (logits of -inf): as an
        # impossible label, grad holds the softmax of the used frames.
        return np.inf
    if not compute_grad:
        return -log_prob

    # Backward, subtracting each frame's occupancies from its softmax.
    # next_*[i] = beta_{t+1}(state i) + emission at t+1, -inf outside the
    # band, with one spare -inf at the end.
    next_blank = np.full(n_labels + 2, _NEG_INF)
    next_label = np.full(n_labels + 1, _NEG_INF)
    beta_blank = np.empty(n_labels + 1)
    beta_label = np.empty(n_labels + 1)
    occupancy_blank = np.empty(n_labels + 1)
    occupancy_label = np.empty(n_labels + 1)
    for t in range(last, -1, -1):
        lo = max(0, n_states - 2 * (n_frames - t))
        hi = min(n_states - 1, 2 * t + 1)
        first_blank, n_blank = (lo + 1) // 2, hi // 2 + 1 - (lo + 1) // 2
        first_label, n_label = lo // 2, (hi - 1) // 2 + 1 - lo // 2
        if t == last:
            # The band is the two end states: the last blank and label.
            beta_blank[n_labels] = 0.0
            beta_label[max(n_labels - 1, 0)] = 0.0
        else:
            _backward_blanks(next_blank[first_blank:], next_label[first_blank:],
                             beta_blank[first_blank:], n_blank)
            _backward_labels(next_label[first_label:], next_blank[first_label + 1:],
                             next_label[first_label + 1:], can_skip[first_label + 1:],
                             beta_label[first_label:], n_label)

        # Views from the band's first state, as for the lattice loops.
        _occupancies(alpha_blank[t, first_blank:], beta_blank[first_blank:], log_prob,
                     occupancy_blank, n_blank)
        _occupancies(alpha_label[t, first_label + 1:], beta_label[first_label:], log_prob,
                     occupancy_label, n_label)
        # Several labels may share a class: a plain loop.
        blank_total = 0.0
        for k in range(n_blank):
            blank_total += occupancy_blank[k]
        grad[t, blank] -= blank_total
        for k in range(n_label):
            grad[t, label[first_label + k]] -= occupancy_label[k]

        next_blank[:] = _NEG_INF
        next_label[:] = _NEG_INF
        _add_emission(beta_blank[first_blank:], emit_blank[t:t + 1], 0,
                      next_blank[first_blank:], n_blank)
        _add_emission(beta_label[first_label:], emit_label[t, first_label:], 1,
                      next_label[first_label:], n_label)
    return -log_prob


@njit_cached_twins(error_model="numpy")
def _ctc_loss_kernel(logits, row_sample, labels, label_lengths, input_lengths,
                     compute_grad, loss, grad):
    """loss[r] (and grad[r] when compute_grad) for each label row r.

    Row r scores labels[r, :label_lengths[r]] against sample row_sample[r] of
    logits, so that one sample can be scored against many label sequences
    (the dictionary decoder does this; the loss uses row_sample = arange).
    grad is (rows, time, classes), or (rows, 0, 0) when not computed.  The
    per-row work is a separate serial function: compiling it inside the
    parallel loop took Numba several times longer.
    """
    for row in numba.prange(labels.shape[0]):
        sample = row_sample[row]
        loss[row] = _ctc_row(logits[sample], labels[row, :label_lengths[row]],
                             input_lengths[sample], compute_grad, grad[row])


def _tf_labels(labels, label_lengths, input_lengths, n_classes, where):
    """The labels as TensorFlow's CTC loss reads them (its PopulateLPrimes).

    Returns (batch, max_len) int64 labels and the (batch,) number of leading
    real labels of each sample.  A class of ``n_classes - 1`` (the blank) or
    more is a null label that ends the sequence: it and the null labels after
    it are dropped, though they still count towards the frames needed.
    Raises where TensorFlow raises, naming the sample.
    """
    batch = len(input_lengths)
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[0] != batch:
        raise ValueError(f"{where}: labels must be (batch={batch}, max_label_length), "
                         f"got shape {labels.shape}")
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    label_lengths = _as_lengths(label_lengths, batch, labels.shape[1], "label_lengths", where)
    blank = n_classes - 1
    positions = np.arange(labels.shape[1])[None, :]
    used = positions < label_lengths[:, None]
    null = used & (labels >= blank)
    real_lengths = np.where(null.any(axis=1), null.argmax(axis=1), label_lengths)
    after_null = used & ~null & (positions > real_lengths[:, None])
    empty = "has an empty label (label_length 0); TensorFlow's CTC loss needs one or more"
    negative = "has a negative label"
    real_after_null = f"has a label below {blank} after a null label ({blank} or more)"
    too_long = ("has more labels than input frames (TensorFlow: \"Not enough time for "
                "target transition sequence\")")
    problems = [(label_lengths == 0, empty), ((used & (labels < 0)).any(axis=1), negative),
                (after_null.any(axis=1), real_after_null), (label_lengths > input_lengths, too_long)]
    for bad, what in problems:
        if bad.any():
            b = int(np.argmax(bad))
            raise ValueError(f"{where}: sample {b} {what}: labels "
                             f"{labels[b, :label_lengths[b]].tolist()}, input length "
                             f"{input_lengths[b]}, {n_classes} classes")
    return labels, real_lengths


def ctc_loss_and_grad(logits, labels, label_lengths, input_lengths, compute_grad=True,
                      where="ctc"):
    """CTC loss per sample and its gradient with respect to the logits.

    What ``tf.nn.ctc_loss`` computes with ``preprocess_collapse_repeated=False,
    ctc_merge_repeated=True`` (the settings of Keras's ``ctc_batch_cost``):
    the standard CTC loss, where repeated labels need a blank between them.

    Args:
        logits: (batch, time, classes) unnormalised log-probabilities; softmax
            is applied over classes (Keras passes ``log(y_pred + epsilon)``).
            The blank is class ``classes - 1``.
        labels: (batch, max_label_length) integer labels; entries at and
            after ``label_lengths[b]`` are ignored (padding).
        label_lengths: (batch,) or (batch, 1), each in 1..max_label_length.
        input_lengths: (batch,) or (batch, 1), each in label_lengths[b]..time.
        compute_grad: when False the gradient is skipped and returned as None.
        where: the name errors start with.

    Returns:
        loss: (batch,) ``-log p(label | logits)``, summed over all alignments.
        grad: (batch, time, classes) d loss / d logits, i.e.
            ``softmax(logits) - posterior occupancy of each class``; zero for
            frames at and after ``input_lengths[b]``.

    As TensorFlow's CTC loss:

    * A class of ``classes - 1`` (the blank) or more in a label is a null
      label: it ends the sequence, and only the labels before it are scored
      (a real label after a null one is an error).  Keras's image_ocr example
      trains on such one-item blank labels.
    * A label whose items are all null is scored as TensorFlow 1 scores it
      (a one-state lattice whose boundary writes fall outside it): for input
      length T >= 2, ``-(sum_{t<T-1} log y_blank(t) + log(1 + y_blank(T-1)))``,
      where the empty labelling's loss has ``log y_blank(T-1)`` for the last
      term, and a gradient ``y - onehot(blank)`` except for the last frame's
      blank entry, ``y_blank - y_blank / (1 + y_blank)``.  For T = 1 it is the
      empty labelling's: ``-log y_blank(0)``.
    * A label with no alignment (equal neighbours need a blank between them,
      so it needs more frames than it has items) or whose alignments all have
      probability zero has loss +inf, and the softmax of the used frames as
      its gradient.
    * Errors, naming the sample: an empty label (label length 0), a negative
      label, a real label after a null one, and more label items than input
      frames (TF: "Not enough time for target transition sequence").

    A label length beyond the labels' width is an error here; TF's
    dense-to-sparse conversion in Keras would silently clip it.
    """
    logits = _as_logits(logits, where)
    batch, n_time, n_classes = logits.shape
    input_lengths = _as_lengths(input_lengths, batch, n_time, "input_lengths", where)
    labels, real_lengths = _tf_labels(labels, label_lengths, input_lengths, n_classes, where)
    compute_grad = bool(compute_grad)
    loss = np.empty(batch, dtype=logits.dtype)
    grad_shape = logits.shape if compute_grad else (batch, 0, 0)  # (batch, 0, 0): unused
    grad = np.empty(grad_shape, dtype=logits.dtype)
    _ctc_loss_kernel_for_here()(logits, np.arange(batch, dtype=np.int64), labels, real_lengths,
                                input_lengths, compute_grad, loss, grad)
    _all_null_labels_as_tf1(logits, input_lengths, real_lengths == 0, loss, grad)
    return loss, (grad if compute_grad else None)


def _all_null_labels_as_tf1(logits, input_lengths, all_null, loss, grad):
    """Loss and gradient of the samples whose label items are all null, as
    TensorFlow 1 computes them (see :func:`ctc_loss_and_grad`).

    TF builds a one-state lattice (the blank) for such a label but still
    writes the usual two start and two end states.  With its column-major
    matrices the second end write lands on the state's beta one frame before
    the last, which beta's recursion then adds to: beta(T-2) is
    log(1 + y_blank(T-1)) instead of log y_blank(T-1).  The gradient's
    occupancy of the blank is exp(alpha + beta - log p): 1 at every frame but
    the last, where it is y_blank / (1 + y_blank).
    """
    blank = logits.shape[2] - 1
    for b in np.nonzero(all_null)[0].tolist():
        n_frames = int(input_lengths[b])
        log_probs = _log_softmax(logits[b, :n_frames])
        log_blank = log_probs[:, blank]
        occupancy = np.ones(n_frames)
        if n_frames >= 2:
            log_p = log_blank[:-1].sum() + np.log1p(np.exp(log_blank[-1]))
            occupancy[-1] = np.exp(log_blank[-1] - np.log1p(np.exp(log_blank[-1])))
        else:
            log_p = log_blank[0]
        loss[b] = -log_p
        if grad.size:
            grad[b] = 0.0
            grad[b, :n_frames] = np.exp(log_probs)
            if log_p > _NEG_INF:  # else, as TF, no valid path: the softmax alone
                grad[b, :n_frames, blank] -= occupancy


def _ctc_loss_kernel_for_here():
    """The parallel loss kernel, or its serial twin where Numba's threads cannot run."""
    return _ctc_loss_kernel if parallel_ok() else _ctc_loss_kernel.serial


# ---------------------------------------------------------------------------
# Greedy (best path) decoding


@njit_cached(error_model="numpy")
def _greedy_kernel(logits, input_lengths, merge_repeated, decoded, decoded_lengths, neg_sum):
    """Best path of each sample.  Serial: one pass of comparisons over the
    logits costs less than waking the threads of a parallel loop."""
    n_classes = logits.shape[2]
    blank = n_classes - 1
    for b in range(logits.shape[0]):
        count = 0
        previous = -1
        total = 0.0
        for t in range(input_lengths[b]):
            # First maximum wins ties, as in TF's RowMax.
            best = 0
            best_value = logits[b, t, 0]
            for c in range(1, n_classes):
                if logits[b, t, c] > best_value:
                    best = c
                    best_value = logits[b, t, c]
            total -= best_value
            if best != blank and not (merge_repeated and best == previous):
                decoded[b, count] = best
                count += 1
            previous = best
        decoded_lengths[b] = count
        neg_sum[b, 0] = total


def ctc_greedy_decode(logits, input_lengths, merge_repeated=True):
    """Best-path decoding, as ``tf.nn.ctc_greedy_decoder``.

    Takes the most likely class of each frame (the first one on ties), merges
    runs of the same class when ``merge_repeated`` (a blank between two equal
    classes keeps both), then drops blanks.

    Args:
        logits: (batch, time, classes); blank = classes - 1.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        merge_repeated: merge consecutive equal classes (TF's default, and
            what Keras's ``ctc_decode(greedy=True)`` uses).

    Returns:
        decoded: (batch, longest decoded length) int64, padded with -1 (the
            dense form Keras makes of TF's sparse result).
        neg_sum_logits: (batch, 1), minus the sum over the used frames of each
            frame's largest logit: TF's "log probability" of the greedy
            decoder.  It is taken on the logits as given, not log-softmaxed,
            so it is a negative log-probability only when the logits are
            normalised (Keras's ``log(y_pred + epsilon)`` nearly is).
            Summed in float64.
    """
    logits = _as_logits(logits)
    batch, n_time, _ = logits.shape
    input_lengths = _as_lengths(input_lengths, batch, n_time, "input_lengths")
    decoded = np.empty((batch, n_time), dtype=np.int64)
    decoded_lengths = np.empty(batch, dtype=np.int64)
    neg_sum = np.empty((batch, 1), dtype=np.float64)
    _greedy_kernel(logits, input_lengths, bool(merge_repeated), decoded, decoded_lengths,
                   neg_sum)
    longest = int(decoded_lengths.max()) if batch else 0
    used = np.arange(longest)[None, :] < decoded_lengths[:, None]
    dense = np.where(used, decoded[:, :longest], -1)
    return dense, neg_sum.astype(logits.dtype)


# ---------------------------------------------------------------------------
# Prefix beam search


# Columns of the prefix tree: each node is a label prefix, node 0 the empty
# one; a node's children are linked in increasing label order.
_PARENT, _LABEL_OF, _FIRST_CHILD, _NEXT_SIBLING = 0, 1, 2, 3
# Columns of a node's log-probabilities: of the frames so far collapsing to its
# prefix (total), and of those ending in a blank or in its last label.
_TOTAL, _BLANK, _LABEL = 0, 1, 2


class _PrefixTree:
    """Label prefixes as a tree of nodes in an int64 array (one row per node:
    parent, last label, first child, next sibling; -1 for none); node 0 is
    the empty prefix.  The free beam search adds nodes as it needs them; a
    tree built from a dictionary is fixed, and ``is_word`` marks its entries.
    """

    def __init__(self, capacity=64):
        self.nodes = np.full((capacity, 4), -1, dtype=np.int64)
        self.n_nodes = 1
        self.is_word = None

    def sequence(self, node):
        """The labels of a node's prefix."""
        out = []
        while node > 0:
            out.append(int(self.nodes[node, _LABEL_OF]))
            node = int(self.nodes[node, _PARENT])
        return out[::-1]

    @classmethod
    def from_words(cls, words):
        index = {(): 0}
        for word in words:
            for end in range(1, len(word) + 1):
                index.setdefault(tuple(word[:end]), len(index))
        tree = cls(len(index))
        tree.n_nodes = len(index)
        tree.is_word = np.zeros(len(index), dtype=bool)
        tree.is_word[[index[tuple(word)] for word in words]] = True
        # Link children in decreasing label order, each in front of the last.
        for prefix in sorted(index, key=lambda p: (len(p), p), reverse=True)[:-1]:
            node, parent = index[prefix], index[prefix[:-1]]
            tree.nodes[node, _PARENT] = parent
            tree.nodes[node, _LABEL_OF] = prefix[-1]
            tree.nodes[node, _NEXT_SIBLING] = tree.nodes[parent, _FIRST_CHILD]
            tree.nodes[parent, _FIRST_CHILD] = node
        return tree


@numba.njit(inline="always")
def _log_add(a, b):
    """log(exp(a) + exp(b)), as TensorFlow's LogSumExp."""
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    return max(a, b) + math.log1p(math.exp(min(a, b) - max(a, b)))


@numba.njit(inline="always")
def _heap_push(heap, size, node, prob):
    """Adds node to the min-heap heap[:size] keyed by prob[node, _TOTAL]; the new size."""
    i = size
    while i > 0:
        up = (i - 1) // 2
        if prob[heap[up], _TOTAL] <= prob[node, _TOTAL]:
            break
        heap[i] = heap[up]
        i = up
    heap[i] = node
    return size + 1


@numba.njit(inline="always")
def _heap_pop(heap, size, prob):
    """Removes the least probable node of heap[:size]; (that node, the new size)."""
    bottom = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while 2 * i + 1 < size:
        child = 2 * i + 1
        if child + 1 < size and prob[heap[child + 1], _TOTAL] < prob[heap[child], _TOTAL]:
            child += 1
        if prob[heap[child], _TOTAL] >= prob[last, _TOTAL]:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = last
    return bottom, size


@numba.njit(inline="always")
def _is_candidate(log_prob, leaves, size, beam_width, prob):
    """TF's is_candidate: nonzero, and the beam has room or its least probable is less."""
    return log_prob > _NEG_INF and (size < beam_width or log_prob > prob[leaves[0], _TOTAL])


@njit_cached(error_model="numpy")
def _beam_search_kernel(log_probs, beam_width, nodes, n_nodes, grow):
    """TensorFlow's CTCBeamSearchDecoder::Step over every frame, default scorer.

    log_probs is one sample's (frames, classes) log-softmax; nodes the prefix
    tree (see :class:`_PrefixTree`), extended when grow, else fixed (a
    dictionary: extensions outside it are skipped).  Returns (the beam's
    nodes best first, their log-probabilities, the tree, its node count).

    Per frame, as TF: the beam's entries, best first, become the branches and
    each is updated in place (a blank, or a repeat of its last label; plus
    the extension of its parent by its last label when the parent was in the
    beam), then put back in the beam.  Then each branch, best first, whose
    previous probability beats the beam's least probable entry (or the beam
    has room) is extended by each label in turn: an extension whose prefix is
    not in the beam now enters with the extension's probability alone when
    it beats the least probable entry, which leaves the beam and is zeroed;
    otherwise both its probabilities are zeroed, so a branch that had left
    the beam earlier in this frame is then extended no more.  Extending by
    the last label needs a blank in between, so it starts from the branch's
    blank probability.
    """
    n_labels = log_probs.shape[1] - 1
    blank = n_labels
    capacity = nodes.shape[0]
    new = np.full((capacity, 3), _NEG_INF)
    old = np.full((capacity, 3), _NEG_INF)
    new[0, _TOTAL] = 0.0
    new[0, _BLANK] = 0.0
    leaves = np.empty(beam_width, dtype=np.int64)  # min-heap on new[:, _TOTAL]
    leaves[0] = 0
    size = 1
    for t in range(log_probs.shape[0]):
        lp = log_probs[t]
        branches = leaves[:size][np.argsort(-new[leaves[:size], _TOTAL], kind="mergesort")]
        for b in branches:
            old[b] = new[b]
        size = 0
        for b in branches:
            if b != 0:
                parent = nodes[b, _PARENT]
                label = nodes[b, _LABEL_OF]
                if new[parent, _TOTAL] > _NEG_INF:  # the parent is in the beam
                    if label == nodes[parent, _LABEL_OF]:
                        previous = old[parent, _BLANK]
                    else:
                        previous = old[parent, _TOTAL]
                    new[b, _LABEL] = _log_add(new[b, _LABEL], previous)
                new[b, _LABEL] += lp[label]
            new[b, _BLANK] = old[b, _TOTAL] + lp[blank]
            new[b, _TOTAL] = _log_add(new[b, _BLANK], new[b, _LABEL])
            size = _heap_push(leaves, size, b, new)

        for b in branches:
            if not _is_candidate(old[b, _TOTAL], leaves, size, beam_width, new):
                continue
            child = nodes[b, _FIRST_CHILD]
            before = -1  # the child before `child`, to link a new node after
            for label in range(n_labels):
                while child >= 0 and nodes[child, _LABEL_OF] < label:
                    before = child
                    child = nodes[child, _NEXT_SIBLING]
                c = child if child >= 0 and nodes[child, _LABEL_OF] == label else -1
                if c < 0 and not grow:
                    continue
                if c >= 0 and new[c, _TOTAL] > _NEG_INF:  # in the beam
                    continue
                if label == nodes[b, _LABEL_OF]:
                    extension = lp[label] + old[b, _BLANK]
                else:
                    extension = lp[label] + old[b, _TOTAL]
                if _is_candidate(extension, leaves, size, beam_width, new):
                    if c < 0:
                        if n_nodes == capacity:
                            capacity *= 2
                            grown = np.full((capacity, 4), -1, dtype=np.int64)
                            grown[:n_nodes] = nodes
                            nodes = grown
                            grown_new = np.full((capacity, 3), _NEG_INF)
                            grown_new[:n_nodes] = new
                            new = grown_new
                            grown_old = np.full((capacity, 3), _NEG_INF)
                            grown_old[:n_nodes] = old
                            old = grown_old
                        c = n_nodes
                        n_nodes += 1
                        nodes[c, _PARENT] = b
                        nodes[c, _LABEL_OF] = label
                        nodes[c, _NEXT_SIBLING] = child
                        if before < 0:
                            nodes[b, _FIRST_CHILD] = c
                        else:
                            nodes[before, _NEXT_SIBLING] = c
                        before = c
                    if size == beam_width:
                        bottom, size = _heap_pop(leaves, size, new)
                        new[bottom] = _NEG_INF
                    new[c, _BLANK] = _NEG_INF
                    new[c, _LABEL] = extension
                    new[c, _TOTAL] = extension
                    size = _heap_push(leaves, size, c, new)
                elif c >= 0:
                    new[c] = _NEG_INF
                    old[c] = _NEG_INF
    beam = leaves[:size][np.argsort(-new[leaves[:size], _TOTAL], kind="mergesort")]
    return beam, new[beam, _TOTAL], nodes, n_nodes


def _beam_search(log_probs, beam_width, tree, grow):
    """Runs :func:`_beam_search_kernel` on ``tree`` (a :class:`_PrefixTree`, kept
    up to date); returns (the beam's nodes, their log-probabilities), best first."""
    beam, totals, tree.nodes, tree.n_nodes = _beam_search_kernel(
        np.ascontiguousarray(log_probs, dtype=np.float64), beam_width, tree.nodes,
        tree.n_nodes, grow)
    return beam, totals


def _merge_runs(sequence):
    """TF's merge_repeated on a decoded sequence: a run of one label becomes one label."""
    return [label for i, label in enumerate(sequence) if i == 0 or label != sequence[i - 1]]


def _check_beam_args(beam_width, top_paths, where="ctc"):
    if beam_width < 1:
        raise ValueError(f"{where}: beam_width must be >= 1, got {beam_width}")
    if not 1 <= top_paths <= beam_width:
        raise ValueError(f"{where}: top_paths must lie in 1..beam_width ({beam_width}), "
                         f"got {top_paths}")


def _collect_top_paths(per_sample, top_paths, dtype):
    """Dense outputs from per-sample lists of (sequence, log_prob), best first.

    Missing paths (fewer candidates than top_paths) are empty sequences with
    log-probability -inf.
    """
    batch = len(per_sample)
    log_probs = np.full((batch, top_paths), _NEG_INF)
    paths = [[[] for _ in range(batch)] for _ in range(top_paths)]
    for b, found in enumerate(per_sample):
        for k, (sequence, log_prob) in enumerate(found[:top_paths]):
            paths[k][b] = sequence
            log_probs[b, k] = log_prob
    return [_pad_paths(p, batch) for p in paths], log_probs.astype(dtype)


def ctc_beam_search_decode(logits, input_lengths, beam_width=100, top_paths=1,
                           merge_repeated=False, where="ctc"):
    """Prefix beam search, as ``tf.nn.ctc_beam_search_decoder`` (default scorer).

    Reproduces TensorFlow's CTCBeamSearchDecoder step by step (see
    :func:`_beam_search_kernel`), with its normalisation of the logits
    (log-softmax per frame, TensorFlow 1.11 and later, which Keras 2.2.5's
    tests assume), in float64.  Its pruning is more than keeping the
    ``beam_width`` most probable prefixes: an entry that leaves the beam
    during a frame and is then offered again as an extension is extended no
    more in that frame.  Only ties may be ordered differently.

    Args:
        logits: (batch, time, classes); log-softmax is applied per frame.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        beam_width: number of prefixes kept after each frame.
        top_paths: number of decodings returned per sample, 1..beam_width.
        merge_repeated: as TF, merge runs of the same label in the returned
            sequences (so that "a a" decodes as "a"); the log-probabilities
            are those of the unmerged prefixes, and two prefixes that merge
            to the same sequence are returned apart.  Keras 2.2.5's
            ``ctc_decode`` passes False, the default here.
        where: the name errors start with.

    Returns:
        decoded: list of ``top_paths`` int64 arrays, the k-th (batch, longest
            k-th decoding) with the k-th most probable decoding of each
            sample, padded with -1.
        log_probs: (batch, top_paths) log-probability of each decoding: the
            probability that the frames collapse to that label sequence,
            summed over the alignments the beam kept; non-increasing along
            each row.

    A sample whose beam holds fewer than ``top_paths`` prefixes (too few
    frames or classes for that many) is an error, as in TensorFlow ("Less
    leaves in the beam search than requested").
    """
    logits = _as_logits(logits, where)
    batch, n_time, _ = logits.shape
    input_lengths = _as_lengths(input_lengths, batch, n_time, "input_lengths", where)
    beam_width, top_paths = int(beam_width), int(top_paths)
    _check_beam_args(beam_width, top_paths, where)
    per_sample = []
    for b in range(batch):
        tree = _PrefixTree()
        nodes, totals = _beam_search(_log_softmax(logits[b, :input_lengths[b]]), beam_width,
                                     tree, grow=True)
        if len(nodes) < top_paths:
            raise ValueError(f"{where}: sample {b} has {len(nodes)} prefixes in its beam after "
                             f"{input_lengths[b]} frames, fewer than top_paths={top_paths} "
                             f"(TensorFlow: \"Less leaves in the beam search than requested\")")
        found = []
        for node, total in zip(nodes[:top_paths].tolist(), totals[:top_paths].tolist()):
            sequence = tree.sequence(node)
            found.append((_merge_runs(sequence) if merge_repeated else sequence, total))
        per_sample.append(found)
    return _collect_top_paths(per_sample, top_paths, logits.dtype)


# ---------------------------------------------------------------------------
# Dictionary-constrained decoding (the Keras 1 ctc_decode form)


def _dictionary_words(dict_seq_lens, dict_values, n_classes):
    """The dictionary as a list of distinct label tuples, first occurrence first."""
    if dict_values is None:
        raise ValueError("ctc: dict_values (the dictionary) is required")
    words = []
    for i, value in enumerate(dict_values):
        word = np.asarray(value, dtype=np.int64).reshape(-1)
        if dict_seq_lens is not None:
            length = int(np.asarray(dict_seq_lens).reshape(-1)[i])
            if not 0 <= length <= len(word):
                raise ValueError(f"ctc: dict_seq_lens[{i}] = {length} does not fit "
                                 f"dict_values[{i}] of length {len(word)}")
            word = word[:length]
        if word.size and (word.min() < 0 or word.max() >= n_classes - 1):
            raise ValueError(f"ctc: dictionary labels must lie in 0..{n_classes - 2}, "
                             f"got {word.tolist()} in entry {i}")
        words.append(tuple(word.tolist()))
    if dict_seq_lens is not None and np.asarray(dict_seq_lens).size != len(words):
        raise ValueError("ctc: dict_seq_lens and dict_values must have the same length")
    if not words:
        raise ValueError("ctc: the dictionary is empty")
    return list(dict.fromkeys(words))


def ctc_dictionary_decode(logits, input_lengths, dict_seq_lens, dict_values, beam_width=None,
                          top_paths=1):
    """Decoding constrained to the words of a dictionary (Keras 1 ``ctc_decode`` form).

    Keras 1's ``ctc_decode(y_pred, input_length, greedy=True, beam_width=None,
    dict_seq_lens=None, dict_values=None)`` documents "a constrained
    dictionary search": with ``greedy=False`` the decoding is one of the
    dictionary's entries (``dict_values``, a list of label lists, entry i
    of length ``dict_seq_lens[i]``), and "if beam_width is not None, the
    constrained dictionary search uses a beam of this width".  Its TF code
    passed these arguments to a TF decoder that never accepted them, so there
    is no reference result; this function implements the documented intent:

    * ``beam_width=None``: exact search.  Every entry is scored by its CTC
      probability, summed over all alignments (the CTC loss forward pass),
      and the ``top_paths`` most probable entries are returned.
    * ``beam_width=n``: the prefix beam search of ``ctc_beam_search_decode``
      where a prefix may only be extended into a prefix of some entry; after
      the last frame the beam's complete entries are ranked by their
      probability.  Its cost does not grow with the dictionary's size (the
      exact search's does); approximate (an entry pruned from the beam is
      lost); exact when the beam holds every prefix.

    Duplicate entries count once.  Entries that cannot be aligned (too long
    for the input) have probability zero and are never returned: missing
    decodings are empty with log-probability -inf.

    Args:
        logits: (batch, time, classes); blank = classes - 1.
        input_lengths: (batch,) or (batch, 1), each in 0..time.
        dict_seq_lens: length of each dictionary entry, or None for the
            entries' own lengths.
        dict_values: the dictionary: a sequence of label sequences (or a
            padded 2-D array read with ``dict_seq_lens``).
        beam_width: None for the exact search, else the beam width.
        top_paths: number of decodings returned per sample.

    Returns:
        decoded: list of ``top_paths`` (batch, longest) int64 arrays padded
            with -1, the k-th holding each sample's k-th best entry.
        log_probs: (batch, top_paths), best first.
    """
    logits = _as_logits(logits)
    batch, n_time, n_classes = logits.shape
    input_lengths = _as_lengths(input_lengths, batch, n_time, "input_lengths")
    words = _dictionary_words(dict_seq_lens, dict_values, n_classes)
    top_paths = int(top_paths)
    if beam_width is not None:
        beam_width = int(beam_width)
        _check_beam_args(beam_width, top_paths)
        tree = _PrefixTree.from_words(words)
        per_sample = []
        for b in range(batch):
            nodes, totals = _beam_search(_log_softmax(logits[b, :input_lengths[b]]), beam_width,
                                         tree, grow=False)
            words_found = tree.is_word[nodes] & (totals > _NEG_INF)
            nodes, totals = nodes[words_found][:top_paths], totals[words_found][:top_paths]
            per_sample.append([(tree.sequence(node), total)
                               for node, total in zip(nodes.tolist(), totals.tolist())])
        return _collect_top_paths(per_sample, top_paths, logits.dtype)

    if top_paths < 1:
        raise ValueError(f"ctc: top_paths must be >= 1, got {top_paths}")
    n_words = len(words)
    longest = max(len(w) for w in words)
    word_labels = np.zeros((n_words, longest), dtype=np.int64)
    for i, word in enumerate(words):
        word_labels[i, :len(word)] = word
    word_lengths = np.array([len(w) for w in words], dtype=np.int64)
    # One kernel row per (sample, entry) pair; the loss kernel's signature
    # (loss in the logits' dtype) is reused.
    loss = np.empty(batch * n_words, dtype=logits.dtype)
    _ctc_loss_kernel_for_here()(logits, np.repeat(np.arange(batch, dtype=np.int64), n_words),
                     np.tile(word_labels, (batch, 1)), np.tile(word_lengths, batch),
                     input_lengths, False, loss, np.empty((len(loss), 0, 0), dtype=logits.dtype))
    word_log_probs = -loss.reshape(batch, n_words)
    per_sample = []
    for b in range(batch):
        best = np.argsort(-word_log_probs[b], kind="stable")[:top_paths]
        per_sample.append([(list(words[i]), word_log_probs[b, i]) for i in best.tolist()
                           if word_log_probs[b, i] > _NEG_INF])
    return _collect_top_paths(per_sample, top_paths, logits.dtype)


# ---------------------------------------------------------------------------
# Dense labels to sparse


def ctc_label_dense_to_sparse(labels, label_lengths):
    """The SparseTensor Keras's ``ctc_label_dense_to_sparse`` builds, as arrays.

    Keeps ``labels[b, i]`` for ``i < label_lengths[b]`` (a length beyond the
    row keeps the whole row, a negative one keeps nothing, as TF's mask does),
    in row-major order.

    Returns:
        indices: (n, 2) int64 (sample, position) pairs.
        values: (n,) the kept labels, in the labels' dtype.
        dense_shape: (2,) int64, the labels' shape.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"ctc: labels must be (batch, max_label_length), got {labels.shape}")
    label_lengths = np.asarray(label_lengths).reshape(-1)
    if label_lengths.size != labels.shape[0]:
        raise ValueError(f"ctc: label_lengths must hold one length per row ({labels.shape[0]}),"
                         f" got shape {label_lengths.shape}")
    mask = np.arange(labels.shape[1])[None, :] < label_lengths[:, None]
    indices = np.argwhere(mask).astype(np.int64)
    return indices, labels[mask], np.array(labels.shape, dtype=np.int64)
