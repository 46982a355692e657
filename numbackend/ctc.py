"""CTC (connectionist temporal classification): Keras 2.2.5's ``ctc_batch_cost``,
``ctc_decode`` and ``ctc_label_dense_to_sparse``, on the kernels of
``jit_kernels.ctc`` (the op definitions are in ops/ctc.py).

As in Keras's TensorFlow backend, ``y_pred`` is a softmax output
(samples, time, classes) with the blank as the LAST class, and the CTC ops
see ``log(y_pred + epsilon())`` as their logits.
"""
import numpy as np

from . import config
from .graph import Tensor
from .ops import apply, as_tensor


def _logits(y_pred, where):
    y_pred = as_tensor(y_pred, where=where)
    if y_pred.ndim != 3:
        raise ValueError(f"{where}: y_pred must be (samples, time, classes), got rank "
                         f"{y_pred.ndim}")
    return apply("log", apply("add", y_pred, config.epsilon()))


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """CTC loss of each sample, shape (samples, 1).

    ``y_true`` (samples, max_label_length) integer labels (a float tensor of
    whole numbers is accepted, as Keras models often feed one), ``y_pred``
    (samples, time, classes) softmax output with the blank last,
    ``input_length`` and ``label_length`` (samples, 1) (or (samples,)).
    Differentiable with respect to ``y_pred``.

    Labels are read as TensorFlow's CTC loss reads them: a class of
    ``classes - 1`` (the blank) or more ends the label, and only the labels
    before it are scored; a label of blanks only (Keras's image_ocr example
    trains on such samples) gets TensorFlow 1's finite loss.  A label that
    cannot be aligned (equal neighbours need a blank frame between them) has
    loss +inf.  An empty label, a negative one, a real label after a blank,
    or more label items than input frames raise a ValueError naming the
    sample when the function runs.  ``jit_kernels.ctc.ctc_loss_and_grad``
    has the details.
    """
    logits = _logits(y_pred, "ctc_batch_cost")
    return apply("ctc_loss", logits, as_tensor(y_true, where="ctc_batch_cost"),
                 as_tensor(label_length, where="ctc_batch_cost"),
                 as_tensor(input_length, where="ctc_batch_cost"))


def ctc_decode(y_pred, input_length, greedy=True, beam_width=100, top_paths=1,
               merge_repeated=False, dict_seq_lens=None, dict_values=None):
    """Decodes the softmax output ``y_pred`` (samples, time, classes), blank last,
    whose sequences have the lengths ``input_length`` ((samples,) or (samples, 1)).

    ``greedy=True``: best path (argmax per frame, merge repeats, drop blanks);
    its log-probability is minus the sum of each frame's largest
    ``log(y_pred + epsilon)``, as TensorFlow's greedy decoder gives it.
    ``greedy=False``: TensorFlow's prefix beam search of width ``beam_width``
    (``tf.nn.ctc_beam_search_decoder``, step by step, so that it prunes as
    TensorFlow does), returning the ``top_paths`` most probable label
    sequences and their log-probabilities (``merge_repeated`` as Keras 2.2.5:
    merge runs of a label in the returned sequences).  A sample whose beam
    holds fewer than ``top_paths`` prefixes raises a ValueError when the
    function runs, as in TensorFlow.

    The Keras 1 form: with ``greedy=False`` and a dictionary ``dict_values`` (a
    list of label lists; entry i of length ``dict_seq_lens[i]``, or its own
    length when ``dict_seq_lens`` is None), the decodings are dictionary
    entries: a beam search of width ``beam_width`` restricted to prefixes of
    entries, or, with ``beam_width=None``, an exact search scoring every
    entry.  With ``greedy=True`` the dictionary is ignored, as Keras 1 did.

    Returns (list of ``top_paths`` int64 tensors (samples, longest decoding)
    padded with -1, log-probabilities (samples, top_paths)).  The decodings'
    width depends on the data: their static shape is (samples, None).
    """
    logits = _logits(y_pred, "ctc_decode")
    input_length = as_tensor(input_length, where="ctc_decode")
    if greedy:
        attrs = {"mode": "greedy", "top_paths": 1}
    elif dict_values is not None or dict_seq_lens is not None:
        if dict_values is None:
            raise ValueError("ctc_decode: dict_seq_lens given without dict_values")
        values = tuple(tuple(int(v) for v in _flat(word)) for word in dict_values)
        lens = None if dict_seq_lens is None else tuple(int(v) for v in _flat(dict_seq_lens))
        attrs = {"mode": "dictionary", "top_paths": int(top_paths),
                 "beam_width": None if beam_width is None else int(beam_width),
                 "dict_seq_lens": lens, "dict_values": values}
    else:
        attrs = {"mode": "beam", "top_paths": int(top_paths),
                 "beam_width": 100 if beam_width is None else int(beam_width),
                 "merge_repeated": bool(merge_repeated)}
    if attrs["top_paths"] < 1:
        raise ValueError(f"ctc_decode: top_paths must be >= 1, got {top_paths}")
    packed = apply("ctc_decode", logits, input_length, **attrs)
    decoded = [apply("ctc_decoded_path", packed, index=k) for k in range(attrs["top_paths"])]
    return decoded, apply("ctc_decoded_log_prob", packed, dtype=logits.dtype)


def _flat(value):
    """A dictionary entry (or the lengths) as a flat list of numbers."""
    if isinstance(value, Tensor):
        raise TypeError("ctc_decode: the dictionary must be given as arrays or lists, "
                        "not tensors")
    return np.asarray(value).reshape(-1).tolist()


def ctc_label_dense_to_sparse(labels, label_lengths):
    """The sparse form of dense CTC labels: ``labels[b, i]`` for
    ``i < label_lengths[b]``, in row-major order.

    numbackend has no sparse tensors: this returns the parts of the
    SparseTensor Keras's TensorFlow backend builds, as a tuple of tensors
    ``(indices, values, dense_shape)``: indices (n, 2) int64 (sample,
    position) pairs, values (n,) in the labels' dtype, dense_shape (2,) int64.
    """
    labels = as_tensor(labels, where="ctc_label_dense_to_sparse")
    label_lengths = as_tensor(label_lengths, where="ctc_label_dense_to_sparse")
    return tuple(apply("ctc_dense_to_sparse", labels, label_lengths, part=part)
                 for part in ("indices", "values", "dense_shape"))


__all__ = ["ctc_batch_cost", "ctc_decode", "ctc_label_dense_to_sparse"]
