"""Later tiers (the whole call, a scan's loop) compile off the serving path:
calls go on with the current tier while the compile is pending, swap when
it is done, and give the same values (checked against NumPy formulas);
Function.warmup compiles them at once; a failure keeps the current tier;
a forked child runs the jobs its parent had queued.

The suite runs with TIER_COMPILE="in_call" (conftest.py); these tests set
the default, "background", themselves."""
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import numbackend as K
from numbackend import runtime, scan_loop, tiers
from numbackend.graph import toposort
from numbackend.plan import BODIES

RNG = np.random.default_rng(29)
B, T, I, U = 2, 6, 3, 4
W_IN = RNG.standard_normal((I, U)) * 0.5
W_REC = RNG.standard_normal((U, U)) * 0.4
W_OUT = RNG.standard_normal((5, 3))
# a call that waits for a compile waits 60 s (then the compile goes on): far above this
RETURNS_WITHIN = 5.0


@pytest.fixture
def background(tuned):
    tuned(TIER_COMPILE="background")


@pytest.fixture
def blocked(monkeypatch):
    """``blocked(owner, name)``: the function ``owner.name`` waits, once called,
    until the returned ``release`` event is set; ``started`` is set once it is
    called.  Released when the test ends, whatever happened."""
    releases = []

    def block(owner, name):
        started, release = threading.Event(), threading.Event()
        releases.append(release)
        original = getattr(owner, name)

        def waiting(*args, **kwargs):
            started.set()
            release.wait(60)
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, waiting)
        return started, release
    yield block
    for release in releases:
        release.set()


def _softmax_function():
    x = K.placeholder((None, 5), dtype="float64")
    w = K.variable(W_OUT, dtype="float64")
    return x, K.function([x], [K.softmax(K.dot(x, w) + 1.0)])


def _softmax(xv):
    z = xv @ W_OUT + 1.0
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _timed(fn, arrays):
    start = time.perf_counter()
    result = fn(arrays)
    return result, time.perf_counter() - start


def test_the_whole_call_compiles_in_the_background_while_the_plan_serves(
        background, tuned, plan_runs, blocked):
    tuned(ONE_CALL_AFTER=2)
    started, release = blocked(runtime, "_compile_whole_call")
    _, f = _softmax_function()
    runs = plan_runs(f)
    xv = RNG.standard_normal((1, 5))
    np.testing.assert_allclose(f([xv])[0], _softmax(xv), rtol=1e-12)
    assert not started.is_set()  # a function called once compiles no whole call
    # the second call starts the compile and does not wait for it, nor do the next
    for _ in range(3):
        got, seconds = _timed(f, [xv])
        assert seconds < RETURNS_WITHIN and not release.is_set()
        np.testing.assert_allclose(got[0], _softmax(xv), rtol=1e-12)
    assert started.wait(10)
    assert runs[0] == 4 and not f.whole_call
    assert "compiling as one call, in the background" in f.explain()
    release.set()
    assert f._current()._compiling.wait(120)
    got = f([xv])
    assert f.whole_call and runs[0] == 4  # the fifth call ran the whole call
    np.testing.assert_allclose(got[0], _softmax(xv), rtol=1e-12)
    assert "run as one compiled call" in f.explain()


def test_a_failed_background_compile_keeps_the_plan_and_shows_in_explain(
        background, tuned, plan_runs, monkeypatch):
    tuned(ONE_CALL_AFTER=1)

    def fails(program, types):
        raise RuntimeError("no compiler today")
    monkeypatch.setattr(runtime, "_compile_whole_call", fails)
    _, f = _softmax_function()
    runs = plan_runs(f)
    xv = RNG.standard_normal((1, 5))
    f([xv])
    assert f._current()._compiling.wait(60)
    with pytest.warns(UserWarning, match="did not compile as one call.*no compiler today"):
        got = f([xv])
    np.testing.assert_allclose(got[0], _softmax(xv), rtol=1e-12)
    f([xv])
    assert runs[0] == 3 and f.whole_call is False
    assert "did not compile as one call: RuntimeError: no compiler today" in f.explain()


def test_in_call_compiles_the_whole_call_in_the_call_that_finds_it_due(tuned, plan_runs):
    tuned(TIER_COMPILE="in_call", ONE_CALL_AFTER=3)
    _, f = _softmax_function()
    runs = plan_runs(f)
    xv = RNG.standard_normal((1, 5))
    for _ in range(3):
        np.testing.assert_allclose(f([xv])[0], _softmax(xv), rtol=1e-12)
    assert runs[0] == 2 and f.whole_call


def _rnn_function():
    x = K.placeholder((None, T, I), dtype="float64")
    h0 = K.placeholder((None, U), dtype="float64")
    w, u = K.variable(W_IN, dtype="float64"), K.variable(W_REC, dtype="float64")

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], u))
        return h, [h]
    _, outputs, _ = K.rnn(step, x, [h0])
    return K.function([x, h0], [outputs])


def _numpy_rnn(xv, hv):
    outs = []
    for t in range(xv.shape[1]):
        hv = np.tanh(xv[:, t] @ W_IN + hv @ W_REC)
        outs.append(hv)
    return np.stack(outs, axis=1)


def _step_runs(fn):
    """How many steps of fn's scan ran from Python (the step's plan), from now."""
    (node,) = [n for n in toposort(fn.plan.targets) if n.op == "scan"]
    plan = BODIES.plan(node.attrs["body"])
    runs, run = [0], plan.run

    def counted(*arrays):
        runs[0] += 1
        return run(*arrays)
    plan.run = counted
    return runs


def _needs_blas():
    from jit_kernels import blas
    if not blas.AVAILABLE:
        pytest.skip("NumPy's BLAS is not OpenBLAS ILP64: every step runs from Python")


def test_a_scan_runs_from_python_while_its_loop_compiles_in_the_background(
        background, tuned, blocked):
    _needs_blas()
    tuned(SCAN_LOOP_AFTER=2, ONE_CALL_AFTER=10**9)
    started, release = blocked(scan_loop.Loop, "_compile")
    fn = _rnn_function()
    runs = _step_runs(fn)
    xv, hv = RNG.standard_normal((B, T, I)), RNG.standard_normal((B, U))
    want = _numpy_rnn(xv, hv)
    np.testing.assert_allclose(fn([xv, hv])[0], want, rtol=1e-12)
    assert runs[0] == T and not started.is_set()  # called once: no loop compiles
    for _ in range(3):  # the second call starts the compile; none waits for it
        got, seconds = _timed(fn, [xv, hv])
        assert seconds < RETURNS_WITHIN and not release.is_set()
        np.testing.assert_allclose(got[0], want, rtol=1e-12)
    assert started.wait(10)
    assert runs[0] == 4 * T
    assert "the loop over time compiling in the background" in fn.explain()
    release.set()
    (node,) = [n for n in toposort(fn.plan.targets) if n.op == "scan"]
    (loop,) = BODIES._loops[node.attrs["body"]].values()
    assert loop._job.wait(120) and loop._job.error is None
    np.testing.assert_allclose(fn([xv, hv])[0], want, rtol=1e-12)
    assert runs[0] == 4 * T + 1  # the first step from Python, the others in the loop
    assert "the loop over time compiled" in fn.explain()


def test_warmup_compiles_every_tier_and_later_calls_compile_nothing(
        background, tuned, monkeypatch):
    _needs_blas()
    tuned(ONE_CALL_AFTER=10)
    _, f = _softmax_function()
    f.warmup((1, 3))
    assert f.whole_call
    rnn = _rnn_function()
    rnn.warmup((2,))
    submitted = []
    monkeypatch.setattr(tiers, "submit", lambda what, work: submitted.append(what))
    runs = _step_runs(rnn)
    xv, hv = RNG.standard_normal((2, T, I)), RNG.standard_normal((2, U))
    np.testing.assert_allclose(rnn([xv, hv])[0], _numpy_rnn(xv, hv), rtol=1e-12)
    assert runs[0] == 1  # the loop ran from the first call after the warm-up
    for rows in (1, 3):
        xs = RNG.standard_normal((rows, 5))
        np.testing.assert_allclose(f([xs])[0], _softmax(xs), rtol=1e-12)
    assert submitted == []


def test_warmup_refuses_an_input_with_an_unknown_axis_past_the_batch():
    x = K.placeholder((None, None, 3))
    f = K.function([x], [x * 2.0])
    with pytest.raises(ValueError, match=r"warmup: input 0 .* shape \(None, None, 3\)"):
        f.warmup()
    with pytest.raises(ValueError, match="warmup: a batch size must be a positive int, got 0"):
        _softmax_function()[1].warmup((0,))


def test_warmup_writes_no_update():
    v = K.variable(np.zeros(3), dtype="float64")
    x = K.placeholder((None, 3), dtype="float64")
    f = K.function([x], [x + v], updates=[(v, v + 1.0)])
    f.warmup((1, 2))
    np.testing.assert_array_equal(K.get_value(v), np.zeros(3))


@pytest.mark.skipif(sys.platform != "linux", reason="fork is POSIX; tested on Linux")
def test_a_forked_child_runs_the_jobs_its_parent_had_queued(background):
    # the worker holds the fork gate while a job runs: the fork waits for job
    # one; job two, queued behind it, runs again in the child, on a worker of its own
    running, release = threading.Event(), threading.Event()
    first = tiers.submit("first", lambda: running.set() or release.wait(60) and "ran")
    second = tiers.submit("second", os.getpid)
    assert running.wait(30)  # job one holds the gate: the fork below must wait for it
    threading.Timer(0.5, release.set).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:
        ok = first.done and first.result == "ran" and second.wait(30) and second.result == os.getpid()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert second.wait(30) and second.result == os.getpid()


@pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                    reason="Keras 2.2.5 comes with the test extra")
def test_warmup_model_compiles_a_keras_models_predict():
    script = textwrap.dedent("""
        import numpy as np
        import keras
        from keras import layers
        from numbackend import keras_compat, tiers

        model = keras.models.Sequential([layers.Dense(4, activation="tanh", input_shape=(5,)),
                                         layers.Dropout(0.5), layers.Dense(2)])
        keras_compat.warmup_model(model, (1, 2))
        assert model.predict_function.whole_call
        submitted = []
        tiers.submit = lambda what, work: submitted.append(what)
        x = np.random.default_rng(0).standard_normal((2, 5)).astype("float32")
        (w1, b1), (w2, b2) = [layer.get_weights() for layer in model.layers if layer.weights]
        want = np.tanh(x @ w1 + b1) @ w2 + b2
        for _ in range(12):
            np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-6)
        assert submitted == [], submitted
        print("ok")
    """)
    env = dict(os.environ, KERAS_BACKEND="numbackend", NUMBACKEND_TUNE_TIER_COMPILE="background",
               NUMBACKEND_TUNE_SCAN_LOOP_AFTER="2")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_a_functions_second_call_compiles_nothing_in_the_calling_thread():
    # a convolution on the Winograd path, a product by packed weights and a scan
    # (whose loop the second call hands to the worker): in a new process, so that
    # no earlier test compiled a signature that the second call would need
    script = textwrap.dedent("""
        import threading
        import numpy as np
        from numba.core import dispatcher
        import numbackend as K

        rng = np.random.default_rng(0)
        image = K.placeholder((None, 10, 10, 4))
        kernel = K.variable(rng.standard_normal((3, 3, 4, 8)).astype("float32"))
        conv = K.function([image], [K.relu(K.conv2d(image, kernel))])
        x = K.placeholder((None, 300))
        weights = K.variable(rng.standard_normal((300, 256)).astype("float32"))
        dense = K.function([x], [K.relu(K.dot(x, weights))])
        seq, h0 = K.placeholder((None, 4, 3)), K.placeholder((None, 5))
        u, v = K.variable(np.ones((3, 5), "float32")), K.variable(np.eye(5, dtype="float32"))
        _, outputs, _ = K.rnn(lambda x_t, s: (lambda h: (h, [h]))(K.tanh(K.dot(x_t, u) + K.dot(s[0], v))),
                              seq, [h0])
        rnn = K.function([seq, h0], [outputs])
        feeds = [(conv, [rng.standard_normal((1, 10, 10, 4)).astype("float32")]),
                 (dense, [rng.standard_normal((1, 300)).astype("float32")]),
                 (rnn, [np.ones((2, 4, 3), "float32"), np.zeros((2, 5), "float32")])]
        for f, arrays in feeds:
            f(arrays)
        compiled, main = [], threading.current_thread()
        compile_for_args = dispatcher.Dispatcher._compile_for_args

        def spied(self, *args, **kwargs):
            if threading.current_thread() is main:
                compiled.append(self.py_func.__qualname__)
            return compile_for_args(self, *args, **kwargs)
        dispatcher.Dispatcher._compile_for_args = spied
        for f, arrays in feeds:
            f(arrays)
        print("compiled in the second calls:", compiled)
    """)
    env = dict(os.environ, NUMBACKEND_TUNE_TIER_COMPILE="background",
               NUMBACKEND_TUNE_SCAN_LOOP_AFTER="2", NUMBACKEND_TUNE_CONV_PATH="winograd",
               NUMBACKEND_TUNE_ONE_CALL_AFTER="2")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled in the second calls: []" in done.stdout, done.stdout



def _switch_interval_becomes(value):
    """Whether sys.getswitchinterval() is ``value`` within RETURNS_WITHIN seconds
    (the worker sets it back after a job has finished, not before)."""
    deadline = time.monotonic() + RETURNS_WITHIN
    while time.monotonic() < deadline:
        if sys.getswitchinterval() == pytest.approx(value):
            return True
        time.sleep(0.001)
    return False


def test_the_gil_changes_hands_often_while_the_worker_compiles(background, tuned):
    # Numba's lowering runs in Python: with Python's 5 ms switch interval a
    # serving thread waited for the GIL at each of its own Python steps
    tuned(COMPILE_SWITCH_INTERVAL_S=0.0005)
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        seen = tiers.submit("a test's job", lambda: sys.getswitchinterval())
        assert seen.wait(RETURNS_WITHIN) and seen.error is None
        assert seen.result == pytest.approx(0.0005)
        assert _switch_interval_becomes(0.004)  # set back after the job
        # an interval that someone else set meanwhile is left as it is: a later
        # job sets back the one it found, which must be that one
        changed = tiers.submit("a test's job", lambda: sys.setswitchinterval(0.002))
        after = tiers.submit("a test's job", lambda: sys.getswitchinterval())
        assert changed.wait(RETURNS_WITHIN) and after.wait(RETURNS_WITHIN)
        assert changed.error is None and after.result == pytest.approx(0.0005)
        assert _switch_interval_becomes(0.002)
    finally:
        sys.setswitchinterval(before)
