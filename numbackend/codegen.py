"""Generate, cache and load the Numba kernel of a fused element-wise group.

A group computes element-wise nodes over one *domain* (the shape of its
widest node), optionally ending in reductions over the domain's trailing
``k`` axes.  The domain is seen as a 2-D space (R rows, C columns) split at
axis ``s``; each external input varies along rows and/or columns:

    'F' full (R, C)    'R' per row (R,)    'C' per column (C,)    'S' scalar
    'W' a window of columns [offset, offset + C) of a wider C-contiguous array
        (a slice of the last axis read in place, never copied)

A group without reductions whose inputs are all 'F' or 'S' becomes one flat
loop.  Each kernel module holds a parallel and a serial entry point with the
same body, and ``run``, plain Python, which checks the shapes, allocates the
outputs and calls one entry point by the work; Numba compiles only the one used.
``run_serial`` is ``run`` for compiled callers (a scan's loop over time),
compiled only when one calls it, with the serial loop alone.  Compiled
callers call it through its address (jit_kernels.compiling.by_address); it
calls kernel_ser directly, which LLVM inlines: called through its address, a
loop with many array arguments slowed small steps (an LSTM at batch 1).  Numba crashes
loading a cached function that calls, through another cached function, a
parallel one (the scan loop's cache, in the next process).

Generated source is canonical: names come from positions (x0, t3, r1...),
never from a tensor's name, so the same structure gives the same text, whose
hash keys the kernel in memory and on disk.  The compiled code is cached too
(jit_kernels.compiling.KernelCache, keyed by the file's bytes), so a second
process loads instead of compiling.  A file in the cache or a seed is used
only when its bytes are the source's, and the module always runs from the
source in hand (see :func:`load_kernel`).
"""
import collections
import contextlib
import functools
import hashlib
import os
import sys
import threading
import types
import warnings
import weakref

import numpy as np

from . import tiers, tuning
from .ops import OPS
from .partition import KernelSpec  # noqa: F401  (the spec it generates from)

# Bump when the generated code changes meaning: it is part of every kernel's key.
CODEGEN_VERSION = 16

_SUFFIX = {"float32": "f32", "float64": "f64"}
_MISMATCH = "numbackend: runtime shapes do not match the compiled broadcast pattern"

_modules = collections.OrderedDict()  # source hash -> loaded module, least recently used first
_live = weakref.WeakValueDictionary()  # source hash -> every loaded module not yet freed
_holders = {}  # source hash -> the plans, loops and calls that run its module (a WeakSet)
_modules_lock = threading.Lock()  # guards the three
stats = {"generated": 0, "loaded": 0}


def cache_dir():
    """The folder generated kernel modules are saved in: ``kernels-v<version>-<stamp>``
    under the writable cache root (NUMBACKEND_CACHE_DIR, else the user cache
    folder, else ``<tmp>/numbackend-<uid>``, else a fresh folder of this
    process; see jit_kernels.compiling.usable_folder, which checks that no one
    else can write there).  Raises OSError when no folder can be made at all."""
    from jit_kernels.compiling import usable_folder
    return usable_folder(_kernels_folder_name())


def seed_dirs():
    """The read-only folders searched for a kernel module before :func:`cache_dir`
    (the seeds' ``kernels-v<version>-<stamp>``, see
    jit_kernels.compiling.seed_folders)."""
    from jit_kernels.compiling import seed_folders
    return seed_folders(_kernels_folder_name())


def _kernels_folder_name():
    return f"kernels-v{CODEGEN_VERSION}-{_dependency_stamp()}"


def _dependency_stamp():
    """A hash of the jit_kernels sources (all of them) and of the tuning
    entries compiled into kernels: jit_kernels.package_stamp.

    Numba's cache checks only a function's own file: a kernel compiled against
    an older vmath.py or reduce.py, a scan loop against an older blas.py or
    packed.py (whose micro-kernels it inlines), a whole call against an older
    parts.py or conv.py (whose loops it calls), or any with other LLVM
    options (set in jit_kernels/compiling.py), would be loaded as it was.
    Keying the cache folder by the package makes a change to it recompile
    every kernel."""
    global _stamp
    if _stamp is None:
        from jit_kernels.compiling import package_stamp
        _stamp = package_stamp()[:12]
    return _stamp


_stamp = None


def scalar_type(dtype):
    """The NumPy scalar constructor spelled in generated code."""
    return "np.bool_" if dtype == "bool" else f"np.{dtype}"




def _load_expr(spec, i, idx_row, idx_col, flat_idx):
    pattern = spec.inputs[i][0]
    if pattern == "S":
        return f"x{i}"
    if pattern == "W":
        return f"v{i}[{idx_row}, {spec.windows[i][0]} + {idx_col}]"
    if spec.flat:
        return f"v{i}[{flat_idx}]"
    return {"F": f"v{i}[{idx_row}, {idx_col}]", "R": f"v{i}[{idx_row}]", "C": f"v{i}[{idx_col}]"}[pattern]


def _node_expr(spec, j, operand_exprs):
    name, _, refs, ct, ot = spec.nodes[j]
    casted = []
    for ref, expr in zip(refs, operand_exprs):
        dt = spec.inputs[ref[1]][2] if ref[0] == "in" else spec.nodes[ref[1]][4]
        casted.append(expr if dt == ct else (f"({expr} != 0)" if ct == "bool" else f"{scalar_type(ct)}({expr})"))
    return OPS[name].template.format(*casted, T=_SUFFIX.get(ct, "f64"), ct=scalar_type(ct), ot=scalar_type(ot))


def work_per_element(spec):
    """The kernel's work per element in units of a cheap element-wise
    operation; a vmath function (exp, tanh...) counts
    tuning.FUSED_VMATH_CALL_WORK more."""
    calls = sum("vm." in (OPS[node[0]].template or "") for node in spec.nodes)
    return 1 + tuning.FUSED_VMATH_CALL_WORK * calls


def vector_bits():
    """The vector width in bits that a fused kernel's loops are compiled for:
    tuning.FUSED_VECTOR_BITS where the CPU target's vector registers are at
    least that wide (jit_kernels.compiling.target_vector_bytes: AVX-512 for
    512), else None (the CPU's own choice).  LLVM's tuning of Intel's AVX-512
    CPUs vectorises loops with 256 bits; a fused kernel's loops ran faster
    with 512 (see the entry), where others, such as the convolutions', ran
    slower, which is why it is a kernel's setting and not the process's."""
    bits = tuning.FUSED_VECTOR_BITS
    if bits is None:
        return None
    from jit_kernels.compiling import target_vector_bytes
    return bits if bits <= 8 * target_vector_bytes() else None


def generate_source(spec, into=False, step_block=False):
    """Python source of a kernel module.

    ``run(x0, x1, ...)`` takes the group's inputs as they are, checks their shapes
    (ValueError when they broadcast unlike the compiled pattern), allocates the
    outputs with NumPy and runs ``kernel_ser`` by the work: on the calling thread,
    or in row parts on OpenBLAS's threads (``row_part``, :func:`_row_part`;
    ``kernel_par``, Numba's parallel loop, where NumPy has no OpenBLAS pool), on
    1-D/2-D views of exactly the sizes the loops index.  The Numba entry points
    only loop: no allocation, reshaping or raising, which makes them much quicker
    to compile (those lower through Numba's array-construction code).  ``run_serial``
    is ``run`` on one thread, compiled.  Where ``into`` (every output element-wise),
    ``run_serial_into(x0, ..., o0, ...)`` also writes them into arrays of the
    domain's shape (which may be inputs: each element is read before it is
    written); only where asked, since each entry point adds to its module's
    load time.  Where ``step_block`` (a kernel of a scan's body, see
    :func:`kernel_source`), ``step_block(d)`` runs it as a block of the scan's
    loop (:func:`_step_block`)."""
    lines = []
    emit = lines.append
    n_in = len(spec.inputs)
    body, buffers = _kernel_body(spec)
    text = "\n".join(body)
    emit("import numpy as np")
    emit("from numba import prange")
    emit("from jit_kernels import njit_cached, parallel_ok")
    emit("from numbackend.codegen import ParallelLoop, RowPart")
    emit("from jit_kernels import parts")
    emit("from jit_kernels.compiling import by_address")
    if "vm." in text:
        emit("from jit_kernels import vmath as vm")
    if "rd." in text:
        emit("from jit_kernels import reduce as rd")
    # the first line of the loop shared between threads: its body is the
    # function that Numba outlines for the threads, which holds the loops
    at = next(i for i, line in enumerate(body) if "PRANGE(" in line) + 1
    bits = vector_bits()
    if bits is not None:
        emit("from jit_kernels import prefer_vector_width")
        body.insert(at, f"    prefer_vector_width({bits})")
    if not into:
        # the outputs are new arrays (run, run_serial): no run-time overlap
        # checks in the vectorised loops.  run_serial_into may write into an input.
        emit("from jit_kernels import arrays_apart")
        body.insert(at, "    arrays_apart()")
    emit("")
    emit(f"MISMATCH = {_MISMATCH!r}")
    emit("")
    emit("")
    emit(f"def run({', '.join(f'x{i}' for i in range(n_in))}):")
    lines.extend("    " + line for line in _wrapper_body(spec, buffers))
    emit("")
    emit("")
    # run_serial and run_serial_into serve compiled callers, through the address
    # of their compiled code: their entry from Python (a test's) is left
    # unoptimised, which was up to a third of a large kernel's run_serial compile
    emit("@njit_cached(optimised_entry=False)")
    emit(f"def run_serial({', '.join(f'x{i}' for i in range(n_in))}):")
    lines.extend("    " + line for line in _wrapper_body(spec, buffers, serial=True))
    if into:
        # the epilogue of a library kernel (a convolution's), which may run on
        # several threads at once: it releases the GIL as theirs do
        emit("")
        emit("")
        emit("@njit_cached(nogil=True, optimised_entry=False)")
        params = [f"x{i}" for i in range(n_in)] + [f"o{o}" for o in range(len(spec.outputs))]
        emit(f"def run_serial_into({', '.join(params)}):")
        lines.extend("    " + line for line in _wrapper_body(spec, buffers, serial=True, into=True))
        lines.extend(_epilogue_part(spec, buffers))
    if step_block:
        lines.extend(_step_block(spec, buffers))
    lines.extend(_row_part(spec, buffers))
    # contract: a*b+c may become one fused multiply-add (vmath is exact under it);
    # no other fast-math flag, which would break vmath's rounding and special cases.
    flags = "error_model='numpy', fastmath={'contract'}"
    args = ", ".join(_kernel_args(spec, buffers))
    # the serial loop releases the GIL: row parts run it on several threads at once
    for variant, decorator, loop in (("par", f"njit_cached(parallel=True, {flags})", "prange"),
                                     ("ser", f"njit_cached(nogil=True, {flags})", "range")):
        emit("")
        emit("")
        emit(f"@{decorator}")
        emit(f"def kernel_{variant}({args}):")
        for line in body:
            emit("    " + line.replace("PRANGE", loop))
    emit("")
    emit("")
    emit("PARALLEL = ParallelLoop(kernel_par)")
    # the row part and the step block call the serial loop through its address:
    # compiled into them, the loop was optimised again with their code, doubling
    # its compile
    emit("SERIAL_LOOP = by_address(kernel_ser)")
    emit("ROW_PART = RowPart(parts.compiled_part(row_part))")
    return "\n".join(lines) + "\n"


class RowPart(tiers.LaterPart):
    """A fused kernel's row part (``row_part``): its kernel's first large call,
    and the large calls until it has compiled, run the serial loop on the
    calling thread."""

    def __init__(self, part):
        super().__init__(part, "a fused kernel's row part", "its large calls run on one thread")


class ParallelLoop:
    """A fused kernel's parallel loop (Numba's threads) as a later tier
    (tiers.py), for a process whose NumPy has no OpenBLAS pool to run the
    serial loop's row parts on (``row_part``): Numba compiles a ``prange`` loop
    for seconds, its serial loop in a fraction of that.  Large calls run the
    serial loop until the parallel loop is compiled: from the
    PARALLEL_LOOP_AFTER-th large call
    (tuning; the second), in the background
    (the first call of a plan compiles its other kernels, which a compile on
    the worker would hold up: Numba compiles one function at a time); at once
    where tiers compile in the call (tuning.TIER_COMPILE, a warm-up).  Later
    signatures compile in their calls."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        self._compiles = {}  # argument types -> its tiers.Job
        self._large_calls = 0
        self._lock = threading.Lock()
        self._warned = False
        # once a compile is done, calls check nothing more: a signature after the
        # first compiles in its call, as Numba does (the typing costs microseconds)
        self.compiled = False

    def ready(self, *args):
        """Whether the parallel loop is compiled for ``args``' types (a large
        call's; see the class's docstring for when its compile starts)."""
        self._large_calls += 1
        if self._large_calls < tuning.PARALLEL_LOOP_AFTER and not tiers.in_call():
            return False
        from numba import typeof
        signature = tuple(typeof(a) for a in args)
        job = self._compiles.get(signature)
        if job is None:
            with self._lock:
                job = self._compiles.get(signature)
                if job is None:
                    job = self._compiles[signature] = tiers.submit(
                        "a parallel loop", functools.partial(self.dispatcher.compile, signature))
        if not job.done:
            return False
        if job.error is not None:
            if not self._warned:
                self._warned = True
                warnings.warn(f"numbackend: a fused kernel's parallel loop did not compile "
                              f"({type(job.error).__name__}: {str(job.error)[:200]}); its "
                              "large calls run on one thread", stacklevel=3)
            return False
        self.compiled = True
        return True


def _epilogue_part(spec, buffers):
    """``EPILOGUE_PART``: the serial loop as a jit_kernels.parts compiled part
    reading a CompiledEpilogue's descriptor: the block (the one 'F' input of an
    epilogue's kernel) and the output, (rows, columns) values with their
    rows' distances, as its head says; each other input from an address after
    it, a row vector (from the block's first column on) or one scalar.  The
    loop reads and writes the first columns of rows that long; a flat loop,
    over contiguous values, takes the rows one at a time where they are not
    whole."""
    from jit_kernels.parts import EPILOGUE_HEAD as head  # not at import: it loads BLAS
    lines = ["", "", "def epilogue_part(d):",
             "    rows, columns, first = d[1], d[2], d[7]"]
    names, slot = [], head
    for i, (pattern, _, dtype) in enumerate(spec.inputs):
        item, size = scalar_type(dtype), np.dtype(dtype).itemsize
        if pattern == "F":
            names.append((f"v{i}", "d[3]", "d[5]", item, size))
            continue
        if pattern == "C":
            lines.append(f"    v{i} = parts.array_at(d[{slot}] + first * {size}, columns, {item})")
        else:
            lines.append(f"    x{i} = parts.array_at(d[{slot}], 1, {item})[0]")
        slot += 1
    (j, _, _), = spec.outputs
    out_type = spec.nodes[j][4]
    names.append(("o0", "d[4]", "d[6]", scalar_type(out_type), np.dtype(out_type).itemsize))
    for j, ct in buffers:
        lines.append(f"    s{j} = np.empty((min(rows, {tuning.FUSED_ROW_BLOCKS}), columns), "
                     f"dtype={scalar_type(ct)})")
    args = ", ".join(_kernel_args(spec, buffers)[2:])  # after the loop's R and C
    if not spec.flat:
        lines += [f"    {name} = parts.array_at({at}, (rows, {ld}), {item})" for name, at, ld, item, _ in names]
        lines += [f"    SERIAL_LOOP(rows, columns, {args})"]
    else:
        lines += ["    if d[5] == columns and d[6] == columns:"]
        lines += [f"        {name} = parts.array_at({at}, rows * columns, {item})"
                  for name, at, _, item, _ in names]
        lines += [f"        SERIAL_LOOP(rows, columns, {args})",
                  "        return",
                  "    for r in range(rows):"]
        lines += [f"        {name} = parts.array_at({at} + r * {ld} * {size}, columns, {item})"
                  for name, at, ld, item, size in names]
        lines += [f"        SERIAL_LOOP(1, columns, {args})"]
    lines += ["", "", "EPILOGUE_PART = parts.compiled_part(epilogue_part)"]
    return lines


def kernel_source(spec, in_scan_body=False):
    """The source of the kernel module of ``spec``: with a ``step_block`` for a
    kernel of a scan's body that can run as a block of its loop
    (:func:`takes_step_block`), so that the plan's first step, the loop's
    blocks and the generated loop share one module and its compiled loops."""
    return generate_source(spec, step_block=in_scan_body and takes_step_block(spec))


def takes_step_block(spec):
    """Whether a kernel of ``spec`` can run as a block (:func:`_step_block`):
    every output of the domain's shape, which the block is given."""
    return all(kind == "full" for _, kind, _ in spec.outputs)


def step_block_slots(spec):
    """Where ``step_block``'s descriptor holds each input and output: a list of
    (first column, rank) per input (rank None: a scalar, its address alone),
    then per output; the columns after an address hold the array's shape."""
    slots, column = [], 0
    for pattern, rank, _ in spec.inputs:
        slots.append((column, None if pattern == "S" else rank))
        column += 1 if pattern == "S" else 1 + rank
    for _ in spec.outputs:
        slots.append((column, spec.rank))
        column += 1 + spec.rank
    return slots


def _step_block(spec, buffers):
    """``step_block(d)``: the kernel as a block of a scan's loop
    (jit_kernels.steps), into outputs given as ``run_serial_into``'s are: each
    input and output at the address and of the shape that its columns of the
    descriptor ``d`` give (:func:`step_block_slots`), a scalar input read from
    a one-item array; the shapes checked as ``run`` checks them."""
    params = [f"x{i}" for i in range(len(spec.inputs))] + [f"o{o}" for o in range(len(spec.outputs))]
    lines = ["", "", "@njit_cached(nogil=True)", "def step_block(d):"]
    dtypes = [dtype for _, _, dtype in spec.inputs] + [spec.nodes[j][4] for j, _, _ in spec.outputs]
    for name, (column, rank), dtype in zip(params, step_block_slots(spec), dtypes):
        if rank is None:
            lines.append(f"    {name} = parts.array_at(d[{column}], (1,), {scalar_type(dtype)})[0]")
        else:
            shape = "".join(f"d[{column + 1 + a}], " for a in range(rank))
            lines.append(f"    {name} = parts.array_at(d[{column}], ({shape}), {scalar_type(dtype)})")
    lines += ["    " + line for line in _wrapper_body(spec, buffers, serial=True, into=True,
                                                      serial_loop="SERIAL_LOOP", returns=False)]
    return lines


def _row_part(spec, buffers):
    """``row_part(d)``: the serial loop over rows d[0]..d[1]-1 of the domain (flat:
    of its R * C values), a jit_kernels.parts compiled part.  The descriptor
    ``d``: the rows, then C, the data address of each input (a scalar's 0-d
    array) and output, as ``run`` passes them to the loop, then the width of
    each window input.  Each part allocates its own row buffers."""
    lines = ["", "", "def row_part(d):",
             "    lo, hi, C = d[0], d[1], d[2]",
             "    n = hi - lo"]
    params = ["n", "C"]
    names = [f"{'x' if p == 'S' else 'v'}{i}" for i, (p, _, _) in enumerate(spec.inputs)]
    slots = list(spec.inputs) + [("F" if kind == "full" else "R", None, spec.nodes[j][4])
                                 for j, kind, _ in spec.outputs]
    names += [f"o{o}" for o in range(len(spec.outputs))]
    width_slot = 3 + len(slots)
    for slot, (name, (pattern, _, dtype)) in enumerate(zip(names, slots), start=3):
        item, size = scalar_type(dtype), np.dtype(dtype).itemsize
        if pattern == "S":
            lines.append(f"    {name} = parts.array_at(d[{slot}], 1, {item})[0]")
        elif pattern == "C":
            lines.append(f"    {name} = parts.array_at(d[{slot}], C, {item})")
        elif pattern == "W":
            lines.append(f"    {name} = parts.array_at(d[{slot}] + lo * d[{width_slot}] * {size}, "
                         f"(n, d[{width_slot}]), {item})")
            width_slot += 1
        elif pattern == "R" or spec.flat:
            lines.append(f"    {name} = parts.array_at(d[{slot}] + lo * {size}, n, {item})")
        else:
            lines.append(f"    {name} = parts.array_at(d[{slot}] + lo * C * {size}, (n, C), {item})")
        params.append(name)
    for j, ct in buffers:
        lines.append(f"    s{j} = np.empty((min(n, {tuning.FUSED_ROW_BLOCKS}), C), dtype={scalar_type(ct)})")
        params.append(f"s{j}")
    lines.append(f"    SERIAL_LOOP({', '.join(params)})")
    return lines


def _kernel_args(spec, buffers):
    names = ["R", "C"] + [f"{'x' if p == 'S' else 'v'}{i}" for i, (p, _, _) in enumerate(spec.inputs)]
    names += [f"o{o}" for o in range(len(spec.outputs))]
    return names + [f"s{j}" for j, _ in buffers]


def _wrapper_body(spec, buffers, serial=False, into=False, serial_loop="kernel_ser", returns=True):
    """``run``'s code: the domain's dims from the inputs, checked; the outputs (given
    where ``into``: arrays of the domain's shape) and row buffers (``buffers``:
    [(member, dtype)], see :func:`_emit_rows`); the call (of the serial loop alone
    where ``serial``)."""
    full_shape = "(" + "".join(f"D{j}, " for j in range(spec.rank)) + ")"
    # outputs given (into) of the domain's shape: checked with the inputs, at one raise
    given = [f"o{o}.shape != {full_shape}" for o, (_, kind, _) in enumerate(spec.outputs)
             if into and kind == "full"]
    lines = _domain_dims(spec, given)
    emit = lines.append
    s, rank = spec.split, spec.rank
    emit(f"R = {_prod([f'D{j}' for j in range(s)])}")
    emit(f"C = {_prod([f'D{j}' for j in range(s, rank)])}")
    args = ["R", "C"]
    # A full-domain array is its own view where the domain already is (R * C,) or
    # (R, C), and the same goes for a window's (R, wider) array and for (C,) and
    # (R,) arrays: a reshape is a call of its own, a noticeable part of a small
    # kernel's call at batch 1, and of run_serial's compile.
    full_as_is = rank == 1 if spec.flat else (rank == 2 and s == 1)
    full_view = "R * C" if spec.flat else "R, C"
    for i, (pattern, rank_i, _) in enumerate(spec.inputs):
        # NumPy's reshape checks the sizes, so no view is smaller than its loop reads
        as_is = (pattern == "S"
                 or (pattern in "FW" and rank_i == rank and full_as_is)
                 or (pattern == "C" and rank_i == 1 and s == rank - 1))
        if as_is:
            args.append(f"x{i}")
        elif pattern == "W":
            args.append(f"x{i}.reshape(R, x{i}.shape[{rank_i - 1}])")
        else:
            args.append(f"x{i}.reshape({ {'F': full_view, 'R': 'R', 'C': 'C'}[pattern] })")
    outs = []
    for o, (j, kind, keepdims) in enumerate(spec.outputs):
        dt = scalar_type(spec.nodes[j][4])
        if kind == "full":
            if not into:
                emit(f"o{o} = np.empty({full_shape}, dtype={dt})")
            args.append(f"o{o}" if full_as_is else f"o{o}.reshape({full_view})")
        else:
            shape = "".join(f"D{a}, " for a in range(s)) + ("1, " * spec.k if keepdims else "")
            emit(f"o{o} = np.empty(({shape}), dtype={dt})")
            args.append(f"o{o}" if s == 1 and not keepdims else f"o{o}.reshape(R)")
        outs.append(f"o{o}")
    for j, ct in buffers:
        emit(f"s{j} = np.empty((min(R, {tuning.FUSED_ROW_BLOCKS}), C), dtype={scalar_type(ct)})")
        args.append(f"s{j}")
    if serial:
        # R and C as int64, not as literals where the domain's dims are constants:
        # a literal would compile kernel_ser a second time, for compiled callers
        # alone (Numba specialises a call on its literal arguments)
        emit(f"{serial_loop}({', '.join(['np.int64(R)', 'np.int64(C)'] + args[2:])})")
    else:
        work = f"R * C * {work_per_element(spec)}"
        done = "return (" + "".join(o + ", " for o in outs) + ")"
        emit(f"if not ({work} >= {tuning.FUSED_PARALLEL_MIN_WORK} and parallel_ok()):")
        emit(f"    kernel_ser({', '.join(args)})")
        emit("    " + done)
        n_in = len(spec.inputs)
        for k in range(2, len(args)):  # each argument once, named
            if not args[k].isidentifier():
                emit(f"a{k} = {args[k]}")
                args[k] = f"a{k}"
        # row parts (flat: parts of R * C) of the serial loop, compiled parts on
        # OpenBLAS's threads (ROW_PART); a scalar goes as a 0-d array of its type
        rows = "R * C" if spec.flat else "R"
        emit(f"count = parts.row_part_count({work}, {rows})")
        emit("if count > 1 and ROW_PART.ready():")
        arrays = []
        for a, (pattern, _, dtype) in zip(args[2:2 + n_in], spec.inputs):
            if pattern == "S":  # named: the array must live until the parts are done
                emit(f"    k{a} = np.array({a}, dtype={scalar_type(dtype)})")
                a = f"k{a}"
            arrays.append(a)
        arrays += args[2 + n_in:2 + n_in + len(spec.outputs)]
        widths = [f"{args[2 + i]}.shape[1]" for i, (p, _, _) in enumerate(spec.inputs) if p == "W"]
        emit(f"    numbers = parts.addresses(({''.join(a + ', ' for a in arrays)}))")
        emit("    if numbers is not None:")
        emit(f"        parts.run_rows(ROW_PART.part, count, {rows}, [C, *numbers{''.join(', ' + w for w in widths)}])")
        emit("        " + done)
        # one part, the row part not compiled yet, or an input that is not
        # C-contiguous; without OpenBLAS's pool (count 0), Numba's parallel
        # loop once compiled (a tier)
        emit(f"if count or not (PARALLEL.compiled or PARALLEL.ready({', '.join(args)})):")
        emit(f"    kernel_ser({', '.join(args)})")
        emit("    " + done)
        emit(f"kernel_par({', '.join(args)})")
    if returns:
        emit("return (" + "".join(o + ", " for o in outs) + ")")
    return lines


def _domain_dims(spec, more_checks=()):
    """Code that reads the domain's dims D0.. from the inputs and checks every
    input, and the conditions ``more_checks`` (of the dims) with them.

    The checks are one condition raising at one place: each ``raise`` is code of
    its own in a compiled caller (``run_serial``), and thirty of them took most
    of an LSTM step's compile."""
    lines, checks, source = [], [], {}
    s = spec.split
    for i, (pattern, rank, _) in enumerate(spec.inputs):
        if pattern == "S":
            continue
        off = spec.rank - rank
        axes = {"F": range(spec.rank), "W": range(spec.rank), "R": range(s),
                "C": range(s, spec.rank)}[pattern]
        if pattern == "W":
            offset, width = spec.windows[i]
            checks.append(f"x{i}.shape[{rank - 1}] < {offset + width}")
        for j in axes:
            if j - off < 0:
                continue
            ref = f"x{i}.shape[{j - off}]"
            if pattern == "W" and j == spec.rank - 1:
                ref = str(spec.windows[i][1])
            if j not in source:
                source[j] = ref
                lines.append(f"D{j} = {ref}")
            elif ref != source[j]:
                checks.append(f"{ref} != D{j}")
    for j in range(spec.rank):
        if j not in source:
            lines.append(f"D{j} = 1")
    checks += more_checks
    if checks:
        lines.append("if (" + " or\n        ".join(checks) + "):")
        lines.append("    raise ValueError(MISMATCH)")
    return lines


def domain_shape(spec, input_shapes):
    """The shape of a kernel's domain (its full outputs') for inputs of
    ``input_shapes`` (None for a scalar), read as :func:`_domain_dims`'s code
    reads it, which checks the rest when the kernel runs."""
    dims, s = {}, spec.split
    for i, ((pattern, rank, _), shape) in enumerate(zip(spec.inputs, input_shapes)):
        if pattern == "S":
            continue
        off = spec.rank - rank
        axes = {"F": range(spec.rank), "W": range(spec.rank), "R": range(s),
                "C": range(s, spec.rank)}[pattern]
        for j in axes:
            if j - off >= 0 and j not in dims:
                last_of_window = pattern == "W" and j == spec.rank - 1
                dims[j] = spec.windows[i][1] if last_of_window else shape[j - off]
    return tuple(int(dims.get(j, 1)) for j in range(spec.rank))


def _prod(names):
    return " * ".join(names) if names else "1"


def _kernel_body(spec):
    """The loops, over views v{i} (rows R, columns C) into outputs o{o}; returns
    (lines, the row buffers they use: [(member, dtype)])."""
    lines = []
    emit = lines.append
    if not spec.flat:
        return lines, _emit_rows(spec, lines)
    emit("for i in PRANGE(R * C):")
    exprs = _emit_elementwise(spec, range(len(spec.nodes)), "i", None, lines, "    ", {})
    for o, (j, _, _) in enumerate(spec.outputs):
        emit(f"    o{o}[i] = {exprs[j]}")
    return lines, []


def _needed(spec, targets, available):
    """Member indices needed (in order) to compute ``targets``, stopping at ``available``."""
    need, stack = set(), list(targets)
    while stack:
        j = stack.pop()
        if j in need or j in available:
            continue
        need.add(j)
        for ref in spec.nodes[j][2]:
            if ref[0] == "node":
                stack.append(ref[1])
    return sorted(need)


def _emit_elementwise(spec, members, col, row, lines, indent, known):
    """Emit one assignment per member; returns {member: expression}."""
    exprs = dict(known)
    for j in members:
        _, _, refs, _, _ = spec.nodes[j]
        operands = [exprs[r[1]] if r[0] == "node" else _load_expr(spec, r[1], row, col, col)
                    for r in refs]
        lines.append(f"{indent}t{j} = {_node_expr(spec, j, operands)}")
        exprs[j] = f"t{j}"
    return exprs


def _emit_rows(spec, lines):
    """Row loop: each reduction is a stage over the row; values a later stage needs again
    are kept in the stage's row buffer instead of being recomputed.  Returns the
    scratch buffers, [(member, dtype)]: block blk's buffer b{j} is row blk of scratch
    s{j} (or, for a lone buffer, row r of the output; then none is returned)."""
    body = []      # the code for one row r
    emit = body.append
    buffers = []   # (member, dtype) of each row buffer
    loops = []     # (first, end) body lines of each loop over the row's columns
    reduced = {}   # member -> per-row scalar name
    buffered = {}  # member -> row buffer name
    # (member, input view) when the row starts with a reduction of an input row that
    # has a fold (max, min: see ops.reductions.reduction)
    folded = None
    reduce_members = [j for j, n in enumerate(spec.nodes) if OPS[n[0]].kind == "reduce"]
    for j in reduce_members:
        name, _, refs, ct, ot = spec.nodes[j]
        op = OPS[name]
        (ref,) = refs
        if ref[0] == "in" and spec.inputs[ref[1]][0] == "F" and spec.inputs[ref[1]][2] == ct:
            row = f"v{ref[1]}[r]"
            if not body and op.reduce_fold is not None:
                folded = (j, f"v{ref[1]}")
        elif ref[0] == "node" and ref[1] in buffered and spec.nodes[ref[1]][4] == ct:
            row = buffered[ref[1]]
        else:
            buf = f"b{j}"
            buffers.append((j, ct))
            first = len(body)
            emit("for c in range(C):")
            avail = {m: buffered[m] + "[c]" for m in buffered}
            avail.update(reduced)
            members = _needed(spec, [ref[1]] if ref[0] == "node" else [], avail)
            exprs = _emit_elementwise(spec, members, "c", "r", body, "    ", avail)
            value = exprs[ref[1]] if ref[0] == "node" else _load_expr(spec, ref[1], "r", "c", "c")
            src_dtype = spec.nodes[ref[1]][4] if ref[0] == "node" else spec.inputs[ref[1]][2]
            if src_dtype != ct:
                value = f"({value} != 0)" if ct == "bool" else f"{scalar_type(ct)}({value})"
            emit(f"    {buf}[c] = {value}")
            loops.append((first, len(body)))
            row = buf
            if ref[0] == "node" and src_dtype == ct:
                buffered[ref[1]] = buf
        emit(f"r{j} = {scalar_type(ot)}({op.reduce_row.format(row=row, n='C')})")
        reduced[j] = f"r{j}"
    full = [(o, j) for o, (j, kind, _) in enumerate(spec.outputs) if kind == "full"]
    if full:
        first = len(body)
        emit("for c in range(C):")
        avail = {m: buffered[m] + "[c]" for m in buffered}
        avail.update(reduced)
        members = _needed(spec, [j for _, j in full], avail)
        exprs = _emit_elementwise(spec, members, "c", "r", body, "    ", avail)
        for o, j in full:
            emit(f"    o{o}[r, c] = {exprs[j]}")
        loops.append((first, len(body)))
    for o, (j, kind, _) in enumerate(spec.outputs):
        if kind == "reduced":
            emit(f"o{o}[r] = {reduced[j]}")
    if not buffers:
        lines.append("for r in PRANGE(R):")
        lines.extend("    " + line for line in body)
        return buffers
    # A lone buffer of the full output's dtype is that output's row: the last loop
    # reads each element before it overwrites it.  A softmax then scales its exps
    # in place instead of copying them out of a buffer (faster together with
    # times_reciprocal's scaling, though either change alone gained little:
    # PERFORMANCE.md, W2a).
    output_row = None
    if len(buffers) == 1 and len(full) == 1 and buffers[0][1] == spec.nodes[full[0][1]][4]:
        output_row = f"b{buffers[0][0]} = o{full[0][0]}[r]"
        buffers = []
    prologue = []
    if folded is not None and loops:
        prologue = _fold_next_row_reduction(spec, *folded, loops[0], body)
    lines.append(f"NB = min(R, {tuning.FUSED_ROW_BLOCKS})")
    lines.append("for blk in PRANGE(NB):")
    lines.extend(f"    b{j} = s{j}[blk]" for j, _ in buffers)
    lines.extend("    " + line for line in prologue)
    lines.append("    for r in range(blk * R // NB, (blk + 1) * R // NB):")
    if output_row is not None:
        lines.append("        " + output_row)
    lines.extend("        " + line for line in body)
    return buffers


def _fold_next_row_reduction(spec, j, view, loop, body):
    """The row starts with ``r{j}``, a reduction with a fold (max, min) of the input
    row ``view[r]``, and later loops over the row (``loop``: its first and end
    lines in ``body``).  Reduce the next row in that loop instead, one fold per
    element: its loads then overlap the loop's arithmetic rather than being a pass
    of their own, and the result is the same, the fold being exact in any order.
    Rewrites ``body``; returns the block prologue, the reduction of the block's
    first row."""
    op, ot = OPS[spec.nodes[j][0]], spec.nodes[j][4]
    first, end = loop
    settled = op.reduce_settle.format(acc=f"m{j}") if op.reduce_settle else f"m{j}"
    body[end:end] = [f"n{j} = {settled}"]
    body.insert(first + 1, f"    m{j} = {op.reduce_fold.format(acc=f'm{j}', x=f'{view}[rn, c]')}")
    # the next row (the last row re-reads itself); its first element starts the fold,
    # or the empty row's identity when C == 0
    body[first:first] = ["rn = r + 1 if r + 1 < R else r",
                         f"m{j} = {op.reduce_row.format(row=f'{view}[rn]', n='min(C, 1)')}"]
    body[0] = f"r{j} = {scalar_type(ot)}(n{j})"
    return [f"n{j} = {op.reduce_row.format(row=f'{view}[blk * R // NB]', n='C')}"]


def numba_error():
    """numba.core.errors.NumbaError (Numba is loaded by then: a kernel module
    imports it), for an ``except`` around a compiled call."""
    from numba.core.errors import NumbaError
    return NumbaError


_MODULE_PREFIX = "numbackend_kernels.k_"


def _source_key(source):
    """The key of a generated module's source: part of its module's and file's names."""
    return hashlib.sha256(f"v{CODEGEN_VERSION}\n{source}".encode()).hexdigest()[:24]


def load_kernel(source):
    """The module for ``source`` (a kernel's or a scan loop's): from memory, else
    run from ``source`` with its file in the cache folder beside it for Numba's
    cache (see :func:`_cached_file`); without it where it cannot be written."""
    _register_loader()
    key = _source_key(source)
    module = _recall(key)
    if module is not None:
        return module
    path = _cached_file(key, source)
    name = f"{_MODULE_PREFIX}{key}"
    module = types.ModuleType(name)
    # Run from the source in hand, never from the file read back, which could have
    # changed since it was checked (and Python's bytecode cache of it be stale).
    # A module without a file compiles without Numba's cache (jit_kernels.njit_cached).
    module.__file__ = path or f"<numbackend kernel k_{key}>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - our own source
    module.SOURCE = source
    module.KEY = key
    _remember(key, module)
    stats["loaded"] += 1
    return module


_loader_registered = False


def _register_loader():
    """Have jit_kernels find generated modules by name (see :func:`load_by_name`),
    once per process; not at import, since jit_kernels loads Numba."""
    global _loader_registered
    if not _loader_registered:
        from jit_kernels.compiling import register_module_loader
        register_module_loader(_MODULE_PREFIX, load_by_name)
        _loader_registered = True


def load_by_name(name):
    """The generated module named ``name`` (``numbackend_kernels.k_<key>``): from
    memory, else from its file ``k_<key>.py`` in a seed or the cache folder,
    whose source must hash to the key.  jit_kernels.compiling calls this to
    bind the kernels that a cached caller (a scan's loop, a whole call) calls
    through their addresses before it loads the caller in a new process.
    LookupError where no such file is found."""
    key = name[len(_MODULE_PREFIX):]
    if not name.startswith(_MODULE_PREFIX) or not key.isalnum():
        raise LookupError(f"load_by_name: {name!r} is not the name of a generated kernel module")
    module = _recall(key)
    if module is not None:
        return module
    folders = list(seed_dirs())
    with contextlib.suppress(OSError):
        folders.append(cache_dir())
    for folder in folders:
        try:
            with open(os.path.join(folder, f"k_{key}.py"), "rb") as f:
                source = f.read().decode()
        except (OSError, UnicodeDecodeError):
            continue
        if _source_key(source) == key:
            return load_kernel(source)
    raise LookupError(f"load_by_name: no source of the kernel module {name!r} is in the "
                      f"kernel cache folders {folders}")


def _cached_file(key, source):
    """The path of a file ``k_<key>.py`` holding exactly ``source``: the first
    found in a seed (see :func:`seed_dirs`) or in the cache folder whose bytes
    are ``source``'s (the key is a hash of ``source``: a file of other bytes is
    corrupt, or someone else's), else written anew in the cache folder.  None
    (after a warning, once per folder) where the file cannot be written, as on
    a full disk: the cache is only a saving.  Numba's compiled code is keyed by
    a hash of the file's bytes (jit_kernels.compiling.KernelCache): none compiled
    from what a rewritten file held before is loaded for it."""
    data = source.encode()
    for folder in seed_dirs():
        path = os.path.join(folder, f"k_{key}.py")
        if _holds(path, data):
            return path
    try:
        folder = cache_dir()
    except OSError as error:
        from jit_kernels.compiling import warn_once  # one warning for kernels and compiled code
        warn_once(None, f"{error}; compiling without a cache")
        return None
    path = os.path.join(folder, f"k_{key}.py")
    if _holds(path, data):
        return path
    from jit_kernels.compiling import write_atomically  # the same writes as compiled code's
    try:
        write_atomically(path, data)
    except OSError as error:
        _warn_once(folder, f"numbackend: cannot write to the kernel cache folder {folder} "
                           f"({error}); computing without the cache")
        return None
    stats["generated"] += 1
    return path


_warned = set()  # the folders warned of


def _warn_once(folder, message):
    """warnings.warn(message), where nothing was said yet of ``folder``."""
    if folder not in _warned:
        _warned.add(folder)
        warnings.warn(message, stacklevel=3)


def _holds(path, data):
    """Whether the file at ``path`` holds exactly the bytes ``data``."""
    try:
        with open(path, "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


def loaded_kernel(key):
    """The kernel module of this key loaded in this process (compiled scan loops
    and whole calls name the kernels they call by key; their Loop and Call hold
    those modules, which therefore stay alive while needed)."""
    module = _recall(key)
    if module is None:
        raise KeyError(f"loaded_kernel: no kernel module {key!r} is loaded in this process")
    return module


def max_kernels():
    """How many kernel modules codegen keeps loaded: NUMBACKEND_MAX_KERNELS where
    set (a positive integer), else tuning.MAX_LOADED_KERNELS."""
    value = os.environ.get("NUMBACKEND_MAX_KERNELS", "").strip()
    if not value:
        return tuning.MAX_LOADED_KERNELS
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"numbackend: NUMBACKEND_MAX_KERNELS must be a positive integer, "
                         f"got {value!r}")
    return count


def hold(modules, owner):
    """Keep ``modules`` in sys.modules while ``owner`` (a plan, a scan's loop or a
    whole call, which runs them) lives, wherever the bound has dropped them from
    codegen's memory: Numba looks a function's module up there when it compiles
    the function or loads it from the disk cache (a compile without it caches
    code that no process can load)."""
    with _modules_lock:
        for module in modules:
            _holders.setdefault(module.KEY, weakref.WeakSet()).add(owner)
            sys.modules[module.__name__] = module  # where the bound dropped it since it loaded


def _remember(key, module):
    """Keep ``module`` loaded as the most recently used; beyond max_kernels(), drop
    the least recently used, and from sys.modules too where nothing holds them
    (see :func:`hold`), which frees them.  A module that a plan, loop or call
    still holds keeps working, and _recall finds it while it lives."""
    limit = max_kernels()
    with _modules_lock:
        _modules[key] = module
        _modules.move_to_end(key)
        _live[key] = module
        sys.modules[module.__name__] = module
        if len(_modules) > limit:
            while len(_modules) > limit:
                _modules.popitem(last=False)
            _unregister_unheld()


def _recall(key):
    """The module of ``key`` where one is loaded and alive, as the most recently
    used; else None."""
    with _modules_lock:
        module = _modules.get(key)
        if module is not None:
            _modules.move_to_end(key)
            return module
        module = _live.get(key)
    if module is not None:
        _remember(key, module)
    return module


def _unregister_unheld():
    """Release the modules that are neither in _modules nor held (see _release)
    and drop them from sys.modules."""
    for key, module in list(_live.items()):
        if key not in _modules and not _holders.get(key):
            _holders.pop(key, None)
            _release(module)
            if sys.modules.get(module.__name__) is module:
                del sys.modules[module.__name__]


def _release(module):
    """Let the code Numba compiled or loaded for ``module``'s functions be freed.
    A dispatcher's finalizer, which undoes Numba's registrations of its
    compiled functions, never runs on its own: those registrations keep the
    dispatcher alive (numba/numba#7831).  Run it here and drop the compiled
    functions, as Numba's Dispatcher.recompile does; a function called after
    compiles or loads from the disk cache again."""
    from numba.core.dispatcher import Dispatcher  # loaded with any kernel module
    for value in list(vars(module).values()):
        if isinstance(value, Dispatcher):
            value._make_finalizer()()
            value._reset_overloads()


def forget_kernels():
    """Drop every loaded kernel module from memory, and from sys.modules where no
    plan, loop or call holds it (see K.clear_session)."""
    with _modules_lock:
        _modules.clear()
        _unregister_unheld()


def numba_stats():
    """Compiles and cache loads made by Numba for generated kernels and scan loops
    in this process (of the modules not yet freed)."""
    compiled = hits = 0
    with _modules_lock:
        modules = list(_live.values())
    for module in modules:
        for variant in ("kernel_par", "kernel_ser", "run_serial", "loop"):
            disp = getattr(module, variant, None)
            if disp is None:
                continue
            compiled += sum(disp.stats.cache_misses.values())
            hits += sum(disp.stats.cache_hits.values())
    return {"compiled": compiled, "cache_hits": hits}
