"""How many threads numbackend's kernels use: the CPUs this process may run on.

``os.cpu_count()`` counts the machine's CPUs, but a process may be held to
fewer: by its CPU affinity (``taskset``, a container's cpuset) or by a cgroup
CPU quota (a container's ``--cpus``, a serverless function's share).  Threads
beyond those wait for time slices, and work split between them waits for the
slowest.  OpenBLAS counts the affinity but not the quota; Numba counts
neither.  Standard library only: this runs before NumPy and Numba load.
"""
import math
import os
import sys

ENV = "NUMBACKEND_NUM_THREADS"


def _affinity():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path):
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None


def _quotas(root, proc_cgroup):
    """The CPU quotas (CPUs, a float) of the cgroups this process is in and their parents."""
    lines = _read(proc_cgroup) or []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: cpu.max is "max 100000" or "<quota> <period>"
            names, folders = [("cpu.max",)], [root]
        elif "cpu" in controllers.split(","):  # v1: cpu.cfs_quota_us (-1 for none), cpu.cfs_period_us
            names = [("cpu.cfs_quota_us", "cpu.cfs_period_us")]
            folders = [os.path.join(root, controllers), os.path.join(root, "cpu")]
        else:
            continue
        for folder in folders:
            here = path.strip("/")
            while True:
                for name in names:
                    if len(name) == 1:
                        value = _read(os.path.join(folder, here, name[0]))
                        if value and len(value) == 2 and value[0] != "max":
                            yield _ratio(value[0], value[1])
                    else:
                        quota = _read(os.path.join(folder, here, name[0]))
                        period = _read(os.path.join(folder, here, name[1]))
                        if quota and period and quota[0] != "-1":
                            yield _ratio(quota[0], period[0])
                if not here:
                    break
                here = os.path.dirname(here)


def _ratio(quota, period):
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return math.inf
    return q / p if q > 0 and p > 0 else math.inf


def available_cpus(root="/sys/fs/cgroup", proc_cgroup="/proc/self/cgroup"):
    """The CPUs this process may use: its affinity, bounded by its cgroups' CPU
    quotas (rounded up: a quota of 1.5 CPUs keeps two threads busy)."""
    count = _affinity()
    for quota in _quotas(root, proc_cgroup):
        if quota != math.inf:
            count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def threads():
    """The thread count for numbackend's kernels: NUMBACKEND_NUM_THREADS where
    set, else :func:`available_cpus`."""
    value = os.environ.get(ENV)
    if value is not None:
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"numbackend: {ENV} must be a whole number, got {value!r}") from None
        if count < 1:
            raise ValueError(f"numbackend: {ENV} must be at least 1, got {count}")
        return count
    return available_cpus()


def limit_thread_pools():
    """Hold OpenBLAS's and Numba's thread pools to :func:`threads`, through
    their environment variables where they are not set and the library has
    not loaded yet, and NUMBACKEND_NUM_THREADS for jit_kernels (which sets
    OpenBLAS's count when NumPy loaded first).  Nothing where every CPU is ours."""
    count = threads()
    if ENV not in os.environ and count >= (os.cpu_count() or 1):
        return
    os.environ[ENV] = str(count)
    if "numpy" not in sys.modules and not any(
            v in os.environ for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")):
        os.environ["OPENBLAS_NUM_THREADS"] = str(count)
    if "numba" not in sys.modules and "NUMBA_NUM_THREADS" not in os.environ:
        os.environ["NUMBA_NUM_THREADS"] = str(count)
