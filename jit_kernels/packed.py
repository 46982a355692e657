"""Matrix products whose right operand is packed once and used many times.

A scan's step multiplies a few rows (an RNN's batch) by the same weights at
every step, and Winograd's convolution multiplies its blocks by the same 36
transformed kernels: small products, where OpenBLAS spends much of its time
packing both operands again on every call and runs far below the speed of its
large products.
Here the right operand is packed once by :func:`pack` into panels of
:func:`panel_width` columns, contiguous along k (or, used once, read in place
by :func:`matmul`), and each product runs a register
tile of up to :data:`TILE_ROWS` rows by one panel: the tile's sums stay in
vector registers for the whole of k, each step of k loading one row of the
panel and broadcasting one value of each row of the left operand (the
micro-kernel of BLIS and of OpenBLAS itself).  It beats OpenBLAS on such
products, float32 and float64 (PERFORMANCE.md, W3: packed products).  A
single row is a matrix times a vector, where BLAS's gemv is about as fast: a
scan's loop chooses between the two by the rows (tuning.SCAN_PACKED_MIN_ROWS),
and beyond one block of rows by :func:`runs_packed`.

The micro-kernel is LLVM vector code written with llvmlite
(:func:`_tile_kernel`): Numba's own loops keep such a tile's sums in memory.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import blas, machine, parts, tuning
from .compiling import by_address, njit_cached, target_vector_bytes

# compiled into the kernels: set by the environment alone (see jit_kernels.tuning);
# the CPU target's width (not the host's), which is part of the cache's key
VECTOR_BYTES = tuning.PACKED_VECTOR_BYTES or target_vector_bytes()
# A panel is two vectors wide, and a tile has up to six rows: 12 vector sums,
# two vectors of the panel and a broadcast value fit AVX2's 16 registers.  Not
# a tuning entry: the six tile kernels below are written for it.  AVX-512's 32
# registers would hold 14 rows: tiles of 12 ran from no faster to 17% faster
# than tiles of 6 on one core of a busy 2-core AVX-512 Xeon VM, within its
# noise, so the six stay until a quiet machine says otherwise (the panels do
# follow the vector width).
TILE_ROWS = 6


@njit_cached()
def panel_width(itemsize):
    """The columns of a panel of :func:`pack` for items of ``itemsize`` bytes."""
    return 2 * VECTOR_BYTES // itemsize


def _tile_kernel(rows, panels=1):
    """An intrinsic ``tile(a, a_start, lda, b, panel_start, panel_step, ldb, out,
    out_start, ldo, depth, accumulate)``: out's ``rows`` x ``panels`` panels tile
    at ``out_start`` (rows ``ldo`` apart) = a's ``rows`` x ``depth`` block at
    ``a_start`` (rows ``lda`` apart) @ b's ``depth`` x panel blocks, the first
    at ``panel_start``, the next ``panel_step`` after it, and so on (rows
    ``ldb`` apart), plus the tile's own values where ``accumulate`` is nonzero
    (a chunk of k after the first); every start and distance counted in items."""
    # A tile of few rows has few sums, each a chain of dependent multiply-adds
    # whose latency would bound the loop: it keeps 2 or 4 sets of sums, each for
    # every 2nd or 4th k, so that 8 sums or more are under way (with one set a
    # single row ran well behind BLAS's gemv).
    chains = -(-8 // (2 * rows * panels))

    @intrinsic
    def tile(typingctx, a, a_start, lda, b, panel_start, panel_step, ldb, out, out_start, ldo,
             depth, accumulate):
        # any mix of the two float types compiles; _check refuses one at run time
        if not all(isinstance(x, types.Array) and x.dtype in (types.float32, types.float64)
                   for x in (a, b, out)):
            return None
        index = types.intp
        sig = types.void(a, index, index, b, index, index, index, out, index, index, index, index)

        def codegen(context, builder, signature, args):
            (a, a_start, lda, b, panel_start, panel_step, ldb, out, out_start, ldo, depth,
             accumulate) = args

            scalar = context.get_value_type(signature.args[0].dtype)

            def pointer(position, value, start):
                array = context.make_array(signature.args[position])(context, builder, value)
                data = builder.bitcast(array.data, scalar.as_pointer())
                return builder.gep(data, [start])

            a_at, panel_at, out_at = (pointer(0, a, a_start), pointer(3, b, panel_start),
                                      pointer(7, out, out_start))
            itemsize = context.get_abi_sizeof(scalar)
            width = VECTOR_BYTES // itemsize
            vector = ir.VectorType(scalar, width)
            intp = context.get_value_type(index)
            # fused multiply-add where the machine has one, else a multiply and an add
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector] * 3),
                f"llvm.fmuladd.v{width}f{8 * itemsize}")
            splat = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
            undefined = ir.Constant(vector, ir.Undefined)

            def at(base, *offsets):
                return builder.gep(base, [builder.add(*offsets) if len(offsets) > 1 else offsets[0]])

            def vector_at(base, *offsets):
                return builder.bitcast(at(base, *offsets), vector.as_pointer())

            def constant(value):
                return ir.Constant(intp, value)

            # allocas in the entry block: LLVM keeps them in registers; two
            # vectors of sums for each row of each panel
            sums = [[[cgutils.alloca_once_value(builder, ir.Constant(vector, None))
                      for _ in range(2 * panels)] for _ in range(rows)] for _ in range(chains)]
            # where each panel's vectors lie, from the first panel's row
            vector_starts = [builder.add(builder.mul(constant(p), panel_step), constant(h * width))
                             for p in range(panels) for h in range(2)]

            def out_vector(r, h):
                return vector_at(out_at, builder.mul(constant(r), ldo), constant(h * width))

            # a later chunk of k adds to what the chunks before it left in out
            with builder.if_then(builder.icmp_signed("!=", accumulate, constant(0))):
                for r in range(rows):
                    for h in range(2 * panels):
                        builder.store(builder.load(out_vector(r, h), align=itemsize), sums[0][r][h])

            def step(k, chain):
                """sums[chain] += a's column k times the panels' row k"""
                row_at = builder.mul(k, ldb)
                panel = [builder.load(vector_at(panel_at, row_at, start), align=itemsize)
                         for start in vector_starts]
                for r in range(rows):
                    value = builder.load(at(a_at, builder.mul(constant(r), lda), k))
                    broadcast = builder.shuffle_vector(
                        builder.insert_element(undefined, value, ir.Constant(ir.IntType(32), 0)),
                        undefined, splat)
                    for h, loaded in enumerate(panel):
                        total = sums[chain][r][h]
                        builder.store(builder.call(fmuladd, [broadcast, loaded,
                                                             builder.load(total)]), total)

            # k in groups of ``chains``, each into its own sums, then what is left
            whole = builder.mul(builder.sdiv(depth, constant(chains)), constant(chains))
            with cgutils.for_range_slice(builder, constant(0), whole, constant(chains),
                                         intp) as (k, _):
                for chain in range(chains):
                    step(builder.add(k, constant(chain)), chain)
            with cgutils.for_range_slice(builder, whole, depth, constant(1), intp) as (k, _):
                step(k, 0)
            for r in range(rows):
                for h in range(2 * panels):
                    total = builder.load(sums[0][r][h])
                    for chain in range(1, chains):
                        total = builder.fadd(total, builder.load(sums[chain][r][h]))
                    builder.store(total, out_vector(r, h), align=itemsize)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile1, _tile2, _tile3, _tile4, _tile5, _tile6 = (_tile_kernel(r) for r in range(1, TILE_ROWS + 1))
# A one-row tile multiplies each vector of the panel it loads once: it takes
# tuning.PACKED_ONE_ROW_PANELS panels at a time (see there).
ONE_ROW_PANELS = tuning.PACKED_ONE_ROW_PANELS
_tile_one_row = _tile_kernel(1, ONE_ROW_PANELS)

_JIT = {"error_model": "numpy", "nogil": True}
# A product runs in chunks of k: a panel's rows of one chunk and a block of
# rows of the left operand over it stay in the L2 cache while every tile of the
# block passes over every panel, however long k is (BLIS's blocking, the
# operands' roles swapped).  See tuning.PACKED_CHUNK_BYTES, PACKED_BLOCK_BYTES.
_CHUNK_BYTES = tuning.PACKED_CHUNK_BYTES
_BLOCK_BYTES = tuning.PACKED_BLOCK_BYTES


@njit_cached()
def chunk_depth(itemsize):
    """How many of k's items a chunk of a product spans, for items of ``itemsize`` bytes."""
    return max(1, _CHUNK_BYTES // (panel_width(itemsize) * itemsize))


@njit_cached()
def block_rows(k, itemsize):
    """The rows of the left operand of a product over k multiplied by every panel
    in turn, one chunk of k at a time: a whole number of tiles."""
    depth = min(max(1, k), chunk_depth(itemsize))
    return max(TILE_ROWS, _BLOCK_BYTES // (depth * itemsize) // TILE_ROWS * TILE_ROWS)


@njit_cached(**_JIT)
def pack(b, transpose_b):
    """op(b) (k x n; op transposing where asked) as panels of :func:`panel_width`
    columns: an array (panels, k, width), the last panel padded with zeros."""
    k, n = (b.shape[1], b.shape[0]) if transpose_b else (b.shape[0], b.shape[1])
    width = panel_width(b.itemsize)
    panels = np.empty(((n + width - 1) // width, k, width), b.dtype)
    pack_into(b, transpose_b, panels)
    return panels


@njit_cached(**_JIT)
def pack_into(b, transpose_b, panels):
    """:func:`pack` into ``panels``, an array of its shape and b's type (a scan
    loop's, packed again at each call without allocating it again)."""
    k, n = (b.shape[1], b.shape[0]) if transpose_b else (b.shape[0], b.shape[1])
    width = panel_width(b.itemsize)
    if (panels.shape[0] != (n + width - 1) // width or panels.shape[1] != k
            or panels.shape[2] != width or panels.itemsize != b.itemsize):
        raise ValueError("jit_kernels.packed.pack_into: the panels' shape does not match")
    full = n // width
    if full < panels.shape[0]:
        panels[full] = 0  # the last panel's padding
    if transpose_b:
        # a panel at a time: its columns are b's rows, read 16 items (a cache
        # line of float32) at a time each; item by item across the rows, whose
        # addresses a power of two apart share a cache set, ran 2-4x slower
        for j in range(panels.shape[0]):
            first = j * width
            for start in range(0, k, 16):
                for x in range(min(width, n - first)):
                    source = b[first + x]
                    for i in range(start, min(k, start + 16)):
                        panels[j, i, x] = source[i]
        return
    # b's rows in order, each cut into the panels' rows (a panel at a time down
    # b's rows, a row of b apart each, ran four to ten times slower)
    for i in range(k):
        source = b[i]
        for j in range(full):
            row = panels[j, i]
            first = j * width
            for x in range(width):
                row[x] = source[first + x]
        if full < panels.shape[0]:
            row = panels[full, i]
            for x in range(n - full * width):
                row[x] = source[full * width + x]


@njit_cached(**_JIT)
def _tile(rows, a, a_start, lda, b, panel_start, ldb, out, out_start, ldo, depth, accumulate):
    if rows == 6:
        _tile6(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)
    elif rows == 5:
        _tile5(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)
    elif rows == 4:
        _tile4(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)
    elif rows == 3:
        _tile3(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)
    elif rows == 2:
        _tile2(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)
    else:
        _tile1(a, a_start, lda, b, panel_start, 0, ldb, out, out_start, ldo, depth, accumulate)


@njit_cached(**_JIT)
def _check(a, b_itemsize, out, k):
    """(m, n, lda, ldo) of a product of a (m x k) into out, checked."""
    m, n = out.shape
    itemsize = a.itemsize
    if b_itemsize != itemsize or out.itemsize != itemsize:
        raise ValueError("jit_kernels.packed: the operands of a product differ in type")
    if a.shape[0] != m or a.shape[1] != k:
        raise ValueError("jit_kernels.packed: the shapes of a product do not match")
    if (m > 0 and n > 0 and k > 1 and a.strides[1] != itemsize) or (
            m > 0 and n > 1 and out.strides[1] != itemsize):
        raise ValueError("jit_kernels.packed: the rows of a product's operands are not contiguous")
    return m, n, a.strides[0] // itemsize, out.strides[0] // itemsize


@njit_cached(**_JIT)
def _product(a, b, panel_step, ldb, last_panel, out, lda, ldo, epilogue, first_column):
    """out = a @ B, where B's full panels lie in b, the j-th from item j *
    panel_step, its rows ldb apart, and the columns after the last full panel
    in ``last_panel`` (k, width), padded with zeros.  Where ``epilogue`` (a
    parts.CompiledEpilogue's template) is not empty, each block of rows is
    computed into a scratch block, which the epilogue then reads while in
    cache and writes into out, out's columns being the epilogue's from
    ``first_column`` on.  (Not in place: the epilogue's loop checks that its
    input and output do not overlap, and runs unvectorised where they do.)

    Each value of out sums its chunks of k in order, whatever the rows and
    panels around it: a product split by rows or by panels gives the bits of
    the whole."""
    m, k = a.shape
    n = out.shape[1]
    width = last_panel.shape[1]
    full = n // width
    depth = chunk_depth(a.itemsize)
    rows = block_rows(k, a.itemsize)
    scratch = np.empty((min(m, rows) if epilogue.size else 0, n), out.dtype)[:, :]
    for block in range(0, m, rows):
        end = min(m, block + rows)
        target = scratch[:end - block] if epilogue.size else out[block:end]
        ldt = target.strides[0] // target.itemsize
        for start in range(0, max(1, k), depth):  # k = 0 still writes out's zeros
            size = min(depth, k - start)
            later = 1 if start > 0 else 0
            first = 0
            if end - block == 1:  # a single row: ONE_ROW_PANELS panels at a time
                first = full // ONE_ROW_PANELS * ONE_ROW_PANELS
                for j in range(0, first, ONE_ROW_PANELS):
                    _tile_one_row(a, block * lda + start, lda, b, j * panel_step + start * ldb,
                                  panel_step, ldb, target, j * width, ldt, size, later)
            for j in range(first, full):
                for i in range(block, end, TILE_ROWS):
                    _tile(min(TILE_ROWS, end - i), a, i * lda + start, lda, b,
                          j * panel_step + start * ldb, ldb, target, (i - block) * ldt + j * width, ldt,
                          size, later)
        if full * width < n:
            _last_panel_product(a, block, end, last_panel, target, lda, depth)
        if epilogue.size:
            parts.run_epilogue_rows(epilogue, target, out[block:end], first_column)


@njit_cached(**_JIT)
def _last_panel_product(a, first, end, last_panel, out, lda, depth):
    """Rows first:end of a's product by its columns after its last full panel,
    into those columns of out's rows from its first, in chunks of ``depth``
    of k as :func:`_product` sums the full panels."""
    k, width = last_panel.shape
    start = out.shape[1] // width * width
    tile = np.empty((TILE_ROWS, width), out.dtype)  # whole panels' width, cut to n
    for i in range(first, end, TILE_ROWS):
        rows = min(TILE_ROWS, end - i)
        for chunk in range(0, max(1, k), depth):
            # the starts as int64, not literal zeros, and tile typed as any layout, as
            # _product passes out: either way _tile would compile once more
            _tile(rows, a, i * lda + chunk, lda, last_panel, np.int64(chunk * width), width,
                  tile[:, :], np.int64(0), width, min(depth, k - chunk), 1 if chunk > 0 else 0)
        for r in range(rows):
            for c in range(out.shape[1] - start):
                out[i - first + r, start + c] = tile[r, c]


@njit_cached(**_JIT)
def matmul_packed(a, packed, out):
    """out[...] = a @ B for B packed by :func:`pack` (of as many columns as out
    has); a and out float32 or float64 matrices of B's type, their rows
    contiguous."""
    matmul_packed_then(a, packed, out, np.empty(0, np.int64), np.int64(0))


@njit_cached(**_JIT)
def matmul_packed_then(a, packed, out, epilogue, first_column):
    """:func:`matmul_packed`, with each block of rows run through ``epilogue``
    (a parts.CompiledEpilogue's template) as it is done, where that is not
    empty; out's columns are the epilogue's from ``first_column`` on (out: a
    part's columns of the whole result)."""
    panels, k, width = packed.shape
    m, n, lda, ldo = _check(a, packed.itemsize, out, k)
    if panels != (n + width - 1) // width or width != panel_width(packed.itemsize):
        raise ValueError("jit_kernels.packed: the shapes of a product do not match")
    if m == 0 or n == 0:
        return
    # the panels as one matrix, as matmul passes its right operand, and out
    # typed as any layout (out[:, :]), contiguous or a part's columns: one
    # compiled _product for every caller
    _product(a, packed.reshape(panels * k, width), k * width, width, packed[panels - 1], out[:, :], lda,
             ldo, epilogue, first_column)


_matmul_packed_by_address = by_address(matmul_packed)


@njit_cached(inline='always')
def matmul_packed_panels(a, packed, out, first, end):
    """:func:`matmul_packed` of panels first..end-1 of ``packed`` alone, into
    out's columns of them (a part of a product split by its panels)."""
    width = packed.shape[2]
    matmul_packed(a, packed[first:end], out[:, first * width:min(out.shape[1], end * width)])


@njit_cached(**_JIT)
def step_product(a, b, panels, transpose_b, on_panels):
    """A new array ``a @ op(b)`` (op transposing where ``transpose_b``), ``a``
    and ``b`` float32 or float64 matrices of one type, ``a``'s rows contiguous:
    on ``panels`` (``pack(b, transpose_b)``) where ``on_panels``, else through
    BLAS.  A scan's loop chooses between the two at run time for each of its
    products; one call to this, rather than both ways written out at every
    product, keeps the loop's own code small to compile."""
    out = np.empty((a.shape[0], b.shape[0] if transpose_b else b.shape[1]), dtype=a.dtype)
    if on_panels:
        _matmul_packed_by_address(a, panels, out)
    else:
        blas.matmul(a, b, out, False, transpose_b)
    return out


@njit_cached(**_JIT)
def pack_where(b, transpose_b, wanted):
    """:func:`pack` ``(b, transpose_b)`` where ``wanted``, else a stack of no
    panels: a scan's loop packs its weights only where its products run on
    panels; one call rather than both ways at every weight keeps the loop's
    own code small to compile."""
    if wanted:
        return pack(b, transpose_b)
    return np.empty((0, 0, 0), dtype=b.dtype)


@njit_cached(**_JIT)
def hoisted_or_step_product(hoisted, index, a, b, panels, transpose_b, on_panels, is_hoisted):
    """``hoisted[index]`` (a step's product computed before the loop by
    :func:`steps_product`) where ``is_hoisted``, else :func:`step_product`:
    one call at each of a scan loop's products of a sequence slice."""
    if is_hoisted:
        return hoisted[index]
    return step_product(a, b, panels, transpose_b, on_panels)


@njit_cached(**_JIT)
def steps_product(sequence, first, end, lo, hi, b, transpose_b, hoisted):
    """The products ``sequence[t, lo:hi] @ op(b)`` of the steps t in [first, end)
    at once, stacked (steps, rows, columns), through BLAS; a stack of no step
    where not ``hoisted`` (a scan's loop then multiplies step by step,
    :func:`step_product`).  ``sequence`` a float32 or float64 array (steps,
    rows, depth) of ``b``'s type."""
    columns = b.shape[0] if transpose_b else b.shape[1]
    rows = min(hi, sequence.shape[1]) - lo
    out = np.empty(((end - first) if hoisted else 0, rows, columns), dtype=sequence.dtype)
    if hoisted:
        steps_product_into(sequence, first, end, lo, hi, b, transpose_b, out)
    return out


@njit_cached(**_JIT)
def steps_product_into(sequence, first, end, lo, hi, b, transpose_b, out):
    """:func:`steps_product` (hoisted) into ``out``, a C-contiguous array of its
    shape and type (a scan loop's, computed again at each call without
    allocating it again)."""
    blas.matmul(np.ascontiguousarray(sequence[first:end, lo:hi]).reshape(-1, sequence.shape[2]), b,
                out.reshape(-1, out.shape[2]), False, transpose_b)


@njit_cached(**_JIT)
def matmul(a, b, out):
    """out[...] = a @ b for float32 or float64 matrices of one type, their rows
    contiguous, b as it is: its panels read in place (only a last one narrower
    than a panel is packed).  For a b used once, where packing all of it would
    cost more than it saves: Winograd's small products."""
    k, n = b.shape
    m, n_out, lda, ldo = _check(a, b.itemsize, out, k)
    if n_out != n:
        raise ValueError("jit_kernels.packed: the shapes of a product do not match")
    if n > 1 and k > 0 and b.strides[1] != b.itemsize:
        raise ValueError("jit_kernels.packed: the rows of a product's operands are not contiguous")
    if m == 0 or n == 0:
        return
    width = panel_width(b.itemsize)
    full = n // width
    # the columns after the last full panel, padded with zeros (a loop here: pack
    # of a slice of b would compile pack for one more type)
    last_panel = np.zeros((k if full * width < n else 0, width), b.dtype)
    for i in range(last_panel.shape[0]):
        for x in range(n - full * width):
            last_panel[i, x] = b[i, full * width + x]
    _product(a, b, width, b.strides[0] // b.itemsize, last_panel, out[:, :], lda, ldo,  # see matmul_packed
             np.empty(0, np.int64), np.int64(0))


@njit_cached(**_JIT)
def matmul_each(a, b, out):
    """out[i] = a[i] @ b[i] (:func:`matmul`) for each matrix of three stacks."""
    if a.shape[0] != b.shape[0] or out.shape[0] != b.shape[0]:
        raise ValueError("jit_kernels.packed: the stacks of a product differ in length")
    for i in range(a.shape[0]):
        matmul(a[i], b[i], out[i])


@njit_cached(**_JIT)
def _parts_of_product(a, packed, out, threads, epilogue):
    """The descriptors of :func:`_product_part_of` for out = a @ B, B packed by
    :func:`pack`, in parts of whole panels, one per thread of ``threads``
    where each reads ``tuning.PARTS_MIN_WORK`` items of B at least (a product
    of a few rows by weights is bound by reading them), else fewer; a and out
    C-contiguous.  Each part then runs its columns through ``epilogue``
    (:func:`matmul_packed_then`) where it is not empty."""
    panels, k, width = packed.shape
    m, n, _, _ = _check(a, packed.itemsize, out, k)
    if panels != (n + width - 1) // width or width != panel_width(packed.itemsize):
        raise ValueError("jit_kernels.packed: the shapes of a product do not match")
    count = parts.part_count(k * n, threads, tuning.PARTS_MIN_WORK, panels)
    per = (panels + count - 1) // count
    count = (panels + per - 1) // per
    d = np.empty((count, 12), np.int64)
    for i in range(count):
        d[i, 0], d[i, 1], d[i, 2], d[i, 3] = a.ctypes.data, m, k, packed.ctypes.data
        d[i, 4], d[i, 5], d[i, 6] = panels, out.ctypes.data, n
        d[i, 7], d[i, 8], d[i, 9] = i * per, min(panels, (i + 1) * per), packed.itemsize
        d[i, 10], d[i, 11] = epilogue.ctypes.data, epilogue.size
    return d


@njit_cached(**_JIT)
def _product_part_of(d, dtype):
    """Panels d[7]..d[8]-1 of a product described by :func:`_parts_of_product`,
    then through its epilogue."""
    m, k, panels, n, first, end = d[1], d[2], d[4], d[6], d[7], d[8]
    width = panel_width(d[9])
    a = parts.array_at(d[0], (m, k), dtype)
    packed = parts.array_at(d[3], (panels, k, width), dtype)
    out = parts.array_at(d[5], (m, n), dtype)
    epilogue = parts.array_at(d[10], d[11], np.int64)
    matmul_packed_then(a, packed[first:end], out[:, first * width:min(n, end * width)], epilogue,
                       first * width)


def _product_part_float32(d):
    """:func:`_product_part_of` of float32 operands: a part of its own for each
    type, since compiling the part compiles everything it calls (a callback
    dispatching on the type compiled both for any product)."""
    _product_part_of(d, np.float32)


def _product_part_float64(d):
    """:func:`_product_part_of` of float64 operands."""
    _product_part_of(d, np.float64)


# the compiled part of each type, by its item size
product_parts = {4: parts.compiled_part(_product_part_float32), 8: parts.compiled_part(_product_part_float64)}


def matmul_packed_in_parts(a, packed, out, epilogue=parts.NO_EPILOGUE):
    """:func:`matmul_packed` with the panels split between BLAS's threads
    (jit_kernels.parts), for a and out C-contiguous; then out through
    ``epilogue`` (a parts.CompiledEpilogue's template, checked for out's
    columns), each part its own columns.  A product by the weights of a
    layer at batch 1 is bound by reading them from memory, which the threads
    then share (see tuning.PACKED_WEIGHTS_MAX_ROWS)."""
    if not (a.flags.c_contiguous and out.flags.c_contiguous and packed.flags.c_contiguous):
        raise ValueError("jit_kernels.packed: the parts read and write whole C-contiguous arrays")
    if out.size == 0 or a.shape[1] == 0:
        matmul_packed_then(a, packed, out, epilogue, 0)  # nothing to split; checks the shapes
        return
    parts.run(product_parts[a.itemsize], _parts_of_product(a, packed, out, max(1, blas.threads()),
                                                           epilogue))


@njit_cached(**_JIT)
def matmul_packed_from_compiled(a, packed, out, part_address):
    """:func:`matmul_packed_in_parts` from compiled code (parts.run_compiled),
    ``part_address`` being that of ``product_parts`` of its type; on the calling
    thread alone where a or out is not C-contiguous."""
    if out.size == 0 or a.shape[1] == 0 or not (a.flags.c_contiguous and out.flags.c_contiguous):
        matmul_packed(a, packed, out)  # checks the shapes
        return
    descriptors = _parts_of_product(a, packed, out, max(1, parts.threads_from_compiled()),
                                    np.empty(0, np.int64))
    parts.run_compiled(part_address, descriptors, (a, packed, out))


def weights_run_packed(rows, k, n, itemsize, threads, written):
    """Whether a product of ``rows`` rows by k x n weights of ``itemsize`` bytes,
    packed once per value (a layer's: numbackend's products by weights), runs
    on the micro-kernel in parts of whole panels (:func:`matmul_packed_in_parts`
    on ``threads`` threads) rather than through BLAS.

    - Up to ``tuning.PACKED_WEIGHTS_MAX_ROWS`` rows (one tile): packed.
    - Beyond, where every thread has a part: BLAS's threads also split the
      rows, so they win where the panels are fewer than the threads.  Its
      chunks of k keep what the micro-kernel reads again in the L2 cache, as
      BLAS's blocking does (``tuning.PACKED_CHUNK_BYTES``).  Not where the
      function writes the weights at every call (``written``: a training
      step), which would pack them again at every call; nor weights of fewer
      than ``tuning.PACKED_WEIGHTS_MIN_ITEMS`` items.

    Depends on the shapes, the thread count and ``written`` alone: every call
    of one function with inputs of one shape gives the same bits."""
    if rows <= tuning.PACKED_WEIGHTS_MAX_ROWS:
        return True
    if written or k * n < tuning.PACKED_WEIGHTS_MIN_ITEMS:
        return False
    threads = max(1, threads)
    panels = -(-n // panel_width(itemsize))
    return machine.part_count(k * n, threads, tuning.PARTS_MIN_WORK, panels) >= threads


def runs_packed(rows, itemsize, alone):
    """Whether a product of ``rows`` rows by weights packed once, of items of
    ``itemsize`` bytes (a scan's step), runs on the micro-kernel rather than
    through BLAS.  A rule from the machine, not from timings of one: per core the
    micro-kernel runs as fast as OpenBLAS's own (both near the FMA units' peak,
    on the AVX2 VM and the AVX-512 Xeon alike), so BLAS wins only by reading less
    or by using more threads.

    - Up to one block of rows (:func:`block_rows` of a whole chunk of k, the
      fewest a block has) the micro-kernel reads each weight once a call, as
      BLAS reads it at least, and BLAS packs them again on every call: packed.
    - Beyond, only where ``alone``: BLAS would run the product on no more
      threads than the micro-kernel does (its threads then win beyond a block
      each)."""
    return alone or rows <= block_rows(chunk_depth(itemsize), itemsize)
