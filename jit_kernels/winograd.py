"""Winograd's F(4x4, 3x3) convolution: a 3x3 convolution with stride 1 as
Numba loops transforming blocks of inputs and of products around 36 matrix
products by jit_kernels.packed's micro-kernel (OpenBLAS packs both operands
of these small products on each call), chunk by chunk of bands (4 output rows
of an image), or split between BLAS's threads as compiled parts
(:mod:`parts`) that may also pool the outputs and run a compiled epilogue.
The parts, :func:`winograd_forward` and :func:`winograd_serial` call the
transforms, the products, the pooling and the parts' descriptors through their
addresses (compiling.by_address): each compiles once, not again inside every
function calling it.
"""

import collections
import weakref
from typing import NamedTuple

import numpy as np

from . import blas, packed, parts, tuning
from .columns import columns_times
from .compiling import by_address, njit_cached
from .copying import copy_into
from .pool import avg_pool_serial, block_finisher, max_pool_serial
from .windows import JIT_OPTIONS, in_image_parts, zero_padded

# a pooling's mode in a part's descriptor and in winograd_forward
POOL_MODES = {None: 0, 'max': 1, 'avg': 2}
_MAX = POOL_MODES['max']

# The columns of a part's descriptor row (see _winograd_descriptors), an int64
# each: the addresses and sizes of its arrays, its bands and what it does
# besides the products (see BandWork); then what the part writes: 1 where its
# bands' inputs hold an inf or a NaN
(_D_ROWS, _D_ROW_COUNT, _D_CHANNELS, _D_WIDTH, _D_TILES_H, _D_TILES_W, _D_FIRST_BAND, _D_END_BAND,
 _D_CHUNK, _D_U, _D_OUT_CH, _D_OUT, _D_OUT_H, _D_OUT_W, _D_SCRATCH, _D_SCRATCH_SIZE, _D_POOL_MODE,
 _D_POOLED, _D_POOLED_ROWS, _D_EPILOGUE, _D_EPILOGUE_SIZE, _D_FINAL, _D_POOL_FIRST,
 _D_NOT_FINITE) = range(24)
_D_COLUMNS = 24


# Winograd F(4x4, 3x3) (Lavin and Gray, 2016): a 4x4 block of outputs of a 3x3
# cross-correlation is A^T [(G w G^T) * (B^T d B)] A, d the 6x6 block of inputs
# under it.  B^T, G and A^T, with the points 0, 1, -1, 2, -2 and infinity:
#   B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
#          [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
#   A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
#          [0, 1, -1, 8, -8, 1]]
_WINOGRAD_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])


@njit_cached(fastmath={'contract'}, **JIT_OPTIONS)
def _winograd_kernel_transform(w, g, u):
    """u[6*xi + nu] = (G w G^T)[xi, nu] of w (3, 3, K), K = C*OC, over the K axis;
    ``g`` is G (6, 3) in w's type.  Each pass one loop over K per row of its
    result, on 2-D arrays: the same sums written as loops over (xi, kx) of a
    3-D array compiled to eight times the code."""
    along_rows = np.empty((18, w.shape[2]), w.dtype)  # row 3*xi + kx: (G w)[xi, kx]
    for row in range(18):
        xi, kx = row // 3, row % 3
        g0, g1, g2 = g[xi, 0], g[xi, 1], g[xi, 2]
        for k in range(w.shape[2]):
            along_rows[row, k] = g0 * w[0, kx, k] + g1 * w[1, kx, k] + g2 * w[2, kx, k]
    for row in range(36):
        xi, nu = row // 6, row % 6
        g0, g1, g2 = g[nu, 0], g[nu, 1], g[nu, 2]
        for k in range(w.shape[2]):
            u[row, k] = (g0 * along_rows[3 * xi, k] + g1 * along_rows[3 * xi + 1, k]
                         + g2 * along_rows[3 * xi + 2, k])


@njit_cached(**JIT_OPTIONS)
def _band_row(band, tiles_h, height, width):
    """The first row (position) of a band (see :func:`_winograd_inputs`) in
    images of ``height`` x ``width`` positions: outputs, or Winograd's padded
    inputs; of band N*tiles_h, the number of rows."""
    return ((band // tiles_h) * height + 4 * (band % tiles_h)) * width


# The transforms multiply by 2, 4 and 8 as sums: a product with an integer
# constant would be computed in float64 (Numba promotes float32 * int64), which
# in the loops below meant conversions and half-width vectors.  Plain calls,
# which LLVM inlines into those loops: inlined by Numba (inline='always'), their
# code was typed and lowered again at every call site.
@njit_cached(**JIT_OPTIONS)
def _twice(x):
    return x + x


@njit_cached(**JIT_OPTIONS)
def _b_transposed(d0, d1, d2, d3, d4, d5):
    """B^T times the six values (d0, ..., d5), in their own type."""
    return (_twice(_twice(d0 - d2)) - d2 + d4, d3 + d4 - _twice(_twice(d1 + d2)),
            _twice(_twice(d1 - d2)) - d3 + d4, _twice(d3 - d1) - d2 + d4,
            _twice(d1 - d3) - d2 + d4, _twice(_twice(d1 - d3)) - d3 + d5)


@njit_cached(**JIT_OPTIONS)
def _a_transposed(m0, m1, m2, m3, m4, m5):
    """A^T times the six values (m0, ..., m5), in their own type."""
    plus, minus = m1 + m2, m1 - m2
    plus_far, minus_far = m3 + m4, m3 - m4
    return (m0 + plus + plus_far, minus + _twice(minus_far), plus + _twice(_twice(plus_far)),
            minus + _twice(_twice(_twice(minus_far))) + m5)


@njit_cached(fastmath={'contract'}, **JIT_OPTIONS)
def _winograd_inputs(rows, width, tiles_h, tiles_w, first_band, v, scratch):
    """B^T d B of every 6x6 block d of inputs under a 4x4 block of outputs.

    ``rows`` (N*H*W, C) are images of H = 4*tiles_h + 2 rows of ``width`` =
    4*tiles_w + 2 pixels.  Band b holds the tiles_w blocks of image
    b // tiles_h whose outputs start at row 4*(b % tiles_h); block t of bands
    first_band, ... (t = (b - first_band)*tiles_w + tx) starts at pixel 4*tx.
    Row (6*xi + nu)*T + t of ``v`` (36*T, C) gets element (xi, nu) of block t's
    transform; ``scratch`` is (36, C).

    The two passes (B^T along the pixels of each of the 6 rows, then along the
    rows) are loops over the channels, which vectorise; both in one loop with
    all 36 values compiled to scalar code, which was slower.  No views are made in
    the loops: each costs reference counting.
    """
    channels = rows.shape[1]
    blocks = v.shape[0] // 36
    for t in range(blocks):
        top = _band_row(first_band + t // tiles_w, tiles_h, 4 * tiles_h + 2, width) + 4 * (t % tiles_w)
        for i in range(6):  # B^T along the pixels of row i: scratch[6*nu + i]
            r = top + i * width
            for c in range(channels):
                e0, e1, e2, e3, e4, e5 = _b_transposed(rows[r, c], rows[r + 1, c], rows[r + 2, c],
                                                       rows[r + 3, c], rows[r + 4, c], rows[r + 5, c])
                scratch[i, c], scratch[6 + i, c], scratch[12 + i, c] = e0, e1, e2
                scratch[18 + i, c], scratch[24 + i, c], scratch[30 + i, c] = e3, e4, e5
        for nu in range(6):  # B^T along the rows
            s = 6 * nu
            for c in range(channels):
                e0, e1, e2, e3, e4, e5 = _b_transposed(scratch[s, c], scratch[s + 1, c], scratch[s + 2, c],
                                                       scratch[s + 3, c], scratch[s + 4, c], scratch[s + 5, c])
                v[nu * blocks + t, c], v[(6 + nu) * blocks + t, c] = e0, e1
                v[(12 + nu) * blocks + t, c], v[(18 + nu) * blocks + t, c] = e2, e3
                v[(24 + nu) * blocks + t, c], v[(30 + nu) * blocks + t, c] = e4, e5


# 'reassoc' lets the sum vectorise; without 'nnan' and 'ninf', x - x stays a NaN
# for an inf or NaN x (and is 0 otherwise)
@njit_cached(fastmath={'reassoc', 'contract'}, **JIT_OPTIONS)
def _all_finite(rows):
    """Whether the C-contiguous (n, C) ``rows`` hold no inf or NaN."""
    values = rows.reshape(-1)
    total = np.zeros(1, rows.dtype)[0]
    for i in range(values.size):
        total += values[i] - values[i]
    return total == 0


class _NonFiniteInput(Exception):
    """An inf or NaN among a Winograd convolution's inputs."""


@njit_cached(fastmath={'contract'}, **JIT_OPTIONS)
def _winograd_outputs(m, tiles_h, tiles_w, out_h, out_w, first_band, out, scratch):
    """A^T M A of every block's 6x6 products M into its 4x4 block of outputs.

    ``m`` (36*T, OC) holds element (xi, nu) of block t in row (6*xi + nu)*T + t,
    for the blocks of bands first_band, ... (see :func:`_winograd_inputs`).
    ``out`` (rows, OC) gets their output positions from its first row on (the
    first band's first position); those past out_h or out_w are left out.
    ``scratch`` is (24, OC).
    """
    out_ch = m.shape[1]
    blocks = m.shape[0] // 36
    origin = _band_row(first_band, tiles_h, out_h, out_w)
    for t in range(blocks):
        band, tx = first_band + t // tiles_w, t % tiles_w
        for nu in range(6):  # A^T along xi: scratch[6*a + nu] for a < 4
            for c in range(out_ch):
                y0, y1, y2, y3 = _a_transposed(m[nu * blocks + t, c], m[(6 + nu) * blocks + t, c],
                                               m[(12 + nu) * blocks + t, c], m[(18 + nu) * blocks + t, c],
                                               m[(24 + nu) * blocks + t, c], m[(30 + nu) * blocks + t, c])
                scratch[nu, c], scratch[6 + nu, c], scratch[12 + nu, c], scratch[18 + nu, c] = y0, y1, y2, y3
        top = _band_row(band, tiles_h, out_h, out_w) - origin + 4 * tx
        columns = min(4, out_w - 4 * tx)
        for a in range(min(4, out_h - 4 * (band % tiles_h))):  # A^T along nu
            r, s = top + a * out_w, 6 * a
            if columns == 4:
                for c in range(out_ch):
                    y0, y1, y2, y3 = _a_transposed(scratch[s, c], scratch[s + 1, c], scratch[s + 2, c],
                                                   scratch[s + 3, c], scratch[s + 4, c], scratch[s + 5, c])
                    out[r, c], out[r + 1, c], out[r + 2, c], out[r + 3, c] = y0, y1, y2, y3
            else:  # a block past the right edge: its first 1 to 3 columns
                for c in range(out_ch):
                    y = _a_transposed(scratch[s, c], scratch[s + 1, c], scratch[s + 2, c],
                                      scratch[s + 3, c], scratch[s + 4, c], scratch[s + 5, c])
                    for j in range(columns):
                        out[r + j, c] = y[j]


def winograd_products(x5, g, w, y2, finish=None, remember=True, band_work=None):
    """What :func:`columns_times` computes for a 3x3 kernel ``w`` (3, 3, C, OC)
    with stride 1, as Winograd F(4x4, 3x3) over bands of 4 output rows of an
    image: chunk by chunk of bands, the inputs' transforms, 36 products (one
    per element of a 6x6 transform, over every block of the chunk at once)
    and the products' transforms back.  ``remember``: keep the kernel's
    transform for the next call (see :func:`_winograd_kernels`).
    ``band_work``: the :class:`BandWork` (a pooling, a compiled epilogue)
    that the parts of :func:`winograd_in_parts` run themselves.  Where those
    parts do not run, ``finish`` does (given with an epilogue before the
    pooling), or a pooling finisher of its own.  Returns whether those parts
    ran."""
    batch, channels, out_ch = x5.shape[0], x5.shape[-1], w.shape[-1]
    out_h, out_w = g.out[1], g.out[2]
    tiles_h, tiles_w = -(-out_h // 4), -(-out_w // 4)
    height, width = 4 * tiles_h + 2, 4 * tiles_w + 2
    rows = zero_padded(x5, g, (1, height, width)).reshape(-1, channels)
    u = _winograd_kernels(w, remember)
    bands = batch * tiles_h
    chunk = winograd_chunk_bands(tiles_w, channels, out_ch, x5.itemsize)
    small = bands < 2 * chunk
    # Compiled parts, with no Python between chunks to hold the GIL, wherever
    # they do all there is to do; a finisher of Python's after them where the
    # bands make fewer than two chunks, else chunk by chunk below.
    if small or finish is None or band_work is not None:
        target = y2 if finish is None and y2 is not None else np.empty((batch * out_h * out_w, out_ch),
                                                                       x5.dtype)
        if winograd_in_parts(rows, width, tiles_h, tiles_w, u, target, out_h, out_w,
                             band_work or NO_BAND_WORK, chunk):
            if finish is not None and band_work is None:
                finish(target, 0, target.shape[0])
            return True
        # an inf or a NaN in the inputs: im2col, pooled block by block
        if band_work is not None and finish is None:
            pooled = band_work.pooled.reshape(batch, out_h // 2, out_w // 2, out_ch)
            finish = block_finisher(g, out_ch, None, None, band_work.pool, pooled)
        columns_times(x5, g, w.reshape(-1, out_ch), y2, finish)
        return False

    def run(lo, hi):
        most = min(chunk, hi - lo) * tiles_w
        scratch = np.empty(_winograd_scratch_size(most, channels, out_ch), x5.dtype)
        if finish is not None:
            block = np.empty((min(chunk, hi - lo) * 4 * out_w, out_ch), x5.dtype)
        for first in range(lo, hi, chunk):
            end = min(hi, first + chunk)
            top = _band_row(first, tiles_h, height, width)
            bottom = _band_row(end - 1, tiles_h, height, width) + 6 * width
            if not _all_finite(rows[top:bottom]):
                raise _NonFiniteInput
            start, stop = _band_row(first, tiles_h, out_h, out_w), _band_row(end, tiles_h, out_h, out_w)
            target = y2[start:stop] if finish is None else block[:stop - start]
            _winograd_chunk(rows, width, tiles_h, tiles_w, first, end, u, target, out_h, out_w, scratch)
            if finish is not None:
                finish(target, start, stop)

    try:
        # work: the transformed inputs and products written
        in_image_parts(bands, bands * tiles_w * 36 * (channels + out_ch), run)
    except _NonFiniteInput:  # rewrites every output
        columns_times(x5, g, w.reshape(-1, out_ch), y2, finish)
    return False


def winograd_chunk_bands(tiles_w, channels, out_ch, itemsize):
    """Bands per chunk of :func:`_winograd_bands`: its transformed inputs and
    products about ``tuning.CONV_WINOGRAD_CHUNK_BYTES``, each product at least
    ``tuning.CONV_WINOGRAD_MIN_ROWS`` rows."""
    return max(-(-tuning.CONV_WINOGRAD_MIN_ROWS // tiles_w),
               tuning.CONV_WINOGRAD_CHUNK_BYTES // (36 * tiles_w * (channels + out_ch) * itemsize))


def _winograd_chunk(*args):
    """:func:`_winograd_bands` of one chunk, called from Python (a name of its own,
    which the compiled parts do not read: tests count the chunks through it)."""
    _winograd_bands(*args)


@njit_cached(inline='always')
def _winograd_scratch_size(blocks, channels, out_ch):
    """Items of :func:`_winograd_bands`'s scratch for ``blocks`` blocks."""
    return 36 * blocks * (channels + out_ch) + 36 * channels + 24 * out_ch


# the steps of _winograd_bands, through their addresses (see the module's docstring)
_inputs_by_address = by_address(_winograd_inputs)
_matmul_each_by_address = by_address(packed.matmul_each)
_outputs_by_address = by_address(_winograd_outputs)


@njit_cached(**JIT_OPTIONS)
def _winograd_bands(rows, width, tiles_h, tiles_w, first, end, u, out, out_h, out_w, scratch):
    """Winograd's three steps for bands first..end-1 (see :func:`_winograd_inputs`)
    of the padded inputs ``rows``, with the kernels' transforms ``u`` (36, C,
    OC): their outputs into ``out`` from its first row on (the first band's
    first position).  ``scratch`` holds :func:`_winograd_scratch_size` items."""
    channels, out_ch = rows.shape[1], u.shape[2]
    blocks = (end - first) * tiles_w
    v_size, m_size = 36 * blocks * channels, 36 * blocks * out_ch
    v = scratch[:v_size].reshape(36, blocks, channels)
    m = scratch[v_size:v_size + m_size].reshape(36, blocks, out_ch)
    in_scratch = scratch[v_size + m_size:v_size + m_size + 36 * channels].reshape(36, channels)
    out_scratch = scratch[v_size + m_size + 36 * channels:
                          v_size + m_size + 36 * channels + 24 * out_ch].reshape(24, out_ch)
    _inputs_by_address(rows, width, tiles_h, tiles_w, first, v.reshape(36 * blocks, channels), in_scratch)
    _matmul_each_by_address(v, u, m)
    _outputs_by_address(m.reshape(36 * blocks, out_ch), tiles_h, tiles_w, out_h, out_w, first, out,
                        out_scratch)


@njit_cached(**JIT_OPTIONS)
def _pool_bands(out, first, end, tiles_h, out_h, out_w, mode, pooled):
    """Pool the outputs of bands first..end-1, in ``out`` from the first band's
    first position on, over 2x2 windows with stride 2 ('valid': an odd last
    row or column left out) into their rows of ``pooled`` (positions of
    (N, OH // 2, OW // 2), channels), by jit_kernels.pool's kernels: the
    maximum where ``mode`` is POOL_MODES['max'], else the mean."""
    channels, pool_w = out.shape[1], out_w // 2
    origin = _band_row(first, tiles_h, out_h, out_w)
    for band in range(first, end):
        n, top = band // tiles_h, 4 * (band % tiles_h)
        lines = min(top + 4, out_h) // 2 - top // 2  # the band's pooled lines
        if lines <= 0:
            continue
        start = (n * out_h + top) * out_w - origin
        source = out[start:start + 2 * lines * out_w].reshape(1, 1, 2 * lines, out_w, channels)
        first_pooled = (n * (out_h // 2) + top // 2) * pool_w
        target = pooled[first_pooled:first_pooled + lines * pool_w].reshape(1, 1, lines, pool_w, channels)
        if mode == _MAX:
            max_pool_serial(source, target, (1, 2, 2), (1, 2, 2), (0, 0, 0))
        else:
            avg_pool_serial(source, target, (1, 2, 2), (1, 2, 2), (0, 0, 0))


# what the compiled parts run, through their addresses
_bands_by_address = by_address(_winograd_bands)
_pool_bands_by_address = by_address(_pool_bands)


@njit_cached(**JIT_OPTIONS)
def _winograd_descriptors(rows, width, tiles_h, tiles_w, u, out, out_h, out_w, threads, chunk, pool_mode,
                          pooled, epilogue, final, pool_first):
    """(descriptors, scratch) of :func:`_winograd_part_of`: the bands of ``rows``
    in parts as even as whole bands allow, one per thread of ``threads`` where
    each gets ``tuning.PARTS_MIN_WORK`` elements of transformed inputs and
    products at least, else fewer; each part ``chunk`` bands at a time with
    its row of the scratch.  Each part checks its own bands' inputs for an inf
    or a NaN (:func:`any_not_finite` after the run), where a check of all of
    them here ran on one thread before the parts."""
    bands = rows.shape[0] // ((4 * tiles_h + 2) * width) * tiles_h
    count = parts.part_count(bands * tiles_w * 36 * (rows.shape[1] + u.shape[2]), threads,
                             tuning.PARTS_MIN_WORK, bands)
    per = -(-bands // count)
    count = -(-bands // per)
    chunk = min(per, chunk)
    scratch = np.empty((count, _winograd_scratch_size(chunk * tiles_w, rows.shape[1], u.shape[2])),
                       rows.dtype)
    d = np.empty((count, _D_COLUMNS), np.int64)
    for i in range(count):
        row = d[i]
        row[_D_ROWS], row[_D_ROW_COUNT], row[_D_CHANNELS] = rows.ctypes.data, rows.shape[0], rows.shape[1]
        row[_D_WIDTH], row[_D_TILES_H], row[_D_TILES_W] = width, tiles_h, tiles_w
        row[_D_FIRST_BAND], row[_D_END_BAND], row[_D_CHUNK] = i * per, min(bands, (i + 1) * per), chunk
        row[_D_U], row[_D_OUT_CH] = u.ctypes.data, u.shape[2]
        row[_D_OUT], row[_D_OUT_H], row[_D_OUT_W] = out.ctypes.data, out_h, out_w
        row[_D_SCRATCH], row[_D_SCRATCH_SIZE] = scratch[i].ctypes.data, scratch.shape[1]
        row[_D_POOL_MODE], row[_D_POOLED], row[_D_POOLED_ROWS] = pool_mode, pooled.ctypes.data, pooled.shape[0]
        row[_D_EPILOGUE], row[_D_EPILOGUE_SIZE] = epilogue.ctypes.data, epilogue.size
        row[_D_FINAL], row[_D_POOL_FIRST] = final.ctypes.data, pool_first
        row[_D_NOT_FINITE] = 0
    return d, scratch


@njit_cached(**JIT_OPTIONS)
def any_not_finite(descriptors):
    """Whether a part of ``descriptors`` (run) found an inf or a NaN in its
    bands' inputs, and so left its outputs unwritten."""
    found = False
    for i in range(descriptors.shape[0]):
        found |= descriptors[i, _D_NOT_FINITE] != 0
    return found


@njit_cached(**JIT_OPTIONS)
def _winograd_part_of(d, dtype):
    """:func:`_winograd_bands` of the descriptor ``d`` (see
    :func:`_winograd_descriptors`), its arrays of ``dtype``, chunk by chunk
    of its bands, each chunk's outputs then run through the epilogue and
    pooled as ``d`` says.  (One function, not one per chunk called from
    here: Numba compiles a caller with all its callees' code again.)  Where
    its bands' inputs hold an inf or a NaN, it writes nothing but
    d[_D_NOT_FINITE] = 1."""
    channels, out_ch = d[_D_CHANNELS], d[_D_OUT_CH]
    rows = parts.array_at(d[_D_ROWS], (d[_D_ROW_COUNT], channels), dtype)
    width, tiles_h, tiles_w = d[_D_WIDTH], d[_D_TILES_H], d[_D_TILES_W]
    if d[_D_END_BAND] > d[_D_FIRST_BAND]:
        top = _band_row(d[_D_FIRST_BAND], tiles_h, 4 * tiles_h + 2, width)
        bottom = _band_row(d[_D_END_BAND] - 1, tiles_h, 4 * tiles_h + 2, width) + 6 * width
        if not _all_finite(rows[top:bottom]):
            d[_D_NOT_FINITE] = 1
            return
    u = parts.array_at(d[_D_U], (36, channels, out_ch), dtype)
    out_h, out_w = d[_D_OUT_H], d[_D_OUT_W]
    scratch = parts.array_at(d[_D_SCRATCH], (d[_D_SCRATCH_SIZE],), dtype)
    epilogue = parts.array_at(d[_D_EPILOGUE], (d[_D_EPILOGUE_SIZE],), np.int64)
    for first in range(d[_D_FIRST_BAND], d[_D_END_BAND], d[_D_CHUNK]):
        end = min(d[_D_END_BAND], first + d[_D_CHUNK])
        first_row, end_row = _band_row(first, tiles_h, out_h, out_w), _band_row(end, tiles_h, out_h, out_w)
        out = parts.array_at(d[_D_OUT], (end_row, out_ch), dtype)[first_row:]
        _bands_by_address(rows, width, tiles_h, tiles_w, first, end, u, out, out_h, out_w, scratch)
        if epilogue.size and not d[_D_POOL_FIRST]:  # the epilogue, on these bands' outputs
            done = parts.array_at(d[_D_FINAL], (end_row, out_ch), dtype)[first_row:]
            parts.run_epilogue(epilogue, out, done)
            out = done
        if d[_D_POOL_MODE]:
            pooled = parts.array_at(d[_D_POOLED], (d[_D_POOLED_ROWS], out_ch), dtype)
            _pool_bands_by_address(out, first, end, tiles_h, out_h, out_w, d[_D_POOL_MODE], pooled)
            if epilogue.size and d[_D_POOL_FIRST]:  # the epilogue, on the pooled rows of these bands
                lo, hi = _pooled_row(first, tiles_h, out_h, out_w), _pooled_row(end, tiles_h, out_h, out_w)
                parts.run_epilogue(epilogue, pooled[lo:hi],
                                   parts.array_at(d[_D_FINAL], (d[_D_POOLED_ROWS], out_ch), dtype)[lo:hi])


@njit_cached(inline='always')
def _pooled_row(band, tiles_h, out_h, out_w):
    """The first row of :func:`_pool_bands`'s pooled rows that ``band`` writes."""
    return ((band // tiles_h) * (out_h // 2) + min(2 * (band % tiles_h), out_h // 2)) * (out_w // 2)


def _winograd_part_float32(d):
    """:func:`_winograd_part_of` of float32 arrays: a part of its own for each
    type (a callback dispatching on the type compiled both types' loops, a
    long wait in a cold process's first call)."""
    _winograd_part_of(d, np.float32)


def _winograd_part_float64(d):
    """:func:`_winograd_part_of` of float64 arrays."""
    _winograd_part_of(d, np.float64)


# the compiled part of each type, by its item size
winograd_parts = {4: parts.compiled_part(_winograd_part_float32),
                  8: parts.compiled_part(_winograd_part_float64)}


class BandWork(NamedTuple):
    """What the parts of :func:`winograd_in_parts` do besides the products:
    pool their bands' outputs over 2x2 windows with stride 2 by ``pool``
    ('max', 'avg' or None) into the rows (N*OH//2*OW//2, OC) of ``pooled``,
    while they are in the core's cache; and where ``epilogue`` (a compiled
    epilogue's template) is not empty, run it into ``final``: on the pooled
    rows (``final`` of ``pooled``'s shape) where ``pool_first``, else on the
    bands' outputs (``final`` of the outputs' shape), which the pooling, if
    any, then reads."""
    pool: str | None = None
    pooled: np.ndarray | None = None
    epilogue: np.ndarray = parts.NO_EPILOGUE
    final: np.ndarray | None = None
    pool_first: bool = True


NO_BAND_WORK = BandWork()


def winograd_in_parts(rows, width, tiles_h, tiles_w, u, out, out_h, out_w, work=NO_BAND_WORK, chunk=None):
    """:func:`_winograd_bands` over every band, the bands split between BLAS's
    threads with no Python between the steps (:mod:`parts`), and the
    :class:`BandWork` ``work`` done in the same parts.  Each part runs
    ``chunk`` bands at a time (all of its bands at once where None).

    False, its outputs not all written, where ``rows`` hold an inf or a NaN: it
    would reach every output of the blocks that read it (inf - inf in the
    transforms), so such inputs go through im2col, which writes them all."""
    pool, pooled, epilogue, final, pool_first = work
    if pooled is None:
        pooled = out[:0]
    if final is None:
        final = pooled[:0]
    if not (rows.flags.c_contiguous and u.flags.c_contiguous and out.flags.c_contiguous
            and pooled.flags.c_contiguous and final.flags.c_contiguous):
        raise ValueError("winograd_in_parts: the parts read and write whole C-contiguous arrays")
    if epilogue.size and not pool_first and final.shape != out.shape:
        raise ValueError("winograd_in_parts: an epilogue before pooling writes an array "
                         f"of the outputs' shape {out.shape}, got {final.shape}")
    if epilogue.size and pool_first and (pool is None or final.shape != pooled.shape):
        raise ValueError("winograd_in_parts: an epilogue after pooling writes an array "
                         f"of the pooled shape {pooled.shape}, got {final.shape}")
    if rows.shape[0] < (4 * tiles_h + 2) * width:
        return True  # no bands
    bands = rows.shape[0] // ((4 * tiles_h + 2) * width) * tiles_h
    # _scratch: what the descriptors point into, held until the parts are done
    descriptors, _scratch = _winograd_descriptors(rows, width, tiles_h, tiles_w, u, out, out_h, out_w,
                                                  max(1, blas.threads()), chunk or bands, POOL_MODES[pool],
                                                  pooled, epilogue, final, pool_first)
    parts.run(winograd_parts[rows.itemsize], descriptors)
    return not any_not_finite(descriptors)


# The last kernels' transforms (see _winograd_kernels), newest last
_kernel_transforms = collections.OrderedDict()


def _winograd_kernels(w, remember=True):
    """G w G^T of the C-contiguous w (3, 3, C, OC) as (36, C, OC).  Where
    ``remember``, the last few are kept (a network's kernels change only between
    training steps, and at batch 1 the transform is a noticeable part of a
    convolution's call), each with a copy of its kernel that the next call compares in full, so
    that a kernel changed in place is never missed, and each until the array
    holding the kernel is freed (a training step's replaced weights), in
    ``tuning.CONV_WINOGRAD_KEPT_BYTES`` at most (the newest always kept)."""
    key = (parts.address(w), w.shape, w.dtype)  # not w.ctypes.data: slow in Python
    known = _kernel_transforms.get(key) if remember else None
    if known is not None and _same_values(known[0], w):
        return known[1]
    u = np.empty((36, w.shape[2] * w.shape[3]), w.dtype)
    _winograd_kernel_transform(w.reshape(3, 3, -1), _WINOGRAD_G.astype(w.dtype), u)
    u = u.reshape(36, w.shape[2], w.shape[3])
    if not remember:
        return u
    _kernel_transforms.pop(key, None)
    kept = w.copy()
    _same_values(kept, w)  # compiled with this call's others, not alone in the next call
    _kernel_transforms[key] = (kept, u)
    owner = w if w.base is None else w.base
    try:
        # freed before its memory can hold another array at the same address
        weakref.finalize(owner, _kernel_transforms.pop, key, None)
    except TypeError:  # memory of an object without weak references: kept until pushed out
        pass
    # a copy to go through: a finalizer (another thread's, or this one's on any
    # release of an array) may drop an entry meanwhile
    entries = list(_kernel_transforms.items())
    held = sum(kept.nbytes + transform.nbytes for _, (kept, transform) in entries)
    for old_key, (kept, transform) in entries[:-1]:  # oldest first; never the newest
        if held <= tuning.CONV_WINOGRAD_KEPT_BYTES:
            break
        _kernel_transforms.pop(old_key, None)
        held -= kept.nbytes + transform.nbytes
    return u


@njit_cached(**JIT_OPTIONS)
def _same_values(a, b):
    """Whether the C-contiguous a and b of one shape hold the same values."""
    x, y = a.reshape(-1), b.reshape(-1)
    differ = False
    for i in range(x.size):  # no early exit: the loop vectorises
        differ |= x[i] != y[i]
    return not differ


# what winograd_forward and winograd_serial call through their addresses: the
# code that Python's callers (_winograd_kernels, winograd_in_parts) run, not a
# copy of it
_kernel_transform_by_address = by_address(_winograd_kernel_transform)
_descriptors_by_address = by_address(_winograd_descriptors)


def kernel_transform(w):
    """The transform (36, C, OC) of the kernel w (3, 3, C, OC) that
    :func:`winograd_serial` reads."""
    w = np.ascontiguousarray(w)
    u = np.empty((36,) + w.shape[2:], w.dtype)
    _winograd_kernel_transform(w.reshape(3, 3, -1), _WINOGRAD_G.astype(w.dtype), u.reshape(36, -1))
    return u


@njit_cached(**JIT_OPTIONS)
def _parts_here(descriptors, x, arrays):
    """Each part of ``descriptors`` on the calling thread, of arrays of x's
    type (x.dtype: one type compiled, where a branch per type compiled both);
    ``arrays``, a tuple of those the descriptors point into, an argument so
    that the caller holds them until the parts are done (Numba frees a
    variable after its last use)."""
    for i in range(descriptors.shape[0]):
        _winograd_part_of(descriptors[i], x.dtype)


_parts_here_by_address = by_address(_parts_here)


@njit_cached(**JIT_OPTIONS)
def winograd_serial(x, u, pool_mode, chunk):
    """(finite, y): :func:`winograd_forward` on the calling thread alone, for
    ``u`` the :func:`kernel_transform` of the kernel; ``finite`` False (and y
    empty) where x holds an inf or a NaN: the caller then takes another
    algorithm.  For code that runs no parts (a plan exported into a library
    of its own)."""
    batch, height, width, channels = x.shape
    out_ch, out_h, out_w = u.shape[2], height - 2, width - 2
    if out_h % 4 or out_w % 4 or out_h < 4 or out_w < 4 or u.shape[1] != channels:
        raise ValueError("winograd_serial: the outputs are not whole 4x4 blocks")
    out = np.empty((batch * out_h * out_w, out_ch), x.dtype)
    pooled = np.empty((batch * (out_h // 2) * (out_w // 2) if pool_mode else 0, out_ch), x.dtype)
    descriptors, scratch = _descriptors_by_address(
        x.reshape(-1, channels), width, out_h // 4, out_w // 4, u, out, out_h, out_w,
        np.int64(1), chunk, pool_mode, pooled, np.zeros(0, np.int64), pooled[:0], np.bool_(True))
    _parts_here_by_address(descriptors, x, (x, out, pooled, scratch))
    if any_not_finite(descriptors):
        return False, np.empty((0, 0, 0, 0), x.dtype)
    if pool_mode:
        return True, pooled.reshape(batch, out_h // 2, out_w // 2, out_ch)
    return True, out.reshape(batch, out_h, out_w, out_ch)


@njit_cached(**JIT_OPTIONS)
def winograd_forward(x, w, kept, u, part_address, pool_mode, chunk):
    """conv_forward's Winograd parts over x (N, H, W, C) with w (3, 3, C, OC),
    from compiled code (a :class:`WinogradForm`; see
    :func:`winograd_in_parts`): (N, H - 2, W - 2, OC), or with ``pool_mode``
    (a value of POOL_MODES) that pooled over 2x2 windows with stride 2.
    ``kept`` and ``u``, of w's shape and (36, C, OC), hold the kernel that
    ``u`` is the transform of: where w holds other values, u and kept are
    made again.  ``part_address``: that of ``winograd_parts`` of its type;
    ``chunk``: its bands per chunk.  Raises ValueError
    where x holds an inf or a NaN (see :func:`winograd_in_parts`): the caller
    then takes conv_forward."""
    batch, height, width, channels = x.shape
    out_ch, out_h, out_w = w.shape[3], height - 2, width - 2
    if out_h % 4 or out_w % 4 or out_h < 4 or out_w < 4:
        raise ValueError("winograd_forward: the outputs are not whole 4x4 blocks")
    if not _same_values(kept, w):
        _kernel_transform_by_address(w.reshape(3, 3, -1), _WINOGRAD_G.astype(w.dtype), u.reshape(36, -1))
        copy_into(kept, w)
    out = np.empty((batch * out_h * out_w, out_ch), x.dtype)
    pooled = np.empty((batch * (out_h // 2) * (out_w // 2) if pool_mode else 0, out_ch), x.dtype)
    descriptors, scratch = _descriptors_by_address(
        x.reshape(-1, channels), width, out_h // 4, out_w // 4, u, out, out_h, out_w,
        max(1, parts.threads_from_compiled()), chunk, pool_mode, pooled, np.zeros(0, np.int64),
        pooled[:0], np.bool_(True))  # np.bool_: a literal would compile it once more
    parts.run_compiled(part_address, descriptors, (out, pooled, scratch))
    if any_not_finite(descriptors):
        raise ValueError("winograd_forward: an inf or a NaN in the inputs")
    if pool_mode:
        return pooled.reshape(batch, out_h // 2, out_w // 2, out_ch)
    return out.reshape(batch, out_h, out_w, out_ch)
