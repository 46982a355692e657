"""Compiled work split into parts run at once on OpenBLAS's threads, without Python.

:func:`blas.run_parts` runs Python callables on BLAS's threads; each part then
takes the GIL between its compiled calls, and on a 2-core VM a run of two
empty parts cost 29 us, as much as half of mnist_cnn's second convolution at
batch 1.  Here a part is a Numba C callback (:func:`compiled_part`) reading
its arguments from a row of int64 numbers (array addresses and sizes, see
:func:`array_at`); OpenBLAS's pool calls it directly, and two empty parts
cost 3 us.  The parts run on BLAS's own threads for the reason run_parts
does: Numba's threads, woken while OpenBLAS's still spin after a product,
waited 2-12 ms for a core.
"""
import ctypes
import functools

import numpy as np
from numba import carray, types
from numba.core.caching import FunctionCache
from numba.core.ccallback import CFunc
from numba.extending import intrinsic

from . import _LoadWithoutRegistries, blas, njit_cached

_PART_SIGNATURE = types.void(types.CPointer(types.int64))


@intrinsic
def _pointer(typingctx, address, dtype):
    """A pointer to items of the NumPy scalar type ``dtype`` at the int ``address``."""
    signature = types.CPointer(dtype.dtype)(address, dtype)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
    return signature, codegen


@njit_cached(inline='always')
def array_at(address, shape, dtype):
    """The C-contiguous array of ``shape`` (a tuple) and ``dtype`` whose data lie
    at ``address`` (an ``array.ctypes.data`` of a descriptor)."""
    return carray(_pointer(address, dtype), shape)


@njit_cached()
def address(a):
    """The address of an array's data (``a.ctypes.data`` takes 3 us in Python)."""
    return a.ctypes.data


def compiled_part(function):
    """``function(descriptor)``, a Python function of one pointer to int64
    numbers, as a Numba C callback for :func:`run`: a function returning
    (callback address, ctypes callable), which compiles it on its first call
    (or loads it from the disk cache, like the other kernels).  Nothing may
    raise in the callback: a C callback cannot pass an exception on, so
    callers check their arguments before a run."""
    @functools.cache
    def compile_once():
        callback = CFunc(function, (_PART_SIGNATURE.args, _PART_SIGNATURE.return_type), {},
                         {'nogil': True})
        callback.enable_caching()
        if type(callback._cache) is FunctionCache:
            callback._cache.__class__ = _LoadWithoutRegistries
        callback.compile()
        return callback.address, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(callback.address)
    return compile_once


def run(part, descriptors):
    """``part(row)`` (a :func:`compiled_part`) for each row of the int64 matrix
    ``descriptors``: at once on OpenBLAS's threads (the first row on the
    calling thread) where it has as many, else one after another on the
    calling thread.  The arrays the rows point into must outlive the call.
    Not from inside a part of :func:`blas.run_parts`, whose lock this takes too."""
    address, function = part()
    descriptors = np.ascontiguousarray(descriptors, np.int64)
    count = descriptors.shape[0]
    if 1 < count <= blas.threads():
        with blas._parts_lock:  # one job on the pool at a time, as run_parts
            blas._run_on_pool(count, address, descriptors.ctypes.data, descriptors.strides[0])
        return
    for i in range(count):
        function(descriptors[i].ctypes.data)
