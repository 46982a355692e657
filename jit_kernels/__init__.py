"""Precompiled Numba kernels on plain NumPy arrays.

This package knows nothing of numbackend's graph: every function takes and
returns NumPy arrays (or fills output arrays passed in).  Kernels are compiled
with ``cache=True`` so a second process loads them from disk.
"""

import llvmlite.binding as _llvm

# LLVM's loop vectoriser gives up on a loop that needs more than 128 run-time
# checks that its arrays do not overlap.  Numba cannot tell LLVM that a
# kernel's freshly allocated outputs overlap nothing, so a fused kernel with
# many outputs needs more (an LSTM backward step: 11 outputs, 12 inputs) and
# ran 4x slower as scalar code.  The option is process-wide; all it does is
# let more loops vectorise.
_llvm.set_option("", "-vectorize-memory-check-threshold=1024")

# Interleave every vectorised loop four times (four independent vector chains
# per iteration).  LLVM's cost model leaves a long loop body such as an inlined
# exp or tanh at one chain, whose latency then bounds the loop: softmax
# 4096x1000 went from 3.4 to 2.5 ms, W1 from 3.3 to 2.9 ms.
_llvm.set_option("", "-force-vector-interleave=4")


def _load_numba_array_math_without_scipy():
    """Import Numba's array-math lowering without its SciPy BLAS probe.

    numba.np.arraymath imports scipy.linalg when it loads (about 0.2 s, part of
    every process's first compile or cache load where SciPy is installed, as it
    is with Keras) only to decide whether np.correlate/np.convolve may call
    BLAS.  No kernel here uses Numba's BLAS: matrix products run through
    NumPy.  The probe answers "no BLAS" while the module loads and is restored
    right after, so np.dot in other njit code still finds SciPy's BLAS.
    """
    import sys
    if "numba.np.arraymath" in sys.modules:
        return
    from numba.np import linalg
    probe = getattr(linalg, "ensure_blas", None)
    if probe is None:  # another Numba layout: load as it comes
        return

    def no_blas():
        raise ImportError("jit_kernels: skipped the SciPy BLAS probe")

    linalg.ensure_blas = no_blas
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        linalg.ensure_blas = probe


_load_numba_array_math_without_scipy()
