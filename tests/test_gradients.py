"""K.gradients against central finite differences, in float64.

Each case is a function ``f`` of a few inputs (placeholders and variables) and
an independent NumPy formula of it.  The loss is ``sum(C * f(...))`` for a
fixed random ``C`` of the output's shape, so every output element gets its own
weight.  The compiled forward loss is checked against the NumPy formula and the
compiled gradient against ``(L(x + h) - L(x - h)) / 2h`` of the NumPy loss.
Points are drawn away from the kinks (abs and relu at 0, clip's bounds, ties of
maximum/minimum and of max/min reductions, hard_sigmoid's corners).

The cases of a group are compiled together, as one K.function with one loss
and its gradients per case, and a case adds up several functions of the same
inputs so that they fuse into few kernels (the file compiles about 140); when a
case fails, each of its functions is compiled alone to name the ones at fault.
Inputs have sizes above 16 or an unknown first axis, so that the generated
kernels run rather than the NumPy path of small static groups.
"""
import functools

import numpy as np
import pytest
from scipy.special import logsumexp as np_logsumexp

import numbackend as K
from tests.finite_differences import numeric_gradient as numeric_gradient_of

RNG = np.random.default_rng(20240603)
F64 = np.float64


def uniform(shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape)


def away_from(shape, kinks, gap=0.15, low=-3.0, high=3.0):
    """Uniform values in [low, high] at least ``gap`` from each of ``kinks``."""
    x = RNG.uniform(low, high, size=shape)
    for _ in range(100):
        bad = np.zeros(x.shape, dtype=bool)
        for k in kinks:
            bad |= np.abs(x - k) < gap
        if not bad.any():
            return x
        x[bad] = RNG.uniform(low, high, size=int(bad.sum()))
    raise AssertionError("could not draw points away from the kinks")


def signed(shape, low=0.3, high=2.0):
    """Values of magnitude in [low, high] with random signs."""
    return RNG.uniform(low, high, size=shape) * RNG.choice([-1.0, 1.0], size=shape)


def positive(shape, low=0.3, high=3.0):
    return RNG.uniform(low, high, size=shape)


# ---------------------------------------------------------------------------
# Cases


class In:
    """An input of a case: its value and how it enters the graph.

    kind: 'p' a placeholder whose first axis is unknown, 'P' a placeholder of
    fully known shape, 'v' a variable, 'c' a constant (not differentiated)."""

    def __init__(self, value, kind="p"):
        self.value = np.asarray(value)
        self.kind = kind

    @property
    def differentiable(self):
        return self.kind != "c" and self.value.dtype.kind == "f"

    def tensor(self):
        v = self.value
        dtype = v.dtype.name
        if self.kind == "v":
            return K.variable(v, dtype=dtype)
        if self.kind == "c":
            return K.constant(v, dtype=dtype)
        shape = tuple(v.shape)
        if self.kind == "p" and shape:
            shape = (None,) + shape[1:]
        return K.placeholder(shape, dtype=dtype)


class Case:
    """Functions of the same inputs, each given as ``label=(build, reference)``:
    ``build`` maps the input tensors to a tensor, ``reference`` the input arrays
    to the expected array.  The loss adds up ``sum(C_label * f_label)``; outputs of
    one static shape are added element-wise first, so that a case's forward pass and
    its gradient with respect to a shared input each fuse into one kernel."""

    def __init__(self, name, inputs, **functions):
        self.name = name
        self.inputs = [i if isinstance(i, In) else In(i) for i in inputs]
        self.functions = functions
        self.weights = {}
        for label, (_, reference) in functions.items():
            out = np.asarray(reference(*[i.value for i in self.inputs]))
            self.weights[label] = RNG.uniform(0.5, 1.5, size=out.shape)

    def only(self, label):
        """The case reduced to one of its functions (to tell which one fails)."""
        part = Case.__new__(Case)
        part.name, part.inputs = f"{self.name}[{label}]", self.inputs
        part.functions = {label: self.functions[label]}
        part.weights = {label: self.weights[label]}
        return part

    def loss_np(self, values):
        return float(sum(np.sum(self.weights[label] * reference(*values))
                         for label, (_, reference) in self.functions.items()))

    def loss(self, tensors):
        """The loss tensor, and the placeholders (with their values) of the weights:
        a weight whose function has an unknown dim is a placeholder of the same
        static shape, so that the product fuses with the function."""
        terms, placeholders, feeds = {}, [], []
        for label, (build, _) in self.functions.items():
            out, w = build(*tensors), self.weights[label]
            if None in K.int_shape(out):
                weight = K.placeholder(K.int_shape(out), dtype="float64")
                placeholders.append(weight)
                feeds.append(w)
            else:
                weight = K.constant(w, dtype="float64")
            terms.setdefault(K.int_shape(out), []).append(out * weight)
        sums = [K.sum(functools.reduce(lambda a, b: a + b, same)) for same in terms.values()]
        return functools.reduce(lambda a, b: a + b, sums), placeholders, feeds


def numeric_gradient(case, index, step=1e-6):
    values = [i.value.astype(F64) if i.differentiable else i.value for i in case.inputs]
    x = values[index]
    grad = np.zeros_like(x)
    for pos in np.ndindex(x.shape):
        h = step * max(1.0, abs(x[pos]))
        saved = x[pos]
        x[pos] = saved + h
        up = case.loss_np(values)
        x[pos] = saved - h
        down = case.loss_np(values)
        x[pos] = saved
        grad[pos] = (up - down) / (2 * h)
    return grad


def compile_group(cases):
    """One K.function computing every case's loss and gradients.

    Returns {name: (loss, [gradient or None per differentiable input])}, or
    {name: exception} for a case whose graph could not be built."""
    placeholders, feeds, outputs, layout, table = [], [], [], {}, {}
    for case in cases:
        tensors = [i.tensor() for i in case.inputs]
        try:
            loss, weights, weight_values = case.loss(tensors)
            wrt = [t for i, t in zip(case.inputs, tensors) if i.differentiable]
            grads = K.gradients(loss, wrt)
        except (ValueError, TypeError, IndexError, NotImplementedError) as error:
            # a graph that cannot be built fails its own test, not the group
            table[case.name] = error
            continue
        for i, t in zip(case.inputs, tensors):
            if i.kind in "pP":
                placeholders.append(t)
                feeds.append(i.value)
        placeholders += weights
        feeds += weight_values
        layout[case.name] = (len(outputs), [g is not None for g in grads])
        outputs += [loss] + [g for g in grads if g is not None]
    results = K.function(placeholders, outputs)(feeds)
    for name, (start, mask) in layout.items():
        loss, rest = results[start], iter(results[start + 1:])
        table[name] = (loss, [next(rest) if m else None for m in mask])
    return table


def compare(case, result):
    if isinstance(result, Exception):
        raise result
    loss, grads = result
    values = [i.value for i in case.inputs]
    np.testing.assert_allclose(loss, case.loss_np(values), rtol=1e-10, atol=1e-10,
                               err_msg=f"{case.name}: forward loss")
    differentiable = [k for k, i in enumerate(case.inputs) if i.differentiable]
    for k, g in zip(differentiable, grads):
        expected = numeric_gradient(case, k)
        if g is None:  # right only where the loss does not depend on the input
            assert not expected.any(), f"{case.name}: no gradient for input {k}"
            continue
        assert g.shape == expected.shape, f"{case.name}: input {k}: {g.shape} != {expected.shape}"
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(g, expected, rtol=1e-6, atol=1e-7 * scale,
                                   err_msg=f"{case.name}: gradient of input {k}")


def check(case, result):
    """Compare a case's results; when they are wrong, compile each of its functions
    alone and name the ones that fail."""
    try:
        compare(case, result)
    except Exception as error:
        if len(case.functions) == 1:
            raise
        failing = []
        for label in case.functions:
            part = case.only(label)
            try:
                compare(part, compile_group([part])[part.name])
            except Exception as part_error:  # noqa: BLE001 - whatever fails names the part
                failing.append(f"{label}: {part_error}")
        raise AssertionError("\n".join(failing) or str(error)) from error


def group_test(cases):
    """A parametrized test over ``cases``, compiling them together once."""
    by_name = {c.name: c for c in cases}
    assert len(by_name) == len(cases), "case names must be unique"
    table = functools.cache(lambda: compile_group(cases))

    @pytest.mark.parametrize("name", list(by_name))
    def test(name):
        check(by_name[name], table()[name])

    return test


# ---------------------------------------------------------------------------
# Element-wise functions


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def np_relu(x, alpha=0.0, max_value=None, threshold=0.0):
    y = np.where(x >= threshold, x, alpha * (x - threshold))
    return y if max_value is None else np.minimum(y, max_value)


S = (3, 6)  # more than 16 elements: small static shapes run through NumPy, not kernels
ELEMENTWISE = [
    Case("kinked", [away_from(S, [0.0, 1.5])],
         abs=(K.abs, np.abs), relu=(K.relu, np_relu),
         relu_leaky_capped=(lambda x: K.relu(x, alpha=0.1, max_value=1.5),
                            lambda x: np_relu(x, 0.1, 1.5)),
         elu=(K.elu, np_elu), elu_alpha=(lambda x: K.elu(x, 0.5), lambda x: np_elu(x, 0.5)),
         softsign=(K.softsign, lambda x: x / (1 + np.abs(x)))),
    Case("positive", [positive(S), In(uniform((6,)), "v")],
         sqrt=(lambda x, y: K.sqrt(x), lambda x, y: np.sqrt(x)),
         log=(lambda x, y: K.log(x), lambda x, y: np.log(x)),
         pow_tensor=(K.pow, np.power)),
    Case("smooth", [uniform(S, -3, 3)],
         square=(K.square, np.square), exp=(K.exp, np.exp), tanh=(K.tanh, np.tanh),
         sigmoid=(K.sigmoid, np_sigmoid), softplus=(K.softplus, lambda x: np.log1p(np.exp(x))),
         sin=(K.sin, np.sin), cos=(K.cos, np.cos),
         pow_number=(lambda x: K.pow(x, 3.0), lambda x: x ** 3),
         negative=(lambda x: -x, np.negative)),
    Case("piecewise_linear",
         [In(away_from((4, 5), [-2.5, -0.5, 0.6, 2.5], gap=0.1, low=-4, high=4), "v")],
         hard_sigmoid=(K.hard_sigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
         clip=(lambda x: K.clip(x, -0.5, 0.6), lambda x: np.clip(x, -0.5, 0.6))),
    Case("python_numbers", [signed(S)],
         **{f"{op}_{order}": ((lambda x, f=f, o=order: f(x, 1.75) if o == "right" else f(-2.5, x)),
                              (lambda x, n=n, o=order: n(x, 1.75) if o == "right" else n(-2.5, x)))
            for op, (f, n) in {"add": (lambda a, b: a + b, np.add),
                               "subtract": (lambda a, b: a - b, np.subtract),
                               "multiply": (lambda a, b: a * b, np.multiply),
                               "divide": (lambda a, b: a / b, np.divide)}.items()
            for order in ("right", "left")}),
    Case("w1_chain", [uniform(S), In(uniform((6,)), "v")],
         chain=(lambda a, b: K.tanh(a * b + 1.0) * K.sigmoid(a - b) + 0.5 * b * b,
                lambda a, b: np.tanh(a * b + 1) * np_sigmoid(a - b) + 0.5 * b * b),
         reused=(lambda a, b: a * K.exp(a) - K.square(a) / (1 + K.abs(b)),
                 lambda a, b: a * np.exp(a) - a ** 2 / (1 + np.abs(b)))),
]
# + - * / with either operand broadcast: x of shape (3, 6) against y of shape (6,),
# (3, 1), a 0-d variable and (3, 6) (the first and last with maximum and minimum too).  Both
# operands are kept away from zero (they divide), and x away from every value of y (no
# ties).  x has an unknown first axis but for the column case, whose y is static.
_ARITHMETIC = {
    "add": (lambda x, y: x + y, np.add),
    "subtract": (lambda x, y: x - y, np.subtract),
    "rsubtract": (lambda x, y: y - x, lambda x, y: y - x),
    "multiply": (lambda x, y: y * x, np.multiply),
    "divide": (lambda x, y: x / y, np.divide),
    "rdivide": (lambda x, y: y / x, lambda x, y: y / x),
}
_EXTREMES = {
    "maximum": (K.maximum, np.maximum),
    "minimum": (lambda x, y: K.minimum(y, x), lambda x, y: np.minimum(y, x)),
}
for _shape, _y_shape, _kinds, _functions in [
        ("row", (6,), "pv", {**_ARITHMETIC, **_EXTREMES}),
        ("column", (3, 1), "Pv", _ARITHMETIC),
        ("scalar", (), "pv", _ARITHMETIC),
        ("same_shape", S, "pp", {**_ARITHMETIC, **_EXTREMES})]:
    _y = signed(_y_shape)
    _x = away_from(S, [0.0] + list(np.ravel(_y)), gap=0.2)
    ELEMENTWISE.append(Case(f"broadcast_{_shape}", [In(_x, _kinds[0]), In(_y, _kinds[1])],
                            **_functions))

test_elementwise = group_test(ELEMENTWISE)


# ---------------------------------------------------------------------------
# Reductions over axes, with and without keepdims: every reduction for each
# (axis, keepdims), on values away from zero (prod divides) and without ties.

R = (2, 3, 4)
_REDUCTIONS = {"sum": (K.sum, np.sum), "mean": (K.mean, np.mean), "max": (K.max, np.max),
               "min": (K.min, np.min), "prod": (K.prod, np.prod), "var": (K.var, np.var),
               "std": (K.std, np.std), "logsumexp": (K.logsumexp, np_logsumexp)}
REDUCTIONS = [
    Case(f"axis{axis}_keepdims{keep}", [In(signed(R, 0.5, 1.5), kind)],
         **{name: (lambda x, f=f, a=axis, kd=keep: f(x, axis=a, keepdims=kd),
                   lambda x, f=n, a=axis, kd=keep: f(x, axis=a, keepdims=kd))
            for name, (f, n) in _REDUCTIONS.items()})
    for axis, keep, kind in [(None, False, "p"), (-1, True, "v"), (1, False, "v"),
                             ((0, 2), True, "p"), ((1, 2), False, "v")]
]

test_reductions = group_test(REDUCTIONS)


# ---------------------------------------------------------------------------
# Linear algebra


def np_dot(x, y):
    """Theano's dot: the last axis of x against the second-to-last of y."""
    if y.ndim == 1:
        return x @ y
    return np.tensordot(x, y, axes=([-1], [-2]))


def np_batch_dot(x, y, axes):
    """Keras's batch_dot, sample by sample with tensordot."""
    out = np.stack([np.tensordot(a, b, axes=(axes[0] - 1, axes[1] - 1)) for a, b in zip(x, y)])
    return out[:, None] if out.ndim == 1 else out


def dot_case(name, x, y, **kwargs):
    if kwargs:
        axes = kwargs["axes"]
        return Case(name, [x, y], batch_dot=(lambda a, b: K.batch_dot(a, b, axes=axes),
                                             lambda a, b: np_batch_dot(a, b, axes)))
    return Case(name, [x, y], dot=(K.dot, np_dot))


LINALG = [
    dot_case("dot_2d", uniform((3, 4)), In(uniform((4, 5)), "v")),
    dot_case("dot_3d_2d", uniform((2, 3, 4)), In(uniform((4, 5)), "v")),
    dot_case("dot_2d_3d", uniform((3, 4)), In(uniform((2, 4, 5)), "v")),
    dot_case("dot_3d_3d", In(uniform((2, 3, 4)), "v"), uniform((3, 4, 2))),
    dot_case("dot_vector", uniform((3, 4)), In(uniform((4,)), "v")),
    dot_case("dot_1d_2d", In(uniform((4,)), "v"), uniform((4, 3))),
    dot_case("batch_dot_2d", uniform((3, 4)), uniform((3, 4)), axes=(1, 1)),
    dot_case("batch_dot_3d", uniform((3, 2, 4)), In(uniform((3, 4, 5)), "v"), axes=(2, 1)),
    dot_case("batch_dot_3d_axes_1_2", uniform((3, 4, 2)), uniform((3, 5, 4)), axes=(1, 2)),
    dot_case("batch_dot_3d_2d", uniform((3, 2, 4)), uniform((3, 4)), axes=(2, 1)),
]

test_linear_algebra = group_test(LINALG)


# ---------------------------------------------------------------------------
# Softmax and the cross-entropies


def np_softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(z, axis=-1):
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def np_binary_xent_logits(t, z):
    return np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))


def one_hot(labels, n):
    return np.eye(n)[labels]


_LABELS = np.array([1, 0, 4, 2])
_ROWS = np.arange(4)
XENT = [
    Case("softmax", [uniform((4, 5)), In(uniform((4, 5)), "v")],
         softmax=(lambda z, v: K.softmax(z), lambda z, v: np_softmax(z)),
         softmax_axis0=(lambda z, v: K.softmax(v, axis=0), lambda z, v: np_softmax(v, 0)),
         log_softmax=(lambda z, v: K.log(K.softmax(v)), lambda z, v: np_log_softmax(v))),
    # soft targets (differentiated too), logits, and probabilities that do not
    # come from a softmax (normalised, inside [eps, 1 - eps])
    Case("categorical", [In(np_softmax(uniform((4, 5))), "v"), uniform((4, 5)),
                         In(uniform((4, 5)), "v"), In(positive((4, 5), 0.2, 1.0), "v")],
         from_softmax=(lambda t, z, v, p: K.categorical_crossentropy(t, K.softmax(z)),
                       lambda t, z, v, p: -np.sum(t * np_log_softmax(z), axis=-1)),
         from_logits=(lambda t, z, v, p: K.categorical_crossentropy(t, v, from_logits=True),
                      lambda t, z, v, p: -np.sum(t * np_log_softmax(v), axis=-1)),
         from_probabilities=(lambda t, z, v, p: K.categorical_crossentropy(t, p),
                             lambda t, z, v, p: -np.sum(t * np.log(p / p.sum(-1, keepdims=True)),
                                                        axis=-1))),
    Case("sparse", [_LABELS.astype("int32"), In(_LABELS[:, None], "c"), uniform((4, 5)),
                    In(uniform((4, 5)), "v"), In(positive((4, 5), 0.05, 0.9), "v")],
         from_softmax=(lambda t, tc, z, v, p: K.sparse_categorical_crossentropy(t, K.softmax(z)),
                       lambda t, tc, z, v, p: -np_log_softmax(z)[_ROWS, t]),
         from_logits_column_targets=(
             lambda t, tc, z, v, p: K.sparse_categorical_crossentropy(tc, v, from_logits=True),
             lambda t, tc, z, v, p: -np_log_softmax(v)[_ROWS, tc[:, 0]]),
         from_probabilities=(lambda t, tc, z, v, p: K.sparse_categorical_crossentropy(t, p),
                             lambda t, tc, z, v, p: -np_log_softmax(np.log(p))[_ROWS, t])),
    Case("binary", [In(RNG.uniform(0, 1, (4, 5)), "v"), uniform((4, 5), -4, 4),
                    In(uniform((4, 5), -4, 4), "v"), In(positive((4, 5), 0.05, 0.95), "v")],
         from_sigmoid=(lambda t, z, v, p: K.binary_crossentropy(t, K.sigmoid(z)),
                       lambda t, z, v, p: np_binary_xent_logits(t, z)),
         from_logits=(lambda t, z, v, p: K.binary_crossentropy(t, v, from_logits=True),
                      lambda t, z, v, p: np_binary_xent_logits(t, v)),
         from_probabilities=(lambda t, z, v, p: K.binary_crossentropy(t, p),
                             lambda t, z, v, p: -(t * np.log(p) + (1 - t) * np.log(1 - p)))),
]

test_softmax_and_crossentropies = group_test(XENT)


# ---------------------------------------------------------------------------
# Indexing and shape manipulation


def np_l2_normalize(x, axis):
    return x / np.sqrt(np.maximum(np.sum(x * x, axis=axis, keepdims=True), 1e-12))


def np_batch_normalization(x, mean, var, beta, gamma, epsilon=1e-3):
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def one(name, inputs, build, reference):
    return Case(name, inputs, **{name: (build, reference)})


_IDX = np.array([[0, 2], [2, 4], [4, 4]], dtype="int32")
SHAPES = [
    Case("gather", [In(uniform((5, 3)), "v"), In(_IDX[:, 1], "p"), In(_IDX, "c")],
         gather=(lambda r, i, j: K.gather(r, i), lambda r, i, j: r[i]),
         gather_2d_indices=(lambda r, i, j: K.gather(r, j), lambda r, i, j: r[j])),
    one("concatenate_last", [uniform((3, 2)), In(uniform((3, 4)), "v")],
        lambda a, b: K.concatenate([a, b]), lambda a, b: np.concatenate([a, b], -1)),
    one("concatenate_first", [uniform((2, 3)), In(uniform((1, 3)), "v"), uniform((3, 3))],
        lambda a, b, c: K.concatenate([a, b, c], axis=0),
        lambda a, b, c: np.concatenate([a, b, c], 0)),
    one("reshape", [uniform((4, 6))], lambda x: K.reshape(x, (2, -1, 3)),
        lambda x: x.reshape(2, -1, 3)),
    one("permute_dimensions", [uniform((2, 3, 4))], lambda x: K.permute_dimensions(x, (2, 0, 1)),
        lambda x: x.transpose(2, 0, 1)),
    one("transpose", [In(uniform((3, 4)), "v")], K.transpose, np.transpose),
    one("repeat_elements", [uniform((2, 3, 2))], lambda x: K.repeat_elements(x, 3, axis=1),
        lambda x: np.repeat(x, 3, axis=1)),
    one("repeat", [uniform((3, 2))], lambda x: K.repeat(x, 2), lambda x: np.stack([x, x], axis=1)),
    one("tile", [uniform((3, 2))], lambda x: K.tile(x, (2, 3)), lambda x: np.tile(x, (2, 3))),
    one("expand_dims", [uniform((3, 4))], lambda x: K.expand_dims(x, 1), lambda x: x[:, None]),
    one("squeeze", [In(uniform((3, 1, 4)), "v")], lambda x: K.squeeze(x, 1), lambda x: x[:, 0]),
    one("slice", [uniform((4, 3, 5))], lambda x: K.slice(x, (1, 0, 2), (2, -1, 2)),
        lambda x: x[1:3, :, 2:4]),
    one("getitem_steps", [In(uniform((4, 5)), "v")], lambda x: x[1:, ::2], lambda x: x[1:, ::2]),
    one("getitem_int_newaxis", [uniform((3, 2, 4))], lambda x: x[None, ..., 2],
        lambda x: x[None, ..., 2]),
    one("stack", [uniform((3, 4)), In(uniform((3, 4)), "v")], lambda a, b: K.stack([a, b], axis=1),
        lambda a, b: np.stack([a, b], axis=1)),
    one("reverse", [uniform((3, 4))], lambda x: K.reverse(x, 1), lambda x: x[:, ::-1]),
    one("cumsum", [uniform((3, 4))], lambda x: K.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1)),
    one("batch_flatten", [uniform((3, 2, 2))], K.batch_flatten, lambda x: x.reshape(len(x), -1)),
    Case("l2_normalize", [uniform((3, 4)), In(uniform((3, 4)), "v")],
         last_axis=(lambda x, v: K.l2_normalize(x, axis=-1), lambda x, v: np_l2_normalize(x, -1)),
         all_axes=(lambda x, v: K.l2_normalize(v), lambda x, v: np_l2_normalize(v, None))),
    one("batch_normalization",
        [uniform((3, 4)), In(uniform((4,)), "v"), In(positive((4,), 0.5, 2), "v"),
         In(uniform((4,)), "v"), In(uniform((4,)), "v")],
        K.batch_normalization, np_batch_normalization),
    one("batch_normalization_axis1",
        [uniform((2, 3, 2)), In(uniform((3,)), "v"), In(positive((3,), 0.5, 2), "v"),
         In(uniform((3,)), "v"), In(uniform((3,)), "v")],
        lambda x, m, v, b, g: K.batch_normalization(x, m, v, b, g, axis=1),
        lambda x, m, v, b, g: np_batch_normalization(x, m[:, None], v[:, None], b[:, None],
                                                     g[:, None])),
]

test_shapes = group_test(SHAPES)


# ---------------------------------------------------------------------------
# What has no gradient


def test_stop_gradient_blocks():
    x, y, c = uniform((3, 6)), uniform((3, 6)), uniform((3, 6))
    xt, yt = K.placeholder((None, 6), dtype="float64"), K.variable(y, dtype="float64")
    ct = K.constant(c, dtype="float64")
    unused = K.variable(uniform((2,)), dtype="float64")
    # y only through stop_gradient: None, as in the TensorFlow backend; x both ways: the
    # stopped path adds nothing
    blocked = K.sum(xt * K.stop_gradient(yt) + K.square(xt) + K.stop_gradient(xt) * ct)
    gx, gy, g_unused = K.gradients(blocked, [xt, yt, unused])
    assert gy is None and g_unused is None
    a, b = K.stop_gradient([xt, yt])  # the list form
    assert K.gradients(K.sum(a * b), [xt, yt]) == [None, None]
    # a non-scalar loss is summed first
    (g_vector,) = K.gradients(K.exp(xt) * ct, [xt])
    got_x, got_vector = K.function([xt], [gx, g_vector])([x])
    np.testing.assert_allclose(got_x, y + 2 * x, rtol=1e-12)
    np.testing.assert_allclose(got_vector, np.exp(x) * c, rtol=1e-12)


def test_stop_gradient_costs_nothing_in_a_compiled_function():
    # it marks the graph for K.gradients only: an element-wise chain through it is
    # still one kernel, and the value is its input's
    x = uniform((3, 6))
    xt = K.placeholder((None, 6), dtype="float64")
    fn = K.function([xt], [K.exp(K.stop_gradient(xt * 2.0)) + 1.0])
    assert [s.kind for s in fn.plan.steps] == ["kernel"]
    np.testing.assert_allclose(fn([x])[0], np.exp(x * 2.0) + 1.0, rtol=1e-14)


@pytest.mark.parametrize("loss", ["softmax", "cross_entropy"])
def test_softmax_gradient_does_not_route_through_the_max(loss):
    # softmax and log-softmax subtract the row max only to stay finite; the result does
    # not depend on it, so its gradient is zero and is not computed (it used to be, as
    # an argmax mask per row)
    z = uniform((4, 5))
    zt = K.variable(z, dtype="float64")
    p = K.softmax(zt)
    objective = (K.sum(p * K.constant(np.arange(5.0))) if loss == "softmax"
                 else K.sum(K.categorical_crossentropy(K.constant(np.eye(5)[[0, 2, 4, 1]]), p)))
    fn = K.function([], K.gradients(objective, [zt]))
    assert "equal" not in fn.explain()
    p_np = np_softmax(z)
    if loss == "softmax":
        expected = p_np * (np.arange(5.0) - (p_np * np.arange(5.0)).sum(-1, keepdims=True))
    else:
        expected = p_np - np.eye(5)[[0, 2, 4, 1]]
    np.testing.assert_allclose(fn([])[0], expected, rtol=1e-12)


def test_non_differentiable_ops_contribute_zero():
    """argmax, comparisons, round, sign and casts to int: a variable reached only through
    them gets None (or zeros); beside a differentiable path they add nothing to it."""
    x = away_from((4, 5), [0.0, 0.3, -1.5, -0.5, 0.5, 1.5], gap=0.1)
    xt = K.placeholder((None, 5), dtype="float64")
    blocked = {
        "argmax": K.cast(K.argmax(xt, axis=-1), "float64"),
        "comparison": K.cast(K.greater(xt, 0.3), "float64") + K.cast(K.equal(xt, xt), "float64"),
        "round": K.round(xt),
        "sign": K.sign(xt),
        "cast_to_int": K.cast(K.cast(xt, "int32"), "float64"),
    }
    through = {  # x times each: the gradient is the blocked factor itself
        "argmax": (xt * K.one_hot(K.argmax(xt, axis=-1), 5), np.eye(5)[x.argmax(-1)]),
        "comparison": (xt * blocked["comparison"], (x > 0.3) + 1.0),
        "round": (xt * blocked["round"], np.round(x)),
        "sign": (xt * blocked["sign"], np.sign(x)),
        "cast_to_int": (xt * blocked["cast_to_int"], np.trunc(x)),
    }
    alone = {name: K.gradients(K.sum(t), [xt])[0] for name, t in blocked.items()}
    grads = {name: K.gradients(K.sum(t), [xt])[0] for name, (t, _) in through.items()}
    present = [name for name, g in alone.items() if g is not None]
    got = K.function([xt], [alone[n] for n in present] + list(grads.values()))([x])
    for name, g in zip(present, got):
        assert not g.any(), name
    for (name, (_, expected)), g in zip(through.items(), got[len(present):]):
        np.testing.assert_array_equal(g, expected, err_msg=name)


# ---------------------------------------------------------------------------
# Numerically stable forms: logits of magnitude 100


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stable_forms_with_large_logits(dtype):
    z = np.array([[100.0, -100.0, 50.0, 0.0], [-100.0, 100.0, -60.0, 99.0],
                  [-100.0, -100.0, 100.0, -30.0]])
    t = np.array([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.2, 0.3, 0.0, 0.5]])
    c = uniform(z.shape, 0.5, 1.5)
    zt, tt = K.placeholder((None, 4), dtype=dtype), K.placeholder((None, 4), dtype=dtype)
    ct = K.constant(c, dtype=dtype)
    losses = {
        "categorical": K.sum(K.categorical_crossentropy(tt, K.softmax(zt))),
        "binary": K.sum(K.binary_crossentropy(tt, K.sigmoid(zt))),
        "log_softmax": K.sum(K.log(K.softmax(zt)) * ct),
    }
    grads = [K.gradients(loss, [zt])[0] for loss in losses.values()]
    got = K.function([zt, tt], list(losses.values()) + grads)([z.astype(dtype), t.astype(dtype)])
    log_p, p = np_log_softmax(z), np_softmax(z)
    expected_losses = [-np.sum(t * log_p), np.sum(np_binary_xent_logits(t, z)), np.sum(c * log_p)]
    expected_grads = [p * t.sum(-1, keepdims=True) - t, np_sigmoid(z) - t,
                      c - p * c.sum(-1, keepdims=True)]
    eps = np.finfo(dtype).eps
    for name, value, expected in zip(losses, got[:3], expected_losses):
        assert np.isfinite(value), name
        np.testing.assert_allclose(value, expected, rtol=8 * eps, err_msg=name)
    for name, value, expected in zip(losses, got[3:], expected_grads):
        assert np.isfinite(value).all(), name
        np.testing.assert_allclose(value, expected, rtol=0, atol=8 * eps, err_msg=name)


# ---------------------------------------------------------------------------
# Regressions


@pytest.mark.parametrize("known", [True, False], ids=["static_dims", "unknown_dims"])
def test_dot_gradient_with_a_left_operand_of_rank_3(known):
    """dot((batch, time, k), (k, n)), a Dense layer on a sequence: the gradient of the
    left operand was built with a transposed product of a 3-D tensor (ValueError)."""
    x, w, c = uniform((2, 3, 4)), uniform((4, 5)), uniform((2, 3, 5))
    xt = K.placeholder((None, 3, 4) if known else (None, None, None), dtype="float64")
    wt = K.placeholder((4, 5) if known else (None, None), dtype="float64")
    loss = K.sum(K.dot(xt, wt) * K.constant(c, dtype="float64"))
    gx, gw = K.function([xt, wt], K.gradients(loss, [xt, wt]))([x, w])
    np.testing.assert_allclose(gx, c @ w.T, rtol=1e-12)
    np.testing.assert_allclose(gw, np.einsum("btk,btn->kn", x, c), rtol=1e-12)


@pytest.mark.parametrize("x_shape", [(None, None), (None, None, 4), ()], ids=["2d", "3d", "1d"])
def test_dot_gradient_with_a_vector_right_operand_and_unknown_dims(x_shape):
    """dot(x, vector) with several unknown dims: the gradient reshaped to (-1, -1)."""
    x = uniform((2, 3, 4)[3 - max(len(x_shape), 1):])
    y, c = uniform(4), uniform(x.shape[:-1])
    xt = K.placeholder(x_shape or (None,), dtype="float64")
    yt = K.placeholder((None,), dtype="float64")
    loss = K.sum(K.dot(xt, yt) * K.constant(c, dtype="float64"))
    gx, gy = K.function([xt, yt], K.gradients(loss, [xt, yt]))([x, y])
    np.testing.assert_allclose(gx, c[..., None] * y, rtol=1e-12)
    np.testing.assert_allclose(gy, np.tensordot(c, x, axes=c.ndim), rtol=1e-12)


def test_log_of_softmax_is_a_log_softmax():
    """log(softmax(z)) in float32 with logits 200 apart: the softmax underflows to 0, and
    its log was -inf with nan gradients; it is computed as a log-softmax from z."""
    z = np.array([[100.0, -100.0, 50.0], [-100.0, 100.0, 0.0]], dtype="float32")
    zt = K.placeholder((None, 3), dtype="float32")
    log_p = K.log(K.softmax(zt))
    (grad,) = K.gradients(K.sum(log_p[:, 0]), [zt])
    got, got_grad = K.function([zt], [log_p, grad])([z])
    shifted = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    p = np.exp(expected)
    np.testing.assert_allclose(got_grad, np.eye(3)[[0, 0]] - p, atol=1e-6)


def test_binary_crossentropy_gradient_at_zero_logits():
    """At a logit of exactly 0 (a zero-initialised output layer) the gradient is
    sigmoid(0) - t = 0.5 - t; the stable form's |z| had gradient 0 there, giving 1 - t."""
    t = np.array([[0.0, 1.0, 0.25], [1.0, 0.0, 0.5]])
    zt, tt = K.placeholder((None, 3), dtype="float64"), K.placeholder((None, 3), dtype="float64")
    losses = [K.binary_crossentropy(tt, zt, from_logits=True),
              K.binary_crossentropy(tt, K.sigmoid(zt))]
    grads = [K.gradients(K.sum(loss), [zt])[0] for loss in losses]
    for got in K.function([zt, tt], grads)([np.zeros((2, 3)), t]):
        np.testing.assert_allclose(got, 0.5 - t, atol=1e-15)


def test_sum_gradient_has_no_cast_to_the_same_dtype():
    """The gradient of a sum cast g to x's dtype even when they agreed: an extra kernel
    (one pass, one launch) in every backward pass through a sum, e.g. a cross-entropy."""
    x = K.placeholder((None, 10))
    (grad,) = K.gradients(K.sum(K.square(x), axis=-1), [x])
    stack, seen, ops = [grad], set(), []
    while stack:
        node = stack.pop()
        if node.id not in seen:
            seen.add(node.id)
            ops.append(node.op)
            stack.extend(node.inputs)
    assert "cast" not in ops, ops
    got = K.function([x], [grad])([np.full((2, 10), 1.5, dtype="float32")])[0]
    np.testing.assert_array_equal(got, np.full((2, 10), 3.0, dtype="float32"))


def test_small_broadcast_gradient_feeding_a_kernel():
    """A group small enough to run through NumPy handed its broadcast_like output (a
    stride-0 view) to a generated kernel, which Numba could not compile."""
    x = K.variable(np.ones((3, 4)), dtype="float64")
    (gx,) = K.gradients(K.sum(x), [x])  # broadcast_like(1, x): 12 elements, run by NumPy
    y = K.placeholder((None, 3, 4), dtype="float64")
    got = K.function([y], [y * gx])([np.full((2, 3, 4), 2.0)])[0]
    np.testing.assert_array_equal(got, np.full((2, 3, 4), 2.0))


def test_relu_gradient_at_zero_is_zero_as_in_tensorflow():
    # TF's relu gradient is g * (x > 0); leaky relu's at 0 is alpha (tf.nn.leaky_relu)
    x = K.placeholder((None,), dtype="float64")
    xv = np.array([-1.0, 0.0, 2.0] * 8)
    (plain,) = K.function([x], K.gradients(K.sum(K.relu(x)), [x]))([xv])
    np.testing.assert_array_equal(plain, (xv > 0).astype(float))
    (leaky,) = K.function([x], K.gradients(K.sum(K.relu(x, alpha=0.1)), [x]))([xv])
    np.testing.assert_allclose(leaky, np.where(xv > 0, 1.0, 0.1))


def test_gradients_of_slices_tiling_the_last_axis_are_joined():
    x = K.placeholder((None, 7), dtype="float64")
    parts = [x[:, 0:2], x[..., 2:3], x[:, 3:7]]
    loss = K.sum(K.tanh(parts[0])) + K.sum(parts[1] ** 3) + K.sum(K.exp(parts[2])) \
        + K.sum(x[:, 2:3] * 2.0) + K.sum(x) * 0.5  # the middle slice twice, and x whole
    fn = K.function([x], K.gradients(loss, [x]))
    labels = [s.label for s in fn.plan.steps]
    assert "concatenate" in labels and "scatter_like" not in labels
    xv = RNG.standard_normal((5, 7))
    want = np.concatenate([1 - np.tanh(xv[:, :2]) ** 2, 3 * xv[:, 2:3] ** 2 + 2,
                           np.exp(xv[:, 3:])], axis=1) + 0.5
    np.testing.assert_allclose(fn([xv])[0], want, rtol=1e-12)


def test_gradients_of_slices_leaving_a_gap_are_scattered():
    x = K.placeholder((None, 5), dtype="float64")
    fn = K.function([x], K.gradients(K.sum(x[:, 0:2] * 3.0) + K.sum(x[:, 3:5]), [x]))
    np.testing.assert_array_equal(fn([np.ones((2, 5))])[0], [[3, 3, 0, 1, 1]] * 2)


@pytest.mark.parametrize("x_shape", [(None, None, 4), (None, None, None)], ids=["none_none_4", "none_x3"])
def test_reduction_gradients_with_several_unknown_dims(x_shape):
    """The gradient of a reduction without keepdims on a tensor with two unknown dims
    or more (a sequence model's (batch, time, features) output) was reshaped to a
    static shape with one -1 per unknown dim, which failed to build.  One compiled
    function per shape, called at two run-time shapes, against finite differences of
    ``sum(reduction(x) ** 2)``, each reduction's terms added up over a few axes."""
    settings = [(0, False), (-1, False), (1, True)]
    x = K.placeholder(x_shape, dtype="float64")
    grads = []
    for f, _ in _REDUCTIONS.values():
        loss = functools.reduce(lambda a, b: a + b, [K.sum(K.square(f(x, axis=a, keepdims=kd)))
                                                     for a, kd in settings])
        grads += K.gradients(loss, [x])
    fn = K.function([x], grads)
    for shape in [(2, 3, 4), (3, 2, 4) if x_shape[-1] == 4 else (4, 2, 5)]:
        xv = signed(shape, 0.5, 1.5)
        for (name, (_, reduce_np)), got in zip(_REDUCTIONS.items(), fn([xv])):
            def loss_np(v, reduce_np=reduce_np):
                return sum(np.sum(reduce_np(v, axis=a, keepdims=kd) ** 2) for a, kd in settings)
            expected = numeric_gradient_of(loss_np, xv)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7 * np.abs(expected).max(),
                                       err_msg=f"{name}, input of shape {shape}")


def test_cumprod_gradient_is_tensorflows():
    # d/dx_j sum_i w_i prod_{k<=i} x_k = sum_{i>=j} w_i y_i / x_j  (x without zeros)
    rng = np.random.default_rng(3)
    x_val = rng.uniform(0.5, 1.5, (3, 4)).astype("float64")
    w = rng.standard_normal((3, 4))
    x = K.variable(x_val, dtype="float64")
    for axis in (0, 1):
        y = np.cumprod(x_val, axis=axis)
        want = np.flip(np.cumsum(np.flip(w * y, axis), axis), axis) / x_val
        got = K.eval(K.gradients(K.sum(K.cumprod(x, axis=axis) * w), [x])[0])
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_second_derivative_through_an_op_without_a_rule_raises():
    # the gradient of concatenate slices its input gradient; that slice has no rule
    # of its own, so a second derivative through it must raise, not be zero
    x = K.variable(np.array([1.0, 2.0, 3.0]))
    first = K.gradients(K.sum(K.concatenate([x * x, x]) ** 2), [x])[0]
    with pytest.raises(LookupError, match="no gradient is defined for op"):
        K.gradients(K.sum(first), [x])
    # argmax, shape and random ops are not differentiable, as in TensorFlow: no error
    assert K.gradients(K.sum(K.cast(K.argmax(x), "float32")), [x]) == [None]
