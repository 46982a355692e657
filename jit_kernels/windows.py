"""What every window sweep shares (convolution, pooling, resizing): the
geometry of sliding a window over channels_last images and its checks, views
of the windows, and how a kernel's work is launched and split between threads.

Padding ('valid', 'same', 'causal') follows TensorFlow: for 'same' the output
size is ``ceil(in / stride)`` and the total padding
``max((out - 1) * stride + (k - 1) * dilation + 1 - in, 0)`` is split with
the smaller half before; 'causal' pads ``(k - 1) * dilation`` before only.
Everything works on five-dimensional arrays ``(N, D, H, W, C)``: rank 1 and 2
inputs get leading singleton spatial axes (kernel size 1, stride 1, no
padding there), so one kernel serves every rank and each compiles once per
dtype.
"""

import functools
from collections import namedtuple

import numpy as np

from . import blas, machine, parts, tuning
from .fork import parallel_ok

# the options of the window kernels' @njit_cached
JIT_OPTIONS = {'error_model': 'numpy', 'nogil': True}

PADDINGS = ('valid', 'same', 'causal')
FLOAT_TYPES = (np.float16, np.float32, np.float64)

Geometry = namedtuple('Geometry', 'rank size kernel stride dilation pad out')
Geometry.__doc__ = """Sizes of one convolution or pooling window sweep.

``rank`` is the spatial rank (1..3); every other field is a 3-tuple over the
axes (D, H, W), with leading 1s for ranks below 3: input ``size``,
``kernel`` taps, ``stride``, ``dilation``, ``pad`` before, ``out`` size.
"""


def int_tuple(value, rank, name):
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
    kernel = int_tuple(kernel, rank, 'kernel size')
    stride = int_tuple(strides, rank, 'strides')
    dilation = int_tuple(dilation, rank, 'dilation')
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


def taps_of(g):
    """The taps of the window (its values per input channel)."""
    return g.kernel[0] * g.kernel[1] * g.kernel[2]


def batch_output_shape(g, batch, channels):
    """The output's shape (N, *out, channels) at the geometry's own rank."""
    return (batch,) + g.out[3 - g.rank:] + (channels,)


def as_5d(a, g):
    """View of an (N, *spatial, C) array as (N, D, H, W, C)."""
    return a.reshape((a.shape[0],) + g.size + (a.shape[-1],))


def as_5d_out(a, g):
    """View of an (N, *out, C) array as (N, OD, OH, OW, C)."""
    return a.reshape((a.shape[0],) + g.out + (a.shape[-1],))


def float_arrays(*arrays):
    """C-contiguous arrays of their common floating dtype."""
    dtype = getattr(arrays[0], "dtype", None)
    if dtype in FLOAT_TYPES:
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


def launch(kernel, work, *args):
    """Call a kernel of :func:`njit_cached_twins`: its serial twin when ``work``
    (elements touched) is below ``tuning.LIBRARY_PARALLEL_MIN_WORK``."""
    if work >= tuning.LIBRARY_PARALLEL_MIN_WORK and parallel_ok():
        return kernel(*args)
    return kernel.serial(*args)


def launch_by_images(kernel, work, batched, *rest):
    """:func:`launch` of ``kernel(*batched, *rest)``, where each array of
    ``batched`` has the images on its first axis.  From
    ``tuning.LIBRARY_IMAGE_PARTS_MIN_WORK`` up the images split between BLAS's threads
    (:func:`in_image_parts`), each part on one thread: Numba's own threads
    would wait for OpenBLAS's, which spin on after the last product."""
    batch = batched[0].shape[0]
    if work < tuning.LIBRARY_IMAGE_PARTS_MIN_WORK or min(blas.threads(), batch) < 2:
        return launch(kernel, work, *batched, *rest)
    in_image_parts(batch, work, lambda lo, hi: kernel.serial(*(a[lo:hi] for a in batched), *rest))


def check_conv(x_shape, w_shape, what):
    """Raise ValueError, naming ``what``, where input and kernel shapes do not match."""
    rank = len(w_shape) - 2
    if len(x_shape) != rank + 2 or x_shape[-1] != w_shape[-2]:
        raise ValueError(f'{what}: input {tuple(x_shape)} does not match kernel '
                         f'{tuple(w_shape)} (expected (N, *spatial, {w_shape[-2]}) '
                         f'with {rank} spatial axes)')


def check_output_gradient(g, dy_shape, what):
    """Raise ValueError, naming ``what``, where a gradient ``dy_shape`` is not of
    the forward output's spatial shape."""
    expected = g.out[3 - g.rank:]
    if tuple(dy_shape[1:-1]) != expected:
        raise ValueError(f'{what}: gradient spatial shape {tuple(dy_shape[1:-1])} does not '
                         f'match the forward output {expected}')


# ---------------------------------------------------------------------------
# Views of the windows, and how the work splits between threads.

def zero_padded(x5, g, reach=None):
    """x5, or where the windows reach into the padding a zero-padded copy of it
    (cut to what the windows reach, or to ``reach`` (D, H, W) where given, which
    they do not pass)."""
    reach = padded_reach(g, reach)
    if reach is None:
        return x5
    padded = np.zeros(x5.shape[:1] + reach + x5.shape[-1:], x5.dtype)
    inside = [min(size, r - p) for size, r, p in zip(g.size, reach, g.pad)]
    target = tuple(slice(p, p + n) for p, n in zip(g.pad, inside))
    padded[(slice(None),) + target] = x5[(slice(None),) + tuple(slice(n) for n in inside)]
    return padded


@functools.lru_cache(maxsize=1024)
def padded_reach(g, reach=None):
    """The (D, H, W) of :func:`zero_padded`'s copy, or None where x5 itself serves."""
    if reach is None:
        reach = tuple((o - 1) * s + (k - 1) * d + 1
                      for o, s, k, d in zip(g.out, g.stride, g.kernel, g.dilation))
    if not any(g.pad) and all(r <= size for r, size in zip(reach, g.size)):
        return None
    return reach


def window_patches(x5, g):
    """Read-only strided view (N, OD, OH, OW, KD, KH, KW, C) of the windows of
    x5 (N, D, H, W, C); when the windows reach into the padding, of a zero-
    padded copy.  Copied into a (N*P, taps*C) buffer this is im2col: NumPy's
    strided copy was faster than a Numba loop doing the same."""
    x5 = zero_padded(x5, g)
    spatial = x5.strides[1:4]
    strides = (x5.strides[:1] + tuple(s * k for s, k in zip(spatial, g.stride))
               + tuple(s * d for s, d in zip(spatial, g.dilation)) + x5.strides[4:])
    shape = x5.shape[:1] + g.out + g.kernel + x5.shape[-1:]
    # np.ndarray over x5's buffer: as_strided does the same far more slowly,
    # which shows at batch 1.  x5 is C-contiguous here.
    view = np.ndarray(shape, x5.dtype, x5, 0, strides)
    view.flags.writeable = False
    return view


def positions_per_image(g):
    """Output positions per image (rows of the column matrix per image)."""
    return g.out[0] * g.out[1] * g.out[2]


def is_pointwise(g):
    """A 1x1 convolution with stride 1: the input is already its column matrix."""
    return g.kernel == (1, 1, 1) and g.stride == (1, 1, 1)


def in_image_parts(batch, work, run):
    """``[run(lo, hi)]`` over images (or Winograd's bands) lo..hi-1, split between
    BLAS's threads (:func:`parts.run_parts`) by ``work``, the elements all the
    images touch: parts of Python, each holding the GIL while it starts, so
    about sqrt(work / ``tuning.PARTS_PYTHON_HANDOFF_WORK``) of them, at most
    one per thread (machine.python_part_count).  Each part then copies its
    columns and multiplies them on one thread while the others copy or
    multiply their own, which beat one copy at a time followed by a product
    on both threads (PERFORMANCE.md, W4: batch split); ``run`` goes through
    its images chunk by chunk."""
    count = 1
    if batch >= 2 and work >= 4 * tuning.PARTS_PYTHON_HANDOFF_WORK:  # threads() calls OpenBLAS
        count = machine.python_part_count(work, blas.threads(), tuning.PARTS_PYTHON_HANDOFF_WORK, batch)
    if count < 2:
        return [run(0, batch)]
    per = -(-batch // count)
    count = -(-batch // per)  # none empty: 5 images on 4 threads are 2 + 2 + 1
    return parts.run_parts(count, lambda i: run(i * per, min(batch, (i + 1) * per)))
