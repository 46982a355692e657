"""Helpers shared by the jit_kernels tests, and the mark of tests that need OpenBLAS."""
import numpy as np
import pytest

from jit_kernels import blas, tuning

needs_blas = pytest.mark.skipif(not blas.AVAILABLE,
                                reason="NumPy's BLAS is not OpenBLAS ILP64: plans run from Python")


@pytest.fixture(autouse=True)
def all_threads():
    """Run every kernel on all threads, however small the arrays, so that the
    tests see the parallel loops (the serial fallback is the same code)."""
    with tuning.override(LIBRARY_PARALLEL_MIN_WORK=0):
        yield


def random_arrays(seed):
    """A ``random(shape, dtype=float64)`` drawing standard normal arrays from one seeded stream."""
    rng = np.random.default_rng(seed)

    def random(shape, dtype=np.float64):
        return rng.standard_normal(shape).astype(dtype)
    return random


def inner(a, b):
    """<a, b> in float64."""
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


# A loop LLVM vectorises: out[i] = x[i] * x[i]
_SQUARES_LOOP_IR = """
define void @squares(float* noalias %x, float* noalias %out, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %body
body:
  %i = phi i64 [0, %entry], [%next, %body]
  %px = getelementptr float, float* %x, i64 %i
  %v = load float, float* %px
  %w = fmul float %v, %v
  %po = getelementptr float, float* %out, i64 %i
  store float %w, float* %po
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %body, label %done
done:
  ret void
}
"""


def llvm_fills_512_bits_by_default():
    """Whether LLVM's own tuning for the CPU target vectorises a plain loop on
    512-bit registers, asked of llvmlite directly: yes for AMD's Zen 4, no for
    Intel's AVX-512 CPUs (which prefer 256 bits) and CPUs without AVX-512."""
    import llvmlite.binding as llvm

    from jit_kernels.compiling import cpu_target
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    name, features = cpu_target()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=name, features=features, opt=3)
    module = llvm.parse_assembly(_SQUARES_LOOP_IR)
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    options.loop_vectorization = True
    passes = llvm.create_pass_builder(machine, options)
    passes.getModulePassManager().run(module, passes)
    return "zmm" in machine.emit_assembly(module)


def report_threads(monkeypatch, count):
    """``blas.threads()`` reports ``count``, so that work splits as for that many
    threads.  Beyond OpenBLAS's own threads the parts then run one after
    another on the calling thread: on the pool, OpenBLAS would queue more
    parts than it has threads, waiting for a sleeping thread that it wakes
    only once all are queued."""
    from jit_kernels import parts
    real = blas.threads()
    monkeypatch.setattr(blas, "threads", lambda: count)
    if count > real:
        def one_after_another(part, descriptors):
            function = part()[1]
            for row in np.ascontiguousarray(descriptors, np.int64):
                function(row.ctypes.data)
        monkeypatch.setattr(parts, "run", one_after_another)
