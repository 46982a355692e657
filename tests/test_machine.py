"""What splits and chunk sizes derive from: the caches read from a made-up
/sys tree, the part counts for given thread counts and work, and the vector
width of a CPU target, asked of LLVM for CPUs this machine need not be."""
import re

import pytest

from jit_kernels import machine


def _cache_tree(tmp_path, caches):
    """A made-up /sys/devices/system/cpu/cpu0/cache: one index folder per
    (level, type, size, shared_cpu_list)."""
    folder = tmp_path / "cache"
    for i, (level, kind, size, shared) in enumerate(caches):
        index = folder / f"index{i}"
        index.mkdir(parents=True)
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
        if shared is not None:
            (index / "shared_cpu_list").write_text(f"{shared}\n")
    return str(folder)


# a 16-core Xeon with two threads a core: the L3 shared by all 32 CPUs
XEON = [(1, "Data", "48K", "0,16"), (1, "Instruction", "32K", "0,16"),
        (2, "Unified", "2048K", "0,16"), (3, "Unified", "36M", "0-15,16-31")]


def test_the_caches_and_the_cpus_sharing_them_are_read(tmp_path):
    folder = _cache_tree(tmp_path, XEON)
    assert machine.read_cache(1, folder) == (48 << 10, 2)  # the data cache, not the instructions'
    assert machine.read_cache(2, folder) == (2 << 20, 2)
    assert machine.read_cache(3, folder) == (36 << 20, 32)
    assert machine.cache_bytes(2, 123, folder) == 2 << 20


def test_a_cache_that_cannot_be_read_gives_the_default(tmp_path):
    folder = _cache_tree(tmp_path, [(2, "Unified", "1024K", None), (3, "Unified", "lots", "0-7")])
    assert machine.read_cache(2, folder) == (1 << 20, 1)  # no shared_cpu_list: its own
    assert machine.read_cache(3, folder) is None
    assert machine.cache_bytes(3, 77, folder) == 77
    assert machine.cache_bytes(2, 77, str(tmp_path / "none")) == 77
    assert machine.shared_cache_share(4, folder=str(tmp_path / "none")) is None


@pytest.mark.parametrize("threads, share", [(1, 36 << 20), (2, 18 << 20), (16, (36 << 20) // 16),
                                            (32, (36 << 20) // 32), (64, (36 << 20) // 32)])
def test_each_thread_counts_on_its_share_of_the_l3(tmp_path, threads, share):
    folder = _cache_tree(tmp_path, XEON)
    assert machine.shared_cache_share(threads, folder=folder) == share


@pytest.mark.parametrize("work, threads, most, count", [
    (10_000, 16, None, 1),          # less than two parts' work: the calling thread alone
    (2 * 16384, 16, None, 2),
    (1 << 20, 16, None, 16),        # a thread each
    (1 << 20, 64, None, 64),
    (1 << 20, 3, None, 3),
    (1 << 20, 1, None, 1),
    (1 << 20, 16, 6, 6),            # 6 pieces of work (bands, panels) at most
    (5 * 16384 - 1, 8, None, 4),    # each part gets its minimum
])
def test_compiled_parts_get_a_thread_each_and_their_minimum(work, threads, most, count):
    assert machine.part_count(work, threads, 16384, most) == count


@pytest.mark.parametrize("work, threads, most, count", [
    (3 * 32768, 16, None, 1),       # sqrt(3): one part
    (4 * 32768, 16, None, 2),
    (64 * 21632, 16, None, 6),      # mnist_cnn's first layer at batch 64: sqrt(42)
    (64 * 21632, 2, None, 2),
    (300 * 32768, 16, None, 16),    # sqrt(300) = 17 parts' worth, one per thread
    (300 * 32768, 16, 5, 5),        # 5 images
])
def test_parts_of_python_number_the_square_root_of_work_over_a_hand_off(work, threads, most, count):
    """n parts of Python end about n hand-offs and 1/n of the work after the
    start: fewest at sqrt(work / hand-off)."""
    assert machine.python_part_count(work, threads, 32768, most) == count


@pytest.mark.parametrize("cpu, avx512", [("skylake-avx512", True), ("cascadelake", True),
                                         ("icelake-server", True), ("x86-64-v4", True),
                                         ("znver4", True), ("x86-64-v3", False), ("znver3", False),
                                         ("haswell", False), ("generic", False)])
def test_a_cpu_named_without_features_has_avx512_by_llvms_word(cpu, avx512):
    # it was x86-64-v4 alone: NUMBACKEND_CPU_TARGET=skylake-avx512 got AVX2's panels
    from jit_kernels import compiling
    assert compiling._has_avx512(cpu) == avx512



def packed_floats_on_zmm(dispatcher):
    """The packed float32 arithmetic on 512-bit registers in ``dispatcher``'s code."""
    assembly = "\n".join(dispatcher.inspect_asm().values())
    return re.findall(r"^\s*v(?:add|mul|fn?madd\d+)ps\s[^\n]*%zmm", assembly, re.MULTILINE)


def test_prefer_vector_width_widens_the_loops_of_its_function():
    """prefer_vector_width(512) in a loop's body, of a parallel loop (whose body Numba
    outlines into a function of its own) or a serial one, has LLVM fill 512-bit
    registers there; the same loops without it keep LLVM's choice for the CPU
    (256 bits on Intel's AVX-512 CPUs, 512 on AMD's Zen 4)."""
    import numba
    import numpy as np

    from jit_kernels import compiling
    from jit_kernels.compiling import prefer_vector_width
    from tests.kernel_helpers import llvm_fills_512_bits_by_default
    if compiling.target_vector_bytes() < 64:
        pytest.skip("the CPU target has no AVX-512")

    @numba.njit(parallel=True)
    def parallel_wide(x, out):
        for i in numba.prange(x.size):
            prefer_vector_width(512)
            out[i] = x[i] * x[i] + np.float32(0.5)

    @numba.njit(parallel=True)
    def parallel_plain(x, out):
        for i in numba.prange(x.size):
            out[i] = x[i] * x[i] + np.float32(0.5)

    @numba.njit
    def serial_wide(x, out):
        prefer_vector_width(512)
        for i in range(x.size):
            out[i] = x[i] * x[i] + np.float32(0.5)

    @numba.njit
    def serial_plain(x, out):
        for i in range(x.size):
            out[i] = x[i] * x[i] + np.float32(0.5)

    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    plain_is_wide = llvm_fills_512_bits_by_default()
    for loop, wide in ((parallel_wide, True), (parallel_plain, plain_is_wide),
                       (serial_wide, True), (serial_plain, plain_is_wide)):
        out = np.empty_like(x)
        loop(x, out)
        np.testing.assert_allclose(out, x.astype(np.float64) ** 2 + 0.5, rtol=1e-7)
        assert bool(packed_floats_on_zmm(loop)) == wide, loop


def test_prefer_vector_width_takes_a_constant_width_llvm_knows():
    import numba

    from jit_kernels.compiling import prefer_vector_width

    @numba.njit
    def unknown_width():
        prefer_vector_width(300)

    @numba.njit
    def variable_width(bits):
        prefer_vector_width(bits)

    expected = r"prefer_vector_width: the width must be a constant, one of \(128, 256, 512\) \(bits\)"
    with pytest.raises(numba.core.errors.TypingError, match=expected + r", got Literal\[int\]\(300\)"):
        unknown_width()
    with pytest.raises(numba.core.errors.TypingError, match=expected + ", got int64"):
        variable_width(512)
