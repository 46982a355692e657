"""The direct convolution: a Numba loop over the output positions that sums
nine window values at a time, with no column matrix.  It serves small
windows (a network's first layer: a few input channels), whose product would
have too few columns for BLAS to run well.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from . import blas, machine, parts, tuning
from .compiling import by_address, njit_cached
from .copying import copy_into
from .windows import JIT_OPTIONS, in_image_parts, padded_reach, positions_per_image

# window values taken in one pass of the direct loop (the nine-value sum of
# _nine_value_products)
PASS_VALUES = 9
# The columns of a DirectLoop's sizes: 3 values each, over (D, H, W)
_PAD, _REACH, _OUT, _STEPS = 0, 3, 6, 9


@njit_cached(fastmath={'contract'}, **JIT_OPTIONS)
def _nine_value_products(images, first_line, end_line, offsets, w9, out, out_size, steps, accumulate):
    """One pass of the direct convolution over output lines first_line..end_line-1
    of the images, line (n*OD + z)*OH + y holding the positions (n, z, y, x):
    position x of line l, row (l - first_line)*OW + x of ``out``, gets (or, with
    ``accumulate``, adds) the sum over k < 9 of ``image[base + offsets[k]] *
    w9[k]``, ``image`` being the row of ``images`` of image n (the first row
    the first line's) and base ``z*steps[0] + y*steps[1] + x*steps[2]``
    (``offsets``: 9 int64 numbers).

    Nine values in one expression keep the partial sums in registers: passes of
    four values, each reading and writing the output row, were much slower.
    """
    od, oh, ow = out_size
    o0, o1, o2, o3, o4, o5, o6, o7, o8 = (offsets[0], offsets[1], offsets[2], offsets[3], offsets[4],
                                          offsets[5], offsets[6], offsets[7], offsets[8])
    out_ch = out.shape[1]
    first_image = first_line // (od * oh)
    for line in range(first_line, end_line):
        image = images[line // (od * oh) - first_image]
        z, y = line % (od * oh) // oh, line % oh
        first_row = (line - first_line) * ow
        for x in range(ow):
            base = z * steps[0] + y * steps[1] + x * steps[2]
            v0 = image[base + o0]
            v1 = image[base + o1]
            v2 = image[base + o2]
            v3 = image[base + o3]
            v4 = image[base + o4]
            v5 = image[base + o5]
            v6 = image[base + o6]
            v7 = image[base + o7]
            v8 = image[base + o8]
            r = first_row + x
            if accumulate:
                for c in range(out_ch):
                    out[r, c] += (v0 * w9[0, c] + v1 * w9[1, c] + v2 * w9[2, c]
                                  + v3 * w9[3, c] + v4 * w9[4, c] + v5 * w9[5, c]
                                  + v6 * w9[6, c] + v7 * w9[7, c] + v8 * w9[8, c])
            else:
                for c in range(out_ch):
                    out[r, c] = (v0 * w9[0, c] + v1 * w9[1, c] + v2 * w9[2, c]
                                 + v3 * w9[3, c] + v4 * w9[4, c] + v5 * w9[5, c]
                                 + v6 * w9[6, c] + v7 * w9[7, c] + v8 * w9[8, c])



def _window_passes(g, image_shape):
    """(offsets, steps) of :func:`window_products` over padded images of shape
    ``image_shape`` (D, H, W, C): the window values' offsets in an image, an
    int64 row of nine per pass (the last pass's missing ones one image size
    on), and the offset steps between output positions along D, H and W."""
    size = math.prod(image_shape)
    step = (image_shape[1] * image_shape[2] * image_shape[3], image_shape[2] * image_shape[3],
            image_shape[3])
    values = [sum(t * d * e for t, d, e in zip(tap, g.dilation, step)) + ch
              for tap in np.ndindex(*g.kernel) for ch in range(image_shape[3])]
    values += [size] * (-len(values) % PASS_VALUES)
    # writeable, as a whole call's compiled code sees it: Numba compiles the
    # loops once more for read-only arrays
    offsets = np.array(values, np.int64).reshape(-1, PASS_VALUES)
    return offsets, tuple(s * e for s, e in zip(g.stride, step))


@njit_cached(**JIT_OPTIONS)
def _window_lines(x5, first_line, end_line, sizes, offsets, weights, out, epilogue, final):
    """Output lines first_line..end_line-1 (see :func:`_nine_value_products`) of
    the direct convolution of x5 (N, D, H, W, C) into their rows of ``out``:
    the images they read copied into the first half of a row of zeros twice
    their size, as padded images, then every pass.  ``sizes`` (see
    :class:`DirectLoop`): the padding before and the padded image's extent
    (D, H, W, what lies beyond it left out), the output's and the steps
    between output positions.  Where the compiled epilogue's template
    ``epilogue`` is not empty, then the epilogue from ``out`` into ``final``."""
    _, size_d, size_h, size_w, channels = x5.shape
    pad = (sizes[_PAD], sizes[_PAD + 1], sizes[_PAD + 2])
    reach = (sizes[_REACH], sizes[_REACH + 1], sizes[_REACH + 2])
    out_size = (sizes[_OUT], sizes[_OUT + 1], sizes[_OUT + 2])
    steps = (sizes[_STEPS], sizes[_STEPS + 1], sizes[_STEPS + 2])
    per_image = out_size[0] * out_size[1]
    first_image, end_image = first_line // per_image, (end_line - 1) // per_image + 1
    # the padding and the second halves stay zeros: only the insides are written
    images = np.zeros((end_image - first_image, 2 * reach[0] * reach[1] * reach[2] * channels), x5.dtype)
    inside_d, inside_h = min(size_d, reach[0] - pad[0]), min(size_h, reach[1] - pad[1])
    inside_w = min(size_w, reach[2] - pad[2])
    for n in range(images.shape[0]):
        image, source = images[n], x5[first_image + n]
        for z in range(inside_d):
            for y in range(inside_h):
                start = (((z + pad[0]) * reach[1] + y + pad[1]) * reach[2] + pad[2]) * channels
                line = source[z, y].reshape(-1)
                for i in range(inside_w * channels):
                    image[start + i] = line[i]
    for k in range(offsets.shape[0]):
        _nine_value_products(images, first_line, end_line, offsets[k], weights[k * 9:(k + 1) * 9], out,
                             out_size, steps, k > 0)
    if epilogue.size:
        parts.run_epilogue(epilogue, out, final)


def _window_chunk(*args):
    """:func:`_window_lines` called from Python (a name of its own: tests count
    the chunks through it)."""
    _window_lines(*args)


def window_products(x5, g, w2, y2, loop, finish=None, epilogue=None):
    """What :func:`columns_times` computes, as a direct loop without columns:
    passes of :func:`_nine_value_products` over the window values nine at a time.
    ``loop``: the :class:`DirectLoop` of the convolution.
    ``epilogue``: a compiled epilogue's template (parts.CompiledEpilogue), which
    the loop runs on each block of rows into y2 (in place of ``finish``).

    Each image is copied (inside zeros where the windows reach into the padding)
    into the first half of a row of zeros twice its size: the last pass reads
    the values it lacks from an offset of one image size, always a zero, so
    that an inf or NaN elsewhere never meets their zero weights.

    Images split between BLAS's threads: as compiled parts (:func:`_direct_part_of`)
    where no ``finish`` of Python's runs on the blocks, else as parts of Python.
    (Run as compiled parts, lines split between two threads, mnist_cnn's first
    layer at batch 1 was slower than on one thread: its short parts took as
    long together as one after the other; PERFORMANCE.md, W4.)
    """
    batch, (patch, out_ch) = x5.shape[0], w2.shape
    sizes, offsets, chunk = loop
    weights = w2
    if patch % PASS_VALUES:
        weights = np.zeros((offsets.size, out_ch), w2.dtype)
        weights[:patch] = w2
    positions, per_image = positions_per_image(g), g.out[0] * g.out[1]
    blocks = finish is not None or epilogue is not None
    if epilogue is None:
        epilogue = parts.NO_EPILOGUE
    # work: each pass writes (or adds to) every output value
    work = batch * positions * out_ch * offsets.shape[0]
    if finish is None and _in_compiled_parts(x5, weights, y2, epilogue, sizes, offsets, chunk, work):
        return

    def run(lo, hi):
        if blocks:
            block = np.empty((min(chunk, hi - lo) * positions, out_ch), x5.dtype)
        for first in range(lo, hi, chunk):
            count = min(chunk, hi - first)
            start, stop = first * positions, (first + count) * positions
            target = block[:stop - start] if blocks else y2[start:stop]
            _window_chunk(x5, first * per_image, (first + count) * per_image, sizes, offsets, weights,
                          target, epilogue, y2[start:stop] if finish is None else target)
            if finish is not None:
                finish(target, start, stop)

    in_image_parts(batch, work, run)


def _in_compiled_parts(x5, weights, y2, epilogue, sizes, offsets, chunk, work):
    """:func:`window_products`'s images split between BLAS's threads as compiled
    parts, one per thread where each gets ``tuning.PARTS_MIN_WORK`` of ``work``
    at least; False, running nothing, where that is one part (as where the
    pool cannot run parts: no threads) or an array is not C-contiguous."""
    batch = x5.shape[0]
    count = machine.part_count(work, blas.threads(), tuning.PARTS_MIN_WORK, batch)
    if count < 2 or not all(a.flags.c_contiguous for a in (x5, weights, y2, epilogue, sizes, offsets)):
        return False
    per = -(-batch // count)
    descriptors = _direct_descriptors(x5, sizes, offsets, weights, y2, epilogue, per, chunk)
    parts.run(direct_parts[x5.itemsize], descriptors)
    return True


# The columns of a part's descriptor row (see _direct_descriptors): the
# arrays' addresses and sizes, its images and their chunk
(_P_X, _P_BATCH, _P_DEPTH, _P_HEIGHT, _P_WIDTH, _P_CHANNELS, _P_SIZES, _P_OFFSETS, _P_PASSES,
 _P_WEIGHTS, _P_OUT_CH, _P_Y, _P_EPILOGUE, _P_EPILOGUE_SIZE, _P_FIRST, _P_END, _P_CHUNK) = range(17)
_P_COLUMNS = 17


@njit_cached(**JIT_OPTIONS)
def _direct_descriptors(x5, sizes, offsets, weights, y2, epilogue, per, chunk):
    """The descriptors of :func:`_direct_part_of`: images ``per`` a part, as many
    parts as the batch fills, each ``chunk`` images at a time."""
    batch = x5.shape[0]
    count = -(-batch // per)
    d = np.empty((count, _P_COLUMNS), np.int64)
    for i in range(count):
        row = d[i]
        row[_P_X], row[_P_BATCH] = x5.ctypes.data, batch
        row[_P_DEPTH], row[_P_HEIGHT], row[_P_WIDTH], row[_P_CHANNELS] = x5.shape[1], x5.shape[2], \
            x5.shape[3], x5.shape[4]
        row[_P_SIZES], row[_P_OFFSETS], row[_P_PASSES] = sizes.ctypes.data, offsets.ctypes.data, offsets.shape[0]
        row[_P_WEIGHTS], row[_P_OUT_CH], row[_P_Y] = weights.ctypes.data, weights.shape[1], y2.ctypes.data
        row[_P_EPILOGUE], row[_P_EPILOGUE_SIZE] = epilogue.ctypes.data, epilogue.size
        row[_P_FIRST], row[_P_END], row[_P_CHUNK] = i * per, min(batch, (i + 1) * per), chunk
    return d


# the loop the parts run, through its address (compiled once, not inside each part)
_lines_by_address = by_address(_window_lines)


@njit_cached(**JIT_OPTIONS)
def _direct_part_of(d, dtype):
    """:func:`window_products`'s images d[_P_FIRST]..d[_P_END]-1 (see
    :func:`_direct_descriptors`), its arrays of ``dtype``, chunk by chunk: each
    chunk's block then through the epilogue into y2, where d has one."""
    batch, out_ch = d[_P_BATCH], d[_P_OUT_CH]
    x5 = parts.array_at(d[_P_X], (batch, d[_P_DEPTH], d[_P_HEIGHT], d[_P_WIDTH], d[_P_CHANNELS]), dtype)
    sizes = parts.array_at(d[_P_SIZES], _STEPS + 3, np.int64)
    offsets = parts.array_at(d[_P_OFFSETS], (d[_P_PASSES], PASS_VALUES), np.int64)
    weights = parts.array_at(d[_P_WEIGHTS], (d[_P_PASSES] * PASS_VALUES, out_ch), dtype)
    epilogue = parts.array_at(d[_P_EPILOGUE], d[_P_EPILOGUE_SIZE], np.int64)
    per_image = sizes[_OUT] * sizes[_OUT + 1]
    positions = per_image * sizes[_OUT + 2]
    y2 = parts.array_at(d[_P_Y], (batch * positions, out_ch), dtype)
    first, end, chunk = d[_P_FIRST], d[_P_END], d[_P_CHUNK]
    block = np.empty((min(chunk, end - first) * positions if epilogue.size else 0, out_ch), dtype)
    for image in range(first, end, chunk):
        count = min(chunk, end - image)
        start, stop = image * positions, (image + count) * positions
        target = block[:stop - start] if epilogue.size else y2[start:stop]
        _lines_by_address(x5, image * per_image, (image + count) * per_image, sizes, offsets, weights,
                          target, epilogue, y2[start:stop])


def _direct_part_float32(d):
    """:func:`_direct_part_of` of float32 arrays (a part of its own for each
    type, as Winograd's)."""
    _direct_part_of(d, np.float32)


def _direct_part_float64(d):
    """:func:`_direct_part_of` of float64 arrays."""
    _direct_part_of(d, np.float64)


# the compiled part of each type, by its item size
direct_parts = {4: parts.compiled_part(_direct_part_float32),
                8: parts.compiled_part(_direct_part_float64)}


class DirectLoop(NamedTuple):
    """The arguments of the direct loop of one convolution (see
    :func:`direct_loop`): ``sizes``, :func:`_window_lines`'s int64 array of
    sizes, read by the named columns _PAD, _REACH, _OUT and _STEPS;
    ``offsets``, :func:`_window_passes`'s; ``chunk``, images per chunk."""
    sizes: np.ndarray
    offsets: np.ndarray
    chunk: int


def direct_loop(g, channels, out_ch, itemsize):
    """The :class:`DirectLoop` of the direct convolution of geometry ``g`` from
    ``channels`` to ``out_ch`` channels of ``itemsize`` bytes, an output block
    per chunk of images of about ``tuning.CONV_DIRECT_CHUNK_BYTES``."""
    return _direct_loop(g, channels, out_ch, itemsize, tuning.CONV_DIRECT_CHUNK_BYTES)


# Cached: worked out in Python these cost more than the loop over a small image.
@functools.lru_cache(maxsize=256)
def _direct_loop(g, channels, out_ch, itemsize, chunk_bytes):
    reach = padded_reach(g) or g.size
    offsets, steps = _window_passes(g, reach + (channels,))
    sizes = np.array(g.pad + reach + g.out + steps, np.int64)  # writeable: see _window_passes
    return DirectLoop(sizes, offsets, max(1, chunk_bytes // (positions_per_image(g) * out_ch * itemsize)))


@njit_cached(**JIT_OPTIONS)
def direct_forward(x, w, sizes, offsets):
    """conv_forward's direct loop over x (N, H, W, C) with w (KH, KW, C, OC),
    for the ``sizes`` and ``offsets`` of its :class:`DirectLoop`: (N, OH, OW, OC).
    (One pass over every image: a whole call's batches are small.)"""
    batch, out_ch = x.shape[0], w.shape[3]
    patch = w.shape[0] * w.shape[1] * w.shape[2]
    weights = np.zeros((offsets.size, out_ch), x.dtype)
    copy_into(weights[:patch], w.reshape(patch, out_ch))
    out_h, out_w = sizes[_OUT + 1], sizes[_OUT + 2]
    y = np.empty((batch, out_h, out_w, out_ch), x.dtype)
    y2 = y.reshape(-1, out_ch)
    # np.int64(0), not a literal 0, which would compile _window_lines once more
    _window_lines(x.reshape(batch, 1, x.shape[1], x.shape[2], x.shape[3]), np.int64(0), batch * out_h, sizes,
                  offsets, weights, y2, np.zeros(0, np.int64), y2)
    return y
