"""Large outputs of generated kernels are backed by huge pages.

Kernels write into arrays that their module's ``run`` allocates with NumPy,
which asks Linux for 2 MB pages for arrays of 4 MB and up.  Without that, a
16 MB output in memory that glibc had just given back to the system took 4096
page faults: 5 ms on a 2-core VM against a 3 ms kernel."""
import os
import subprocess
import sys
import textwrap

import pytest

# Run in a new process: in this one, memory that earlier tests had advised and
# freed may come back to a small allocation, flags and all.
_SCRIPT = textwrap.dedent("""
    import numpy as np
    import numbackend as K

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

    x = K.placeholder((None, 1024))
    fn = K.function([x], [K.exp(x) * 2.0])
    values = np.linspace(-1, 1, 4096 * 1024, dtype=np.float32).reshape(4096, 1024)  # 16 MB
    for _ in range(3):  # the first call's output may reuse memory advised before
        large = fn([values])[0]
    small = fn([values[:4]])[0]
    np.testing.assert_allclose(large, np.exp(values) * 2.0, rtol=1e-6)
    print("hg" in vm_flags(large.ctypes.data + large.nbytes // 2),
          "hg" in vm_flags(small.ctypes.data))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's madvise")
def test_large_kernel_outputs_use_huge_pages_small_ones_not():
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(thp):
        pytest.skip("no transparent huge pages")
    with open(thp) as f:
        if "[never]" in f.read():
            pytest.skip("transparent huge pages are off")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False"]
