"""Loaded kernel modules are bounded (NUMBACKEND_MAX_KERNELS, least recently used
dropped first) and K.clear_session drops those no function holds."""
import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import numbackend as K
from numbackend import codegen

ROWS = np.linspace(-1, 1, 5 * 8, dtype="float32").reshape(5, 8)


@pytest.fixture
def max_kernels(monkeypatch):
    """Sets the bound and starts with no kernel module loaded."""
    def set_bound(count):
        monkeypatch.setenv("NUMBACKEND_MAX_KERNELS", str(count))
        codegen.forget_kernels()
    yield set_bound
    codegen.forget_kernels()  # the next tests load theirs again, under the default bound


def chain(length):
    """A function of ``length`` steps y * 1.5 + 0.25 (one fused kernel, of its own
    source for each length) and its NumPy formula."""
    x = K.placeholder((None, 8))
    y = x
    for _ in range(length):
        y = y * 1.5 + 0.25
    return K.function([x], [y]), lambda a: a * 1.5 ** length + 0.25 * (1.5 ** length - 1) / 0.5


def _loaded_kernels_stay_within_the_bound():
    functions = []
    for length in range(1, 9):
        f, formula = chain(length)
        np.testing.assert_allclose(f([ROWS])[0], formula(ROWS), rtol=1e-5, atol=1e-6)
        functions.append((f, formula))
        assert len(codegen._modules) == min(length, 3)
    for f, formula in functions:  # most of their kernels were dropped: they still run
        np.testing.assert_allclose(f([ROWS])[0], formula(ROWS), rtol=1e-5, atol=1e-6)
    modules = [weakref.ref(m) for f, _ in functions for m in f.plan.kernels]
    names = {m().__name__ for m in modules}
    compiled = [weakref.ref(m().kernel_ser) for m in modules]  # what each call ran
    del f, functions
    gc.collect()
    chain(9)  # loading one more drops those that nothing holds any more
    gc.collect()
    alive = [m() for m in modules if m() is not None]
    assert sorted(m.KEY for m in alive) == sorted(list(codegen._modules)[:2])  # lengths 7 and 8
    assert names & set(sys.modules) == {m.__name__ for m in alive}
    assert sum(d() is not None for d in compiled) == 2  # and so is the code Numba compiled


def test_loaded_kernels_stay_within_the_bound():
    # in a process of its own: a function of another test holding a kernel of
    # the same source would keep it loaded, rightly
    code = ("from tests.test_kernel_memory import _loaded_kernels_stay_within_the_bound as run\n"
            "run()\nprint('ok')")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBACKEND_MAX_KERNELS="3",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False, cwd=root)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stdout + done.stderr


def test_a_whole_call_runs_kernels_that_were_dropped(max_kernels):
    max_kernels(1)
    x = K.placeholder((None, 8))
    w = K.variable(np.linspace(-0.5, 0.5, 8 * 4).reshape(8, 4))
    y = K.tanh(K.dot(K.tanh(x * 2.0 + 1.0), w)) + 1.0  # two kernels around a product
    f = K.function([x], [y])
    want = np.tanh(np.tanh(ROWS * 2.0 + 1.0) @ K.get_value(w)) + 1.0
    for _ in range(12):  # compiled as one call after ten
        np.testing.assert_allclose(f([ROWS])[0], want, rtol=1e-5)
    assert f.whole_call and len(codegen._modules) == 1


def test_a_bad_bound_is_named(monkeypatch):
    monkeypatch.setenv("NUMBACKEND_MAX_KERNELS", "none")
    with pytest.raises(ValueError, match="NUMBACKEND_MAX_KERNELS.*'none'"):
        codegen.max_kernels()


def test_clear_session_drops_unheld_kernels_and_resets_uids(max_kernels):
    max_kernels(512)
    kept, kept_formula = chain(2)
    dropped, _ = chain(3)
    dropped([ROWS])
    dropped_module = weakref.ref(dropped.plan.kernels[0])
    dropped_code = weakref.ref(dropped.plan.kernels[0].kernel_ser)
    del dropped
    K.get_uid("dense")
    K.set_learning_phase(1)
    K.clear_session()
    gc.collect()
    assert len(codegen._modules) == 0 and dropped_module() is None and dropped_code() is None
    np.testing.assert_allclose(kept([ROWS])[0], kept_formula(ROWS), rtol=1e-5, atol=1e-6)
    assert K.get_uid("dense") == 1
    assert K.is_placeholder(K.learning_phase())  # no longer fixed to 1
