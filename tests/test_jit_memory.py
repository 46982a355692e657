"""jit_kernels.memory: large arrays allocated in kernels ask for huge pages."""
import os
import sys

import numba
import numpy as np
import pytest

from jit_kernels import memory


@numba.njit
def _allocate(n):
    out = np.empty(n, dtype=np.float32)
    memory.prefer_huge_pages(out)
    out[:] = 1.0
    return out


def _vm_flags(address):
    """The VmFlags of the mapping of this process holding ``address``."""
    flags, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    return flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's madvise")
def test_large_arrays_are_advised_huge_pages_small_ones_not():
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(thp):
        pytest.skip("no transparent huge pages")
    with open(thp) as f:
        if "[never]" in f.read():
            pytest.skip("transparent huge pages are off")
    large = _allocate(memory.HUGE_PAGE_MIN_BYTES // 4 * 4)  # 16 MB
    small = _allocate(1024)
    np.testing.assert_array_equal(large[[0, -1]], [1.0, 1.0])
    assert "hg" in _vm_flags(large.ctypes.data + large.nbytes // 2)
    flags = _vm_flags(small.ctypes.data)
    assert flags is not None and "hg" not in flags


def test_generated_kernels_advise_their_outputs():
    import numbackend as K
    x = K.placeholder((None, 8))
    fn = K.function([x], [K.exp(x) * 2.0, K.sum(x * x, axis=1)])
    source = "\n".join(fn.kernel_sources())
    assert source.count("mem.prefer_huge_pages(o") == 2 * 2  # two outputs, par and ser
    values = np.linspace(-1, 1, 24).reshape(3, 8)
    got = fn([values])
    np.testing.assert_allclose(got[0], np.exp(values) * 2.0, rtol=1e-6)
    np.testing.assert_allclose(got[1], (values * values).sum(1), rtol=1e-6)
