"""Convolution, pooling and resizing in the graph: each public function against
direct NumPy loops (cross-correlation, TensorFlow's padding), gradients against
central finite differences, construction-time errors, and a Keras 2.2.5 CNN."""
import itertools
import json

import numpy as np
import pytest

import numbackend as K
from tests.source_checks import compiled_calls, literal_calls

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape)


def run(fn, *arrays):
    """fn built on float64 placeholders of the arrays' shapes, run on them."""
    holders = [K.placeholder(a.shape, dtype="float64") for a in arrays]
    return K.function(holders, [fn(*holders)])(list(arrays))[0]


# ---------------------------------------------------------------------------
# NumPy references, channels_last, any spatial rank


def pad_before(size, k, s, d, padding):
    span = (k - 1) * d + 1
    if padding == "valid":
        return (size - span) // s + 1, 0
    if padding == "causal":
        return (size - 1) // s + 1, span - 1
    out = -(-size // s)
    return out, max((out - 1) * s + span - size, 0) // 2


def windows(x_shape, kernel, strides, padding, dilation):
    """For every output position: its index and the input index of each tap (or None)."""
    geo = [pad_before(n, k, s, d, padding)
           for n, k, s, d in zip(x_shape[1:-1], kernel, strides, dilation)]
    outs = [g[0] for g in geo]
    for o in itertools.product(*[range(n) for n in outs]):
        taps = []
        for t in itertools.product(*[range(k) for k in kernel]):
            i = tuple(oo * s + tt * d - g[1] for oo, tt, s, d, g in zip(o, t, strides, dilation, geo))
            inside = all(0 <= ii < n for ii, n in zip(i, x_shape[1:-1]))
            taps.append((t, i if inside else None))
        yield o, taps, outs


def ref_conv(x, w, strides, padding, dilation):
    rank = x.ndim - 2
    out = None
    for o, taps, outs in windows(x.shape, w.shape[:rank], strides, padding, dilation):
        if out is None:
            out = np.zeros((x.shape[0], *outs, w.shape[-1]))
        for t, i in taps:
            if i is not None:
                out[(slice(None), *o)] += x[(slice(None), *i)] @ w[t]
    return out


def ref_conv_transpose(x, w, out_shape, strides, padding, dilation):
    """Scatter of each input position through the kernel w (*k, OC, IC)."""
    rank = x.ndim - 2
    y = np.zeros(out_shape)
    for o, taps, _ in windows(out_shape, w.shape[:rank], strides, padding, dilation):
        for t, i in taps:
            if i is not None:
                y[(slice(None), *i)] += x[(slice(None), *o)] @ w[t].T
    return y


def ref_depthwise(x, w, strides, padding, dilation):
    rank = x.ndim - 2
    c, m = w.shape[-2:]
    out = None
    for o, taps, outs in windows(x.shape, w.shape[:rank], strides, padding, dilation):
        if out is None:
            out = np.zeros((x.shape[0], *outs, c * m))
        for t, i in taps:
            if i is not None:
                out[(slice(None), *o)] += (x[(slice(None), *i)][:, :, None] * w[t]).reshape(-1, c * m)
    return out


def ref_pool(x, size, strides, padding, mode):
    rank = x.ndim - 2
    out = None
    for o, taps, outs in windows(x.shape, size, strides, padding, (1,) * rank):
        if out is None:
            out = np.zeros((x.shape[0], *outs, x.shape[-1]))
        vals = np.stack([x[(slice(None), *i)] for _, i in taps if i is not None])
        out[(slice(None), *o)] = vals.max(0) if mode == "max" else vals.mean(0)
    return out


def ref_bilinear(x, factors):
    """TensorFlow 1's resize_bilinear: source positions and fractions in float32."""
    for axis in range(x.ndim - 2, 0, -1):
        n = x.shape[axis]
        m = n * factors[axis - 1]
        pos = np.arange(m).astype(np.float32) * (np.float32(n) / np.float32(m))
        lo = pos.astype(int)
        hi = np.minimum(lo + 1, n - 1)
        f = (pos - lo.astype(np.float32)).astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - axis - 1))
        a, b = np.take(x, lo, axis=axis), np.take(x, hi, axis=axis)
        x = a + (b - a) * f
    return x


def ref_local(x, w, kernel, strides, feature_order):
    """Keras 2.2.5's slicing: patch features (taps, C) or (C, taps)."""
    rank = x.ndim - 2
    rows = []
    for o, taps, outs in windows(x.shape, kernel, strides, "valid", (1,) * rank):
        patch = np.stack([x[(slice(None), *i)] for _, i in taps], axis=1)   # (N, taps, C)
        if feature_order == "channels_first":
            patch = patch.transpose(0, 2, 1)
        rows.append(patch.reshape(x.shape[0], -1))
    out = np.einsum("pnf,pfo->npo", np.stack(rows), w)
    return out.reshape((x.shape[0], *outs, w.shape[-1]))


def first(x):
    """channels_last -> channels_first."""
    return np.moveaxis(x, -1, 1)


def last(x):
    return np.moveaxis(x, 1, -1)


def both_formats(fn, ref, x, *rest):
    """fn(x, *rest, data_format) against ref on channels_last and channels_first x."""
    want = ref(x, *rest)
    got = run(lambda *t: fn(*t, "channels_last"), x, *rest)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    got = run(lambda *t: fn(*t, "channels_first"), first(x), *rest)
    np.testing.assert_allclose(got, first(want), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------
# Forward values

CASES = [  # strides, padding, dilation
    (1, "valid", 1), (1, "same", 1), (2, "same", 1), (2, "valid", 1), (1, "same", 2)]


@pytest.mark.parametrize("strides,padding,dilation", CASES)
def test_conv2d(strides, padding, dilation):
    x, w = rand(2, 7, 6, 3), rand(3, 2, 3, 4)
    s, d = (strides, strides), (dilation, dilation)
    both_formats(lambda x, w, f: K.conv2d(x, w, s, padding, f, d),
                 lambda x, w: ref_conv(x, w, s, padding, d), x, w)


@pytest.mark.parametrize("strides,padding,dilation", CASES + [(1, "causal", 2), (2, "causal", 1)])
def test_conv1d(strides, padding, dilation):
    x, w = rand(2, 9, 3), rand(3, 3, 2)
    want = ref_conv(x, w, (strides,), padding, (dilation,))
    got = run(lambda x, w: K.conv1d(x, w, strides, padding, "channels_last", dilation), x, w)
    np.testing.assert_allclose(got, want, atol=1e-9)
    if padding != "causal":
        got = run(lambda x, w: K.conv1d(x, w, strides, padding, "channels_first", dilation),
                  first(x), w)
        np.testing.assert_allclose(got, first(want), atol=1e-9)


@pytest.mark.parametrize("strides,padding,dilation", [(1, "valid", 1), (2, "same", 1),
                                                      (1, "same", 2)])
def test_conv3d(strides, padding, dilation):
    x, w = rand(2, 5, 4, 5, 2), rand(2, 3, 2, 2, 3)
    s, d = (strides,) * 3, (dilation,) * 3
    both_formats(lambda x, w, f: K.conv3d(x, w, s, padding, f, d),
                 lambda x, w: ref_conv(x, w, s, padding, d), x, w)


@pytest.mark.parametrize("strides,padding,out", [((1, 1), "valid", (7, 6)), ((2, 2), "same", (8, 7)),
                                                 ((2, 1), "valid", (9, 6))])
def test_conv2d_transpose(strides, padding, out):
    w = rand(3, 2, 4, 3)                       # (rows, cols, out_channels, in_channels)
    out_shape = (2, *out, 4)
    x_spatial = [pad_before(n, k, s, 1, padding)[0] for n, k, s in zip(out, w.shape, strides)]
    x = rand(2, *x_spatial, 3)
    want = ref_conv_transpose(x, w, out_shape, strides, padding, (1, 1))
    got = run(lambda x, w: K.conv2d_transpose(x, w, out_shape, strides, padding, "channels_last"),
              x, w)
    np.testing.assert_allclose(got, want, atol=1e-9)
    # channels_first, with a None batch in output_shape
    shape_first = (None, 4, *out)
    got = run(lambda x, w: K.conv2d_transpose(x, w, shape_first, strides, padding,
                                              "channels_first"), first(x), w)
    np.testing.assert_allclose(got, first(want), atol=1e-9)


def test_conv2d_transpose_dilated_and_symbolic_output_shape():
    w, x = rand(2, 2, 2, 3), rand(2, 4, 3, 3)
    want = ref_conv_transpose(x, w, (2, 6, 5, 2), (1, 1), "valid", (2, 2))
    got = run(lambda x, w: K.conv2d_transpose(x, w, (2, 6, 5, 2), padding="valid",
                                              dilation_rate=(2, 2)), x, w)
    np.testing.assert_allclose(got, want, atol=1e-9)
    # Keras' Conv2DTranspose passes scalar tensors computed from K.shape(inputs)
    xp, wp = K.placeholder((None, None, None, 3), dtype="float64"), K.variable(w, dtype="float64")
    dims = K.shape(xp)
    y = K.conv2d_transpose(xp, wp, (dims[0], dims[1] + 2, dims[2] + 2, 2), padding="valid",
                           dilation_rate=(2, 2))
    assert K.int_shape(y) == (None, None, None, 2)
    np.testing.assert_allclose(K.function([xp], [y])([x])[0], want, atol=1e-9)
    # where the input's spatial shape is known, so is the output's
    xp = K.placeholder((None, 4, 3, 3), dtype="float64")
    dims = K.shape(xp)
    y = K.conv2d_transpose(xp, wp, (dims[0], dims[1] + 2, dims[2] * 1 + 2, 2), padding="valid",
                           dilation_rate=(2, 2))
    assert K.int_shape(y) == (None, 6, 5, 2)
    np.testing.assert_allclose(K.function([xp], [y])([x])[0], want, atol=1e-9)


def test_conv3d_transpose():
    w, x = rand(2, 2, 2, 2, 3), rand(1, 2, 3, 2, 3)
    out_shape = (1, 4, 6, 4, 2)
    want = ref_conv_transpose(x, w, out_shape, (2, 2, 2), "same", (1, 1, 1))
    got = run(lambda x, w: K.conv3d_transpose(x, w, out_shape, (2, 2, 2), "same",
                                              "channels_last"), x, w)
    np.testing.assert_allclose(got, want, atol=1e-9)
    got = run(lambda x, w: K.conv3d_transpose(x, w, (1, 2, 4, 6, 4), (2, 2, 2), "same",
                                              "channels_first"), first(x), w)
    np.testing.assert_allclose(got, first(want), atol=1e-9)


@pytest.mark.parametrize("strides,padding,dilation", [(1, "valid", 1), (2, "same", 1),
                                                      (1, "same", 2)])
def test_depthwise_conv2d(strides, padding, dilation):
    x, w = rand(2, 6, 5, 3), rand(3, 2, 3, 2)
    s, d = (strides, strides), (dilation, dilation)
    both_formats(lambda x, w, f: K.depthwise_conv2d(x, w, s, padding, f, d),
                 lambda x, w: ref_depthwise(x, w, s, padding, d), x, w)


@pytest.mark.parametrize("strides,padding,dilation", [(1, "valid", 1), (2, "same", 1),
                                                      (1, "same", 2)])
def test_separable_conv(strides, padding, dilation):
    x, dw, pw = rand(2, 6, 5, 3), rand(3, 2, 3, 2), rand(1, 1, 6, 4)
    s, d = (strides, strides), (dilation, dilation)

    def ref(x, dw, pw):
        return ref_depthwise(x, dw, s, padding, d) @ pw[0, 0]
    both_formats(lambda x, dw, pw, f: K.separable_conv2d(x, dw, pw, s, padding, f, d), ref,
                 x, dw, pw)
    x1, dw1, pw1 = rand(2, 8, 3), rand(3, 3, 2), rand(1, 6, 4)
    both_formats(lambda x, dw, pw, f: K.separable_conv1d(x, dw, pw, strides, padding, f, dilation),
                 lambda x, dw, pw: ref_depthwise(x, dw, (strides,), padding, (dilation,)) @ pw[0],
                 x1, dw1, pw1)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("size,strides,padding", [((2, 2), (2, 2), "valid"), ((3, 2), (1, 1), "valid"),
                                                  ((3, 3), (2, 2), "same"), ((2, 3), (2, 1), "same")])
def test_pool2d(mode, size, strides, padding):
    x = rand(2, 7, 6, 3)
    both_formats(lambda x, f: K.pool2d(x, size, strides, padding, f, mode),
                 lambda x: ref_pool(x, size, strides, padding, mode), x)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_pool3d(mode, padding):
    x = rand(2, 5, 4, 5, 2)
    both_formats(lambda x, f: K.pool3d(x, (2, 2, 3), (2, 1, 2), padding, f, mode),
                 lambda x: ref_pool(x, (2, 2, 3), (2, 1, 2), padding, mode), x)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_resize_images(interpolation):
    x = rand(2, 3, 4, 2)
    if interpolation == "nearest":
        want = np.repeat(np.repeat(x, 2, axis=1), 3, axis=2)
    else:
        want = ref_bilinear(x, (2, 3))
    both_formats(lambda x, f: K.resize_images(x, 2, 3, f, interpolation), lambda x: want, x)


def tf1_resize_bilinear(x, out_h, out_w):
    """TensorFlow 1's resize_bilinear (align_corners=False, no half-pixel centres)
    on channels_last float32 images: source row i * (H / out_h) and column
    j * (W / out_w) in float32, their integer parts and fractions, then
    top = tl + (tr - tl) * dx, bottom = bl + (br - bl) * dx,
    out = top + (bottom - top) * dy, all in float32."""
    def samples(size_in, size_out):
        position = np.arange(size_out).astype(np.float32) * (np.float32(size_in)
                                                              / np.float32(size_out))
        low = np.trunc(position).astype(int)
        return low, np.minimum(low + 1, size_in - 1), position - low.astype(np.float32)
    top, bottom, dy = samples(x.shape[1], out_h)
    left, right, dx = samples(x.shape[2], out_w)
    dx, dy = dx[None, None, :, None], dy[None, :, None, None]
    rows_top, rows_bottom = x[:, top], x[:, bottom]
    upper = rows_top[:, :, left] + (rows_top[:, :, right] - rows_top[:, :, left]) * dx
    lower = rows_bottom[:, :, left] + (rows_bottom[:, :, right] - rows_bottom[:, :, left]) * dx
    return upper + (lower - upper) * dy


def tf1_resize_bilinear_grad(dy, in_h, in_w):
    """TensorFlow 1's ResizeBilinearGrad: each output's gradient added to its four
    source pixels with weights (1 - y)(1 - x), (1 - y) x, y (1 - x) and y x."""
    n, out_h, out_w, c = dy.shape
    dx = np.zeros((n, in_h, in_w, c))
    for i in range(out_h):
        src_y = np.float32(i) * (np.float32(in_h) / np.float32(out_h))
        top, fy = int(src_y), float(src_y - np.float32(int(src_y)))
        bottom = min(top + 1, in_h - 1)
        for j in range(out_w):
            src_x = np.float32(j) * (np.float32(in_w) / np.float32(out_w))
            left, fx = int(src_x), float(src_x - np.float32(int(src_x)))
            right = min(left + 1, in_w - 1)
            dx[:, top, left] += dy[:, i, j] * (1 - fy) * (1 - fx)
            dx[:, top, right] += dy[:, i, j] * (1 - fy) * fx
            dx[:, bottom, left] += dy[:, i, j] * fy * (1 - fx)
            dx[:, bottom, right] += dy[:, i, j] * fy * fx
    return dx


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_resize_images_bilinear_as_tensorflow_with_unknown_dims(data_format):
    """Unknown batch and spatial sizes, several sizes through one function;
    float32 results are TensorFlow 1's to the bit, and the gradient is its
    ResizeBilinearGrad's."""
    last = data_format == "channels_last"
    x = K.placeholder((None, None, None, 3) if last else (None, 3, None, None))
    y = K.resize_images(x, 3, 2, data_format, interpolation="bilinear")
    assert K.int_shape(y) == ((None, None, None, 3) if last else (None, 3, None, None))
    weights = K.placeholder(K.int_shape(y))
    (grad,) = K.gradients(K.sum(y * weights), [x])
    f = K.function([x, weights], [y, grad])
    rng = np.random.default_rng(11)
    for shape in [(2, 4, 5, 3), (1, 7, 3, 3)]:
        images = rng.standard_normal(shape).astype(np.float32)
        dy = rng.standard_normal((shape[0], shape[1] * 3, shape[2] * 2, 3)).astype(np.float32)
        to_format = (lambda a: a) if last else (lambda a: a.transpose(0, 3, 1, 2))
        out, g = f([to_format(images), to_format(dy)])
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, to_format(tf1_resize_bilinear(images, *dy.shape[1:3])))
        np.testing.assert_allclose(g, to_format(tf1_resize_bilinear_grad(dy, *shape[1:3])),
                                   rtol=1e-5, atol=1e-5)


def test_resize_images_other_interpolation_raises_value_error():
    """As Keras 2.2.5's TensorFlow backend (and UpSampling2D): a ValueError."""
    with pytest.raises(ValueError, match="resize_images: interpolation should be one of "
                                         "'nearest' or 'bilinear', got 'bicubic'"):
        K.resize_images(K.placeholder((None, 4, 4, 3)), 2, 2, "channels_last", "bicubic")


def test_resize_volumes():
    x = rand(2, 2, 3, 2, 3)
    want = np.repeat(np.repeat(np.repeat(x, 2, axis=1), 1, axis=2), 3, axis=3)
    both_formats(lambda x, f: K.resize_volumes(x, 2, 1, 3, f), lambda x: want, x)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_local_conv2d(data_format):
    x, w = rand(2, 5, 6, 3), rand(2 * 3, 2 * 2 * 3, 4)   # kernel (2, 2), strides (2, 2)
    want = ref_local(x, w, (2, 2), (2, 2), data_format)
    xin = x if data_format == "channels_last" else first(x)
    got = run(lambda x, w: K.local_conv2d(x, w, (2, 2), (2, 2), (2, 3), data_format), xin, w)
    np.testing.assert_allclose(got, want if data_format == "channels_last" else first(want),
                               atol=1e-9)


def test_local_conv1d():
    x, w = rand(2, 7, 3), rand(3, 3 * 3, 4)                # kernel 3, stride 2
    got = run(lambda x, w: K.local_conv1d(x, w, (3,), (2,)), x, w)
    np.testing.assert_allclose(got, ref_local(x, w, (3,), (2,), "channels_last"), atol=1e-9)


def test_keras1_spellings():
    x, w = rand(2, 6, 5, 3), rand(3, 3, 3, 2)
    want = ref_conv(x, w, (1, 1), "same", (1, 1))
    got = run(lambda x, w: K.conv2d(x, w, border_mode="same", dim_ordering="th"), first(x), w)
    np.testing.assert_allclose(got, first(want), atol=1e-9)
    got = run(lambda x: K.pool2d(x, (2, 2), (2, 2), border_mode="same", dim_ordering="tf",
                                 pool_mode="avg"), x)
    np.testing.assert_allclose(got, ref_pool(x, (2, 2), (2, 2), "same", "avg"), atol=1e-9)
    got = run(lambda x: K.resize_images(x, 2, 2, "th"), first(x))
    np.testing.assert_allclose(got, first(np.repeat(np.repeat(x, 2, 1), 2, 2)))
    # the Keras 1 face: 'th' kernels (out, in, rows, cols)
    from numbackend import keras1
    got = run(lambda x, w: keras1.conv2d(x, w, border_mode="same", dim_ordering="th"),
              first(x), w.transpose(3, 2, 0, 1))
    np.testing.assert_allclose(got, first(want), atol=1e-9)


def test_unknown_spatial_dims_and_float32():
    x, w = rand(2, 7, 6, 3).astype("float32"), rand(3, 3, 3, 4).astype("float32")
    xp = K.placeholder((None, None, None, 3))
    y = K.conv2d(xp, K.variable(w), (2, 2), "same")
    assert K.int_shape(y) == (None, None, None, 4) and K.dtype(y) == "float32"
    got = K.function([xp], [y])([x])[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref_conv(x.astype(float), w.astype(float), (2, 2), "same",
                                             (1, 1)), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Element-wise work after a convolution runs on each block of its output rows


def _epilogue_function(build, x, *others, dtype="float64"):
    holders = [K.placeholder((None,) + a.shape[1:], dtype=dtype) for a in (x,) + others]
    f = K.function(holders, [build(*holders)])
    return f, f([x] + list(others))[0]


@pytest.mark.parametrize("kernel", [(3, 3), (1, 1)])  # im2col, and one product
def test_conv_epilogue_bias_and_relu(kernel):
    x, w, b = rand(3, 7, 6, 3), rand(*kernel, 3, 5), rand(5)
    f, got = _epilogue_function(
        lambda x: K.relu(K.bias_add(K.conv2d(x, K.variable(w, dtype="float64"), padding="same"), K.variable(b, dtype="float64"))), x)
    assert "conv+fused" in f.explain() and len(f.explain().splitlines()) == 1
    want = np.maximum(ref_conv(x, w, (1, 1), "same", (1, 1)) + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_epilogue_after_the_direct_loop(monkeypatch, tune):
    # mnist_cnn's first layer: 9 values a window, 32 float32 channels, in chunks of
    # one image, each through bias + relu
    from jit_kernels import direct
    passes = []
    chunk = direct._window_chunk
    monkeypatch.setattr(direct, "_window_chunk", lambda *a: passes.append(1) or chunk(*a))
    tune(CONV_DIRECT_CHUNK_BYTES=1)
    x, w, b = rand(3, 8, 7, 1).astype("float32"), rand(3, 3, 1, 32).astype("float32"), rand(32)
    f, got = _epilogue_function(
        lambda x: K.relu(K.bias_add(K.conv2d(x, K.variable(w)), K.variable(b.astype("float32")))), x,
        dtype="float32")
    assert "conv+fused" in f.explain() and passes == [1] * 3 and got.dtype == np.float32
    want = np.maximum(ref_conv(x.astype(float), w.astype(float), (1, 1), "valid", (1, 1)) + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, size", [((3, 3, 1, 32), (10, 9)),    # the direct loop
                                          ((3, 3, 8, 16), (10, 9)),    # im2col
                                          ((3, 3, 32, 64), (26, 26))])  # Winograd's parts
def test_conv_epilogue_reads_its_inputs_as_they_are_on_each_call(kernel, size):
    """The epilogue reads the bias by address and is kept from call to call
    while its inputs are the same arrays: a bias given a new value, or changed
    in place, is what the next call adds."""
    x, w = rand(1, *size, kernel[2]).astype("float32"), rand(*kernel).astype("float32")
    bias = K.variable(np.zeros(kernel[-1], "float32"))
    f, _ = _epilogue_function(lambda x: K.relu(K.bias_add(K.conv2d(x, K.variable(w)), bias)), x,
                              dtype="float32")
    assert "conv+fused" in f.explain()
    conv = ref_conv(x.astype(float), w.astype(float), (1, 1), "valid", (1, 1))
    atol = 2e-5 * np.abs(conv).max()  # float32 Winograd: about 6e-6 of the largest output
    for b in (rand(kernel[-1]), rand(kernel[-1]) - 0.5):
        K.set_value(bias, b.astype("float32"))
        np.testing.assert_allclose(f([x])[0], np.maximum(conv + b, 0), rtol=1e-4, atol=atol)
    bias.value[:] = 3.0
    np.testing.assert_allclose(f([x])[0], np.maximum(conv + 3.0, 0), rtol=1e-4, atol=atol)


def test_conv_of_an_empty_batch():
    x, w = np.zeros((0, 6, 5, 1), "float32"), rand(3, 3, 1, 32).astype("float32")
    _, got = _epilogue_function(lambda x: K.relu(K.conv2d(x, K.variable(w)) + 1.0), x,
                                dtype="float32")
    assert got.shape == (0, 4, 3, 32) and got.dtype == np.float32


def test_conv_epilogue_scalars_flat_and_float32():
    x, w = rand(2, 6, 5, 3).astype("float32"), rand(3, 3, 3, 4).astype("float32")
    scale = K.variable(np.array([0.5], "float32"))
    f, got = _epilogue_function(lambda x: K.tanh(K.conv2d(x, K.variable(w)) * scale - 1.0), x,
                                dtype="float32")
    assert "conv+fused" in f.explain()
    assert got.dtype == np.float32
    want = np.tanh(ref_conv(x.astype(float), w.astype(float), (1, 1), "valid", (1, 1)) * 0.5 - 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_epilogue_split_between_threads(tune):
    tune(CONV_COLUMN_CHUNK_BYTES=1)  # one image a chunk: 5 chunks, in parts
    x, w, b = rand(5, 6, 7, 2), rand(3, 3, 2, 4), rand(4)
    f, got = _epilogue_function(lambda x: K.relu(K.conv2d(x, K.variable(w, dtype="float64")) + K.variable(b, dtype="float64")), x)
    assert "conv+fused" in f.explain()
    want = np.maximum(ref_conv(x, w, (1, 1), "valid", (1, 1)) + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_epilogue_takes_a_bias_broadcasting_only_at_run_time():
    # a bias of unknown length compiles as one value per channel; fed one value,
    # the step runs the convolution and then the group with NumPy
    x, w = rand(2, 5, 5, 2), rand(3, 3, 2, 3)
    f, _ = _epilogue_function(lambda x, b: K.relu(K.conv2d(x, K.variable(w, dtype="float64")) + b), x, rand(3))
    assert "conv+fused" in f.explain()
    conv = ref_conv(x, w, (1, 1), "valid", (1, 1))
    for b in (rand(3), rand(1)):
        np.testing.assert_allclose(f([x, b])[0], np.maximum(conv + b, 0), rtol=1e-12, atol=1e-12)


def test_conv_epilogue_of_integers_and_float32_is_float64():
    # NumPy's promotion, as for every op: the epilogue writes the conv's own dtype
    x, w = RNG.integers(-3, 4, (2, 5, 5, 2)).astype("int32"), rand(3, 3, 2, 3).astype("float32")
    xp = K.placeholder((None, 5, 5, 2), dtype="int32")
    y = K.relu(K.conv2d(xp, K.variable(w)) + 1.0)
    f = K.function([xp], [y])
    got = f([x])[0]
    assert "conv+fused" in f.explain() and got.dtype == np.float64 and K.dtype(y) == "float64"
    want = np.maximum(ref_conv(x.astype(float), w.astype(float), (1, 1), "valid", (1, 1)) + 1, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("x_shape, kernel", [((3, 9, 8, 2), (3, 3)), ((2, 7, 9, 3), (1, 1))])
def test_conv_epilogue_then_2x2_pooling_is_one_step(x_shape, kernel, mode):
    # Keras's Conv2D(activation) then MaxPooling2D(): the pooling runs on each
    # block of the convolution after its epilogue, or for max pooling, which
    # commutes with a bias and a ReLU, before it; odd rows and columns left out
    x, w, b = rand(*x_shape), rand(*kernel, x_shape[-1], 4), rand(4)
    f, got = _epilogue_function(lambda x: K.pool2d(K.relu(K.conv2d(x, K.variable(w, dtype="float64"))
                                                          + K.variable(b, dtype="float64")),
                                                   (2, 2), (2, 2), pool_mode=mode), x)
    assert ("conv+pool+fused" if mode == "max" else "+pool") in f.explain()
    assert ("conv -> pool -> add" if mode == "max" else "maximum -> pool") in f.explain()
    assert len(f.explain().splitlines()) == 1
    conv = np.maximum(ref_conv(x, w, (1, 1), "valid", (1, 1)) + b, 0)
    np.testing.assert_allclose(got, ref_pool(conv, (2, 2), (2, 2), "valid", mode),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("epilogue, pooled_first", [
    (lambda y, b: K.relu(y + b) - 0.25, True),          # add, maximum, subtract: all rising
    (lambda y, b: K.minimum(b - y, 0.5), False),        # b - y falls as y rises
    (lambda y, b: K.relu(y * b), False),                # a product: falls where b < 0
    (lambda y, b: K.relu(y + b) + K.square(y), False),  # y also reaches square
])
def test_conv_max_pooling_before_its_epilogue_only_where_it_commutes(epilogue, pooled_first):
    """Max pooling runs before the epilogue where every op of the epilogue on the
    way from the convolution is non-decreasing in it (Op.rising); after it
    otherwise.  Both give the pooled epilogue of the full convolution."""
    x, w, b = rand(2, 9, 8, 3), rand(3, 3, 3, 4), rand(4)
    xp = K.placeholder((None, 9, 8, 3), dtype="float64")
    y = K.conv2d(xp, K.variable(w, dtype="float64"))
    f = K.function([xp], [K.pool2d(epilogue(y, K.variable(b, dtype="float64")), (2, 2), (2, 2))])
    assert ("conv+pool+fused" in f.explain()) == pooled_first and "+pool" in f.explain()
    yp, bp = K.placeholder((None, 7, 6, 4), dtype="float64"), K.placeholder((4,), dtype="float64")
    full = K.function([yp, bp], [epilogue(yp, bp)])([ref_conv(x, w, (1, 1), "valid", (1, 1)), b])[0]
    np.testing.assert_allclose(f([x])[0], ref_pool(full, (2, 2), (2, 2), "valid", "max"),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("build", [
    lambda y: [K.pool2d(y, (2, 2), (1, 1))],                      # stride 1
    lambda y: [K.pool2d(y, (3, 3), (3, 3))],                      # 3x3 windows
    lambda y: [K.pool2d(y, (2, 2), (2, 2), padding="same")],      # 'same' padding
    lambda y: [K.pool2d(y, (2, 2), (2, 2)), y],                   # the unpooled value is a result
    lambda y: [K.pool2d(y, (2, 2), (2, 2)) + K.sum(y)],           # ... or read by another step
    lambda y: [K.pool2d(y, (2, 2), (2, 2)), K.pool2d(y, (3, 3), (3, 3))],  # ... another pooling
])
def test_conv_pooling_that_is_not_fused(build):
    x, w = rand(2, 8, 7, 2), rand(3, 3, 2, 3)
    xp = K.placeholder((None, 8, 7, 2), dtype="float64")
    y = K.relu(K.conv2d(xp, K.variable(w, dtype="float64")) - 0.5)
    f = K.function([xp], build(y))
    assert "+pool" not in f.explain()
    yp = K.placeholder((None, 6, 5, 3), dtype="float64")
    reference = K.function([yp], build(yp))  # the same graph after the convolution
    for got, want in zip(f([x]), reference([np.maximum(ref_conv(x, w, (1, 1), "valid", (1, 1)) - 0.5, 0)])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_pooling_in_a_training_step_is_not_fused():
    # the pooling's gradient reads the value before it: the two stay apart
    x, w = rand(2, 8, 7, 2), rand(3, 3, 2, 3)
    xp = K.placeholder((None, 8, 7, 2), dtype="float64")
    kernel = K.variable(w, dtype="float64")
    loss = K.sum(K.pool2d(K.relu(K.conv2d(xp, kernel) + 0.1), (2, 2), (2, 2)))
    f = K.function([xp], [loss] + K.gradients(loss, [kernel]))
    assert "+pool" not in f.explain()
    conv = np.maximum(ref_conv(x, w, (1, 1), "valid", (1, 1)) + 0.1, 0)
    np.testing.assert_allclose(f([x])[0], ref_pool(conv, (2, 2), (2, 2), "valid", "max").sum(),
                               rtol=1e-12)


def test_conv_epilogue_and_pooling_with_a_bias_broadcasting_only_at_run_time():
    # fed one value for a bias compiled as one per channel, the step runs the
    # convolution, the group with NumPy, then the pooling
    x, w = rand(2, 6, 6, 2), rand(3, 3, 2, 3)
    f, _ = _epilogue_function(lambda x, b: K.pool2d(K.relu(K.conv2d(x, K.variable(w, dtype="float64")) + b),
                                                    (2, 2), (2, 2)), x, rand(3))
    assert "+pool" in f.explain()
    conv = ref_conv(x, w, (1, 1), "valid", (1, 1))
    for b in (rand(3), rand(1)):
        np.testing.assert_allclose(f([x, b])[0], ref_pool(np.maximum(conv + b, 0), (2, 2), (2, 2), "valid", "max"),
                                   rtol=1e-12, atol=1e-12)


def _small_cnn(weights, x):
    """mnist_cnn's layers in NumPy: conv + bias + relu twice, 2x2 max pooling,
    a dense layer and softmax."""
    (k1, b1), (k2, b2), (w3, b3) = weights
    h = np.maximum(ref_conv(x, k1, (1, 1), "valid", (1, 1)) + b1, 0)
    h = np.maximum(ref_conv(h, k2, (1, 1), "valid", (1, 1)) + b2, 0)
    z = ref_pool(h, (2, 2), (2, 2), "valid", "max").reshape(len(x), -1) @ w3 + b3
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the inf, on BLAS's threads
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_small_cnn_called_often_runs_as_one_call(tuned, dtype):
    """Small inputs to a function called often run its plan as one compiled
    call, convolutions included: the direct loop, Winograd's parts pooling
    before the epilogue, the dense layer's weights packed once and split
    between threads.  Kernels and weights given new values, and a kernel
    changed in place, are what the next call reads; an inf in an image goes
    back to the plan (Winograd would spread it), and so does a batch too
    large for one call."""
    from jit_kernels import blas, parts
    from numbackend import tuning
    if not (blas.AVAILABLE and parts.pool_from_compiled()):
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64 with its pool: plans run from Python")
    tuned(ONE_CALL_AFTER=2, PACKED_WEIGHTS_MIN_ITEMS=1)
    values = [(rand(3, 3, 1, 32), rand(32)), (rand(3, 3, 32, 8) / 10, rand(8)),
              (rand(12 * 12 * 8, 10) / 30, rand(10))]
    weights = [tuple(K.variable(a.astype(dtype), dtype=dtype) for a in pair) for pair in values]
    x = K.placeholder((None, 28, 28, 1), dtype=dtype)
    h = K.relu(K.bias_add(K.conv2d(x, weights[0][0]), weights[0][1]))
    h = K.pool2d(K.relu(K.bias_add(K.conv2d(h, weights[1][0]), weights[1][1])), (2, 2), (2, 2))
    f = K.function([x], [K.softmax(K.dot(K.batch_flatten(h), weights[2][0]) + weights[2][1])])
    runs, run = [0], f.plan.run
    f.plan.run = lambda *a: runs.__setitem__(0, runs[0] + 1) or run(*a)
    # Winograd F(4x4, 3x3) rounds float32 more than a direct sum: 1e-4 relative
    tol = 1e-4 if dtype == "float32" else 1e-10

    def check(batch):
        xv = rand(batch, 28, 28, 1)
        got = f([xv.astype(dtype)])[0]
        want = _small_cnn([(K.get_value(a).astype(float), K.get_value(b).astype(float))
                           for a, b in weights], xv.astype(dtype).astype(float))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        return xv

    for batch in (1, 3, 1):
        check(batch)
    assert runs[0] == 1
    source = f.whole_call.source
    for call in ("conv.direct_forward", "conv.winograd_forward", "packed.matmul_packed_from_compiled"):
        assert call in source
    # no literal arguments to library code (each pattern of literals compiles it again)
    function = f.whole_call._function
    (signature,) = function.signatures
    assert literal_calls(function, signature) == []
    for callee, sig in compiled_calls(function, signature):
        if callee.py_func.__module__.startswith("jit_kernels"):
            assert literal_calls(callee, sig.args) == [], callee.py_func.__name__
    K.set_value(weights[1][0], values[1][0][::-1].astype(dtype))
    K.set_value(weights[2][0], 2 * values[2][0].astype(dtype))
    check(1)
    weights[1][0].value[0, 1] += 0.5
    weights[0][0].value[:] *= -1
    check(2)
    assert runs[0] == 1
    xv = check(2)
    xv[1, 7, 8] = np.inf
    got = f([xv.astype(dtype)])[0]
    assert runs[0] == 2 and np.isnan(got[1]).all()
    now = [(K.get_value(a).astype(float), K.get_value(b).astype(float)) for a, b in weights]
    np.testing.assert_allclose(got[:1], _small_cnn(now, xv[:1].astype(dtype).astype(float)),
                               rtol=tol, atol=tol)
    check(tuning.ONE_CALL_MAX_ELEMENTS // 784 + 1)
    assert runs[0] == 3


def test_conv_result_read_elsewhere_is_not_an_epilogue():
    x, w = rand(2, 5, 5, 2), rand(3, 3, 2, 3)
    conv = ref_conv(x, w, (1, 1), "valid", (1, 1))
    xp = K.placeholder((None, 5, 5, 2), dtype="float64")
    y = K.conv2d(xp, K.variable(w, dtype="float64"))
    f = K.function([xp], [K.relu(y), y])
    assert "conv+fused" not in f.explain()
    relu, raw = f([x])
    np.testing.assert_allclose(raw, conv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(relu, np.maximum(conv, 0), rtol=1e-12, atol=1e-12)
    g = K.function([xp], [K.relu(y) * K.sum(y, axis=-1, keepdims=True)])
    np.testing.assert_allclose(g([x])[0], np.maximum(conv, 0) * conv.sum(-1, keepdims=True),
                               rtol=1e-12, atol=1e-12)


def test_static_shapes():
    x = K.placeholder((None, 3, 28, 28))
    assert K.int_shape(K.conv2d(x, K.variable(np.zeros((5, 5, 3, 8))), (2, 2), "same",
                                "channels_first")) == (None, 8, 14, 14)
    assert K.int_shape(K.pool2d(x, (2, 2), (2, 2), data_format="channels_first")) == (None, 3, 14, 14)
    assert K.int_shape(K.resize_images(x, 2, 3, "channels_first")) == (None, 3, 56, 84)


@pytest.mark.parametrize("build,message", [
    (lambda: K.conv2d(K.placeholder((None, 8, 8)), K.variable(np.zeros((3, 3, 1, 2)))),
     r"conv2d: expected an input of rank 4 .*\(None, 8, 8\)"),
    (lambda: K.conv2d(K.placeholder((None, 8, 8, 3)), K.variable(np.zeros((3, 3, 2, 4)))),
     r"conv2d: input of shape \(None, 8, 8, 3\).*3 channels.*\(3, 3, 2, 4\) expects 2"),
    (lambda: K.conv2d(K.placeholder((None, 3, 8, 8)), K.variable(np.zeros((3, 3, 2, 4))),
                      data_format="channels_first"), r"conv2d: .*3 channels"),
    (lambda: K.conv2d(K.placeholder((None, 8, 8, 3)), K.variable(np.zeros((3, 3, 3, 4))),
                      padding="full"), r"conv2d: padding must be one of"),
    (lambda: K.conv2d(K.placeholder((None, 2, 8, 3)), K.variable(np.zeros((3, 3, 3, 4)))),
     r"does not fit the input of shape \(None, 2, 8, 3\)"),
    (lambda: K.conv1d(K.placeholder((None, 8, 3)), K.variable(np.zeros((3, 3, 4))),
                      padding="causal", data_format="channels_first"), r"conv1d: causal"),
    (lambda: K.pool2d(K.placeholder((None, 8, 8, 3)), (2, 2), pool_mode="sum"),
     r"pool2d: pool_mode must be"),
    (lambda: K.pool2d(K.placeholder((None, 8, 8, 3)), (2, 2), padding="causal"),
     r"pool2d: padding must be one of"),
    (lambda: K.depthwise_conv2d(K.placeholder((None, 8, 8, 3)), K.variable(np.zeros((3, 3, 2, 1)))),
     r"depthwise_conv2d: .*depthwise kernel of shape \(3, 3, 2, 1\)"),
    (lambda: K.conv2d_transpose(K.placeholder((None, 4, 4, 3)), K.variable(np.zeros((3, 3, 2, 3))),
                                (None, 9, 9, 2)), r"conv2d_transpose: output shape \(None, 9, 9, 2\) .*\(None, 4, 4, 3\)"),
    (lambda: K.conv2d_transpose(K.placeholder((None, 4, 4, 3)), K.variable(np.zeros((3, 3, 2, 5))),
                                (None, 6, 6, 2)), r"conv2d_transpose: .*3 channels"),
    (lambda: K.resize_images(K.placeholder((None, 4, 4)), 2, 2, "channels_last"),
     r"resize_images: expected an input of rank 4"),
    (lambda: K.local_conv2d(K.placeholder((None, 5, 6, 3)), K.variable(np.zeros((5, 12, 4))),
                            (2, 2), (2, 2), (2, 3)), r"local_conv: kernel of shape \(5, 12, 4\)"),
])
def test_errors_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# ---------------------------------------------------------------------------
# Gradients against central finite differences (float64, tiny sizes)


def check_gradients(fn, *arrays, eps=1e-6, tol=1e-6):
    holders = [K.placeholder(a.shape, dtype="float64") for a in arrays]
    y = fn(*holders)
    weights = rand(*[d for d in K.int_shape(y)])
    loss = K.sum(y * K.constant(weights, dtype="float64"))
    f_loss = K.function(holders, [loss])
    f_grad = K.function(holders, K.gradients(loss, holders))
    grads = f_grad(list(arrays))
    for k, a in enumerate(arrays):
        numeric = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            vals = []
            for sign in (1, -1):
                moved = [b.copy() for b in arrays]
                moved[k][idx] += sign * eps
                vals.append(f_loss(moved)[0])
            numeric[idx] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(grads[k], numeric, rtol=tol, atol=tol,
                                   err_msg=f"gradient w.r.t. input {k}")


@pytest.mark.parametrize("strides,padding,dilation,data_format", [
    ((1, 1), "valid", (1, 1), "channels_last"), ((2, 2), "same", (1, 1), "channels_first"),
    ((1, 1), "same", (2, 1), "channels_last")])
def test_conv2d_gradients(strides, padding, dilation, data_format):
    x = rand(2, 5, 4, 2) if data_format == "channels_last" else rand(2, 2, 5, 4)
    check_gradients(lambda x, w: K.conv2d(x, w, strides, padding, data_format, dilation),
                    x, rand(2, 3, 2, 3))


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("size,strides,padding", [((2, 2), (2, 2), "valid"), ((3, 3), (2, 1), "same")])
def test_pool2d_gradients(mode, size, strides, padding):
    check_gradients(lambda x: K.pool2d(x, size, strides, padding, "channels_last", mode),
                    rand(2, 5, 4, 2))


def test_pool2d_gradient_channels_first():
    check_gradients(lambda x: K.pool2d(x, (2, 2), (1, 1), "same", "channels_first", "max"),
                    rand(1, 2, 4, 3))


@pytest.mark.parametrize("strides,padding", [((1, 1), "valid"), ((2, 2), "same")])
def test_conv2d_transpose_gradients(strides, padding):
    out = (2, 5, 4, 3)
    x_spatial = [pad_before(n, 2, s, 1, padding)[0] for n, s in zip(out[1:3], strides)]
    check_gradients(lambda x, w: K.conv2d_transpose(x, w, out, strides, padding, "channels_last"),
                    rand(2, *x_spatial, 2), rand(2, 2, 3, 2))


@pytest.mark.parametrize("strides,padding,dilation", [((1, 1), "valid", (1, 1)),
                                                      ((2, 2), "same", (1, 1)),
                                                      ((1, 1), "same", (2, 2))])
def test_depthwise_conv2d_gradients(strides, padding, dilation):
    check_gradients(lambda x, w: K.depthwise_conv2d(x, w, strides, padding, "channels_last",
                                                    dilation), rand(2, 5, 4, 2), rand(2, 3, 2, 2))


@pytest.mark.parametrize("interpolation,data_format", [("nearest", "channels_last"),
                                                       ("bilinear", "channels_last"),
                                                       ("bilinear", "channels_first")])
def test_resize_images_gradients(interpolation, data_format):
    check_gradients(lambda x: K.resize_images(x, 2, 3, data_format, interpolation),
                    rand(2, 3, 2, 2))


def test_other_gradients():
    check_gradients(lambda x, w: K.conv1d(x, w, 1, "causal", dilation_rate=2), rand(2, 6, 2),
                    rand(2, 2, 3))
    check_gradients(lambda x, dw, pw: K.separable_conv2d(x, dw, pw, (1, 1), "same",
                                                         "channels_last"),
                    rand(1, 4, 3, 2), rand(2, 2, 2, 2), rand(1, 1, 4, 2))
    check_gradients(lambda x, w: K.local_conv2d(x, w, (2, 2), (1, 2), (3, 2), "channels_first"),
                    rand(2, 2, 4, 4), rand(6, 8, 2))
    check_gradients(lambda x: K.pool3d(x, (2, 2, 2), (1, 1, 1), "same", "channels_last", "max"),
                    rand(1, 3, 2, 3, 2))
    check_gradients(lambda x: K.resize_volumes(x, 2, 1, 2, "channels_last"), rand(1, 2, 2, 2, 2))


def test_second_order_through_conv2d():
    """Gradients of gradients: the backward ops have rules too."""
    x, w = rand(1, 4, 4, 2), rand(2, 2, 2, 2)

    def grad_norm(x, w):
        g = K.gradients(K.sum(K.square(K.conv2d(x, w, (1, 1), "same", "channels_last"))), [x])[0]
        return K.square(g)
    check_gradients(grad_norm, x, w, tol=1e-5)


@pytest.mark.parametrize("build", [
    lambda x, w: K.pool2d(K.conv2d(x, w, padding="same"), (2, 2), (1, 1), "same", pool_mode="avg"),
    lambda x, w: K.resize_images(K.conv2d(x, w, padding="same"), 2, 1, "channels_last",
                                 "bilinear"),
    lambda x, w: K.local_conv2d(x, K.reshape(K.tile(w, (9, 1, 1, 1)), (9, 8, 2)), (2, 2),
                                (1, 1), (3, 3), "channels_last")])
def test_second_order_through_other_ops(build):
    x, w = rand(1, 4, 4, 2), rand(2, 2, 2, 2)

    def grad_norm(x, w):
        g = K.gradients(K.sum(K.square(build(x, w))), [x])[0]
        return K.square(g)
    check_gradients(grad_norm, x, w, tol=1e-5)


def test_second_order_through_max_pool_raises():
    x = K.placeholder((1, 4, 4, 2), dtype="float64")
    g = K.gradients(K.sum(K.square(K.pool2d(x, (2, 2)))), [x])[0]
    with pytest.raises(NotImplementedError, match="max pooling"):
        K.gradients(K.sum(K.square(g)), [x])


# ---------------------------------------------------------------------------
# Keras 2.2.5: a small CNN predicts what NumPy computes from its weights (its
# convolution, 18 values a window into 32 float32 channels, is the direct loop)

KERAS_CNN = """
import json
import numpy as np
from keras.models import Sequential
from keras.layers import Conv2D, MaxPooling2D, Flatten, Dense

rng = np.random.default_rng(0)
model = Sequential([Conv2D(32, 3, activation="relu", input_shape=(9, 8, 2)), MaxPooling2D(),
                    Flatten(), Dense(5, activation="softmax")])
weights = [rng.standard_normal(w.shape).astype("float32") * 0.5 for w in model.get_weights()]
model.set_weights(weights)
x = rng.standard_normal((6, 9, 8, 2)).astype("float32")
got = model.predict(x, batch_size=4)

k, b, wd, bd = [w.astype(np.float64) for w in weights]
x = x.astype(np.float64)
conv = np.zeros((6, 7, 6, 32))
for i in range(7):
    for j in range(6):
        conv[:, i, j] = np.einsum("nabc,abcf->nf", x[:, i:i + 3, j:j + 3], k)
h = np.maximum(conv + b, 0)
h = h[:, :6].reshape(6, 3, 2, 3, 2, 32).max(axis=(2, 4))
z = h.reshape(6, -1) @ wd + bd
e = np.exp(z - z.max(axis=1, keepdims=True))
want = e / e.sum(axis=1, keepdims=True)
print(json.dumps({"shape": list(got.shape), "max_error": float(np.abs(got - want).max())}))
"""


def test_keras_cnn_predict(tmp_path):
    from tests.test_keras import run_keras
    result = run_keras(KERAS_CNN, tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["shape"] == [6, 5]
    assert report["max_error"] < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_direct_loops_compiled_parts_give_its_values(monkeypatch, tuned, dtype):
    """A first layer's direct loop with its bias and ReLU, its images split into
    compiled parts (three here, run one after another where the pool has fewer
    threads), a chunk of one image at a time: NumPy's values, and the same
    bits as the same images in parts of Python."""
    from jit_kernels import direct, parts
    if not parts.pool_from_compiled():
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64 with its pool")
    tuned(CONV_DIRECT_CHUNK_BYTES=1, ONE_CALL_AFTER=10**9, NATIVE_TIER="off")
    kernel, bias = rand(3, 3, 1, 32), rand(32)
    x = K.placeholder((None, 9, 7, 1), dtype=dtype)
    f = K.function([x], [K.relu(K.bias_add(K.conv2d(x, K.variable(kernel.astype(dtype), dtype=dtype),
                                                    padding="same"),
                                           K.variable(bias.astype(dtype), dtype=dtype)))])
    xv = rand(7, 9, 7, 1).astype(dtype)
    runs, run = [], parts.run
    monkeypatch.setattr(parts, "run", lambda part, rows: runs.append(len(rows)) or run(part, rows))
    monkeypatch.setattr(direct.machine, "part_count", lambda work, threads, least, most: 3)
    got = f([xv])[0]
    assert runs == [3]  # images 0-2, 3-5 and 6
    want = np.maximum(ref_conv(xv.astype(float), kernel, (1, 1), "same", (1, 1)) + bias, 0)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    monkeypatch.setattr(direct, "_in_compiled_parts", lambda *args: False)
    np.testing.assert_array_equal(f([xv])[0], got)
