"""Convolution kernels on channels_last NumPy arrays, forward and backward.

Layouts follow TensorFlow and Keras 2.2.5: inputs are ``(N, *spatial, C)``,
conv kernels ``(*kernel_spatial, in_ch, out_ch)``, depthwise kernels
``(*kernel_spatial, in_ch, depth_multiplier)``.  Every function accepts
spatial rank 1, 2 or 3.  Convolution is cross-correlation (no kernel flip).

How the work is split: a convolution is im2col (NumPy's strided copy of
the input windows) and a matrix product through NumPy's BLAS (``np.matmul``
called from Python, because ``np.dot`` inside ``njit`` needs SciPy at run
time); its input gradient gathers columns back with a Numba kernel.  A
convolution over small windows (a network's first layer: a few input
channels), whose product would have too few columns for BLAS to run well,
and depthwise convolution, which has no matrix product worth the name, are
direct Numba loops; a 3x3 convolution with stride 1 is Winograd's F(4x4, 3x3),
Numba loops transforming blocks of inputs and of products around 36 matrix
products by jit_kernels.packed's micro-kernel (OpenBLAS packs both operands of
these small products on each call: mnist_cnn's second layer took 478 us that
way at batch 1 and 330 us so, 14 and 8-9 ms at batch 64).  Everything works on five-dimensional
arrays ``(N, D, H, W, C)``: rank 1 and 2 inputs get leading singleton spatial
axes (kernel size 1, stride 1, no padding there), so one kernel serves every
rank and each compiles once per dtype.

Padding ('valid', 'same', 'causal') follows TensorFlow: for 'same' the output
size is ``ceil(in / stride)`` and the total padding
``max((out - 1) * stride + (k - 1) * dilation + 1 - in, 0)`` is split with
the smaller half before; 'causal' pads ``(k - 1) * dilation`` before only.
"""

import collections
import functools
import math
import weakref
from collections import namedtuple

import numpy as np
from numba import prange

from . import blas, packed, parts
from .compiling import njit_cached, njit_cached_twins
from .fork import parallel_ok
from .reduce import maximum

_JIT = {'error_model': 'numpy', 'nogil': True}

# im2col works on batch chunks whose column buffer stays about this size, so
# that BLAS reads the columns while they are still in cache: on mnist_cnn's
# second layer at batch 64, 2 MB chunks (3 images) ran the layer 20% faster
# than 8 MB ones and its training step 16% faster; 1 MB ones pay for more
# switches between the copy and BLAS.
_COLUMN_CHUNK_BYTES = 2 << 20

# Below this many elements of work a kernel runs on the calling thread only.
# Waking Numba's other threads costs a few microseconds when the machine is
# otherwise idle, but up to a scheduler time slice (4-12 ms measured on 2
# cores) while OpenBLAS's threads still spin after a matrix product, which is
# exactly when the next kernel of a network runs; and Numba's threads, spinning
# in turn, slow the next product.  So by default only huge kernels go
# parallel; numbackend may lower this once it keeps the two thread pools apart
# (for instance with OPENBLAS_THREAD_TIMEOUT=4 and OMP_WAIT_POLICY=passive).
PARALLEL_MIN_WORK = 1 << 24

# From this many elements of work a kernel parallel over images runs them in
# parts on BLAS's threads (see _launch_by_images): mnist_cnn's max pooling
# after a product, at batch 64 (2.4M elements), 1.6-2x faster forward and
# 1.3-2x backward than on one thread; at batch 16 sometimes slower.
IMAGE_PARTS_MIN_WORK = 1 << 20

# One-channel im2col copies tap by tap from this many column rows up (see
# _fill_columns); below, one copy of the whole window view.
_TAPWISE_MIN_ROWS = 1024

# A convolution whose windows hold at most this many values (taps x input
# channels: 9 at mnist_cnn's first layer, 27 for 3x3 over RGB) is a direct loop
# (_window_products) rather than im2col + BLAS, whose products with so few
# columns run far below speed: mnist_cnn's first layer at batch 1 took 65 us
# against 105 us, 3x3 over RGB at batch 16 0.75 ms against 2.4 ms; with 72
# values im2col + BLAS was faster (1.6 ms against 2.1 ms at batch 16).
DIRECT_MAX_PATCH = 36
# ... where a row of output channels is at least this many bytes: the loop over
# them vectorises only from four vectors on (LLVM's interleaving of four, see
# jit_kernels/__init__.py) and runs as scalar code below that.
DIRECT_MIN_ROW_BYTES = 128
# window values taken in one pass of the direct loop
_PASS_VALUES = 9
# the direct loop's output block per chunk of images: with an epilogue, about
# the size of a core's L2 cache
_DIRECT_CHUNK_BYTES = 512 << 10

# 3x3 convolutions with stride 1 over at least this many input and output
# channels run as Winograd F(4x4, 3x3) (_winograd_products): 36 multiplications
# per 4x4 block of outputs and input channel where im2col + BLAS has 144.
# mnist_cnn's second layer (32 -> 64 channels) ran 1.5-1.75x faster from batch
# 16 up, 1.15-1.3x at batch 1.  Its float32 results are off by about 6e-6 of the
# largest output, where im2col's are off by about 7e-7.
WINOGRAD_MIN_CHANNELS = 8
# ... and over at least this many 4x4 blocks of outputs (36 at mnist_cnn's second
# layer at batch 1), and one per 1024 products of an input and an output
# channel: the kernel's transform (36 matrices C x OC) is made on every call,
# and each of the 36 products has a row per block.  256 -> 256 channels over 7x7
# outputs: 4 blocks 0.24x im2col's speed, 16 blocks 0.57x, 64 blocks 1.09x;
# 128 -> 128 over 14x14 (16 blocks) 0.7x; 64 -> 64 over 28x28 (49) 1.1-1.9x.
WINOGRAD_MIN_BLOCKS = 32
# the Winograd loop's transformed inputs and products per chunk of bands (4
# output rows of an image): 1-2 MB ran alike, 512 KB slower; but at least
# _WINOGRAD_MIN_ROWS blocks (rows of each product): with 256 channels in and
# out, 1 MB is 6 blocks, and 16 images of 7x7 outputs took 2.3x as long so
_WINOGRAD_CHUNK_BYTES = 1 << 20
_WINOGRAD_MIN_ROWS = 64

PADDINGS = ('valid', 'same', 'causal')
_FLOATS = (np.float16, np.float32, np.float64)

Geometry = namedtuple('Geometry', 'rank size kernel stride dilation pad out')
Geometry.__doc__ = """Sizes of one convolution or pooling window sweep.

``rank`` is the spatial rank (1..3); every other field is a 3-tuple over the
axes (D, H, W), with leading 1s for ranks below 3: input ``size``,
``kernel`` taps, ``stride``, ``dilation``, ``pad`` before, ``out`` size.
"""


def _int_tuple(value, rank, name):
    """``value`` as a tuple of ``rank`` positive ints (an int is repeated)."""
    if isinstance(value, (int, np.integer)):
        value = (int(value),) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank or min(value) < 1:
        raise ValueError(f'{name} must be {rank} positive integers, got {value}')
    return value


def _axis_output(size, kernel, stride, dilation, padding):
    """(output size, padding before) of one spatial axis, as TensorFlow does."""
    span = (kernel - 1) * dilation + 1
    if padding == 'valid':
        out, pad = (size - span) // stride + 1, 0
    elif padding == 'same':
        out = -(-size // stride)
        pad = max((out - 1) * stride + span - size, 0) // 2
    elif padding == 'causal':
        pad = span - 1
        out = (size + pad - span) // stride + 1
    else:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    return out, pad


def geometry(size, kernel, strides=1, padding='valid', dilation=1):
    """The :class:`Geometry` of sliding ``kernel`` over spatial ``size``.

    ``size`` and ``kernel`` are tuples of the spatial rank; ``strides`` and
    ``dilation`` an int or such a sequence.  Raises ValueError when the
    kernel does not fit ('valid' with a window larger than the input).
    """
    if isinstance(strides, list):
        strides = tuple(strides)
    if isinstance(dilation, list):
        dilation = tuple(dilation)
    return _geometry(tuple(size), tuple(kernel), strides, padding, dilation)


# Cached because working it out costs about as much as a whole batch-1
# kernel call, and a model asks for the same few geometries on every call.
@functools.lru_cache(maxsize=1024)
def _geometry(size, kernel, strides, padding, dilation):
    rank = len(size)
    if not 1 <= rank <= 3 or len(kernel) != rank:
        raise ValueError(f'spatial rank must be 1..3 and match the kernel: '
                         f'input {size}, kernel {kernel}')
    kernel = _int_tuple(kernel, rank, 'kernel size')
    stride = _int_tuple(strides, rank, 'strides')
    dilation = _int_tuple(dilation, rank, 'dilation')
    out, pad = zip(*(_axis_output(*a, padding) for a in zip(size, kernel, stride, dilation)))
    if min(out) < 1:
        raise ValueError(f'kernel {kernel} with dilation {dilation} does not fit '
                         f'input {size} with {padding!r} padding')
    lead = (1,) * (3 - rank)
    return Geometry(rank, lead + size, lead + kernel, lead + stride, lead + dilation,
                    (0,) * (3 - rank) + pad, lead + out)


def conv_output_shape(size, kernel, strides=1, padding='valid', dilation=1):
    """Spatial output shape of a convolution or pooling over spatial ``size``."""
    g = geometry(size, kernel, strides, padding, dilation)
    return g.out[3 - g.rank:]


def _taps(g):
    return g.kernel[0] * g.kernel[1] * g.kernel[2]


def _out_shape(g, batch, channels):
    return (batch,) + g.out[3 - g.rank:] + (channels,)


def _as_5d(a, g):
    """View of an (N, *spatial, C) array as (N, D, H, W, C)."""
    return a.reshape((a.shape[0],) + g.size + (a.shape[-1],))


def _as_5d_out(a, g):
    return a.reshape((a.shape[0],) + g.out + (a.shape[-1],))


def _float_arrays(*arrays):
    """C-contiguous arrays of their common floating dtype."""
    dtype = getattr(arrays[0], "dtype", None)
    if dtype in _FLOATS:
        # a loop, not all() over a generator: a few us, which show at batch 1 (and
        # np.result_type costs as much)
        for a in arrays:
            if type(a) is not np.ndarray or a.dtype != dtype or not a.flags.c_contiguous:
                break
        else:
            return arrays  # as they come
    dtype = np.result_type(*arrays)
    if not np.issubdtype(dtype, np.floating):
        dtype = np.float64
    return [np.ascontiguousarray(a, dtype=dtype) for a in arrays]


def _launch(kernel, work, *args):
    """Call a kernel of :func:`njit_cached_twins`: its serial twin when ``work``
    (elements touched) is below :data:`PARALLEL_MIN_WORK`."""
    if work >= PARALLEL_MIN_WORK and parallel_ok():
        return kernel(*args)
    return kernel.serial(*args)


def _launch_by_images(kernel, work, batched, *rest):
    """:func:`_launch` of ``kernel(*batched, *rest)``, where each array of
    ``batched`` has the images on its first axis.  From
    :data:`IMAGE_PARTS_MIN_WORK` up the images split between BLAS's threads
    (:func:`blas.run_parts`), each part on one thread: Numba's own threads
    would wait for OpenBLAS's, which spin on after the last product."""
    batch = batched[0].shape[0]
    if work < IMAGE_PARTS_MIN_WORK or min(blas.threads(), batch) < 2:
        return _launch(kernel, work, *batched, *rest)
    _in_image_parts(batch, 1, lambda lo, hi: kernel.serial(*(a[lo:hi] for a in batched), *rest))


def _check_conv(x_shape, w_shape, what):
    rank = len(w_shape) - 2
    if len(x_shape) != rank + 2 or x_shape[-1] != w_shape[-2]:
        raise ValueError(f'{what}: input {tuple(x_shape)} does not match kernel '
                         f'{tuple(w_shape)} (expected (N, *spatial, {w_shape[-2]}) '
                         f'with {rank} spatial axes)')


def _check_out(g, dy_shape, what):
    expected = g.out[3 - g.rank:]
    if tuple(dy_shape[1:-1]) != expected:
        raise ValueError(f'{what}: gradient spatial shape {tuple(dy_shape[1:-1])} does not '
                         f'match the forward output {expected}')


# ---------------------------------------------------------------------------
# Numba kernels.  All take 5-D arrays and 3-tuples of sizes.

@njit_cached_twins(**_JIT)
def _col2im(cols, first, dx, kernel, stride, dilation, pad, out):
    """Inverse of im2col: images first, ... of ``dx`` get the sum of every
    column entry (see :func:`_patches`) that was copied from them.

    A scatter in the order of the rows of ``cols``, parallel over images
    (each owns its slice of dx): every row is read once, front to back, and
    its taps add runs of ``channels`` contiguous values.  The gather over
    input positions it replaces (each position looking up the outputs and
    taps that read it, with a division test per tap) read ``cols`` out of
    order: 3.0 ms against 1.2 ms for this on a 12-image chunk of
    mnist_cnn's second layer (3x3, 32 -> 64 channels), one thread.
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


@njit_cached(fastmath={'contract'}, **_JIT)
def _nine_value_products(images, first_line, end_line, offsets, w9, out, out_size, steps, accumulate):
    """One pass of the direct convolution over output lines first_line..end_line-1
    of the images, line (n*OD + z)*OH + y holding the positions (n, z, y, x):
    position x of line l, row (l - first_line)*OW + x of ``out``, gets (or, with
    ``accumulate``, adds) the sum over k < 9 of ``image[base + offsets[k]] *
    w9[k]``, ``image`` being the row of ``images`` of image n (the first row
    the first line's) and base ``z*steps[0] + y*steps[1] + x*steps[2]``
    (``offsets``: 9 int64 numbers).

    Nine values in one expression keep the partial sums in registers: passes of
    four values, each reading and writing the output row, took twice as long.
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


# Winograd F(4x4, 3x3) (Lavin and Gray, 2016): a 4x4 block of outputs of a 3x3
# cross-correlation is A^T [(G w G^T) * (B^T d B)] A, d the 6x6 block of inputs
# under it.  B^T, G and A^T, with the points 0, 1, -1, 2, -2 and infinity:
#   B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
#          [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
#   A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
#          [0, 1, -1, 8, -8, 1]]
_WINOGRAD_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                        [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])


@njit_cached(fastmath={'contract'}, **_JIT)
def _winograd_kernel_transform(w, g, u):
    """u[6*xi + nu] = (G w G^T)[xi, nu] of w (3, 3, K), K = C*OC, over the K axis;
    ``g`` is G (6, 3) in w's type."""
    along_rows = np.empty((6, 3, w.shape[2]), w.dtype)
    for xi in range(6):
        g0, g1, g2 = g[xi, 0], g[xi, 1], g[xi, 2]
        for kx in range(3):
            for k in range(w.shape[2]):
                along_rows[xi, kx, k] = g0 * w[0, kx, k] + g1 * w[1, kx, k] + g2 * w[2, kx, k]
    for xi in range(6):
        for nu in range(6):
            g0, g1, g2 = g[nu, 0], g[nu, 1], g[nu, 2]
            for k in range(w.shape[2]):
                u[6 * xi + nu, k] = (g0 * along_rows[xi, 0, k] + g1 * along_rows[xi, 1, k]
                                     + g2 * along_rows[xi, 2, k])


@njit_cached(**_JIT)
def _band_row(band, tiles_h, height, width):
    """The first row (position) of a band (see :func:`_winograd_inputs`) in
    images of ``height`` x ``width`` positions: outputs, or Winograd's padded
    inputs; of band N*tiles_h, the number of rows."""
    return ((band // tiles_h) * height + 4 * (band % tiles_h)) * width


# The transforms multiply by 2, 4 and 8 as sums: a product with an integer
# constant would be computed in float64 (Numba promotes float32 * int64), which
# in the loops below meant conversions and half-width vectors.
@njit_cached(inline='always')
def _twice(x):
    return x + x


@njit_cached(inline='always')
def _b_transposed(d0, d1, d2, d3, d4, d5):
    """B^T times the six values (d0, ..., d5), in their own type."""
    return (_twice(_twice(d0 - d2)) - d2 + d4, d3 + d4 - _twice(_twice(d1 + d2)),
            _twice(_twice(d1 - d2)) - d3 + d4, _twice(d3 - d1) - d2 + d4,
            _twice(d1 - d3) - d2 + d4, _twice(_twice(d1 - d3)) - d3 + d5)


@njit_cached(inline='always')
def _a_transposed(m0, m1, m2, m3, m4, m5):
    """A^T times the six values (m0, ..., m5), in their own type."""
    plus, minus = m1 + m2, m1 - m2
    plus_far, minus_far = m3 + m4, m3 - m4
    return (m0 + plus + plus_far, minus + _twice(minus_far), plus + _twice(_twice(plus_far)),
            minus + _twice(_twice(_twice(minus_far))) + m5)


@njit_cached(fastmath={'contract'}, **_JIT)
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
    all 36 values compiled to scalar code, 1.3-4x slower.  No views are made in
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
@njit_cached(fastmath={'reassoc', 'contract'}, **_JIT)
def _all_finite(rows):
    """Whether the C-contiguous (n, C) ``rows`` hold no inf or NaN."""
    values = rows.reshape(-1)
    total = np.zeros(1, rows.dtype)[0]
    for i in range(values.size):
        total += values[i] - values[i]
    return total == 0


class _NonFiniteInput(Exception):
    """An inf or NaN among a Winograd convolution's inputs."""


@njit_cached(fastmath={'contract'}, **_JIT)
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


@njit_cached_twins(**_JIT)
def _depthwise_forward(x, w, y, stride, dilation, pad):
    """y[..., c*M + m] = sum over taps of x[..., c] * w[tap, c, m]; w is (KD, KH, KW, C, M)."""
    _, size_d, size_h, size_w, channels = x.shape
    kd, kh, kw, _, mult = w.shape
    _, od, oh, ow, _ = y.shape
    for line in prange(y.shape[0] * od * oh):
        n = line // (od * oh)
        z = line // oh % od
        yo = line % oh
        for xo in range(ow):
            target = y[n, z, yo, xo]
            target[:] = 0
            for a in range(kd):
                iz = z * stride[0] + a * dilation[0] - pad[0]
                if not 0 <= iz < size_d:
                    continue
                for b in range(kh):
                    iy = yo * stride[1] + b * dilation[1] - pad[1]
                    if not 0 <= iy < size_h:
                        continue
                    for c in range(kw):
                        ix = xo * stride[2] + c * dilation[2] - pad[2]
                        if not 0 <= ix < size_w:
                            continue
                        source = x[n, iz, iy, ix]
                        taps = w[a, b, c]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch * mult + m] += source[ch] * taps[ch, m]


@njit_cached_twins(**_JIT)
def _depthwise_backward_input(dy, w, dx, stride, dilation, pad):
    """dx of :func:`_depthwise_forward`, as a gather over input positions."""
    _, size_d, size_h, size_w, channels = dx.shape
    kd, kh, kw, _, mult = w.shape
    _, od, oh, ow, _ = dy.shape
    for line in prange(dx.shape[0] * size_d * size_h):
        n = line // (size_d * size_h)
        iz = line // size_h % size_d
        iy = line % size_h
        for ix in range(size_w):
            target = dx[n, iz, iy, ix]
            target[:] = 0
            for a in range(kd):
                tz = iz + pad[0] - a * dilation[0]
                if tz < 0 or tz % stride[0] != 0 or tz // stride[0] >= od:
                    continue
                for b in range(kh):
                    ty = iy + pad[1] - b * dilation[1]
                    if ty < 0 or ty % stride[1] != 0 or ty // stride[1] >= oh:
                        continue
                    for c in range(kw):
                        tx = ix + pad[2] - c * dilation[2]
                        if tx < 0 or tx % stride[2] != 0 or tx // stride[2] >= ow:
                            continue
                        grad = dy[n, tz // stride[0], ty // stride[1], tx // stride[2]]
                        taps = w[a, b, c]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch] += grad[ch * mult + m] * taps[ch, m]


@njit_cached_twins(**_JIT)
def _depthwise_backward_kernel(x, dy, dw, stride, dilation, pad):
    """dw of :func:`_depthwise_forward`; parallel over taps, which own their slice of dw."""
    _, size_d, size_h, size_w, channels = x.shape
    kd, kh, kw, _, mult = dw.shape
    _, od, oh, ow, _ = dy.shape
    for tap in prange(kd * kh * kw):
        a = tap // (kh * kw)
        b = tap // kw % kh
        c = tap % kw
        target = dw[a, b, c]
        target[:] = 0
        for n in range(x.shape[0]):
            for z in range(od):
                iz = z * stride[0] + a * dilation[0] - pad[0]
                if not 0 <= iz < size_d:
                    continue
                for yo in range(oh):
                    iy = yo * stride[1] + b * dilation[1] - pad[1]
                    if not 0 <= iy < size_h:
                        continue
                    for xo in range(ow):
                        ix = xo * stride[2] + c * dilation[2] - pad[2]
                        if not 0 <= ix < size_w:
                            continue
                        source = x[n, iz, iy, ix]
                        grad = dy[n, z, yo, xo]
                        for ch in range(channels):
                            for m in range(mult):
                                target[ch, m] += source[ch] * grad[ch * mult + m]


# ---------------------------------------------------------------------------
# Column-matrix helpers shared by the convolutions.

def _padded(x5, g, reach=None):
    """x5, or where the windows reach into the padding a zero-padded copy of it
    (cut to what the windows reach, or to ``reach`` (D, H, W) where given, which
    they do not pass)."""
    reach = _padded_reach(g, reach)
    if reach is None:
        return x5
    padded = np.zeros(x5.shape[:1] + reach + x5.shape[-1:], x5.dtype)
    inside = [min(size, r - p) for size, r, p in zip(g.size, reach, g.pad)]
    target = tuple(slice(p, p + n) for p, n in zip(g.pad, inside))
    padded[(slice(None),) + target] = x5[(slice(None),) + tuple(slice(n) for n in inside)]
    return padded


@functools.lru_cache(maxsize=1024)
def _padded_reach(g, reach=None):
    """The (D, H, W) of :func:`_padded`'s copy, or None where x5 itself serves."""
    if reach is None:
        reach = tuple((o - 1) * s + (k - 1) * d + 1
                      for o, s, k, d in zip(g.out, g.stride, g.kernel, g.dilation))
    if not any(g.pad) and all(r <= size for r, size in zip(reach, g.size)):
        return None
    return reach


def _patches(x5, g):
    """Read-only strided view (N, OD, OH, OW, KD, KH, KW, C) of the windows of
    x5 (N, D, H, W, C); when the windows reach into the padding, of a zero-
    padded copy.  Copied into a (N*P, taps*C) buffer this is im2col: NumPy's
    strided copy measured 2-5x faster than a Numba loop doing the same."""
    x5 = _padded(x5, g)
    spatial = x5.strides[1:4]
    strides = (x5.strides[:1] + tuple(s * k for s, k in zip(spatial, g.stride))
               + tuple(s * d for s, d in zip(spatial, g.dilation)) + x5.strides[4:])
    shape = x5.shape[:1] + g.out + g.kernel + x5.shape[-1:]
    # np.ndarray over x5's buffer: as_strided does the same in 6x the time,
    # which shows at batch 1.  x5 is C-contiguous here.
    view = np.ndarray(shape, x5.dtype, x5, 0, strides)
    view.flags.writeable = False
    return view


def _fill_columns(patches, first, cols):
    """Copy the patches of images first, ... into cols (their rows, taps*C)."""
    _, od, oh, ow = patches.shape[:4]
    images = cols.shape[0] // (od * oh * ow)   # not np.prod: a few us, which shows at batch 1
    target = cols.reshape((images,) + patches.shape[1:])
    source = patches[first:first + images]
    if patches.shape[-1] > 1 or cols.shape[0] < _TAPWISE_MIN_ROWS:
        np.copyto(target, source)
        return
    # With one channel, copying a tap at a time (runs along the output rows)
    # measured 3x faster than the whole view (runs of kw values) from a few
    # images up; for one image (676 rows at mnist_cnn's first layer) the
    # whole view is faster (15 us against 27 us): fewer NumPy calls.
    for tap in np.ndindex(*patches.shape[4:7]):
        index = (slice(None),) * 4 + tap
        target[index] = source[index]


def _add_columns(cols, first, dx5, g):
    _launch(_col2im, cols.size, cols, first, dx5, g.kernel, g.stride, g.dilation, g.pad, g.out)


def _positions(g):
    """Output positions per image (rows of the column matrix per image)."""
    return g.out[0] * g.out[1] * g.out[2]


def _chunk_images(g, width, itemsize):
    """How many images per im2col chunk, whose rows are ``width`` values wide."""
    return max(1, _COLUMN_CHUNK_BYTES // max(1, _positions(g) * width * itemsize))


def _is_pointwise(g):
    """A 1x1 convolution with stride 1: the input is already its column matrix."""
    return g.kernel == (1, 1, 1) and g.stride == (1, 1, 1)


def _in_image_parts(batch, chunk, run):
    """``[run(lo, hi)]`` over images (or Winograd's bands) lo..hi-1, split between
    BLAS's threads (:func:`blas.run_parts`) when each part gets at least a
    whole chunk.  Each part then copies its columns and multiplies them on
    one thread while the other copies or multiplies its own: on mnist_cnn's
    second layer this ran 1.5-1.8x faster from batch 16 up than one copy at a
    time followed by a product on both threads; with less than a chunk per
    part (batch 8 there, or its first layer at batch 64) it was no faster."""
    parts = batch // chunk
    if parts >= 2:  # threads() is a call into OpenBLAS: not at batch 1
        parts = min(blas.threads(), parts)
    if parts < 2:
        return [run(0, batch)]
    per = -(-batch // parts)
    parts = -(-batch // per)  # none empty: 5 images on 4 threads are 2 + 2 + 1
    return blas.run_parts(parts, lambda i: run(i * per, min(batch, (i + 1) * per)))


def _columns_times(x5, g, w2, y2, finish=None):
    """y2 = im2col(x5) @ w2 chunk by chunk (y2 is (N*P, OC)), or where given
    ``finish(block, start, stop)`` with each chunk's product, the values of
    rows start..stop-1 (see :func:`_finisher`)."""
    batch, (patch, out_ch) = x5.shape[0], w2.shape
    positions = _positions(g)
    # with an epilogue, its block of products stays in cache too (mnist_cnn's first
    # layer: 9 taps, 32 channels)
    width = patch if finish is None else max(patch, out_ch)
    chunk = _chunk_images(g, width, x5.itemsize)
    patches = _patches(x5, g)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), x5.dtype)
        if finish is not None:
            block = np.empty((cols.shape[0], out_ch), x5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            _fill_columns(patches, first, cols[:rows])
            start = first * positions
            target = y2[start:start + rows] if finish is None else block[:rows]
            np.matmul(cols[:rows], w2, out=target)
            if finish is not None:
                finish(target, start, start + rows)

    _in_image_parts(batch, chunk, run)


def _uses_window_products(patch, out_ch, dtype):
    # float16 has no vector arithmetic in Numba: it stays with NumPy's matmul
    return (patch <= DIRECT_MAX_PATCH and out_ch * dtype.itemsize >= DIRECT_MIN_ROW_BYTES
            and dtype in (np.float32, np.float64))


def _window_passes(g, image_shape):
    """(offsets, steps) of :func:`_window_products` over padded images of shape
    ``image_shape`` (D, H, W, C): the window values' offsets in an image, an
    int64 row of nine per pass (the last pass's missing ones one image size
    on), and the offset steps between output positions along D, H and W."""
    size = math.prod(image_shape)
    step = (image_shape[1] * image_shape[2] * image_shape[3], image_shape[2] * image_shape[3],
            image_shape[3])
    values = [sum(t * d * e for t, d, e in zip(tap, g.dilation, step)) + ch
              for tap in np.ndindex(*g.kernel) for ch in range(image_shape[3])]
    values += [size] * (-len(values) % _PASS_VALUES)
    offsets = np.array(values, np.int64).reshape(-1, _PASS_VALUES)
    offsets.flags.writeable = False
    return offsets, tuple(s * e for s, e in zip(g.stride, step))


@njit_cached(**_JIT)
def _window_lines(x5, first_line, end_line, sizes, offsets, weights, out, epilogue, final):
    """Output lines first_line..end_line-1 (see :func:`_nine_value_products`) of
    the direct convolution of x5 (N, D, H, W, C) into their rows of ``out``:
    the images they read copied into the first half of a row of zeros twice
    their size, as padded images, then every pass.  ``sizes`` (see
    :func:`_window_sizes`): the padding before and the padded image's extent
    (D, H, W, what lies beyond it left out), the output's and the steps
    between output positions.  Where the compiled epilogue's template
    ``epilogue`` is not empty, then the epilogue from ``out`` into ``final``."""
    _, size_d, size_h, size_w, channels = x5.shape
    pad, reach, out_size, steps = (sizes[0], sizes[1], sizes[2]), (sizes[3], sizes[4], sizes[5]), \
        (sizes[6], sizes[7], sizes[8]), (sizes[9], sizes[10], sizes[11])
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


_NO_EPILOGUE = np.zeros(0, np.int64)  # an empty template: no compiled epilogue


def _window_chunk(*args):
    """:func:`_window_lines` called from Python (a name of its own: tests count
    the chunks through it)."""
    _window_lines(*args)


def _window_products(x5, g, w2, y2, finish=None, epilogue=None):
    """What :func:`_columns_times` computes, as a direct loop without columns:
    passes of :func:`_nine_value_products` over the window values nine at a time.
    ``epilogue``: a compiled epilogue's template (parts.CompiledEpilogue), which
    the loop runs on each block of rows into y2 (in place of ``finish``).

    Each image is copied (inside zeros where the windows reach into the padding)
    into the first half of a row of zeros twice its size: the last pass reads
    the values it lacks from an offset of one image size, always a zero, so
    that an inf or NaN elsewhere never meets their zero weights.

    (Run as compiled parts, lines split between the two threads, mnist_cnn's
    first layer at batch 1 took 50 us against 42 us on one: the parts of about
    11 us each ran in 21 us together.)
    """
    batch, (patch, out_ch) = x5.shape[0], w2.shape
    sizes, offsets, chunk = _window_sizes(g, x5.shape[-1], out_ch, x5.itemsize, _DIRECT_CHUNK_BYTES)
    weights = w2
    if patch % _PASS_VALUES:
        weights = np.zeros((offsets.size, out_ch), w2.dtype)
        weights[:patch] = w2
    positions, per_image = _positions(g), g.out[0] * g.out[1]
    blocks = finish is not None or epilogue is not None
    if epilogue is None:
        epilogue = _NO_EPILOGUE

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

    _in_image_parts(batch, chunk, run)


@functools.lru_cache(maxsize=256)
def _window_sizes(g, channels, out_ch, itemsize, chunk_bytes):
    """(sizes, offsets, chunk) of :func:`_window_products`: the sizes of
    :func:`_window_lines` as an int64 array, the offsets of
    :func:`_window_passes` and the images per chunk of output blocks of
    ``chunk_bytes``.  Cached: worked out in Python they cost more than the
    loop over a small image."""
    reach = _padded_reach(g) or g.size
    offsets, steps = _window_passes(g, reach + (channels,))
    sizes = np.array(g.pad + reach + g.out + steps, np.int64)
    sizes.flags.writeable = False
    return sizes, offsets, max(1, chunk_bytes // (_positions(g) * out_ch * itemsize))


def _uses_winograd(g, batch, channels, out_ch, dtype):
    blocks = batch * -(-g.out[1] // 4) * -(-g.out[2] // 4)
    # one depth slice: a 3-D convolution with a (1, 3, 3) kernel over several
    # slices is not one 2-D convolution of them
    return (g.size[0] == 1 and g.kernel == (1, 3, 3) and g.stride == (1, 1, 1)
            and g.dilation == (1, 1, 1)
            and min(channels, out_ch) >= WINOGRAD_MIN_CHANNELS
            and blocks >= max(WINOGRAD_MIN_BLOCKS, channels * out_ch // 1024)
            and dtype in (np.float32, np.float64))


def _winograd_products(x5, g, w, y2, finish=None, remember=True, pool_into=None):
    """What :func:`_columns_times` computes for a 3x3 kernel ``w`` (3, 3, C, OC)
    with stride 1, as Winograd F(4x4, 3x3) over bands of 4 output rows of an
    image: chunk by chunk of bands, the inputs' transforms, 36 products (one
    per element of a 6x6 transform, over every block of the chunk at once)
    and the products' transforms back.  ``remember``: keep the kernel's
    transform for the next call (see :func:`_winograd_kernels`).
    ``pool_into``: the pooling and compiled epilogue that the parts of
    :func:`_winograd_in_parts` run themselves (its arguments from ``pool``
    on): (mode, pooled rows) of a pooling without epilogue, (mode, pooled
    rows, epilogue template, final rows) with an epilogue after the pooling,
    or (mode or None, pooled rows, epilogue template, final rows, True) with
    an epilogue before it.  Where those parts do not run, ``finish`` does
    (given with an epilogue before the pooling), or a pooling finisher of its
    own.  Returns whether those parts ran."""
    batch, channels, out_ch = x5.shape[0], x5.shape[-1], w.shape[-1]
    out_h, out_w = g.out[1], g.out[2]
    tiles_h, tiles_w = -(-out_h // 4), -(-out_w // 4)
    height, width = 4 * tiles_h + 2, 4 * tiles_w + 2
    rows = _padded(x5, g, (1, height, width)).reshape(-1, channels)
    u = _winograd_kernels(w, remember)
    bands = batch * tiles_h
    chunk = _winograd_chunk_bands(tiles_w, channels, out_ch, x5.itemsize)
    small = bands < 2 * chunk
    if small:
        target = y2 if finish is None and y2 is not None else np.empty((batch * out_h * out_w, out_ch),
                                                                       x5.dtype)
        if _winograd_in_parts(rows, width, tiles_h, tiles_w, u, target, out_h, out_w, *(pool_into or ()),
                              chunk=chunk):
            if finish is not None and pool_into is None:
                finish(target, 0, target.shape[0])
            return True
    if pool_into is not None and finish is None:  # pooled block by block from here on
        pooled = pool_into[1].reshape(batch, out_h // 2, out_w // 2, out_ch)
        finish = _finisher(g, out_ch, None, None, pool_into[0], pooled)
    if small:  # an inf or a NaN in the inputs
        _columns_times(x5, g, w.reshape(-1, out_ch), y2, finish)
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
        _in_image_parts(bands, chunk, run)
    except _NonFiniteInput:  # rewrites every output
        _columns_times(x5, g, w.reshape(-1, out_ch), y2, finish)
    return False


def _winograd_chunk_bands(tiles_w, channels, out_ch, itemsize):
    """Bands per chunk of :func:`_winograd_bands`: its transformed inputs and
    products about _WINOGRAD_CHUNK_BYTES, each product at least
    _WINOGRAD_MIN_ROWS rows."""
    return max(-(-_WINOGRAD_MIN_ROWS // tiles_w),
               _WINOGRAD_CHUNK_BYTES // (36 * tiles_w * (channels + out_ch) * itemsize))


def _winograd_chunk(*args):
    """:func:`_winograd_bands` of one chunk, called from Python (a name of its own,
    which the compiled parts do not read: tests count the chunks through it)."""
    _winograd_bands(*args)


@njit_cached(inline='always')
def _winograd_scratch_size(blocks, channels, out_ch):
    """Items of :func:`_winograd_bands`'s scratch for ``blocks`` blocks."""
    return 36 * blocks * (channels + out_ch) + 36 * channels + 24 * out_ch


@njit_cached(**_JIT)
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
    _winograd_inputs(rows, width, tiles_h, tiles_w, first, v.reshape(36 * blocks, channels), in_scratch)
    packed.matmul_each(v, u, m)
    _winograd_outputs(m.reshape(36 * blocks, out_ch), tiles_h, tiles_w, out_h, out_w, first, out,
                      out_scratch)


@njit_cached(**_JIT)
def _pool_bands(out, first, end, tiles_h, out_h, out_w, mode, pooled):
    """Pool the outputs of bands first..end-1, in ``out`` from the first band's
    first position on, over 2x2 windows with stride 2 ('valid': an odd last
    row or column left out) into their rows of ``pooled`` (positions of
    (N, OH // 2, OW // 2), channels): the maximum where ``mode`` is 1 (NaN
    where a window holds one), else the mean, as jit_kernels.pool's kernels
    compute them (which this module cannot call: pool imports it)."""
    pool_h, pool_w = out_h // 2, out_w // 2
    origin = _band_row(first, tiles_h, out_h, out_w)
    for band in range(first, end):
        n, top = band // tiles_h, 4 * (band % tiles_h)
        for py in range(top // 2, min(top + 4, out_h) // 2):
            for px in range(pool_w):
                r = (n * out_h + 2 * py) * out_w + 2 * px - origin
                target = (n * pool_h + py) * pool_w + px
                if mode == 1:
                    for c in range(out.shape[1]):
                        pooled[target, c] = maximum(maximum(out[r, c], out[r + 1, c]),
                                                    maximum(out[r + out_w, c], out[r + out_w + 1, c]))
                else:
                    for c in range(out.shape[1]):
                        pooled[target, c] = (out[r, c] + out[r + 1, c] + out[r + out_w, c]
                                             + out[r + out_w + 1, c]) * 0.25


@njit_cached(**_JIT)
def _winograd_descriptors(rows, width, tiles_h, tiles_w, u, out, out_h, out_w, count, chunk, pool_mode,
                          pooled, epilogue, final, epilogue_first):
    """(descriptors, scratch) of :func:`_winograd_part_of`: the bands of ``rows``
    in ``count`` parts or fewer, as even as whole bands allow, each part
    ``chunk`` bands at a time with its row of the scratch; no descriptors
    where ``rows`` hold an inf or a NaN."""
    if not _all_finite(rows):
        return np.empty((0, 23), np.int64), np.empty((0, 0), rows.dtype)
    bands = rows.shape[0] // ((4 * tiles_h + 2) * width) * tiles_h
    per = -(-bands // count)
    count = -(-bands // per)
    chunk = min(per, chunk)
    scratch = np.empty((count, _winograd_scratch_size(chunk * tiles_w, rows.shape[1], u.shape[2])),
                       rows.dtype)
    d = np.empty((count, 23), np.int64)
    for i in range(count):
        d[i, 0], d[i, 1], d[i, 2], d[i, 3] = rows.ctypes.data, rows.shape[0], rows.shape[1], width
        d[i, 4], d[i, 5], d[i, 6], d[i, 7] = tiles_h, tiles_w, i * per, min(bands, (i + 1) * per)
        d[i, 8], d[i, 9], d[i, 10], d[i, 11] = u.ctypes.data, u.shape[2], out.ctypes.data, out_h
        d[i, 12], d[i, 13], d[i, 14], d[i, 15] = out_w, scratch[i].ctypes.data, scratch.shape[1], chunk
        d[i, 16], d[i, 17], d[i, 18] = pool_mode, pooled.ctypes.data, pooled.shape[0]
        d[i, 19], d[i, 20], d[i, 21] = epilogue.ctypes.data, epilogue.size, final.ctypes.data
        d[i, 22] = epilogue_first
    return d, scratch


@njit_cached(**_JIT)
def _winograd_part_of(d, dtype):
    """:func:`_winograd_bands` of the descriptor ``d`` (see
    :func:`_winograd_descriptors`), its arrays of ``dtype``, chunk by chunk
    of its bands."""
    for first in range(d[6], d[7], d[15]):
        _winograd_bands_of(d, dtype, first, min(d[7], first + d[15]))


@njit_cached(**_JIT)
def _winograd_bands_of(d, dtype, first, end):
    """What :func:`_winograd_part_of` does for bands first..end-1."""
    rows = parts.array_at(d[0], (d[1], d[2]), dtype)
    width, tiles_h, tiles_w = d[3], d[4], d[5]
    u = parts.array_at(d[8], (36, d[2], d[9]), dtype)
    out_h, out_w = d[11], d[12]
    first_row, end_row = _band_row(first, tiles_h, out_h, out_w), _band_row(end, tiles_h, out_h, out_w)
    out = parts.array_at(d[10], (end_row, d[9]), dtype)[first_row:]
    scratch = parts.array_at(d[13], (d[14],), dtype)
    _winograd_bands(rows, width, tiles_h, tiles_w, first, end, u, out, out_h, out_w, scratch)
    if d[20] and d[22]:  # the epilogue, on these bands' outputs
        done = parts.array_at(d[21], (end_row, d[9]), dtype)[first_row:]
        parts.run_epilogue(parts.array_at(d[19], (d[20],), np.int64), out, done)
        out = done
    if d[16]:
        pooled = parts.array_at(d[17], (d[18], d[9]), dtype)
        _pool_bands(out, first, end, tiles_h, out_h, out_w, d[16], pooled)
        if d[20] and not d[22]:  # the epilogue, on the pooled rows of these bands
            lo, hi = _pooled_row(first, tiles_h, out_h, out_w), _pooled_row(end, tiles_h, out_h, out_w)
            parts.run_epilogue(parts.array_at(d[19], (d[20],), np.int64), pooled[lo:hi],
                               parts.array_at(d[21], (d[18], d[9]), dtype)[lo:hi])


@njit_cached(inline='always')
def _pooled_row(band, tiles_h, out_h, out_w):
    """The first row of :func:`_pool_bands`'s pooled rows that ``band`` writes."""
    return ((band // tiles_h) * (out_h // 2) + min(2 * (band % tiles_h), out_h // 2)) * (out_w // 2)


def _winograd_part_float32(d):
    """:func:`_winograd_part_of` of float32 arrays: a part of its own for each
    type (a callback dispatching on the type took a cold process 38 s to
    compile, both types' loops)."""
    _winograd_part_of(d, np.float32)


def _winograd_part_float64(d):
    """:func:`_winograd_part_of` of float64 arrays."""
    _winograd_part_of(d, np.float64)


# the compiled part of each type, by its item size
winograd_parts = {4: parts.compiled_part(_winograd_part_float32),
                  8: parts.compiled_part(_winograd_part_float64)}
# a pooling's mode in a descriptor (see _pool_bands)
_POOL_MODES = {None: 0, 'max': 1, 'avg': 2}


def _winograd_in_parts(rows, width, tiles_h, tiles_w, u, out, out_h, out_w, pool=None, pooled=None,
                       epilogue=_NO_EPILOGUE, final=None, epilogue_first=False, chunk=None):
    """:func:`_winograd_bands` over every band, the bands split between BLAS's
    threads with no Python between the steps (:mod:`parts`): mnist_cnn's second
    layer at batch 1 took 113-123 us so on 2 cores, against 206 us on one.
    With ``pool`` ('max' or 'avg'), each part also pools its bands' outputs
    over 2x2 windows with stride 2 into the rows (N*OH//2*OW//2, OC) of
    ``pooled``, while they are in its core's cache, and where the compiled
    epilogue's template ``epilogue`` is not empty, the epilogue from its
    pooled rows into theirs of ``final`` (the shape of ``pooled``).  With
    ``epilogue_first``, the epilogue runs on its bands' outputs instead, into
    their rows of ``final`` (the shape of ``out``), and the pooling, if any,
    reads them there.  Each part runs ``chunk`` bands at a time (all of its
    bands at once where None).

    False, running nothing, where ``rows`` hold an inf or a NaN: it would reach
    every output of the blocks that read it (inf - inf in the transforms), so
    such inputs go through im2col."""
    if pooled is None:
        pooled = out[:0]
    if final is None:
        final = pooled[:0]
    if not (rows.flags.c_contiguous and u.flags.c_contiguous and out.flags.c_contiguous
            and pooled.flags.c_contiguous and final.flags.c_contiguous):
        raise ValueError("_winograd_in_parts: the parts read and write whole C-contiguous arrays")
    if epilogue.size and epilogue_first and final.shape != out.shape:
        raise ValueError("_winograd_in_parts: an epilogue before pooling writes an array "
                         f"of the outputs' shape {out.shape}, got {final.shape}")
    if epilogue.size and not epilogue_first and (pool is None or final.shape != pooled.shape):
        raise ValueError("_winograd_in_parts: an epilogue after pooling writes an array "
                         f"of the pooled shape {pooled.shape}, got {final.shape}")
    if rows.shape[0] < (4 * tiles_h + 2) * width:
        return True  # no bands
    # the scratch the descriptors point into, held until the parts are done
    bands = rows.shape[0] // ((4 * tiles_h + 2) * width) * tiles_h
    descriptors, _scratch = _winograd_descriptors(rows, width, tiles_h, tiles_w, u, out, out_h, out_w,
                                                  max(1, blas.threads()), chunk or bands, _POOL_MODES[pool],
                                                  pooled, epilogue, final, epilogue_first)
    if descriptors.shape[0] == 0:
        return False
    parts.run(winograd_parts[rows.itemsize], descriptors)
    return True


# The last kernels' transforms (see _winograd_kernels), newest last
_kernel_transforms = collections.OrderedDict()
_KERNEL_TRANSFORMS_MAX_BYTES = 64 << 20


def _winograd_kernels(w, remember=True):
    """G w G^T of the C-contiguous w (3, 3, C, OC) as (36, C, OC).  Where
    ``remember``, the last few are kept (a network's kernels change only between
    training steps; the transform took 25-44 us of mnist_cnn's 0.8 ms at batch
    1), each with a copy of its kernel that the next call compares in full, so
    that a kernel changed in place is never missed, and each until the array
    holding the kernel is freed (a training step's replaced weights)."""
    key = (parts.address(w), w.shape, w.dtype)  # not w.ctypes.data: 3 us
    known = _kernel_transforms.get(key) if remember else None
    if known is not None and _same_values(known[0], w):
        return known[1]
    u = np.empty((36, w.shape[2] * w.shape[3]), w.dtype)
    _winograd_kernel_transform(w.reshape(3, 3, -1), _WINOGRAD_G.astype(w.dtype), u)
    u = u.reshape(36, w.shape[2], w.shape[3])
    if not remember:
        return u
    _kernel_transforms.pop(key, None)
    _kernel_transforms[key] = (w.copy(), u)
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
        if held <= _KERNEL_TRANSFORMS_MAX_BYTES:
            break
        _kernel_transforms.pop(old_key, None)
        held -= kept.nbytes + transform.nbytes
    return u


@njit_cached(**_JIT)
def _same_values(a, b):
    """Whether the C-contiguous a and b of one shape hold the same values."""
    x, y = a.reshape(-1), b.reshape(-1)
    differ = False
    for i in range(x.size):  # no early exit: the loop vectorises
        differ |= x[i] != y[i]
    return not differ


def _gradient_to_columns(dy2, w2t, g, dx5):
    """dx5 = col2im(dy2 @ w2t) chunk by chunk; dy2 is (N*P, OC), w2t (OC, taps*C)."""
    batch, patch = dx5.shape[0], w2t.shape[1]
    positions = _positions(g)
    chunk = _chunk_images(g, patch, dx5.itemsize)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), dx5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            np.matmul(dy2[first * positions:first * positions + rows], w2t, out=cols[:rows])
            _add_columns(cols[:rows], first, dx5, g)

    _in_image_parts(batch, chunk, run)


def _columns_transposed_times(x5, g, dy2, patch):
    """im2col(x5).T @ dy2, summed over batch chunks: (taps*C, OC)."""
    batch = x5.shape[0]
    positions = _positions(g)
    chunk = _chunk_images(g, patch, x5.itemsize)
    patches = _patches(x5, g)

    def run(lo, hi):
        cols = np.empty((min(chunk, hi - lo) * positions, patch), x5.dtype)
        total = np.zeros((patch, dy2.shape[1]), x5.dtype)
        for first in range(lo, hi, chunk):
            rows = min(chunk, hi - first) * positions
            _fill_columns(patches, first, cols[:rows])
            total += cols[:rows].T @ dy2[first * positions:first * positions + rows]
        return total

    return sum(_in_image_parts(batch, chunk, run))


# ---------------------------------------------------------------------------
# Convolution.

def _finisher(g, out_ch, epilogue, y2, pool, pooled):
    """The ``finish(block, start, stop)`` the convolution paths call with each
    block of products, the values of output rows (positions) start..stop-1,
    whole output lines of one or more images, starting at an even line.

    Without ``pool``, ``epilogue(block, rows start..stop-1 of y2)``.  With
    ``pool`` ('max' or 'avg'), the block (through the epilogue where given)
    is pooled over 2x2 windows with stride 2 into its lines of ``pooled``:
    the full-size result is never written.
    """
    if pool is None:
        return lambda block, start, stop: epilogue(block, y2[start:stop])
    kernel = _pool_kernel(pool)
    out_h, out_w = g.out[1], g.out[2]
    positions = out_h * out_w

    def finish(block, start, stop):
        if epilogue is not None:
            done = np.empty_like(block)
            epilogue(block, done)
            block = done
        while start < stop:  # lines first..last-1 of an image, or whole images
            n, first = divmod(start, positions)
            if first or stop - start < positions:
                images, end = 1, min(stop, (n + 1) * positions)
                first, last = first // out_w, (end - n * positions) // out_w
            else:
                images = (stop - start) // positions
                end, first, last = start + images * positions, 0, out_h
            lines = block[:end - start].reshape(images, 1, last - first, out_w, out_ch)
            target = pooled[n:n + images, first // 2:last // 2]
            kernel(lines, target.reshape(images, 1, target.shape[1], out_w // 2, out_ch),
                   (1, 2, 2), (1, 2, 2), (0, 0, 0))
            block, start = block[end - start:], end
    return finish


@functools.cache
def _pool_kernel(mode):
    """jit_kernels.pool's serial kernel of pooling ``mode`` (imported once: that
    module imports this one)."""
    from . import pool as pooling
    return (pooling._max_pool if mode == 'max' else pooling._avg_pool).serial


def conv_forward(x, w, strides=1, padding='valid', dilation=1, epilogue=None, pool=None,
                 pool_first=False):
    """Convolution (cross-correlation) of x (N, *spatial, C) with w (*k, C, OC).

    ``strides`` and ``dilation`` are an int or one int per spatial axis;
    ``padding`` is 'valid', 'same' or 'causal'.  Returns (N, *out, OC).
    ``epilogue(block, out)``, where given, is called with each block of output
    rows as soon as it is computed (while it is in cache), a (rows, OC) array,
    and ``out``, a (rows, OC) array where it writes their final values; blocks
    may come from several threads at once.  (Out of place: a Numba loop
    reading and writing the same array measured 2.4x slower, its aliasing
    keeping it from vectorising.)

    ``pool`` ('max' or 'avg'; 2-D convolutions only) pools the result, after
    the epilogue, over 2x2 windows with stride 2 and 'valid' padding, block by
    block while in cache, and returns (N, OH // 2, OW // 2, OC) instead.  With
    ``pool_first``, the epilogue runs on the pooled values instead, where the
    caller knows the two commute (a max pooling, an epilogue non-decreasing in
    the convolution's value): on a quarter of the values.
    """
    x, w = _float_arrays(x, w)
    g, path = _forward_path(x.shape, w.shape, x.dtype, _hashable(strides), padding,
                            _hashable(dilation), pool, _path_limits())
    batch, channels, out_ch = x.shape[0], x.shape[-1], w.shape[-1]
    if isinstance(epilogue, parts.CompiledEpilogue):
        epilogue.check(out_ch, x.dtype)  # before any block runs
    if pool is None:
        y = np.empty(_out_shape(g, batch, out_ch), x.dtype)
        y2, pooled = y.reshape(-1, out_ch), None
    else:
        y2, pooled = None, np.empty((batch, g.out[1] // 2, g.out[2] // 2, out_ch), x.dtype)
    after_pool = final = None
    if pool_first and pool is not None and epilogue is not None:
        epilogue, after_pool = None, epilogue
        final = np.empty_like(pooled)
    w2 = w.reshape(-1, out_ch)
    if path == 'direct' and pool is None and isinstance(epilogue, parts.CompiledEpilogue):
        # the loop runs the epilogue itself, on each block while in cache
        _window_products(_as_5d(x, g), g, w2, y2, epilogue=epilogue.template)
        return y
    finish = None
    # (Winograd pools by itself where no epilogue comes first: in its parts or in chunks)
    if epilogue is not None or (pool is not None and path != 'winograd'):
        finish = _finisher(g, out_ch, epilogue, y2, pool, pooled)
    if path == 'pointwise':
        if finish is None:
            np.matmul(x.reshape(-1, channels), w2, out=y2)
        else:
            finish(np.matmul(x.reshape(-1, channels), w2), 0, batch * _positions(g))
    elif path == 'direct':
        _window_products(_as_5d(x, g), g, w2, y2, finish)
    elif path == 'winograd':
        pool_into = _winograd_parts_work(batch * _positions(g), pool, pooled, y2, epilogue, after_pool, final)
        if _winograd_products(_as_5d(x, g), g, w.reshape(3, 3, channels, out_ch), y2, finish,
                              pool_into=pool_into) and isinstance(after_pool, parts.CompiledEpilogue):
            return final  # its parts ran the epilogue too
    else:
        _columns_times(_as_5d(x, g), g, w2, y2, finish)
    if after_pool is not None:
        after_pool(pooled.reshape(-1, out_ch), final.reshape(-1, out_ch))
        return final
    return y if pool is None else pooled


def _winograd_parts_work(outputs, pool, pooled, y2, epilogue, after_pool, final):
    """The ``pool_into`` of :func:`_winograd_products` for :func:`conv_forward`:
    what Winograd's parts do besides their products, which fill ``outputs``
    rows (of pooled's type, y2 being None) or y2: a compiled epilogue on their
    outputs (into y2, or into a scratch they pool from), a pooling, a compiled
    epilogue on the pooled values (``after_pool``, into ``final``); None
    where they do none of it."""
    if isinstance(epilogue, parts.CompiledEpilogue):
        if pool is None:
            return (None, y2[:0], epilogue.template, y2, True)
        done = np.empty((outputs, pooled.shape[-1]), pooled.dtype)
        return (pool, pooled.reshape(-1, pooled.shape[-1]), epilogue.template, done, True)
    if epilogue is not None or pool is None:
        return None
    into = (pool, pooled.reshape(-1, pooled.shape[-1]))
    if isinstance(after_pool, parts.CompiledEpilogue):
        into += (after_pool.template, final.reshape(-1, final.shape[-1]))
    return into


# Compiled forms of two of conv_forward's paths, for numbackend's plans compiled
# as one call (numbackend/compiled_plan.py): 2-D convolutions whose path is the
# same whatever the batch.  At batch 1 the Python around conv_forward's
# compiled loops took as long as mnist_cnn's first layer itself.

def compiled_path(x_shape, w_shape, dtype, strides, padding, dilation):
    """('direct', (sizes, offsets)) or ('winograd', (chunk,)) where
    :func:`direct_forward` or :func:`winograd_forward` computes conv_forward's
    result for inputs of shape x_shape (N, H, W, C) with any N, with the
    arguments they take besides, else (None, ()).  Winograd only over whole
    4x4 blocks without padding, where its rows are the input's own."""
    if len(x_shape) != 4 or None in x_shape[1:] or dtype not in (np.float32, np.float64):
        return None, ()
    g, path = _forward_path((1,) + tuple(x_shape[1:]), tuple(w_shape), np.dtype(dtype),
                            _hashable(strides), padding, _hashable(dilation), None, _path_limits())
    if path == 'direct':  # the same for any batch
        sizes, offsets, _ = _window_sizes(g, x_shape[-1], w_shape[-1], np.dtype(dtype).itemsize,
                                          _DIRECT_CHUNK_BYTES)
        return path, (sizes, offsets)
    # (more images only add blocks: Winograd at batch 1 is Winograd at any batch)
    if path == 'winograd' and g.pad == (0, 0, 0) and g.out[1] % 4 == 0 and g.out[2] % 4 == 0:
        return path, (_winograd_chunk_bands(g.out[2] // 4, x_shape[-1], w_shape[-1], np.dtype(dtype).itemsize),)
    return None, ()


@njit_cached(**_JIT)
def direct_forward(x, w, sizes, offsets):
    """conv_forward's direct loop over x (N, H, W, C) with w (KH, KW, C, OC),
    for the ``sizes`` and ``offsets`` of :func:`compiled_path`: (N, OH, OW, OC).
    (One pass over every image: a whole call's batches are small.)"""
    batch, out_ch = x.shape[0], w.shape[3]
    patch = w.shape[0] * w.shape[1] * w.shape[2]
    weights = np.zeros((offsets.size, out_ch), x.dtype)
    weights[:patch] = w.reshape(patch, out_ch)
    y = np.empty((batch, sizes[7], sizes[8], out_ch), x.dtype)
    y2 = y.reshape(-1, out_ch)
    _window_lines(x.reshape(batch, 1, x.shape[1], x.shape[2], x.shape[3]), 0, batch * sizes[7], sizes,
                  offsets, weights, y2, np.zeros(0, np.int64), y2)
    return y


@njit_cached(**_JIT)
def winograd_forward(x, w, kept, u, part_address, pool_mode, chunk):
    """conv_forward's Winograd parts over x (N, H, W, C) with w (3, 3, C, OC),
    from compiled code (a :func:`compiled_path` of 'winograd'; see
    :func:`_winograd_in_parts`): (N, H - 2, W - 2, OC), or with ``pool_mode``
    (see :func:`_pool_bands`) that pooled over 2x2 windows with stride 2.
    ``kept`` and ``u``, of w's shape and (36, C, OC), hold the kernel that
    ``u`` is the transform of: where w holds other values, u and kept are
    made again.  ``part_address``: that of ``winograd_parts`` of its type;
    ``chunk``: :func:`compiled_path`'s bands per chunk.  Raises ValueError
    where x holds an inf or a NaN (see :func:`_winograd_in_parts`): the caller
    then takes conv_forward."""
    batch, height, width, channels = x.shape
    out_ch, out_h, out_w = w.shape[3], height - 2, width - 2
    if out_h % 4 or out_w % 4 or out_h < 4 or out_w < 4:
        raise ValueError("winograd_forward: the outputs are not whole 4x4 blocks")
    if not _same_values(kept, w):
        _winograd_kernel_transform(w.reshape(3, 3, -1), _WINOGRAD_G.astype(w.dtype),
                                   u.reshape(36, -1))
        kept[:] = w
    out = np.empty((batch * out_h * out_w, out_ch), x.dtype)
    pooled = np.empty((batch * (out_h // 2) * (out_w // 2) if pool_mode else 0, out_ch), x.dtype)
    descriptors, scratch = _winograd_descriptors(
        x.reshape(-1, channels), width, out_h // 4, out_w // 4, u, out, out_h, out_w,
        max(1, parts.threads_from_compiled()), chunk, pool_mode, pooled, np.zeros(0, np.int64),
        pooled[:0], False)
    if descriptors.shape[0] == 0:
        raise ValueError("winograd_forward: an inf or a NaN in the inputs")
    parts.run_compiled(part_address, descriptors, (out, pooled, scratch))
    if pool_mode:
        return pooled.reshape(batch, out_h // 2, out_w // 2, out_ch)
    return out.reshape(batch, out_h, out_w, out_ch)


def _path_limits():
    """The module's limits on :func:`_forward_path`'s paths, as they are now
    (tests change them)."""
    return DIRECT_MAX_PATCH, DIRECT_MIN_ROW_BYTES, WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_BLOCKS


def _hashable(value):
    """Strides or dilation as a key of :func:`_forward_path` (a list as a tuple)."""
    return tuple(value) if isinstance(value, list) else value


# Cached for the reason _geometry is: a batch-1 network asks for the same few
# convolutions on every call, and working the choice out took longer than
# mnist_cnn's first convolution itself.
@functools.lru_cache(maxsize=1024)
def _forward_path(x_shape, w_shape, dtype, strides, padding, dilation, pool, limits):
    """(geometry, path) of :func:`conv_forward`: its arguments checked, and how it
    runs.  A 1x1 kernel is one product ('pointwise'); small windows
    (DIRECT_MAX_PATCH) a direct loop ('direct'), whose sums over nine window
    values at a time stay in registers (a loop adding one tap at a time into
    the output, 2.8 ms at mnist_cnn's first layer, batch 64, lost to im2col's
    1.9 ms); 3x3 kernels with stride 1 over enough channels Winograd F(4x4,
    3x3) ('winograd'; F(2x2, 3x3), 16 products for 4 outputs, gained only
    1.1-1.2x over im2col); the rest im2col ('columns').  ``limits``, the
    module's limits on those paths, are in the key so that a changed limit
    takes effect."""
    _check_conv(x_shape, w_shape, 'conv_forward')
    g = geometry(x_shape[1:-1], w_shape[:-2], strides, padding, dilation)
    if pool is not None and (pool not in ('max', 'avg') or g.rank != 2):
        raise ValueError(f"conv_forward: pool must be 'max' or 'avg' after a 2-D convolution, "
                         f"got {pool!r} for an input of shape {x_shape}")
    batch, channels, out_ch = x_shape[0], x_shape[-1], w_shape[-1]
    if _is_pointwise(g):
        return g, 'pointwise'
    if _uses_window_products(math.prod(w_shape[:-1]), out_ch, dtype):
        return g, 'direct'
    if _uses_winograd(g, batch, channels, out_ch, dtype):
        return g, 'winograd'
    return g, 'columns'


def conv_backward_input(dy, w, x_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`conv_forward` with respect to its input, shape ``x_shape``.

    This is also the transposed convolution of ``dy`` (see
    :func:`conv_transpose_forward`).
    """
    dy, w = _float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    _check_conv(x_shape, w.shape, 'conv_backward_input')
    g = geometry(x_shape[1:-1], w.shape[:-2], strides, padding, dilation)
    _check_out(g, dy.shape, 'conv_backward_input')
    if dy.shape[0] != x_shape[0] or dy.shape[-1] != w.shape[-1]:
        raise ValueError(f'conv_backward_input: gradient {dy.shape} does not match '
                         f'batch {x_shape[0]} and kernel {w.shape}')
    channels, out_ch = w.shape[-2:]
    w2t = w.reshape(-1, out_ch).T
    dy2 = dy.reshape(-1, out_ch)
    if _is_pointwise(g):
        return np.matmul(dy2, w2t).reshape(x_shape)
    dx = np.empty(x_shape, dy.dtype)
    full = _full_correlation(g)
    if full is not None and _uses_winograd(full, dy.shape[0], out_ch, channels, dy.dtype):
        # dx is dy's correlation with the kernel turned half a turn, its channels
        # swapped: a 3x3 convolution with stride 1, which Winograd takes
        flipped = np.ascontiguousarray(w.reshape(3, 3, channels, out_ch)[::-1, ::-1].swapaxes(2, 3))
        # (a copy made on each call: its transform is not kept)
        _winograd_products(_as_5d_out(dy, g), full, flipped, dx.reshape(-1, channels), remember=False)
        return dx
    _gradient_to_columns(dy2, w2t, g, _as_5d(dx, g))
    return dx


def _full_correlation(g):
    """Where ``g`` is a 3x3 convolution with stride 1 over one depth slice, the
    geometry of its input gradient as a convolution of the output gradient:
    over the outputs, padded so that every output a tap of an input reaches is
    read, giving the input's size; else None."""
    if g.size[0] != 1 or g.kernel != (1, 3, 3) or g.stride != (1, 1, 1) or g.dilation != (1, 1, 1):
        return None
    return g._replace(size=g.out, pad=(0, 2 - g.pad[1], 2 - g.pad[2]), out=g.size)


def conv_backward_kernel(x, dy, w_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`conv_forward` with respect to its kernel, shape ``w_shape``."""
    x, dy = _float_arrays(x, dy)
    w_shape = tuple(int(s) for s in w_shape)
    _check_conv(x.shape, w_shape, 'conv_backward_kernel')
    g = geometry(x.shape[1:-1], w_shape[:-2], strides, padding, dilation)
    _check_out(g, dy.shape, 'conv_backward_kernel')
    out_ch = w_shape[-1]
    dy2 = dy.reshape(-1, out_ch)
    if _is_pointwise(g):
        return (x.reshape(-1, x.shape[-1]).T @ dy2).reshape(w_shape)
    patch = int(np.prod(w_shape[:-1]))
    return _columns_transposed_times(_as_5d(x, g), g, dy2, patch).reshape(w_shape)


# ---------------------------------------------------------------------------
# Transposed convolution: the input gradient of a convolution whose input has
# ``output_shape``.  Kernel layout (*k, out_ch, in_ch), as in TensorFlow.

def _transpose_output_shape(x, output_shape):
    output_shape = tuple(output_shape)
    if output_shape[0] is None:
        output_shape = (x.shape[0],) + output_shape[1:]
    return output_shape


def conv_transpose_forward(x, w, output_shape, strides=1, padding='same', dilation=1):
    """Transposed convolution of x (N, *spatial, IC) with w (*k, OC, IC).

    ``output_shape`` is the full (N, *out_spatial, OC) shape (N may be None);
    it must be an input shape from which the matching convolution produces
    x's spatial shape, as in ``tf.nn.conv2d_transpose``.
    """
    output_shape = _transpose_output_shape(x, output_shape)
    return conv_backward_input(x, w, output_shape, strides, padding, dilation)


def conv_transpose_backward_input(dy, w, strides=1, padding='same', dilation=1):
    """Gradient of :func:`conv_transpose_forward` with respect to its input."""
    return conv_forward(dy, w, strides, padding, dilation)


def conv_transpose_backward_kernel(x, dy, w_shape, strides=1, padding='same', dilation=1):
    """Gradient of :func:`conv_transpose_forward` with respect to its kernel."""
    return conv_backward_kernel(dy, x, w_shape, strides, padding, dilation)


# ---------------------------------------------------------------------------
# Depthwise and separable convolution.

def _depthwise_setup(x_shape, w, strides, padding, dilation, what):
    if len(x_shape) != w.ndim or x_shape[-1] != w.shape[-2]:
        raise ValueError(f'{what}: input {tuple(x_shape)} does not match depthwise kernel '
                         f'{w.shape}')
    return geometry(x_shape[1:-1], w.shape[:-2], strides, padding, dilation)


def depthwise_conv_forward(x, w, strides=1, padding='valid', dilation=1):
    """Depthwise convolution of x (N, *spatial, C) with w (*k, C, M) -> (N, *out, C*M).

    Output channel ``c*M + m`` is input channel c convolved with w[..., c, m],
    as ``tf.nn.depthwise_conv2d`` orders them.
    """
    x, w = _float_arrays(x, w)
    g = _depthwise_setup(x.shape, w, strides, padding, dilation, 'depthwise_conv_forward')
    y = np.empty(_out_shape(g, x.shape[0], w.shape[-2] * w.shape[-1]), x.dtype)
    _launch(_depthwise_forward, y.size * _taps(g), _as_5d(x, g),
            w.reshape(g.kernel + w.shape[-2:]), _as_5d_out(y, g), g.stride, g.dilation, g.pad)
    return y


def depthwise_conv_backward_input(dy, w, x_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`depthwise_conv_forward` with respect to its input."""
    dy, w = _float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    g = _depthwise_setup(x_shape, w, strides, padding, dilation, 'depthwise_conv_backward_input')
    _check_out(g, dy.shape, 'depthwise_conv_backward_input')
    dx = np.empty(x_shape, dy.dtype)
    _launch(_depthwise_backward_input, dy.size * _taps(g), _as_5d_out(dy, g),
            w.reshape(g.kernel + w.shape[-2:]), _as_5d(dx, g), g.stride, g.dilation, g.pad)
    return dx


def depthwise_conv_backward_kernel(x, dy, w_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`depthwise_conv_forward` with respect to its kernel."""
    x, dy = _float_arrays(x, dy)
    w_shape = tuple(int(s) for s in w_shape)
    dw = np.empty(w_shape, x.dtype)
    g = _depthwise_setup(x.shape, dw, strides, padding, dilation,
                         'depthwise_conv_backward_kernel')
    _check_out(g, dy.shape, 'depthwise_conv_backward_kernel')
    _launch(_depthwise_backward_kernel, dy.size * _taps(g), _as_5d(x, g), _as_5d_out(dy, g),
            dw.reshape(g.kernel + w_shape[-2:]), g.stride, g.dilation, g.pad)
    return dw


def separable_conv_forward(x, depthwise_w, pointwise_w, strides=1, padding='valid', dilation=1):
    """Separable convolution: depthwise (*k, C, M), then pointwise (*1, C*M, OC).

    The gradients are those of the two steps chained; a caller that needs
    them keeps the depthwise output.
    """
    return conv_forward(depthwise_conv_forward(x, depthwise_w, strides, padding, dilation),
                        pointwise_w)


# ---------------------------------------------------------------------------
# Locally connected (unshared weights) convolution, as Keras 2.2.5's
# local_conv1d / local_conv2d: kernel (P, taps*C, F) with P the output
# positions in row-major order and 'valid' windows without dilation.

_FEATURE_ORDERS = ('channels_last', 'channels_first')


def _local_setup(x_shape, w_shape, kernel_size, strides, feature_order, what):
    rank = len(x_shape) - 2
    kernel_size = _int_tuple(kernel_size, rank, 'kernel_size')
    g = geometry(x_shape[1:-1], kernel_size, strides, 'valid', 1)
    positions = g.out[0] * g.out[1] * g.out[2]
    patch = int(np.prod(kernel_size)) * x_shape[-1]
    if len(w_shape) != 3 or tuple(w_shape[:2]) != (positions, patch):
        raise ValueError(f'{what}: kernel {tuple(w_shape)} does not match input '
                         f'{tuple(x_shape)}; expected ({positions}, {patch}, filters)')
    if feature_order not in _FEATURE_ORDERS:
        raise ValueError(f'feature_order must be one of {_FEATURE_ORDERS}')
    return g, kernel_size


def _kernel_to_channels_last(w, kernel_size, channels, feature_order):
    """Keras orders a patch (taps, C) for channels_last inputs and (C, taps)
    for channels_first ones; the columns here are always (taps, C)."""
    if feature_order == 'channels_last':
        return w
    rank = len(kernel_size)
    split = w.reshape((w.shape[0], channels) + kernel_size + (w.shape[-1],))
    order = (0,) + tuple(range(2, 2 + rank)) + (1, rank + 2)
    return np.ascontiguousarray(split.transpose(order)).reshape(w.shape)


def _kernel_from_channels_last(dw, kernel_size, channels, feature_order):
    if feature_order == 'channels_last':
        return dw
    rank = len(kernel_size)
    split = dw.reshape((dw.shape[0],) + kernel_size + (channels, dw.shape[-1]))
    order = (0, rank + 1) + tuple(range(1, rank + 1)) + (rank + 2,)
    return np.ascontiguousarray(split.transpose(order)).reshape(dw.shape)


def local_conv_forward(x, w, kernel_size, strides=1, feature_order='channels_last'):
    """Locally connected convolution of x (N, *spatial, C) with w (P, taps*C, F).

    ``feature_order`` is the order of a patch's features in w: 'channels_last'
    (taps, C) as Keras uses for channels_last inputs, 'channels_first'
    (C, taps) as Keras' local_conv2d uses for channels_first inputs (x itself
    is channels_last here in both cases).  Returns (N, *out, F).
    """
    x, w = _float_arrays(x, w)
    g, kernel_size = _local_setup(x.shape, w.shape, kernel_size, strides, feature_order,
                                  'local_conv_forward')
    batch, channels, filters = x.shape[0], x.shape[-1], w.shape[-1]
    w = _kernel_to_channels_last(w, kernel_size, channels, feature_order)
    positions = w.shape[0]
    cols = np.empty((batch * positions, w.shape[1]), x.dtype)
    _fill_columns(_patches(_as_5d(x, g), g), 0, cols)
    # (P, N, taps*C) @ (P, taps*C, F): one product per output position.
    y = np.matmul(cols.reshape(batch, positions, -1).transpose(1, 0, 2), w)
    return np.ascontiguousarray(y.transpose(1, 0, 2)).reshape(_out_shape(g, batch, filters))


def local_conv_backward_input(dy, w, x_shape, kernel_size, strides=1,
                              feature_order='channels_last'):
    """Gradient of :func:`local_conv_forward` with respect to its input."""
    dy, w = _float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    g, kernel_size = _local_setup(x_shape, w.shape, kernel_size, strides, feature_order,
                                  'local_conv_backward_input')
    _check_out(g, dy.shape, 'local_conv_backward_input')
    batch, positions = x_shape[0], w.shape[0]
    w = _kernel_to_channels_last(w, kernel_size, x_shape[-1], feature_order)
    dy3 = dy.reshape(batch, positions, -1).transpose(1, 0, 2)
    cols = np.matmul(dy3, w.transpose(0, 2, 1))
    cols = np.ascontiguousarray(cols.transpose(1, 0, 2)).reshape(batch * positions, -1)
    dx = np.empty(x_shape, dy.dtype)
    _add_columns(cols, 0, _as_5d(dx, g), g)
    return dx


def local_conv_backward_kernel(x, dy, kernel_size, strides=1, feature_order='channels_last'):
    """Gradient of :func:`local_conv_forward` with respect to its kernel (P, taps*C, F)."""
    x, dy = _float_arrays(x, dy)
    rank = x.ndim - 2
    kernel_size = _int_tuple(kernel_size, rank, 'kernel_size')
    batch, channels, filters = x.shape[0], x.shape[-1], dy.shape[-1]
    positions = int(np.prod(dy.shape[1:-1]))
    w_shape = (positions, int(np.prod(kernel_size)) * channels, filters)
    g, _ = _local_setup(x.shape, w_shape, kernel_size, strides, feature_order,
                        'local_conv_backward_kernel')
    _check_out(g, dy.shape, 'local_conv_backward_kernel')
    cols = np.empty((batch * positions, w_shape[1]), x.dtype)
    _fill_columns(_patches(_as_5d(x, g), g), 0, cols)
    # (P, taps*C, N) @ (P, N, F)
    dw = np.matmul(cols.reshape(batch, positions, -1).transpose(1, 2, 0),
                   dy.reshape(batch, positions, filters).transpose(1, 0, 2))
    return _kernel_from_channels_last(dw, kernel_size, channels, feature_order)
