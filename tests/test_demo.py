"""``python -m numbackend demo``, the README's first command, in a new process."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_demo_runs_and_reports_its_threads():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "numbackend", "demo"], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "W1 fused element-wise chain" in done.stdout and "W3 MLP 784-512-512-10, batch 256" in done.stdout
    assert "threads of OpenBLAS's pool" in done.stdout.splitlines()[-1]
