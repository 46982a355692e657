"""K.rnn, foldl, foldr and map_fn against explicit NumPy loops; gradients
against central finite differences."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K
from jit_kernels import blas
from numbackend import tuning
from numbackend.graph import toposort
from numbackend.ops.scan import scan
from numbackend.plan import BODIES
from tests.finite_differences import numeric_gradient
from tests.rnn_scripts import TANH_RNN
from tests.source_checks import compiled_calls, literal_calls, slice_assignments

RNG = np.random.default_rng(7)
B, T, I, U = 3, 5, 4, 6


def weights(dtype="float64"):
    r = np.random.default_rng(1)
    return (r.standard_normal((I, U)).astype(dtype) * 0.5,
            r.standard_normal((U, U)).astype(dtype) * 0.4,
            r.standard_normal(U).astype(dtype) * 0.1)


def numpy_rnn(x, w, u, b, h0, mask=None, backwards=False, const=0.0):
    """tanh RNN h_t = tanh(x_t w + h_{t-1} u + b + const); TF's masking rule: a
    masked step keeps the state and repeats the previous output, zeros before
    the first kept step."""
    h, out, outs = h0, np.zeros_like(h0), []
    steps = range(x.shape[1] - 1, -1, -1) if backwards else range(x.shape[1])
    for t in steps:
        new = np.tanh(x[:, t] @ w + h @ u + b + const)
        if mask is None:
            h = out = new
        else:
            kept = mask[:, t][:, None]
            h, out = np.where(kept, new, h), np.where(kept, new, out)
        outs.append(out)
    return h, np.stack(outs, axis=1)


def build_rnn(dtype="float64", **options):
    w, u, b = (K.variable(v, dtype=dtype) for v in weights(dtype))
    x = K.placeholder((None, T, I), dtype=dtype)
    h0 = K.placeholder((None, U), dtype=dtype)

    def step(x_t, states):
        extra = states[1] if len(states) > 1 else 0.0
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u) + b + extra)
        return h, [h]

    last, outputs, states = K.rnn(step, x, [h0], **options)
    return (w, u, b), x, h0, last, outputs, states


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_rnn_matches_a_numpy_loop(go_backwards, masked):
    mask_value = RNG.random((B, T)) > 0.3
    mask = K.constant(mask_value, dtype="bool") if masked else None
    (_w, _u, _b), x, h0, last, outputs, states = build_rnn(go_backwards=go_backwards, mask=mask)
    fn = K.function([x, h0], [last, outputs, states[0]])
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    got_last, got_outputs, got_state = fn([xv, hv])
    want_h, want_outputs = numpy_rnn(xv, *weights(), hv, mask_value if masked else None,
                                     go_backwards)
    assert got_outputs.shape == (B, T, U)
    np.testing.assert_allclose(got_outputs, want_outputs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_last, want_outputs[:, -1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_state, want_h, rtol=1e-10, atol=1e-12)


def test_rnn_constants_unroll_and_input_length():
    c = K.placeholder((None, U), dtype="float64")
    (_w, _u, _b), x, h0, _last, outputs, _states = build_rnn(constants=[c], unroll=True,
                                                       input_length=T)
    fn = K.function([x, h0, c], [outputs])
    xv, hv, cv = (RNG.standard_normal(s) for s in ((B, T, I), (B, U), (B, U)))
    _, want = numpy_rnn(xv, *weights(), hv, const=cv)
    np.testing.assert_allclose(fn([xv, hv, cv])[0], want, rtol=1e-10, atol=1e-12)


def test_inference_copies_no_state_history_that_nothing_reads():
    # a function of the outputs alone runs its scan without each step's states;
    # one that reads the final states (taken from the history) keeps them
    (_w, _u, _b), x, h0, last, outputs, states = build_rnn()
    rng = np.random.default_rng(11)  # leaves RNG's draws to the tests after this one
    xv, hv = rng.standard_normal((B, T, I)), rng.standard_normal((B, U))
    want_h, want_outputs = numpy_rnn(xv, *weights(), hv)

    def scan_of(fn):
        (scan,) = [n for n in toposort(fn.plan.targets) if n.op == "scan"]
        return scan

    lean = K.function([x, h0], [last, outputs])
    assert scan_of(lean).attrs["keep_history"] is False
    got_last, got_outputs = lean([xv, hv])
    np.testing.assert_allclose(got_outputs, want_outputs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_last, want_outputs[:, -1], rtol=1e-10, atol=1e-12)
    full = K.function([x, h0], [last, states[0]])
    assert scan_of(full).attrs["keep_history"] is True
    np.testing.assert_allclose(full([xv, hv])[1], want_h, rtol=1e-10, atol=1e-12)


def test_rnn_with_two_states_and_a_separate_output():
    x = K.placeholder((None, T, 2), dtype="float64")
    s0 = K.placeholder((None, 2), dtype="float64")

    def step(x_t, states):
        total, count = states
        return total * 2.0, [total + x_t, count + 1.0]

    last, outputs, (total, count) = K.rnn(step, x, [s0, s0])
    xv, sv = RNG.standard_normal((B, T, 2)), RNG.standard_normal((B, 2))
    got = K.function([x, s0], [last, outputs, total, count])([xv, sv])
    running = sv[:, None] + np.concatenate([np.zeros((B, 1, 2)), np.cumsum(xv, axis=1)[:, :-1]], axis=1)
    np.testing.assert_allclose(got[1], 2 * running)
    np.testing.assert_allclose(got[0], 2 * running[:, -1])
    np.testing.assert_allclose(got[2], sv + xv.sum(axis=1))
    np.testing.assert_allclose(got[3], sv + T)


def test_masked_steps_repeat_the_previous_output_when_it_is_not_a_state():
    # the output (a sum) has another shape than the state: the previous output is carried
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, I), dtype="float64")
    mask_value = np.array([[1, 0, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=bool)

    def step(x_t, states):
        h = states[0] + x_t
        return K.sum(h, axis=1, keepdims=True), [h]

    _, outputs, _ = K.rnn(step, x, [h0], mask=K.constant(mask_value, dtype="bool"))
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, I))
    (got,) = K.function([x, h0], [outputs])([xv, hv])
    h, out, want = hv, np.zeros((B, 1)), []
    for t in range(T):
        m = mask_value[:, t][:, None]
        h = np.where(m, h + xv[:, t], h)
        out = np.where(m, h.sum(axis=1, keepdims=True), out)
        want.append(out)
    np.testing.assert_allclose(got, np.stack(want, axis=1))


# each row a kind of mask, read forwards or backwards (go_backwards): the first
# steps masked, holes in the middle, every step masked, the last steps masked
TF_MASK = np.array([[0, 0, 1, 1, 1], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=bool)


def numpy_tf_rnn(step, x, states, mask, backwards):
    """TensorFlow's ``rnn`` with a mask, written out: each step's output is
    ``where(mask_t, output, previous output)``, the previous output starting at
    zeros, and each state ``where(mask_t, new state, state)``."""
    previous, outputs = None, []
    for t in (range(x.shape[1] - 1, -1, -1) if backwards else range(x.shape[1])):
        output, new_states = step(x[:, t], states)
        if previous is None:
            previous = np.zeros_like(output)
        kept = mask[:, t].reshape((-1,) + (1,) * (output.ndim - 1))
        output = np.where(kept, output, previous)
        states = [np.where(kept, new, old) for new, old in zip(new_states, states)]
        previous = output
        outputs.append(output)
    return outputs[-1], np.stack(outputs, axis=1), states


def _two_state_step(dot, tanh, w, u, b):
    """h_t = tanh(x_t w + h u + b), c_t = c + h_t; the output tanh(h_t + c_t) is no state."""
    def step(x_t, states):
        h, c = states
        h = tanh(dot(x_t, w) + dot(h, u) + b)
        c = c + h
        return tanh(h + c), [h, c]
    return step


def _build_two_state_rnn(go_backwards, unroll):
    w, u, b = (K.variable(v, dtype="float64") for v in weights())
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")
    c0 = K.placeholder((None, U), dtype="float64")
    # a mask of any batch, as Keras's layers compute it: the gradient's loop compiles
    mask = K.placeholder((None, T), dtype="bool")
    last, outputs, (h, c) = K.rnn(_two_state_step(K.dot, K.tanh, w, u, b), x, [h0, c0],
                                  go_backwards=go_backwards, unroll=unroll, input_length=T,
                                  mask=mask)
    return (w, u, b, x, h0, c0, mask), (last, outputs, h, c)


def _two_state_values():
    """x, h0 and c0 for TF_MASK's rows."""
    rng = np.random.default_rng(5)
    return [rng.standard_normal((len(TF_MASK), T, I)), rng.standard_normal((len(TF_MASK), U)),
            rng.standard_normal((len(TF_MASK), U))]


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_masked_rnn_follows_tensorflows_rule(go_backwards, unroll):
    # nonzero initial states: zeros, not the first state, before the first kept step
    (_w, _u, _b, x, h0, c0, mask), results = _build_two_state_rnn(go_backwards, unroll)
    xv, hv, cv = _two_state_values()
    got = K.function([x, h0, c0, mask], list(results))([xv, hv, cv, TF_MASK])
    step = _two_state_step(np.dot, np.tanh, *weights())
    want_last, want_outputs, (want_h, want_c) = numpy_tf_rnn(step, xv, [hv, cv], TF_MASK,
                                                              go_backwards)
    for g, w in zip(got, [want_last, want_outputs, want_h, want_c]):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(got[1][2], 0.0)  # the row whose steps are all masked
    np.testing.assert_array_equal(got[2][2], hv[2])


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_masked_keras_style_rnn_outputs_zeros_before_its_first_kept_step(go_backwards, unroll):
    # the output is the first state (Keras's cells): its initial value is no output
    (_w, _u, _b), x, h0, last, outputs, states = build_rnn(
        go_backwards=go_backwards, unroll=unroll, mask=K.constant(TF_MASK, dtype="bool"))
    xv, hv = _two_state_values()[:2]
    got = K.function([x, h0], [last, outputs, states[0]])([xv, hv])
    w_v, u_v, b_v = weights()

    def step(x_t, states):
        h = np.tanh(x_t @ w_v + states[0] @ u_v + b_v)
        return h, [h]
    want_last, want_outputs, (want_h,) = numpy_tf_rnn(step, xv, [hv], TF_MASK, go_backwards)
    for g, w in zip(got, [want_last, want_outputs, want_h]):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("go_backwards", [False, True])
def test_masked_rnn_gradients_match_finite_differences(go_backwards):
    # a masked step passes the gradient on to the previous output and states
    (w, u, b, x, h0, c0, mask), (last, outputs, h, c) = _build_two_state_rnn(go_backwards, False)
    rng = np.random.default_rng(6)
    target, h_target = rng.standard_normal((len(TF_MASK), T, U)), rng.standard_normal(U)
    loss = K.sum(outputs * target) + K.sum(K.square(last)) + K.sum(h * h_target) + K.sum(c)
    variables = [w, u, b, x, h0, c0]
    fn = K.function([x, h0, c0, mask], K.gradients(loss, variables))
    values = list(weights()) + _two_state_values()
    got = fn(values[3:] + [TF_MASK])

    def numpy_loss(w_, u_, b_, x_, h_, c_):
        step = _two_state_step(np.dot, np.tanh, w_, u_, b_)
        last_, outputs_, (h_, c_) = numpy_tf_rnn(step, x_, [h_, c_], TF_MASK, go_backwards)
        return (outputs_ * target).sum() + (last_ ** 2).sum() + (h_ * h_target).sum() + c_.sum()

    for k, value in enumerate(values):
        def f(v, k=k):
            args = list(values)
            args[k] = v
            return numpy_loss(*args)
        np.testing.assert_allclose(got[k], numeric_gradient(f, value), rtol=1e-5, atol=1e-7,
                                   err_msg=f"d loss / d {['w', 'u', 'b', 'x', 'h0', 'c0'][k]}")


def test_a_masked_rnn_runs_no_step_outside_its_loop():
    # the zeros that the output starts from are the state's where they have its
    # shape: no step is computed before the loop for the output's shape alone
    mask = K.placeholder((None, T), dtype="bool")
    _, x, h0, _last, outputs, _ = build_rnn(mask=mask)
    fn = K.function([x, h0, mask], [outputs])
    outer_dots = [n for n in toposort(fn.plan.targets) if n.op == "dot"]
    assert all(n.shape == (T, None, U) for n in outer_dots)  # at most the input projection
    xv, hv = _two_state_values()[:2]
    want = numpy_rnn(xv, *weights(), hv, TF_MASK)[1]
    np.testing.assert_allclose(fn([xv, hv, TF_MASK])[0], want, rtol=1e-10, atol=1e-12)


def test_a_masked_rnn_gives_the_same_bits_in_its_compiled_loop_and_from_python(monkeypatch):
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from numbackend import plan as plan_module
    (w, u, b, x, h0, c0, mask), (last, outputs, h, c) = _build_two_state_rnn(True, False)
    loss = K.sum(outputs * outputs) + K.sum(K.square(last)) + K.sum(h * c)
    fn = K.function([x, h0, c0, mask],
                    [last, outputs, h, c] + K.gradients(loss, [w, u, b, x, h0, c0]))
    values = _two_state_values() + [TF_MASK]
    counts = _count_step_runs(fn)
    compiled = [np.array(v, copy=True) for v in fn(values)]
    assert counts == {"rnn": 1, "rnn gradient": 1}
    monkeypatch.setattr(plan_module.Bodies, "loop", lambda self, body, n_stacked: None)
    counts = _count_step_runs(fn)
    from_python = fn(values)
    assert counts == {"rnn": T, "rnn gradient": T}
    for a, p in zip(compiled, from_python):
        np.testing.assert_array_equal(a, p)
    step = _two_state_step(np.dot, np.tanh, *weights())
    np.testing.assert_allclose(compiled[1], numpy_tf_rnn(step, values[0], values[1:3], TF_MASK,
                                                         True)[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("compiled_loops", [True, False])
def test_the_input_projection_stays_in_the_loop_and_tracing_loads_no_numba(monkeypatch, compiled_loops):
    # x @ w stays in the step (the compiled loop packs its weights once); the
    # choice is made when the scan is traced, from the graph alone, so the same
    # whether loops compile or not (then every step runs from Python); the same
    # numbers either way
    monkeypatch.setattr(blas, "AVAILABLE", blas.AVAILABLE and compiled_loops)
    _, x, h0, last, _, _ = build_rnn()
    fn = K.function([x, h0], [last])
    (scan,) = [n for n in toposort(fn.plan.targets) if n.op == "scan"]
    body_dots = [n for n in toposort(scan.attrs["body"].outputs + scan.attrs["body"].new_states)
                 if n.op == "dot"]
    outer_dots = [n for n in toposort(fn.plan.targets) if n.op == "dot"]
    assert len(body_dots) == 2 and not any(n.shape == (T, None, U) for n in outer_dots)
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    w_v, u_v, b_v = weights()
    np.testing.assert_allclose(fn([xv, hv])[0], numpy_rnn(xv, w_v, u_v, b_v, hv)[0], rtol=1e-12)


def test_building_an_rnn_graph_loads_no_numba():
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import numbackend as K
        x, h0 = K.placeholder((None, 5, 3)), K.placeholder((None, 4))
        w, u = K.variable(np.ones((3, 4))), K.variable(np.ones((4, 4)))

        def step(xt, states):
            h = K.tanh(K.dot(xt, w) + K.dot(states[0], u))
            return h, [h]
        last, outputs, states = K.rnn(step, x, [h0])
        K.gradients(K.sum(last), [w, u])
        print("numba" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


@pytest.mark.parametrize("options", [{}, {"go_backwards": True}, {"masked": True}])
def test_rnn_gradients_match_finite_differences(options):
    masked = options.pop("masked", False)
    mask_value = np.array([[1, 1, 0, 1, 0], [1, 0, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=bool)
    mask = K.constant(mask_value, dtype="bool") if masked else None
    (w, u, b), x, h0, last, outputs, _states = build_rnn(mask=mask, **options)
    target = RNG.standard_normal((B, T, U))
    loss = K.sum(outputs * target) + K.sum(K.square(last))
    grads = K.gradients(loss, [w, u, b, x, h0])
    fn = K.function([x, h0], grads)
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    got = fn([xv, hv])
    w_v, u_v, b_v = weights()
    back = options.get("go_backwards", False)

    def numpy_loss(w_, u_, b_, x_, h_):
        _, outs = numpy_rnn(x_, w_, u_, b_, h_, mask_value if masked else None, back)
        return (outs * target).sum() + (outs[:, -1] ** 2).sum()

    values = [w_v, u_v, b_v, xv, hv]
    for k, value in enumerate(values):
        def f(v, k=k):
            args = list(values)
            args[k] = v
            return numpy_loss(*args)
        np.testing.assert_allclose(got[k], numeric_gradient(f, value), rtol=1e-5, atol=1e-7)


def test_gradient_of_an_invariant_computed_from_another():
    # u2 = 2 * u is computed outside the loop; u's gradient must count each path once
    x = K.placeholder((None, T, I), dtype="float64")
    w_v, u_v, _ = weights()
    # float64 variables, as the reference computes (floatx's float32 rounded them)
    u = K.variable(u_v, dtype="float64")
    w = K.variable(w_v, dtype="float64")

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u) + K.dot(states[0], 2.0 * u))
        return h, [h]

    h0 = K.zeros_like(K.dot(x[:, 0], w))
    last, _, _ = K.rnn(step, x, [h0])
    xv = RNG.standard_normal((B, T, I))
    (g,) = K.function([x], K.gradients(K.sum(last), [u]))([xv])

    def f(u_):
        h = np.zeros((B, U))
        for t in range(T):
            h = np.tanh(xv[:, t] @ w_v + h @ u_ + h @ (2 * u_))
        return h.sum()

    np.testing.assert_allclose(g, numeric_gradient(f, u_v), rtol=1e-5, atol=1e-7)


def test_rnn_trains_a_float32_model():
    (w, u, b), x, h0, last, _, _ = build_rnn(dtype="float32")
    target = K.placeholder((None, U))
    loss = K.mean(K.square(last - target))
    lr = 0.2
    updates = [(p, p - lr * g) for p, g in zip((w, u, b), K.gradients(loss, [w, u, b]))]
    train = K.function([x, h0, target], [loss], updates=updates)
    xv = RNG.standard_normal((B, T, I)).astype("float32")
    hv = np.zeros((B, U), "float32")
    tv = (RNG.random((B, U)) - 0.5).astype("float32")
    losses = [float(train([xv, hv, tv])[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_rnn_rejects_bad_input():
    x2 = K.placeholder((None, I))
    with pytest.raises(ValueError, match="rnn: inputs must have rank >= 3"):
        K.rnn(lambda x_t, s: (x_t, s), x2, [])
    x = K.placeholder((None, T, I))
    h0 = K.placeholder((None, U))
    with pytest.raises(ValueError, match="returned state 0 of shape"):
        K.rnn(lambda x_t, s: (x_t, [x_t]), x, [h0])
    with pytest.raises(TypeError, match="state 0 of dtype float64"):
        K.rnn(lambda x_t, s: (x_t, [K.cast(s[0], "float64")]), x, [h0])
    with pytest.raises(ValueError, match="mask of shape"):
        K.rnn(lambda x_t, s: (s[0], s), x, [h0], mask=K.ones((2, T + 1), dtype="bool"))
    with pytest.raises(ValueError, match="returned 0 state"):
        K.rnn(lambda x_t, s: (s[0], []), x, [h0])


def test_rnn_rejects_an_empty_sequence_at_run_time():
    x = K.placeholder((None, None, I))
    h0 = K.placeholder((None, I))
    last, _, _ = K.rnn(lambda x_t, s: (x_t + s[0], [x_t + s[0]]), x, [h0])
    fn = K.function([x, h0], [last])
    with pytest.raises(ValueError, match="rnn: the sequences are empty"):
        fn([np.zeros((2, 0, I), "float32"), np.zeros((2, I), "float32")])


@pytest.mark.parametrize("with_initializer", [False, True])
def test_folds_match_python_reductions(with_initializer):
    values = RNG.standard_normal((6, 3))
    elems = K.constant(values, dtype="float64")
    init = K.constant(np.ones(3), dtype="float64") if with_initializer else None

    def fn(acc, x):
        return acc * 0.5 + x * x

    left = K.eval(K.foldl(fn, elems, initializer=init))
    right = K.eval(K.foldr(fn, elems, initializer=init))
    rows = list(values)
    acc_l = np.ones(3) if with_initializer else rows[0]
    for row in (rows if with_initializer else rows[1:]):
        acc_l = acc_l * 0.5 + row * row
    acc_r = np.ones(3) if with_initializer else rows[-1]
    for row in (rows[::-1] if with_initializer else rows[-2::-1]):
        acc_r = acc_r * 0.5 + row * row
    np.testing.assert_allclose(left, acc_l)
    np.testing.assert_allclose(right, acc_r)


def test_foldl_gradient_matches_finite_differences():
    x = K.placeholder((5,), dtype="float64")
    prod = K.foldl(lambda acc, v: acc * K.sin(v), x, initializer=K.constant(1.0, "float64"))
    (g,) = K.function([x], K.gradients(prod, [x]))([xv := RNG.standard_normal(5)])
    np.testing.assert_allclose(g, numeric_gradient(lambda v: np.prod(np.sin(v)), xv), rtol=1e-6)


def test_map_fn_matches_a_loop_and_takes_a_dtype():
    values = RNG.standard_normal((4, 3, 2))
    elems = K.constant(values, dtype="float64")
    got = K.eval(K.map_fn(lambda m: K.dot(K.transpose(m), m), elems))
    np.testing.assert_allclose(got, np.stack([m.T @ m for m in values]))
    counts = K.eval(K.map_fn(lambda m: K.sum(K.cast(m > 0, "int32")), elems, dtype="int32"))
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts, (values > 0).sum(axis=(1, 2)))
    doubled = K.eval(K.map_fn(lambda m: m * 2.0, elems))  # all hoisted: no loop at all
    np.testing.assert_allclose(doubled, values * 2)


def test_map_fn_gradient():
    x = K.placeholder((4, 3), dtype="float64")
    y = K.map_fn(lambda row: K.sum(K.exp(row)) * row, x)
    (g,) = K.function([x], K.gradients(K.sum(y * y), [x]))([xv := RNG.standard_normal((4, 3))])

    def f(v):
        return sum(((np.exp(r).sum() * r) ** 2).sum() for r in v)

    np.testing.assert_allclose(g, numeric_gradient(f, xv), rtol=1e-6)


def test_map_fn_rejects_outputs_that_change_shape():
    # each row keeps its positive entries: the shapes differ from step to step
    x = K.placeholder((3, 4), dtype="float64")
    fn = K.function([x], [K.map_fn(lambda row: K.gather(row, K.cast(K.arange(0, K.sum(
        K.cast(row > 0, "int32"))), "int32")), x)])
    with pytest.raises(ValueError, match="map_fn: step 1 gave an output of shape"):
        fn([np.array([[1.0, 2, 3, -1], [1, -1, -1, -1], [1, 1, 1, 1]])])


@pytest.mark.parametrize("compiled_loops", [True, False])
def test_a_keras_style_lstm_step_is_one_product_and_one_kernel(monkeypatch, compiled_loops):
    # per-gate slices of the kernels (Keras's implementation 1): the input products
    # merge into one product per step, the recurrent ones into one per step, and
    # the gates read slices of those in place in a single fused kernel
    monkeypatch.setattr(blas, "AVAILABLE", blas.AVAILABLE and compiled_loops)
    units = 4
    rng = np.random.default_rng(2)
    kernel = rng.standard_normal((I, 4 * units))
    recurrent = rng.standard_normal((units, 4 * units)) * 0.3
    bias = rng.standard_normal(4 * units)
    w, u, b = (K.variable(v, dtype="float64") for v in (kernel, recurrent, bias))
    gates = [slice(k * units, (k + 1) * units) for k in range(4)]

    def step(x_t, states):
        h, c = states
        z = [K.bias_add(K.dot(x_t, w[:, g]), b[g]) + K.dot(h, u[:, g]) for g in gates]
        c = K.hard_sigmoid(z[1]) * c + K.hard_sigmoid(z[0]) * K.tanh(z[2])
        h = K.hard_sigmoid(z[3]) * K.tanh(c)
        return h, [h, c]

    x = K.placeholder((None, T, I), dtype="float64")
    zeros = K.zeros_like(K.dot(x[:, 0], w[:, gates[0]]))
    last, _, _ = K.rnn(step, x, [zeros, zeros])
    fn = K.function([x], [last])
    (scan,) = [n for n in toposort(fn.plan.targets) if n.op == "scan"]
    body_plan = BODIES.plan(scan.attrs["body"])
    steps = [s.kind if s.kind == "kernel" else s.label for s in body_plan.steps]
    hoisted = [n.shape for n in toposort(fn.plan.targets) if n.op == "dot" and n.ndim == 3]
    # (the same where loops do not compile: the scan is traced from the graph alone)
    assert steps == ["dot", "dot", "kernel"] and hoisted == []

    xv = RNG.standard_normal((B, T, I))

    def numpy_lstm(kernel, recurrent, bias):
        h = c = np.zeros((B, units))
        for t in range(T):
            z = xv[:, t] @ kernel + bias + h @ recurrent
            hs = [np.clip(0.2 * z[:, g] + 0.5, 0, 1) for g in gates]
            c = hs[1] * c + hs[0] * np.tanh(z[:, gates[2]])
            h = hs[3] * np.tanh(c)
        return h

    np.testing.assert_allclose(fn([xv])[0], numpy_lstm(kernel, recurrent, bias),
                               rtol=1e-10, atol=1e-12)

    # back-propagation through time: the step's gradient is one product back per
    # step; the weight and bias gradients are products and sums over all steps
    grads = K.gradients(K.sum(last * last), [w, u, b])
    grad_fn = K.function([x], grads)
    (back,) = [n for n in toposort(grad_fn.plan.targets)
               if n.op == "scan" and n.attrs["body"].where == "rnn gradient"]
    # (the forward products it recomputes from the sequences and the states'
    # history run in the loop too: x_t @ w and h_t-1 @ u)
    assert [s.label for s in BODIES.plan(back.attrs["body"]).steps].count("dot") == 3
    got = grad_fn([xv])
    for k, value in enumerate((kernel, recurrent, bias)):
        def loss(v, k=k):
            args = [kernel, recurrent, bias]
            args[k] = v
            return (numpy_lstm(*args) ** 2).sum()
        np.testing.assert_allclose(got[k], numeric_gradient(loss, value), rtol=1e-5, atol=1e-7)


def _count_step_runs(fn):
    """{scan body's where: how many times its plan ran from Python}, counted from now."""
    counts = {}
    for node in toposort(fn.plan.targets):
        if node.op != "scan":
            continue
        body = node.attrs["body"]
        plan = BODIES.plan(body)
        run = plan.run
        counts.setdefault(body.where, 0)

        def counted(*arrays, run=run, where=body.where):
            counts[where] += 1
            return run(*arrays)
        plan.run = counted
    return counts


def test_steps_after_the_first_run_in_one_compiled_loop():
    # the first step runs the body's plan from Python (it checks the shapes); the
    # other T - 1 run inside one compiled loop, forward and back-propagating
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    (w, u, b), x, h0, last, outputs, _ = build_rnn(go_backwards=True)
    grads = K.gradients(K.sum(outputs * outputs), [w, u, b, h0])
    fn = K.function([x, h0], [last, outputs] + grads)
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    counts = _count_step_runs(fn)
    got = fn([xv, hv])
    assert counts == {"rnn": 1, "rnn gradient": 1}
    _, want_outputs = numpy_rnn(xv, *weights(), hv, backwards=True)
    np.testing.assert_allclose(got[1], want_outputs, rtol=1e-10, atol=1e-12)

    def loss(w_, u_, b_, h_):
        return (numpy_rnn(xv, w_, u_, b_, h_, backwards=True)[1] ** 2).sum()
    values = list(weights()) + [hv]
    for k in range(4):
        def loss_k(v, k=k):
            args = list(values)
            args[k] = v
            return loss(*args)
        np.testing.assert_allclose(got[2 + k], numeric_gradient(loss_k, values[k]),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("form", ["generated", "blocks"])
def test_a_loop_that_does_not_compile_runs_from_python(monkeypatch, form):
    from numba.core.errors import TypingError

    from numbackend import lowering, scan_blocks
    monkeypatch.setattr(tuning, "SCAN_LOOP_FORM", form)
    for name in ("PRODUCT", "STEP_PRODUCT", "STEPS_PRODUCT"):
        monkeypatch.setattr(lowering, name, "np.float64")  # no such signature

    def fails(self):
        raise TypingError("no block")
    monkeypatch.setattr(scan_blocks.StepBlocks, "compile", fails)
    (_w, _u, _b), x, h0, _last, outputs, _ = build_rnn()
    fn = K.function([x, h0], [outputs])
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    counts = _count_step_runs(fn)
    with pytest.warns(UserWarning, match="rnn: the loop over time did not compile"):
        got = fn([xv, hv])[0]
    assert counts == {"rnn": T}
    np.testing.assert_allclose(got, numpy_rnn(xv, *weights(), hv)[1], rtol=1e-10, atol=1e-12)


def test_a_scan_stacks_each_value_once():
    # a step returning one value twice and its own slice: the loop stacks the value once
    # and the slice not at all (the whole output is the sequence)
    x = K.placeholder((T, None, 3), dtype="float64")
    s0 = K.placeholder((None, 3), dtype="float64")

    def step(xs, ss):
        h = K.tanh(ss[0] + xs[0])
        return [h, xs[0], h], [h * 0.5]

    stacked, (final,) = scan(step, [x], [s0], keep_history=False, where="test")
    (node,) = {n for n in toposort(stacked + [final]) if n.op == "scan"}
    assert len(node.attrs["body"].outputs) == 1
    fn = K.function([x, s0], stacked + [final])
    xv, s0v = RNG.standard_normal((T, 4, 3)), RNG.standard_normal((4, 3))
    counts = _count_step_runs(fn)
    got = fn([xv, s0v])
    assert counts == {"test": 1}  # the first step in the plan, the others in the loop
    s, want = s0v, []
    for t in range(T):
        want.append(np.tanh(s + xv[t]))
        s = want[-1] * 0.5
    for g, w in zip(got, [np.stack(want), xv, np.stack(want), s]):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


def test_steps_whose_shapes_broadcast_unlike_the_kernels_run_from_python():
    # x_t has one row at run time, the invariant four: the fused kernel, compiled for
    # rows that match, refuses them, in the loop as in the first step
    x = K.placeholder((T, None, 3), dtype="float64")
    scale = K.placeholder((None, 3), dtype="float64")
    s0 = K.placeholder((None, 3), dtype="float64")
    stacked, (final,) = scan(lambda xs, ss: ([ss[0]], [ss[0] * 0.5 + xs[0] * scale]), [x], [s0],
                             keep_history=False, where="test")
    fn = K.function([x, scale, s0], [stacked[0], final])
    xv, sv, s0v = (RNG.standard_normal(s) for s in ((T, 1, 3), (4, 3), (4, 3)))
    counts = _count_step_runs(fn)
    got_stacked, got_final = fn([xv, sv, s0v])
    assert counts == {"test": T}
    s, want = s0v, []
    for t in range(T):
        want.append(s)
        s = s * 0.5 + xv[t] * sv
    np.testing.assert_allclose(got_stacked, np.stack(want), rtol=1e-12)
    np.testing.assert_allclose(got_final, s, rtol=1e-12)


_LOOP_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import numbackend as K
    from numbackend import codegen
""") + TANH_RNN + textwrap.dedent("""
    last, outputs, states = K.rnn(step, x, [h0])
    wanted = [last] if sys.argv[1] == "last" else [outputs, states[0]]
    xv, hv = np.linspace(-1, 1, 24).reshape(2, 4, 3), np.ones((2, 3))
    got = K.function([x, h0], wanted)([xv, hv])
    h, want = hv, []
    for t in range(4):
        h = np.tanh(h @ w_value + xv[:, t])
        want.append(h)
    ok = np.allclose(got[0], want[-1] if sys.argv[1] == "last" else np.stack(want, axis=1))
    print(codegen.numba_stats()["compiled"], ok)
""")


@pytest.mark.parametrize("form", ["generated", "blocks"])
def test_a_cached_loop_over_cached_kernels_loads_in_a_new_process(tmp_path, form):
    # the second process compiles a loop (or its kernels' blocks) calling a kernel
    # it loaded from the cache; the third loads that loop (Numba crashed here when
    # the kernel called its parallel loop) and compiles nothing
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=str(tmp_path), NUMBACKEND_TUNE_SCAN_LOOP_FORM=form)
    runs = []
    for wanted in ("last", "all", "all"):
        out = subprocess.run([sys.executable, "-c", _LOOP_SCRIPT, wanted], env=env,
                             capture_output=True, text=True, check=True)
        runs.append(out.stdout.split())
    assert [ok for _, ok in runs] == ["True"] * 3
    assert int(runs[0][0]) > 0 and runs[2][0] == "0"
    # a generated loop stacks what its function returns; blocks are the kernels'
    assert (int(runs[1][0]) > 0) == (form == "generated")


def test_a_gated_step_on_slices_of_one_product_back_propagates_in_a_compiled_loop():
    # Keras's implementation 2: the gates slice one product; the gradient of the
    # slices is a concatenation, which the compiled loop runs too
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    rng = np.random.default_rng(5)
    w_value, u_value = rng.standard_normal((I, 2 * U)) * 0.5, rng.standard_normal((U, 2 * U)) * 0.4
    w, u = K.variable(w_value, dtype="float64"), K.variable(u_value, dtype="float64")
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")

    def step(x_t, states):
        z = K.dot(x_t, w) + K.dot(states[0], u)
        h = K.sigmoid(z[:, :U]) * K.tanh(z[:, U:])
        return h, [h]

    last, _, _ = K.rnn(step, x, [h0])
    fn = K.function([x, h0], K.gradients(K.sum(last * last), [w, u]))
    xv, hv = rng.standard_normal((B, T, I)), rng.standard_normal((B, U))
    counts = _count_step_runs(fn)
    got = fn([xv, hv])
    assert counts == {"rnn": 1, "rnn gradient": 1}

    def loss(w_, u_):
        h = hv
        for t in range(T):
            z = xv[:, t] @ w_ + h @ u_
            h = 1 / (1 + np.exp(-z[:, :U])) * np.tanh(z[:, U:])
        return (h * h).sum()
    np.testing.assert_allclose(got[0], numeric_gradient(lambda v: loss(v, u_value), w_value),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], numeric_gradient(lambda v: loss(w_value, v), u_value),
                               rtol=1e-5, atol=1e-7)


@pytest.fixture
def split_runs(monkeypatch, tuned):
    """Every compiled loop over two rows or more splits them between BLAS's threads
    (rather than the threads sharing each step); the list of the part counts of
    each split run."""
    if not blas.AVAILABLE or blas.threads() < 2:
        pytest.skip("the rows are split between OpenBLAS's threads, and it has one here")
    tuned(SCAN_SPLIT_MIN_ROWS_PER_THREAD=1, SCAN_SPLIT_MIN_ELEMENTS=0,
          SCAN_SHARE_MIN_WORK=1 << 62)
    from jit_kernels import parts
    runs, run_parts = [], parts.run_parts

    def counted(count, part):
        runs.append(count)
        return run_parts(count, part)
    monkeypatch.setattr(parts, "run_parts", counted)
    return runs


@pytest.fixture
def packed_ways(monkeypatch):
    """The list, call by call, of whether each compiled loop over time ran its
    products packed (the loop's 7th argument), for the loops loaded from here on
    (generated, or run as blocks)."""
    from numbackend import codegen, scan_blocks
    ways, load_kernel, prepare = [], codegen.load_kernel, scan_blocks.StepBlocks.prepare
    monkeypatch.setattr(scan_blocks.StepBlocks, "prepare",
                        lambda self, *a, **kw: ways.append(a[6]) or prepare(self, *a, **kw))

    def load_spied(source):
        module = load_kernel(source)
        loop = getattr(module, "loop", None)
        if loop is not None and not hasattr(loop, "spied"):
            spied = lambda *a: ways.append(a[6]) or loop(*a)
            spied.spied = True
            spied.compile = loop.compile  # the loop compiles before its first run
            monkeypatch.setattr(module, "loop", spied)
        return module
    monkeypatch.setattr(codegen, "load_kernel", load_spied)
    return ways


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("packed_min_rows, packed", [(10**9, False), (1, True)])
@pytest.mark.parametrize("in_loop_min_rows", [0, 10**9])
def test_a_loop_runs_its_products_packed_by_the_rows(packed_ways, tuned, request, split,
                                                     go_backwards, packed_min_rows, packed,
                                                     in_loop_min_rows):
    # a loop runs its products by invariants packed from SCAN_PACKED_MIN_ROWS
    # rows, through BLAS below, on every call alike; its products of the sequence
    # slices (x_t @ w) run per step, or for each call's steps at once before its
    # loop (always, unless split, by SCAN_IN_LOOP_MIN_ROWS); the same numbers
    # every way, forward and back-propagating
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    runs = request.getfixturevalue("split_runs") if split else []
    tuned(SCAN_PACKED_MIN_ROWS=packed_min_rows, SCAN_IN_LOOP_MIN_ROWS=in_loop_min_rows)
    steps = 9
    w_v, u_v, b_v = weights()
    w, u, b = (K.variable(v, dtype="float64") for v in (w_v, u_v, b_v))
    x = K.placeholder((None, steps, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u) + b)
        return h, [h]
    _, outputs, _ = K.rnn(step, x, [h0], go_backwards=go_backwards)
    fn = K.function([x, h0], [outputs] + K.gradients(K.sum(outputs * outputs), [u]))
    xv, hv = RNG.standard_normal((4, steps, I)), RNG.standard_normal((4, U))
    for _ in range(2):
        got = fn([xv, hv])
        np.testing.assert_allclose(got[0], numpy_rnn(xv, w_v, u_v, b_v, hv, backwards=go_backwards)[1],
                                   rtol=1e-10, atol=1e-12)
        loss = lambda u_: (numpy_rnn(xv, w_v, u_, b_v, hv, backwards=go_backwards)[1] ** 2).sum()
        np.testing.assert_allclose(got[1], numeric_gradient(loss, u_v), rtol=1e-5, atol=1e-7)
    parts = 2 if split else 1
    # forward and back, on each call, in each part
    assert packed_ways == [packed] * (4 * parts) and bool(runs) == split


@pytest.mark.parametrize("split", [False, True])
def test_a_loop_runs_more_rows_than_a_block_packed_where_alone(packed_ways, request, split):
    # up to a block of rows a part (jit_kernels.packed.block_rows), a loop's
    # products by invariants run packed; beyond, only where the parts take all
    # of BLAS's threads (jit_kernels.packed.runs_packed), else through BLAS
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from jit_kernels import packed as packed_products
    runs = request.getfixturevalue("split_runs") if split else []
    _, x, h0, _, outputs, _ = build_rnn()
    fn = K.function([x, h0], [outputs])
    parts = blas.threads() if split else 1
    alone = parts >= max(1, blas.threads())
    block = packed_products.block_rows(packed_products.chunk_depth(8), 8)
    for per_part, packed in [(block, True), (block + 1, alone)]:
        packed_ways.clear()
        xv, hv = RNG.standard_normal((per_part * parts, T, I)), RNG.standard_normal((per_part * parts, U))
        np.testing.assert_allclose(fn([xv, hv])[0], numpy_rnn(xv, *weights(), hv)[1],
                                   rtol=1e-10, atol=1e-12)
        assert packed_ways == [packed] * parts
    assert bool(runs) == split


def test_a_loop_without_products_runs_compiled(monkeypatch):
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from numbackend import scan_loop
    monkeypatch.setattr(tuning, "SCAN_LOOP_FORM", "generated")
    loops, run = [], scan_loop.Loop.run

    def spied(self, *args):
        loops.append(self)
        return run(self, *args)
    monkeypatch.setattr(scan_loop.Loop, "run", spied)
    x = K.placeholder((None, 12, U), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")

    def step(x_t, states):
        h = states[0] * 0.5 + x_t
        return h, [h]
    last, _, _ = K.rnn(step, x, [h0])
    xv, hv = RNG.standard_normal((3, 12, U)), RNG.standard_normal((3, U))
    want = hv
    for t in range(12):
        want = want * 0.5 + xv[:, t]
    np.testing.assert_allclose(K.function([x, h0], [last])([xv, hv])[0], want, rtol=1e-12)
    assert len(loops) == 1 and not loops[0].has_packable


def test_the_loop_stacks_its_outputs_without_slice_assignments(monkeypatch):
    # copying.copy_into: a slice assignment compiles Numba's error path with
    # string formatting, seconds of a cold process's first call
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from numbackend import scan_loop
    monkeypatch.setattr(tuning, "SCAN_LOOP_FORM", "generated")
    loops, run = [], scan_loop.Loop.run

    def spied(self, *args):
        loops.append(self)
        return run(self, *args)
    monkeypatch.setattr(scan_loop.Loop, "run", spied)
    x = K.placeholder((None, 7, U), dtype="float32")
    h0 = K.placeholder((None, U), dtype="float32")

    def step(x_t, states):
        h = states[0] * 0.25 + x_t
        return h * 2.0, [h]
    _, outputs, _ = K.rnn(step, x, [h0])
    xv = RNG.standard_normal((2, 7, U)).astype("float32")
    hv = RNG.standard_normal((2, U)).astype("float32")
    want, h = [], hv
    for t in range(7):
        h = h * np.float32(0.25) + xv[:, t]
        want.append(h * 2)
    np.testing.assert_allclose(K.function([x, h0], [outputs])([xv, hv])[0], np.stack(want, axis=1),
                               rtol=1e-6)
    assert len(loops) == 1 and slice_assignments(loops[0].source) == []


def test_the_loop_and_its_kernels_call_library_code_without_literal_arguments(monkeypatch):
    # Numba compiles a callee once more for each pattern of literal arguments:
    # transposition flags and a kernel's constant width typed as literals
    # compiled products and kernels again for compiled callers alone
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from numbackend import scan_loop
    monkeypatch.setattr(tuning, "SCAN_LOOP_FORM", "generated")
    loops, run = [], scan_loop.Loop.run

    def spied(self, *args):
        loops.append(self)
        return run(self, *args)
    monkeypatch.setattr(scan_loop.Loop, "run", spied)
    r = np.random.default_rng(3)
    w_v = (r.standard_normal((I, 2 * U)) * 0.5).astype("float32")
    u_v = (r.standard_normal((U, 2 * U)) * 0.4).astype("float32")
    w, u = K.variable(w_v), K.variable(u_v)
    x = K.placeholder((None, T, I), dtype="float32")
    h0 = K.placeholder((None, U), dtype="float32")

    def step(x_t, states):  # gates sliced from one product: a kernel of constant width
        z = K.dot(x_t, w) + K.dot(states[0], u)
        h = K.tanh(z[:, :U]) * K.sigmoid(z[:, U:])
        return h, [h]
    _, outputs, _ = K.rnn(step, x, [h0])
    xv = RNG.standard_normal((B, T, I)).astype("float32")
    hv = RNG.standard_normal((B, U)).astype("float32")
    got = K.function([x, h0], [outputs])([xv, hv])[0]
    h, want = hv.astype("float64"), []
    for t in range(T):
        z = xv[:, t] @ w_v.astype("float64") + h @ u_v.astype("float64")
        h = np.tanh(z[:, :U]) / (1 + np.exp(-z[:, U:]))
        want.append(h)
    np.testing.assert_allclose(got, np.stack(want, axis=1), rtol=1e-4, atol=1e-5)
    (loop,) = {id(lp): lp for lp in loops}.values()
    (signature,) = loop._function.signatures
    assert literal_calls(loop._function, signature) == []
    kernels = [(callee, sig) for callee, sig in compiled_calls(loop._function, signature)
               if callee.py_func.__name__ == "run_serial"]
    assert kernels
    for callee, sig in kernels:
        assert literal_calls(callee, sig.args) == []


def _masked_rnn_step(w, u, keep, shift):
    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0] * keep, u) + shift)
        return h, [h]
    return step


def _numpy_masked_rnn(x, w, u, keep, shift, h, backwards):
    outs = []
    for t in (range(T - 1, -1, -1) if backwards else range(T)):
        h = np.tanh(x[:, t] @ w + (h * keep) @ u + shift)
        outs.append(h)
    return np.stack(outs, axis=1)


@pytest.mark.parametrize("rows", [5, 2])
def test_rows_split_between_threads_give_the_numpy_loop_and_its_gradients(split_runs, rows):
    # a per-row invariant (keep, a dropout mask) is split with the rows, a bias
    # (shift) is shared; five rows split unevenly
    w_v, u_v, _ = weights()
    shift_v = RNG.standard_normal(U) * 0.1
    w, u, shift = (K.variable(v, dtype="float64") for v in (w_v, u_v, shift_v))
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")
    keep = K.placeholder((None, U), dtype="float64")
    last, outputs, _ = K.rnn(_masked_rnn_step(w, u, keep, shift), x, [h0], go_backwards=True)
    target = RNG.standard_normal((rows, T, U))
    loss = K.sum(outputs * target) + K.sum(K.square(last))
    fn = K.function([x, h0, keep], [outputs] + K.gradients(loss, [w, u, shift, h0]))
    xv, hv = RNG.standard_normal((rows, T, I)), RNG.standard_normal((rows, U))
    keep_v = (RNG.random((rows, U)) > 0.3) / 0.7
    counts = _count_step_runs(fn)
    got = fn([xv, hv, keep_v])
    assert counts == {"rnn": 1, "rnn gradient": 1} and len(split_runs) == 2
    np.testing.assert_allclose(got[0], _numpy_masked_rnn(xv, w_v, u_v, keep_v, shift_v, hv, True),
                               rtol=1e-10, atol=1e-12)

    def numpy_loss(w_, u_, shift_, h_):
        outs = _numpy_masked_rnn(xv, w_, u_, keep_v, shift_, h_, True)
        return (outs * target).sum() + (outs[:, -1] ** 2).sum()
    values = [w_v, u_v, shift_v, hv]
    for k, value in enumerate(values):
        def f(v, k=k):
            args = list(values)
            args[k] = v
            return numpy_loss(*args)
        np.testing.assert_allclose(got[1 + k], numeric_gradient(f, value), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("go_backwards", [False, True])
def test_split_rows_read_their_rows_of_every_sequence(split_runs, go_backwards):
    # the mask is a second sequence beside the inputs; each part reads and writes
    # its own rows of the sequences and of the stacked outputs, in place
    mask_value = RNG.random((B, T)) > 0.3
    (_w, _u, _b), x, h0, last, outputs, states = build_rnn(
        go_backwards=go_backwards, mask=K.constant(mask_value, dtype="bool"))
    fn = K.function([x, h0], [last, outputs, states[0]])
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    got_last, got_outputs, got_state = fn([xv, hv])
    assert split_runs == [min(blas.threads(), B)]  # one part per thread, at most one per row
    want_h, want_outputs = numpy_rnn(xv, *weights(), hv, mask_value, go_backwards)
    np.testing.assert_allclose(got_outputs, want_outputs, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_last, want_outputs[:, -1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_state, want_h, rtol=1e-10, atol=1e-12)


def test_a_per_row_invariant_with_one_row_is_shared_by_the_split_rows(split_runs):
    w_v, u_v, _ = weights()
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")
    keep = K.placeholder((None, U), dtype="float64")
    _, outputs, _ = K.rnn(_masked_rnn_step(K.variable(w_v, dtype="float64"),
                                          K.variable(u_v, dtype="float64"), keep, 0.0), x, [h0])
    fn = K.function([x, h0, keep], [outputs])
    xv, hv, keep_v = RNG.standard_normal((4, T, I)), RNG.standard_normal((4, U)), RNG.random((1, U))
    got = fn([xv, hv, keep_v])[0]
    assert split_runs == [min(blas.threads(), 4)]
    np.testing.assert_allclose(got, _numpy_masked_rnn(xv, w_v, u_v, keep_v, 0.0, hv, False),
                               rtol=1e-10, atol=1e-12)


def test_a_step_that_mixes_rows_runs_them_together(split_runs):
    # each row's step reads the others' (a product with the rows reshaped): splitting
    # them would change it
    w_v, u_v, b_v = weights()
    w, u, b = (K.variable(v, dtype="float64") for v in (w_v, u_v, b_v))
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")

    def step(x_t, states):
        h = states[0]
        mixed = K.dot(K.dot(h, K.reshape(h, (U, -1))), h)
        h = K.tanh(K.dot(x_t, w) + K.dot(h, u) + b + 0.01 * mixed)
        return h, [h]

    last, _, _ = K.rnn(step, x, [h0])
    fn = K.function([x, h0], [last])
    xv, hv = RNG.standard_normal((4, T, I)), RNG.standard_normal((4, U))
    counts = _count_step_runs(fn)
    got = fn([xv, hv])[0]
    assert counts == {"rnn": 1} and split_runs == []
    h = hv
    for t in range(T):
        h = np.tanh(xv[:, t] @ w_v + h @ u_v + b_v + 0.01 * (h @ h.reshape(U, -1) @ h))
    np.testing.assert_allclose(got, h, rtol=1e-10, atol=1e-12)


_ROW_CASES = {  # a step's new state from h and the invariants, and which invariants line up
    "products and a bias": (lambda x, h, v: K.tanh(K.dot(x, v["w"]) + K.dot(h, v["u"]) + v["b"]),
                            [False, False, False]),
    "a per-row mask": (lambda x, h, v: h * v["keep"] + v["b"], [False, True]),
    # static shape (1, U): broadcast along the rows
    "a one-row invariant": (lambda x, h, v: h * v["one_row"], [False]),
    "reshapes within rows": (lambda x, h, v: K.reshape(K.reshape(h, (-1, 2, U // 2)) * 2.0,
                                                       (-1, U)), []),
    "slices and a concatenation of columns": (
        lambda x, h, v: K.concatenate([h[:, :2], h[:, 2:]], axis=1), []),
    # a product's right operand is shared by the rows, whatever its shape
    "a product with a per-row placeholder": (lambda x, h, v: K.dot(h, v["keep"]), [False]),
    "a mean over the rows": (lambda x, h, v: h - K.mean(h, axis=0), None),
    "a sum over the rows": (lambda x, h, v: h - K.sum(h, axis=0), None),
    "a product of rows": (lambda x, h, v: K.dot(K.dot(h, K.reshape(h, (U, -1))), h), None),
    "a concatenation of rows": (lambda x, h, v: K.concatenate([h[:2], h[2:]], axis=0), None),
    "an invariant both lined up and shared": (
        lambda x, h, v: h * v["keep"] + K.dot(h, v["keep"]), None),
}


@pytest.mark.parametrize("case", list(_ROW_CASES))
def test_which_steps_keep_their_rows_apart(case):
    from numbackend.plan import Plan
    from numbackend.scan_loop import _row_aligned
    step, aligned = _ROW_CASES[case]
    x = K.placeholder((None, I), dtype="float64")
    h = K.placeholder((None, U), dtype="float64")
    invariants = {"w": K.placeholder((I, U), dtype="float64"),
                  "u": K.placeholder((U, U), dtype="float64"),
                  "b": K.placeholder((U,), dtype="float64"),
                  "keep": K.placeholder((None, U), dtype="float64"),
                  "one_row": K.placeholder((1, U), dtype="float64")}
    target = step(x, h, invariants)
    reached = {n.id for n in toposort([target])}
    used = [v for v in invariants.values() if v.id in reached]  # the step's invariants
    assert _row_aligned(Plan([x, h] + used, [target]), 1, 1) == aligned


def _gated_step(w, u, bias, keep):
    def step(x_t, states):
        z = K.bias_add(K.dot(x_t, w), bias) + K.dot(states[0] * keep, u)
        c = K.sigmoid(z[:, :U]) * states[1] + K.tanh(z[:, U:2 * U])
        h = K.hard_sigmoid(z[:, 2 * U:]) * K.tanh(c)
        return h, [h, c]
    return step


def _numpy_gated_steps(values, keep, units, go_backwards):
    """The h and c of each step of _gated_step's loop in NumPy, float64, stacked
    along axis 1 in the order the steps ran; ``values``: w, u, bias, x, h0, c0."""
    w, u, bias, x, h, c = (v.astype("float64") for v in values)
    hs, cs = [], []
    for t in (range(x.shape[1] - 1, -1, -1) if go_backwards else range(x.shape[1])):
        z = x[:, t] @ w + bias + (h * keep) @ u
        c = c / (1 + np.exp(-z[:, :units])) + np.tanh(z[:, units:2 * units])
        h = np.clip(0.2 * z[:, 2 * units:] + 0.5, 0, 1) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs, axis=1), np.stack(cs, axis=1)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
def test_the_loop_as_blocks_gives_the_generated_loops_bits(tuned, request, monkeypatch, split,
                                                           go_backwards):
    # a Keras-style gated step on slices of one product (its gradient a
    # concatenation), a bias, a per-row mask (a recurrent dropout's), two
    # states, float32, forward and back:
    # the library's blocks (scan_blocks.py) and the generated loop run the
    # same kernels and products in the same order
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    if split:
        request.getfixturevalue("split_runs")
    from numbackend import scan_blocks
    block_runs, prepare = [], scan_blocks.StepBlocks.prepare

    def counted(self, *args, **kw):
        run = prepare(self, *args, **kw)
        block_runs.append(run is not None)
        return run
    monkeypatch.setattr(scan_blocks.StepBlocks, "prepare", counted)
    r = np.random.default_rng(11)
    values = [(r.standard_normal(s) * 0.5).astype("float32")
              for s in ((I, 3 * U), (U, 3 * U), (3 * U,), (B, T, I), (B, U), (B, U))]
    keep_value = (r.random((B, U)) > 0.3).astype("float32")
    got = {}
    for form in ("generated", "blocks"):
        tuned(SCAN_LOOP_FORM=form)
        w, u, bias = (K.variable(v) for v in values[:3])
        x = K.placeholder((None, T, I), dtype="float32")
        h0, c0, keep = (K.placeholder((None, U), dtype="float32") for _ in range(3))
        _, outputs, (_, c_last) = K.rnn(_gated_step(w, u, bias, keep), x, [h0, c0],
                                        go_backwards=go_backwards)
        loss = K.sum(outputs * outputs) + K.sum(c_last)
        fn = K.function([x, h0, c0, keep], [outputs, c_last] + K.gradients(loss, [w, u, bias, x]))
        got[form] = fn(values[3:] + [keep_value])
    assert len(block_runs) == (4 if split else 2) and all(block_runs)  # forward and back
    for generated, blocks in zip(got["generated"], got["blocks"]):
        np.testing.assert_array_equal(blocks, generated)
    # and the same as NumPy's loop (within float32's rounding)
    hs, cs = _numpy_gated_steps(values, keep_value, U, go_backwards)
    np.testing.assert_allclose(got["blocks"][0], hs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["blocks"][1], cs[:, -1], rtol=1e-4, atol=1e-5)


def test_a_loop_called_again_with_other_arrays_reads_and_writes_those(monkeypatch):
    # the blocks' table of a kind of arguments is kept, and each call writes its
    # own arrays' addresses into it: calls with other inputs and weights of the
    # same shapes, then of other shapes, then the first again, each give their
    # own NumPy loop (every array kept alive, so that none takes another's place)
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")
    from numbackend import scan_blocks
    tables = []
    prepare = scan_blocks.StepBlocks.prepare

    def spied(self, *args, **kw):
        tables.append(self)
        return prepare(self, *args, **kw)
    monkeypatch.setattr(scan_blocks.StepBlocks, "prepare", spied)
    (w, u, b), x, h0, _last, outputs, states = build_rnn()
    fn = K.function([x, h0], [outputs, states[0]])
    r = np.random.default_rng(7)
    cases = [(r.standard_normal((rows, T, I)), r.standard_normal((rows, U)),
              [v * r.uniform(0.5, 1.5) for v in weights()]) for rows in (B, B, B + 2)]
    kept = []
    for xv, hv, values in cases + cases[:1]:
        for variable, value in zip((w, u, b), values):
            K.set_value(variable, value)
        got_outputs, got_state = fn([xv, hv])
        kept.append((got_outputs, got_state))
        want_outputs = numpy_rnn(xv, *values, hv)[1]
        np.testing.assert_allclose(got_outputs, want_outputs, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got_state, want_outputs[:, -1], rtol=1e-10, atol=1e-12)
    assert len(tables) >= 4
    (blocks,) = set(tables)
    assert len(blocks._tables) >= 2  # one kind of arguments for each batch size


@pytest.mark.parametrize("go_backwards", [False, True])
def test_threads_sharing_each_step_give_the_one_thread_loops_bits(tuned, monkeypatch, go_backwards):
    # the threads share each step (scan_blocks.StepBlocks.prepare's ``shared``):
    # the products split by panels, the kernels, the stacked output's
    # concatenation and the copies by rows, a per-row mask, a bias, two states;
    # the same bits as the loop on one thread, and NumPy's loop within rounding
    if not blas.AVAILABLE or blas.threads() < 2:
        pytest.skip("the threads of OpenBLAS's pool share the steps, and it has one here")
    from jit_kernels import packed
    from numbackend import scan_blocks
    shared, prepare = [], scan_blocks.StepBlocks.prepare

    def spied(self, *args, **kw):
        shared.append(kw.get("shared", 1))
        return prepare(self, *args, **kw)
    monkeypatch.setattr(scan_blocks.StepBlocks, "prepare", spied)
    rows, steps, inputs = 7, 6, 5
    units = 2 * packed.panel_width(4)  # 6 panels of 3 * units columns: 2 or more a thread
    r = np.random.default_rng(5)
    values = [(r.standard_normal(s) * 0.3).astype("float32")
              for s in ((inputs, 3 * units), (units, 3 * units), (3 * units,),
                        (rows, steps, inputs), (rows, units), (rows, units))]
    keep_value = (r.random((rows, units)) > 0.3).astype("float32")

    def step(w, u, bias, keep):
        def body(x_t, states):
            z = K.bias_add(K.dot(x_t, w), bias) + K.dot(states[0] * keep, u)
            c = K.sigmoid(z[:, :units]) * states[1] + K.tanh(z[:, units:2 * units])
            h = K.hard_sigmoid(z[:, 2 * units:]) * K.tanh(c)
            return K.concatenate([h, c]), [h, c]
        return body

    got = {}
    for form, settings in (("one thread", {"SCAN_SPLIT_MIN_ELEMENTS": 10**12}),
                           ("shared", {"SCAN_SPLIT_MIN_ELEMENTS": 0, "SCAN_SHARE_MIN_WORK": 1,
                                       "SCAN_SHARE_MIN_THREADS": 2,
                                       "SCAN_SPLIT_MIN_ROWS_PER_THREAD": rows})):
        tuned(**settings)
        w, u, bias = (K.variable(v) for v in values[:3])
        x = K.placeholder((None, steps, inputs), dtype="float32")
        h0, c0, keep = (K.placeholder((None, units), dtype="float32") for _ in range(3))
        _, outputs, (_, c_last) = K.rnn(step(w, u, bias, keep), x, [h0, c0],
                                        go_backwards=go_backwards)
        fn = K.function([x, h0, c0, keep], [outputs, c_last]
                        + K.gradients(K.sum(outputs * outputs), [w, u]))
        shared.clear()
        for _ in range(3):  # the loop takes over from the second call
            got[form] = fn(values[3:] + [keep_value])
        got[form + " runs"] = list(shared)
    assert got["one thread runs"] and set(got["one thread runs"]) == {1}
    # forward shared between min(threads, 6 panels) threads; the backward loop's
    # products by the step's values (x^T @ dz) do not split by panels
    assert min(blas.threads(), 6) in got["shared runs"], got["shared runs"]
    for one, both in zip(got["one thread"], got["shared"]):
        np.testing.assert_array_equal(both, one)
    hs, cs = _numpy_gated_steps(values, keep_value, units, go_backwards)
    np.testing.assert_allclose(got["shared"][0], np.concatenate([hs, cs], axis=2), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(got["shared"][1], cs[:, -1], rtol=1e-4, atol=1e-5)
