"""CTC loss and its gradient (``tf.nn.ctc_loss``): a Numba kernel run on parts
of the batch at once, the lattice in float64 (see :mod:`jit_kernels.ctc` for
the conventions).
"""
import math

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic

from . import blas
from .compiling import njit_cached
from .ctc_args import NEG_INF, as_lengths, as_logits, log_softmax

# The lattice needs a few exp and log per state and frame.  Numba turns
# math.exp / math.log into scalar libm calls that LLVM cannot vectorise (the
# pip llvmlite has no SVML), which made them most of the loss's run time; these
# two polynomial versions, exact to about 1 ulp on the ranges used here, let
# the loops over states and classes run 4 doubles at a time.
#
# They are compiled once each, and LLVM inlines them into the loops that call
# them; _log_add3 alone is inlined by Numba (inline="always"), as LLVM found it
# too long to inline and its loop then stayed scalar.  Numba's inlining of
# each at every call had typed and lowered them again each time: most of
# those loops' compile time.

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


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
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


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
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


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _log_add2(a, b):
    """log(exp(a) + exp(b)), branch-free; exact for -inf terms, no overflow."""
    top = max(a, b)
    out = top + _log_1_to_3(1.0 + _exp(min(a, b) - top))
    # Both -inf: the difference above is nan; the answer is -inf.
    return top if top == NEG_INF else out


@numba.njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def _log_add3(a, b, c):
    """log(exp(a) + exp(b) + exp(c)), branch-free; exact for -inf terms, no overflow."""
    top_ab = max(a, b)
    top = max(top_ab, c)
    out = top + _log_1_to_3(1.0 + _exp(min(a, b) - top) + _exp(min(top_ab, c) - top))
    return top if top == NEG_INF else out


# The lattice loops.  Blank and label states live in separate arrays so that
# each loop does the same work for every state, and each loop takes 1-D views
# that start at the first state of the band: indices from 0 let Numba drop its
# negative-index handling, and LLVM then vectorises the loop.  The forward and
# the backward pass share them (the backward one adds no emission), so that
# they compile once.


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _blank_step(same, label_beside, emit, out, n):
    """out[k] = log(exp(same[k]) + exp(label_beside[k])) + emit.

    Forward, blank state i is entered from itself or from the label before
    it; backward (emit 0), it goes on to itself or to the label after it."""
    for k in range(n):
        out[k] = _log_add2(same[k], label_beside[k]) + emit


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _label_step(same, blank_beside, label_beyond, can_skip, emit, out, n):
    """out[k] = log(exp(same[k]) + exp(blank_beside[k]) + exp(label_beyond[k] if
    can_skip[k])) + emit[k].

    Forward, label state i is entered from itself, the blank before it, or the
    label before that blank when the two labels differ; backward (emit 0), it
    goes on to itself, the blank after it, or the label after that blank."""
    for k in range(n):
        skip = label_beyond[k] if can_skip[k] else NEG_INF
        out[k] = _log_add3(same[k], blank_beside[k], skip) + emit[k]


@numba.njit(fastmath=_FASTMATH, error_model="numpy")
def _shifted_exps(a, b, shift, out, n):
    """out[k] = exp(a[k] + b[k] - shift): the occupancies exp(alpha + beta -
    log_prob), and the softmax's exps (b zero: one such loop to compile)."""
    for k in range(n):
        out[k] = _exp(a[k] + b[k] - shift)


# A row's loss (_ctc_row) in three stages, each a function of its own, so that
# each compiles within the library's budget (tuning.LIBRARY_COMPILE_BUDGET_S);
# as one function the row did not.  Their arrays are made with np.empty and
# filled by loops: np.full, np.zeros and slice assignments each compiled a
# function of their own.


@numba.njit(error_model="numpy", fastmath=_FASTMATH)
def _emissions(logits, label, compute_grad, grad, emit_blank, emit_label):
    """Log-softmax of the blank and of each label at each frame t < n_frames
    (emit_blank's length) into emit_blank and emit_label[:, :L]; the spare
    last column of emit_label is -inf.  When compute_grad, grad[t] is set to
    softmax(logits[t]) (:func:`_backward` subtracts the occupancies)."""
    n_classes = logits.shape[1]
    blank = n_classes - 1
    n_labels = label.shape[0]
    exps = np.empty(n_classes)
    values = np.empty(n_classes)  # logits[t] in float64
    zeros = np.empty(n_classes)
    for c in range(n_classes):
        zeros[c] = 0.0
    for t in range(emit_blank.shape[0]):
        top = NEG_INF
        for c in range(n_classes):
            values[c] = float(logits[t, c])
            top = max(top, values[c])
        _shifted_exps(values, zeros, top, exps, n_classes)
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
        emit_label[t, n_labels] = NEG_INF


@numba.njit(error_model="numpy", fastmath=_FASTMATH)
def _forward(emit_blank, emit_label, can_skip, alpha_blank, alpha_label):
    """The forward lattice (see :func:`_ctc_row`): alpha_blank[t, i] holds
    blank i and alpha_label[t, i + 1] label i (column 0 is a -inf "label
    before the first blank"); returns log p(label)."""
    n_frames = emit_blank.shape[0]
    n_labels = emit_label.shape[1] - 1
    n_states = 2 * n_labels + 1
    for t in range(n_frames):
        for i in range(n_labels + 1):
            alpha_blank[t, i] = NEG_INF
            alpha_label[t, i] = NEG_INF
    alpha_blank[0, 0] = emit_blank[0]
    if n_labels > 0:
        alpha_label[0, 1] = emit_label[0, 0]
    for t in range(1, n_frames):
        lo = max(0, n_states - 2 * (n_frames - t))
        hi = min(n_states - 1, 2 * t + 1)
        first, last_blank = (lo + 1) // 2, hi // 2
        prev_blank, prev_label = alpha_blank[t - 1], alpha_label[t - 1]
        _blank_step(prev_blank[first:], prev_label[first:], emit_blank[t],
                    alpha_blank[t, first:], last_blank + 1 - first)
        first, last_label = lo // 2, (hi - 1) // 2
        _label_step(prev_label[first + 1:], prev_blank[first:], prev_label[first:],
                    can_skip[first:], emit_label[t, first:], alpha_label[t, first + 1:],
                    last_label + 1 - first)
    last = n_frames - 1
    return np.logaddexp(alpha_blank[last, n_labels], alpha_label[last, n_labels])


@numba.njit(error_model="numpy", fastmath=_FASTMATH)
def _backward(label, emit_blank, emit_label, can_skip, alpha_blank, alpha_label, log_prob,
              grad):
    """The backward lattice (see :func:`_ctc_row`), subtracting each frame's
    occupancies from grad[t] (the softmax, from :func:`_emissions`)."""
    n_frames = emit_blank.shape[0]
    n_labels = label.shape[0]
    n_states = 2 * n_labels + 1
    blank = grad.shape[1] - 1
    # next_*[i] = beta_{t+1}(state i) + emission at t+1, -inf outside the
    # band, with one spare -inf at the end.
    next_blank = np.empty(n_labels + 2)
    next_label = np.empty(n_labels + 1)
    beta_blank = np.empty(n_labels + 1)
    beta_label = np.empty(n_labels + 1)
    occupancy_blank = np.empty(n_labels + 1)
    occupancy_label = np.empty(n_labels + 1)
    no_emission = np.empty(n_labels + 1)
    for i in range(n_labels + 1):
        next_blank[i] = next_label[i] = NEG_INF
        no_emission[i] = 0.0
    next_blank[n_labels + 1] = NEG_INF
    last = n_frames - 1
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
            _blank_step(next_blank[first_blank:], next_label[first_blank:], 0.0,
                        beta_blank[first_blank:], n_blank)
            _label_step(next_label[first_label:], next_blank[first_label + 1:],
                        next_label[first_label + 1:], can_skip[first_label + 1:],
                        no_emission, beta_label[first_label:], n_label)

        # Views from the band's first state, as for the lattice loops.
        _shifted_exps(alpha_blank[t, first_blank:], beta_blank[first_blank:], log_prob,
                      occupancy_blank, n_blank)
        _shifted_exps(alpha_label[t, first_label + 1:], beta_label[first_label:], log_prob,
                      occupancy_label, n_label)
        # Several labels may share a class: a plain loop.
        blank_total = 0.0
        for k in range(n_blank):
            blank_total += occupancy_blank[k]
        grad[t, blank] -= blank_total
        for k in range(n_label):
            grad[t, label[first_label + k]] -= occupancy_label[k]

        for i in range(n_labels + 1):
            next_blank[i] = next_label[i] = NEG_INF
        next_blank[n_labels + 1] = NEG_INF
        # next = beta + the emission at t, in the band (views from its first
        # state, as for the lattice loops)
        band_next, band_beta = next_blank[first_blank:], beta_blank[first_blank:]
        for k in range(n_blank):
            band_next[k] = band_beta[k] + emit_blank[t]
        band_next, band_beta = next_label[first_label:], beta_label[first_label:]
        band_emit = emit_label[t, first_label:]
        for k in range(n_label):
            band_next[k] = band_beta[k] + band_emit[k]


# Inlined into the kernel: a function of its own would have the stages' code
# optimised once more, in it and again in the kernel.
@numba.njit(inline="always", error_model="numpy", fastmath=_FASTMATH)
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
    n_labels = label.shape[0]
    # Two equal labels in a row need a blank frame between them.
    required_frames = n_labels
    for i in range(1, n_labels):
        if label[i] == label[i - 1]:
            required_frames += 1
    # Frames at and after n_frames get no gradient (grad is (0, 0) when not
    # computed).
    for t in range(n_frames, grad.shape[0]):
        for c in range(grad.shape[1]):
            grad[t, c] = 0.0
    if n_frames == 0:
        # An empty label on an empty input has probability 1; any other
        # label none.
        return np.inf if required_frames > 0 else 0.0
    # can_skip[i]: label i may directly follow label i - 1 (no blank
    # between) because they differ.  One spare False at the end.
    can_skip = np.empty(n_labels + 1, dtype=np.bool_)
    for i in range(n_labels + 1):
        can_skip[i] = 0 < i < n_labels and label[i] != label[i - 1]

    emit_blank = np.empty(n_frames)
    emit_label = np.empty((n_frames, n_labels + 1))
    _emissions(logits, label, compute_grad, grad, emit_blank, emit_label)
    if n_frames < required_frames:
        # No alignment exists: grad holds the softmax of the used frames.
        return np.inf
    alpha_blank = np.empty((n_frames, n_labels + 1))
    alpha_label = np.empty((n_frames, n_labels + 1))
    log_prob = _forward(emit_blank, emit_label, can_skip, alpha_blank, alpha_label)
    if log_prob == NEG_INF:
        # Every alignment has probability zero (logits of -inf): as an
        # impossible label, grad holds the softmax of the used frames.
        return np.inf
    if compute_grad:
        _backward(label, emit_blank, emit_label, can_skip, alpha_blank, alpha_label, log_prob,
                  grad)
    return -log_prob


@njit_cached(nogil=True, error_model="numpy")
def _ctc_loss_kernel(logits, row_sample, labels, label_lengths, input_lengths,
                     compute_grad, loss, grad):
    """loss[r] (and grad[r] when compute_grad) for each label row r.

    Row r scores labels[r, :label_lengths[r]] against sample row_sample[r] of
    logits, so that one sample can be scored against many label sequences
    (the dictionary decoder does this; the loss uses row_sample = arange).
    grad is (rows, time, classes), or (rows, 0, 0) when not computed.
    Serial and without the GIL: :func:`loss_rows` runs it on parts of the
    rows at once.
    """
    for row in range(labels.shape[0]):
        sample = row_sample[row]
        loss[row] = _ctc_row(logits[sample], labels[row, :label_lengths[row]],
                             input_lengths[sample], compute_grad, grad[row])


def loss_rows(logits, row_sample, labels, label_lengths, input_lengths, compute_grad, loss,
              grad):
    """:func:`_ctc_loss_kernel`, its rows split between BLAS's threads
    (:func:`parts.run_parts`) where there are two or more.  Not a prange loop:
    Numba compiled the loss kernel several times longer with one (its
    parallel loop's body is compiled, and every callee's code optimised,
    once more), and BLAS's threads also avoid the wait for Numba's threads
    that :func:`windows.launch_by_images` describes."""
    rows = labels.shape[0]
    count = min(blas.threads(), rows) if rows >= 2 else 1
    if count < 2:
        _ctc_loss_kernel(logits, row_sample, labels, label_lengths, input_lengths, compute_grad,
                         loss, grad)
        return
    per = -(-rows // count)
    count = -(-rows // per)  # none empty
    from . import parts  # not at import: it compiles its timing part, which a decoder never needs

    def part(i):
        rows_of_part = slice(i * per, min(rows, (i + 1) * per))
        _ctc_loss_kernel(logits, row_sample[rows_of_part], labels[rows_of_part],
                         label_lengths[rows_of_part], input_lengths, compute_grad,
                         loss[rows_of_part], grad[rows_of_part])
    parts.run_parts(count, part)


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
    label_lengths = as_lengths(label_lengths, batch, labels.shape[1], "label_lengths", where)
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
    logits = as_logits(logits, where)
    batch, n_time, n_classes = logits.shape
    input_lengths = as_lengths(input_lengths, batch, n_time, "input_lengths", where)
    labels, real_lengths = _tf_labels(labels, label_lengths, input_lengths, n_classes, where)
    compute_grad = bool(compute_grad)
    loss = np.empty(batch, dtype=logits.dtype)
    grad_shape = logits.shape if compute_grad else (batch, 0, 0)  # (batch, 0, 0): unused
    grad = np.empty(grad_shape, dtype=logits.dtype)
    loss_rows(logits, np.arange(batch, dtype=np.int64), labels, real_lengths, input_lengths,
              compute_grad, loss, grad)
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
        log_probs = log_softmax(logits[b, :n_frames])
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
            if log_p > NEG_INF:  # else, as TF, no valid path: the softmax alone
                grad[b, :n_frames, blank] -= occupancy
