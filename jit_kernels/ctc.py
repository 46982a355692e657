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

The loss and its gradient live in :mod:`jit_kernels.ctc_loss`, the decoders
in :mod:`jit_kernels.ctc_decode`; this module holds their entry points.
The loss and the greedy decoder are Numba kernels, parallel over the batch.
The beam searches are a serial Numba kernel per sample: TensorFlow's beam
search updates its entries one after another, and its result depends on
that order.
"""
import numpy as np

from .ctc_decode import ctc_beam_search_decode, ctc_dictionary_decode, ctc_greedy_decode
from .ctc_loss import ctc_loss_and_grad

__all__ = ["ctc_beam_search_decode", "ctc_dictionary_decode", "ctc_greedy_decode", "ctc_label_dense_to_sparse",
           "ctc_loss_and_grad"]


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
