"""One lowering per library op: how a library step runs.

A lowering owns an op's paths: the callable the Python plan calls
(:meth:`Lowering.plan_callable`), its compiled form, the source lines a whole
compiled call or a scan's loop runs (:meth:`Lowering.compiled_lines`, None
where it has none), and the traits fusion reads:

- ``takes_epilogue(node)``: it can run an element-wise group on each block
  of node's result while in cache (program.LibraryWithEpilogue);
- ``pools``: it can pool its result over 2x2 windows itself, before or after
  that group;
- ``returns_view``: its result may be a view of its input (a reshape), which
  the caller must not be handed as its own;
- ``is_product``: a matrix product (a scan's loop counts their columns).

Whether an element-wise op commutes with max pooling (``rising``) is a
property of its maths, declared in its op entry.  Ops without a lowering of
their own get :class:`Lowering`: their NumPy/Numba function, no compiled form.
"""
import functools
import math
import numbers
import weakref
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from jit_kernels import tuning

from . import tiers
from .evaluator import library_call
from .graph import Constant, Variable
from .ops import OPS, is_float_matrix_product

# Compiled forms of products: of float32 or float64 matrices through NumPy's
# BLAS; a scan step's by an invariant on its panels packed before the loop or
# through BLAS, as the loop chooses by the rows, and all steps' at once where
# hoisted (jit_kernels.packed).
PRODUCT, STEP_PRODUCT, STEPS_PRODUCT = "blas.matmul", "packed.step_product", "packed.steps_product"
HOISTED_OR_STEP_PRODUCT = "packed.hoisted_or_step_product"
# The transposition flags of PRODUCT as typed bools, not literals: Numba
# compiles a function again for each pattern of literal arguments it is called with.
_FLAG = {False: "np.bool_(False)", True: "np.bool_(True)"}


class Lowering:
    """A library op run by its NumPy/Numba function, with no compiled form."""

    pools = False
    returns_view = False
    is_product = False

    def takes_epilogue(self, node):
        """Whether ``node`` can run an element-wise group on each block of its
        result (see :meth:`plan_callable_with_epilogue`)."""
        return False

    def plan_callable(self, node, bodies=None, written=frozenset()):
        """``f(*input_arrays)`` for the Python plan.  ``bodies``: where an op runs
        sub-programs (a scan's step), what builds them (see plan.Bodies);
        ``written``: the ids of the variables the function writes at every call."""
        return library_call(node)

    def compiled_lines(self, node, ins, out, render):
        """The lines computing ``out`` from ``ins`` inside compiled code, or None
        where there are none.  ``render``: the compiled_plan.Render the lines
        join, whose constants, arguments, packings and hoistings they may add to."""
        return

    def no_compiled_form(self, node):
        """Why :meth:`compiled_lines` gives ``node`` none, where there is more
        to say than the step itself (an export's refusal says it); else None."""
        return

    def export_padding(self, node):
        """Where the size of an axis of ``node``'s result depends on the data (the
        batch's longest CTC decoding): a :class:`Padding`, how the export's lines
        write it; None for every other op."""
        return

    def counts_input(self, node):
        """(index of an input of ``node`` that holds whole numbers below a bound,
        that bound) where the op has one (an Embedding's ids, a CTC decoder's
        lengths), so that an export's check feeds it numbers the op takes; else
        None."""
        return


class Padding(NamedTuple):
    """An axis of a result whose size depends on the data, as an export's lines
    write it: at its bound, ``size`` (no result is longer), each row's entries
    followed by ``value``, which the result holds nowhere else.  The export's
    loader drops the trailing positions along the axis that hold ``value`` in
    every row (manifest.json's "trim"), which gives the function's result."""
    axis: int
    size: int
    value: int


class View(Lowering):
    """A reshape, expand_dims and the like: a view of the input, no copy."""

    returns_view = True


class Reshape(View):
    def compiled_lines(self, node, ins, out, render):
        shape = node.attrs["shape"]
        if not all(isinstance(d, numbers.Integral) for d in shape):
            return None
        return [f"{out} = {ins[0]}.reshape(({''.join(f'{int(d)}, ' for d in shape)}))"]


class GetItem(Lowering):
    """``x[key]`` (ints, slices, None, Ellipsis), copied to a C-contiguous array
    as the op's own function does; compiled in an export only."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export or node.ndim == 0:
            return None  # an item would be a Numba scalar, not an array
        return [f"{out} = np.ascontiguousarray({ins[0]}[{_key_source(node.attrs['key'])}])"]


def _key_source(key):
    """The source of an index ``key`` (a tuple of ints, slices, None and
    Ellipsis, as ops.indexing.getitem checked it)."""
    def item(k):
        if k is None:
            return "None"
        if k is Ellipsis:
            return "..."
        if isinstance(k, slice):
            return ":".join("" if v is None else str(int(v)) for v in (k.start, k.stop, k.step))
        return str(int(k))
    return "".join(item(k) + ", " for k in key)


class Transpose(Lowering):
    """``np.transpose(x, axes)`` as a new C-contiguous array, in an export only."""

    def compiled_lines(self, node, ins, out, render):
        axes = [int(a) for a in node.attrs["axes"]]
        if not render.export or not axes:
            return None
        return _transpose_lines(ins[0], axes, out)


def _transpose_lines(x, axes, out):
    """Lines writing ``np.transpose(x, axes)`` into a new array ``out`` as loops
    (Numba's np.transpose checks its axes with a list and formats its errors
    with Python's objects, which an export cannot call)."""
    index = [f"{out}_i{k}" for k in range(len(axes))]
    source = [None] * len(axes)  # x's index along each of its axes
    for k, a in enumerate(axes):
        source[a] = index[k]
    shape = "".join(f"{x}.shape[{a}], " for a in axes)
    lines = [f"{out} = np.empty(({shape}), dtype={x}.dtype)"]
    for k, i in enumerate(index):
        lines.append("    " * k + f"for {i} in range({out}.shape[{k}]):")
    lines.append("    " * len(axes) + f"{out}[{', '.join(index)}] = {x}[{', '.join(source)}]")
    return lines


class Reduce(Lowering):
    """A sum, mean, max, min or product over axes that are not the trailing
    ones (those fuse into kernels), of floats, in an export only: the reduced
    axes moved last, then each row reduced."""

    # each op's reduction of one row {row} of {n} items
    ROW = MappingProxyType({"sum": "{row}.sum()", "mean": "{row}.sum() / {n}", "max": "{row}.max()",
                           "shift_max": "{row}.max()", "min": "{row}.min()", "prod": "{row}.prod()"})

    def compiled_lines(self, node, ins, out, render):
        (x,) = node.inputs
        axes = sorted(int(a) for a in node.attrs["axis"])
        # (an export refuses a reduction over the batch before it gets here: ops/batch.py)
        if (not render.export or node.op not in self.ROW or node.ndim == 0
                or x.dtype != node.dtype or node.dtype not in ("float32", "float64")
                or any(x.shape[a] is None for a in axes)):
            return None
        kept = [a for a in range(x.ndim) if a not in axes]
        count = int(np.prod([x.shape[a] for a in axes]))
        moved, rows, flat, k = f"{out}_moved", f"{out}_rows", f"{out}_flat", f"{out}_k"
        lines = _transpose_lines(ins[0], kept + axes, moved)
        # the result's shape: the kept axes' sizes (an unknown one read from x), 1
        # for a reduced axis where keepdims
        dims = [1 if a in axes else (f"{ins[0]}.shape[{a}]" if x.shape[a] is None else int(x.shape[a]))
                for a in range(x.ndim) if a in kept or node.attrs["keepdims"]]
        shape = "".join(f"{d}, " for d in dims)
        reduced = self.ROW[node.op].format(row=f"{rows}[{k}]", n=count)
        return lines + [f"{rows} = {moved}.reshape((-1, {count}))",
                        f"{flat} = np.empty({rows}.shape[0], dtype=np.{node.dtype})",
                        f"for {k} in range({rows}.shape[0]):",
                        f"    {flat}[{k}] = {reduced}",
                        f"{out} = {flat}.reshape(({shape}))"]


class Reverse(Lowering):
    """``np.flip(x, axes)``, copied to a C-contiguous array; in an export only."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export or node.ndim == 0:
            return None
        axes = set(node.attrs["axes"])
        key = "".join("::-1, " if a in axes else ":, " for a in range(node.ndim))
        return [f"{out} = np.ascontiguousarray({ins[0]}[{key}])"]


class Tile(Lowering):
    """``np.tile(x, reps)`` (one count per axis), in an export only: x seen as
    (1, n0, 1, n1, ...), broadcast to (r0, n0, r1, n1, ...), copied, and
    reshaped to (r0 * n0, r1 * n1, ...)."""

    def compiled_lines(self, node, ins, out, render):
        (x,) = node.inputs
        reps = node.attrs["reps"]
        if not render.export or x.ndim == 0:
            return None
        sizes = [f"{ins[0]}.shape[{i}]" for i in range(x.ndim)]
        spread = "".join(f"1, {n}, " for n in sizes)
        wide = "".join(f"{int(r)}, {n}, " for r, n in zip(reps, sizes))
        tiled = "".join(f"{int(r)} * {n}, " for r, n in zip(reps, sizes))
        return [(f"{out} = np.ascontiguousarray(np.broadcast_to({ins[0]}.reshape(({spread})), "
                 f"({wide}))).reshape(({tiled}))")]


class TupleItem(Lowering):
    """Item ``index`` of a multi-output step's tuple (a scan's); in an export only."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export:
            return None
        return [f"{out} = {ins[0]}[{int(node.attrs['index'])}]"]


class Gather(Lowering):
    """Rows of a table by integer ids (an Embedding layer), in an export only:
    jit_kernels.copying.gather_rows, whose IndexError on an id out of range
    the export's predict raises."""

    def compiled_lines(self, node, ins, out, render):
        table, ids = node.inputs
        if not render.export or table.ndim == 0 or np.dtype(ids.dtype).kind not in "iu":
            return None
        return [(f"{out} = copying.gather_rows(np.ascontiguousarray({ins[0]}), "
                 f"np.ascontiguousarray({ins[1]}))")]

    def counts_input(self, node):
        rows = node.inputs[0].shape[0] if node.inputs[0].ndim else None
        return None if rows is None else (1, int(rows))


class Concatenate(Lowering):
    def compiled_lines(self, node, ins, out, render):
        # (the gradient of per-gate slices, in a scan's loop)
        if any(i.dtype != node.dtype or i.ndim == 0 for i in node.inputs):
            return None
        parts = "".join(i + ", " for i in ins)
        return [f"{out} = np.concatenate(({parts}), axis={int(node.attrs['axis'])})"]


def _multiplies_weights(node):
    """Whether ``node`` is a product of a matrix by a variable's or a constant's
    value (a layer's weights), 2-D, untransposed, of float32 or float64."""
    return (isinstance(node.inputs[1], (Variable, Constant)) and is_float_matrix_product(node)
            and not node.attrs.get("transpose_a") and not node.attrs.get("transpose_b"))


def _blas():
    from jit_kernels import blas  # loads NumPy's BLAS: not at import
    return blas


class Dot(Lowering):
    """A matrix product.  By weights (a variable's or constant's value) with at
    most PACKED_WEIGHTS_MAX_ROWS rows of x: on jit_kernels.packed's
    micro-kernel, which reads the weights from memory once; large weights
    packed once per value and split between BLAS's threads.  With more rows,
    there too where every thread gets panels and the function does not write
    the weights (packed.weights_run_packed).  Else through BLAS.  The choice depends on
    the shapes and the thread count alone, in the plan and in the whole call
    alike: the two sum in other orders, and every call must give the same bits
    for the same input."""

    is_product = True

    def takes_epilogue(self, node):
        """A product by weights: its parts on the weights' panels run the group
        on their columns of each block of rows (packed.matmul_packed_then)."""
        return _multiplies_weights(node)

    def plan_callable(self, node, bodies=None, written=frozenset()):
        if not _multiplies_weights(node):
            return library_call(node)
        return ProductByWeights(node, node.inputs[1].id in written)

    def plan_callable_with_epilogue(self, step, module, fallback, written=frozenset()):
        """The plan's callable for a program.LibraryWithEpilogue of a product by
        weights: ``call(x, w, *group_inputs_but_node)``.  Where the product runs
        on the weights' panels, its parts run the group as ``module``'s
        compiled part once that has compiled: a later tier, from the second
        call (a compile on the tiers' worker during the first would hold up
        that call's own compiles: Numba compiles one function at a time).
        Else the group runs after the product, as ``module``'s kernel
        (``fallback``, NumPy's, where the run-time shapes do not fit it)."""
        from jit_kernels import parts  # not at import: it loads BLAS
        product = ProductByWeights(step.node, step.node.inputs[1].id in written)
        epilogues = _Epilogues(step, module)
        part = tiers.LaterPart(module.EPILOGUE_PART, "a product's epilogue part",
                                 "its epilogue runs after the product")
        position = step.position
        dtype = np.dtype(step.node.dtype)
        # the group's other inputs as its kernel over rows takes them: row vectors, scalars
        patterns = [p for j, p in enumerate(step.patterns) if j != position]

        calls = [0]

        def call(x, w, *others):
            calls[0] += 1
            ready = (calls[0] > 1 or tiers.warming()) and part.ready()
            epilogue = epilogues.of(others) if ready else None
            if epilogue is not None:
                try:
                    epilogue.check(w.shape[-1], dtype)
                except parts.EpilogueMismatch:
                    return fallback_after(product(x, w), others)
            out, done = product.run(x, w, None if epilogue is None else epilogue.template)
            if done:
                return out
            inputs = [np.asarray(a).reshape(-1) for a in others]
            inputs = [a[0] if p == "S" else a for a, p in zip(inputs, patterns)]
            inputs.insert(position, out)
            try:
                return module.run(*inputs)[0]
            except ValueError:  # run-time shapes broadcast unlike the static ones
                return fallback_after(out, others)

        def fallback_after(out, others):
            inputs = list(others)
            inputs.insert(position, out)
            return fallback(*inputs)[0]
        return call

    def compiled_lines(self, node, ins, out, render, pool=None):
        if pool is not None:
            return None
        if render.export and node.inputs[0].ndim > 2:
            return self._batched_weights_lines(node, ins, out, render)
        if not (_blas().AVAILABLE and is_float_matrix_product(node)):
            return None
        if render.whole_call:
            weights = render.variable_named(ins[1])
            if weights is not None and _multiplies_weights(node):
                lines = self._weights_lines(node, ins, out, weights, render)
                if lines is not None:
                    return lines
        return self._product_lines(node, ins, out, render)

    @staticmethod
    def _weights_lines(node, ins, out, weights, render):
        """A product by the value of the variable ``weights``: by its panels
        packed once per value (an argument of the call), split between BLAS's
        threads where the weights are many, where packed.weights_run_packed
        says so; else through BLAS.  None where parts cannot run from compiled
        code."""
        from jit_kernels import packed, parts
        panels = render.add_argument("weights_panels", weights, _panels)
        if render.export:
            # every batch size on the panels: the export's threads each run a
            # chunk of rows, and its library then needs no BLAS for a layer
            return [f"{out} = np.empty(({ins[0]}.shape[0], {ins[1]}.shape[1]), dtype=np.{node.dtype})",
                    f"packed.matmul_packed({ins[0]}, {panels}, {out})"]
        in_parts = math.prod(weights.shape) >= tuning.PACKED_WEIGHTS_MIN_ITEMS
        if in_parts and not parts.pool_from_compiled():
            return None
        if in_parts:
            part = render.add_constant(
                "weights_part", packed.product_parts[np.dtype(node.dtype).itemsize]()[0], runs_parts=True)
            product = f"packed.matmul_packed_from_compiled({ins[0]}, {panels}, {out}, {part})"
        else:
            product = f"packed.matmul_packed({ins[0]}, {panels}, {out})"
        allocation = f"{out} = np.empty(({ins[0]}.shape[0], {ins[1]}.shape[1]), dtype=np.{node.dtype})"
        # packed.weights_run_packed, as the plan's ProductByWeights decides: beyond
        # one tile of rows it depends on the weights, the threads and the updates alone
        if packed.weights_run_packed(tuning.PACKED_WEIGHTS_MAX_ROWS + 1, *weights.shape,
                                     np.dtype(node.dtype).itemsize, _blas().threads(),
                                     weights.id in render.program.written):
            return [allocation, product]
        return [allocation,
                f"if {ins[0]}.shape[0] <= {tuning.PACKED_WEIGHTS_MAX_ROWS}:",
                f"    {product}",
                "else:",
                f"    {PRODUCT}({ins[0]}, {ins[1]}, {out}, {_FLAG[False]}, {_FLAG[False]})"]

    @staticmethod
    def _batched_weights_lines(node, ins, out, render):
        """An export's product of x of rank > 2 by a matrix of weights (a Dense
        layer on a sequence): x's rows, all axes but the last flattened, on the
        weights' panels, reshaped back."""
        x, w = node.inputs
        weights = render.variable_named(ins[1])
        if (weights is None or w.ndim != 2 or node.attrs.get("transpose_a")
                or node.attrs.get("transpose_b") or node.dtype not in ("float32", "float64")
                or not x.dtype == w.dtype == node.dtype):
            return None
        panels = render.add_argument("weights_panels", weights, _panels)
        rows, flat = f"{out}_rows", f"{out}_flat"
        shape = "".join(f"{ins[0]}.shape[{i}], " for i in range(x.ndim - 1))
        return [f"{rows} = np.ascontiguousarray({ins[0]}).reshape((-1, {ins[0]}.shape[{x.ndim - 1}]))",
                f"{flat} = np.empty(({rows}.shape[0], {ins[1]}.shape[1]), dtype=np.{node.dtype})",
                f"packed.matmul_packed({rows}, {panels}, {flat})",
                f"{out} = {flat}.reshape(({shape}{ins[1]}.shape[1]))"]

    @staticmethod
    def _product_lines(node, ins, out, render):
        """Through BLAS; by a ``packable`` value (a scan's invariant) through
        STEP_PRODUCT, on its packed panels where the loop's ``packed_products``
        is true; of a ``sliced`` sequence by it, for all the loop's steps at
        once by the hoisting line (STEPS_PRODUCT) where ``hoisted_products`` is
        true."""
        ta, tb = bool(node.attrs.get("transpose_a")), bool(node.attrs.get("transpose_b"))
        if ta or ins[1] not in render.packable:
            rows = f"{ins[0]}.shape[{1 if ta else 0}]"
            cols = f"{ins[1]}.shape[{0 if tb else 1}]"
            return [f"{out} = np.empty(({rows}, {cols}), dtype=np.{node.dtype})",
                    f"{PRODUCT}({ins[0]}, {ins[1]}, {out}, {_FLAG[ta]}, {_FLAG[tb]})"]
        # the choice between panels and BLAS, and the hoisting, are library
        # kernels called by address: written out at every product, both ways
        # made the bulk of a large loop's code and of its compile
        panels = render.packings.setdefault((ins[1], tb), f"packed{len(render.packings)}")
        if ins[0] not in render.sliced:
            return [f"{out} = {STEP_PRODUCT}({ins[0]}, {ins[1]}, {panels}, {_FLAG[tb]}, packed_products)"]
        whole, steps = render.sliced[ins[0]], f"hoisted{len(render.hoistings)}"
        render.hoistings.append(f"{steps} = {STEPS_PRODUCT}({whole}, earliest, last, lo, hi, {ins[1]}, "
                                f"{_FLAG[tb]}, hoisted_products)")
        step = (f"{out} = {HOISTED_OR_STEP_PRODUCT}({steps}, t - earliest, {ins[0]}, {ins[1]}, "
                f"{panels}, {_FLAG[tb]}, packed_products, hoisted_products)")
        return [step]


def _panels(weights):
    """The panels of jit_kernels.packed of a product's right operand ``weights``."""
    from jit_kernels import packed
    return packed.pack(weights, False)


class ProductByWeights:
    """The plan's ``x @ w`` for a product by weights (see :class:`Dot`); a
    variable's value is replaced, never written in place (Variable.assign and
    the updates store new arrays), so panels packed for one value serve
    until the value changes."""

    def __init__(self, node, weights_written=False):
        self.fallback = library_call(node)
        self.weights_written = weights_written  # by the function, at every call
        self.dtype = np.dtype(node.dtype)
        self.packed = None  # jit_kernels.packed, from the first packed call
        self.packing = None  # (weak reference to the value packed, its panels)

    def __call__(self, x, w):
        return self.run(x, w, None)[0]

    def run(self, x, w, epilogue):
        """(x @ w, whether it went through ``epilogue``): a CompiledEpilogue's
        template for w's columns, or None.  The product's parts run it on
        their columns where they run on the weights' panels; else the caller
        runs it after."""
        if (x.dtype != self.dtype or w.dtype != self.dtype or x.ndim != 2 or w.ndim != 2
                or x.shape[1] != w.shape[0] or not x.flags.c_contiguous
                or not w.flags.c_contiguous):
            return self.fallback(x, w), False
        if self.packed is None:
            from jit_kernels import packed
            self.packed = packed
        # up to a tile of rows always packed: the thread count (a call into
        # OpenBLAS) is asked only beyond, where the rule reads it
        if x.shape[0] > tuning.PACKED_WEIGHTS_MAX_ROWS and not self.packed.weights_run_packed(
                x.shape[0], *w.shape, self.dtype.itemsize, _blas().threads(), self.weights_written):
            return self.fallback(x, w), False
        out = np.empty((x.shape[0], w.shape[1]), self.dtype)
        if w.size < tuning.PACKED_WEIGHTS_MIN_ITEMS:
            self.packed.matmul(x, w, out)
            return out, False
        packing = self.packing
        if packing is None or packing[0]() is not w:
            packing = self.packing = (weakref.ref(w), self.packed.pack(w, False))
        if epilogue is None:
            self.packed.matmul_packed_in_parts(x, packing[1], out)
            return out, False
        self.packed.matmul_packed_in_parts(x, packing[1], out, epilogue)
        return out, True


class Conv(Lowering):
    """A convolution: jit_kernels.conv chooses its algorithm (forward_path,
    the one place).  It takes an epilogue and pools a 2-D result itself: the
    op's impl takes ``epilogue=f``, ``f(block, out)`` called with each block
    of the result's rows, (rows, last axis), as it is computed, writing their
    final values into ``out``; and ``pool='max' | 'avg'``, returning its
    result (after the epilogue) pooled over 2x2 windows with stride 2,
    'valid', block by block; with ``pool_first=True`` the epilogue runs on
    the pooled values instead (where partition.rises_with says they commute)."""

    pools = True

    def takes_epilogue(self, node):
        return True

    def plan_callable_with_epilogue(self, step, module, fallback, written=frozenset()):
        """The plan's callable for a program.LibraryWithEpilogue: ``call(*node_inputs,
        *group_inputs_but_node)``, the group running as ``module``'s compiled
        part on each block; ``fallback(*group_inputs)`` runs the group with
        NumPy where the run-time shapes do not fit the part."""
        return _library_with_epilogue(step, module, fallback)

    def compiled_lines(self, node, ins, out, render, pool=None):
        """The line of a 2-D convolution (pooled by 'max' where ``pool`` says so)
        as jit_kernels.conv's compiled forms run it: only in a whole call, and
        only where conv.compiled_path has a form for the node's shapes."""
        if not render.whole_call:
            return None
        from jit_kernels import conv, parts
        x, w = node.inputs
        if x.dtype != node.dtype or w.dtype != node.dtype or None in w.shape:
            return None
        attrs = node.attrs
        if render.export:
            return self._export_lines(node, ins, out, render, pool)
        path = conv.compiled_path(x.shape, w.shape, np.dtype(node.dtype), attrs["strides"],
                                  attrs["padding"], attrs["dilation"])
        if path is None:
            return None
        if path.algorithm == "direct" and pool is None:
            sizes = render.add_constant("conv_sizes", path.compiled.sizes)
            offsets = render.add_constant("conv_offsets", path.compiled.offsets)
            render.imports.add("conv")
            return [f"{out} = conv.direct_forward({ins[0]}, {ins[1]}, {sizes}, {offsets})"]
        if path.algorithm != "winograd" or pool not in (None, "max") or not parts.pool_from_compiled():
            return None
        # the kernel that the transform is of: none yet (NaN differs from all)
        kept = render.add_constant("conv_kernel", np.full(w.shape, np.nan, node.dtype))
        transform = render.add_constant("conv_transform", np.empty((36,) + w.shape[2:], node.dtype))
        part = render.add_constant("conv_part", conv.winograd_parts[np.dtype(node.dtype).itemsize]()[0],
                                   runs_parts=True)
        render.imports.add("conv")
        return [(f"{out} = conv.winograd_forward({ins[0]}, {ins[1]}, {kept}, {transform}, {part}, "
                f"np.int64({conv.POOL_MODES[pool]}), np.int64({path.compiled.chunk}))")]

    @staticmethod
    def _export_lines(node, ins, out, render, pool):
        """An export's lines (compiled_plan.Render): the direct loop for every
        2-D convolution (Winograd's compiled form runs parts on OpenBLAS's
        threads), then a 2x2 max pooling where ``pool`` is 'max' (the epilogue
        kernel then runs on the pooled values, as a pool-first step says)."""
        from jit_kernels import conv
        x, w = node.inputs
        attrs = node.attrs
        dtype = np.dtype(node.dtype)
        if x.ndim == 3 and pool is None:
            return _conv1d_export_lines(node, ins, out, render)
        loop = conv.direct_form(x.shape, w.shape, dtype, attrs["strides"], attrs["padding"],
                                attrs["dilation"])
        if loop is None or pool not in (None, "max"):
            return None
        sizes = render.add_constant("conv_sizes", loop.sizes)
        offsets = render.add_constant("conv_offsets", loop.offsets)
        render.imports.add("conv")
        path = conv.compiled_path(x.shape, w.shape, dtype, attrs["strides"], attrs["padding"],
                                  attrs["dilation"])
        weights = render.variable_named(ins[1])
        if path is not None and path.algorithm == "winograd" and weights is not None:
            # Winograd where the plan takes it, on the calling thread, the
            # kernel's transform made once per value of the weights
            transform = render.add_argument("conv_transform", weights, _kernel_transform)
            return [(f"{out} = conv.winograd_or_direct({ins[0]}, {ins[1]}, {transform}, {sizes}, "
                     f"{offsets}, np.int64({conv.POOL_MODES[pool]}), "
                     f"np.int64({path.compiled.chunk}))")]
        if pool is None:
            return [f"{out} = conv.direct_forward({ins[0]}, {ins[1]}, {sizes}, {offsets})"]
        return [(f"{out} = conv.max_pool_2x2(conv.direct_forward({ins[0]}, {ins[1]}, {sizes}, "
                 f"{offsets}))")]


def _conv1d_export_lines(node, ins, out, render):
    """An export's 1-D convolution: x (N, L, C) seen as (N, 1, L, C) and the
    kernel (k, C, O) as (1, k, C, O), on the 2-D direct loop."""
    from jit_kernels import conv
    x, w = node.inputs
    attrs = node.attrs
    loop = conv.direct_form((None, 1) + x.shape[1:], (1,) + w.shape, np.dtype(node.dtype),
                            (1,) + tuple(attrs["strides"]), attrs["padding"],
                            (1,) + tuple(attrs["dilation"]))
    if loop is None or None in node.shape[1:]:
        return None
    sizes = render.add_constant("conv_sizes", loop.sizes)
    offsets = render.add_constant("conv_offsets", loop.offsets)
    render.imports.add("conv")
    length, channels = (int(d) for d in x.shape[1:])
    flat = "".join(f"{int(d)}, " for d in w.shape)
    return [(f"{out} = conv.direct_forward(np.ascontiguousarray({ins[0]}).reshape(({ins[0]}.shape[0], "
             f"1, {length}, {channels})), np.ascontiguousarray({ins[1]}).reshape((1, {flat})), "
             f"{sizes}, {offsets}).reshape(({ins[0]}.shape[0], {int(node.shape[1])}, "
             f"{int(node.shape[2])}))")]


def pool_export_lines(node, x_name, out):
    """An export's lines of the pool op ``node`` (max or average, 1 to 3 spatial
    axes, 'valid' or 'same') on the value named ``x_name``: jit_kernels.pool's
    serial loop on 5-D views; None where its shapes are not known but for the batch."""
    from jit_kernels import windows
    (x,) = node.inputs
    attrs = node.attrs
    if x.dtype != node.dtype or node.dtype not in ("float32", "float64") or None in x.shape[1:]:
        return None
    g = windows.geometry(tuple(x.shape[1:-1]), tuple(attrs["pool_size"]), tuple(attrs["strides"]),
                         attrs["padding"])
    channels = int(x.shape[-1])
    batch = f"{x_name}.shape[0]"

    def ints(values):
        return "(" + "".join(f"np.int64({int(v)}), " for v in values) + ")"

    def shape(spatial):
        return f"({batch}, {''.join(f'{int(d)}, ' for d in spatial)}{channels})"

    function = "pool.max_pool_serial" if attrs["mode"] == "max" else "pool.avg_pool_serial"
    return [f"{out} = np.empty({shape(g.out[3 - g.rank:])}, dtype=np.{node.dtype})",
            (f"{function}(np.ascontiguousarray({x_name}).reshape({shape(g.size)}), "
             f"{out}.reshape({shape(g.out)}), {ints(g.kernel)}, {ints(g.stride)}, {ints(g.pad)})")]


class Pool(Lowering):
    """Max or average pooling: in an export, jit_kernels.pool's serial loop."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export:
            return None
        lines = pool_export_lines(node, ins[0], out)
        if lines is not None:
            render.imports.add("pool")
        return lines


class CtcDecode(Lowering):
    """CTC decoding, in an export only, and greedy only: jit_kernels.ctc_decode's
    serial loop, which writes the op's packed results ((rows, 1, 1 + longest)
    float64: the log probability, then the labels padded with -1; ops/ctc.py)
    at the width of the time steps, the longest any decoding can be, so that
    a chunk of rows does not depend on the others; the ctc_decoded_path and
    ctc_decoded_log_prob steps read them there."""

    def compiled_lines(self, node, ins, out, render):
        steps = node.inputs[0].shape[1]
        if not render.export or node.attrs["mode"] != "greedy" or steps is None:
            return None
        render.imports.add("ctc_decode")
        return [f"{out} = np.empty(({ins[0]}.shape[0], 1, {1 + int(steps)}), dtype=np.float64)",
                (f"ctc_decode.greedy_decode_packed({ins[0]}, "
                 f"np.ascontiguousarray({ins[1]}).ravel(), {out})")]

    def no_compiled_form(self, node):
        search = {"beam": "beam search (greedy=False)",
                  "dictionary": "dictionary decoding (dict_values)"}.get(node.attrs["mode"])
        if search is None:
            return None
        return (f"{search} is not exported, only greedy decoding: export the model up to its "
                "softmax and decode its output with K.ctc_decode")

    def counts_input(self, node):
        steps = node.inputs[0].shape[1]
        return None if steps is None else (1, int(steps) + 1)  # lengths 0..steps


def _ctc_steps(packed):
    """The time steps of the logits that the ctc_decode node ``packed`` decodes,
    the width of its decodings in an export (see CtcDecode); None where unknown."""
    steps = packed.inputs[0].shape[1] if packed.op == "ctc_decode" else None
    return None if steps is None else int(steps)


class CtcDecodedPath(Lowering):
    """A decoding of CTC's packed results, in an export only: at the width of
    the time steps, each row padded with -1 (see CtcDecode), which the
    export's loader trims to the batch's longest (:meth:`export_padding`)."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export or self.export_padding(node) is None:
            return None
        return [f"{out} = {ins[0]}[:, {int(node.attrs['index'])}, 1:].astype(np.int64)"]

    def export_padding(self, node):
        steps = _ctc_steps(node.inputs[0])
        return None if steps is None else Padding(axis=1, size=steps, value=-1)


class CtcDecodedLogProb(Lowering):
    """The log probabilities of CTC's packed results, in an export only."""

    def compiled_lines(self, node, ins, out, render):
        if not render.export:
            return None
        return [f"{out} = {ins[0]}[:, :, 0].astype(np.{node.dtype})"]


def _kernel_transform(weights):
    """Winograd's transform of a convolution's kernel ``weights``."""
    from jit_kernels import conv
    return conv.kernel_transform(weights)


class _Epilogues:
    """The parts.CompiledEpilogue of a program.LibraryWithEpilogue's group,
    its kernel ``module``'s compiled part, for the group's inputs other than
    the library op's result."""

    def __init__(self, step, module):
        self.part = module.EPILOGUE_PART
        self.dtype = np.dtype(step.node.dtype)
        self.others = [(p == "C", np.dtype(t.dtype)) for j, (p, t) in
                       enumerate(zip(step.patterns, step.inputs)) if j != step.position]
        # the last call's inputs and their epilogue, while it can serve again
        self.last = ((), None)

    def of(self, inputs):
        """The CompiledEpilogue of ``inputs``: the last one where they are the
        same arrays, read in place (a layer's weights, on each call)."""
        from jit_kernels import parts  # not at import: it loads BLAS
        known, epilogue = self.last
        if epilogue is not None and len(known) == len(inputs):
            for a, b in zip(known, inputs):
                if a is not b:
                    break
            else:
                return epilogue
        keep, numbers_, widths, in_place = [], [], [], True
        for (row, kind), a in zip(self.others, inputs):
            # C-contiguous and in the kernel's types: it reads them by address
            in_place = in_place and type(a) is np.ndarray and a.dtype == kind and a.flags.c_contiguous
            a = np.asarray(a, dtype=kind).reshape(-1)
            keep.append(a)
            numbers_.append(parts.address(a))
            if row:
                widths.append(a.size)
        epilogue = parts.CompiledEpilogue(self.part, self.dtype, numbers_, keep, widths)
        # a copy would miss a change made in place to the array it came from
        self.last = (inputs, epilogue) if in_place else ((), None)
        return epilogue


def _library_with_epilogue(step, module, fallback):
    """See :meth:`Conv.plan_callable_with_epilogue`.  With ``step.pool_first``
    (max pooling, a group that rises with node) node's value is pooled and the
    group runs on the pooled values.  Run-time shapes the part does not take
    (a last axis of another length) run the node, then the group with NumPy,
    then the pool."""
    from jit_kernels import parts  # not at import: it loads BLAS
    node, pool, pool_first = step.node, step.pool, step.pool_first
    unpooled = functools.partial(OPS[node.op].impl, **node.attrs) if node.attrs else OPS[node.op].impl
    impl = unpooled if pool is None else functools.partial(unpooled, pool=pool.attrs["mode"])
    pool_call = None if pool is None else library_call(pool)
    own, position = len(node.inputs), step.position

    epilogues = _Epilogues(step, module)

    def call(*arrays):
        epilogue = epilogues.of(arrays[own:])
        try:
            if pool_first:
                return impl(*arrays[:own], epilogue=epilogue, pool_first=True)
            return impl(*arrays[:own], epilogue=epilogue)
        except parts.EpilogueMismatch:  # checked before any block ran
            group_inputs = list(arrays[own:])
            group_inputs.insert(position, unpooled(*arrays[:own]))
            result = fallback(*group_inputs)[0]
            return result if pool_call is None else pool_call(result)
    return call


class Scan(Lowering):
    """A scan: its body's program run once per step by the Python plan; from
    the plan's tuning.SCAN_LOOP_AFTER-th call on, the steps after the first
    in one compiled loop where the body has one (scan_loop.py), once that
    loop has compiled (in the background: the calls run from Python
    meanwhile; see numbackend.tiers).  ``bodies`` (plan.Bodies) builds and
    keeps both."""

    def plan_callable(self, node, bodies=None, written=frozenset()):
        attrs = node.attrs
        body, reverse, keep_history = attrs["body"], attrs["reverse"], attrs["keep_history"]
        calls = [0]  # of this plan's scan: a plan called once compiles no loop

        def call(*arrays):
            if tiers.warming():
                calls[0] = max(calls[0], tuning.SCAN_LOOP_AFTER - 1)
            calls[0] += 1
            return _run_scan(arrays, body, reverse, keep_history, bodies,
                             calls[0] >= tuning.SCAN_LOOP_AFTER)
        return call


    def compiled_lines(self, node, ins, out, render):
        """In an export only: every step in the body's compiled loop
        (scan_loop.py; the first too, as the loop repeats what the plan's first
        step does), on the calling thread, its products hoisted out of the loop
        as an unsplit loop's are.  The stacked values are allocated here, so
        each per-step value's shape must be known but for axis 0, the rows of
        the states and sequence slices, which every step keeps apart."""
        if not render.export or render.bodies is None:
            return None
        body, keep_history = node.attrs["body"], node.attrs["keep_history"]
        n_seq, n_state, n_out = len(body.seq_inputs), len(body.state_inputs), len(body.outputs)
        n_stacked = n_out + (n_state if keep_history else 0)
        loop = render.bodies.loop(body, n_stacked)
        per_step = (body.outputs + body.new_states)[:n_stacked]
        if (loop is None or loop.row_aligned is None or n_seq == 0
                or any(None in t.shape[1:] or t.ndim == 0 for t in per_step)):
            return None
        function = render.function_name(loop.module(), "loop", loop)
        constants = [render.add_constant("scan_constant", value) for value in loop.constants]
        arrays = [f"{out}_in{i}" for i in range(len(ins))]  # C-contiguous, as the loop takes them
        lines = [f"{a} = np.ascontiguousarray({name})" for a, name in zip(arrays, ins)]
        seqs, states = arrays[:n_seq], arrays[n_seq:n_seq + n_state]
        steps, rows, result = f"{out}_steps", f"{out}_rows", f"{out}_finals"
        lines += [f"{steps} = {seqs[0]}.shape[0]",
                  f"{rows} = {states[0]}.shape[0]" if states else f"{rows} = {seqs[0]}.shape[1]"]
        stacked = []
        for k, t in enumerate(per_step):
            name = f"{out}_stacked{k}"
            first = rows if t.shape[0] is None else str(int(t.shape[0]))
            shape = "".join(f", {int(d)}" for d in t.shape[1:])
            lines.append(f"{name} = np.empty(({steps}, {first}{shape}), dtype=np.{t.dtype})")
            stacked.append(name)
        packed = f"np.bool_({rows} >= {tuning.SCAN_PACKED_MIN_ROWS})" if loop.has_packable else \
            "np.bool_(False)"
        arguments = (["np.int64(0)", steps, steps, _FLAG[bool(node.attrs["reverse"])],
                      "np.int64(0)", f"np.int64({np.iinfo(np.int64).max})", packed, _FLAG[True]]
                     + arrays + constants + stacked)
        lines.append(f"{result} = {function}({', '.join(arguments)})")
        finals = [] if keep_history else [f"{result}[{j}]" for j in range(n_state)]
        lines.append(f"{out} = ({''.join(v + ', ' for v in stacked + finals)})")
        return lines


def _run_scan(arrays, body, reverse, keep_history, bodies, loop_due):
    """The scan's value: stacked per-step outputs, then the states (stacked or
    final).  ``loop_due``: the steps after the first may run in the compiled loop."""
    n_seq, n_state = len(body.seq_inputs), len(body.state_inputs)
    seqs = arrays[:n_seq]
    states = arrays[n_seq:n_seq + n_state]
    invariants = arrays[n_seq + n_state:]
    steps = seqs[0].shape[0]
    if steps == 0:
        raise ValueError(f"{body.where}: the sequences are empty along axis 0 (shape "
                         f"{seqs[0].shape})")
    for s in seqs[1:]:
        if s.shape[0] != steps:
            raise ValueError(f"{body.where}: the sequences differ in length along axis 0: "
                             + ", ".join(str(a.shape) for a in seqs))
    run = bodies.plan(body).run
    n_out = len(body.outputs)
    n_stacked = n_out + (n_state if keep_history else 0)
    stacked = None
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for n, t in enumerate(order):
        result = run(*[s[t] for s in seqs], *states, *invariants)
        if stacked is None:
            for j in range(n_state):
                if result[n_out + j].shape != states[j].shape:
                    raise ValueError(f"{body.where}: the step turns state {j} of shape "
                                     f"{states[j].shape} into one of shape "
                                     f"{result[n_out + j].shape}")
            stacked = [np.empty((steps,) + r.shape, r.dtype) for r in result[:n_stacked]]
        for k in range(n_stacked):
            if result[k].shape != stacked[k].shape[1:]:  # else NumPy would broadcast it
                raise ValueError(f"{body.where}: step {t} gave an output of shape "
                                 f"{result[k].shape}, the first step one of shape "
                                 f"{stacked[k].shape[1:]}")
            stacked[k][t] = result[k]
        states = result[n_out:]
        if n == 0 and steps > 1 and loop_due:
            # the first step checked the shapes: the others in one compiled loop,
            # where the body has one and it runs (else None: they run from Python)
            loop = bodies.loop(body, n_stacked)
            finals = loop and loop.run(1, steps, reverse, seqs, states, invariants, stacked)
            if finals is not None:
                states = finals
                break
    return tuple(stacked) if keep_history else tuple(stacked) + tuple(states)


_DEFAULT = Lowering()
_VIEW = View()
LOWERINGS = {
    "dot": Dot(),
    "conv": Conv(),
    "reshape": Reshape(),
    "concatenate": Concatenate(),
    "getitem": GetItem(),
    "gather": Gather(),
    "transpose": Transpose(),
    "tile": Tile(),
    "reverse": Reverse(),
    "pool": Pool(),
    "ctc_decode": CtcDecode(),
    "ctc_decoded_path": CtcDecodedPath(),
    "ctc_decoded_log_prob": CtcDecodedLogProb(),
    **{op: Reduce() for op in Reduce.ROW},
    "tuple_item": TupleItem(),
    "scan": Scan(),
    "reshape_like": _VIEW,
    "reshape_dynamic": _VIEW,
    "expand_dims": _VIEW,
    "print_tensor": _VIEW,
}


def lowering_of(node):
    """The lowering of a library node."""
    return LOWERINGS.get(node.op, _DEFAULT)
