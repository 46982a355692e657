"""Where the batch axis of a value lies, and whether an op keeps the rows of a
batch apart: the rules an export checks its program with.

An export (numbackend/exporting.py) cuts every batch into chunks of rows and
runs the whole program on each chunk alone, so it is right only where each row
of an output depends on the same row of the inputs and on nothing else of the
batch.  A value that depends on the batch carries it as a :class:`Batch`:
along axis ``axis``, each row of the batch holds ``block`` consecutive entries
(1, but more where a reshape merged the batch with the axes after it, as
TimeDistributed does), which depend on that row of the inputs alone.

Each op that keeps the rows apart declares a ``rows`` rule (Op.rows):
``rows(node, axes)``, given the Batch of each of its inputs (None for a value
that does not depend on the batch: weights, constants; a multi-output op's
value has a tuple, one entry per item), gives its result's, or raises
:class:`MixesRows` saying why the rows would mix (a reduction over the batch
axis, a slice of it, a product over it...).  An op without a rule is refused
wherever an input carries the batch.
"""
from typing import NamedTuple

from ..graph import format_shape, toposort
from .registry import OPS


class Batch(NamedTuple):
    """The batch of a value: along ``axis``, ``block`` entries per row."""
    axis: int
    block: int = 1

    def __str__(self):
        return f"axis {self.axis}" + (f" in blocks of {self.block}" if self.block != 1 else "")


class MixesRows(ValueError):
    """Raised by a rule: the op would mix the rows of a batch (the message says how)."""


class RowsRefused(ValueError):
    """Raised by :func:`trace`: ``node`` (a graph node) would mix the rows of a
    batch for ``reason``."""

    def __init__(self, node, reason):
        super().__init__(f"{describe(node)} {reason}")
        self.node = node
        self.reason = reason


def describe(node):
    """A node in words: its op, name, shape and type."""
    return f"{node.op} {node.name!r} {format_shape(node.shape)} {node.dtype}"


# the batch of a value computed from one by an op without a rule, where
# trace(strict=False) goes on past it
UNKNOWN = "unknown"


def trace(targets, known, strict=True):
    """{node id: its Batch} of every node the ``targets`` depend on, given the
    Batch of some (``known``, {node id: Batch}: the placeholders); leaves
    not in ``known`` (variables, constants) do not depend on the batch.
    Raises RowsRefused at the first node that would mix rows, or that has
    no rule where an input carries the batch; not ``strict``, such a node's
    value and those computed from it are UNKNOWN instead, and unchecked."""
    axes = dict(known)
    for node in toposort(targets):
        if node.id in axes:
            continue
        inputs = [axes.get(i.id) for i in node.inputs]
        op = OPS.get(node.op)
        if all(a is None for a in inputs):
            axes[node.id] = None  # the same for every chunk of the batch
        elif UNKNOWN in inputs or (not strict and (op is None or op.rows is None)):
            axes[node.id] = UNKNOWN
        elif op is None or op.rows is None:
            raise RowsRefused(node, "is not known to keep the rows of a batch apart")
        else:
            try:
                axes[node.id] = op.rows(node, inputs)
            except MixesRows as exc:
                raise RowsRefused(node, str(exc)) from None
            except RowsRefused as exc:  # in a sub-graph (a scan's step)
                raise RowsRefused(node, f"in its step: {exc}") from None
    return axes


# ---------------------------------------------------------------------------
# Rules shared by several ops


def same(node, axes):
    """The value passes through (or keeps its shape): the input's batch."""
    return axes[0]


def elementwise(node, axes):
    """Operands broadcast against each other (aligned from the last axis): their
    batches must land on one axis of the result, in blocks of one size."""
    landed = {Batch(b.axis + node.ndim - t.ndim, b.block)
              for t, b in zip(node.inputs, axes) if b is not None}
    if len(landed) > 1:
        raise MixesRows("broadcasts the batches of its operands against each other ("
                        + ", ".join(sorted(map(str, landed))) + " of its result)")
    return landed.pop()


def reduction(node, axes):
    """A reduction over ``axis`` (with ``keepdims``): not over the batch axis."""
    (b,) = axes
    reduced = node.attrs["axis"]
    if b.axis in reduced:
        raise MixesRows(f"reduces over the batch ({b})")
    return b if node.attrs["keepdims"] else b._replace(axis=b.axis - sum(r < b.axis for r in reduced))


def first_axis_only(node, axes):
    """Convolution and pooling, which take each entry of the input's axis 0 on
    its own: the batch must be there (the kernel must not depend on it)."""
    if axes[0] is None or axes[0].axis != 0 or any(b is not None for b in axes[1:]):
        raise MixesRows("runs over each entry of its input's axis 0 alone, but its inputs carry "
                        f"the batch on {', '.join(map(str, axes))}")
    return axes[0]


def transpose(node, axes):
    (b,) = axes
    return b._replace(axis=list(node.attrs["axes"]).index(b.axis))


def reverse(node, axes):
    (b,) = axes
    if b.axis in node.attrs["axes"]:
        raise MixesRows(f"reverses axis {b.axis}, the batch's")
    return b


def tile(node, axes):
    (b,) = axes
    if node.attrs["reps"][b.axis] != 1:
        raise MixesRows(f"repeats axis {b.axis}, the batch's, {node.attrs['reps'][b.axis]} times")
    return b


def expand_dims(node, axes):
    (b,) = axes
    kept = [a for a in range(node.ndim) if a not in node.attrs["axes"]]
    return b._replace(axis=kept[b.axis])


def reshape(node, axes):
    """A static reshape: the batch's rows lie in the input, in C order, as
    ``before`` slabs (the items of the axes before the batch's), each of them
    the rows one after the other, ``row`` items each.  The target's -1 takes
    them whole where the axes before it hold ``before`` items and those after
    it a divisor of ``row``: the rows then lie along it in blocks."""
    (b,) = axes
    (x,) = node.inputs
    shape = node.attrs["shape"]
    fixed = x.shape[:b.axis] + x.shape[b.axis + 1:]
    if -1 in shape and None not in fixed:
        before = _product(x.shape[:b.axis])
        row = b.block * _product(x.shape[b.axis + 1:])
        at = shape.index(-1)
        after = _product(shape[at + 1:])
        if _product(shape[:at]) == before and after and row % after == 0:
            return Batch(at, row // after)
    raise MixesRows(f"reshapes {format_shape(x.shape)} (the batch on {b}) into {shape}, which "
                    "does not keep the rows of the batch whole along one axis")


def _product(dims):
    total = 1
    for d in dims:
        total *= int(d)
    return total


def concatenate(node, axes):
    """Joins values that all carry the batch alike, along another axis."""
    carried = set(axes)
    if len(carried) != 1 or None in carried:
        raise MixesRows("joins values whose batches are on "
                        + ", ".join("no axis" if b is None else str(b) for b in axes))
    b = carried.pop()
    if node.attrs["axis"] == b.axis:
        raise MixesRows(f"joins along axis {b.axis}, the batch's")
    return b


def getitem(node, axes):
    """``x[key]``: the batch's axis must be taken whole (``:``), and moves as the
    key's ints, Nones and Ellipsis move the axes before it."""
    (b,) = axes
    key = node.attrs["key"]
    x = node.inputs[0]
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    axis = out = 0  # the next axis of x, of the result
    for k in key:
        if k is None:
            out += 1
        elif k is Ellipsis:
            take = x.ndim - n_real
            if axis <= b.axis < axis + take:
                return b._replace(axis=out + b.axis - axis)
            axis, out = axis + take, out + take
        elif isinstance(k, slice):
            if axis == b.axis:
                if k.start not in (None, 0) or k.stop is not None or k.step not in (None, 1):
                    raise MixesRows(f"slices axis {b.axis}, the batch's, by {k}")
                return b._replace(axis=out)
            axis, out = axis + 1, out + 1
        else:
            if axis == b.axis:
                raise MixesRows(f"takes item {k} of axis {b.axis}, the batch's")
            axis += 1
    return b._replace(axis=out + b.axis - axis)


def gather(node, axes):
    """Rows of a table by ids: the ids may carry the batch, the table not."""
    table, ids = axes
    if table is not None:
        raise MixesRows(f"takes rows of a table that carries the batch ({table})")
    return ids


def tuple_item(node, axes):
    return axes[0][node.attrs["index"]]


def dot(node, axes):
    """``x . y`` (NumPy's dot, or a 2-D product with transposed operands): the
    batch may lie along an axis of one operand that is not summed over."""
    x, y = node.inputs
    bx, by = axes
    if bx is not None and by is not None:
        raise MixesRows("multiplies two values that both carry the batch")
    transposed = node.attrs.get("transpose_a"), node.attrs.get("transpose_b")
    if bx is not None:
        a = 1 - bx.axis if transposed[0] else bx.axis  # the axis of x as the product sees it
        if a == x.ndim - 1:
            raise MixesRows(f"sums over axis {a} of its left operand, the batch's")
        return bx._replace(axis=a)
    a = 1 - by.axis if transposed[1] else by.axis
    if y.ndim == 1 or a == y.ndim - 2:
        raise MixesRows(f"sums over axis {a} of its right operand, the batch's")
    # the result's axes: x's but its last, then y's but the summed one
    return by._replace(axis=x.ndim - 1 + (a if a < y.ndim - 2 else a - 1))
