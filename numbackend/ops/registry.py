"""The op registry: ``Op``, ``OPS``, ``register``, and building nodes (``apply``,
``as_tensor``) with the shape helpers every family's rules use.

An ``Op`` carries
- ``kind``: 'elementwise' (fused into generated kernels), 'reduce' (fused as a
  kernel's last stage where the shapes allow), or 'library' (a NumPy/BLAS or
  jit_kernels call made by one plan step);
- ``infer(inputs, attrs) -> (shape, dtype)``: the static shape and dtype rule,
  which raises at construction on bad input;
- ``impl(*arrays, **attrs)``: the NumPy semantics (the reference for library
  ops, constant folding and the interpreter fallback);
- ``template``: for an element-wise op, the scalar expression the code
  generator inlines (``{0}``, ``{1}`` are operands already cast to the op's
  compute dtype; ``{T}`` is 'f32'/'f64'; ``{ct}`` names the compute scalar
  type, e.g. ``np.float32``);
- ``reduce_row``, ``reduce_fold`` and ``reduce_settle``: for a reduction, its
  fused form (see ``reductions.reduction``);
- ``compute_dtype(inputs, attrs)``: for an element-wise op or a reduction, the
  dtype its operands are cast to before it computes;
- ``grad(g, node) -> [gradient per input]``: the reverse-mode rule, built
  from graph ops (used by autodiff);
- ``rows(node, axes) -> axis``: where the batch axis of its result lies,
  given its inputs' (see ops/batch.py: an export refuses an op that has no
  such rule, or whose rule says it mixes the rows of a batch).
"""
import numbers

import numpy as np

from .. import config
from ..graph import Constant, SparseTensor, Tensor, canonical_dtype, format_shape

OPS = {}


class Op:
    """One op: its kind, rules and traits (see the module docstring)."""

    def __init__(self, name, kind, infer, impl, template=None, grad=None, reduce_row=None,
                 reduce_fold=None, reduce_settle=None, compute_dtype=None, stateful=False,
                 multi_output=False, computed_by=None, grad_takes_wanted=False,
                 grad_differentiates=False, rising=(), rows=None):
        self.name = name
        self.kind = kind
        self.infer = infer
        self.impl = impl
        self.template = template
        self.grad = grad
        # grad also takes wanted=[whether each input's gradient is needed], and
        # may skip the work of those that are not
        self.grad_takes_wanted = grad_takes_wanted
        # grad also takes gradients=autodiff.gradients: its gradient differentiates
        # a graph of its own (a scan's step), and the ops sit below autodiff
        self.grad_differentiates = grad_differentiates
        self.reduce_row = reduce_row
        self.reduce_fold = reduce_fold
        self.reduce_settle = reduce_settle
        self.compute_dtype = compute_dtype
        self.stateful = stateful  # draws random numbers: never folded or merged
        # its value is a tuple of arrays, read by 'tuple_item' nodes; never folded
        self.multi_output = multi_output
        # (multi-output op, index): the same value is that op's item on the same
        # inputs; a graph that computes that op anyway reads it from there
        self.computed_by = computed_by
        # the operands in each of which the op's compiled and NumPy forms are
        # non-decreasing, rounding included (the others held fixed): max pooling
        # commutes with such ops (see partition.rises_with)
        self.rising = rising
        self.rows = rows  # the batch axis of its result (ops/batch.py); None: not known

    def __repr__(self):
        return f"Op({self.name!r}, {self.kind})"


def contiguous(a):
    """``a`` as a C-contiguous array (a copy only when needed); unlike
    np.ascontiguousarray it keeps a 0-d array 0-d."""
    if isinstance(a, np.ndarray) and a.flags.c_contiguous:
        return a
    return np.array(a, order="C")  # np.require costs microseconds of Python per call


def register(op):
    """Add ``op`` to OPS (raises if its name is taken); returns it."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} defined twice")
    OPS[op.name] = op
    return op


# ---------------------------------------------------------------------------
# Building nodes


def as_tensor(x, dtype=None, where="tensor"):
    """A Tensor for x: tensors pass through, arrays and numbers become constants."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)) and any(isinstance(e, Tensor) for e in x):
        return apply("stack", *[as_tensor(e, dtype, where) for e in x], axis=0)
    if dtype is None:
        arr = np.asarray(x)
        if arr.dtype == np.float64 and not isinstance(x, np.ndarray):
            dtype = config.floatx()  # Python floats take the default float type
        elif arr.dtype == np.int64 and not isinstance(x, np.ndarray):
            dtype = "int32"
        else:
            dtype = canonical_dtype(arr.dtype, where)
    return Constant(x, dtype=dtype)


def _is_python_scalar(x):
    return isinstance(x, (numbers.Number, np.number, np.bool_)) and not isinstance(x, Tensor)


def apply(name, *args, **attrs):
    """Make a node of op ``name`` on ``args`` (tensors, arrays or numbers)."""
    op = OPS[name]
    if op.kind == "elementwise":
        inputs = _elementwise_operands(name, args)
    else:
        inputs = [as_tensor(a, where=name) for a in args]
    for t in inputs:
        if isinstance(t, SparseTensor):
            # as TensorFlow's ops, which take no SparseTensor
            raise TypeError(f"{name}: {t.name!r} of shape {format_shape(t.shape)} is a sparse "
                            "tensor; convert it with K.to_dense first")
    shape, dtype = op.infer(inputs, attrs)
    return Tensor(name, inputs, attrs, shape, dtype)


def _elementwise_operands(name, args):
    """Python scalars adopt the dtype of the tensors beside them (weak typing)."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    arrays = [np.asarray(a) for a in args if not isinstance(a, Tensor) and not _is_python_scalar(a)]
    strong = [t.dtype for t in tensors] + [canonical_dtype(a.dtype, name) for a in arrays]
    inputs = []
    for a in args:
        if isinstance(a, Tensor):
            inputs.append(a)
        elif _is_python_scalar(a):
            inputs.append(as_tensor(a, dtype=_weak_scalar_dtype(a, strong), where=name))
        else:
            inputs.append(as_tensor(a, where=name))
    return inputs


def _weak_scalar_dtype(value, strong):
    if not strong:
        return None
    base = np.result_type(*strong).name
    if isinstance(value, (bool, np.bool_)):
        return base
    if isinstance(value, numbers.Integral) or np.asarray(value).dtype.kind in "iu":
        return base if base != "bool" else "int32"
    if np.issubdtype(np.dtype(base), np.floating):
        return base
    return config.floatx()


# ---------------------------------------------------------------------------
# Shape helpers


def broadcast_shapes(where, *shapes):
    """NumPy broadcasting on static shapes (None = unknown); raises naming ``where``."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(ndim):
        dims = [s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ValueError(f"{where}: incompatible shapes for broadcasting: "
                             + ", ".join(format_shape(s) for s in shapes))
        if known:
            result.append(known.pop())
        elif any(d is None for d in dims):
            result.append(None)
        else:
            result.append(1)
    return tuple(result)


def normalize_axes(where, axis, ndim):
    """A sorted tuple of non-negative axes; None means all axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, Tensor):
        raise TypeError(f"{where}: axis must be a Python int or list of ints, not a tensor")
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"{where}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: repeated axis in {axis}")
    return tuple(sorted(out))


def normalize_axis(where, axis, ndim):
    """One non-negative axis for the int ``axis`` of a tensor of rank ``ndim``."""
    return normalize_axes(where, int(axis), ndim)[0]


# ---------------------------------------------------------------------------
# Dtype rules


def promote_dtype(inputs):
    """NumPy's promotion of the tensors' dtypes (a dtype name)."""
    return np.result_type(*[np.dtype(t.dtype) for t in inputs]).name


def float_dtype(dtype):
    """``dtype`` where it is a float type, else floatx (integers and booleans compute as floats)."""
    return dtype if np.dtype(dtype).kind == "f" else config.floatx()


# ---------------------------------------------------------------------------
# Library ops: one plan step each, NumPy/BLAS or jit_kernels


def not_differentiable(g, n):
    """The gradient rule of an op that gradients go through as through a constant
    (TensorFlow's NotDifferentiable: decoders, assignments).  An op with no rule at
    all makes ``gradients`` raise instead, rather than give a silent zero."""
    return [None] * len(n.inputs)


def is_float(t):
    """Whether a tensor (or array) holds floats."""
    return np.dtype(t.dtype).kind == "f"


def library(name, infer, impl, grad=None, stateful=False, multi_output=False, computed_by=None,
            grad_takes_wanted=False, grad_differentiates=False, rows=None):
    """Define a library op (see Op for the traits); how it runs, and what it
    fuses with, is its lowering's (numbackend/lowering.py)."""
    return register(Op(name, "library", infer, impl, grad=grad, stateful=stateful,
                       multi_output=multi_output, computed_by=computed_by,
                       grad_takes_wanted=grad_takes_wanted,
                       grad_differentiates=grad_differentiates, rows=rows))
