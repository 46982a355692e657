"""im2col: convolutions as a column matrix of the input windows and a matrix
product through NumPy's BLAS (``np.matmul`` called from Python, because
``np.dot`` inside ``njit`` needs SciPy at run time), batch chunk by batch
chunk; and col2im, which gathers columns back for the input gradient.
"""

import numpy as np
from numba import prange

from . import blas, machine, tuning
from .compiling import njit_cached_twins
from .windows import JIT_OPTIONS, in_image_parts, launch, positions_per_image, window_patches


@njit_cached_twins(**JIT_OPTIONS)
def _col2im(cols, first, dx, kernel, stride, dilation, pad, out):
    """Inverse of im2col: images first, ... of ``dx`` get the sum of every
    column entry (see :func:`window_patches`) that was copied from them.

    A scatter in the order of the rows of ``cols``, parallel over images
    (each owns its slice of dx): every row is read once, front to back, and
    its taps add runs of ``channels`` contiguous values.  The gather over
    input positions it replaces (each position looking up the outputs and
    taps that read it, with a division test per tap) read ``cols`` out of
    order and was much slower (PERFORMANCE.md, W4 training).
    """
    _, size_d, size_h, size_w, channels = dx.shape
    kd, kh, kw = kernel
    od, oh, ow = out
    images = cols.shape[0] // (od * oh * ow)
    for n in prange(images):
        image = dx[first + n]
        image[:] = 0
        for z in range(od):
            for y in range(oh):
                for x in range(ow):
                    source = cols[((n * od + z) * oh + y) * ow + x]
                    for a in range(kd):
                        iz = z * stride[0] + a * dilation[0] - pad[0]
                        if not 0 <= iz < size_d:
                            continue
                        for b in range(kh):
                            iy = y * stride[1] + b * dilation[1] - pad[1]
                            if not 0 <= iy < size_h:
                                continue
                            for c in range(kw):
                                ix = x * stride[2] + c * dilation[2] - pad[2]
                                if not 0 <= ix < size_w:
                                    continue
                                target = image[iz, iy, ix]
                                col = ((a * kh + b) * kw + c) * channels
                                for ch in range(channels):
                                    target[ch] += source[col + ch]


def fill_columns(patches, first, cols):
    """Copy the patches of images first, ... into cols (their rows, taps*C)."""
    _, od, oh, ow = patches.shape[:4]
    images = cols.shape[0] // (od * oh * ow)   # not np.prod, whose call shows at batch 1
    target = cols.reshape((images,) + patches.shape[1:])
    source = patches[first:first + images]
    if patches.shape[-1] > 1 or cols.shape[0] < tuning.CONV_TAPWISE_MIN_ROWS:
        np.copyto(target, source)
        return
    # With one channel, copying a tap at a time (runs along the output rows)
    # is faster than the whole view (runs of kw values) from a few images up;
    # for one image (676 rows at mnist_cnn's first layer) the whole view is
    # faster: fewer NumPy calls (PERFORMANCE.md, W4).
    for tap in np.ndindex(*patches.shape[4:7]):
        index = (slice(None),) * 4 + tap
        target[index] = source[index]


def add_columns(cols, first, dx5, g):
    """Images first, ... of dx5 get the sum of the column entries of ``cols``
    copied from them (col2im)."""
    launch(_col2im, cols.size, cols, first, dx5, g.kernel, g.stride, g.dilation, g.pad, g.out)


def _chunk_images(g, width, itemsize, batch):
    """How many images per im2col chunk, whose rows are ``width`` values wide: a
    chunk's columns about ``tuning.CONV_COLUMN_CHUNK_BYTES``, and where the batch
    may split between threads no more than each thread's share of the L3 cache,
    so that every thread's chunk stays in it."""
    chunk_bytes = tuning.CONV_COLUMN_CHUNK_BYTES
    if batch > 1:  # blas.threads() is a call into OpenBLAS: not at batch 1
        share = machine.shared_cache_share(blas.threads())
        if share is not None:
            chunk_bytes = min(chunk_bytes, share)
    return max(1, chunk_bytes // max(1, positions_per_image(g) * width * itemsize))


def columns_times(x5, g, w2, y2, finish=None):
    """y2 = im2col(x5) @ w2 chunk by chunk (y2 is (N*P, OC)), or where given
    ``finish(block, start, stop)`` with each chunk's product, the values of
    rows start..stop-1 (see :func:`_finisher`)."""
    batch, (patch, out_ch) = x5.shape[0], w2.shape
    positions = positions_per_image(g)
    # with an epilogue, its block of products stays in cache too (mnist_cnn's first
    # layer: 9 taps, 32 channels)
    width = patch if finish is None else max(patch, out_ch)
    chunk = _chunk_images(g, width, x5.itemsize, batch)
    patches = window_patches(x5, g)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), x5.dtype)
        if finish is not None:
            block = np.empty((cols.shape[0], out_ch), x5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            fill_columns(patches, first, cols[:rows])
            start = first * positions
            target = y2[start:start + rows] if finish is None else block[:rows]
            np.matmul(cols[:rows], w2, out=target)
            if finish is not None:
                finish(target, start, start + rows)

    # work: the columns written, the outputs written
    in_image_parts(batch, batch * positions * (patch + out_ch), run)


def gradient_to_columns(dy2, w2t, g, dx5):
    """dx5 = col2im(dy2 @ w2t) chunk by chunk; dy2 is (N*P, OC), w2t (OC, taps*C)."""
    batch, patch = dx5.shape[0], w2t.shape[1]
    positions = positions_per_image(g)
    chunk = _chunk_images(g, patch, dx5.itemsize, batch)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), dx5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            np.matmul(dy2[first * positions:first * positions + rows], w2t, out=cols[:rows])
            add_columns(cols[:rows], first, dx5, g)

    # work: the gradients read, the columns written and added up
    in_image_parts(batch, batch * positions * (dy2.shape[1] + patch), run)


def columns_transposed_times(x5, g, dy2, patch):
    """im2col(x5).T @ dy2, summed over batch chunks: (taps*C, OC)."""
    batch = x5.shape[0]
    positions = positions_per_image(g)
    chunk = _chunk_images(g, patch, x5.itemsize, batch)
    patches = window_patches(x5, g)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), x5.dtype)
        total = np.zeros((patch, dy2.shape[1]), x5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            fill_columns(patches, first, cols[:rows])
            total += cols[:rows].T @ dy2[first * positions:first * positions + rows]
        return total

    # work: the columns written, the gradients read
    return sum(in_image_parts(batch, batch * positions * (patch + dy2.shape[1]), run))
