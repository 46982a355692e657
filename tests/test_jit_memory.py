"""jit_kernels.memory: large arrays allocated in kernels ask for huge pages."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

# Run in a new process: in this one, memory that earlier tests had advised and
# freed may come back to a small allocation, flags and all.
_ADVICE_SCRIPT = textwrap.dedent("""
    import numba
    import numpy as np
    from jit_kernels import memory

    @numba.njit
    def allocate(n):
        out = np.empty(n, dtype=np.float32)
        memory.prefer_huge_pages(out)
        out[:] = 1.0
        return out

    def vm_flags(address):
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

    large = allocate(memory.HUGE_PAGE_MIN_BYTES // 4 * 4)  # 16 MB
    small = allocate(1024)
    assert large[0] == large[-1] == 1.0
    print("hg" in vm_flags(large.ctypes.data + large.nbytes // 2),
          "hg" in vm_flags(small.ctypes.data))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's madvise")
def test_large_arrays_are_advised_huge_pages_small_ones_not():
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(thp):
        pytest.skip("no transparent huge pages")
    with open(thp) as f:
        if "[never]" in f.read():
            pytest.skip("transparent huge pages are off")
    out = subprocess.run([sys.executable, "-c", _ADVICE_SCRIPT], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False"]


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
