"""numbackend.keras1: the Keras 1 documentation's backend API on the flat implementation."""
import inspect
import json
import pathlib

import numpy as np
import pytest

import numbackend
import numbackend.keras1 as K1
from numbackend import config, core, math, nn, random, updates

# The seed (Keras 1) signatures: the 104 functions of the Keras 1
# documentation's backend API (element-wise functions, reductions, conv3d's
# volume_shape, ...), with the signatures that documentation gives.
SEED_SIGNATURES = {
    "abs": "(x)",
    "all": "(x, axis=None, keepdims=False)",
    "any": "(x, axis=None, keepdims=False)",
    "argmax": "(x, axis=-1)",
    "argmin": "(x, axis=-1)",
    "backend": "()",
    "batch_dot": "(x, y, axes=None)",
    "batch_flatten": "(x)",
    "batch_get_value": "(xs)",
    "batch_normalization": "(x, mean, var, beta, gamma, epsilon=0.0001)",
    "batch_set_value": "(tuples)",
    "binary_crossentropy": "(output, target, from_logits=False)",
    "cast": "(x, dtype)",
    "cast_to_floatx": "(x)",
    "categorical_crossentropy": "(output, target, from_logits=False)",
    "clip": "(x, min_value, max_value)",
    "concatenate": "(tensors, axis=-1)",
    "conv2d": "(x, kernel, strides=(1, 1), border_mode='valid', dim_ordering='th', "
              "image_shape=None, filter_shape=None)",
    "conv3d": "(x, kernel, strides=(1, 1, 1), border_mode='valid', dim_ordering='th', "
              "volume_shape=None, filter_shape=None)",
    "cos": "(x)",
    "count_params": "(x)",
    "ctc_batch_cost": "(y_true, y_pred, input_length, label_length)",
    "ctc_decode": "(y_pred, input_length, greedy=True, beam_width=None, dict_seq_lens=None, "
                  "dict_values=None)",
    "deconv2d": "(x, kernel, output_shape, strides=(1, 1), border_mode='valid', "
                "dim_ordering='th', image_shape=None, filter_shape=None)",
    "dot": "(x, y)",
    "dropout": "(x, level, seed=None)",
    "dtype": "(x)",
    "epsilon": "()",
    "equal": "(x, y)",
    "eval": "(x)",
    "exp": "(x)",
    "expand_dims": "(x, dim=-1)",
    "eye": "(size, dtype=None, name=None)",
    "floatx": "()",
    "function": "(inputs, outputs, updates=[])",
    "gather": "(reference, indices)",
    "get_value": "(x)",
    "gradients": "(loss, variables)",
    "greater": "(x, y)",
    "greater_equal": "(x, y)",
    "hard_sigmoid": "(x)",
    "image_dim_ordering": "()",
    "in_test_phase": "(x, alt)",
    "in_train_phase": "(x, alt)",
    "int_shape": "(x)",
    "l2_normalize": "(x, axis)",
    "learning_phase": "()",
    "lesser": "(x, y)",
    "lesser_equal": "(x, y)",
    "log": "(x)",
    "manual_variable_initialization": "(value)",
    "max": "(x, axis=None, keepdims=False)",
    "maximum": "(x, y)",
    "mean": "(x, axis=None, keepdims=False)",
    "min": "(x, axis=None, keepdims=False)",
    "minimum": "(x, y)",
    "ndim": "(x)",
    "normalize_batch_in_training": "(x, gamma, beta, reduction_axes, epsilon=0.0001)",
    "not_equal": "(x, y)",
    "one_hot": "(indices, nb_classes)",
    "ones": "(shape, dtype=None, name=None)",
    "ones_like": "(x, name=None)",
    "permute_dimensions": "(x, pattern)",
    "placeholder": "(shape=None, ndim=None, dtype=None, name=None)",
    "pool2d": "(x, pool_size, strides=(1, 1), border_mode='valid', dim_ordering='th', "
              "pool_mode='max')",
    "pool3d": "(x, pool_size, strides=(1, 1, 1), border_mode='valid', dim_ordering='th', "
              "pool_mode='max')",
    "pow": "(x, a)",
    "print_tensor": "(x, message='')",
    "prod": "(x, axis=None, keepdims=False)",
    "relu": "(x, alpha=0.0, max_value=None)",
    "repeat": "(x, n)",
    "repeat_elements": "(x, rep, axis)",
    "reshape": "(x, shape)",
    "resize_images": "(X, height_factor, width_factor, dim_ordering)",
    "resize_volumes": "(X, depth_factor, height_factor, width_factor, dim_ordering)",
    "reverse": "(x, axes)",
    "rnn": "(step_function, inputs, initial_states, go_backwards=False, mask=None, "
           "constants=None, unroll=False, input_length=None)",
    "round": "(x)",
    "set_epsilon": "(e)",
    "set_image_dim_ordering": "(dim_ordering)",
    "set_value": "(x, value)",
    "shape": "(x)",
    "sigmoid": "(x)",
    "sign": "(x)",
    "sin": "(x)",
    "softmax": "(x)",
    "softplus": "(x)",
    "sparse_categorical_crossentropy": "(output, target, from_logits=False)",
    "spatial_2d_padding": "(x, padding=(1, 1), dim_ordering='th')",
    "spatial_3d_padding": "(x, padding=(1, 1, 1), dim_ordering='th')",
    "sqrt": "(x)",
    "square": "(x)",
    "squeeze": "(x, axis)",
    "std": "(x, axis=None, keepdims=False)",
    "stop_gradient": "(variables)",
    "sum": "(x, axis=None, keepdims=False)",
    "switch": "(condition, then_expression, else_expression)",
    "tanh": "(x)",
    "temporal_padding": "(x, padding=1)",
    "transpose": "(x)",
    "var": "(x, axis=None, keepdims=False)",
    "variable": "(value, dtype=None, name=None)",
    "zeros": "(shape, dtype=None, name=None)",
    "zeros_like": "(x, name=None)",
}

# Keras 1 names outside the 104 that Keras 1 code calls.
OTHER_SIGNATURES = {
    "random_normal": "(shape, mean=0.0, std=1.0, dtype=None, seed=None)",
    "random_uniform": "(shape, low=0.0, high=1.0, dtype=None, seed=None)",
    "random_binomial": "(shape, p=0.0, dtype=None, seed=None)",
    "set_learning_phase": "(value)",
    "pack": "(x)",
}

# Names that mean the same in both generations: the flat functions themselves.
SHARED = [
    "abs", "all", "any", "argmax", "argmin", "backend", "batch_dot", "batch_flatten",
    "batch_set_value", "cast", "cast_to_floatx", "clip", "concatenate", "cos", "count_params",
    "dot", "dtype", "epsilon", "equal", "eval", "exp", "eye", "floatx", "gather", "get_value",
    "get_variable_shape", "greater", "greater_equal", "hard_sigmoid", "image_dim_ordering", "int_shape",
    "learning_phase", "lesser", "lesser_equal", "log", "manual_variable_initialization", "max",
    "maximum", "mean", "min", "minimum", "ndim", "not_equal", "ones", "permute_dimensions", "pow",
    "print_tensor", "prod", "random_binomial", "repeat", "repeat_elements", "reshape", "reverse",
    "round", "set_epsilon", "set_floatx", "set_image_dim_ordering", "set_learning_phase",
    "set_value", "shape", "sigmoid", "sign", "sin", "softplus", "sqrt", "square", "squeeze",
    "std", "stop_gradient", "sum", "switch", "tanh", "transpose", "var", "zeros",
]


def _value(x):
    return np.asarray(core.eval(x))


def _var(a):
    return core.variable(np.asarray(a, dtype="float64"), dtype="float64")


# ---------------------------------------------------------------------------
# Names and signatures


def test_the_table_holds_the_104_seed_names():
    assert len(SEED_SIGNATURES) == 104
    names_file = pathlib.Path("/work/shared/tools/api_names.json")
    if names_file.exists():
        assert sorted(SEED_SIGNATURES) == sorted(json.loads(names_file.read_text())["seed_keras1"])


@pytest.mark.parametrize("name", sorted({**SEED_SIGNATURES, **OTHER_SIGNATURES}))
def test_signature_is_keras1s(name):
    expected = {**SEED_SIGNATURES, **OTHER_SIGNATURES}[name]
    assert str(inspect.signature(getattr(K1, name))) == expected


@pytest.mark.parametrize("name", SHARED)
def test_shared_names_are_the_flat_functions(name):
    (flat,) = {getattr(m, name) for m in (config, core, math, nn, random, updates)
               if hasattr(m, name)}
    assert getattr(K1, name) is flat


def test_all_lists_the_public_names_with_docstrings():
    public = sorted(n for n in vars(K1) if not n.startswith("_"))
    assert sorted(K1.__all__) == public
    assert set(SEED_SIGNATURES) | set(OTHER_SIGNATURES) <= set(K1.__all__)
    for name in K1.__all__:
        assert callable(getattr(K1, name)) and getattr(K1, name).__doc__, name


# ---------------------------------------------------------------------------
# Cross-entropies: output first


P = np.array([[0.1, 0.6, 0.3], [0.25, 0.25, 0.5]])
T = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])


def test_categorical_crossentropy_takes_output_first():
    expected = -np.sum(T * np.log(P / P.sum(-1, keepdims=True)), axis=-1)
    np.testing.assert_allclose(_value(K1.categorical_crossentropy(_var(P), _var(T))), expected,
                               rtol=1e-6)
    np.testing.assert_allclose(
        _value(K1.categorical_crossentropy(target=_var(T), output=_var(P))), expected, rtol=1e-6)


def test_categorical_crossentropy_from_logits():
    z = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(_value(K1.categorical_crossentropy(_var(z), _var(T), True)),
                               -np.sum(T * log_softmax, axis=-1), rtol=1e-6)


def test_sparse_categorical_crossentropy_takes_output_first():
    labels = np.array([1, 2])
    expected = -np.log(P[np.arange(2), labels])
    got = K1.sparse_categorical_crossentropy(_var(P), core.variable(labels, dtype="int64"))
    np.testing.assert_allclose(_value(got), expected, rtol=1e-6)


def test_binary_crossentropy_takes_output_first():
    p = np.array([[0.9, 0.2], [0.4, 0.7]])
    t = np.array([[1.0, 0.0], [0.0, 0.3]])
    expected = -(t * np.log(p) + (1 - t) * np.log(1 - p))
    np.testing.assert_allclose(_value(K1.binary_crossentropy(_var(p), _var(t))), expected,
                               rtol=1e-6)
    z = np.array([[2.0, -1.0], [0.5, -3.0]])
    s = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(_value(K1.binary_crossentropy(_var(z), _var(t), True)),
                               -(t * np.log(s) + (1 - t) * np.log(1 - s)), rtol=1e-6)


# ---------------------------------------------------------------------------
# Normalisation: epsilon defaults to 1e-4


def test_batch_normalization_epsilon_default():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3))
    mean, var = np.array([0.1, -0.2, 0.0]), np.array([1e-4, 2e-4, 1.0])
    beta, gamma = np.array([0.5, 0.0, -1.0]), np.array([2.0, 1.0, 0.5])
    expected = (x - mean) / np.sqrt(var + 1e-4) * gamma + beta
    got = K1.batch_normalization(_var(x), _var(mean), _var(var), _var(beta), _var(gamma))
    np.testing.assert_allclose(_value(got), expected, rtol=1e-9)
    got = K1.batch_normalization(_var(x), _var(mean), _var(var), _var(beta), _var(gamma), 1e-2)
    np.testing.assert_allclose(_value(got), (x - mean) / np.sqrt(var + 1e-2) * gamma + beta,
                               rtol=1e-9)


def test_normalize_batch_in_training_epsilon_default():
    rng = np.random.default_rng(1)
    x = 0.01 * rng.normal(size=(6, 2))
    gamma, beta = np.array([1.5, 0.5]), np.array([0.1, -0.1])
    normed, mean, var = K1.normalize_batch_in_training(_var(x), _var(gamma), _var(beta), [0])
    np.testing.assert_allclose(_value(mean), x.mean(0), rtol=1e-9)
    np.testing.assert_allclose(_value(var), x.var(0), rtol=1e-9)
    np.testing.assert_allclose(_value(normed),
                               (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-4) * gamma + beta,
                               rtol=1e-9)


# ---------------------------------------------------------------------------
# Shapes and padding


def test_spatial_2d_padding_defaults_to_th():
    x = np.arange(24.0).reshape(1, 2, 3, 4)
    np.testing.assert_array_equal(_value(K1.spatial_2d_padding(_var(x))),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))))
    np.testing.assert_array_equal(_value(K1.spatial_2d_padding(_var(x), (2, 0), "tf")),
                                  np.pad(x, ((0, 0), (2, 2), (0, 0), (0, 0))))


def test_spatial_3d_padding_defaults_to_th():
    x = np.arange(16.0).reshape(1, 2, 2, 2, 2)
    np.testing.assert_array_equal(_value(K1.spatial_3d_padding(_var(x))),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1))))
    np.testing.assert_array_equal(
        _value(K1.spatial_3d_padding(_var(x), (1, 0, 2), dim_ordering="tf")),
        np.pad(x, ((0, 0), (1, 1), (0, 0), (2, 2), (0, 0))))


def test_temporal_padding_takes_an_int():
    x = np.arange(12.0).reshape(2, 3, 2)
    np.testing.assert_array_equal(_value(K1.temporal_padding(_var(x))),
                                  np.pad(x, ((0, 0), (1, 1), (0, 0))))
    np.testing.assert_array_equal(_value(K1.temporal_padding(_var(x), 2)),
                                  np.pad(x, ((0, 0), (2, 2), (0, 0))))


def test_dim_ordering_values():
    x = _var(np.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="dim_ordering"):
        K1.spatial_2d_padding(x, dim_ordering="channels_first")
    configured = {"channels_first": (1, 1, 4, 4), "channels_last": (1, 3, 4, 2)}
    assert K1.int_shape(K1.spatial_2d_padding(x, dim_ordering="default")) == \
        configured[config.image_data_format()]


def test_expand_dims_dim():
    x = _var(np.arange(6.0).reshape(2, 3))
    assert K1.int_shape(K1.expand_dims(x)) == (2, 3, 1)
    assert K1.int_shape(K1.expand_dims(x, 1)) == (2, 1, 3)
    assert K1.int_shape(K1.expand_dims(x, dim=0)) == (1, 2, 3)


def test_one_hot_nb_classes():
    indices = core.variable(np.array([[0, 3], [2, 1]]), dtype="int32")
    expected = np.eye(4)[[[0, 3], [2, 1]]]
    np.testing.assert_array_equal(_value(K1.one_hot(indices, 4)), expected)
    np.testing.assert_array_equal(_value(K1.one_hot(indices, nb_classes=4)), expected)


def test_pack_stacks_along_a_new_first_axis():
    a, b = np.arange(3.0), np.arange(3.0, 6.0)
    np.testing.assert_array_equal(_value(K1.pack([_var(a), _var(b)])), np.stack([a, b]))


# ---------------------------------------------------------------------------
# Variables, placeholders, functions


def test_variable_and_placeholder_positional_arguments():
    with numbackend.name_scope("test_positional_arguments") as scope:  # a scope of its own
        v = K1.variable(np.ones((2, 2)), "float64", "w")
        p = K1.placeholder((None, 3), None, "int32", "inp")
    assert (v.dtype, v.name) == ("float64", scope + "w:0")
    assert (p.dtype, p.name, K1.int_shape(p)) == ("int32", scope + "inp:0", (None, 3))
    assert K1.int_shape(K1.placeholder(ndim=2)) == (None, None)


def test_zeros_like_ones_like_and_batch_get_value():
    v = K1.variable(np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(_value(K1.zeros_like(v, "z")), np.zeros((2, 2)))
    np.testing.assert_array_equal(_value(K1.ones_like(v)), np.ones((2, 2)))
    w = K1.variable([5.0])
    values = K1.batch_get_value(xs=[v, w])
    np.testing.assert_array_equal(values[0], np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(values[1], [5.0])


def test_function_with_positional_updates():
    a = K1.placeholder(shape=(2,))
    v = K1.variable([1.0, 2.0])
    f = K1.function([a], [a * 2, v], [(v, v + a)])
    out, before = f([np.array([10.0, 20.0])])
    np.testing.assert_array_equal(out, [20.0, 40.0])
    np.testing.assert_array_equal(before, [1.0, 2.0])
    np.testing.assert_array_equal(K1.get_value(v), [11.0, 22.0])
    assert K1.function([a], [a])([np.array([1.0, 2.0])])[0].tolist() == [1.0, 2.0]


def test_in_train_phase_and_in_test_phase():
    x, alt = K1.variable([1.0, 2.0]), K1.variable([-1.0, -2.0])
    f = K1.function([K1.learning_phase()], [K1.in_train_phase(x, alt), K1.in_test_phase(x, alt)])
    train, test = f([1])
    np.testing.assert_array_equal(train, [1.0, 2.0])
    np.testing.assert_array_equal(test, [-1.0, -2.0])
    train, test = f([0])
    np.testing.assert_array_equal(train, [-1.0, -2.0])
    np.testing.assert_array_equal(test, [1.0, 2.0])


# ---------------------------------------------------------------------------
# Neural-network functions and random tensors


def test_relu_softmax_l2_normalize():
    x = np.array([[-2.0, -0.5, 0.0, 1.0, 3.0]])
    np.testing.assert_allclose(_value(K1.relu(_var(x), 0.1, 2.0)),
                               np.where(x < 0, 0.1 * x, np.minimum(x, 2.0)))
    np.testing.assert_allclose(_value(K1.relu(_var(x))), np.maximum(x, 0))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(_value(K1.softmax(_var(x))), e / e.sum(-1, keepdims=True))
    y = np.array([[3.0, 1.0], [4.0, -2.0]])
    np.testing.assert_allclose(_value(K1.l2_normalize(_var(y), 0)),
                               y / np.sqrt((y ** 2).sum(0, keepdims=True)))


def test_dropout_third_argument_is_the_seed():
    x = K1.ones((2000,))
    first = _value(K1.dropout(x, 0.25, 7))
    assert np.all((first == 0) | np.isclose(first, 1 / 0.75))
    assert 0.2 < np.mean(first == 0) < 0.3
    np.testing.assert_array_equal(_value(K1.dropout(x, 0.25, seed=7)), first)


def test_random_parameter_names():
    normal = _value(K1.random_normal((4000,), mean=5.0, std=0.5, seed=1))
    assert abs(normal.mean() - 5.0) < 0.05 and abs(normal.std() - 0.5) < 0.05
    normal = _value(K1.random_normal((4000,), 5.0, 0.5))
    assert abs(normal.mean() - 5.0) < 0.05
    uniform = _value(K1.random_uniform((4000,), low=2.0, high=3.0, seed=1))
    assert uniform.min() >= 2.0 and uniform.max() < 3.0 and abs(uniform.mean() - 2.5) < 0.05
    binary = _value(K1.random_binomial((4000,), p=0.3, seed=1))
    assert set(np.unique(binary)) <= {0.0, 1.0} and abs(binary.mean() - 0.3) < 0.05


# ---------------------------------------------------------------------------
# Argument mapping onto the Keras 2.2.5 signatures of the flat functions


def _conv2d(x, kernel, strides=(1, 1), padding="valid", data_format=None,
            dilation_rate=(1, 1)):
    pass


def _conv2d_transpose(x, kernel, output_shape, strides=(1, 1), padding="valid",
                      data_format=None, dilation_rate=(1, 1)):
    pass


def _conv3d(x, kernel, strides=(1, 1, 1), padding="valid", data_format=None,
            dilation_rate=(1, 1, 1)):
    pass


def _pool2d(x, pool_size, strides=(1, 1), padding="valid", data_format=None, pool_mode="max"):
    pass


def _pool3d(x, pool_size, strides=(1, 1, 1), padding="valid", data_format=None,
            pool_mode="max"):
    pass


def _resize_images(x, height_factor, width_factor, data_format, interpolation="nearest"):
    pass


def _resize_volumes(x, depth_factor, height_factor, width_factor, data_format):
    pass


def _ctc_batch_cost(y_true, y_pred, input_length, label_length):
    pass


def _ctc_decode(y_pred, input_length, greedy=True, beam_width=100, top_paths=1, **dictionary):
    pass


def _rnn(step_function, inputs, initial_states, go_backwards=False, mask=None, constants=None,
         unroll=False, input_length=None):
    pass


def _gradients(loss, variables):
    pass


class Recorder:
    """Stands in for a flat function: records its arguments, bound to the Keras 2.2.5
    signature ``keras2``, and returns a marker."""

    def __init__(self, keras2):
        self.signature = inspect.signature(keras2)
        self.calls = []

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        self.calls.append(dict(bound.arguments))
        return "flat result"


@pytest.fixture
def record(monkeypatch):
    def install(name, keras2):
        recorder = Recorder(keras2)
        monkeypatch.setattr(numbackend, name, recorder, raising=False)
        return recorder
    return install


def test_conv2d_maps_th_onto_keras2(record):
    flat = record("conv2d", _conv2d)
    x = K1.placeholder((None, 3, 8, 8))
    kernel = np.random.default_rng(0).normal(size=(4, 3, 2, 5))
    assert K1.conv2d(x, _var(kernel), (2, 1), "same") == "flat result"
    (call,) = flat.calls
    assert call["x"] is x
    np.testing.assert_array_equal(_value(call["kernel"]), kernel.transpose(2, 3, 1, 0))
    assert (call["strides"], call["padding"], call["data_format"], call["dilation_rate"]) == \
        ((2, 1), "same", "channels_first", (1, 1))


def test_conv2d_passes_a_tf_kernel_as_it_is(record):
    flat = record("conv2d", _conv2d)
    x, kernel = K1.placeholder((None, 8, 8, 3)), _var(np.ones((2, 2, 3, 4)))
    K1.conv2d(x, kernel, dim_ordering="tf", image_shape=(None, 8, 8, 3),
              filter_shape=(2, 2, 3, 4))
    (call,) = flat.calls
    assert call["kernel"] is kernel
    assert (call["strides"], call["padding"], call["data_format"]) == \
        ((1, 1), "valid", "channels_last")


def _keras2_conv2d_numpy(x, kernel, strides=(1, 1), padding="valid", data_format=None,
                         dilation_rate=(1, 1)):
    """Keras 2.2.5's conv2d ('valid', no dilation) in NumPy: kernel (rows, cols, in, out)."""
    x, kernel = _value(x), _value(kernel)
    if data_format == "channels_first":
        x = x.transpose(0, 2, 3, 1)
    rows, cols = kernel.shape[:2]
    out_rows = (x.shape[1] - rows) // strides[0] + 1
    out_cols = (x.shape[2] - cols) // strides[1] + 1
    out = np.zeros((x.shape[0], out_rows, out_cols, kernel.shape[3]))
    for i in range(out_rows):
        for j in range(out_cols):
            window = x[:, i * strides[0]:i * strides[0] + rows, j * strides[1]:j * strides[1] + cols]
            out[:, i, j] = np.einsum("brci,rcio->bo", window, kernel)
    return out.transpose(0, 3, 1, 2) if data_format == "channels_first" else out


def _keras1_th_conv2d_numpy(x, kernel, strides):
    """out[b, o, i, j] = sum over c, r, s of x[b, c, i*sr + r, j*sc + s] * kernel[o, c, r, s]."""
    rows, cols = kernel.shape[2:]
    out_rows = (x.shape[2] - rows) // strides[0] + 1
    out_cols = (x.shape[3] - cols) // strides[1] + 1
    out = np.zeros((x.shape[0], kernel.shape[0], out_rows, out_cols))
    for b in range(x.shape[0]):
        for o in range(kernel.shape[0]):
            for i in range(out_rows):
                for j in range(out_cols):
                    window = x[b, :, i * strides[0]:i * strides[0] + rows,
                               j * strides[1]:j * strides[1] + cols]
                    out[b, o, i, j] = np.sum(window * kernel[o])
    return out


def test_conv2d_th_kernel_layout_against_numpy(monkeypatch):
    monkeypatch.setattr(numbackend, "conv2d", _keras2_conv2d_numpy, raising=False)
    rng = np.random.default_rng(2)
    x, kernel = rng.normal(size=(2, 3, 6, 5)), rng.normal(size=(4, 3, 3, 2))
    expected = _keras1_th_conv2d_numpy(x, kernel, (2, 1))
    np.testing.assert_allclose(K1.conv2d(_var(x), _var(kernel), (2, 1)), expected, rtol=1e-9)
    x_tf, kernel_tf = x.transpose(0, 2, 3, 1), kernel.transpose(2, 3, 1, 0)
    np.testing.assert_allclose(
        K1.conv2d(_var(x_tf), _var(kernel_tf), (2, 1), dim_ordering="tf"),
        expected.transpose(0, 2, 3, 1), rtol=1e-9)


def test_conv2d_against_numpy():
    rng = np.random.default_rng(3)
    x, kernel = rng.normal(size=(2, 3, 6, 5)), rng.normal(size=(4, 3, 3, 2))
    out = K1.conv2d(_var(x), _var(kernel), (2, 1))
    np.testing.assert_allclose(_value(out), _keras1_th_conv2d_numpy(x, kernel, (2, 1)),
                               rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dim_ordering, kernel_axes, data_format", [
    ("th", (2, 3, 0, 1), "channels_first"),
    ("tf", (0, 1, 3, 2), "channels_last"),
])
def test_deconv2d_kernel_to_keras2_layout(record, dim_ordering, kernel_axes, data_format):
    flat = record("conv2d_transpose", _conv2d_transpose)
    kernel = np.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    x = K1.placeholder(ndim=4)
    K1.deconv2d(x, _var(kernel), (1, 2, 9, 9), (2, 2), "same", dim_ordering)
    (call,) = flat.calls
    np.testing.assert_array_equal(_value(call["kernel"]), kernel.transpose(kernel_axes))
    assert (call["output_shape"], call["strides"], call["padding"], call["data_format"]) == \
        ((1, 2, 9, 9), (2, 2), "same", data_format)


def test_conv3d_maps_th_onto_keras2(record):
    flat = record("conv3d", _conv3d)
    kernel = np.arange(2 * 3 * 4 * 5 * 6.0).reshape(2, 3, 4, 5, 6)
    x = K1.placeholder(ndim=5)
    K1.conv3d(x, _var(kernel), (1, 2, 3), "valid", "th", volume_shape=None)
    (call,) = flat.calls
    np.testing.assert_array_equal(_value(call["kernel"]), kernel.transpose(2, 3, 4, 1, 0))
    assert (call["strides"], call["padding"], call["data_format"], call["dilation_rate"]) == \
        ((1, 2, 3), "valid", "channels_first", (1, 1, 1))
    tf_kernel = _var(kernel)
    K1.conv3d(x, tf_kernel, dim_ordering="tf")
    assert flat.calls[1]["kernel"] is tf_kernel
    assert flat.calls[1]["data_format"] == "channels_last"


def test_pooling_maps_onto_keras2(record):
    flat2, flat3 = record("pool2d", _pool2d), record("pool3d", _pool3d)
    x = K1.placeholder(ndim=4)
    K1.pool2d(x, (2, 2))
    K1.pool2d(x, (3, 3), (2, 2), "same", "tf", "avg")
    assert [(c["pool_size"], c["strides"], c["padding"], c["data_format"], c["pool_mode"])
            for c in flat2.calls] == [((2, 2), (1, 1), "valid", "channels_first", "max"),
                                      ((3, 3), (2, 2), "same", "channels_last", "avg")]
    K1.pool3d(x, (2, 2, 2), border_mode="same", pool_mode="avg")
    (call,) = flat3.calls
    assert (call["strides"], call["padding"], call["data_format"], call["pool_mode"]) == \
        ((1, 1, 1), "same", "channels_first", "avg")


def test_resize_maps_onto_keras2(record):
    images, volumes = record("resize_images", _resize_images), record("resize_volumes",
                                                                      _resize_volumes)
    x = K1.placeholder(ndim=4)
    K1.resize_images(x, 2, 3, "th")
    K1.resize_volumes(x, 1, 2, 3, "tf")
    assert [(c["x"], c["height_factor"], c["width_factor"], c["data_format"])
            for c in images.calls] == [(x, 2, 3, "channels_first")]
    (call,) = volumes.calls
    assert (call["depth_factor"], call["height_factor"], call["width_factor"],
            call["data_format"]) == (1, 2, 3, "channels_last")


def test_ctc_maps_onto_keras2(record):
    decode, cost = record("ctc_decode", _ctc_decode), record("ctc_batch_cost", _ctc_batch_cost)
    y_pred = K1.placeholder((None, 5, 4))
    lengths = np.array([[5], [3]], dtype="int32")
    K1.ctc_decode(y_pred, lengths)
    K1.ctc_decode(y_pred, lengths, False, 7)
    K1.ctc_decode(y_pred, lengths, False, None, [2], [[1, 2]])
    first, beam, dictionary = decode.calls
    assert first["y_pred"] is y_pred
    np.testing.assert_array_equal(_value(first["input_length"]), [5, 3])
    assert (first["greedy"], first["beam_width"], first["top_paths"], first["dictionary"]) == \
        (True, 100, 1, {})
    assert (beam["greedy"], beam["beam_width"]) == (False, 7)
    assert dictionary["dictionary"] == {"dict_seq_lens": [2], "dict_values": [[1, 2]]}
    K1.ctc_batch_cost("y_true", y_pred, "input_length", "label_length")
    assert cost.calls == [{"y_true": "y_true", "y_pred": y_pred, "input_length": "input_length",
                           "label_length": "label_length"}]


def test_rnn_and_gradients_map_onto_keras2(record):
    rnn, gradients = record("rnn", _rnn), record("gradients", _gradients)

    def step(x, states):
        return x, states

    x = K1.placeholder((None, 4, 3))
    K1.rnn(step, x, ["state"], True, "mask", ["c"], True, 4)
    assert rnn.calls == [{"step_function": step, "inputs": x, "initial_states": ["state"],
                          "go_backwards": True, "mask": "mask", "constants": ["c"],
                          "unroll": True, "input_length": 4}]
    K1.gradients("loss", ["w"])
    assert gradients.calls == [{"loss": "loss", "variables": ["w"]}]

