"""Calls of one function with updates from several threads run one at a time."""
import sys
import threading

import pytest

import numbackend as K

THREADS = 8
CALLS = 300


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every microsecond rather than every 5 ms, so that calls overlap."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def call_from_threads(f, inputs_of, calls=CALLS):
    """What each of THREADS threads got from ``calls`` calls of ``f`` with
    ``inputs_of(its index)``: a list per thread."""
    returned = [[] for _ in range(THREADS)]
    errors = []

    def work(i):
        try:
            for _ in range(calls):
                returned[i].append(f(inputs_of(i)))
        except Exception as exc:  # noqa: BLE001 - reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return returned


def test_a_counter_updated_from_eight_threads_counts_every_call(frequent_thread_switches):
    counter = K.variable(0.0, dtype="float64")
    step = K.placeholder((), dtype="float64")
    f = K.function([step], [counter * 1.0], updates=[K.update_add(counter, step)])
    returned = [r for mine in call_from_threads(f, lambda i: [1.0]) for r in mine]
    assert K.get_value(counter) == THREADS * CALLS
    # each call read the counter as the one before it left it
    assert sorted(float(r[0]) for r in returned) == list(range(THREADS * CALLS))



def test_a_scan_called_from_threads_at_once_gives_each_call_its_own_loop(frequent_thread_switches):
    # a function without updates runs its calls at once: each call of the scan's
    # loop takes a table of blocks of its own (numbackend/scan_blocks.py)
    import numpy as np
    r = np.random.default_rng(3)
    w, u = r.standard_normal((3, 4)) * 0.5, r.standard_normal((4, 4)) * 0.5
    x = K.placeholder((None, 6, 3), dtype="float64")
    h0 = K.placeholder((None, 4), dtype="float64")
    wv, uv = K.variable(w, dtype="float64"), K.variable(u, dtype="float64")

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, wv) + K.dot(states[0], uv))
        return h, [h]
    _, outputs, _ = K.rnn(step, x, [h0])
    f = K.function([x, h0], [outputs])
    inputs = [(r.standard_normal((2, 6, 3)), r.standard_normal((2, 4))) for _ in range(THREADS)]
    f(list(inputs[0]))  # compiled before the threads start
    returned = call_from_threads(f, lambda i: list(inputs[i]), calls=CALLS // 10)
    for (xv, hv), got in zip(inputs, returned):
        h, want = hv, []
        for t in range(6):
            h = np.tanh(xv[:, t] @ w + h @ u)
            want.append(h)
        for (outputs_value,) in got:
            np.testing.assert_allclose(outputs_value, np.stack(want, axis=1), rtol=1e-10, atol=1e-12)
