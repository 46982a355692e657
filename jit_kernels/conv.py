"""Convolution on channels_last NumPy arrays, forward and backward: the entry
points, and the one place that chooses how a convolution runs.

Layouts follow TensorFlow and Keras 2.2.5: inputs are ``(N, *spatial, C)``,
conv kernels ``(*kernel_spatial, in_ch, out_ch)``, depthwise kernels
``(*kernel_spatial, in_ch, depth_multiplier)``.  Every function accepts
spatial rank 1, 2 or 3.  Convolution is cross-correlation (no kernel flip).
Padding follows TensorFlow (see :mod:`jit_kernels.windows`).

A forward convolution takes one of four algorithms, chosen by
:func:`forward_path`: a 1x1 kernel with stride 1 is one matrix product
('pointwise'); small windows a direct Numba loop (:mod:`jit_kernels.direct`);
3x3 kernels with stride 1 over enough channels Winograd's F(4x4, 3x3)
(:mod:`jit_kernels.winograd`); the rest im2col and a product through NumPy's
BLAS (:mod:`jit_kernels.columns`).  Depthwise and locally connected
convolutions live in :mod:`jit_kernels.depthwise` and :mod:`jit_kernels.local`;
their entry points are importable from here too.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from . import parts, tuning
from .columns import columns_times, columns_transposed_times, gradient_to_columns
from .compiling import njit_cached
from .depthwise import (
    depthwise_conv_backward_input,
    depthwise_conv_backward_kernel,
    depthwise_conv_forward,
)
from .direct import DirectLoop, direct_forward, direct_loop, window_products
from .local import local_conv_backward_input, local_conv_backward_kernel, local_conv_forward
from .pool import block_finisher, max_pool_2x2
from .windows import (
    JIT_OPTIONS,
    PADDINGS,
    Geometry,
    as_5d,
    as_5d_out,
    batch_output_shape,
    check_conv,
    check_output_gradient,
    conv_output_shape,
    float_arrays,
    geometry,
    is_pointwise,
    positions_per_image,
)
from .winograd import (
    POOL_MODES,
    BandWork,
    kernel_transform,
    winograd_chunk_bands,
    winograd_forward,
    winograd_parts,
    winograd_products,
    winograd_serial,
)

__all__ = [
    "ALGORITHMS",
    "PADDINGS",
    "POOL_MODES",
    "ForwardPath",
    "Geometry",
    "WinogradForm",
    "compiled_path",
    "conv_backward_input",
    "conv_backward_kernel",
    "conv_forward",
    "conv_output_shape",
    "conv_transpose_backward_input",
    "conv_transpose_backward_kernel",
    "conv_transpose_forward",
    "depthwise_conv_backward_input",
    "depthwise_conv_backward_kernel",
    "depthwise_conv_forward",
    "direct_form",
    "direct_forward",
    "forward_path",
    "geometry",
    "kernel_transform",
    "local_conv_backward_input",
    "local_conv_backward_kernel",
    "local_conv_forward",
    "max_pool_2x2",
    "separable_conv_forward",
    "winograd_forward",
    "winograd_or_direct",
    "winograd_parts",
]

ALGORITHMS = ('pointwise', 'direct', 'winograd', 'columns')


class WinogradForm(NamedTuple):
    """The arguments of :func:`winograd_forward` besides the arrays: ``chunk``,
    the bands per chunk of each part."""
    chunk: int


class ForwardPath(NamedTuple):
    """How :func:`conv_forward` runs one convolution (see :func:`forward_path`).

    ``algorithm``: one of ALGORITHMS.  ``geometry``: its :class:`Geometry`.
    ``direct``: the :class:`DirectLoop` of the 'direct' algorithm (else None).
    ``compiled``: where a compiled form computes the convolution for inputs
    of any batch, its arguments: the DirectLoop for :func:`direct_forward`,
    a :class:`WinogradForm` for :func:`winograd_forward`; else None.
    """
    algorithm: str
    geometry: Geometry
    direct: DirectLoop | None
    compiled: DirectLoop | WinogradForm | None


def forward_path(x_shape, w_shape, dtype, strides=1, padding='valid', dilation=1, pool=None):
    """The :class:`ForwardPath` of :func:`conv_forward` for inputs of shape
    ``x_shape`` (N, *spatial, C) and kernels ``w_shape`` of ``dtype``, its
    arguments checked: the one place that chooses a convolution's algorithm.

    A 1x1 kernel with stride 1 is one product ('pointwise'); windows of at
    most ``tuning.CONV_DIRECT_MAX_PATCH`` values the direct loop ('direct'),
    whose sums over nine window values at a time stay in registers; 3x3
    kernels with stride 1 over enough channels and blocks Winograd F(4x4, 3x3)
    ('winograd'); the rest im2col ('columns').  ``tuning.CONV_PATH``, where
    set, takes that algorithm instead wherever it can run the convolution.
    """
    dtype = np.dtype(dtype)
    return _forward_path(tuple(x_shape), tuple(w_shape), dtype, _hashable(strides), padding,
                         _hashable(dilation), pool, _path_tuning())


def _path_tuning():
    """The tuning entries :func:`_forward_path` reads, as they are now: part of
    its cache key, so that an override takes effect."""
    return (tuning.CONV_PATH, tuning.CONV_DIRECT_MAX_PATCH, tuning.CONV_DIRECT_MIN_ROW_BYTES,
            tuning.CONV_DIRECT_CHUNK_BYTES, tuning.CONV_WINOGRAD_MIN_CHANNELS, tuning.CONV_WINOGRAD_MIN_BLOCKS,
            tuning.CONV_WINOGRAD_CHUNK_BYTES, tuning.CONV_WINOGRAD_MIN_ROWS)


def _hashable(value):
    """Strides or dilation as a key of :func:`_forward_path` (a list as a tuple)."""
    return tuple(value) if isinstance(value, list) else value


# Cached for the reason geometry is: a batch-1 network asks for the same few
# convolutions on every call, and working the choice out takes about as long
# as a small first convolution itself.
@functools.lru_cache(maxsize=1024)
def _forward_path(x_shape, w_shape, dtype, strides, padding, dilation, pool, path_tuning):
    check_conv(x_shape, w_shape, 'conv_forward')
    g = geometry(x_shape[1:-1], w_shape[:-2], strides, padding, dilation)
    if pool is not None and (pool not in ('max', 'avg') or g.rank != 2):
        raise ValueError(f"conv_forward: pool must be 'max' or 'avg' after a 2-D convolution, "
                         f"got {pool!r} for an input of shape {x_shape}")
    batch, channels, out_ch = x_shape[0], x_shape[-1], w_shape[-1]
    # float16 has no vector arithmetic in Numba: it stays with NumPy's matmul
    vector_float = dtype in (np.float32, np.float64)
    runs = {'pointwise': is_pointwise(g), 'direct': vector_float,
            'winograd': vector_float and _is_winograd_shape(g), 'columns': True}
    pin = tuning.CONV_PATH
    if pin is not None and runs[pin]:
        algorithm = pin
    elif runs['pointwise']:
        algorithm = 'pointwise'
    elif (vector_float and math.prod(w_shape[:-1]) <= tuning.CONV_DIRECT_MAX_PATCH
          and out_ch * dtype.itemsize >= tuning.CONV_DIRECT_MIN_ROW_BYTES):
        algorithm = 'direct'
    elif vector_float and _winograd_pays(g, batch, channels, out_ch, dtype):
        algorithm = 'winograd'
    else:
        algorithm = 'columns'
    direct = compiled = None
    if algorithm == 'direct':
        direct = direct_loop(g, channels, out_ch, dtype.itemsize)
        compiled = direct if g.rank == 2 else None  # the same loop for any batch
    # (more images only add blocks: Winograd at batch 1 is Winograd at any batch)
    elif algorithm == 'winograd' and g.pad == (0, 0, 0) and g.out[1] % 4 == 0 and g.out[2] % 4 == 0:
        compiled = WinogradForm(winograd_chunk_bands(g.out[2] // 4, channels, out_ch, dtype.itemsize))
    return ForwardPath(algorithm, g, direct, compiled)


def _is_winograd_shape(g):
    """Whether Winograd F(4x4, 3x3) computes the convolution of ``g``: a 3x3
    kernel with stride 1 and no dilation over one depth slice (a 3-D
    convolution with a (1, 3, 3) kernel over several slices is not one 2-D
    convolution of them)."""
    return g.size[0] == 1 and g.kernel == (1, 3, 3) and g.stride == (1, 1, 1) and g.dilation == (1, 1, 1)


def _winograd_pays(g, batch, channels, out_ch, dtype):
    """Whether Winograd, rather than im2col, runs the convolution of ``g``: its
    shape, enough channels in and out, and enough 4x4 blocks of outputs (at
    least one per 1024 products of an input and an output channel: the
    kernel's transform is made on every call)."""
    blocks = batch * -(-g.out[1] // 4) * -(-g.out[2] // 4)
    return (_is_winograd_shape(g) and dtype in (np.float32, np.float64)
            and min(channels, out_ch) >= tuning.CONV_WINOGRAD_MIN_CHANNELS
            and blocks >= max(tuning.CONV_WINOGRAD_MIN_BLOCKS, channels * out_ch // 1024))


def conv_forward(x, w, strides=1, padding='valid', dilation=1, epilogue=None, pool=None,
                 pool_first=False):
    """Convolution (cross-correlation) of x (N, *spatial, C) with w (*k, C, OC).

    ``strides`` and ``dilation`` are an int or one int per spatial axis;
    ``padding`` is 'valid', 'same' or 'causal'.  Returns (N, *out, OC).
    ``epilogue(block, out)``, where given, is called with each block of output
    rows as soon as it is computed (while it is in cache), a (rows, OC) array,
    and ``out``, a (rows, OC) array where it writes their final values; blocks
    may come from several threads at once.  (Out of place: a Numba loop
    reading and writing the same array was much slower, its aliasing keeping
    it from vectorising.)

    ``pool`` ('max' or 'avg'; 2-D convolutions only) pools the result, after
    the epilogue, over 2x2 windows with stride 2 and 'valid' padding, block by
    block while in cache, and returns (N, OH // 2, OW // 2, OC) instead.  With
    ``pool_first``, the epilogue runs on the pooled values instead, where the
    caller knows the two commute (a max pooling, an epilogue non-decreasing in
    the convolution's value): on a quarter of the values.
    """
    x, w = float_arrays(x, w)
    path = _forward_path(x.shape, w.shape, x.dtype, _hashable(strides), padding, _hashable(dilation), pool,
                         _path_tuning())
    g, algorithm = path.geometry, path.algorithm
    batch, channels, out_ch = x.shape[0], x.shape[-1], w.shape[-1]
    if isinstance(epilogue, parts.CompiledEpilogue):
        epilogue.check(out_ch, x.dtype)  # before any block runs
    if pool is None:
        y = np.empty(batch_output_shape(g, batch, out_ch), x.dtype)
        y2, pooled = y.reshape(-1, out_ch), None
    else:
        y2, pooled = None, np.empty((batch, g.out[1] // 2, g.out[2] // 2, out_ch), x.dtype)
    after_pool = final = None
    if pool_first and pool is not None and epilogue is not None:
        epilogue, after_pool = None, epilogue
        final = np.empty_like(pooled)
    w2 = w.reshape(-1, out_ch)
    if algorithm == 'direct' and pool is None and isinstance(epilogue, parts.CompiledEpilogue):
        # the loop runs the epilogue itself, on each block while in cache
        window_products(as_5d(x, g), g, w2, y2, path.direct, epilogue=epilogue.template)
        return y
    finish = None
    # (Winograd pools by itself where no epilogue comes first: in its parts or in chunks)
    if epilogue is not None or (pool is not None and algorithm != 'winograd'):
        finish = block_finisher(g, out_ch, epilogue, y2, pool, pooled)
    if algorithm == 'pointwise':
        if finish is None:
            np.matmul(x.reshape(-1, channels), w2, out=y2)
        else:
            finish(np.matmul(x.reshape(-1, channels), w2), 0, batch * positions_per_image(g))
    elif algorithm == 'direct':
        window_products(as_5d(x, g), g, w2, y2, path.direct, finish)
    elif algorithm == 'winograd':
        work = _band_work(batch * positions_per_image(g), pool, pooled, y2, epilogue, after_pool, final)
        if winograd_products(as_5d(x, g), g, w.reshape(3, 3, channels, out_ch), y2, finish,
                             band_work=work) and isinstance(after_pool, parts.CompiledEpilogue):
            return final  # its parts ran the epilogue too
    else:
        columns_times(as_5d(x, g), g, w2, y2, finish)
    if after_pool is not None:
        after_pool(pooled.reshape(-1, out_ch), final.reshape(-1, out_ch))
        return final
    return y if pool is None else pooled


def _band_work(outputs, pool, pooled, y2, epilogue, after_pool, final):
    """The :class:`BandWork` of :func:`winograd_products` for :func:`conv_forward`:
    what Winograd's parts do besides their products, which fill ``outputs``
    rows (of pooled's type, y2 being None) or y2: a compiled epilogue on their
    outputs (into y2, or into a scratch they pool from), a pooling, a compiled
    epilogue on the pooled values (``after_pool``, into ``final``); None
    where they do none of it."""
    if isinstance(epilogue, parts.CompiledEpilogue):
        if pool is None:
            return BandWork(None, y2[:0], epilogue.template, y2, pool_first=False)
        done = np.empty((outputs, pooled.shape[-1]), pooled.dtype)
        return BandWork(pool, pooled.reshape(-1, pooled.shape[-1]), epilogue.template, done,
                        pool_first=False)
    if epilogue is not None or pool is None:
        return None
    if isinstance(after_pool, parts.CompiledEpilogue):
        return BandWork(pool, pooled.reshape(-1, pooled.shape[-1]), after_pool.template,
                        final.reshape(-1, final.shape[-1]))
    return BandWork(pool, pooled.reshape(-1, pooled.shape[-1]))


def compiled_path(x_shape, w_shape, dtype, strides, padding, dilation):
    """The :class:`ForwardPath` of a 2-D convolution of inputs of shape x_shape
    (N, H, W, C), N any batch (None allowed), where a compiled form computes
    :func:`conv_forward`'s result (its ``compiled``: the arguments of
    :func:`direct_forward` or :func:`winograd_forward` besides the arrays);
    else None.  For numbackend's plans compiled as one call, where the Python
    around conv_forward's compiled loops would take as long as a small layer."""
    if len(x_shape) != 4 or None in x_shape[1:] or np.dtype(dtype) not in (np.float32, np.float64):
        return None
    path = forward_path((1,) + tuple(x_shape[1:]), w_shape, dtype, strides, padding, dilation)
    return path if path.compiled is not None else None


def direct_form(x_shape, w_shape, dtype, strides, padding, dilation):
    """The :class:`DirectLoop` of :func:`direct_forward` for a 2-D convolution of
    inputs of shape x_shape (N, H, W, C), N any batch (None allowed), whatever
    algorithm :func:`forward_path` would choose; None where it is no 2-D
    convolution of float32 or float64.  For code that runs no parts (a plan
    exported into a library of its own)."""
    dtype = np.dtype(dtype)
    if len(x_shape) != 4 or None in x_shape[1:] or dtype not in (np.float32, np.float64):
        return None
    check_conv((1,) + tuple(x_shape[1:]), w_shape, 'direct_form')
    g = geometry(tuple(x_shape[1:-1]), tuple(w_shape[:-2]), _hashable(strides), padding,
                 _hashable(dilation))
    return direct_loop(g, x_shape[-1], w_shape[-1], dtype.itemsize)


@njit_cached(**JIT_OPTIONS)
def winograd_or_direct(x, w, u, sizes, offsets, pool_mode, chunk):
    """The convolution of x (N, H, W, C) with w (3, 3, C, OC) by Winograd on the
    calling thread (:func:`winograd_serial`, ``u`` w's kernel_transform), or by
    the direct loop of ``sizes`` and ``offsets`` (:func:`direct_form`) where x
    holds an inf or a NaN; max pooled over 2x2 windows where ``pool_mode`` is
    POOL_MODES['max']."""
    finite, y = winograd_serial(x, u, pool_mode, chunk)
    if finite:
        return y
    y = direct_forward(x, w, sizes, offsets)
    return max_pool_2x2(y) if pool_mode else y


def conv_backward_input(dy, w, x_shape, strides=1, padding='valid', dilation=1):
    """Gradient of :func:`conv_forward` with respect to its input, shape ``x_shape``.

    This is also the transposed convolution of ``dy`` (see
    :func:`conv_transpose_forward`).
    """
    dy, w = float_arrays(dy, w)
    x_shape = tuple(int(s) for s in x_shape)
    check_conv(x_shape, w.shape, 'conv_backward_input')
    g = geometry(x_shape[1:-1], w.shape[:-2], strides, padding, dilation)
    check_output_gradient(g, dy.shape, 'conv_backward_input')
    if dy.shape[0] != x_shape[0] or dy.shape[-1] != w.shape[-1]:
        raise ValueError(f'conv_backward_input: gradient {dy.shape} does not match '
                         f'batch {x_shape[0]} and kernel {w.shape}')
    channels, out_ch = w.shape[-2:]
    w2t = w.reshape(-1, out_ch).T
    dy2 = dy.reshape(-1, out_ch)
    if is_pointwise(g):
        return np.matmul(dy2, w2t).reshape(x_shape)
    dx = np.empty(x_shape, dy.dtype)
    full = _full_correlation(g)
    if full is not None and _winograd_pays(full, dy.shape[0], out_ch, channels, dy.dtype):
        # dx is dy's correlation with the kernel turned half a turn, its channels
        # swapped: a 3x3 convolution with stride 1, which Winograd takes
        flipped = np.ascontiguousarray(w.reshape(3, 3, channels, out_ch)[::-1, ::-1].swapaxes(2, 3))
        # (a copy made on each call: its transform is not kept)
        winograd_products(as_5d_out(dy, g), full, flipped, dx.reshape(-1, channels), remember=False)
        return dx
    gradient_to_columns(dy2, w2t, g, as_5d(dx, g))
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
    x, dy = float_arrays(x, dy)
    w_shape = tuple(int(s) for s in w_shape)
    check_conv(x.shape, w_shape, 'conv_backward_kernel')
    g = geometry(x.shape[1:-1], w_shape[:-2], strides, padding, dilation)
    check_output_gradient(g, dy.shape, 'conv_backward_kernel')
    out_ch = w_shape[-1]
    dy2 = dy.reshape(-1, out_ch)
    if is_pointwise(g):
        return (x.reshape(-1, x.shape[-1]).T @ dy2).reshape(w_shape)
    patch = int(np.prod(w_shape[:-1]))
    return columns_transposed_times(as_5d(x, g), g, dy2, patch).reshape(w_shape)


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


def separable_conv_forward(x, depthwise_w, pointwise_w, strides=1, padding='valid', dilation=1):
    """Separable convolution: depthwise (*k, C, M), then pointwise (*1, C*M, OC).

    The gradients are those of the two steps chained; a caller that needs
    them keeps the depthwise output.
    """
    return conv_forward(depthwise_conv_forward(x, depthwise_w, strides, padding, dilation),
                        pointwise_w)
