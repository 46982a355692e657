"""Matrix products callable from compiled code, through NumPy's own BLAS.

Numba's ``np.dot`` in nopython mode needs SciPy.  NumPy's wheels ship OpenBLAS
built with 64-bit integers, whose CBLAS entry points this module binds by
address: Numba links a call to ``numbackend_sgemm``/``numbackend_dgemm`` the
way it links its own helpers, so the compiled code stays cacheable on disk
(the address is registered again in each process before anything loads).  The
products run on the same OpenBLAS, and the same thread pool, as NumPy's.

Where NumPy's BLAS is another one (a conda MKL build, Accelerate), nothing is
bound and :data:`AVAILABLE` is False: callers must then use NumPy.
"""
import contextlib
import ctypes
import glob
import os
import threading

import llvmlite.binding as llvm
import numpy as np
from numba import types

from .compiling import njit_cached

# The CBLAS names of NumPy's OpenBLAS builds with 64-bit integers (ILP64):
# NumPy 2's scipy-openblas64, then NumPy 1.22-1.26's openblas64_.
_SYMBOLS = {"sgemm": ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
            "dgemm": ("scipy_cblas_dgemm64_", "cblas_dgemm64_"),
            "sgemv": ("scipy_cblas_sgemv64_", "cblas_sgemv64_"),
            "dgemv": ("scipy_cblas_dgemv64_", "cblas_dgemv64_")}
# OpenBLAS's process-wide thread count, read and set
_THREAD_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                   ("openblas_get_num_threads64_", "openblas_set_num_threads64_"))
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_thread_count = None  # (get, set) ctypes functions, where bound
_run_on_pool = None  # OpenBLAS's gotoblas_pthread, where bound
_parts_lock = threading.Lock()  # the thread count is process-wide: one run_parts at a time


def pool_bound():
    """Whether OpenBLAS's thread pool (gotoblas_pthread) is bound."""
    return _run_on_pool is not None


def parts_lock():
    """The lock held while parts run on BLAS's threads (one job at a time)."""
    return _parts_lock




def _numpy_blas_libraries():
    """The OpenBLAS shared libraries bundled with NumPy's wheels."""
    root = os.path.dirname(np.__file__)
    found = []
    for folder in (os.path.join(root, os.pardir, "numpy.libs"), os.path.join(root, ".dylibs")):
        found += sorted(glob.glob(os.path.join(folder, "*openblas*")))
    return found


def _bind():
    """Register ``numbackend_sgemm``, ``_dgemm``, ``_sgemv`` and ``_dgemv``; True when
    all are."""
    for path in _numpy_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        addresses = {}
        for routine, names in _SYMBOLS.items():
            for name in names:
                function = getattr(lib, name, None)
                if function is not None:
                    addresses[routine] = ctypes.cast(function, ctypes.c_void_p).value
                    break
        if len(addresses) == len(_SYMBOLS):
            for routine, address in addresses.items():
                llvm.add_symbol(f"numbackend_{routine}", address)
            _bind_thread_count(lib)
            return True
    return False


def _follow_numbackend_threads(get, set_):
    """Size OpenBLAS's pool, whose threads run numbackend's parts, to numbackend's
    thread count (NUMBACKEND_NUM_THREADS: the CPUs the process may use, or the
    user's choice): fewer threads where NumPy loaded OpenBLAS before numbackend
    could set its environment; more where OpenBLAS held itself to the CPUs it
    found (it counts them, not the variable) or NumPy loaded first, unless
    OpenBLAS's own variable asks for another count."""
    limit = os.environ.get("NUMBACKEND_NUM_THREADS", "")
    if not limit.isdigit() or int(limit) < 1:
        return
    own = os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    if int(limit) < get() or (int(limit) > get() and own in (None, limit)):
        set_(int(limit))  # OpenBLAS holds it to the most it was built for


def _bind_thread_count(lib):
    global _thread_count, _run_on_pool
    for get_name, set_name in _THREAD_SYMBOLS:
        get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
        if get is not None and set_ is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            _thread_count = (get, set_)
            _follow_numbackend_threads(get, set_)
            break
    run = getattr(lib, "gotoblas_pthread", None)
    if run is not None and _thread_count is not None:
        # (number of calls, function, first argument, argument step)
        run.restype, run.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_int]
        _run_on_pool = run
        # for jit_kernels.parts.run_compiled, linked by name like the products
        for name, function in (("run_on_pool", run), ("threads", _thread_count[0]),
                               ("set_threads", _thread_count[1])):
            llvm.add_symbol(f"numbackend_{name}", ctypes.cast(function, ctypes.c_void_p).value)


AVAILABLE = _bind()

# What jit_kernels.parts.run_on_pool keeps between runs, read and written by
# compiled code through the symbol numbackend_pool_state: [0] the
# CLOCK_MONOTONIC time in ns until which parts run on the calling thread
# alone, [1] the address of the compiled part that times each part, [2] how
# many runs in a row found a thread late.  An array of this module's, so its
# address holds for the process.
pool_state = np.zeros(3, np.int64)
llvm.add_symbol("numbackend_pool_state", pool_state.ctypes.data)
_libc = ctypes.CDLL(None)
llvm.add_symbol("numbackend_clock_gettime", ctypes.cast(_libc.clock_gettime, ctypes.c_void_p).value)
llvm.add_symbol("numbackend_sched_yield", ctypes.cast(_libc.sched_yield, ctypes.c_void_p).value)


def threads():
    """How many parts :func:`parts.run_parts` runs at once: OpenBLAS's thread count
    (0 where its threads cannot be used)."""
    return _thread_count[0]() if _run_on_pool is not None else 0


@contextlib.contextmanager
def one_thread():
    """OpenBLAS's products on the calling thread alone for the ``with`` block."""
    get, set_ = _thread_count
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)


def _gemm_type(scalar):
    i32, i64, ptr = types.int32, types.int64, types.voidptr
    return types.void(i32, i32, i32, i64, i64, i64, scalar, ptr, i64, ptr, i64, scalar, ptr, i64)


def _gemv_type(scalar):
    i32, i64, ptr = types.int32, types.int64, types.voidptr
    return types.void(i32, i32, i64, i64, scalar, ptr, i64, ptr, i64, scalar, ptr, i64)


_sgemm = types.ExternalFunction("numbackend_sgemm", _gemm_type(types.float32))
_dgemm = types.ExternalFunction("numbackend_dgemm", _gemm_type(types.float64))
_sgemv = types.ExternalFunction("numbackend_sgemv", _gemv_type(types.float32))
_dgemv = types.ExternalFunction("numbackend_dgemv", _gemv_type(types.float64))


@njit_cached()
def _dims(a, b, out, transpose_a, transpose_b):
    """(m, n, k) of out = op(a) @ op(b), checked: BLAS would read past a wrong size."""
    m, k = (a.shape[1], a.shape[0]) if transpose_a else (a.shape[0], a.shape[1])
    k_b, n = (b.shape[1], b.shape[0]) if transpose_b else (b.shape[0], b.shape[1])
    if k != k_b or out.shape[0] != m or out.shape[1] != n:
        raise ValueError("jit_kernels.blas: the shapes of a product do not match")
    if a.itemsize != b.itemsize or a.itemsize != out.itemsize:
        raise ValueError("jit_kernels.blas: the operands of a product differ in type")
    return m, n, k


@njit_cached()
def matmul(a, b, out, transpose_a, transpose_b):
    """out[...] = op(a) @ op(b) for C-contiguous float32 or float64 matrices of one
    type, op transposing where asked."""
    m, n, k = _dims(a, b, out, transpose_a, transpose_b)
    if k == 0:  # BLAS rejects the zero leading dimensions of empty operands
        out[:] = 0
    if m == 0 or n == 0 or k == 0:
        return
    if m == 1:  # out's row = op(b)^T @ a's k elements (contiguous, transposed or not)
        _matrix_times_vector(b, not transpose_b, a, out)
    elif n == 1:  # out's column = op(a) @ b's k elements
        _matrix_times_vector(a, transpose_a, b, out)
    else:
        _general_product(a, b, out, transpose_a, transpose_b, m, n, k)


@njit_cached()
def _matrix_times_vector(matrix, transpose, vector, out):
    """out's elements = op(matrix) @ vector's: BLAS's gemm would treat a product with
    one row or column as a general one, far slower than its gemv."""
    rows, cols = matrix.shape
    op = _TRANS if transpose else _NO_TRANS
    if matrix.itemsize == 4:
        _sgemv(_ROW_MAJOR, op, rows, cols, 1.0, matrix.ctypes, cols, vector.ctypes, 1, 0.0,
               out.ctypes, 1)
    else:
        _dgemv(_ROW_MAJOR, op, rows, cols, 1.0, matrix.ctypes, cols, vector.ctypes, 1, 0.0,
               out.ctypes, 1)


@njit_cached()
def _general_product(a, b, out, transpose_a, transpose_b, m, n, k):
    op_a = _TRANS if transpose_a else _NO_TRANS
    op_b = _TRANS if transpose_b else _NO_TRANS
    lda, ldb = a.shape[1], b.shape[1]
    if a.itemsize == 4:
        _sgemm(_ROW_MAJOR, op_a, op_b, m, n, k, 1.0, a.ctypes, lda, b.ctypes, ldb, 0.0, out.ctypes, n)
    else:
        _dgemm(_ROW_MAJOR, op_a, op_b, m, n, k, 1.0, a.ctypes, lda, b.ctypes, ldb, 0.0, out.ctypes, n)
