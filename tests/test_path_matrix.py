"""The path matrix: every registered op, and every path of a 2-D convolution
and its pooling, run through every way a function runs, compared with NumPy.

Each case builds a small graph with ``K.*`` calls (a table of argument makers
below) and runs it
- as a plan (a function called once; ``tuning.ONE_CALL_AFTER`` pinned high),
- as one compiled call (``ONE_CALL_AFTER=1``; inputs under
  ``ONE_CALL_MAX_ELEMENTS``): where every step of the graph has a compiled
  form the test checks that the call ran, else that the plan ran (the case's
  ``whole_call`` says which: a property of the op, recorded here),
- inside the step of a scan (the op ``K.rnn`` builds) over a few time steps,
  the op's first input there depending on the carried state (so that the op
  runs in the loop, not hoisted out of it: checked); the cases of a dtype
  in steps of SCAN_GROUP, so that one loop compiles for several, and the steps
  after the first run in it where every op has a compiled form (checked; such
  an op in one of the two dtypes, see _scan_groups),
in float32 and float64 where the op takes floats.  The reference evaluates
the same graph node by node with each op's NumPy form
(``evaluator.evaluate``), in a Python loop over the steps for the scan.

Tolerances are relative, scaled by the largest magnitude of the reference:
1e-10 for float64 and 1e-5 for float32, except where a case says why not.
Inputs hold more than ``tuning.NUMPY_MAX_SIZE`` values, so that element-wise
groups run their generated kernels rather than NumPy.
"""
import copy

import numpy as np
import pytest

import numbackend as K
from jit_kernels import blas, conv
from numbackend import evaluator, tuning
from numbackend.graph import toposort
from numbackend.ops import OPS
from numbackend.ops.scan import scan
from numbackend.plan import BODIES

TOLERANCE = {"float32": 1e-5, "float64": 1e-10, None: 0.0}
STEPS = 3  # time steps of the scan mode
# cases run in one scan step: one loop compiles for them all (a loop's compile
# time grows faster than its length: all of a dtype's cases in one took longer)
SCAN_GROUP = 8


# ---------------------------------------------------------------------------
# Argument makers: each takes a NumPy Generator and the case's float dtype.

def normal(*shape):
    return lambda rng, dtype: rng.standard_normal(shape).astype(dtype)


def positive(*shape):
    return lambda rng, dtype: rng.uniform(0.5, 2.0, shape).astype(dtype)


def probabilities(*shape):
    """Softmax rows over the last axis (CTC's inputs)."""
    def make(rng, dtype):
        e = np.exp(rng.standard_normal(shape))
        return (e / e.sum(axis=-1, keepdims=True)).astype(dtype)
    return make


def integers(*shape, low=0, high=4, dtype="int32"):
    return lambda rng, _: rng.integers(low, high, shape).astype(dtype)


def booleans(*shape):
    return lambda rng, _: rng.random(shape) < 0.5


def fixed(value, dtype="int32"):
    return lambda rng, _: np.asarray(value, dtype)


def gradient(forward, wrt=0):
    """A builder of the gradient of sum(forward(*inputs) * g) with respect to
    input ``wrt``, g being the last input (the backward ops' graphs)."""
    def build(*inputs):
        *args, g = inputs
        return K.gradients(K.sum(forward(*args) * g), [args[wrt]])[0]
    return build


class Case:
    """A graph made by ``build`` from placeholders of ``inputs``' arrays, in
    which op ``op`` appears.  ``floats``: run in float32 and float64 (else
    once, with the makers' own dtypes); ``whole_call``: every step has a
    compiled form, so that the function runs as one compiled call; ``scan``:
    True, or why the case is not run inside a scan step; ``tolerance``: {dtype:
    relative tolerance} where the default is not met, with the reason in
    ``why``; ``unknown_batch``: the placeholders' first axis is None;
    ``unknown``: {input index: axes of its placeholder that are None}."""

    def __init__(self, op, build, *inputs, name=None, floats=True, whole_call=False, scan=True,
                 tolerance=None, why=None, unknown_batch=False, unknown=None):
        self.op, self.build, self.inputs = op, build, inputs
        self.name = name or op
        self.floats, self.whole_call, self.scan = floats, whole_call, scan
        self.tolerance = dict(TOLERANCE, **(tolerance or {}))
        self.why = why
        self.unknown = ({i: (0,) for i in range(len(inputs))} if unknown_batch
                        else dict(unknown or {}))

    def arrays(self, dtype, seed=0):
        rng = np.random.default_rng(seed)
        return [make(rng, dtype or "float64") for make in self.inputs]


def _softmax_rows(x):
    return K.softmax(x)


def _tanh_step(x_t, states):
    h = K.tanh(x_t + states[0])
    return h, [h]


# the reason of cases whose op only a run-time dimension brings (a gradient
# summed back to an unknown shape): inside a scan's step the shapes are static
STATIC_IN_SCAN = "the op comes from a run-time dimension: a scan's step has static shapes"

C = Case
CASES = [
    # element-wise: fused into generated kernels
    C("add", lambda x, y: x + y, normal(4, 6), normal(6), whole_call=True),
    C("subtract", lambda x, y: x - y, normal(4, 6), normal(4, 6), whole_call=True),
    C("multiply", lambda x, y: x * y, normal(4, 6), normal(4, 1), whole_call=True),
    C("divide", lambda x, y: x / y, normal(4, 6), positive(4, 6), whole_call=True),
    C("times_reciprocal", _softmax_rows, normal(4, 6), whole_call=True),
    C("floor_divide", lambda x, y: x // y, normal(4, 6), positive(4, 6), whole_call=True),
    C("mod", lambda x, y: x % y, normal(4, 6), positive(4, 6), whole_call=True),
    C("power", lambda x: K.pow(x, 1.7), positive(4, 6), whole_call=True),
    C("maximum", K.maximum, normal(4, 6), normal(4, 6), whole_call=True),
    C("minimum", K.minimum, normal(4, 6), normal(4, 6), whole_call=True),
    C("equal", lambda x, y: K.equal(K.round(x), K.round(y)), normal(4, 6), normal(4, 6),
      whole_call=True),
    C("not_equal", lambda x, y: K.not_equal(K.round(x), y), normal(4, 6), normal(4, 6),
      whole_call=True),
    C("less", K.less, normal(4, 6), normal(4, 6), whole_call=True),
    C("less_equal", K.less_equal, normal(4, 6), normal(4, 6), whole_call=True),
    C("greater", K.greater, normal(4, 6), normal(4, 6), whole_call=True),
    C("greater_equal", K.greater_equal, normal(4, 6), normal(4, 6), whole_call=True),
    C("logical_and", lambda a, b: a & b, booleans(4, 6), booleans(4, 6), floats=False,
      whole_call=True, scan="the op takes booleans: the scan mode varies a float input"),
    C("logical_or", lambda a, b: a | b, booleans(4, 6), booleans(4, 6), floats=False,
      whole_call=True, scan="the op takes booleans: the scan mode varies a float input"),
    C("logical_not", lambda x: ~K.greater(x, 0.0), normal(4, 6), whole_call=True),
    C("where", lambda x, y: K.switch(K.greater(x, 0.0), x, y), normal(4, 6), normal(4, 6),
      whole_call=True),
    C("broadcast_like", lambda x, y: K.ones_like(x) * 2.0 + y, normal(4, 6), normal(6),
      whole_call=True),
    C("negative", lambda x: -x, normal(4, 6), whole_call=True),
    C("abs", K.abs, normal(4, 6), whole_call=True),
    C("sign", K.sign, normal(4, 6), whole_call=True),
    C("square", K.square, normal(4, 6), whole_call=True),
    C("sqrt", K.sqrt, positive(4, 6), whole_call=True),
    C("exp", K.exp, normal(4, 6), whole_call=True),
    C("exp_nonpositive", lambda x, t: K.categorical_crossentropy(t, x, from_logits=True),
      normal(4, 6), probabilities(4, 6), whole_call=True),
    C("expm1", K.elu, normal(4, 6), whole_call=True),
    C("log", K.log, positive(4, 6), whole_call=True),
    C("log1p", lambda logits, target: K.binary_crossentropy(target, logits, from_logits=True),
      normal(4, 6), positive(4, 6), whole_call=True),
    C("tanh", K.tanh, normal(4, 6), whole_call=True),
    C("sigmoid", K.sigmoid, normal(4, 6), whole_call=True),
    C("softplus", K.softplus, normal(4, 6), whole_call=True),
    C("sin", K.sin, normal(4, 6), whole_call=True),
    C("cos", K.cos, normal(4, 6), whole_call=True),
    C("round", K.round, normal(4, 6), whole_call=True),
    C("cast", lambda x: K.cast(x * 4.0, "int32"), normal(4, 6), whole_call=True),
    # reductions: over the last axis fused as a kernel's last stage
    C("sum", lambda x: K.sum(x, axis=-1), normal(4, 6), whole_call=True),
    C("sum", lambda x: K.sum(x, axis=0), normal(4, 6), name="sum-axis0"),
    C("prod", lambda x: K.prod(x, axis=-1), positive(4, 6), whole_call=True),
    C("max", lambda x: K.max(x, axis=-1), normal(4, 6), whole_call=True),
    C("min", lambda x: K.min(x, axis=1, keepdims=True), normal(4, 6), whole_call=True),
    C("mean", lambda x: K.mean(x, axis=-1), normal(4, 6), whole_call=True),
    C("any", lambda x: K.any(K.greater(x, 1.0), axis=-1), normal(4, 6), whole_call=True),
    C("all", lambda x: K.all(K.greater(x, -1.0), axis=-1), normal(4, 6), whole_call=True),
    # library ops
    C("dot", K.dot, normal(4, 6), normal(6, 5), whole_call=True),
    C("matmul", K.batch_dot, normal(3, 4, 6), normal(3, 6, 5)),
    C("transpose", lambda x: K.permute_dimensions(x, (1, 0, 2)) * 2.0, normal(3, 4, 5)),
    C("reshape", lambda x: K.reshape(x * 2.0, (6, 4)) + 1.0, normal(4, 6), whole_call=True),
    C("reshape_like", gradient(lambda x: K.reshape(x, (6, 4))), normal(4, 6), normal(6, 4)),
    C("expand_dims", gradient(lambda x: K.sum(x, axis=-1)), normal(2, 3, 6), normal(2, 3),
      unknown={0: (0, 1)}, scan=STATIC_IN_SCAN),
    C("sum_to", gradient(lambda x, b: x * b, wrt=1), normal(4, 6), normal(4, 6), normal(4, 6),
      unknown={1: (0,)}, scan=STATIC_IN_SCAN),
    C("axes_size", gradient(lambda x: K.mean(x, axis=0)), normal(4, 6), normal(6),
      unknown_batch=True),
    C("concatenate", lambda x, y: K.concatenate([x * 2.0, y], axis=-1), normal(4, 6), normal(4, 3),
      whole_call=True),
    C("slice_axis_like", gradient(lambda x, y: K.concatenate([x, y], axis=-1)), normal(4, 6),
      normal(4, 3), normal(4, 9)),
    C("split_part", gradient(lambda x, y: K.concatenate([x, y], axis=0)), normal(4, 6),
      normal(4, 6), normal(8, 6), unknown_batch=True, scan=STATIC_IN_SCAN),
    C("stack", lambda x, y: K.stack([x, y], axis=1), normal(4, 6), normal(4, 6)),
    C("take_index", gradient(lambda x, y: K.stack([x, y], axis=1)), normal(4, 6), normal(4, 6),
      normal(4, 2, 6)),
    C("getitem", lambda x: x[1:3, ::2] * 2.0, normal(4, 6)),
    C("scatter_like", gradient(lambda x: x[1:3, ::2]), normal(4, 6), normal(2, 3)),
    C("gather", lambda w, i: K.gather(w, i), normal(5, 4), integers(3, 2, high=5),
      scan="a gather's indices are the input that varies per sample"),
    C("scatter_add", gradient(lambda w, i: K.gather(w, i)), normal(5, 4), integers(3, 2, high=5),
      normal(3, 2, 4)),
    C("argmax", lambda x: K.argmax(x, axis=-1), normal(4, 6)),
    C("argmin", lambda x: K.argmin(x, axis=0), normal(4, 6)),
    C("cumsum", lambda x: K.cumsum(x, axis=1), normal(4, 6)),
    C("cumprod", lambda x: K.cumprod(x, axis=0), positive(4, 6)),
    C("reverse", lambda x: K.reverse(x, axes=1), normal(4, 6)),
    C("tile", lambda x: K.tile(x, (2, 3)), normal(4, 6)),
    C("untile", gradient(lambda x: K.tile(x, (2, 3))), normal(4, 6), normal(8, 18)),
    C("repeat_elements", lambda x: K.repeat_elements(x, 2, axis=1), normal(4, 6)),
    C("unrepeat", gradient(lambda x: K.repeat_elements(x, 2, axis=1)), normal(4, 6),
      normal(4, 12)),
    C("pad", lambda x: K.temporal_padding(x, (1, 2)), normal(2, 4, 3)),
    C("unpad", gradient(lambda x: K.temporal_padding(x, (1, 2))), normal(2, 4, 3),
      normal(2, 7, 3)),
    C("shape", lambda x: K.shape(x), normal(4, 6), unknown_batch=True,
      scan="its value is the input's shape, the same at every step"),
    C("reshape_dynamic", lambda x, y: K.reshape(x, K.shape(y)), normal(4, 6), normal(6, 4),
      unknown_batch=True),
    C("arange", lambda x: K.cast(K.arange(K.shape(x)[0]), K.dtype(x)) * 2.0 + x[:, 0],
      normal(4, 6), unknown_batch=True),
    C("random_normal", lambda x: x + K.random_normal((4, 6), seed=1), normal(4, 6),
      scan="a random draw differs at each step: the reference cannot replay it"),
    C("random_truncated_normal", lambda x: x + K.truncated_normal((4, 6), seed=2), normal(4, 6),
      scan="a random draw differs at each step: the reference cannot replay it"),
    C("random_uniform", lambda x: x + K.random_uniform((4, 6), seed=3), normal(4, 6),
      scan="a random draw differs at each step: the reference cannot replay it"),
    C("random_binomial", lambda x: x * K.random_binomial((4, 6), 0.5, seed=4), normal(4, 6),
      scan="a random draw differs at each step: the reference cannot replay it"),
    C("random_shaped", lambda x: x + K.random_uniform(K.shape(x), seed=5), normal(4, 6),
      unknown_batch=True,
      scan="a random draw differs at each step: the reference cannot replay it"),
    C("print_tensor", lambda x: K.print_tensor(x * 2.0, "path matrix:") + 1.0, normal(4, 6)),
    C("identity", lambda x: K.identity(x * 2.0) + 1.0, normal(4, 6), whole_call=True),
    C("stop_gradient", lambda x: K.stop_gradient(x * 2.0) + 1.0, normal(4, 6), whole_call=True),
    C("in_top_k", lambda p, t: K.in_top_k(p, t, 2), normal(4, 6), integers(4, high=6)),
    C("ctc_loss", lambda y, p, n, m: K.ctc_batch_cost(y, p, n, m), integers(2, 3, high=4),
      probabilities(2, 6, 5), fixed([[6], [5]]), fixed([[3], [2]]),
      scan="its first input is the labels"),
    C("ctc_loss_and_grad", lambda p, y, n, m: K.gradients(K.sum(K.ctc_batch_cost(y, p, n, m)), [p])[0],
      probabilities(2, 6, 5), integers(2, 3, high=4), fixed([[6], [5]]), fixed([[3], [2]])),
    C("ctc_decode", lambda p, n: K.ctc_decode(p, n, greedy=False, beam_width=4, top_paths=2)[1],
      probabilities(2, 6, 5), fixed([6, 5])),
    C("ctc_decoded_path", lambda p, n: K.ctc_decode(p, n)[0][0], probabilities(2, 6, 5),
      fixed([6, 5]), scan="its output's width depends on the data"),
    C("ctc_decoded_log_prob", lambda p, n: K.ctc_decode(p, n)[1], probabilities(2, 6, 5),
      fixed([6, 5])),
    C("ctc_dense_to_sparse", lambda y, m: list(K.ctc_label_dense_to_sparse(y, m)),
      integers(2, 3, high=4), fixed([3, 2]), floats=False,
      scan="its output's size depends on the data"),
    # (im2col here, which has no compiled form: test_conv2d_path_matches_numpy
    # drives each path of conv2d, the compiled ones included)
    C("conv", lambda x, w: K.conv2d(x, w), normal(2, 6, 6, 3), normal(3, 3, 3, 4)),
    C("conv", lambda x, w: K.conv1d(x, w, padding="causal", dilation_rate=2), normal(2, 7, 3),
      normal(2, 3, 4), name="conv-1d-causal"),
    C("conv", lambda x, w: K.conv3d(x, w, strides=(1, 2, 1), padding="same"), normal(1, 4, 5, 4, 2),
      normal(2, 3, 2, 2, 3), name="conv-3d"),
    C("conv_backward_input", gradient(lambda x, w: K.conv2d(x, w, strides=(2, 1), padding="same")),
      normal(2, 6, 6, 3), normal(3, 3, 3, 4), normal(2, 3, 6, 4)),
    C("conv_backward_kernel", gradient(lambda x, w: K.conv2d(x, w), wrt=1), normal(2, 6, 6, 3),
      normal(3, 3, 3, 4), normal(2, 4, 4, 4)),
    C("depthwise_conv", lambda x, w: K.depthwise_conv2d(x, w), normal(2, 6, 6, 3),
      normal(3, 3, 3, 2)),
    C("depthwise_conv_backward_input", gradient(lambda x, w: K.depthwise_conv2d(x, w)),
      normal(2, 6, 6, 3), normal(3, 3, 3, 2), normal(2, 4, 4, 6)),
    C("depthwise_conv_backward_kernel", gradient(lambda x, w: K.depthwise_conv2d(x, w), wrt=1),
      normal(2, 6, 6, 3), normal(3, 3, 3, 2), normal(2, 4, 4, 6)),
    C("pool", lambda x: K.pool2d(x, (2, 2), (2, 2), pool_mode="avg"), normal(2, 6, 6, 3)),
    C("pool", lambda x: K.pool2d(x, (3, 3), (2, 2), padding="same"), normal(2, 5, 5, 3),
      name="pool-max-same"),
    C("pool_backward", gradient(lambda x: K.pool2d(x, (2, 2), (2, 2))), normal(2, 6, 6, 3),
      normal(2, 3, 3, 3)),
    C("resize", lambda x: K.resize_images(x, 2, 3, "channels_last"), normal(2, 3, 4, 2)),
    C("resize_backward", gradient(lambda x: K.resize_images(x, 2, 3, "channels_last")),
      normal(2, 3, 4, 2), normal(2, 6, 12, 2)),
    C("local_conv", lambda x, w: K.local_conv1d(x, w, (2,), (1,)), normal(2, 5, 3),
      normal(4, 6, 2)),
    C("local_conv_backward_input", gradient(lambda x, w: K.local_conv1d(x, w, (2,), (1,))),
      normal(2, 5, 3), normal(4, 6, 2), normal(2, 4, 2)),
    C("local_conv_backward_kernel", gradient(lambda x, w: K.local_conv1d(x, w, (2,), (1,)), wrt=1),
      normal(2, 5, 3), normal(4, 6, 2), normal(2, 4, 2)),
    C("scan", lambda x, h: K.rnn(_tanh_step, x, [h])[1], normal(2, 3, 4), normal(2, 4)),
]

# Ops no case builds, and why.
NOT_BUILT = {
    "update": "replaced by its new value before planning (runtime.lift_updates): never a plan step",
    "tuple_item": "built with each multi-output op (ctc_loss_and_grad, ctc_decode)",
    "floor": "reached from K.* only through random integer draws",
}
for _name in ("sparse_to_dense", "sparse_gather", "sparse_dense_matmul", "sparse_sampled_products",
              "sparse_concat_indices", "sparse_concat_shape"):
    NOT_BUILT[_name] = ("a sparse input is fed as a scipy.sparse matrix through "
                        "sparse.SparseFunction, in three parts: see test_sparse.py")


# ---------------------------------------------------------------------------
# Running a case

def _targets(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _placeholders(case, arrays):
    return [K.placeholder(tuple(None if axis in case.unknown.get(i, ()) else d
                                for axis, d in enumerate(a.shape)), dtype=str(a.dtype))
            for i, a in enumerate(arrays)]


def numpy_values(outputs, feeds):
    """The outputs' values, node by node with each op's NumPy form;
    ``feeds``: {placeholder id: array}."""
    return evaluator.evaluate_graph(outputs, feeds)


def _random_states(outputs):
    """A function restoring the random generators of the graph to their state now."""
    states = [(n.attrs["rng"], copy.deepcopy(n.attrs["rng"].bit_generator.state))
              for n in toposort(outputs) if "rng" in n.attrs]

    def restore():
        for rng, state in states:
            rng.bit_generator.state = copy.deepcopy(state)
    return restore


def assert_close(got, want, tolerance, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    if tolerance == 0.0 or want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    assert np.isfinite(want).all(), f"{what}: the reference holds an inf or a NaN (a case's inputs to fix)"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * scale, err_msg=what)


def _call_counting_plan(fn):
    """[how many times the plan of ``fn`` (a function, or a plan) ran], counted from now."""
    plan = getattr(fn, "plan", fn)
    runs, run = [0], plan.run

    def counted(*arrays):
        runs[0] += 1
        return run(*arrays)
    plan.run = counted
    return runs


def _check_plan_or_call(case, dtype, mode):
    arrays = case.arrays(dtype)
    inputs = _placeholders(case, arrays)
    outputs = _targets(case.build(*inputs))
    assert case.op in {n.op for n in toposort(outputs)}, f"{case.name}: no {case.op} in the graph"
    restore = _random_states(outputs)
    after = 10**9 if mode == "plan" else 1
    with tuning.override(ONE_CALL_AFTER=after):
        fn = K.function(inputs, outputs)
        runs = _call_counting_plan(fn)
        got = fn(arrays)
    if mode == "whole call":
        assert sum(a.size for a in arrays) <= tuning.ONE_CALL_MAX_ELEMENTS
        if case.whole_call and blas.AVAILABLE:
            assert fn.whole_call and runs[0] == 0, f"{case.name}: the whole call did not run"
        else:
            assert not fn.whole_call and runs[0] == 1, f"{case.name}: expected the plan to run"
    else:
        assert runs[0] == 1
    restore()
    want = numpy_values(outputs, {p.id: a for p, a in zip(inputs, arrays)})
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, case.tolerance[dtype], f"{case.name} {mode} {dtype} output {i}")


def _scan_reference(case, dtype, sequence, initial, others):
    """The case's op in a Python loop over the steps with each op's NumPy form:
    (per-step outputs stacked, the last state)."""
    shape = initial.shape
    operand = K.placeholder(shape, dtype=dtype)
    other_ins = [K.placeholder(a.shape, dtype=str(a.dtype)) for a in others]
    outputs = _targets(case.build(operand, *other_ins))[:1]
    h, want = initial, []
    for t in range(STEPS):
        a = sequence[t] + h
        feeds = {operand.id: a, **{p.id: v for p, v in zip(other_ins, others)}}
        want.append(np.asarray(numpy_values(outputs, feeds)[0]).reshape(1, -1))
        h = a * np.asarray(0.5, dtype)
    return np.stack(want), h


def _check_scan(cases, dtype, loop_compiles):
    """Each case's op inside one scan's step (the op K.rnn builds), all the
    cases of a group in one step: a case's first input is its step's slice
    plus its carried state, which the step then halves (so that the op runs
    in the loop, not hoisted out of it).  One step for many ops: one loop to
    compile rather than one per op.  ``loop_compiles``: every op of the group
    has a compiled form, so that the steps after the first run in the
    compiled loop (checked), else all from Python."""
    rng = np.random.default_rng(1)
    sequences, initials, others = [], [], []
    for case in cases:
        arrays = case.arrays(dtype)
        # each step's slice drawn as the op's first input is: with the state,
        # which the step halves, the operand stays where the op is defined
        sequences.append(np.stack([case.inputs[0](rng, dtype) for _ in range(STEPS)]))
        initials.append(arrays[0])
        others.append(arrays[1:])
    seq_ins = [K.placeholder(q.shape, dtype=dtype) for q in sequences]
    state_ins = [K.placeholder(h.shape, dtype=dtype) for h in initials]
    other_ins = [[K.placeholder(a.shape, dtype=str(a.dtype)) for a in o] for o in others]

    def step(slices, states):
        outs, new_states = [], []
        for case, x_t, h, ins in zip(cases, slices, states, other_ins):
            a = x_t + h
            # (1, n): a scalar result would keep the loop from compiling
            outs.append(K.reshape(_targets(case.build(a, *ins))[0], (1, -1)))
            new_states.append(a * 0.5)
        return outs, new_states

    outputs, finals = scan(step, seq_ins, state_ins, keep_history=False, where="path matrix")
    (node,) = [n for n in toposort(finals) if n.op == "scan"]
    in_step = {n.op for n in toposort(node.attrs["body"].outputs)}
    missing = [case.name for case in cases if case.op not in in_step]
    assert not missing, f"not in the scan's step (hoisted out of it): {missing}"
    feeds = [p for group in other_ins for p in group]
    step_plan = BODIES.plan(node.attrs["body"])
    runs = _call_counting_plan(step_plan)  # the steps run from Python
    with tuning.override(ONE_CALL_AFTER=10**9):
        fn = K.function(seq_ins + state_ins + feeds, outputs + finals)
        got = fn(sequences + initials + [a for group in others for a in group])
    # the first step from Python (it checks the shapes), the others in the loop
    expected = 1 if loop_compiles and blas.AVAILABLE else STEPS
    assert runs[0] == expected, (f"{runs[0]} of {STEPS} steps ran from Python, expected {expected}: "
                                 + ", ".join(c.name for c in cases))
    failures = []
    for i, case in enumerate(cases):
        want_outputs, want_state = _scan_reference(case, dtype, sequences[i], initials[i], others[i])
        for what, g, w in (("outputs", got[i], want_outputs), ("state", got[len(cases) + i], want_state)):
            try:
                assert_close(g, w, case.tolerance[dtype], f"{case.name} scan {dtype} {what}")
            except AssertionError as error:
                failures.append(str(error))
    assert not failures, "\n".join(failures)


def _op_params():
    params = []
    for case in CASES:
        dtypes = ("float32", "float64") if case.floats else (None,)
        for dtype in dtypes:
            for mode in ("plan", "whole call"):
                params.append(pytest.param(case, dtype, mode,
                                           id=f"{case.name}-{mode.replace(' ', '_')}-{dtype or 'fixed'}"))
            if case.scan is not True:
                params.append(pytest.param(case, dtype, "scan", id=f"{case.name}-scan-{dtype or 'fixed'}",
                                           marks=pytest.mark.skip(reason=f"not in a scan: {case.scan}")))
    return params


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case, dtype, mode", _op_params())
def test_op_matches_numpy(case, dtype, mode):
    _check_plan_or_call(case, dtype, mode)


def _scan_groups():
    """The cases run inside a scan step, by dtype and by whether every op has
    a compiled form (the loop compiles) or not (steps run from Python).

    A case whose op has a compiled form runs in the compiled loop in one dtype,
    float32 and float64 taking turns down CASES: the loop costs seconds of
    compiling per op, and the op's kernel is checked in both dtypes as a plan
    and as a whole call.  Steps from Python run in both dtypes."""
    groups = {}
    turn = 0
    for case in CASES:
        if case.scan is not True:
            continue
        if not case.floats:
            dtypes = (None,)
        elif case.whole_call:
            dtypes = (("float32", "float64")[turn % 2],)
            turn += 1
        else:
            dtypes = ("float32", "float64")
        for dtype in dtypes:
            groups.setdefault((dtype, case.whole_call), []).append(case)
    params = []
    for (dtype, compiled), cases in sorted(groups.items(), key=str):
        for first in range(0, len(cases), SCAN_GROUP):
            part = cases[first:first + SCAN_GROUP]
            where = 'compiled_loop' if compiled else 'from_python'
            params.append(pytest.param(part, dtype, compiled,
                                       id=f"{dtype or 'fixed'}-{where}-{part[0].name}-{part[-1].name}"))
    return params


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("cases, dtype, loop_compiles", _scan_groups())
def test_ops_inside_a_scan_step_match_numpy(cases, dtype, loop_compiles):
    _check_scan(cases, dtype, loop_compiles)


def test_every_registered_op_is_in_the_matrix():
    """Every op in OPS is built by a case, or listed in NOT_BUILT with a reason."""
    built = set()
    for case in CASES:
        arrays = case.arrays("float64")
        built |= {n.op for n in toposort(_targets(case.build(*_placeholders(case, arrays))))}
    missing = sorted(set(OPS) - built - set(NOT_BUILT))
    assert not missing, f"ops no case builds: {missing}"
    assert not set(NOT_BUILT) & {c.op for c in CASES}


# ---------------------------------------------------------------------------
# conv2d's paths: each algorithm forced, with and without an epilogue (bias +
# relu) and a following 2x2 pooling, as a plan and as one compiled call.

# (path, input shape, kernel shape): shapes where the path can run
CONV_GEOMETRIES = {
    "pointwise": ((2, 6, 6, 8), (1, 1, 8, 8)),
    "direct": ((2, 6, 6, 4), (3, 3, 4, 8)),
    "winograd": ((2, 10, 10, 8), (3, 3, 8, 8)),
    "columns": ((2, 10, 10, 8), (3, 3, 8, 8)),
}
# (path, epilogue, pool) that the whole call compiles (lowering.Conv's
# compiled_lines, from jit_kernels.conv.compiled_path): the direct loop
# (no pooling) or Winograd over whole 4x4 blocks without padding (no pooling,
# or a max pooling before an epilogue); a bare conv's pooling is a step of its
# own, which has no compiled form.
COMPILED_CONVS = {("direct", False, None), ("winograd", False, None), ("direct", True, None),
                  ("winograd", True, None), ("winograd", True, "max")}
# The label of the conv's step in a plan: a bare conv's pooling is a step of
# its own; with an epilogue, a max pooling runs before it (the two commute:
# on a quarter of the values), an average pooling after it.
EPILOGUE_LABELS = {(False, None): "conv", (False, "max"): "conv", (False, "avg"): "conv",
                   (True, None): "conv+fused[", (True, "max"): "conv+pool+fused[",
                   (True, "avg"): "conv+fused["}
# Winograd F(4x4, 3x3) rounds float32 more than a direct sum (its transforms)
CONV_TOLERANCE = {("winograd", "float32"): 1e-4}


def _conv_params():
    params = []
    for path in CONV_GEOMETRIES:
        for epilogue in (False, True):
            for pool in (None, "max", "avg"):
                for mode in ("plan", "whole call"):
                    for dtype in ("float32", "float64"):
                        params.append(pytest.param(
                            path, epilogue, pool, mode, dtype,
                            id=f"{path}-{'bias_relu' if epilogue else 'bare'}-{pool or 'nopool'}"
                               f"-{mode.replace(' ', '_')}-{dtype}"))
    return params


def numpy_conv2d(x, w):
    """Cross-correlation of x (N, H, W, C) with w (KH, KW, C, OC), stride 1,
    'valid', by its definition: each output a sum over its window."""
    windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[:2], axis=(1, 2))
    return np.einsum("nhwcij,ijco->nhwo", windows, w)


@pytest.mark.parametrize("path, epilogue, pool, mode, dtype", _conv_params())
def test_conv2d_path_matches_numpy(path, epilogue, pool, mode, dtype):
    x_shape, w_shape = CONV_GEOMETRIES[path]
    rng = np.random.default_rng(2)
    xv = rng.standard_normal(x_shape).astype(dtype)
    wv = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[:-1]))).astype(dtype)
    bv = rng.standard_normal(w_shape[-1]).astype(dtype)
    x = K.placeholder(x_shape, dtype=dtype)
    w, b = K.variable(wv, dtype=dtype), K.variable(bv, dtype=dtype)
    y = K.conv2d(x, w)
    if epilogue:
        y = K.relu(K.bias_add(y, b))
    if pool is not None:
        y = K.pool2d(y, (2, 2), (2, 2), pool_mode=pool)
    with tuning.override(CONV_PATH=path, ONE_CALL_AFTER=10**9 if mode == "plan" else 1):
        assert conv.forward_path(x_shape, w_shape, np.dtype(dtype)).algorithm == path
        fn = K.function([x], [y])
        runs = _call_counting_plan(fn)
        (got,) = fn([xv])
    if mode == "plan":  # the conv's step runs the epilogue, and with it the pooling
        label = next(line for line in fn.explain().splitlines() if "conv" in line).split()[2]
        assert label.startswith(EPILOGUE_LABELS[epilogue, pool]), label
        assert label.endswith("+pool") == (epilogue and pool == "avg"), label
    if mode == "whole call":
        compiled = (path, epilogue, pool) in COMPILED_CONVS and blas.AVAILABLE
        assert bool(fn.whole_call) == compiled and runs[0] == (0 if compiled else 1), fn.explain()
    want = numpy_conv2d(xv.astype(np.float64), wv.astype(np.float64))
    if epilogue:
        want = np.maximum(want + bv, 0.0)
    if pool is not None:
        n, h, w_, c = want.shape
        windows = want[:, :h // 2 * 2, :w_ // 2 * 2].reshape(n, h // 2, 2, w_ // 2, 2, c)
        want = windows.max(axis=(2, 4)) if pool == "max" else windows.mean(axis=(2, 4))
    want = want.astype(dtype)
    tolerance = CONV_TOLERANCE.get((path, dtype), TOLERANCE[dtype])
    assert_close(got, want, tolerance, f"conv2d {path} epilogue={epilogue} pool={pool} {mode}")
