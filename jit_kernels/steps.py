"""A scan's loop over time run by one precompiled loop: step functions called
through their addresses, no code compiled per model.

Compiled code pays for every call it makes: Numba lowers each call site with
its result and error path, and LLVM optimises them, some milliseconds each, so
a scan loop generated with its step's 60 calls took seconds to compile
(ARCHITECTURE.md, Keeping compiles short).  Here the loop is data:

- a step is a list of *blocks*, each a compiled function of one argument, a
  row of int64 numbers (its *descriptor*: array addresses and sizes), called
  through its address by :func:`run_steps`, with Numba's calling convention,
  so that an exception raised in a block reaches the caller;
- before each step, :func:`run_steps` writes the addresses that move with the
  step (a sequence's slice, a stacked output's, and a state's, which alternates
  between two arrays: one step's new state is the next one's state) into the
  descriptors: ``descriptors[row, column] = base + t * stride + (t % 2) *
  flip`` for each row of ``moving``.

:func:`run_steps_shared` runs the steps from several threads at once, each
step's blocks made in parts (one per thread) and grouped into tasks that the
threads claim in order (numbackend/scan_blocks.py makes them).

The blocks of the library are here (:func:`product_block`, :func:`copy_block`):
each compiles once, into the package's seed.  A fused kernel's block is its
module's ``STEP_BLOCK`` (numbackend/codegen.py).  :func:`block_address` is the
address to call one at.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import blas, packed, tuning
from .compiling import njit_cached
from .parts import array_at, now_ns

# The one argument of a block, as Numba types it: a row of a C-contiguous
# int64 matrix.
BLOCK_ARGUMENT = (types.Array(types.int64, 1, "C"),)

# A product's descriptor, by column: a's address, then out's rows and the
# depth; b's address, then its rows and columns; whether b is transposed; b's
# panels' address (packed.pack) or 0, then their count; out's address; whether
# a is transposed; the first panel and the end of the panels computed (an end
# of -1: all; else out's columns of those panels only, a part of a shared run).
PRODUCT_A, PRODUCT_B, PRODUCT_TRANSPOSE_B, PRODUCT_PANELS, PRODUCT_OUT, PRODUCT_TRANSPOSE_A = (
    0, 3, 6, 7, 9, 10)
PRODUCT_PANEL_RANGE = 11
PRODUCT_WIDTH = 13
# A copy's descriptor, by column: from, to, then the lines, the bytes a line,
# and the lines' distances there and here.
COPY_FROM, COPY_TO, COPY_LINES = 0, 1, 2


def _block_call(context, builder, descriptor_type, address, descriptor):
    """The call of the block at ``address`` with ``descriptor``: its status."""
    function_type = context.call_conv.get_function_type(types.none, [descriptor_type])
    function = builder.inttoptr(address, function_type.as_pointer())
    status, _ = context.call_conv.call_function(builder, function, types.none, [descriptor_type],
                                                [descriptor])
    return status


@intrinsic
def _call_block(typingctx, address, descriptor):
    """Call the block at the int ``address`` (a function compiled by Numba for
    :data:`BLOCK_ARGUMENT`, returning nothing) with ``descriptor``; an
    exception it raises is raised here."""
    def codegen(context, builder, sig, args):
        status = _block_call(context, builder, descriptor, *args)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()
    return types.none(address, descriptor), codegen


@njit_cached(nogil=True)
def run_steps(first, stop, steps, reverse, blocks, descriptors, moving):
    """Steps first..stop-1 of a scan of ``steps`` (counted from the last where
    ``reverse``): each calls the blocks at the addresses ``blocks`` in order,
    block k with row k of ``descriptors``, after writing each row (row,
    column, base, stride, flip) of ``moving`` as ``descriptors[row, column] =
    base + t * stride + (t % 2) * flip``, t the step's index in the sequences."""
    for n in range(first, stop):
        t = steps - 1 - n if reverse else n
        for m in range(moving.shape[0]):
            descriptors[moving[m, 0], moving[m, 1]] = (moving[m, 2] + t * moving[m, 3]
                                                       + (t & 1) * moving[m, 4])
        for k in range(blocks.shape[0]):
            _call_block(blocks[k], descriptors[k])


# The counters of run_steps_shared, each on a cache line of its own: the
# next task to claim, the tasks done, whether a block raised, and how many
# waits took longer than tuning.PARTS_LATE_START_NS.
SHARED_CLAIMED, SHARED_DONE, SHARED_FAILED, SHARED_LONG_WAITS = 0, 8, 16, 24
SHARED_COUNTERS = 32
# A task's row in run_steps_shared: its calls (rows of ``calls``), its moving
# addresses (rows of ``moving``), and the tasks of its step done before it starts.
TASK_CALLS, TASK_MOVES, TASK_AFTER = 0, 2, 4
TASK_WIDTH = 5

_sched_yield = types.ExternalFunction("numbackend_sched_yield", types.intc())


@intrinsic
def _fetch_add(typingctx, counters, index, value):
    """``counters[index] += value`` as one atomic operation; the value before."""
    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, sig.args[0], array, [args[1]])
        return builder.atomic_rmw("add", pointer, args[2], "seq_cst")
    return types.int64(counters, index, types.int64), codegen


@intrinsic
def _load_acquire(typingctx, counters, index):
    """``counters[index]``, read after every write made before the write of it read."""
    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, sig.args[0], array, [args[1]])
        return builder.load_atomic(pointer, "acquire", 8)
    return types.int64(counters, index), codegen


@intrinsic
def _pause(typingctx):
    """The CPU's spin-wait hint (x86's pause)."""
    def codegen(context, builder, sig, args):
        pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                               "llvm.x86.sse2.pause")
        builder.call(pause, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _call_block_or_fail(typingctx, address, descriptor, counters):
    """:func:`_call_block`, which first marks ``counters[SHARED_FAILED]`` where
    the block raised, so that the threads waiting for its task stop."""
    def codegen(context, builder, sig, args):
        status = _block_call(context, builder, descriptor, args[0], args[1])
        with cgutils.if_unlikely(builder, status.is_error):
            array = context.make_array(sig.args[2])(context, builder, args[2])
            pointer = cgutils.get_item_pointer(context, builder, sig.args[2], array,
                                               [context.get_constant(types.intp, SHARED_FAILED)])
            builder.store_atomic(context.get_constant(types.int64, 1), pointer, "release", 8)
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()
    return types.none(address, descriptor, counters), codegen


@njit_cached(nogil=True)
def run_steps_shared(first, stop, steps, reverse, blocks, descriptors, moving, calls, tasks,
                     counters):
    """:func:`run_steps` by several threads at once, each calling this with the
    same arguments: steps first..stop-1, each a list of tasks (rows of
    ``tasks``, see :data:`TASK_CALLS`), which the threads claim in order.  A
    task calls the blocks of its rows of ``calls`` (rows of ``blocks`` and
    ``descriptors``) after writing its rows of ``moving``, once the tasks of
    its step before its ``TASK_AFTER`` are done (and every task of the steps
    before).  The tasks between two such points must touch apart what they
    write (a product's columns, a kernel's rows).

    A thread waits only for tasks that other threads have claimed and run:
    threads that start late find their work done, and the calls one after
    another on one thread run every task.  ``counters``: int64, zeros, of
    :data:`SHARED_COUNTERS`; where a block raises, the others stop at their
    next wait and the exception is raised by its thread's call.  A wait longer
    than ``tuning.PARTS_LATE_START_NS`` is counted (a thread running a task
    lost its core: parts.note_shared_run)."""
    per_step = tasks.shape[0]
    total = (stop - first) * per_step
    spins = 0
    while True:
        claimed = _fetch_add(counters, SHARED_CLAIMED, 1)
        if claimed >= total:
            return
        n = claimed // per_step
        task = claimed - n * per_step
        after = n * per_step + tasks[task, TASK_AFTER]
        waiting_since = 0  # from the wait's first yield: a short wait reads no clock
        while _load_acquire(counters, SHARED_DONE) < after:
            if _load_acquire(counters, SHARED_FAILED) != 0:
                return
            spins += 1
            if spins & 63 == 0:
                if waiting_since == 0:
                    waiting_since = now_ns()
                _sched_yield()  # a thread we wait for may have no core
            else:
                _pause()
        if waiting_since != 0 and now_ns() - waiting_since > tuning.PARTS_LATE_START_NS:
            _fetch_add(counters, SHARED_LONG_WAITS, 1)
        n += first
        t = steps - 1 - n if reverse else n
        for m in range(tasks[task, TASK_MOVES], tasks[task, TASK_MOVES + 1]):
            descriptors[moving[m, 0], moving[m, 1]] = (moving[m, 2] + t * moving[m, 3]
                                                       + (t & 1) * moving[m, 4])
        for c in range(tasks[task, TASK_CALLS], tasks[task, TASK_CALLS + 1]):
            _call_block_or_fail(blocks[calls[c]], descriptors[calls[c]], counters)
        _fetch_add(counters, SHARED_DONE, 1)


@njit_cached(nogil=True)
def _product(d, dtype):
    """The product of descriptor ``d`` (see :data:`PRODUCT_A`) of ``dtype`` items."""
    m, k = d[PRODUCT_A + 1], d[PRODUCT_A + 2]
    transpose_a, transpose_b = d[PRODUCT_TRANSPOSE_A] != 0, d[PRODUCT_TRANSPOSE_B] != 0
    a = array_at(d[PRODUCT_A], (k, m) if transpose_a else (m, k), dtype)
    b = array_at(d[PRODUCT_B], (d[PRODUCT_B + 1], d[PRODUCT_B + 2]), dtype)
    out = array_at(d[PRODUCT_OUT], (m, b.shape[0] if transpose_b else b.shape[1]), dtype)
    if d[PRODUCT_PANELS] != 0:
        width = packed.panel_width(out.itemsize)
        panels = array_at(d[PRODUCT_PANELS], (d[PRODUCT_PANELS + 1], k, width), dtype)
        first, end = d[PRODUCT_PANEL_RANGE], d[PRODUCT_PANEL_RANGE + 1]
        if end < 0:
            packed.matmul_packed(a, panels, out)
        else:
            packed.matmul_packed_panels(a, panels, out, first, end)
    else:
        blas.matmul(a, b, out, transpose_a, transpose_b)


@njit_cached(nogil=True)
def product_block_float32(d):
    """A block: ``out = op(a) @ op(b)`` of float32 matrices, C-contiguous, on
    b's packed panels where given (see :data:`PRODUCT_A`)."""
    _product(d, np.float32)


@njit_cached(nogil=True)
def product_block_float64(d):
    """:func:`product_block_float32` of float64 matrices."""
    _product(d, np.float64)


PRODUCT_BLOCKS = {4: product_block_float32, 8: product_block_float64}


@njit_cached(nogil=True)
def copy_block(d):
    """A block: d[2] lines of d[3] bytes from address d[0] to address d[1], the
    lines d[4] bytes apart there and d[5] bytes apart here (see :data:`COPY_FROM`)."""
    lines, length = d[COPY_LINES], d[COPY_LINES + 1]
    for line in range(lines):
        source = array_at(d[COPY_FROM] + line * d[COPY_LINES + 2], (length,), np.uint8)
        target = array_at(d[COPY_TO] + line * d[COPY_LINES + 3], (length,), np.uint8)
        for i in range(length):
            target[i] = source[i]


def block_address(block):
    """The address of ``block``'s compiled code (a dispatcher of a function of
    one descriptor), compiled or loaded first; it stays valid while the
    dispatcher lives."""
    block.compile(BLOCK_ARGUMENT)
    result = block.overloads[BLOCK_ARGUMENT]
    return result.library.get_pointer_to_function(result.fndesc.mangled_name)
