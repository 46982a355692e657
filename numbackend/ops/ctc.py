"""CTC: the loss (with its gradient from the same pass), the decoders and the
dense-to-sparse conversion of labels, on jit_kernels.ctc (imported when first
run, so that importing numbackend does not import Numba).  Logits are (batch,
time, classes), blank last.  The decoders' results have data-dependent widths:
one "ctc_decode" node runs the decoder once and packs its outputs into one
float64 array, which the "ctc_decoded_path" and "ctc_decoded_log_prob" nodes
unpack."""
import numpy as np

from ..graph import format_shape
from . import batch
from .registry import apply, library, not_differentiable


def _ctc_kernels():
    from jit_kernels import ctc
    return ctc


def _ctc_check(where, logits, lengths=(), labels=None):
    if logits.ndim != 3 or np.dtype(logits.dtype).kind != "f":
        raise ValueError(f"{where}: predictions must be a float tensor (samples, time, classes), "
                         f"got shape {format_shape(logits.shape)} and dtype {logits.dtype}")
    if labels is not None and labels.ndim != 2:
        raise ValueError(f"{where}: labels must be (samples, max_label_length), got shape "
                         f"{format_shape(labels.shape)}")
    for t in lengths:
        if t.ndim not in (1, 2) or (t.ndim == 2 and t.shape[1] not in (None, 1)):
            raise ValueError(f"{where}: lengths must be (samples,) or (samples, 1), got shape "
                             f"{format_shape(t.shape)}")


def _ctc_loss_infer(inputs, attrs):
    logits, labels, label_lengths, input_lengths = inputs
    _ctc_check("ctc_batch_cost", logits, (label_lengths, input_lengths), labels)
    return (logits.shape[0], 1), logits.dtype


def _ctc_loss(logits, labels, label_lengths, input_lengths):
    loss, _ = _ctc_kernels().ctc_loss_and_grad(logits, labels, label_lengths, input_lengths,
                                               compute_grad=False, where="ctc_batch_cost")
    return loss.reshape(-1, 1)


def _ctc_loss_and_grad(logits, labels, label_lengths, input_lengths):
    loss, grad = _ctc_kernels().ctc_loss_and_grad(logits, labels, label_lengths, input_lengths,
                                                  where="ctc_batch_cost")
    return loss.reshape(-1, 1).astype(logits.dtype), grad.astype(logits.dtype, copy=False)


def _ctc_loss_grad(g, n):
    """d loss / d logits from the kernel, times the incoming (batch, 1) gradient;
    the labels and lengths get none."""
    both = apply("ctc_loss_and_grad", *n.inputs)
    grad = apply("tuple_item", both, index=1, shape=n.inputs[0].shape, dtype=n.dtype)
    return [apply("multiply", grad, apply("reshape", g, shape=(-1, 1, 1))), None, None, None]


# One pass of the lattice gives the loss and its gradient; where a graph has both,
# the loss is read from that pass (rewrite's computed_by) instead of a second one.
library("ctc_loss", _ctc_loss_infer, _ctc_loss, grad=_ctc_loss_grad,
        computed_by=("ctc_loss_and_grad", 0))
library("ctc_loss_and_grad", _ctc_loss_infer, _ctc_loss_and_grad, multi_output=True)


def _ctc_decode_infer(inputs, attrs):
    logits, input_lengths = inputs
    _ctc_check("ctc_decode", logits, (input_lengths,))
    if attrs["mode"] not in ("greedy", "beam", "dictionary"):
        raise ValueError(f"ctc_decode: unknown mode {attrs['mode']!r}")
    return (logits.shape[0], attrs["top_paths"], None), "float64"


def _ctc_decode(logits, input_lengths, mode, top_paths, beam_width=None, merge_repeated=False,
                dict_seq_lens=None, dict_values=None):
    """(batch, top_paths, 1 + longest) float64: [..., 0] the log-probability of
    each decoding, [..., 1:] its labels padded with -1."""
    ctc = _ctc_kernels()
    if mode == "greedy":
        path, log_prob = ctc.ctc_greedy_decode(logits, input_lengths)
        paths = [path]
    elif mode == "beam":
        paths, log_prob = ctc.ctc_beam_search_decode(logits, input_lengths, beam_width, top_paths,
                                                     merge_repeated=merge_repeated,
                                                     where="ctc_decode")
    else:
        paths, log_prob = ctc.ctc_dictionary_decode(logits, input_lengths, dict_seq_lens,
                                                    dict_values, beam_width, top_paths)
    longest = max(p.shape[1] for p in paths)
    packed = np.full((logits.shape[0], top_paths, 1 + longest), -1.0)
    packed[:, :, 0] = log_prob
    for k, p in enumerate(paths):
        packed[:, k, 1:1 + p.shape[1]] = p
    return packed


def _ctc_decoded_path(packed, index):
    labels = packed[:, index, 1:]
    used = int((labels >= 0).any(axis=0).nonzero()[0].max(initial=-1)) + 1
    return labels[:, :used].astype(np.int64)


def _ctc_decode_rows(node, axes):
    """Each entry of axis 0 (a sequence and its length) is decoded on its own.
    Its decodings are padded to the longest of the whole batch: an export
    writes them at their bound instead, the time steps, and its loader trims
    them (lowering.CtcDecode)."""
    logits, lengths = axes
    if logits is None or logits.axis != 0 or lengths != logits:
        raise batch.MixesRows("decodes each entry of axis 0 with its length, but the logits "
                              "and the lengths carry the batch on "
                              + ", ".join("no axis" if b is None else str(b) for b in axes))
    return logits


library("ctc_decode", _ctc_decode_infer, _ctc_decode, grad=not_differentiable,
        rows=_ctc_decode_rows)
library("ctc_decoded_path", lambda inputs, attrs: ((inputs[0].shape[0], None), "int64"),
        _ctc_decoded_path, grad=not_differentiable, rows=batch.same)
library("ctc_decoded_log_prob",
        lambda inputs, attrs: (inputs[0].shape[:2], attrs["dtype"]),
        lambda packed, dtype: packed[:, :, 0].astype(dtype), grad=not_differentiable,
        rows=batch.same)


def _ctc_sparse_infer(inputs, attrs):
    labels, label_lengths = inputs
    if labels.ndim != 2 or label_lengths.ndim not in (1, 2):
        raise ValueError(f"ctc_label_dense_to_sparse: labels must be (samples, max_label_length) "
                         f"and label_lengths (samples,), got shapes {format_shape(labels.shape)} "
                         f"and {format_shape(label_lengths.shape)}")
    return {"indices": ((None, 2), "int64"), "values": ((None,), labels.dtype),
            "dense_shape": ((2,), "int64")}[attrs["part"]]


def _ctc_sparse(labels, label_lengths, part):
    indices, values, dense_shape = _ctc_kernels().ctc_label_dense_to_sparse(labels, label_lengths)
    return {"indices": indices, "values": values, "dense_shape": dense_shape}[part]


library("ctc_dense_to_sparse", _ctc_sparse_infer, _ctc_sparse)
