"""What the library's splits and chunk sizes are derived from (the thread count
and the caches of the machine), and the rules that derive them: pure
functions of their inputs, so that tests can give them any machine.

Standard library only: :mod:`jit_kernels.tuning` reads the caches when it is
imported, before NumPy and Numba load.
"""
import functools
import math
import os
from typing import NamedTuple

CACHE_FOLDER = "/sys/devices/system/cpu/cpu0/cache"


class Cache(NamedTuple):
    """One data (or unified) cache of the first CPU: ``size`` in bytes and the
    number of CPUs that share it (``sharing``)."""
    size: int
    sharing: int


def _cpu_list_length(text):
    """How many CPUs a Linux CPU list such as ``0-3,8,10-11`` names."""
    count = 0
    for span in text.strip().split(","):
        if not span:
            continue
        first, _, last = span.partition("-")
        count += int(last or first) - int(first) + 1
    return count


# Cached: the caches do not change while the process runs, and chunk sizes are
# worked out on every call of a kernel.
@functools.lru_cache(maxsize=64)
def read_cache(level, folder=CACHE_FOLDER):
    """The :class:`Cache` of ``level`` (1: L1 data, 2, 3) of the CPU whose
    cache folder under Linux's /sys is ``folder``; None where it cannot be
    read."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in sorted(names):
        try:
            with open(os.path.join(folder, name, "level")) as f:
                found = int(f.read())
            with open(os.path.join(folder, name, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(folder, name, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if found != level or kind not in ("Data", "Unified"):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            size = int(size.rstrip("KMG")) * scale
        except ValueError:
            return None
        try:
            with open(os.path.join(folder, name, "shared_cpu_list")) as f:
                sharing = max(1, _cpu_list_length(f.read()))
        except (OSError, ValueError):
            sharing = 1
        return Cache(size, sharing)
    return None


def cache_bytes(level, default, folder=CACHE_FOLDER):
    """The size in bytes of the first CPU's cache of ``level``; ``default``
    where it cannot be read."""
    cache = read_cache(level, folder)
    return default if cache is None else cache.size


def shared_cache_share(threads, level=3, default=None, folder=CACHE_FOLDER):
    """Bytes of the cache of ``level`` (shared between cores) that each of
    ``threads`` threads may count on: the cache over the threads that share
    it, at most all of it.  ``default`` where it cannot be read."""
    cache = read_cache(level, folder)
    if cache is None:
        return default
    return cache.size // max(1, min(threads, cache.sharing))


def part_count(work, threads, min_work, most=None):
    """How many parts to split ``work`` into where handing a part to a thread
    costs about as much as ``min_work`` (compiled parts, which the threads of
    the pool start at once): one per thread of ``threads``, each with at least
    ``min_work``, at most ``most`` (the pieces the work comes in: images,
    bands, panels, rows) and at least one.  Work too small for two parts runs
    as one, on the calling thread."""
    count = min(threads, work // max(1, min_work))
    if most is not None:
        count = min(count, most)
    return max(1, count)


def python_part_count(work, threads, handoff_work, most=None):
    """How many parts of Python to split ``work`` into, where a part's hand-off
    holds the GIL for about the time of ``handoff_work``: the hand-offs go one
    after another, so n parts end about n hand-offs plus 1/n of the work after
    the start, soonest at n = sqrt(work / handoff_work); no more than
    ``threads`` or ``most``, at least one."""
    count = min(threads, math.isqrt(work // max(1, handoff_work)))
    if most is not None:
        count = min(count, most)
    return max(1, count)
