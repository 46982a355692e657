"""Every threshold and size that numbackend and jit_kernels choose by.

Each entry has a unit, where its value comes from (derived from the machine,
or measured: on what), why it exists, and an environment override,
``NUMBACKEND_TUNE_<NAME>`` (an int, a float, a word, or ``none``), read
when this module is imported.  Code reads an entry as a module attribute,
``tuning.NAME``, at the moment it decides, so that :func:`override` takes
effect at once::

    from numbackend import tuning
    with tuning.override(CONV_PATH="columns"):
        ...

Entries marked ``compiled`` are constants inside compiled kernels: they are
set by the environment alone (before the first kernel compiles), and the disk
caches are keyed by their values (see :func:`compiled_values`).

Pins.  Some decisions depend on how a function has been called (how often,
with what) rather than on shapes alone; each such entry says so in its
``decides`` and can be pinned to a fixed choice.

Results.  Paths of one op compute the same values, but not always the same
bits: a product summed in another order (BLAS's blocking against the packed
micro-kernel, Winograd's transforms against a direct loop, two threads'
partial sums against one) may differ in the last bits.  For the same input,
the same path and the same thread count, a function gives the same bits on
every call.

This module imports nothing of NumPy or Numba: importing numbackend reads it.
"""
import contextlib
import numbers
import os
import threading

from . import machine

__all__ = ["Entry", "compiled_values", "entries", "override", "pins"]


class Entry:
    """One tunable: ``name``, ``default`` (its value before any override),
    ``unit``, ``source`` (derived from what, or measured on what), ``why``,
    ``compiled`` (a constant inside compiled kernels) and ``decides`` (for a
    pin: the run-time decision it fixes)."""

    __slots__ = ("choices", "compiled", "decides", "default", "name", "source", "unit", "why")

    def __init__(self, name, default, unit, source, why, compiled=False, decides=None,
                 choices=None):
        self.name = name
        self.default = default
        self.unit = unit
        self.source = source
        self.why = why
        self.compiled = compiled
        self.decides = decides
        self.choices = choices

    def __repr__(self):
        return f"Entry({self.name}={self.default!r} {self.unit})"


_ENTRIES = {}
_LOCK = threading.Lock()


def _parse(name, text):
    text = text.strip()
    if text.lower() in ("", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text, 0) if kind is int else kind(text)
        except ValueError:
            pass
    return text


def _check(entry, value):
    """``value`` where ``entry`` may take it: one of its choices, else a value of
    its default's kind (a number for a number, an int for an int, a word for a
    word); anything where the default is None and there are no choices."""
    if entry.choices is not None:
        if value not in entry.choices:
            raise ValueError(f"tuning: {entry.name} must be one of {entry.choices!r}, "
                             f"got {value!r}")
        return value
    default = entry.default
    if default is None:
        return value
    if isinstance(default, bool):
        kind, fits = "bool", isinstance(value, bool)
    elif isinstance(default, numbers.Integral):
        kind, fits = "whole number", isinstance(value, numbers.Integral)
    elif isinstance(default, numbers.Real):
        kind, fits = "number", isinstance(value, numbers.Real)
    else:
        kind, fits = type(default).__name__, isinstance(value, type(default))
    if not fits or (isinstance(value, bool) and kind != "bool"):
        raise ValueError(f"tuning: {entry.name} takes a {kind} ({entry.unit}), got {value!r}")
    return value


def _define(name, default, unit, source, why, compiled=False, decides=None, choices=None):
    """Register an entry and set ``name`` in this module to its value: the
    environment's ``NUMBACKEND_TUNE_<NAME>`` where set, else ``default``."""
    if name in _ENTRIES:
        raise ValueError(f"tuning: {name} is defined twice")
    entry = Entry(name, default, unit, source, why, compiled, decides, choices)
    _ENTRIES[name] = entry
    text = os.environ.get(f"NUMBACKEND_TUNE_{name}")
    value = default
    if text is not None:
        try:
            value = _check(entry, _parse(name, text))
        except ValueError as error:
            raise ValueError(f"{error} (from NUMBACKEND_TUNE_{name}={text!r})") from None
    globals()[name] = value
    return value


def entries():
    """Every entry, in the order defined."""
    return list(_ENTRIES.values())


def pins():
    """The entries that fix a decision made by how a function has been called
    (how often, how fast) rather than by shapes alone: those with a
    ``decides``."""
    return [entry for entry in _ENTRIES.values() if entry.decides]


def compiled_values():
    """{name: value} of the entries compiled into kernels, as they are in this
    process (part of the kernels' cache keys)."""
    return {name: globals()[name] for name, e in _ENTRIES.items() if e.compiled}


@contextlib.contextmanager
def override(**values):
    """Set entries for the ``with`` block, process-wide, and restore them after.
    For tests and experiments: calls in other threads see the new values too.
    Refuses unknown names and entries compiled into kernels."""
    for name, value in values.items():
        entry = _ENTRIES.get(name)
        if entry is None:
            raise KeyError(f"tuning: no entry {name!r}; see tuning.entries()")
        if entry.compiled:
            raise ValueError(f"tuning: {name} is compiled into kernels; set "
                             f"NUMBACKEND_TUNE_{name} in the environment instead")
        _check(entry, value)
    with _LOCK:
        before = {name: globals()[name] for name in values}
        globals().update(values)
    try:
        yield
    finally:
        with _LOCK:
            globals().update(before)


# ---------------------------------------------------------------------------
# The entries.  Grouped by the code that reads them; each says its unit,
# where its value comes from, and why it exists.

# --- numbackend/codegen.py: fused element-wise kernels ----------------------
# Read when a kernel's source is generated: the value is written into it, and
# the source's hash keys the kernel, so a kernel generated under another value
# is another kernel.

_define("FUSED_PARALLEL_MIN_WORK", 1 << 18,
        "work: elements x work per element (1 + FUSED_VMATH_CALL_WORK per vmath call)",
        "derived, then measured on the 2-core AMD EPYC VM (Zen 4): a large call's hand-off "
        "(its parts' descriptors built in Python, then the pool's threads started) costs about "
        "8 us, the time of 60-100K cheap elements held in L2; two parts gain half the work, so "
        "they break even at about twice that: a cheap kernel (add -> maximum, x - 0.01 * y) "
        "between 131K elements (2 us slower in parts) and 262K (2 us faster), a tanh kernel "
        "(work 4 an element) at 65K elements (18.5 us serial, 18.8 in parts; 35 -> 27 us at "
        "131K)",
        "A fused kernel's call with this much work runs its serial loop in row parts on "
        "OpenBLAS's threads (jit_kernels.parts.run_rows, PARTS_MIN_WORK a part at least), "
        "less on the calling thread alone.  Where NumPy has no OpenBLAS pool, the same work "
        "runs Numba's parallel loop, whose threads cost tens of microseconds to wake (more "
        "between BLAS calls, whose threads still spin and hold the cores).")
_define("FUSED_VMATH_CALL_WORK", 3,
        "work per element of a vmath call (exp, tanh, ...), in cheap operations",
        "measured on one 2-core AMD EPYC VM only: a tanh kernel broke even with its "
        "parallel loop at a quarter of the elements of a cheap one (60k against 250k)",
        "The weight of a vmath function in a fused kernel's work per element, which "
        "FUSED_PARALLEL_MIN_WORK is compared with.")
_define("FUSED_ROW_BLOCKS", 64, "blocks of rows",
        "chosen: more blocks than cores on the machines used; measured on one 2-core AMD "
        "EPYC VM, row softmax 4096x1000: allocating the row buffers once per row instead "
        "cost about 15%",
        "A fused kernel with per-row buffers (a reduction's row, a softmax) runs its rows "
        "in at most this many blocks, each allocating its buffers once (each row part its "
        "own); the blocks are what Numba's parallel loop shares between threads.")
_define("FUSED_VECTOR_BITS", 512, "bits per vector (LLVM's prefer-vector-width)",
        "measured on the 2-core Xeon VM (Cascade Lake, AVX-512), 512 against None in one "
        "process, in turns, on one and on two threads: W1 8-11% faster, W2a 3-9%; W4, W5 and "
        "W6 within the noise (4%); a fused kernel's compile as long.  On a 16-core Xeon "
        "(Emerald Rapids), the whole process compiled for 512-bit vectors ran W1 and W2a "
        "20-35% faster, but the convolutions (W4), W5 and W6 10-24% slower",
        "The width of the vectors that LLVM's loop vectoriser fills in a fused kernel's "
        "loops (the generated kernel_par and kernel_ser, not the library's kernels), where "
        "the CPU target's vector registers are at least this wide (64 bytes with AVX-512: "
        "jit_kernels.compiling.target_vector_bytes); else, and with None, the CPU's own "
        "choice, which LLVM's tuning of Intel's AVX-512 CPUs makes 256 bits.",
        choices=(None, 128, 256, 512))
_define("MAX_LOADED_KERNELS", 512, "kernel modules",
        "chosen, not measured: bounds the memory of a process that builds many different "
        "functions, far above what one model's functions load",
        "How many kernel modules (fused kernels, scan loops, whole calls, each with the "
        "code Numba compiled for it) stay loaded, the least recently used dropped first; "
        "those that live compiled functions hold stay beyond it.  The environment "
        "variable NUMBACKEND_MAX_KERNELS, where set, takes precedence (read each time).")

# --- numbackend/program.py, plan.py, runtime.py, lowering.py: the plan, the whole call --

_define("NUMPY_MAX_SIZE", 16, "elements (a group's domain, known before running)",
        "chosen with the first engine, not measured: NumPy's few calls on 16 elements "
        "cost microseconds, a kernel's compile a good part of a second",
        "A fused group whose domain is known to be this small is evaluated with NumPy "
        "and compiles nothing.  Read when a plan is built.")
_define("NUMPY_MAX_SAMPLES", 4096, "samples (a group of one value per sample)",
        "measured on one 2-core AMD EPYC VM only, W7 training step (batch 128): 8 kernels "
        "compiled instead of 12, asv cold 5.6 -> 4.2 s, warm 0.84 -> 0.61 s; a compile "
        "costs about 0.3 s",
        "A group of one value per sample (a loss's per-sample tail, row statistics after "
        "a reduction) runs with NumPy up to this many samples and compiles its kernel only "
        "when called with more.  Read when a plan is built.")
_define("ONE_CALL_AFTER", 10, "calls with small inputs (see ONE_CALL_MAX_ELEMENTS)",
        "chosen, not measured: more calls than a function of a test suite usually gets",
        "A function called this many times with small inputs gets its plan compiled as "
        "one call (compiled_plan), where the plan allows: that saves the interpreter's "
        "microseconds per step, which a small batch's run is mostly made of, and costs a "
        "compile that functions called a few times never pay.",
        decides="after how many calls with small inputs a function runs as one compiled "
                "call instead of its plan (1: from the first call; 10**9: never)")
_define("SCAN_LOOP_AFTER", 2, "calls of a scan (any function running it)",
        "chosen, not measured: a function of a test suite is often called once, and an "
        "LSTM's loop compiles for seconds",
        "A scan runs its steps from Python (the step's plan) until it has been called this "
        "many times; from then on its steps after the first run in one compiled loop "
        "(scan_loop), compiled in the background (see TIER_COMPILE) while the calls go on "
        "from Python.",
        decides="after how many calls a scan's steps run in its compiled loop instead of "
                "from Python (1: from the first call; 10**9: never)")
_define("SCAN_LOOP_FORM", "blocks", "the form a scan's compiled loop runs in",
        "chosen, then measured on the Zen 4 VM: the blocks give the generated loop's bits; "
        "imdb_lstm's first two training steps from empty caches 7.9-8.1 s generated, 5.7-6.0 s "
        "as blocks (its backward loop compiled for 1.6 s); W5 2-4% slower a call (Python "
        "writing the call's addresses into the blocks' table)",
        "'blocks': a scan's compiled loop runs its steps as blocks of the library's "
        "precompiled loop (numbackend/scan_blocks.py) where every step has one; "
        "'generated': as one function generated and compiled for the model "
        "(scan_loop.py), which a whole call and an export use either way.",
        decides="whether a scan's loop runs as library blocks or as a generated function",
        choices=("blocks", "generated"))
_define("PARALLEL_LOOP_AFTER", 2, "large calls of a fused kernel (see FUSED_PARALLEL_MIN_WORK)",
        "chosen, not measured as a curve: a plan's first call compiles its kernels, which a "
        "parallel loop compiling on the worker would hold up (Numba compiles one function at "
        "a time); a softmax over 4096 x 1000 on the 2-core Xeon VM, empty caches: first call "
        "2.2 s with its parallel loop, 0.9-1.1 s without",
        "Where NumPy has no OpenBLAS pool to run a fused kernel's row parts on, its large "
        "calls run its serial loop until its parallel loop (Numba's threads) has compiled, "
        "which starts (in the background, see TIER_COMPILE) at this large call.",
        decides="from which large call a fused kernel's parallel loop compiles (1: its "
                "first; 10**9: never, where tiers compile in the background)")
_define("TIER_COMPILE", "background", "where a later tier compiles",
        "chosen: a serving call must not wait seconds for a compile",
        "Where the later tiers of a function (the whole call, see ONE_CALL_AFTER; a "
        "scan's loop, see SCAN_LOOP_AFTER) compile once due: 'background', on one worker "
        "thread of the process while the calls go on with the current tier, which they "
        "leave when the compile is done; 'in_call', in the call that finds it due, which "
        "waits for it (tests and benchmarks that measure one tier; which call first runs "
        "the new tier is then fixed).  Function.warmup compiles them at once either way.",
        decides="whether later tiers compile in the background (the call that first runs "
                "them depends on timing) or in the call that finds them due",
        choices=("background", "in_call"))
_define("COMPILE_SWITCH_INTERVAL_S", 0.0005, "seconds (Python's sys.setswitchinterval)",
        "chosen, then measured on the Zen 4 VM: a Keras LSTM(128) x 100 steps predicting at "
        "batch 1 from empty caches, calls 2-15 (its loop and whole call compiling on the "
        "worker), nine processes each in turns: slowest call 0.011-0.076 s (over 0.03 s in "
        "4 of 9) with Python's 5 ms, 0.010-0.025 s with 0.5 ms; calls 2-15 together 0.12 "
        "against 0.07 s (medians of 6)",
        "While the worker thread compiles a later tier (see TIER_COMPILE), the GIL changes "
        "hands at least this often rather than every 5 ms: Numba's lowering runs in Python, "
        "and a serving thread waited for the GIL at each of its own Python steps.")
_define("ONE_CALL_MAX_ELEMENTS", 1 << 14, "elements, of all a call's inputs together",
        "chosen, not measured: holds a batch-1 call of the W3 MLP and mnist_cnn "
        "(784 inputs) and small batches of them",
        "Calls with at most this many input elements count towards ONE_CALL_AFTER and "
        "then run as one compiled call; larger inputs run the plan, whose kernels go "
        "parallel.")
_define("PACKED_WEIGHTS_MAX_ROWS", 6, "rows of the left operand",
        "derived: one register tile of jit_kernels.packed (TILE_ROWS, 6 rows), the "
        "micro-kernel's own shape, on every machine; measured on the 2-core Xeon VM (AVX-512), "
        "one thread: 6 x 784 by 784 x 512 in 68 us packed against 282 us through BLAS, "
        "6 x 9216 by 9216 x 128 in 235 against 808 us",
        "A product by a variable's or a constant's value (a layer's weights) with at most "
        "this many rows runs on jit_kernels.packed's micro-kernel, which reads the weights "
        "from memory once: one tile of rows per panel reads each weight once a call, the "
        "least any product reads, where BLAS also copies them into its own panels on every "
        "call.  With more, through BLAS, whose threads always have work (the packed "
        "product's parts take whole panels, fewer than the threads where the weights are "
        "narrow), unless every thread gets panels (jit_kernels.packed.weights_run_packed).  "
        "Read per call by the "
        "plan and when a whole call is generated.")
_define("PACKED_WEIGHTS_MIN_ITEMS", 1 << 16, "items of the weights (rows x columns)",
        "measured on one 2-core AMD EPYC VM only, mnist_cnn and the W3 MLP at batch 1: "
        "1x128 by 128x10 read in place 15 -> 8 us, 1x512 by 512x10 in a whole call 2.4 "
        "us through BLAS against 0.8 us packed",
        "Weights with at least this many items are packed once per value and their "
        "panels split between BLAS's threads; smaller ones are read in place on the "
        "calling thread, where a call into BLAS costs more than the product.")

# --- numbackend/exporting.py: the exported library -----------------------------

_define("EXPORT_CHUNK_ROWS", 32, "rows of a batch",
        "chosen, not measured as a curve: a chunk's plan runs serially on one thread, so a "
        "chunk must hold enough rows for the products to run near speed (the packed "
        "micro-kernel's block is 48 rows) while a batch of a few hundred rows still gives "
        "every thread of a many-core machine a chunk",
        "An export's library runs a batch in chunks of this many rows, each chunk's plan "
        "on one thread; read when a model is exported and recorded in its library.")

# --- numbackend/native.py: a function's inference plan as an entry of the cache ---

_define("NATIVE_TIER", "on", "on or off",
        "chosen: a new process's first call spends most of its time importing Numba and "
        "loading kernels (0.3-0.5 s for the W3 MLP on the 2-core Xeon VM), where an entry "
        "loads in about 10 ms",
        "'on': a function without updates that got its whole call (ONE_CALL_AFTER) has its "
        "inference plan exported into the cache, by a process of its own at low priority, "
        "and a later process that builds the same function with the same values serves its "
        "small calls from that entry without loading Numba; 'off': neither (the test suite "
        "and the benchmarks, whose processes must not start builds).",
        choices=("on", "off"))
_define("NATIVE_MAX_BYTES", 1 << 28, "bytes of a function's pickled form (its values, mostly)",
        "chosen, not measured as a curve: hashing 256 MB takes about 0.3 s, about what a "
        "cold process's kernels take to load",
        "A function whose graph and values pickle to more than this gets no native entry: "
        "finding one hashes them in the process's first call.")
_define("NATIVE_CACHE_MAX_BYTES", 1 << 30, "bytes of the entries in the writable cache",
        "chosen, not measured: the W3 MLP's entry holds 2.7 MB, mnist_cnn's 5 MB, so about "
        "two hundred such models",
        "Each native entry's build, once in place, removes the least recently used entries "
        "until those left hold at most this (the one just built stays whatever its size).")
_define("NATIVE_BUILD_STALE_S", 600, "seconds",
        "chosen: a build takes seconds (the W3 MLP's about 3 s on the 2-core Xeon VM, "
        "mnist_cnn's about 10 s)",
        "A native entry's build marked as under way for longer than this is taken as dead "
        "(its process killed), and a later process starts another.")

# --- numbackend/scan_loop.py: a scan's compiled loop over time ---------------

_define("SCAN_SPLIT_MIN_ROWS_PER_THREAD", 4, "rows (axis 0 of the states) per thread",
        "measured on a 16-core Xeon (Emerald Rapids), the W5 LSTM's 32 rows (128 units) "
        "pinned to N threads: 8 parts of 4 rows (8 threads) 2.8 ms, 16 parts of 2 rows "
        "(16 threads) 3.1-3.8 ms in three runs, 4 parts of 8 rows 3.4 ms.  Each part runs "
        "the whole loop over its rows, with no hand-off between steps, but its products "
        "use a third of the packed tile's 6 rows at 2 rows, and each part is one more "
        "hand-off holding the GIL (parts.run_parts); 8 before, which held W5 to 4 threads",
        "A loop whose step keeps its rows apart is split between threads only where each "
        "gets this many rows at least.")
_define("SCAN_SPLIT_MIN_ELEMENTS", 1 << 19,
        "elements: the sequences, plus per step the states and the products' results",
        "chosen, not measured as a curve: handing work to another thread costs tens of "
        "microseconds, more where it sleeps",
        "A loop is split between threads only where it reads, carries and multiplies out "
        "this many elements at least; below, it runs on the calling thread.")
_define("SCAN_PACKED_MIN_ROWS", 2, "rows of a step's product",
        "derived: one row is a matrix times a vector, where BLAS's gemv reads each weight "
        "once as the micro-kernel does, and splits large weights between its threads where "
        "a loop runs on one; measured on one 2-core AMD EPYC VM, W5 LSTM: packed beat BLAS "
        "for every product of two rows or more measured (W5 12.7 against 17.2 ms), and for "
        "one row BLAS's gemv was as fast",
        "A step's products by loop invariants (an RNN's recurrent weights) run on the "
        "weights packed once per loop from this many rows up, through BLAS below; above "
        "one block of rows (jit_kernels.packed.block_rows), jit_kernels.packed.runs_packed "
        "decides (by the rows and the threads: every call of the same shapes gives the same "
        "bits).")
_define("SCAN_IN_LOOP_MIN_ROWS", 16, "rows per thread",
        "measured on one 2-core AMD EPYC VM only, W5 LSTM: one product over all steps was "
        "14-17% faster over 1 to 8 rows on one thread and 20% over 16 rows split in two; "
        "over 32 and 64 rows split in two, products per step in the loop were 12-13% faster",
        "A step's products of sequence slices by invariants (an RNN's input projection) "
        "run per step inside the loop, on packed weights, where the rows are split "
        "between threads and each gets this many; else as one product over all of a "
        "call's steps before the loop.")
_define("SCAN_SHARE_MIN_THREADS", 4, "threads",
        "measured on the 2-core Zen 4 VM, the W5 LSTM over 100 steps, the forms in turns in "
        "one process: 2 threads sharing 4 and 6 rows ran 2-14% faster than one thread in "
        "quiet phases of the VM, and up to 30% slower in noisy ones and beside a busy core "
        "(two waits a step, and each step's values crossing between the cores' caches, cost "
        "about what the second thread saves); from 4 threads each thread's share of the "
        "work is a quarter or less.  Not measured on more cores",
        "Threads share a scan's steps (SCAN_SHARE_MIN_WORK) only where at least this many "
        "would.")
_define("SCAN_SHARE_MIN_WORK", 1 << 17, "multiply-adds per thread of the products in a step",
        "measured on the 2-core Zen 4 VM, the W5 LSTM (its 128 x 512 recurrent product in "
        "the step, 65,536 multiply-adds a row) over 100 steps, each form timed in turns in "
        "one process: on one thread, its 32 rows' loop cut into the 16 tasks a step of 16 "
        "sharing threads took 8.61 ms against 8.38 uncut, where 8 parts of 4 rows took 9.44 "
        "and 16 of 2 rows 10.6 (the tiles' rows go unused): so 16 threads sharing W5's "
        "steps, 131k multiply-adds each, do the least work.  On 2 threads, 4 and 6 rows "
        "shared ran within 5% of one thread in quiet phases of the VM (a wait between "
        "threads costs about 0.1 us there); the cost of a wait on 16 cores is not measured",
        "Where a scan's rows split between BLAS's threads would leave some idle "
        "(SCAN_SPLIT_MIN_ROWS_PER_THREAD), the threads share each step instead "
        "(numbackend/scan_blocks.py), as many as each get this much of the step's products, "
        "where that is more threads than the split by rows.")



# ---------------------------------------------------------------------------
# jit_kernels: how its library loops run.  "Measured on the 2-core AMD VM"
# means one 2-core AMD EPYC (Zen, AVX2) virtual machine, the only machine
# these were measured on.

# -- jit_kernels/windows.py (every window kernel: conv, pool, resize, sparse)
_define("LIBRARY_PARALLEL_MIN_WORK", 1 << 24, "elements touched",
        "measured on the 2-core AMD VM: waking Numba's threads costs a few us on an idle machine, "
        "but up to a scheduler time slice (4-12 ms) while OpenBLAS's threads still spin after a "
        "product, which is when the next kernel of a network runs",
        "below this a library kernel of parallel/serial twins runs its serial twin on the calling "
        "thread; only huge kernels go parallel on Numba's threads")
_define("LIBRARY_IMAGE_PARTS_MIN_WORK", 1 << 20, "elements touched",
        "measured on the 2-core AMD VM: mnist_cnn's max pooling after a product at batch 64 "
        "(2.4M elements) ran 1.6-2x faster forward and 1.3-2x backward in parts; at batch 16 "
        "sometimes slower",
        "from this a kernel parallel over images (pooling) splits its images between BLAS's "
        "threads, each part on one thread")

# -- jit_kernels/columns.py (im2col)
_define("CONV_COLUMN_CHUNK_BYTES", 2 << 20, "bytes",
        "measured on the 2-core AMD VM: mnist_cnn's second layer at batch 64 ran 20% faster with "
        "2 MB chunks than 8 MB ones; 1 MB ones pay for more switches between the copy and BLAS",
        "im2col works batch chunk by batch chunk, each chunk's columns about this size, so that "
        "BLAS reads them while they are still in cache; where the batch may split between "
        "threads, no more than each thread's share of the L3 cache (jit_kernels.machine."
        "shared_cache_share), so that all the threads' chunks fit in it together")
_define("CONV_TAPWISE_MIN_ROWS", 1024, "column rows",
        "measured on the 2-core AMD VM: tap by tap 3x faster from a few images up; for one image "
        "(676 rows) the whole view was faster (fewer NumPy calls)",
        "one-channel im2col copies tap by tap from this many column rows up; below, one copy "
        "of the whole window view")

# -- jit_kernels/conv.py (forward_path: the choice of algorithm)
_define("CONV_PATH", None, "algorithm",
        "a pin: none by default",
        "where set, forward_path takes this algorithm wherever it can run the convolution "
        "(pointwise: 1x1 kernels with stride 1; direct, winograd: float32 and float64; "
        "winograd: 3x3 kernels with stride 1 over one depth slice; columns: any), else its usual "
        "choice; tests drive every path with it",
        decides="the algorithm of every forward convolution (jit_kernels.conv.forward_path)",
        choices=(None, "pointwise", "direct", "winograd", "columns"))
_define("CONV_DIRECT_MAX_PATCH", 36, "window values (taps x input channels)",
        "measured on the 2-core AMD VM: mnist_cnn's first layer (9 values) at batch 1 in 65 us "
        "against im2col's 105 us, 3x3 over RGB (27) at batch 16 0.75 ms against 2.4 ms; with 72 "
        "values im2col + BLAS was faster (1.6 ms against 2.1 ms)",
        "a convolution whose windows hold at most this many values runs the direct loop rather "
        "than im2col + BLAS, whose products with so few columns run far below speed")
_define("CONV_DIRECT_MIN_ROW_BYTES", 128, "bytes of a row of output channels",
        "derived: four 256-bit vectors, the direct loop's vector body (LLVM interleaves four "
        "vectors, see compiling.py); 256-bit on AVX2 and on Intel's AVX-512 CPUs too, whose "
        "loops LLVM vectorises with 256-bit vectors (its code for skylake-avx512, "
        "cascadelake, icelake-server, sapphirerapids and x86-64-v4); where loops take "
        "512-bit vectors (LLVM's znver4), rows of 128 bytes run its vectorised remainder "
        "loop, of 256-bit vectors",
        "the direct loop only where a row of output channels is at least this long: below, it "
        "runs as scalar code")
_define("CONV_DIRECT_CHUNK_BYTES", machine.cache_bytes(2, 512 << 10), "bytes",
        "derived: the size of a core's L2 cache (Linux's /sys; 512 KB where unknown, the L2 of "
        "the 2-core AMD VM where it was chosen)",
        "the direct loop's block of outputs per chunk of images, which an epilogue then reads "
        "while it is in cache")
_define("CONV_WINOGRAD_MIN_CHANNELS", 8, "channels",
        "measured on the 2-core AMD VM: mnist_cnn's second layer (32 -> 64 channels) ran "
        "1.5-1.75x faster from batch 16 up, 1.15-1.3x at batch 1",
        "3x3 convolutions with stride 1 over at least this many input and output channels run "
        "as Winograd F(4x4, 3x3): 36 multiplications per 4x4 block and input channel where "
        "im2col has 144 (float32 results off by about 6e-6 of the largest output, im2col's by "
        "about 7e-7)")
_define("CONV_WINOGRAD_MIN_BLOCKS", 32, "4x4 blocks of outputs",
        "measured on the 2-core AMD VM: 256 -> 256 channels over 7x7 outputs ran at 0.24x "
        "im2col's speed with 4 blocks, 0.57x with 16, 1.09x with 64; 64 -> 64 over 28x28 (49) "
        "1.1-1.9x",
        "Winograd only over at least this many blocks, and one per 1024 products of an input and "
        "an output channel: the kernel's transform is made on every call, and each of the 36 "
        "products has a row per block")
_define("CONV_WINOGRAD_CHUNK_BYTES", 1 << 20, "bytes",
        "measured on the 2-core AMD VM: 1-2 MB ran alike, 512 KB slower",
        "Winograd's transformed inputs and products per chunk of bands (4 output rows)")
_define("CONV_WINOGRAD_MIN_ROWS", 64, "blocks (rows of each product)",
        "measured on the 2-core AMD VM: with 256 channels in and out, 1 MB is 6 blocks, and 16 "
        "images of 7x7 outputs took 2.3x as long so",
        "however small CONV_WINOGRAD_CHUNK_BYTES makes a chunk, each of its products has at "
        "least this many rows")
_define("CONV_WINOGRAD_KEPT_BYTES", 64 << 20, "bytes",
        "chosen: a network's kernels and their transforms, with room to spare",
        "the Winograd kernel transforms kept between calls (with a copy of each kernel) hold at "
        "most this many bytes; the oldest go first, the newest is always kept")

# -- jit_kernels/packed.py (the packed micro-kernel)
_define("PACKED_VECTOR_BYTES", None, "bytes",
        "derived: None takes the vector registers of the CPU target (the host, or "
        "NUMBACKEND_CPU_TARGET, a CPU named there having the features LLVM gives it; 64 "
        "bytes with AVX-512, else 32: jit_kernels.compiling.target_vector_bytes)",
        "a panel of the packed products is two vectors wide", compiled=True)
_define("PACKED_ONE_ROW_PANELS", 4, "panels",
        "measured on one core of the 2-core AMD VM: 1 x 784 by 784 x 512 in 23.8 us against "
        "31.2 with one panel; 1 x 512 by 512 x 512 in 16.0 against 20.8",
        "a one-row product takes this many panels at a time: a one-row tile uses each vector of "
        "the panel once, so loads bound its loop (two a cycle on Zen)", compiled=True)
_define("PACKED_CHUNK_BYTES", 64 << 10, "bytes",
        "derived: a chunk of a panel and a block of rows of it (PACKED_BLOCK_BYTES) take "
        "three quarters of the smallest L2 cache of the x86-64 CPUs a cache's CPU target covers "
        "(256 KB, Intel's client cores; AMD's have 512 KB or more, Intel's server cores 1 MB or "
        "more).  Not read from /sys: it is compiled into kernels whose cache serves every "
        "machine of the target (the README's container recipe).  Measured on one core of the "
        "2-core Zen 4 VM (AVX-512, 1 MB of L2): 64 KB chunks (512 items of float32) ran "
        "256 x 1024 by 1024 x 1024, 256 x 784 by 784 x 512 and 128 x 512 by 512 x 2048 as "
        "fast as whole panels (108-113 GFLOP/s), 16 KB chunks 5-15% slower (out's tiles "
        "read again at each chunk).  On the 2-core Xeon VM (1 MB of L2), before chunks, "
        "256 x 4096 by 4096 x 512 ran at 0.76x BLAS's speed: 48 rows of k (768 KB) and a "
        "panel (512 KB) overflowed its L2",
        "a product by packed panels runs in chunks of k: a panel's rows of one chunk take "
        "this many bytes (jit_kernels.packed.chunk_depth)", compiled=True)
_define("PACKED_BLOCK_BYTES", 128 << 10, "bytes",
        "derived with PACKED_CHUNK_BYTES (see there)",
        "the rows of the left operand multiplied by every panel in turn, over one chunk of k, "
        "hold this many bytes (jit_kernels.packed.block_rows: 64 rows of float32 with "
        "AVX-512 where k spans a whole chunk, more where k is shorter)", compiled=True)

# -- jit_kernels/parts.py (compiled parts on OpenBLAS's threads)
# How much work a part must get.  Work is counted in elements touched (read or
# written once; for a product by weights, the weights' items read): the
# library's loops take roughly 0.1 to 1 ns per element on one core.
_define("PARTS_MIN_WORK", 1 << 14, "elements touched per part",
        "derived: a compiled part costs about 1.5 us to hand to a thread of the pool (two "
        "empty parts ran in 3 us on the 2-core AMD VM), and 16K elements take about 2 to "
        "16 us: split finer, the hand-offs would cost about as much as the work they share",
        "compiled parts (packed products by weights, Winograd's bands) split their work "
        "between the threads so that each part gets this much at least; work too small "
        "for two parts runs on the calling thread", compiled=True)
_define("PARTS_PYTHON_HANDOFF_WORK", 1 << 15, "elements touched",
        "derived: a part of Python (parts.run_parts) takes about 15 us of its thread's time "
        "and of the GIL's to start and end (a run of two parts cost 29 us on the 2-core AMD "
        "VM), the time of about 32K elements at 0.5 ns each",
        "parts of Python (a convolution's images or bands, pooling by images) hand their "
        "work out one after another, each holding the GIL: work W splits into about "
        "sqrt(W / this) parts (machine.python_part_count), at most one per thread")
_define("PARTS_LATE_START_NS", 500_000, "ns",
        "chosen: a thread woken from sleep starts within tens of microseconds",
        "a run on the pool whose last thread started its part this long after the run began, "
        "and later than the calling thread took for its own part, had a thread that was not "
        "running (another process had its core); so had a run of threads sharing a scan's "
        "steps where one waited this long for another's task, in steps shorter than this",
        compiled=True,
        decides="whether parts run on OpenBLAS's threads or on the calling thread alone "
                "(jit_kernels.parts.run_on_pool), by the start times of earlier runs; pin it to "
                "threads with NUMBACKEND_TUNE_PARTS_CONTENDED_SERIAL_NS=0")
_define("PARTS_LATE_RUNS", 2, "runs in a row",
        "chosen: the pool's first run starts its threads, so one late run is not enough",
        "after this many late runs in a row the parts run on the calling thread alone for "
        "PARTS_CONTENDED_SERIAL_NS", compiled=True,
        decides="see PARTS_LATE_START_NS")
_define("PARTS_CONTENDED_SERIAL_NS", 1_000_000_000, "ns",
        "measured on the 2-core AMD VM: waiting for a time slice of a busy core made a batch-1 "
        "CNN 50 times slower",
        "how long the parts run on the calling thread alone once threads were found late; 0 "
        "pins the parts to the threads", compiled=True,
        decides="see PARTS_LATE_START_NS")

# -- jit_kernels/manifest.py, numbackend/compile_report.py (compile time as a budget)
_define("LIBRARY_COMPILE_BUDGET_S", 2.0, "seconds",
        "chosen: a library kernel compiled in a model's first call is paid by every new user "
        "and container; a few of them must stay well under a first call of a few seconds",
        "python -m numbackend compile-report flags a compile of a library kernel whose own "
        "time (its nested compiles left out) is over this")
