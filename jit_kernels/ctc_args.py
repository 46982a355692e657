"""What the CTC kernels share (see :mod:`jit_kernels.ctc` for their conventions):
the checks of their arguments and a log-softmax.
"""
import numpy as np

# log(0), the lattice's and the beams' "no path"
NEG_INF = -np.inf


def as_logits(logits, where="ctc"):
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


def as_lengths(lengths, batch, upper, what, where="ctc"):
    """(batch,) int64 array of lengths in 0 .. upper; accepts (batch, 1) as Keras passes."""
    lengths = np.asarray(lengths)
    if lengths.size != batch or (lengths.ndim > 1 and lengths.shape[0] != batch):
        raise ValueError(f"{where}: {what} must hold one length per sample ({batch}), "
                         f"got shape {lengths.shape}")
    lengths = np.ascontiguousarray(lengths.reshape(batch), dtype=np.int64)
    if batch and (lengths.min() < 0 or lengths.max() > upper):
        raise ValueError(f"{where}: {what} must lie in 0..{upper}, got {lengths.tolist()}")
    return lengths


def padded_paths(paths, batch):
    """Dense (batch, longest) int64 array from a list of label sequences, padded with -1."""
    longest = max((len(p) for p in paths), default=0)
    dense = np.full((batch, longest), -1, dtype=np.int64)
    for b, path in enumerate(paths):
        dense[b, :len(path)] = path
    return dense


def log_softmax(logits_2d):
    """Log-softmax over the last axis, in float64."""
    x = logits_2d.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
