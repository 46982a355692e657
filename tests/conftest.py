import contextlib
import os
import tempfile

import pytest

# One kernel cache for the whole session, unless the caller chose one (CI passes a cold one).
os.environ.setdefault("NUMBACKEND_CACHE_DIR", os.path.join(tempfile.gettempdir(), "numbackend-tests"))
os.environ.setdefault("KERAS_HOME", tempfile.mkdtemp(prefix="numbackend-keras-home-"))
# Later tiers compile in the call that finds them due, and a scan runs its loop
# from its first call: which call runs which tier is then fixed, and tests
# check it (tests/test_tiers.py checks the default, background compiles).
os.environ.setdefault("NUMBACKEND_TUNE_TIER_COMPILE", "in_call")
os.environ.setdefault("NUMBACKEND_TUNE_SCAN_LOOP_AFTER", "1")
# No native entries (a process of their own for each function called often):
# tests/test_native.py turns them on where it checks them.
os.environ.setdefault("NUMBACKEND_TUNE_NATIVE_TIER", "off")


@pytest.fixture
def tuned():
    """``tuned(NAME=value, ...)``: tuning.override(NAME=value, ...) until the test ends."""
    from numbackend import tuning
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(tuning.override(**values))


@pytest.fixture
def plan_runs(tuned):
    """Functions compile their plan as one call from their second small call on;
    returns a function counting how often a Function's plan ran from Python."""
    tuned(ONE_CALL_AFTER=2)

    def count(fn):
        runs, run = [0], fn.plan.run

        def counted(*arrays):
            runs[0] += 1
            return run(*arrays)
        fn.plan.run = counted
        return runs
    return count


@pytest.fixture
def tune():
    """``tune(NAME=value, ...)``: tuning entries overridden until the test ends
    (see numbackend.tuning.override)."""
    from jit_kernels import tuning  # imports nothing else
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(tuning.override(**values))
