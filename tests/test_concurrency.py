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


def call_from_threads(f, inputs):
    """What each call of ``f`` returned, over THREADS threads calling it CALLS times each."""
    returned = [[] for _ in range(THREADS)]
    errors = []

    def work(mine):
        try:
            for _ in range(CALLS):
                mine.append(f(inputs))
        except Exception as exc:  # noqa: BLE001 - reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(returned[i],)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [r for mine in returned for r in mine]


def test_a_counter_updated_from_eight_threads_counts_every_call(frequent_thread_switches):
    counter = K.variable(0.0, dtype="float64")
    step = K.placeholder((), dtype="float64")
    f = K.function([step], [counter * 1.0], updates=[K.update_add(counter, step)])
    returned = call_from_threads(f, [1.0])
    assert K.get_value(counter) == THREADS * CALLS
    # each call read the counter as the one before it left it
    assert sorted(float(r[0]) for r in returned) == list(range(THREADS * CALLS))

