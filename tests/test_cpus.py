"""The thread count follows the CPUs the process may use: its affinity and its
cgroup CPU quota (a container's --cpus), read from a made-up cgroup tree."""
import os
import subprocess
import sys

import pytest

from numbackend import cpus


def _tree(tmp_path, proc_lines, files):
    proc = tmp_path / "proc_cgroup"
    proc.write_text("\n".join(proc_lines) + "\n")
    root = tmp_path / "cgroup"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root), str(proc)


@pytest.fixture
def eight_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


@pytest.mark.parametrize("cpu_max, want", [("max 100000\n", 8), ("150000 100000\n", 2),
                                           ("100000 100000\n", 1), ("20000 100000\n", 1),
                                           ("1600000 100000\n", 8)])
def test_a_cgroup_v2_quota_bounds_the_cpus(tmp_path, eight_cpus, cpu_max, want):
    root, proc = _tree(tmp_path, ["0::/box/job"], {"box/job/cpu.max": cpu_max})
    assert cpus.available_cpus(root, proc) == want


def test_a_parent_cgroups_quota_counts_too(tmp_path, eight_cpus):
    root, proc = _tree(tmp_path, ["0::/box/job"], {"box/job/cpu.max": "max 100000\n",
                                                   "box/cpu.max": "300000 100000\n"})
    assert cpus.available_cpus(root, proc) == 3


@pytest.mark.parametrize("quota, want", [("-1", 8), ("250000", 3)])
def test_a_cgroup_v1_quota_bounds_the_cpus(tmp_path, eight_cpus, quota, want):
    root, proc = _tree(tmp_path, ["4:memory:/x", "2:cpu,cpuacct:/docker/abc"],
                       {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": quota + "\n",
                        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpus.available_cpus(root, proc) == want


def test_no_cgroup_files_leaves_the_affinity(tmp_path, eight_cpus):
    assert cpus.available_cpus(str(tmp_path / "none"), str(tmp_path / "none" / "cgroup")) == 8


def test_the_environment_variable_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv(cpus.ENV, "3")
    assert cpus.threads() == 3
    for bad in ("0", "two"):
        monkeypatch.setenv(cpus.ENV, bad)
        with pytest.raises(ValueError, match=cpus.ENV):
            cpus.threads()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and two CPUs")
def test_a_process_held_to_one_cpu_runs_one_thread_of_each_pool():
    # NumPy loads first, as in most programs: OpenBLAS's count is then set by jit_kernels
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "import numpy, numba\nimport numbackend\nfrom jit_kernels import blas\n"
            "print(os.environ['NUMBACKEND_NUM_THREADS'], blas.threads())")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBACKEND_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                        "NUMBA_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True)
    assert done.stdout.split() == ["1", "1"]
