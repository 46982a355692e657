"""The tuning module: every threshold and size in one place, each with its
unit, source and why; environment overrides; override() for tests; the
decisions it names reach the code that takes them."""
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K
from numbackend import codegen, tuning
from tests.kernel_helpers import needs_blas

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(code, **environment):
    """Run ``code`` in a fresh interpreter with ``environment`` added; the result."""
    env = dict(os.environ, **environment,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in list(env):
        if name.startswith("NUMBACKEND_TUNE_") and name not in environment:
            del env[name]
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=False, timeout=120)


# --- the environment -----------------------------------------------------------

def test_the_environment_sets_entries_when_the_module_is_imported():
    done = _run("""
        import json
        from jit_kernels import tuning
        values = {"ONE_CALL_AFTER": tuning.ONE_CALL_AFTER,
                  "FUSED_PARALLEL_MIN_WORK": tuning.FUSED_PARALLEL_MIN_WORK,
                  "NUMPY_MAX_SIZE": tuning.NUMPY_MAX_SIZE}
        # entries of this test alone, defined as the module defines its own
        values["WORD"] = tuning._define("TEST_WORD", "direct", "a path", "test", "test",
                                        choices=("direct", "columns"))
        values["NONE"] = tuning._define("TEST_NONE", "direct", "a path", "test", "test",
                                        choices=(None, "direct"))
        values["FLOAT"] = tuning._define("TEST_FLOAT", 0.5, "a fraction", "test", "test")
        try:
            tuning._define("TEST_BAD_CHOICE", "direct", "a path", "test", "test",
                           choices=("direct", "columns"))
        except ValueError as error:
            values["BAD_CHOICE"] = str(error)
        print(json.dumps(values))
        """, NUMBACKEND_TUNE_ONE_CALL_AFTER=" 3 ", NUMBACKEND_TUNE_FUSED_PARALLEL_MIN_WORK="0x100",
        NUMBACKEND_TUNE_TEST_WORD="columns", NUMBACKEND_TUNE_TEST_NONE="None",
        NUMBACKEND_TUNE_TEST_FLOAT="2", NUMBACKEND_TUNE_TEST_BAD_CHOICE="diagonal")
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values.pop("BAD_CHOICE") == ("tuning: TEST_BAD_CHOICE must be one of ('direct', "
                                        "'columns'), got 'diagonal' (from "
                                        "NUMBACKEND_TUNE_TEST_BAD_CHOICE='diagonal')")
    assert values == {"ONE_CALL_AFTER": 3, "FUSED_PARALLEL_MIN_WORK": 256, "NUMPY_MAX_SIZE": 16,
                      "WORD": "columns", "NONE": None, "FLOAT": 2}


@pytest.mark.parametrize("text", ["often", "none", "2.5"])
def test_an_environment_value_of_the_wrong_kind_stops_the_import(text):
    done = _run("import numbackend", NUMBACKEND_TUNE_ONE_CALL_AFTER=text)
    assert done.returncode != 0
    assert "ValueError: tuning: ONE_CALL_AFTER takes a whole number (calls with" in done.stderr
    assert f"(from NUMBACKEND_TUNE_ONE_CALL_AFTER={text!r})" in done.stderr


def test_importing_numbackend_loads_neither_numba_nor_the_kernels():
    done = _run("""
        import sys
        import numbackend
        from numbackend import tuning
        assert tuning is sys.modules["jit_kernels.tuning"], tuning
        print(sorted(name for name in sys.modules
                     if name == "numba" or name.startswith(("numba.", "llvmlite"))
                     or (name.startswith("jit_kernels.")
                         and name not in ("jit_kernels.tuning", "jit_kernels.machine",
                                          "jit_kernels.cache_folders"))))
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- override() --------------------------------------------------------------------

def test_override_sets_entries_and_restores_them():
    before = tuning.ONE_CALL_AFTER, tuning.NUMPY_MAX_SIZE
    with tuning.override(ONE_CALL_AFTER=before[0] + 5, NUMPY_MAX_SIZE=0):
        assert (tuning.ONE_CALL_AFTER, tuning.NUMPY_MAX_SIZE) == (before[0] + 5, 0)
        with tuning.override(ONE_CALL_AFTER=1):
            assert tuning.ONE_CALL_AFTER == 1
        assert tuning.ONE_CALL_AFTER == before[0] + 5
    assert (tuning.ONE_CALL_AFTER, tuning.NUMPY_MAX_SIZE) == before


def test_override_restores_entries_after_an_exception():
    before = tuning.ONE_CALL_AFTER
    with pytest.raises(RuntimeError, match="inside"), tuning.override(ONE_CALL_AFTER=before + 1):
        raise RuntimeError("inside")
    assert tuning.ONE_CALL_AFTER == before


def _refused(error, match, **values):
    """Assert that tuning.override(**values) raises ``error`` matching ``match``."""
    with pytest.raises(error, match=match), tuning.override(**values):
        pass


def test_override_refuses_unknown_names_and_values_of_another_kind():
    before = tuning.ONE_CALL_AFTER
    _refused(KeyError, "no entry 'ONE_CALL_AFTERR'", ONE_CALL_AFTER=1, ONE_CALL_AFTERR=1)
    kind = r"ONE_CALL_AFTER takes a whole number \(calls with small inputs .*\), got "
    _refused(ValueError, kind + "'often'", ONE_CALL_AFTER="often")
    _refused(ValueError, kind + r"2\.5", ONE_CALL_AFTER=2.5)
    _refused(ValueError, kind + "True", ONE_CALL_AFTER=True)
    _refused(ValueError, kind + "None", ONE_CALL_AFTER=None)
    assert tuning.ONE_CALL_AFTER == before
    with tuning.override(ONE_CALL_AFTER=np.int64(4)):  # a NumPy integer is an integer
        assert tuning.ONE_CALL_AFTER == 4


@pytest.fixture
def scratch_entry():
    """Define an entry of this test alone, ``define(name, default, **options)``,
    removed after the test."""
    names = []

    def define(name, default, **options):
        names.append(name)
        return tuning._define(name, default, "a unit", "a source", "a reason", **options)
    yield define
    for name in names:
        tuning._ENTRIES.pop(name, None)
        vars(tuning).pop(name, None)


def test_override_refuses_entries_compiled_into_kernels(scratch_entry):
    scratch_entry("TEST_COMPILED_SIZE", 64, compiled=True)
    _refused(ValueError, "TEST_COMPILED_SIZE is compiled into kernels; set "
                         "NUMBACKEND_TUNE_TEST_COMPILED_SIZE in the environment",
             TEST_COMPILED_SIZE=8)
    assert tuning.TEST_COMPILED_SIZE == 64
    assert tuning.compiled_values()["TEST_COMPILED_SIZE"] == 64


def test_an_entry_is_defined_once(scratch_entry):
    scratch_entry("TEST_TWICE", 1)
    with pytest.raises(ValueError, match="TEST_TWICE is defined twice"):
        scratch_entry("TEST_TWICE", 2)


def test_override_takes_a_choice_and_refuses_others(scratch_entry):
    scratch_entry("TEST_PATH", None, choices=(None, "direct", "columns"))
    with tuning.override(TEST_PATH="columns"):
        assert tuning.TEST_PATH == "columns"
    _refused(ValueError, r"TEST_PATH must be one of \(None, 'direct', 'columns'\), got 'diagonal'",
             TEST_PATH="diagonal")
    assert tuning.TEST_PATH is None


# --- the entries -------------------------------------------------------------------

def test_every_entry_says_its_unit_source_and_why():
    entries = tuning.entries()
    assert len({e.name for e in entries}) == len(entries)
    for e in entries:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", e.name), e.name
        for field, shortest in (("unit", 2), ("source", 5), ("why", 5)):  # a unit may be "ns"
            text = getattr(e, field)
            assert isinstance(text, str) and len(text) >= shortest, (e.name, field, text)
        assert getattr(tuning, e.name) == e.default or os.environ.get(f"NUMBACKEND_TUNE_{e.name}")
        assert e.decides is None or isinstance(e.decides, str)


def test_decisions_by_call_count_or_timing_are_pins():
    pins = tuning.pins()
    assert "ONE_CALL_AFTER" in {e.name for e in pins}
    assert all(isinstance(e.decides, str) and e.decides for e in pins)


def test_no_module_of_numbackend_defines_a_threshold_of_its_own():
    """Thresholds and sizes live in tuning, where override() reaches them: no
    module of numbackend sets a module-level number under a name that looks
    like one."""
    looks_like_a_threshold = re.compile(
        r"(^|_)(MIN|MAX)(_|$)|_(BYTES|AFTER|ROWS|ITEMS|ELEMENTS|WORK|SIZE|SAMPLES|BLOCKS|THREADS?"
        r"|CHANNELS|PATCH|NS|LIMIT|THRESHOLD|CHUNK|RUNS|KERNELS)$")

    def is_number(node):
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.UnaryOp):
            return is_number(node.operand)
        if isinstance(node, ast.BinOp):
            return is_number(node.left) and is_number(node.right)
        return False

    found = []
    for path in sorted((ROOT / "numbackend").rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
            for target in targets:
                if (isinstance(target, ast.Name) and looks_like_a_threshold.search(target.id)
                        and is_number(node.value)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
    assert not found, "thresholds outside tuning: " + ", ".join(found)


# --- the entries reach the decisions ------------------------------------------------

def test_fused_kernels_are_generated_with_the_entries_in_force():
    a = K.placeholder((None, 8))
    with tuning.override(FUSED_PARALLEL_MIN_WORK=12345, FUSED_VMATH_CALL_WORK=10,
                         FUSED_ROW_BLOCKS=7):
        # a softmax's rows, with a buffer per block of rows where two outputs read it
        f = K.function([a], [K.tanh(a) * 2.0, K.softmax(a) * 2.0, K.softmax(a) - a])
    sources = "\n".join(f.kernel_sources())
    assert "R * C * 11 >= 12345 and parallel_ok()" in sources
    assert "NB = min(R, 7)" in sources and "np.empty((min(R, 7), C)" in sources
    av = np.linspace(-3, 3, 9 * 8).reshape(9, 8).astype(np.float32)
    e = np.exp(av - av.max(axis=1, keepdims=True))
    softmax = e / e.sum(axis=1, keepdims=True)
    for got, want in zip(f([av]), [np.tanh(av) * 2.0, softmax * 2.0, softmax - av]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_small_groups_run_with_numpy_by_the_entry():
    a = K.placeholder((3,), dtype="float64")
    av = np.array([0.5, -1.0, 2.0])
    f = K.function([a], [K.exp(a) * 2.0 + 1.0])
    assert f.plan.kernels == []  # 3 elements: NumPy
    with tuning.override(NUMPY_MAX_SIZE=2):
        g = K.function([a], [K.exp(a) * 2.0 + 1.0])
    assert len(g.plan.kernels) == 1
    for fn in (f, g):
        np.testing.assert_allclose(fn([av])[0], np.exp(av) * 2.0 + 1.0, rtol=1e-14)


@needs_blas
def test_one_call_after_pins_when_a_function_runs_as_one_call():
    x = K.placeholder((None, 4), dtype="float64")
    wv = np.linspace(-0.5, 0.5, 12).reshape(4, 3)
    w = K.variable(wv, dtype="float64")
    xv = np.linspace(-1, 1, 8).reshape(2, 4)
    want = np.tanh(xv @ wv) + 1.0
    for after, calls, one_call in ((1, 1, True), (10**9, 20, False)):
        f = K.function([x], [K.tanh(K.dot(x, w)) + 1.0])
        with tuning.override(ONE_CALL_AFTER=after):
            for _ in range(calls):
                np.testing.assert_allclose(f([xv])[0], want, rtol=1e-12)
        assert ("run as one compiled call" in f.explain()) == one_call, (after, f.explain())


def test_the_bound_on_loaded_kernels_comes_from_the_environment_else_the_entry(monkeypatch):
    monkeypatch.delenv("NUMBACKEND_MAX_KERNELS", raising=False)
    assert codegen.max_kernels() == tuning.MAX_LOADED_KERNELS
    with tuning.override(MAX_LOADED_KERNELS=7):
        assert codegen.max_kernels() == 7
        monkeypatch.setenv("NUMBACKEND_MAX_KERNELS", "3")
        assert codegen.max_kernels() == 3
