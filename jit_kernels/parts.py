"""Compiled work split into parts run at once on OpenBLAS's threads, without Python.

:func:`run_parts` runs Python callables on BLAS's threads; each part then
takes the GIL between its compiled calls, which for small work (a batch-1
convolution) costs as much as the work.  Here a part is a Numba C callback
(:func:`compiled_part`) reading its arguments from a row of int64 numbers
(array addresses and sizes, see :func:`array_at`); OpenBLAS's pool calls it
directly, at a fraction of that cost.  The parts run on BLAS's own threads for
the reason run_parts does: Numba's threads, woken while OpenBLAS's still spin
after a product, waited milliseconds for a core (PERFORMANCE.md, W4: compiled
parts).
"""
import ctypes
import functools
import time

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba.core import cgutils
from numba.core.ccallback import CFunc
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from . import blas, machine, tuning
from .compiling import install_cache, njit_cached
from .fork import fork_gate

_PART_SIGNATURE = types.void(types.CPointer(types.int64))


# machine.part_count for compiled code (the parts' descriptors are laid out there)
part_count = njit_cached(inline='always')(machine.part_count)


@intrinsic
def array_at(typingctx, address, shape, dtype):
    """The C-contiguous array of ``shape`` (a tuple of ints, or an int) and ``dtype`` (a
    NumPy scalar type, or an array's dtype) whose data lie at the int ``address`` (an
    ``array.ctypes.data`` of a descriptor).  Built in place, as a few
    instructions: numba.carray's code, at each of a block's dozens of arrays,
    was most of the block's compile."""
    one_dim = isinstance(shape, types.Integer)
    if not (isinstance(address, types.Integer)
            and (one_dim or isinstance(shape, types.BaseTuple)
                 and all(isinstance(d, types.Integer) for d in shape))
            and isinstance(dtype, (types.NumberClass, types.DType))):
        return None
    array_type = types.Array(dtype.dtype, 1 if one_dim else len(shape), "C")

    def codegen(context, builder, sig, args):
        item = context.get_data_type(array_type.dtype)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(item))
        if one_dim:
            dims = [context.cast(builder, args[1], sig.args[1], types.intp)]
        else:
            dims = [context.cast(builder, value, given, types.intp)
                    for value, given in zip(cgutils.unpack_tuple(builder, args[1]), sig.args[1])]
        strides, stride = [], itemsize
        for dim in reversed(dims):
            strides.insert(0, stride)
            stride = builder.mul(stride, dim)
        array = context.make_array(array_type)(context, builder)
        populate_array(array, data=builder.inttoptr(args[0], item.as_pointer()), shape=dims,
                       strides=strides, itemsize=itemsize, meminfo=None)
        return array._getvalue()
    return array_type(address, shape, dtype), codegen


@njit_cached()
def address(a):
    """The address of an array's data (``a.ctypes.data`` is slow in Python: it
    builds a ctypes object)."""
    return a.ctypes.data


@intrinsic
def _call_part(typingctx, address, descriptor):
    """Call the compiled part at the int ``address`` with the data of the int64
    array ``descriptor``: an indirect call, so that code calling parts chosen
    at run time is cached like any other."""
    signature = types.void(address, descriptor)

    def codegen(context, builder, sig, args):
        row = context.make_array(sig.args[1])(context, builder, args[1])
        part_type = ir.FunctionType(ir.VoidType(), [ir.IntType(64).as_pointer()])
        builder.call(builder.inttoptr(args[0], part_type.as_pointer()), [row.data])
        return context.get_dummy_value()
    return signature, codegen


def compiled_part(function):
    """``function(descriptor)``, a Python function of one pointer to int64
    numbers, as a Numba C callback for :func:`run`: a function returning
    (callback address, ctypes callable), which compiles it on its first call
    (or loads it from the disk cache, like the other kernels, where it has a
    source file).  Nothing may raise in the callback: a C callback cannot pass
    an exception on, so callers check their arguments before a run."""
    @functools.cache
    def compile_once():
        callback = CFunc(function, (_PART_SIGNATURE.args, _PART_SIGNATURE.return_type), {},
                         {'nogil': True})
        install_cache(callback, function)
        callback.compile()
        compile_once.callback = callback
        return callback.address, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(callback.address)
    compile_once.part_function = function  # for jit_kernels.manifest
    return compile_once


def run(part, descriptors):
    """``part(row)`` (a :func:`compiled_part`) for each row of the int64 matrix
    ``descriptors``: at once on OpenBLAS's threads (the first row on the
    calling thread) where it has as many, else one after another on the
    calling thread.  The arrays the rows point into must outlive the call.
    Not from inside a part of :func:`run_parts`, whose lock this takes too."""
    address, function = part()
    descriptors = np.ascontiguousarray(descriptors, np.int64)
    count = descriptors.shape[0]
    if 1 < count <= blas.threads():
        fork_gate.enter()
        try:
            with blas.parts_lock():  # one job on the pool at a time, as run_parts
                run_on_pool(count, address, descriptors.ctypes.data, descriptors.strides[0])
        finally:
            fork_gate.leave()
        return
    for i in range(count):
        function(descriptors[i].ctypes.data)


_run_on_pool = types.ExternalFunction("numbackend_run_on_pool",
                                      types.intc(types.intc, types.voidptr, types.voidptr, types.intc))
_pool_threads = types.ExternalFunction("numbackend_threads", types.intc())
_set_pool_threads = types.ExternalFunction("numbackend_set_threads", types.void(types.intc))


@intrinsic
def _void_pointer(typingctx, address):
    """The int ``address`` as a void pointer."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(address), codegen


@njit_cached(nogil=True)
def threads_from_compiled():
    """:func:`blas.threads` for compiled code, where :func:`pool_from_compiled`."""
    return _pool_threads()


@njit_cached(nogil=True)
def run_compiled(part_address, descriptors, arrays):
    """:func:`run` from compiled code: the part at ``part_address`` (a
    :func:`compiled_part`'s) for each row of the C-contiguous int64 matrix
    ``descriptors``.  ``arrays``: a tuple of the arrays the rows point into,
    an argument so that the caller holds them until the parts are done (Numba
    frees a variable after its last use).  Only where
    :func:`pool_from_compiled` is true, and with ``blas.parts_lock()`` held by
    the Python code that made the call."""
    count = descriptors.shape[0]
    if 1 < count <= _pool_threads():
        run_on_pool(count, part_address, descriptors.ctypes.data, descriptors.shape[1] * 8)
        return
    for i in range(count):
        _call_part(part_address, descriptors[i])




@intrinsic
def _pool_state(typingctx):
    """The address of blas.pool_state (the symbol numbackend_pool_state)."""
    def codegen(context, builder, sig, args):
        state = builder.module.globals.get("numbackend_pool_state")
        if state is None:
            state = ir.GlobalVariable(builder.module, ir.ArrayType(ir.IntType(64), 3),
                                      "numbackend_pool_state")
            state.linkage = "external"
        return builder.ptrtoint(state, ir.IntType(64))
    return types.int64(), codegen


_clock_gettime = types.ExternalFunction("numbackend_clock_gettime",
                                        types.intc(types.intc, types.voidptr))


@njit_cached(inline='always')
def now_ns():
    """CLOCK_MONOTONIC in ns (time.monotonic_ns's clock)."""
    spec = np.empty(2, np.int64)
    _clock_gettime(1, spec.ctypes)
    return spec[0] * 1_000_000_000 + spec[1]


@intrinsic
def _call_at(typingctx, function, argument):
    """Call the ``void (void *)`` function at the int ``function`` with the int
    ``argument`` as its pointer."""
    def codegen(context, builder, sig, args):
        part_type = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
        builder.call(builder.inttoptr(args[0], part_type.as_pointer()),
                     [builder.inttoptr(args[1], ir.IntType(8).as_pointer())])
        return context.get_dummy_value()
    return types.void(function, argument), codegen


def _timed_part(d):
    """The part d[0] of argument d[1], its start and end times written to d[2], d[3]."""
    row = carray(d, 4)
    row[2] = now_ns()
    _call_at(row[0], row[1])
    row[3] = now_ns()


_timed = compiled_part(_timed_part)
blas.pool_state[1] = _timed()[0]


@njit_cached(nogil=True)
def run_on_pool(count, function, arguments, step):
    """``function(arguments + i * step)`` for i in 0..count-1 (``function`` the
    address of a ``void (void *)`` function), at once on OpenBLAS's threads, or
    one after another on the calling thread for a while after runs found a
    thread late: a run whose last thread started its part more than
    ``tuning.PARTS_LATE_START_NS`` after the run began, and later than the
    calling thread took for its own part, had a thread that was not running
    (another process had its core); after ``tuning.PARTS_LATE_RUNS`` such runs
    in a row the parts run on the calling thread alone for
    ``tuning.PARTS_CONTENDED_SERIAL_NS``.  The same parts either way, so the same
    results.  Under blas.parts_lock()."""
    state = array_at(_pool_state(), (3,), np.int64)
    start = now_ns()
    if start < state[0]:
        # the products inside the parts on this thread too: OpenBLAS's threads
        # would wait for the busy core as the pool's did (same results)
        threads = _pool_threads()
        _set_pool_threads(1)
        for i in range(count):
            _call_at(function, arguments + i * step)
        _set_pool_threads(threads)
        return
    timing = np.empty((count, 4), np.int64)
    for i in range(count):
        timing[i, 0], timing[i, 1] = function, arguments + i * step
    _run_on_pool(count, _void_pointer(state[1]), timing.ctypes, 32)
    own = timing[0, 3] - timing[0, 2]  # the calling thread's part
    latest = start
    for i in range(1, count):
        latest = max(latest, timing[i, 2])
    if latest - start <= max(tuning.PARTS_LATE_START_NS, own):
        state[2] = 0
        return
    state[2] += 1
    if state[2] >= tuning.PARTS_LATE_RUNS:
        state[0] = now_ns() + tuning.PARTS_CONTENDED_SERIAL_NS
        state[2] = 0


# runs in a row of threads sharing a scan's steps that found a thread without its core
_late_shared_runs = 0


def note_shared_run(long_waits, elapsed_ns, steps):
    """After a run of threads sharing a scan's ``steps`` steps
    (steps.run_steps_shared), which took ``elapsed_ns``: where a thread waited
    longer than ``tuning.PARTS_LATE_START_NS`` for another's task (``long_waits``
    such waits) in steps that took less than that on average, that thread had
    lost its core; after ``tuning.PARTS_LATE_RUNS`` such runs in a row, parts
    run on the calling thread alone for ``tuning.PARTS_CONTENDED_SERIAL_NS``,
    as after late starts (:func:`run_on_pool`): a shared run then runs every
    task in its first call."""
    global _late_shared_runs
    if long_waits == 0 or elapsed_ns >= steps * tuning.PARTS_LATE_START_NS:
        _late_shared_runs = 0
        return
    _late_shared_runs += 1
    if _late_shared_runs >= tuning.PARTS_LATE_RUNS:
        blas.pool_state[0] = time.monotonic_ns() + tuning.PARTS_CONTENDED_SERIAL_NS
        _late_shared_runs = 0


# The Python job of the run_parts under way: (part, results, errors), under
# blas.parts_lock()
_job = None


def _run_job(argument):
    part, results, errors = _job
    index = argument or 0
    try:
        results[index] = part(index)
    except BaseException as exc:  # noqa: BLE001 - raised again in the calling thread
        errors[index] = exc


# One callback for every run_parts: a ctypes callback made per call sits in a
# reference cycle, so what its part refers to (arrays of megabytes) lived on
# until the garbage collector ran, and malloc handed the next arrays fresh
# pages, faulted in at every call (PERFORMANCE.md, memory and allocation).
_run_job_callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_run_job)
_run_job_address = ctypes.cast(_run_job_callback, ctypes.c_void_p)



def run_parts(count, part):
    """``[part(0), ..., part(count - 1)]``, run at once on OpenBLAS's own threads
    (``part(0)`` on the calling thread), every product inside them on its
    calling thread alone.  ``count`` is at most :func:`blas.threads`.

    The parts run on BLAS's threads rather than on threads of their own: after a
    product OpenBLAS's threads spin for a while, and on a machine with as many
    threads as cores they would take the cores from any other threads."""
    if not 1 <= count <= blas.threads():
        raise ValueError(f"jit_kernels.parts.run_parts: cannot run {count} parts on "
                         f"{blas.threads()} BLAS threads")
    global _job
    results, errors = [None] * count, [None] * count
    fork_gate.enter()
    try:
        with blas.parts_lock(), blas.one_thread():
            _job = (part, results, errors)
            try:
                run_on_pool(count, _run_job_address.value, 0, 1)
            finally:
                _job = None
    finally:
        fork_gate.leave()
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def row_part_count(work, rows):
    """How many parts of ``rows`` rows (each at least one) a fused kernel's
    ``work`` splits into on OpenBLAS's threads (:func:`run_rows`), each with
    ``tuning.PARTS_MIN_WORK`` at least; 0 where the pool cannot be used."""
    threads = blas.threads()
    return threads and machine.part_count(work, threads, tuning.PARTS_MIN_WORK, rows)


def addresses(arrays):
    """The data addresses of ``arrays``, or None where one is not C-contiguous."""
    found = []
    for a in arrays:
        if not a.flags.c_contiguous:
            return None
        found.append(address(a))
    return found


def run_rows(part, count, rows, numbers):
    """``part`` (a :func:`compiled_part`) on ``count`` parts of the rows [0, rows)
    at once (:func:`run`), each reading the descriptor [first row, end row,
    *numbers]."""
    descriptors = np.empty((count, 2 + len(numbers)), np.int64)
    edges = [rows * i // count for i in range(count + 1)]
    descriptors[:, 0] = edges[:-1]
    descriptors[:, 1] = edges[1:]
    descriptors[:, 2:] = numbers
    run(part, descriptors)


def pool_from_compiled():
    """Whether compiled code can call :func:`run_compiled` and
    :func:`threads_from_compiled` (OpenBLAS's pool is bound)."""
    return blas.pool_bound()


# An epilogue's descriptor (see CompiledEpilogue): the part's address, the
# block's rows and columns, the block's and the output's addresses, the items
# from one row to the next in the block and in the output, the block's first
# column among the epilogue's row vectors, then the epilogue's own numbers.
EPILOGUE_HEAD = 8


# an empty epilogue template: no compiled epilogue
NO_EPILOGUE = np.zeros(0, np.int64)


class EpilogueMismatch(ValueError):
    """An epilogue compiled for other columns than a block has."""


class CompiledEpilogue:
    """An ``epilogue(block, out)`` of the library kernels (see
    jit_kernels.conv.conv_forward) as a compiled part, which compiled code
    calls on its blocks without Python (:func:`run_epilogue`).

    ``part`` is a :func:`compiled_part` reading the descriptor laid out by
    :data:`EPILOGUE_HEAD`: rows and columns; the block and the output, two
    (rows, columns) arrays of ``dtype`` apart, each with its rows' distance
    in items (:func:`run_epilogue_rows`); the first column, from which the
    block's columns read the row vectors; then
    ``numbers`` (the addresses of its other inputs, which ``keep`` holds
    alive).  ``widths``: the column counts its inputs take (the lengths of
    its row vectors), each block's columns among them."""

    def __init__(self, part, dtype, numbers, keep=(), widths=()):
        self.template = np.zeros(EPILOGUE_HEAD + len(numbers), np.int64)
        self.template[0] = part()[0]
        self.template[EPILOGUE_HEAD:] = numbers
        self.dtype = np.dtype(dtype)
        self.keep = keep
        self.widths = set(widths)

    def check(self, columns, dtype):
        """Raise :class:`EpilogueMismatch` unless blocks of ``columns`` values of
        ``dtype`` fit."""
        if dtype != self.dtype or self.widths and (len(self.widths) > 1 or columns not in self.widths):
            raise EpilogueMismatch(f"an epilogue for rows of {sorted(self.widths)} {self.dtype} "
                                   f"values called on rows of {columns} {np.dtype(dtype)}")

    def __call__(self, block, out):
        self.check(block.shape[1], block.dtype)
        if not (block.flags.c_contiguous and out.flags.c_contiguous and block.shape == out.shape
                and out.dtype == block.dtype and block.ndim == 2):
            raise ValueError("CompiledEpilogue: the block and out must be C-contiguous 2-D arrays "
                             f"of one shape and type, got {block.shape} {block.dtype} and "
                             f"{out.shape} {out.dtype}")
        run_epilogue(self.template, block, out)


@njit_cached(inline='always')
def _epilogue_on(template, block, out, first_column):
    """The epilogue of ``template`` from ``block`` into ``out``, with a
    descriptor of its own laid out by :data:`EPILOGUE_HEAD`."""
    descriptor = template.copy()
    descriptor[1], descriptor[2] = block.shape[0], block.shape[1]
    descriptor[3], descriptor[4] = block.ctypes.data, out.ctypes.data
    descriptor[5], descriptor[6] = block.strides[0] // block.itemsize, out.strides[0] // out.itemsize
    descriptor[7] = first_column
    _call_part(descriptor[0], descriptor)


@njit_cached(nogil=True)
def run_epilogue(template, block, out):
    """The epilogue of ``template`` (a :class:`CompiledEpilogue`'s) from ``block``
    into ``out``, C-contiguous (rows, columns) arrays of its type.  From
    compiled code too: each call has its own descriptor."""
    _epilogue_on(template, block, out, 0)


@njit_cached(nogil=True)
def run_epilogue_rows(template, block, out, first_column):
    """:func:`run_epilogue` from ``block`` into ``out``, (rows, columns) arrays
    of its type apart whose rows are contiguous (``out`` a part's columns of
    a larger array, as a part of a product writes them); their columns are
    the epilogue's row vectors' from ``first_column`` on."""
    _epilogue_on(template, block, out, first_column)
