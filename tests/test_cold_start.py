"""asv_bench/cold_start.py's new processes start with the user's environment,
not with the tuning that asv_bench's benchmarks set when the harness imports
them; ``import numbackend`` loads only what serving a model needs (nothing timed)."""
import os
import subprocess
import sys
import textwrap

from tests import asv_scripts


def test_the_children_run_without_the_harness_tuning(monkeypatch):
    monkeypatch.delenv("NUMBACKEND_TUNE_TIER_COMPILE", raising=False)
    monkeypatch.delenv("NUMBACKEND_TUNE_NATIVE_TIER", raising=False)
    cold_start = asv_scripts.load("cold_start", "cold_start_under_test")
    # what onnx_files does to this process: asv_bench's benchmarks set the
    # harness's tuning in os.environ when imported
    monkeypatch.syspath_prepend(asv_scripts.FOLDER)
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    import benchmarks  # noqa: F401
    assert os.environ.get("NUMBACKEND_TUNE_TIER_COMPILE") == "in_call"
    assert os.environ.get("NUMBACKEND_TUNE_NATIVE_TIER") == "off"
    seen = []
    monkeypatch.setattr(cold_start, "run_child", lambda source, args, env: seen.append(env) or {})
    cold_start.numbackend_runs("mlp", 2)
    assert len(seen) == 2
    assert all("NUMBACKEND_TUNE_TIER_COMPILE" not in env for env in seen)
    assert all("NUMBACKEND_TUNE_NATIVE_TIER" not in env for env in seen)  # entries on, as for a user
    assert all(env["HOME"] == seen[0]["HOME"] for env in seen)


def test_importing_numbackend_loads_no_subprocess_until_export_or_warmup_is_used():
    script = textwrap.dedent("""
        import sys
        import numbackend
        print("subprocess" in sys.modules, {"export", "warmup"} <= set(dir(numbackend)))
        from numbackend import export, warmup
        print(export.__module__, warmup.__module__)
        print("subprocess" in sys.modules)
        try:
            numbackend.no_such_name
        except AttributeError as error:
            print(error)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["False True", "numbackend.exporting numbackend.compile_report", "True",
                   "module 'numbackend' has no attribute 'no_such_name'"]
