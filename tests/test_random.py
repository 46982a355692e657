"""numbackend.random: distributions, seeds, fresh draws, symbolic shapes."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K

SHAPE = (250, 400)  # 1e5 samples: moments to about 1%
N = SHAPE[0] * SHAPE[1]
TRUNCATED_STD = 0.8796256610342398  # std of a standard normal truncated to [-2, 2]


def draw(tensor):
    (value,) = K.function([], [tensor])([])
    return value


def assert_moments(x, mean, std):
    assert abs(x.mean() - mean) < 5 * std / np.sqrt(x.size)
    assert abs(x.std() - std) < 0.02 * std


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_normal(dtype):
    x = draw(K.random_normal(SHAPE, mean=2.0, stddev=3.0, dtype=dtype, seed=1))
    assert x.shape == SHAPE and x.dtype == dtype
    assert_moments(x, 2.0, 3.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_truncated_normal(dtype):
    x = draw(K.truncated_normal(SHAPE, mean=-1.0, stddev=0.5, dtype=dtype, seed=2))
    assert x.shape == SHAPE and x.dtype == dtype
    assert np.abs(x + 1.0).max() <= 2 * 0.5 * (1 + 1e-6)
    assert_moments(x, -1.0, 0.5 * TRUNCATED_STD)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_uniform(dtype):
    x = draw(K.random_uniform(SHAPE, minval=-2.0, maxval=6.0, dtype=dtype, seed=3))
    assert x.shape == SHAPE and x.dtype == dtype
    assert x.min() >= -2.0 and x.max() < 6.0
    assert_moments(x, 2.0, 8.0 / np.sqrt(12))
    counts = np.histogram(x, bins=8, range=(-2, 6))[0]
    assert np.abs(counts / N - 1 / 8).max() < 0.005


@pytest.mark.parametrize("dtype,p", [("float32", 0.3), ("float64", 0.8), ("int32", 0.5)])
def test_random_binomial(dtype, p):
    x = draw(K.random_binomial(SHAPE, p=p, dtype=dtype, seed=4))
    assert x.shape == SHAPE and x.dtype == dtype
    assert set(np.unique(x)) == {0, 1}
    assert abs(x.mean() - p) < 5 * np.sqrt(p * (1 - p) / N)


def test_random_binomial_extremes():
    assert (draw(K.random_binomial((50,), p=0.0)) == 0).all()
    assert (draw(K.random_binomial((50,), p=1.0)) == 1).all()


def test_default_dtype_is_floatx():
    for t in (K.random_normal((2,)), K.random_uniform((2,)), K.truncated_normal((2,)),
              K.random_binomial((2,), 0.5)):
        assert t.dtype == "float32"


def test_random_uniform_integers():
    x = draw(K.random_uniform((2000,), minval=-3, maxval=4, dtype="int32", seed=5))
    assert x.dtype == np.int32
    assert set(np.unique(x)) == set(range(-3, 4))


def test_each_call_draws_afresh():
    f = K.function([], [K.random_normal((1000,), seed=6), K.random_uniform((1000,))])
    first, second = f([]), f([])
    for a, b in zip(first, second):
        assert not np.array_equal(a, b)


def test_same_seed_same_first_draw():
    shape = (30, 40)
    for make in (lambda s: K.random_normal(shape, seed=s), lambda s: K.truncated_normal(shape, seed=s),
                 lambda s: K.random_uniform(shape, seed=s), lambda s: K.random_binomial(shape, 0.5, seed=s)):
        a, b, c = K.function([], [make(7), make(7), make(8)])([])
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        np.testing.assert_array_equal(draw(make(7)), a)  # another function, a new node


def test_unseeded_nodes_differ():
    a, b = K.function([], [K.random_normal((100,)), K.random_normal((100,))])([])
    assert not np.array_equal(a, b)


def test_symbolic_shape():
    x = K.placeholder((None, 3))
    noise = K.random_normal(K.shape(x), stddev=0.1, seed=9)
    assert noise.shape == (None, 3)
    rows = K.random_uniform([K.shape(x)[0], 5], seed=10)  # as Keras builds noise shapes
    assert rows.shape == (None, 5)
    f = K.function([x], [x + noise, rows])
    for batch in (4, 1000):
        noisy, u = f([np.zeros((batch, 3), "float32")])
        assert noisy.shape == (batch, 3) and u.shape == (batch, 5)
    assert abs(noisy.std() - 0.1) < 0.01
    assert u.min() >= 0 and u.max() < 1
    assert draw(K.random_normal(K.variable([2, 3], dtype="int32"))).shape == (2, 3)


def test_tensor_parameters():
    mean, stddev = K.variable(10.0), K.variable(2.0)
    x = draw(K.random_normal(SHAPE, mean=mean, stddev=stddev, seed=11))
    assert_moments(x, 10.0, 2.0)
    u = draw(K.random_uniform(SHAPE, minval=K.variable(1.0), maxval=3.0, seed=12))
    assert u.min() >= 1.0 and u.max() < 3.0
    assert_moments(u, 2.0, 2.0 / np.sqrt(12))


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="random_normal"):
        K.random_normal((2, -1))
    with pytest.raises(ValueError, match="random_uniform"):
        K.random_uniform((2, None))
    with pytest.raises(TypeError, match="random_normal"):
        K.random_normal(2.5)
    with pytest.raises(TypeError, match="float"):
        K.random_normal((2,), dtype="int32")


def test_random_normal_variable():
    v = K.random_normal_variable(SHAPE, 1.0, 0.5, seed=13)
    assert isinstance(v, K.Variable) and v.dtype == "float32" and v.shape == SHAPE
    assert_moments(K.get_value(v), 1.0, 0.5)
    same = K.random_normal_variable(SHAPE, 1.0, 0.5, seed=13)
    np.testing.assert_array_equal(K.get_value(same), K.get_value(v))
    with K.name_scope("test_random_normal_variable") as scope:  # a scope of its own
        other = K.random_normal_variable((3, 4), 0.0, 1.0, dtype="float64", name="w")
    assert other.dtype == "float64" and other.name == scope + "w:0"


def test_random_uniform_variable():
    v = K.random_uniform_variable(SHAPE, -1.0, 3.0, seed=14)
    value = K.get_value(v)
    assert isinstance(v, K.Variable) and v.dtype == "float32"
    assert value.min() >= -1.0 and value.max() < 3.0
    assert_moments(value, 1.0, 4.0 / np.sqrt(12))
    same = K.random_uniform_variable(SHAPE, -1.0, 3.0, seed=14)
    np.testing.assert_array_equal(K.get_value(same), value)
    assert not np.array_equal(K.get_value(K.random_uniform_variable((10,), 0, 1)),
                              K.get_value(K.random_uniform_variable((10,), 0, 1)))
    with pytest.raises(ValueError, match="random_uniform_variable"):
        K.random_uniform_variable((None, 2), 0, 1)


# Draws made without a seed after np.random.seed(SEED): each a list of floats.
# (Sixteen values at most: the functions run with NumPy, no compile.)
UNSEEDED_DRAWS = textwrap.dedent("""
    import json, sys
    import numpy as np
    np.random.seed(int(sys.argv[1]))
    import numbackend as K

    def draw(tensor):
        return K.function([], [tensor])([])[0].tolist()

    masks = K.function([], [K.dropout(K.ones((16,)), 0.5)])
    print(json.dumps({
        "normal": draw(K.random_normal((4,))),
        "truncated_normal": draw(K.truncated_normal((4,))),
        "uniform": draw(K.random_uniform((4,))),
        "binomial": draw(K.random_binomial((16,), 0.5)),
        "dropout": [masks([])[0].tolist(), masks([])[0].tolist()],
        "normal_variable": K.get_value(K.random_normal_variable((4,), 0.0, 1.0)).tolist(),
        "uniform_variable": K.get_value(K.random_uniform_variable((4,), 0.0, 1.0)).tolist(),
    }))
""")


def unseeded_draws(seed):
    result = subprocess.run([sys.executable, "-c", UNSEEDED_DRAWS, str(seed)], capture_output=True,
                            text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_unseeded_draws_follow_numpys_global_seed_across_processes():
    first, again, other = unseeded_draws(0), unseeded_draws(0), unseeded_draws(1)
    assert first == again
    for kind in first:
        assert first[kind] != other[kind], kind
    # a compiled function still draws a new mask on each call
    assert first["dropout"][0] != first["dropout"][1]
