"""A scan's loop over time as blocks run by the library's one loop.

A scan's loop written as one generated function (scan_loop.py) compiles for
as long as it has calls: an LSTM's backward step, 60 calls a step, took
seconds.  Here the same steps become blocks of jit_kernels.steps, a row of
int64 numbers each, run by its precompiled ``run_steps``: a fused kernel
through its module's ``step_block`` (numbackend/codegen.py), which compiles
about as long as the kernel's ``run_serial`` that the generated loop calls; a
product, a concatenation along the last axis and the copies into the stacked
outputs and the states through the library's blocks, compiled into its seed.
A model then compiles no loop of its own.

The blocks compute what the generated loop computes, in the same order with
the same kernels and products (the panels where ``packed_products``, the
products of a sequence for all steps at once where ``hoisted_products``), so
that both give the same bits.  The values of a step have arrays of their own,
shared where one's life ends before another's starts.  Each state has two
arrays, read and written in turn: a step writes its new state (where a block
computes it) into the array that the next step reads.

Where a scan's rows are too few to split between the threads (scan_loop.py),
several threads share each step (``run_steps_shared``): each block is made
in parts, a product's by its panels (its columns), a kernel's and a copy's by
the rows.  A run of blocks of one kind is a group; the part i of a group is
one task, run by one thread, and the threads wait for a group's tasks before
the next group's start.  Each element is computed as on one thread: the
same bits.
"""
import math
import operator
import time

import numpy as np

from . import codegen, program
from .ops.linalg import is_float_matrix_product

_SCALAR_OF = ".reshape(-1)[0]"  # a kernel's argument: the one item of an array


class _Kernel:
    def __init__(self, call):
        self.spec, self.args, self.outs = call.spec, call.args, call.outs
        self.module = None  # the kernel's module with its step block, once compiled
        self.reads = [a.removesuffix(_SCALAR_OF) for a in self.args]


class _Product:
    def __init__(self, step, hoisted_from):
        self.x, self.w = step.ins
        self.out = step.out
        self.transpose_a = bool(step.node.attrs.get("transpose_a"))
        self.transpose_b = bool(step.node.attrs.get("transpose_b"))
        self.itemsize = np.dtype(step.node.dtype).itemsize
        self.hoisted_from = hoisted_from  # the index of x's sequence, where x is one's slice
        self.reads = [self.x, self.w]


class _Concatenate:
    def __init__(self, step):
        self.ins, self.out, self.dtype = step.ins, step.out, np.dtype(step.node.dtype)
        self.reads = list(self.ins)


def plan_blocks(plan, n_seq, n_state, n_stacked, packable):
    """The :class:`StepBlocks` of a scan body's program ``plan`` (see
    scan_loop.compile_loop), or None where a step has no block: every step must
    be a fused kernel whose outputs have its domain's shape, a 2-D product of
    floats, or a concatenation along the last axis.  ``packable``: the names of
    the invariants whose products run on packed panels where the loop's
    ``packed_products`` says so."""
    state_names = {f"p{n_seq + j}" for j in range(n_state)}
    operations = []
    for step in plan.steps:
        if isinstance(step, program.FusedGroup):
            if step.kernel is None or not codegen.takes_step_block(step.kernel.spec):
                return None
            operations.append(_Kernel(step.kernel))
        elif isinstance(step, program.LibraryCall) and step.node.op == "dot":
            if not is_float_matrix_product(step.node):
                return None
            x, w = step.ins
            sequence = int(x[1:]) if x[0] == "p" and int(x[1:]) < n_seq else None
            hoisted = (sequence is not None and w in packable
                       and not step.node.attrs.get("transpose_a"))
            operations.append(_Product(step, sequence if hoisted else None))
        elif isinstance(step, program.LibraryCall) and step.node.op == "concatenate":
            node = step.node
            if node.ndim == 0 or node.attrs["axis"] % node.ndim != node.ndim - 1 or any(
                    i.dtype != node.dtype or i.ndim != node.ndim for i in node.inputs):
                return None
            operations.append(_Concatenate(step))
        else:
            return None
    results = plan.result_names
    if any(name in state_names for name in results[len(results) - n_state:]):
        return None  # a state handed on as another's: the copies would overlap
    return StepBlocks(operations, n_seq, n_state, n_stacked, results, set(packable))


class StepBlocks:
    """The steps of a scan as blocks (see the module), called with the
    arguments of the generated loop's function (scan_loop.Loop); ``compile()``
    first, which compiles or loads the kernels' blocks."""

    def __init__(self, operations, n_seq, n_state, n_stacked, results, packable):
        self.operations = operations
        self.n_seq, self.n_state, self.n_stacked = n_seq, n_state, n_stacked
        self.results = results
        self.packable = packable
        self.constant_names = []  # set by the Loop: the names of its constant arguments
        self._addresses = None
        self._tables = {}  # {the arguments' kinds: a pool of _Tables for them, or None}
        self._constants = ((), [])  # the constants given, and as arrays
        # whether threads can share each step (prepare's ``shared``): every
        # product is by an invariant packed into panels, which they split
        self.can_share = all(op.w in packable and not op.transpose_a
                             for op in operations if isinstance(op, _Product))

    def step_products(self, invariants):
        """(the fewest panels of any, multiply-adds a row of all) of the products
        in the steps, where the products of a sequence's steps run before the
        loop, by the loop's ``invariants``, where :attr:`can_share` (every
        product is by one); (0, 0) where the steps have none."""
        from jit_kernels import packed
        first = self.n_seq + self.n_state
        panels, work = [], 0
        for op in self.operations:
            if isinstance(op, _Product) and op.hoisted_from is None:
                w = invariants[int(op.w[1:]) - first]
                width = packed.panel_width(op.itemsize)
                panels.append(-(-(w.shape[0] if op.transpose_b else w.shape[1]) // width))
                work += w.size
        return min(panels, default=0), work

    @property
    def kernel_modules(self):
        return [op.module for op in self.operations if isinstance(op, _Kernel)]

    def compile(self):
        """Compile (or load) every block the steps call; returns the modules of
        the kernels' blocks, to be held while the blocks run."""
        from jit_kernels import steps
        addresses = {"copy": steps.block_address(steps.copy_block)}
        for op in self.operations:
            if isinstance(op, _Kernel):
                op.module = codegen.load_kernel(codegen.kernel_source(op.spec, True))
                addresses[id(op)] = steps.block_address(op.module.step_block)
            elif isinstance(op, _Product):
                addresses[op.itemsize] = steps.block_address(steps.PRODUCT_BLOCKS[op.itemsize])
        empty = np.zeros((0, 1), np.int64)
        steps.run_steps(0, 0, 0, False, np.zeros(0, np.int64), empty, empty)  # loaded
        self._addresses = addresses
        return self.kernel_modules

    def __call__(self, *arguments, shared=1):
        """Steps first..stop-1 over rows lo:hi, with the arguments of the
        generated loop's function (scan_loop.compile_loop); the final states,
        or None where the arrays do not fit the steps (the caller then runs
        them from Python).  ``shared``: see :meth:`prepare`."""
        run = self.prepare(*arguments, shared=shared)
        return None if run is None else run()

    def prepare(self, first, stop, steps, reverse, lo, hi, packed_products, hoisted_products,
                *arrays, shared=1):
        """:meth:`__call__` in two: the work in Python now, and a function that
        runs the steps (releasing the GIL) and returns the final states; None
        where the arrays do not fit the steps.  The parts of a loop split by
        rows are prepared one after another, then run at once: prepared in
        their threads, each waited for the GIL while the other prepared.

        ``shared`` > 1: that many threads of BLAS's pool run every step
        together (jit_kernels.steps.run_steps_shared), the products split by
        their panels, the kernels and copies by the rows, waiting for each
        other where a block reads what the blocks before wrote; only where
        :attr:`can_share`, with packed products, over all the rows, and at most
        as many threads as rows.  The products of a sequence's steps, where
        ``hoisted_products``, run before the steps on all of BLAS's threads, as
        on one thread: the bits do not depend on ``shared``."""
        from jit_kernels import parts
        from jit_kernels import steps as library

        n_seq, n_state = self.n_seq, self.n_state
        # each state's two arrays, the first step reading the first
        pairs = [np.empty((2,) + s.shape, s.dtype) for s in arrays[n_seq:n_seq + n_state]]
        for pair, s in zip(pairs, arrays[n_seq:n_seq + n_state]):
            pair[0] = s
        arrays = list(arrays)  # contiguous (scan_loop.Loop), but for the constants
        arrays[n_seq:n_seq + n_state] = pairs
        end = len(arrays) - self.n_stacked
        constants = tuple(arrays[end - len(self.constant_names):end])
        known = self._constants  # read once: another thread may replace it
        if len(known[0]) != len(constants) or not all(map(operator.is_, known[0], constants)):
            known = self._constants = (constants, [np.ascontiguousarray(c) for c in constants])
        arrays[end - len(constants):end] = known[1]  # the same arrays call after call
        key = (first, stop, steps, bool(reverse), lo, hi, bool(packed_products),
               bool(hoisted_products), shared, *[a.shape for a in arrays],
               *[a.dtype for a in arrays])
        # a table runs one call at a time: each call takes one from the pool
        pool = self._tables.setdefault(key, [])
        if pool is None:
            return None  # arguments of this kind do not fit the steps
        try:
            table = pool.pop()
        except IndexError:
            table = self._table(first, stop, steps, reverse, lo, hi, packed_products,
                                hoisted_products, arrays, shared)
            if table is None:
                self._tables[key] = None
                return None
        table.refill(arrays)
        blocks, descriptors, moving = table.for_call(
            table.addresses_of(arrays, n_seq + n_state, len(arrays) - self.n_stacked))

        def run():
            if table.shared > 1:
                calls, tasks, counters = table.shared_arrays
                counters[:] = 0
                start = time.monotonic_ns()
                parts.run_parts(table.shared, lambda i: library.run_steps_shared(
                    first, stop, steps, bool(reverse), blocks, descriptors, moving, calls, tasks,
                    counters))
                parts.note_shared_run(counters[library.SHARED_LONG_WAITS],
                                      time.monotonic_ns() - start, stop - first)
            else:
                library.run_steps(first, stop, steps, bool(reverse), blocks, descriptors, moving)
            pool.append(table)
            return tuple(pair[(stop - first) % 2] for pair in pairs)  # the last step wrote it
        return run

    def _table(self, first, stop, steps, reverse, lo, hi, packed_products, hoisted_products,
               arrays, shared):
        """The blocks of the steps for these arguments (see prepare) as a
        :class:`_Table`, or None where they do not fit the steps."""
        n_seq, n_state, n_stacked = self.n_seq, self.n_state, self.n_stacked
        if shared > 1 and not (self.can_share and packed_products and lo == 0):
            raise ValueError("StepBlocks: threads share only steps whose products all run on "
                             "packed weights, over all the rows")
        n_const = len(self.constant_names)
        n_inv = len(arrays) - n_seq - n_state - n_const - n_stacked
        earliest = steps - stop if reverse else first
        last = steps - first if reverse else stop
        table = _Table()
        values = {}
        if shared > 1:
            rows = arrays[n_seq].shape[1] if n_state else _rows(arrays[0], lo, hi)  # (pairs)
            if not 1 < shared <= rows:
                return None
            table.share(shared, rows)
        for i, s in enumerate(arrays[:n_seq]):  # the step's slice s[t, lo:hi]
            values[f"p{i}"] = table.moving(i, s, (_rows(s, lo, hi),) + s.shape[2:], s.strides[1] * lo)
        t0 = steps - 1 - first if reverse else first  # the first step's index
        results = self.results
        written = {}  # {the name of a new state a block writes: where it goes}
        for j in range(n_state):
            pair, name = arrays[n_seq + j], results[len(results) - n_state + j]
            values[f"p{n_seq + j}"] = table.alternating(n_seq + j, pair, t0 % 2)
            if name not in written and name.startswith("v"):  # a step's value (program.py)
                written[name] = table.alternating(n_seq + j, pair, 1 - t0 % 2)
        for j in range(n_inv):
            index = n_seq + n_state + j
            values[f"p{index}"] = table.fixed(index, arrays[index])
        constants = {}
        for k, name in enumerate(self.constant_names):
            index = n_seq + n_state + n_inv + k
            constants[name] = arrays[index]
            values[name] = table.fixed(index, arrays[index])
        stacked = range(len(arrays) - n_stacked, len(arrays))
        # the steps' values share arrays where one's life ends before another's
        # starts: the few arrays a step then works in stay in the core's L1 cache
        last_read = {name: k for k, op in enumerate(self.operations) for name in op.reads}
        last_read.update((name, len(self.operations)) for name in results)
        table.written = written
        for k, op in enumerate(self.operations):
            if isinstance(op, _Kernel):
                if not self._kernel_row(op, table, values, constants):
                    return None
            elif isinstance(op, _Product):
                if not self._product_row(op, table, values, arrays, packed_products,
                                         hoisted_products, (earliest, last, lo, hi)):
                    return None
            else:
                ins = [values[name] for name in op.ins]
                shape = ins[0].shape[:-1] + (sum(v.shape[-1] for v in ins),)
                if any(v.shape[:-1] != shape[:-1] for v in ins):
                    return None
                out = values[op.out] = table.scratch(op.out, shape, op.dtype)
                offset = 0
                for v in ins:
                    width = v.shape[-1] * op.dtype.itemsize
                    table.copy(self._addresses["copy"], v, out, math.prod(shape[:-1]), width,
                               width, shape[-1] * op.dtype.itemsize, offset)
                    offset += width
            # after the step's outputs are placed, so that none shares its inputs' arrays
            table.release(values[name] for name in set(op.reads) if last_read[name] == k)
        for k, index in enumerate(stacked):  # into stacked[t, lo:hi]
            value, target = values[results[k]], arrays[index]
            if ((_rows(target, lo, hi),) + target.shape[2:] != value.shape
                    or target.dtype != value.dtype):
                return None
            destination = table.moving(index, target, value.shape, target.strides[1] * lo)
            table.copy(self._addresses["copy"], value, destination, None, None, 0, 0, 0)
        for j in range(n_state):
            name, pair = results[len(results) - n_state + j], arrays[n_seq + j]
            value = values[name]
            if value.shape != pair.shape[1:] or value.dtype != pair.dtype:
                return None
            if written.get(name) is not value:  # not written in place by its block
                table.copy(self._addresses["copy"], value,
                           table.alternating(n_seq + j, pair, 1 - t0 % 2), None, None, 0, 0, 0)
        return table

    def _kernel_row(self, op, table, values, constants):
        """The block of a fused kernel; False where its arguments do not fit it."""
        cells, shapes = [], []  # (column, value, whether it is an array)
        slots = codegen.step_block_slots(op.spec)
        for arg, (column, rank), (pattern, _, dtype) in zip(op.args, slots, op.spec.inputs):
            if pattern != "S":
                value = values[arg]
                if len(value.shape) != rank:
                    return False
                cells.append((column, value, True))
                shapes.append(value.shape)
                continue
            if arg.endswith(_SCALAR_OF):
                value = values[arg[:-len(_SCALAR_OF)]]
                if math.prod(value.shape) != 1:
                    return False
            else:  # a scalar constant, of the type the kernel reads
                value = table.own(np.array([constants[arg]], dtype))
            cells.append((column, value, False))
            shapes.append(None)
        shape = codegen.domain_shape(op.spec, shapes)
        reads = [value for _, value, _ in cells]
        for out, (column, _), (j, _, _) in zip(op.outs, slots[len(op.args):], op.spec.outputs):
            values[out] = table.scratch(out, shape, op.spec.nodes[j][4])
            cells.append((column, values[out], True))
        table.block("rows", reads, [values[out] for out in op.outs])
        for part in table.row_parts():
            row = table.row(self._addresses[id(op)])
            for column, value, is_array in cells:
                # the kernel's part of the rows: of its arrays with those rows
                # (not those broadcast along them)
                if (part is not None and is_array and len(value.shape) == len(shape)
                        and value.shape[:1] == shape[:1]):
                    value = value.rows(*part)
                table.put(row, column, value, value.shape if is_array else ())
        return True

    def _product_row(self, op, table, values, arrays, packed_products, hoisted_products, bounds):
        """The block of a product (none where the products of a sequence's steps
        run before the loop); False where its operands do not fit it."""
        from jit_kernels import packed
        from jit_kernels import steps as library
        x, w = values[op.x], values[op.w]
        if len(x.shape) != 2 or len(w.shape) != 2:
            return False
        m, k = x.shape[::-1] if op.transpose_a else x.shape
        n = w.shape[0] if op.transpose_b else w.shape[1]
        if k != (w.shape[1] if op.transpose_b else w.shape[0]):
            return False
        if op.hoisted_from is not None and hoisted_products:
            earliest, last, lo, hi = bounds
            sequence, tb = op.hoisted_from, np.bool_(op.transpose_b)
            steps = table.refilled(np.empty((last - earliest, m, n), x.dtype), lambda arrays, out: (
                packed.steps_product_into(arrays[sequence], earliest, last, lo, hi, arrays[w.index],
                                          tb, out)))
            values[op.out] = _Value(steps.array, (m, n),
                                    steps.address - earliest * steps.array.strides[0],
                                    steps.array.strides[0])
            return True
        out = values[op.out] = table.scratch(op.out, (m, n), x.dtype)
        panels = None
        if packed_products and op.w in self.packable and not op.transpose_a:
            width = packed.panel_width(x.dtype.itemsize)
            tb = np.bool_(op.transpose_b)
            panels = table.refilled(
                np.empty(((n + width - 1) // width, k, width), x.dtype),
                lambda arrays, out: packed.pack_into(arrays[w.index], tb, out), key=(op.w, tb))
        table.block("columns", [x, w], [out])
        for first, end in table.panel_parts(0 if panels is None else panels.shape[0]):
            row = table.row(self._addresses[op.itemsize])
            table.put(row, library.PRODUCT_A, x, (m, k))
            table.put(row, library.PRODUCT_B, w, w.shape)
            table.set(row, library.PRODUCT_TRANSPOSE_B, int(op.transpose_b))
            if panels is not None:
                table.put(row, library.PRODUCT_PANELS, panels, panels.shape[:1])
            table.put(row, library.PRODUCT_OUT, out, ())
            table.set(row, library.PRODUCT_TRANSPOSE_A, int(op.transpose_a))
            table.set(row, library.PRODUCT_PANEL_RANGE, first)
            table.set(row, library.PRODUCT_PANEL_RANGE + 1, end)
        return True


def _rows(stack, lo, hi):
    """The number of rows of ``stack[t, lo:hi]``."""
    return max(0, min(hi, stack.shape[1]) - lo)


def _address(array):
    return array.__array_interface__["data"][0]


class _Value:
    """An array the blocks read or write: at ``address + t * stride + (t % 2) *
    flip`` for step t.  ``index``: the argument of the
    call it lies in (see _Table), None where the table owns it."""

    def __init__(self, array, shape, address, stride, index=None, flip=0):
        self.array, self.shape, self.address, self.stride = array, tuple(shape), address, stride
        self.index = index
        self.flip = flip  # added at odd t
        self.dtype = array.dtype
        self.nbytes = math.prod(self.shape) * array.itemsize

    def rows(self, lo, hi):
        """Its rows lo:hi (along axis 0)."""
        row_bytes = self.nbytes // self.shape[0] if self.shape[0] else 0
        return _Value(self.array, (hi - lo,) + self.shape[1:], self.address + lo * row_bytes,
                      self.stride, self.index, self.flip)


class _Table:
    """The blocks' addresses, their descriptors and the descriptors' moving
    addresses (see jit_kernels.steps.run_steps), built row by row for one
    call's arrays, and run again for another call's arrays of the same shapes:
    an address in an argument of the call is written again for each
    (:meth:`for_call`); the arrays of the steps' own values, and those filled
    again from the arguments at each call (:meth:`refilled`: packed weights, a
    sequence's products for all steps), are the table's, and stay."""

    def __init__(self):
        self.blocks, self.rows, self.moves = [], [], []
        self.owned = []  # the arrays the table owns
        self._free = {}  # {(shape, dtype): values whose arrays no later value reads}
        self.fills, self._refilled = [], {}  # see refilled
        self.cells, self.moving_cells = [], []  # (row, column / move, argument, offset)
        self._arrays = None
        self._steady = ((), [])  # the last call's invariants and constants, and their addresses
        self.written = {}  # {a new state's name: where its block writes it} (see scratch)
        # threads sharing each step (see share): their count, the rows' bounds
        # between them, and each block's (kind, first row, arrays read, written)
        self.shared, self._bounds, self._accesses = 1, None, []
        self.shared_arrays = None  # (calls, tasks, counters) of run_steps_shared

    def share(self, parts, rows):
        """Make each block's rows in ``parts`` parts, one for each thread of a
        shared run: a kernel's or copy's part of the ``rows``, a product's part
        of its panels."""
        self.shared = parts
        self._bounds = [rows * i // parts for i in range(parts + 1)]

    def row_parts(self):
        """The (lo, hi) of each part of the rows, or [None] where unshared."""
        return list(zip(self._bounds, self._bounds[1:])) if self.shared > 1 else [None]

    def panel_parts(self, panels):
        """The (first, end) of each part of ``panels`` panels, or [(0, -1)] (all)
        where unshared."""
        parts = self.shared
        if parts == 1:
            return [(0, -1)]
        if not panels:
            raise ValueError("StepBlocks: threads share a product only on packed panels")
        return [(panels * i // parts, panels * (i + 1) // parts) for i in range(parts)]

    def block(self, kind, reads, writes):
        """The next block's rows (one for each part, made next) work by ``kind``:
        "rows" (each part the same rows of every array it touches) or "columns"
        (each part reads the whole of ``reads``, writes its columns of
        ``writes``)."""
        self._accesses.append((kind, len(self.rows), {id(v.array) for v in reads},
                               {id(v.array) for v in writes}))

    def own(self, array):
        self.owned.append(array)
        return _Value(array, array.shape, _address(array), 0)

    def scratch(self, name, shape, dtype):
        """Where a block writes the step's value ``name``: its state's array
        where it is a new state (:attr:`written`), else an array of the table,
        one released or a new one."""
        state = self.written.get(name)
        if state is not None and state.shape == tuple(shape) and state.dtype == dtype:
            return state
        self.written.pop(name, None)  # (the shapes then differ: refused later)
        free = self._free.get((tuple(shape), np.dtype(dtype)))
        return free.pop() if free else self.own(np.empty(shape, dtype))

    def release(self, values):
        """The arrays of ``values`` that are the table's, free for later values."""
        for value in values:
            if value.index is None and value.stride == 0 and value.flip == 0:
                self._free.setdefault((value.shape, value.dtype), []).append(value)

    def alternating(self, index, pair, slot_at_even_t):
        """The state in argument ``index``, ``pair`` (its two arrays): at even t
        its array ``slot_at_even_t``, at odd t the other."""
        size = pair.strides[0]
        return _Value(pair, pair.shape[1:], _address(pair) + slot_at_even_t * size, 0, index,
                      size if slot_at_even_t == 0 else -size)

    def fixed(self, index, array):
        """Argument ``index`` of the call, ``array``."""
        return _Value(array, array.shape, _address(array), 0, index)

    def moving(self, index, array, shape, offset):
        """A step's part of argument ``index`` (``array``, indexed by the step
        along axis 0), ``offset`` bytes in."""
        return _Value(array, shape, _address(array) + offset, array.strides[0], index)

    def refilled(self, array, fill, key=None):
        """``array``, the table's, which ``fill(arguments, array)`` fills again
        before each call's steps (:meth:`refill`); one for each ``key``."""
        if key is not None and key in self._refilled:
            return self._refilled[key]
        self.fills.append((fill, array))
        value = self.own(array)
        if key is not None:
            self._refilled[key] = value
        return value

    def refill(self, arguments):
        """Fill the arrays of :meth:`refilled` for a call's ``arguments``."""
        for fill, array in self.fills:
            fill(arguments, array)

    def row(self, block):
        self.blocks.append(block)
        self.rows.append([])
        return len(self.rows) - 1

    def set(self, row, column, number):
        items = self.rows[row]
        items.extend([0] * (column + 1 - len(items)))
        items[column] = int(number)

    def put(self, row, column, value, dims):
        """``value``'s address at ``column`` of ``row``, ``dims`` after it."""
        self.set(row, column, value.address)
        if value.index is not None:
            base = _address(value.array)
            self.cells.append((row, column, value.index, value.address - base))
            if value.stride or value.flip:
                self.moving_cells.append((len(self.moves), value.index, value.address - base))
        if value.stride or value.flip:
            self.moves.append((row, column, value.address, value.stride, value.flip))
        for a, d in enumerate(dims):
            self.set(row, column + 1 + a, d)

    def copy(self, block, source, target, lines, length, source_step, target_step, offset):
        """A copy block: ``lines`` lines of ``length`` bytes from ``source`` to
        ``target`` (``offset`` bytes in); ``lines`` None: the whole of source,
        of target's shape."""
        from jit_kernels import steps as library
        self.block("rows", [source], [target])
        for part in self.row_parts():
            whole_lines, whole_length = (1, source.nbytes) if lines is None else (lines, length)
            part_source, part_target = source, target
            if part is not None:
                part_source, part_target = source.rows(*part), target.rows(*part)
                if lines is None:
                    whole_length = part_source.nbytes
                else:  # lines of each row
                    whole_lines = lines // source.shape[0] * part_source.shape[0]
            row = self.row(block)
            self.put(row, library.COPY_FROM, part_source, ())
            self.put(row, library.COPY_TO, _Value(
                part_target.array, part_target.shape, part_target.address + offset,
                part_target.stride, part_target.index, part_target.flip), ())
            for column, number in enumerate((whole_lines, whole_length, source_step, target_step),
                                            library.COPY_LINES):
                self.set(row, column, number)

    def addresses_of(self, arrays, start, end):
        """The addresses of a call's arguments ``arrays``, as an int64 array.
        Those of arguments start:end
        (the invariants and constants: a layer's weights, the same arrays call
        after call) are read again only where one is another array: reading an
        address costs a microsecond.  (An array keeps its data where it is
        while referenced: NumPy refuses to resize it.)"""
        steady = arrays[start:end]
        known = self._steady
        if len(known[0]) != len(steady) or not all(map(operator.is_, known[0], steady)):
            known = self._steady = (steady, [_address(a) for a in steady])
        return np.array([_address(a) for a in arrays[:start]] + known[1]
                        + [_address(a) for a in arrays[end:]], np.int64)

    def for_call(self, bases):
        """(blocks, descriptors, moving) for run_steps, with the addresses in the
        call's arguments (``bases``, their addresses) written."""
        if self._arrays is None:
            width = max(len(items) for items in self.rows)
            descriptors = np.zeros((len(self.rows), width), np.int64)
            for r, items in enumerate(self.rows):
                descriptors[r, :len(items)] = items
            cells = np.array(self.cells, np.int64).reshape(-1, 4)
            moving_cells = np.array(self.moving_cells, np.int64).reshape(-1, 3)
            moves = np.array(self.moves, np.int64).reshape(-1, 5)
            if self.shared > 1:
                moves, moving_cells = self._share(moves, moving_cells)
            self._arrays = (np.array(self.blocks, np.int64), descriptors, moves, cells, moving_cells)
        blocks, descriptors, moves, cells, moving_cells = self._arrays
        descriptors[cells[:, 0], cells[:, 1]] = bases[cells[:, 2]] + cells[:, 3]
        moves[moving_cells[:, 0], 2] = bases[moving_cells[:, 1]] + moving_cells[:, 2]
        return blocks, descriptors, moves

    def _share(self, moves, moving_cells):
        """The tasks of a shared run (jit_kernels.steps.run_steps_shared) into
        :attr:`shared_arrays`; ``moves`` ordered by task, and ``moving_cells``
        pointing into them so.

        Consecutive blocks of one kind form a group, the threads waiting for
        each other between groups: where the kind changes, and between products
        where one reads or writes what another of the group writes, or writes
        what it reads (a product reads the whole of its operands).  Each part
        of a group is one task: the part's rows of each block, in order, on
        one thread."""
        from jit_kernels import steps as library
        parts = self.shared
        groups = []  # [kind, first rows of its blocks, arrays read, written]
        for kind, first, reads, writes in self._accesses:
            group = groups[-1] if groups else None
            if group is None or group[0] != kind or kind == "columns" and (
                    reads & group[3] or writes & (group[2] | group[3])):
                group = [kind, [], set(), set()]
                groups.append(group)
            group[1].append(first)
            group[2] |= reads
            group[3] |= writes
        calls, task_of_row = [], {}
        tasks = np.zeros((len(groups) * parts, library.TASK_WIDTH), np.int64)
        for g, (_, firsts, _, _) in enumerate(groups):
            for part in range(parts):
                task = g * parts + part
                tasks[task, library.TASK_CALLS] = len(calls)
                for first in firsts:
                    task_of_row[first + part] = task
                    calls.append(first + part)
                tasks[task, library.TASK_CALLS + 1] = len(calls)
                tasks[task, library.TASK_AFTER] = g * parts
        order = np.argsort([task_of_row[row] for row in moves[:, 0]], kind="stable")
        moves = moves[order]
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        moving_cells = moving_cells.copy()
        moving_cells[:, 0] = position[moving_cells[:, 0]]
        ends = np.searchsorted([task_of_row[row] for row in moves[:, 0]],
                               np.arange(len(tasks) + 1))
        tasks[:, library.TASK_MOVES], tasks[:, library.TASK_MOVES + 1] = ends[:-1], ends[1:]
        self.shared_arrays = (np.array(calls, np.int64), tasks,
                              np.zeros(library.SHARED_COUNTERS, np.int64))
        return moves, moving_cells
