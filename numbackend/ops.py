"""The op registry: every op is defined once, here.

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
  compute dtype; ``{T}`` is 'f32'/'f64'; ``{ct}``/``{ot}`` name the compute
  and output scalar types);
- ``grad(g, node) -> [gradient per input]``: the reverse-mode rule, built
  from graph ops (used by autodiff).
"""
import math
import numbers

import numpy as np

from . import config, graph
from .graph import Constant, SparseTensor, Tensor, canonical_dtype, format_shape

OPS = {}


class Op:
    def __init__(self, name, kind, infer, impl, template=None, grad=None, reduce_init=None,
                 reduce_combine=None, compute_dtype=None, stateful=False, multi_output=False,
                 computed_by=None, epilogue=False, pools=False, grad_takes_wanted=False, rising=()):
        self.name = name
        self.kind = kind
        self.infer = infer
        self.impl = impl
        self.template = template
        self.grad = grad
        # grad also takes wanted=[whether each input's gradient is needed], and
        # may skip the work of those that are not
        self.grad_takes_wanted = grad_takes_wanted
        self.reduce_init = reduce_init
        self.reduce_combine = reduce_combine
        self.compute_dtype = compute_dtype
        self.stateful = stateful  # draws random numbers: never folded or merged
        # its value is a tuple of arrays, read by 'tuple_item' nodes; never folded
        self.multi_output = multi_output
        # (multi-output op, index): the same value is that op's item on the same
        # inputs; a graph that computes that op anyway reads it from there
        self.computed_by = computed_by
        # impl takes epilogue=f: f(block, out) is called with each block of the
        # result's rows, (rows, last axis), as it is computed, and writes their final
        # values into out, the result's view; the compiler passes an element-wise
        # group that reads the result this way
        self.epilogue = epilogue
        # impl also takes pool='max' | 'avg': it returns its result (after the
        # epilogue) pooled over 2x2 windows with stride 2, 'valid', computed block
        # by block; the compiler passes a 'pool' node that alone reads that result;
        # and pool_first=True: the epilogue runs on the pooled values instead (the
        # compiler knows the two commute)
        self.pools = pools
        # the operands in each of which the op's compiled and NumPy forms are
        # non-decreasing, rounding included (the others held fixed): max pooling
        # commutes with such ops (see compiler.rises_with)
        self.rising = rising

    def __repr__(self):
        return f"Op({self.name!r}, {self.kind})"


def contiguous(a):
    """``a`` as a C-contiguous array (a copy only when needed); unlike
    np.ascontiguousarray it keeps a 0-d array 0-d."""
    if isinstance(a, np.ndarray) and a.flags.c_contiguous:
        return a
    return np.array(a, order="C")  # np.require costs microseconds of Python per call


def register(op):
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
    return normalize_axes(where, int(axis), ndim)[0]


# ---------------------------------------------------------------------------
# Element-wise ops

def _promote(inputs):
    return np.result_type(*[np.dtype(t.dtype) for t in inputs]).name


def _float_of(dtype):
    return dtype if np.dtype(dtype).kind == "f" else config.floatx()


def elementwise(name, arity, template, impl, out="promote", grad=None, rising=()):
    """Define an element-wise op.

    out: 'promote' (NumPy promotion of the operands), 'float' (promotion, then
    integers and booleans become floatx), 'bool' (comparisons: operands are
    compared in their promoted type), 'cast' (the dtype attribute), 'first' (the
    first operand's dtype).  rising: see Op.rising.
    """
    def infer(inputs, attrs):
        if len(inputs) != arity:
            raise TypeError(f"{name}: expected {arity} operand(s), got {len(inputs)}")
        shape = broadcast_shapes(name, *[t.shape for t in inputs])
        return shape, output_dtype(inputs, attrs)

    def output_dtype(inputs, attrs):
        if out == "cast":
            return attrs["dtype"]
        if out == "first":
            return inputs[0].dtype
        promoted = _promote(inputs)
        if out == "float":
            return _float_of(promoted)
        if out == "bool":
            return "bool"
        return promoted

    def compute_dtype(inputs, attrs):
        if out in ("cast", "first"):
            return inputs[0].dtype
        promoted = _promote(inputs)
        return _float_of(promoted) if out == "float" else promoted

    return register(Op(name, "elementwise", infer, impl, template=template, grad=grad,
                       compute_dtype=compute_dtype, rising=rising))


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_softplus(x):
    return np.logaddexp(0, x).astype(x.dtype)


def _np_power(x, y):
    with np.errstate(all="ignore"):
        return np.power(x, y)


def _np_floor_divide(x, y):
    with np.errstate(all="ignore"):
        return np.floor_divide(x, y)


def _np_mod(x, y):
    with np.errstate(all="ignore"):
        return np.mod(x, y)


def _np_cast(x, dtype):
    return x.astype(dtype)


elementwise("add", 2, "({0} + {1})", np.add, grad=lambda g, n: [g, g], rising=(0, 1))
elementwise("subtract", 2, "({0} - {1})", np.subtract, grad=lambda g, n: [g, apply("negative", g)],
            rising=(0,))
elementwise("multiply", 2, "({0} * {1})", np.multiply,
            grad=lambda g, n: [apply("multiply", g, n.inputs[1]), apply("multiply", g, n.inputs[0])])
def _quotient_grad(op):
    """The gradient of n = x / y computed by ``op``: g / y and -(g n) / y, divided alike."""
    return lambda g, n: [apply(op, g, n.inputs[1]),
                         apply("negative", apply(op, apply("multiply", g, n), n.inputs[1]))]


elementwise("divide", 2, "({0} / {1})", lambda x, y: np.true_divide(x, y), out="float",
            grad=_quotient_grad("divide"))
# x * (1 / y), as TensorFlow's softmax scales by its row sums: within an ulp of
# x / y, and where y is one value per row of x the compiler hoists the division
# out of the row loop (a softmax scaling its exps in place in the output row ran
# 15% faster this way than dividing each element).
elementwise("times_reciprocal", 2, "({0} * ({ct}(1) / {1}))",
            lambda x, y: x * np.true_divide(1, y), out="float", grad=_quotient_grad("times_reciprocal"))
elementwise("floor_divide", 2, "({0} // {1})", _np_floor_divide, grad=lambda g, n: [None, None])
elementwise("mod", 2, "({0} % {1})", _np_mod,
            grad=lambda g, n: [g, apply("negative", apply("multiply", g,
                                                    apply("floor_divide", n.inputs[0], n.inputs[1])))])
elementwise("power", 2, "vm.pow_{T}({0}, {1})", _np_power, out="float",
            grad=lambda g, n: [
                apply("multiply", g, apply("multiply", n.inputs[1],
                                     apply("power", n.inputs[0], apply("subtract", n.inputs[1], 1)))),
                apply("multiply", g, apply("multiply", n, apply("log", n.inputs[0])))])
elementwise("maximum", 2, "({0} if ({0} >= {1} or {0} != {0}) else {1})", np.maximum,
            grad=lambda g, n: [apply("multiply", g, apply("cast", apply("greater_equal", n.inputs[0], n.inputs[1]), dtype=g.dtype)),
                               apply("multiply", g, apply("cast", apply("less", n.inputs[0], n.inputs[1]), dtype=g.dtype))],
            rising=(0, 1))
elementwise("minimum", 2, "({0} if ({0} <= {1} or {0} != {0}) else {1})", np.minimum,
            grad=lambda g, n: [apply("multiply", g, apply("cast", apply("less_equal", n.inputs[0], n.inputs[1]), dtype=g.dtype)),
                               apply("multiply", g, apply("cast", apply("greater", n.inputs[0], n.inputs[1]), dtype=g.dtype))],
            rising=(0, 1))
for _name, _sym, _fn in (("equal", "==", np.equal), ("not_equal", "!=", np.not_equal),
                         ("less", "<", np.less), ("less_equal", "<=", np.less_equal),
                         ("greater", ">", np.greater), ("greater_equal", ">=", np.greater_equal)):
    elementwise(_name, 2, "({0} " + _sym + " {1})", _fn, out="bool", grad=lambda g, n: [None, None])
elementwise("logical_and", 2, "(({0} != 0) and ({1} != 0))", np.logical_and, out="bool",
            grad=lambda g, n: [None, None])
elementwise("logical_or", 2, "(({0} != 0) or ({1} != 0))", np.logical_or, out="bool",
            grad=lambda g, n: [None, None])
elementwise("logical_not", 1, "({0} == 0)", np.logical_not, out="bool", grad=lambda g, n: [None])
elementwise("where", 3, "({1} if {0} else {2})", np.where,
            out="promote",
            grad=lambda g, n: [None,
                               apply("where", n.inputs[0], g, apply("multiply", g, 0)),
                               apply("where", n.inputs[0], apply("multiply", g, 0), g)])
# x broadcast to the shape of x and like together; like only lends its shape.
elementwise("broadcast_like", 2, "{0}",
            lambda x, like: np.broadcast_to(x, np.broadcast_shapes(x.shape, like.shape)), out="first",
            grad=lambda g, n: [g, None])
elementwise("negative", 1, "(-{0})", np.negative, grad=lambda g, n: [apply("negative", g)])
elementwise("abs", 1, "abs({0})", np.abs,
            grad=lambda g, n: [apply("multiply", g, apply("sign", n.inputs[0]))])
elementwise("sign", 1, "(({ct}(1) if {0} > 0 else ({ct}(-1) if {0} < 0 else {0})))", np.sign,
            grad=lambda g, n: [None])
elementwise("square", 1, "({0} * {0})", np.square,
            grad=lambda g, n: [apply("multiply", g, apply("multiply", n.inputs[0], 2))])
elementwise("sqrt", 1, "np.sqrt({0})", np.sqrt, out="float",
            grad=lambda g, n: [apply("divide", g, apply("multiply", n, 2))])
elementwise("exp", 1, "vm.exp_{T}({0})", np.exp, out="float",
            grad=lambda g, n: [apply("multiply", g, n)])
# exp of x <= 0 (a softmax's x - max): one scaling by 2**n where exp needs two, so
# compiled kernels flush results below float32's (float64's) least normal to 0.
elementwise("exp_nonpositive", 1, "vm.exp_nonpositive_{T}({0})", np.exp, out="float",
            grad=lambda g, n: [apply("multiply", g, n)])
elementwise("expm1", 1, "vm.expm1_{T}({0})", np.expm1, out="float",
            grad=lambda g, n: [apply("multiply", g, apply("add", n, 1))])
elementwise("log", 1, "vm.log_{T}({0})", np.log, out="float",
            grad=lambda g, n: [apply("divide", g, n.inputs[0])])
elementwise("log1p", 1, "vm.log1p_{T}({0})", np.log1p, out="float",
            grad=lambda g, n: [apply("divide", g, apply("add", n.inputs[0], 1))])
elementwise("tanh", 1, "vm.tanh_{T}({0})", np.tanh, out="float",
            grad=lambda g, n: [apply("multiply", g, apply("subtract", 1, apply("square", n)))])
elementwise("sigmoid", 1, "vm.sigmoid_{T}({0})", _np_sigmoid, out="float",
            grad=lambda g, n: [apply("multiply", g, apply("multiply", n, apply("subtract", 1, n)))])
elementwise("softplus", 1, "vm.softplus_{T}({0})", _np_softplus, out="float",
            grad=lambda g, n: [apply("multiply", g, apply("sigmoid", n.inputs[0]))])
elementwise("sin", 1, "vm.sin_{T}({0})", np.sin, out="float",
            grad=lambda g, n: [apply("multiply", g, apply("cos", n.inputs[0]))])
elementwise("cos", 1, "vm.cos_{T}({0})", np.cos, out="float",
            grad=lambda g, n: [apply("negative", apply("multiply", g, apply("sin", n.inputs[0])))])
elementwise("round", 1, "vm.rint_{T}({0})", np.round, out="float", grad=lambda g, n: [None])
elementwise("floor", 1, "np.floor({0})", np.floor, out="float", grad=lambda g, n: [None])
elementwise("cast", 1, "{ot}({0})", _np_cast, out="cast",
            grad=lambda g, n: [apply("cast", g, dtype=n.inputs[0].dtype)
                               if np.dtype(n.inputs[0].dtype).kind == "f"
                               and np.dtype(n.dtype).kind == "f" else None])


# ---------------------------------------------------------------------------
# Reductions


def _reduce_infer(name, out_dtype=None):
    def infer(inputs, attrs):
        (x,) = inputs
        axes = normalize_axes(name, attrs.get("axis"), x.ndim)
        attrs["axis"] = axes
        keepdims = bool(attrs.get("keepdims", False))
        attrs["keepdims"] = keepdims
        shape = tuple((1 if keepdims else None) if i in axes else d for i, d in enumerate(x.shape))
        if not keepdims:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        dtype = out_dtype(x.dtype) if out_dtype else x.dtype
        return shape, dtype
    return infer


def reduction(name, impl, init, combine, out_dtype=None, grad=None):
    """A reduction over ``axis`` (tuple) with ``keepdims``; init/combine are the
    accumulator's scalar code for the fused kernel (``acc``, ``x``)."""
    def run(x, axis, keepdims):
        return np.asarray(impl(x, axis=axis, keepdims=keepdims))
    return register(Op(name, "reduce", _reduce_infer(name, out_dtype), run, grad=grad,
                       reduce_init=init, reduce_combine=combine))


def _sum_dtype(dtype):
    return "int64" if np.dtype(dtype).kind in "biu" and dtype != "uint64" else dtype


def _keep(g, n):
    """A reduction's gradient (or result) ``g`` with the reduced axes put back as
    axes of length 1, so that it broadcasts against the input."""
    if n.attrs["keepdims"]:
        return g
    shape = list(n.inputs[0].shape)
    for a in n.attrs["axis"]:
        shape[a] = 1
    if shape.count(None) <= 1:
        # a static reshape, which the compiled whole call and scan loops know
        return apply("reshape", g, shape=tuple(-1 if d is None else d for d in shape))
    # several unknown dims: only the run-time shape tells them apart
    return apply("expand_dims", g, axes=n.attrs["axis"])


def _grad_sum(g, n):
    x = n.inputs[0]
    g = _keep(g, n)
    if g.dtype != x.dtype:  # a no-op cast would be a kernel of its own
        g = apply("cast", g, dtype=x.dtype)
    return [apply("broadcast_like", g, x)]


def _grad_mean(g, n):
    x = n.inputs[0]
    count = apply("axes_size", x, axis=n.attrs["axis"], dtype=x.dtype)
    return [apply("broadcast_like", apply("divide", _keep(g, n), count), x)]


def _grad_extreme(g, n):
    x = n.inputs[0]
    red = n if n.attrs["keepdims"] else _keep(n, n)
    hit = apply("cast", apply("equal", x, red), dtype=x.dtype)
    count = apply("sum", hit, axis=n.attrs["axis"], keepdims=True)
    return [apply("multiply", apply("divide", hit, count), _keep(g, n))]


def _grad_prod(g, n):
    x = n.inputs[0]
    red = n if n.attrs["keepdims"] else _keep(n, n)
    return [apply("multiply", _keep(g, n), apply("divide", red, x))]


reduction("sum", np.sum, "0", "acc + x", grad=_grad_sum,
          out_dtype=_sum_dtype)
reduction("prod", np.prod, "1", "acc * x", grad=_grad_prod, out_dtype=_sum_dtype)
reduction("max", np.max, "-np.inf", "x if (x > acc or x != x) else acc", grad=_grad_extreme)
reduction("min", np.min, "np.inf", "x if (x < acc or x != x) else acc", grad=_grad_extreme)
reduction("mean", np.mean, "0", "acc + x", grad=_grad_mean,
          out_dtype=_float_of)
reduction("any", np.any, "False", "acc or (x != 0)", out_dtype=lambda d: "bool",
          grad=lambda g, n: [None])
reduction("all", np.all, "True", "acc and (x != 0)", out_dtype=lambda d: "bool",
          grad=lambda g, n: [None])


# ---------------------------------------------------------------------------
# Library ops: one plan step each, NumPy/BLAS or jit_kernels


def not_differentiable(g, n):
    """The gradient rule of an op that gradients go through as through a constant
    (TensorFlow's NotDifferentiable: decoders, assignments).  An op with no rule at
    all makes ``gradients`` raise instead, rather than give a silent zero."""
    return [None] * len(n.inputs)


def library(name, infer, impl, grad=None, stateful=False, multi_output=False, computed_by=None,
            epilogue=False, pools=False, grad_takes_wanted=False):
    return register(Op(name, "library", infer, impl, grad=grad, stateful=stateful,
                       multi_output=multi_output, computed_by=computed_by, epilogue=epilogue,
                       pools=pools, grad_takes_wanted=grad_takes_wanted))


# One output of a multi-output node (whose value is a tuple); autodiff gathers
# the gradients of a node's items into a dict {index: gradient} for its rule.
library("tuple_item", lambda inputs, attrs: (attrs["shape"], attrs["dtype"]),
        lambda packed, index, shape, dtype: packed[index], grad=lambda g, n: [g])


def _shape_of(where, shape):
    out = []
    for d in shape:
        if d is None or (isinstance(d, (int, np.integer)) and d >= 0):
            out.append(None if d is None else int(d))
        else:
            raise ValueError(f"{where}: bad dimension {d!r} in shape {shape}")
    return tuple(out)


def _dot_infer(inputs, attrs):
    x, y = inputs
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"dot: operands must have rank >= 1, got shapes {format_shape(x.shape)} "
                         f"and {format_shape(y.shape)}")
    xs, ys = x.shape, y.shape
    # transpose_a/transpose_b (2-D operands only) let gradients use BLAS's transposed
    # products instead of copying a transpose first
    if attrs.get("transpose_a") or attrs.get("transpose_b"):
        if x.ndim != 2 or y.ndim != 2:
            raise ValueError("dot: transpose_a/transpose_b need 2-D operands")
        xs = xs[::-1] if attrs.get("transpose_a") else xs
        ys = ys[::-1] if attrs.get("transpose_b") else ys
    k_x = xs[-1]
    k_y = ys[-2] if len(ys) >= 2 else ys[0]
    if k_x is not None and k_y is not None and k_x != k_y:
        raise ValueError(f"dot: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)} ({k_x} != {k_y})")
    shape = xs[:-1] + (ys[:-2] + ys[-1:] if len(ys) >= 2 else ())
    return shape, _promote(inputs)


def _dot(x, y, transpose_a=False, transpose_b=False):
    # the shapes known only at run time are checked here, as at construction
    k_x = x.shape[0 if transpose_a else -1]
    k_y = y.shape[1 if transpose_b else (-2 if y.ndim >= 2 else 0)]
    if k_x != k_y:
        raise ValueError(f"dot: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)} ({k_x} != {k_y})")
    if x.ndim > 2 and y.ndim == 2 and x.flags.c_contiguous:
        # np.dot runs a slow loop, not BLAS, for a 3-D and up left operand
        return np.dot(x.reshape(-1, x.shape[-1]), y).reshape(x.shape[:-1] + y.shape[-1:])
    x, y = (x.T if transpose_a else x), (y.T if transpose_b else y)
    if x.ndim == 2 and y.ndim == 2:
        return np.matmul(x, y)  # the same product, a few percent less overhead
    return np.dot(x, y)


def _as_matrix(t):
    """t with its leading axes flattened: (-1, last axis), also when that axis is unknown."""
    if t.ndim == 2:
        return t
    if t.shape[-1] is not None:
        return apply("reshape", t, shape=(-1, t.shape[-1]))
    last = apply("getitem", apply("shape", t), key=(-1,))
    target = apply("stack", Constant(np.asarray(-1, dtype=np.int32)), last, axis=0)
    return apply("reshape_dynamic", t, target, known=(None, None))


def _dot_grad(g, n):
    x, y = n.inputs
    ta, tb = n.attrs.get("transpose_a", False), n.attrs.get("transpose_b", False)
    if x.ndim == 2 and y.ndim == 2:
        if not ta and not tb:      # out = x y
            return [apply("dot", g, y, transpose_b=True), apply("dot", x, g, transpose_a=True)]
        if not ta:                 # out = x y'
            return [apply("dot", g, y), apply("dot", g, x, transpose_a=True)]
        if not tb:                 # out = x' y
            return [apply("dot", y, g, transpose_b=True), apply("dot", x, g)]
        return [apply("dot", y, g, transpose_a=True, transpose_b=True),   # out = x' y'
                apply("dot", g, x, transpose_a=True, transpose_b=True)]
    if y.ndim == 2:  # (..., k) . (k, n): flatten the leading axes of x and g
        x2, g2 = _as_matrix(x), _as_matrix(g)
        gx = apply("reshape_like", apply("dot", g2, y, transpose_b=True), x)
        return [gx, apply("dot", x2, g2, transpose_a=True)]
    if y.ndim == 1:  # (..., k) . (k,) -> (...): an outer product back
        gx = apply("multiply", apply("getitem", g, key=(Ellipsis, None)), y)
        gy = apply("dot", apply("reshape", g, shape=(-1,)), _as_matrix(x))
        return [gx, gy]
    raise NotImplementedError("gradients: dot with a right operand of rank 3 or more has no "
                              "gradient rule; math.dot rewrites it on 2-D products")


library("dot", _dot_infer, _dot, grad=_dot_grad)


def is_float_matrix_product(node):
    """Whether a ``dot`` node multiplies two 2-D float32 or float64 matrices of its
    own dtype: the products with compiled forms (compiled_plan, and the packed
    products of compiler._ProductByWeights)."""
    a, b = node.inputs
    return (a.ndim == 2 and b.ndim == 2 and node.dtype in ("float32", "float64")
            and a.dtype == b.dtype == node.dtype)


# ---------------------------------------------------------------------------
# Sparse tensors: ops on the three parts of a graph.SparseTensor (indices
# (nonzeros, 2) int64, values (nonzeros,), dense_shape (2,) int64), each index
# once; sparse.py builds them.  ``shape``/``sparse_shape``: the sparse
# tensor's static shape, checked against its dense_shape at run time.


def _sparse_kernels():
    from jit_kernels import sparse
    return sparse


def _check_sparse_parts(where, indices, values, dense_shape):
    if (indices.ndim != 2 or indices.shape[1] not in (None, 2) or values.ndim != 1
            or dense_shape.shape != (2,)):
        raise ValueError(f"{where}: expected sparse parts of shapes (nonzeros, 2), (nonzeros,) and "
                         f"(2,), got {format_shape(indices.shape)}, {format_shape(values.shape)} "
                         f"and {format_shape(dense_shape.shape)}")
    if indices.dtype != "int64" or dense_shape.dtype != "int64":
        raise TypeError(f"{where}: sparse indices and dense shape must be int64, got "
                        f"{indices.dtype} and {dense_shape.dtype}")


def _sparse_dims(where, indices, dense_shape, static, values=None):
    """The rows, columns and (rows, columns) size of a sparse tensor's parts, checked
    against each other and against its static shape."""
    rows, cols, dims = _sparse_kernels().check_indices(where, indices, dense_shape)
    if any(s is not None and s != d for s, d in zip(static, dims)):
        raise ValueError(f"{where}: a sparse tensor of shape {format_shape(static)} has dense "
                         f"shape {dims}")
    if values is not None and values.shape != rows.shape:
        raise ValueError(f"{where}: {rows.size} sparse indices but values of shape {values.shape}")
    return rows, cols, dims


def _sparse_to_dense_infer(inputs, attrs):
    indices, values, dense_shape = inputs
    _check_sparse_parts("to_dense", indices, values, dense_shape)
    return tuple(attrs["shape"]), values.dtype


def _sparse_to_dense(indices, values, dense_shape, shape):
    rows, cols, dims = _sparse_dims("to_dense", indices, dense_shape, shape, values)
    out = np.zeros(dims, dtype=values.dtype)
    out[rows, cols] = values  # each index once
    return out


library("sparse_to_dense", _sparse_to_dense_infer, _sparse_to_dense,
        grad=lambda g, n: [None, apply("sparse_gather", g, n.inputs[0], n.inputs[2]), None])


def _sparse_gather_infer(inputs, attrs):
    dense, indices, _ = inputs
    if dense.ndim != 2:
        raise ValueError(f"sparse_gather: expected a 2-D tensor, got shape "
                         f"{format_shape(dense.shape)}")
    return (indices.shape[0],), dense.dtype


def _sparse_gather(dense, indices, dense_shape):
    """dense[i, j] for each index (i, j) of a sparse tensor of dense's shape."""
    rows, cols, _ = _sparse_dims("sparse_gather", indices, dense_shape, dense.shape)
    return dense[rows, cols]


library("sparse_gather", _sparse_gather_infer, _sparse_gather,
        grad=lambda g, n: [apply("sparse_to_dense", n.inputs[1], g, n.inputs[2],
                                 shape=n.inputs[0].shape), None, None])


def _sparse_matmul_infer(inputs, attrs):
    indices, values, dense_shape, dense = inputs
    _check_sparse_parts("dot", indices, values, dense_shape)
    outer, inner = attrs["sparse_shape"][::-1] if attrs["adjoint_a"] else attrs["sparse_shape"]
    if dense.ndim != 2 or (inner is not None and dense.shape[0] not in (None, inner)):
        raise ValueError(f"dot: cannot multiply a sparse tensor of shape "
                         f"{format_shape(attrs['sparse_shape'])}{' transposed' * attrs['adjoint_a']} "
                         f"by a dense one of shape {format_shape(dense.shape)}")
    if values.dtype != dense.dtype or values.dtype not in ("float32", "float64"):
        raise TypeError(f"dot: a sparse product needs float32 or float64 operands of one dtype, "
                        f"got {values.dtype} and {dense.dtype}")
    return (outer, dense.shape[1]), dense.dtype


def _sparse_matmul(indices, values, dense_shape, dense, adjoint_a, sparse_shape):
    _sparse_dims("dot", indices, dense_shape, sparse_shape, values)
    return _sparse_kernels().sparse_dense_matmul(indices, values, dense_shape, dense, adjoint_a)


def _sparse_matmul_grad(g, n, wanted):
    indices, values, dense_shape, dense = n.inputs
    adjoint, static = n.attrs["adjoint_a"], n.attrs["sparse_shape"]
    g_values = g_dense = None
    if wanted[1]:
        g_values = apply("sparse_sampled_products", indices, dense_shape, g, dense,
                         adjoint_a=adjoint, sparse_shape=static)
    if wanted[3]:
        g_dense = apply("sparse_dense_matmul", indices, values, dense_shape, g,
                        adjoint_a=not adjoint, sparse_shape=static)
    return [None, g_values, None, g_dense]


# A @ dense (A' @ dense with adjoint_a) for the sparse A of the first three inputs
library("sparse_dense_matmul", _sparse_matmul_infer, _sparse_matmul, grad=_sparse_matmul_grad,
        grad_takes_wanted=True)


def _sampled_products_infer(inputs, attrs):
    indices, _, a, b = inputs
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype:
        raise ValueError(f"sparse_sampled_products: expected two 2-D tensors of one dtype, got "
                         f"{format_shape(a.shape)} {a.dtype} and {format_shape(b.shape)} {b.dtype}")
    return (indices.shape[0],), a.dtype


def _sampled_products(indices, dense_shape, a, b, adjoint_a, sparse_shape):
    _sparse_dims("dot", indices, dense_shape, sparse_shape)
    return _sparse_kernels().sampled_products(indices, dense_shape, a, b, adjoint_a)


def _sampled_products_grad(g, n):
    indices, dense_shape, a, b = n.inputs
    adjoint, static = n.attrs["adjoint_a"], n.attrs["sparse_shape"]
    return [None, None,
            apply("sparse_dense_matmul", indices, g, dense_shape, b, adjoint_a=adjoint,
                  sparse_shape=static),
            apply("sparse_dense_matmul", indices, g, dense_shape, a, adjoint_a=not adjoint,
                  sparse_shape=static)]


# a[i] . b[j] for each index (i, j) of the sparse tensor (a[j] . b[i] with
# adjoint_a): the gradient of sparse_dense_matmul's values
library("sparse_sampled_products", _sampled_products_infer, _sampled_products,
        grad=_sampled_products_grad)


def _sparse_concat_dims(dense_shapes, axis):
    """The (rows, columns) of each part and of their concatenation along ``axis``."""
    dims = [(int(s[0]), int(s[1])) for s in dense_shapes]
    if any(d[1 - axis] != dims[0][1 - axis] for d in dims):
        raise ValueError(f"concatenate: sparse tensors of dense shapes {dims} differ outside "
                         f"axis {axis}")
    joint = list(dims[0])
    joint[axis] = sum(d[axis] for d in dims)
    return dims, np.array(joint, dtype=np.int64)


def _sparse_concat_indices(*parts, axis):
    """The indices of the concatenation of the sparse tensors with indices
    ``parts[0::2]`` and dense shapes ``parts[1::2]``."""
    dims, _ = _sparse_concat_dims(parts[1::2], axis)
    moved, offset = [], 0
    for indices, d in zip(parts[0::2], dims):
        shifted = np.array(indices, dtype=np.int64)
        shifted[:, axis] += offset
        moved.append(shifted)
        offset += d[axis]
    return np.concatenate(moved, axis=0)


library("sparse_concat_indices", lambda inputs, attrs: ((None, 2), "int64"),
        _sparse_concat_indices)
library("sparse_concat_shape", lambda inputs, attrs: ((2,), "int64"),
        lambda *dense_shapes, axis: _sparse_concat_dims(dense_shapes, axis)[1])


def _matmul_infer(inputs, attrs):
    x, y = inputs
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError(f"matmul: operands must have rank >= 2, got {format_shape(x.shape)} "
                         f"and {format_shape(y.shape)}")
    if x.shape[-1] is not None and y.shape[-2] is not None and x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: cannot contract shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)}")
    batch = broadcast_shapes("matmul", x.shape[:-2], y.shape[:-2])
    return batch + (x.shape[-2], y.shape[-1]), _promote(inputs)


def _swap_last(t):
    axes = tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2)
    return apply("transpose", t, axes=axes)


def _matmul(x, y):
    # the shapes known only at run time are checked here, as at construction
    batch = [(a, b) for a, b in zip(x.shape[-3::-1], y.shape[-3::-1]) if a != b and 1 not in (a, b)]
    if x.shape[-1] != y.shape[-2] or batch:
        raise ValueError(f"matmul: cannot multiply shapes {format_shape(x.shape)} and "
                         f"{format_shape(y.shape)}")
    return np.matmul(x, y)


library("matmul", _matmul_infer, _matmul,
        grad=lambda g, n: [apply("sum_to", apply("matmul", g, _swap_last(n.inputs[1])), n.inputs[0]),
                           apply("sum_to", apply("matmul", _swap_last(n.inputs[0]), g), n.inputs[1])])


def _transpose_infer(inputs, attrs):
    (x,) = inputs
    axes = tuple(int(a) for a in attrs["axes"])
    if sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)) or len(axes) != x.ndim:
        raise ValueError(f"permute_dimensions: pattern {axes} is not a permutation of the axes "
                         f"of a tensor of shape {format_shape(x.shape)}")
    axes = tuple(a % x.ndim for a in axes)
    attrs["axes"] = axes
    return tuple(x.shape[a] for a in axes), x.dtype


library("transpose", _transpose_infer, lambda x, axes: contiguous(np.transpose(x, axes)),
        grad=lambda g, n: [apply("transpose", g, axes=tuple(np.argsort(n.attrs["axes"])))])


def _reshape_infer(inputs, attrs):
    (x,) = inputs
    shape = tuple(int(d) for d in attrs["shape"])
    if sum(1 for d in shape if d == -1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: bad target shape {shape} (at most one -1, no other negatives)")
    known = [d for d in x.shape]
    total = None if any(d is None for d in known) else int(np.prod(known, dtype=np.int64))
    target = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    if -1 in shape:
        if total is not None and (target == 0 or total % target):
            raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} into {shape}")
        fill = total // target if total is not None and target else None
        out = tuple(fill if d == -1 else d for d in shape)
    else:
        if total is not None and total != target:
            raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} "
                             f"({total} elements) into {shape} ({target} elements)")
        out = shape
    attrs["shape"] = shape
    return out, x.dtype


library("reshape", _reshape_infer, lambda x, shape: x.reshape(shape),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0])])
library("reshape_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda x, like: x.reshape(like.shape),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0]), None])


def _expand_dims_infer(inputs, attrs):
    (x,) = inputs
    axes = tuple(int(a) for a in attrs["axes"])
    ndim = x.ndim + len(axes)
    if sorted(set(axes)) != list(axes) or any(not 0 <= a < ndim for a in axes):
        raise ValueError(f"expand_dims: axes {axes} must be increasing and within the "
                         f"{ndim} axes of the result for a tensor of shape {format_shape(x.shape)}")
    attrs["axes"] = axes
    rest = iter(x.shape)
    return tuple(1 if a in axes else next(rest) for a in range(ndim)), x.dtype


# x with axes of length 1 inserted at ``axes`` (positions in the result, sorted):
# a view whatever x's run-time shape
library("expand_dims", _expand_dims_infer, lambda x, axes: np.expand_dims(x, axes),
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0])])


def sum_to_shape(g, shape):
    """Sum a broadcast gradient back to ``shape`` (NumPy broadcasting undone)."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and g.shape[lead + i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


library("sum_to", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda g, like: sum_to_shape(g, like.shape),
        grad=lambda g, n: [apply("broadcast_like", g, n.inputs[0]), None])


def _axes_size_infer(inputs, attrs):
    return (), attrs["dtype"]


library("axes_size", _axes_size_infer,
        lambda x, axis, dtype: np.asarray(math.prod(x.shape[a] for a in axis), dtype=dtype),
        grad=not_differentiable)


def _concat_infer(inputs, attrs):
    if not inputs:
        raise ValueError("concatenate: no tensors given")
    ndim = inputs[0].ndim
    if any(t.ndim != ndim for t in inputs):
        raise ValueError("concatenate: tensors of different ranks: "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    if ndim == 0:
        raise ValueError("concatenate: cannot concatenate scalars")
    axis = normalize_axis("concatenate", attrs.get("axis", -1), ndim)
    attrs["axis"] = axis
    shape = []
    for i in range(ndim):
        dims = [t.shape[i] for t in inputs]
        if i == axis:
            shape.append(None if None in dims else sum(dims))
        else:
            known = {d for d in dims if d is not None}
            if len(known) > 1:
                raise ValueError(f"concatenate: shapes differ outside axis {axis}: "
                                 + ", ".join(format_shape(t.shape) for t in inputs))
            shape.append(known.pop() if known else None)
    return tuple(shape), _promote(inputs)


def _concat_grad(g, n):
    axis = n.attrs["axis"]
    grads, start = [], 0
    for t in n.inputs:
        grads.append(apply("slice_axis_like", g, t, axis=axis, start=start))
        size = t.shape[axis]
        if size is None:
            grads = [apply("split_part", g, *n.inputs, axis=axis, index=i) for i in range(len(n.inputs))]
            return grads
        start += size
    return grads


library("concatenate", _concat_infer, lambda *xs, axis: np.concatenate(xs, axis=axis),
        grad=_concat_grad)
library("slice_axis_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype),
        lambda g, like, axis, start: contiguous(
            np.take(g, np.arange(start, start + like.shape[axis]), axis=axis)))


def _split_part(g, *parts, axis, index):
    start = sum(p.shape[axis] for p in parts[:index])
    return contiguous(np.take(g, np.arange(start, start + parts[index].shape[axis]), axis=axis))


library("split_part", lambda inputs, attrs: (inputs[1 + attrs["index"]].shape, inputs[0].dtype),
        _split_part)


def _stack_infer(inputs, attrs):
    if not inputs:
        raise ValueError("stack: no tensors given")
    if any(t.ndim != inputs[0].ndim for t in inputs):
        raise ValueError("stack: tensors of different ranks: "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    shape = []
    for dims in zip(*[t.shape for t in inputs]):
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise ValueError("stack: tensors of different shapes: "
                             + ", ".join(format_shape(t.shape) for t in inputs))
        shape.append(known.pop() if known else None)
    shape = tuple(shape)
    axis = normalize_axis("stack", attrs.get("axis", 0), len(shape) + 1)
    attrs["axis"] = axis
    return shape[:axis] + (len(inputs),) + shape[axis:], _promote(inputs)


library("stack", _stack_infer, lambda *xs, axis: np.stack(xs, axis=axis),
        grad=lambda g, n: [apply("take_index", g, axis=n.attrs["axis"], index=i)
                           for i in range(len(n.inputs))])
library("take_index",
        lambda inputs, attrs: (inputs[0].shape[:attrs["axis"]] + inputs[0].shape[attrs["axis"] + 1:],
                               inputs[0].dtype),
        lambda x, axis, index: contiguous(np.take(x, index, axis=axis)))


def _getitem_infer(inputs, attrs):
    (x,) = inputs
    key = attrs["key"]
    shape, axis = [], 0
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"getitem: too many indices ({n_real}) for a tensor of shape "
                         f"{format_shape(x.shape)}")
    for k in key:
        if k is None:
            shape.append(1)
        elif k is Ellipsis:
            take = x.ndim - n_real
            shape.extend(x.shape[axis:axis + take])
            axis += take
        elif isinstance(k, slice):
            d = x.shape[axis]
            shape.append(None if d is None else len(range(*k.indices(d))))
            axis += 1
        else:
            d = x.shape[axis]
            if d is not None and not -d <= k < d:
                raise IndexError(f"getitem: index {k} is out of range for axis {axis} of size {d}")
            axis += 1
    shape.extend(x.shape[axis:])
    return tuple(shape), x.dtype


def _getitem_grad(g, n):
    return [apply("scatter_like", g, n.inputs[0], key=n.attrs["key"])]


def _scatter_like(g, like, key):
    out = np.zeros(like.shape, dtype=g.dtype)
    out[key] = g
    return out


library("getitem", _getitem_infer, lambda x, key: contiguous(x[key]),
        grad=_getitem_grad)
library("scatter_like", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _scatter_like,
        grad=lambda g, n: [apply("getitem", g, key=n.attrs["key"]), None])


def last_axis_window(key, shape):
    """(start, stop) when ``key`` slices only the last axis of an array of static
    ``shape`` (step 1, static bounds, nothing else indexed), else None."""
    if not key or not shape or shape[-1] is None:
        return None
    *lead, last = key
    if not isinstance(last, slice) or any(k is not Ellipsis and k != slice(None) for k in lead):
        return None
    if Ellipsis not in lead and len(key) != len(shape):
        return None
    start, stop, step = last.indices(shape[-1])
    return (start, stop) if step == 1 and start < stop else None


def getitem(x, key):
    """x[key] for ints, slices, None, Ellipsis; a tensor or int array index gathers on axis 0."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(isinstance(k, (Tensor, list, np.ndarray)) for k in key):
        if len(key) == 1:
            return apply("gather", x, key[0])
        raise IndexError("getitem: a tensor index is only supported alone, on the first axis")
    clean = []
    for k in key:
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            clean.append(int(k))
        elif isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and not isinstance(part, (int, np.integer)):
                    raise TypeError(f"getitem: slice bounds must be ints, got {k}")
            if k.step == 0:
                raise ValueError("getitem: slice step cannot be zero")
            clean.append(slice(k.start, k.stop, k.step))
        elif k is None or k is Ellipsis:
            clean.append(k)
        else:
            raise TypeError(f"getitem: unsupported index {k!r}")
    if sum(1 for k in clean if k is Ellipsis) > 1:
        raise IndexError("getitem: at most one Ellipsis")
    return apply("getitem", x, key=tuple(clean))


def _gather_infer(inputs, attrs):
    ref, idx = inputs
    if ref.ndim == 0:
        raise ValueError("gather: reference must have rank >= 1")
    if np.dtype(idx.dtype).kind not in "iu":
        raise TypeError(f"gather: indices must be integers, got dtype {idx.dtype}")
    return idx.shape + ref.shape[1:], ref.dtype


def _gather(ref, idx):
    if idx.size and (idx.min() < -ref.shape[0] or idx.max() >= ref.shape[0]):
        raise IndexError(f"gather: index out of range for reference of shape {ref.shape}")
    return np.take(ref, idx, axis=0)


def _scatter_add(g, ref, idx):
    out = np.zeros(ref.shape, dtype=g.dtype)
    np.add.at(out, idx.reshape(-1), g.reshape((-1,) + ref.shape[1:]))
    return out


library("gather", _gather_infer, _gather,
        grad=lambda g, n: [apply("scatter_add", g, n.inputs[0], n.inputs[1]), None])
library("scatter_add", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _scatter_add)


def _arg_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        axis = normalize_axis(name, attrs.get("axis", -1), x.ndim)
        attrs["axis"] = axis
        return x.shape[:axis] + x.shape[axis + 1:], "int64"
    return infer


library("argmax", _arg_infer("argmax"), lambda x, axis: np.argmax(x, axis=axis),
        grad=not_differentiable)
library("argmin", _arg_infer("argmin"), lambda x, axis: np.argmin(x, axis=axis),
        grad=not_differentiable)


def _cum_infer(name):
    def infer(inputs, attrs):
        (x,) = inputs
        attrs["axis"] = normalize_axis(name, attrs.get("axis", 0), x.ndim)
        return x.shape, _sum_dtype(x.dtype)
    return infer


def _cumsum_grad(g, n):
    axis = n.attrs["axis"]
    rev = apply("reverse", g, axes=(axis,))
    return [apply("reverse", apply("cumsum", rev, axis=axis), axes=(axis,))]


library("cumsum", _cum_infer("cumsum"), lambda x, axis: np.cumsum(x, axis=axis), grad=_cumsum_grad)


def _cumprod_grad(g, n):
    # TensorFlow's rule: the reversed cumulative sum of g * y, divided by x (so
    # not finite where x has a zero, as in TensorFlow)
    (x,) = n.inputs
    return [apply("divide", _cumsum_grad(apply("multiply", g, n), n)[0], x)]


library("cumprod", _cum_infer("cumprod"), lambda x, axis: np.cumprod(x, axis=axis),
        grad=_cumprod_grad)


def _reverse_infer(inputs, attrs):
    (x,) = inputs
    attrs["axes"] = normalize_axes("reverse", attrs["axes"], x.ndim)
    return x.shape, x.dtype


library("reverse", _reverse_infer, lambda x, axes: contiguous(np.flip(x, axes)),
        grad=lambda g, n: [apply("reverse", g, axes=n.attrs["axes"])])


def _tile_infer(inputs, attrs):
    (x,) = inputs
    reps = tuple(int(r) for r in attrs["reps"])
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ValueError(f"tile: need one non-negative repeat count per axis of "
                         f"{format_shape(x.shape)}, got {reps}")
    attrs["reps"] = reps
    return tuple(None if d is None else d * r for d, r in zip(x.shape, reps)), x.dtype


def _tile_grad(g, n):
    x = n.inputs[0]
    return [apply("untile", g, x, reps=n.attrs["reps"])]


def _untile(g, x, reps):
    shape = []
    for r, d in zip(reps, x.shape):
        shape += [r, d]
    return g.reshape(shape).sum(axis=tuple(range(0, 2 * len(reps), 2)))


library("tile", _tile_infer, lambda x, reps: np.tile(x, reps), grad=_tile_grad)
library("untile", lambda inputs, attrs: (inputs[1].shape, inputs[0].dtype), _untile)


def _repeat_infer(inputs, attrs):
    (x,) = inputs
    axis = normalize_axis("repeat_elements", attrs["axis"], x.ndim)
    attrs["axis"] = axis
    rep = int(attrs["repeats"])
    if rep < 0:
        raise ValueError(f"repeat_elements: rep must be >= 0, got {rep}")
    d = x.shape[axis]
    return x.shape[:axis] + (None if d is None else d * rep,) + x.shape[axis + 1:], x.dtype


def _repeat_grad(g, n):
    axis, rep = n.attrs["axis"], n.attrs["repeats"]
    return [apply("unrepeat", g, axis=axis, repeats=rep)]


def _unrepeat(g, axis, repeats):
    shape = g.shape[:axis] + (g.shape[axis] // repeats, repeats) + g.shape[axis + 1:]
    return g.reshape(shape).sum(axis=axis + 1)


def _unrepeat_infer(inputs, attrs):
    (g,) = inputs
    axis = attrs["axis"]
    d = g.shape[axis]
    return g.shape[:axis] + (None if d is None else d // attrs["repeats"],) + g.shape[axis + 1:], g.dtype


library("repeat_elements", _repeat_infer, lambda x, axis, repeats: np.repeat(x, repeats, axis=axis),
        grad=_repeat_grad)
library("unrepeat", _unrepeat_infer, _unrepeat)


def _pad_infer(inputs, attrs):
    (x,) = inputs
    pads = tuple((int(a), int(b)) for a, b in attrs["pads"])
    if len(pads) != x.ndim or any(a < 0 or b < 0 for a, b in pads):
        raise ValueError(f"pad: need a non-negative (before, after) pair per axis of "
                         f"{format_shape(x.shape)}, got {pads}")
    attrs["pads"] = pads
    return tuple(None if d is None else d + a + b for d, (a, b) in zip(x.shape, pads)), x.dtype


def _unpad(g, pads):
    return contiguous(g[tuple(slice(a, g.shape[i] - b) for i, (a, b) in enumerate(pads))])


library("pad", _pad_infer, lambda x, pads: np.pad(x, pads),
        grad=lambda g, n: [apply("unpad", g, pads=n.attrs["pads"])])
library("unpad", lambda inputs, attrs: (
    tuple(None if d is None else d - a - b for d, (a, b) in zip(inputs[0].shape, attrs["pads"])),
    inputs[0].dtype), _unpad)


def _shape_infer(inputs, attrs):
    return (inputs[0].ndim,), "int32"


library("shape", _shape_infer, lambda x: np.asarray(x.shape, dtype=np.int32),
        grad=not_differentiable)


def dim_read_at_run_time(t):
    """(x, axis) where the scalar tensor ``t`` is ``shape(x)[axis]``, else None."""
    if t.op == "getitem" and t.inputs[0].op == "shape":
        key = t.attrs["key"]
        if len(key) == 1 and isinstance(key[0], int):
            x = t.inputs[0].inputs[0]
            return x, key[0] % x.ndim
    return None


def static_int(t):
    """The value of the scalar int tensor ``t`` where the graph tells it (a
    constant, or ``shape(x)[i]`` of a dim that x's static shape knows), else None."""
    if t.op == "constant":
        return int(t.value)
    read = dim_read_at_run_time(t)
    return None if read is None else read[0].shape[read[1]]


def _static_target(shape):
    """The entries of a 1-D int shape tensor known when the graph is built, None
    for the others, as TensorFlow's reshape reads them: constants, static dims
    read through ``shape(x)``, and stacks, slices and concatenations of those.
    A -1 (inferred at run time) is None."""
    if shape.op == "concatenate" and all(part.ndim == 1 for part in shape.inputs):
        return [d for part in shape.inputs for d in _static_target(part)]
    if shape.op == "constant":
        known = [int(d) for d in shape.value]
    elif shape.op == "shape":
        known = list(shape.inputs[0].shape)
    elif (shape.op == "getitem" and shape.inputs[0].op == "shape" and len(shape.attrs["key"]) == 1
          and isinstance(shape.attrs["key"][0], slice)):
        known = list(shape.inputs[0].inputs[0].shape[shape.attrs["key"][0]])
    elif shape.op == "stack" and all(e.ndim == 0 for e in shape.inputs):
        known = [static_int(e) for e in shape.inputs]
    else:
        known = [None] * shape.shape[0]
    return [d if d is not None and d >= 0 else None for d in known]


def _reshape_dynamic_infer(inputs, attrs):
    """``known`` (optional): target dims known when the graph is built, None
    elsewhere; those the target tensor itself tells are added (_static_target)."""
    x, shape = inputs
    if shape.ndim != 1 or shape.shape[0] is None:
        raise ValueError("reshape: a symbolic target shape must be a 1-D tensor of known length, "
                         f"got shape {format_shape(shape.shape)}")
    if np.dtype(shape.dtype).kind not in "iu":
        raise TypeError(f"reshape: a symbolic target shape must be of an int type, got {shape.dtype}")
    given = tuple(attrs.get("known") or (None,) * shape.shape[0])
    if len(given) != shape.shape[0]:
        raise ValueError(f"reshape: {len(given)} known dims given for a target shape of "
                         f"length {shape.shape[0]}")
    known = tuple(g if g is not None else k for g, k in zip(given, _static_target(shape)))
    if None not in known and None not in x.shape and math.prod(known) != math.prod(x.shape):
        raise ValueError(f"reshape: cannot reshape {format_shape(x.shape)} into {known}")
    attrs["known"] = known
    return known, x.dtype


def _reshape_dynamic(x, shape, known):
    """x reshaped to the run-time ``shape``, checked as TensorFlow does (NumPy
    takes any negative entry for -1); ``known``: the static shape it must have."""
    target = tuple(int(d) for d in shape)
    rest = math.prod(d for d in target if d != -1)
    inferred = target.count(-1)
    if (inferred > 1 or any(d < -1 for d in target)
            or (inferred == 0 and rest != x.size) or (inferred == 1 and (rest == 0 or x.size % rest))):
        raise ValueError(f"reshape: cannot reshape a tensor of shape {format_shape(x.shape)} "
                         f"into {target}")
    out = x.reshape(target)
    if any(k is not None and k != d for k, d in zip(known, out.shape)):
        raise ValueError(f"reshape: the target shape {target} differs from the static shape "
                         f"{format_shape(known)} of the result")
    return out


library("reshape_dynamic", _reshape_dynamic_infer, _reshape_dynamic,
        grad=lambda g, n: [apply("reshape_like", g, n.inputs[0]), None])


def _arange_infer(inputs, attrs):
    """inputs: scalar start, stop, step; the length is known when all three are constants."""
    if any(t.ndim != 0 for t in inputs):
        raise ValueError("arange: start, stop and step must be scalars, got shapes "
                         + ", ".join(format_shape(t.shape) for t in inputs))
    if all(isinstance(t, Constant) for t in inputs):
        start, stop, step = (t.value.item() for t in inputs)
        if step == 0:
            raise ValueError("arange: step must not be zero")
        return (len(np.arange(start, stop, step)),), attrs["dtype"]
    return (None,), attrs["dtype"]


library("arange", _arange_infer,
        lambda start, stop, step, dtype: np.arange(start, stop, step).astype(dtype),
        grad=not_differentiable)


def _random_infer(inputs, attrs):
    return tuple(attrs["shape"]), attrs["dtype"]


def _random(kind):
    def draw(rng, shape, dtype, **params):
        if kind == "normal":
            out = rng.standard_normal(shape) * params["stddev"] + params["mean"]
        elif kind == "truncated_normal":
            out = rng.standard_normal(shape)
            bad = np.abs(out) > 2
            while bad.any():  # redraw beyond two standard deviations, as TensorFlow does
                out[bad] = rng.standard_normal(int(bad.sum()))
                bad = np.abs(out) > 2
            out = out * params["stddev"] + params["mean"]
        elif kind == "uniform":
            out = rng.uniform(params["minval"], params["maxval"], shape)
        elif kind == "binomial":
            out = (rng.uniform(0.0, 1.0, shape) < params["p"])
        else:
            raise AssertionError(kind)
        return np.asarray(out, dtype=dtype)
    return draw


for _kind in ("normal", "truncated_normal", "uniform", "binomial"):
    library("random_" + _kind, _random_infer, _random(_kind), stateful=True,
            grad=not_differentiable)


def _print_impl(x, message):
    print(message, x)
    return x


library("print_tensor", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype), _print_impl,
        grad=lambda g, n: [g])
library("identity", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        lambda x: np.array(x), grad=lambda g, n: [g])
library("stop_gradient", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        lambda x: x, grad=lambda g, n: [None])



def _update_outside_a_function(variable, new_value):
    raise NotImplementedError("update: an update (K.update, K.update_add, ...) is applied only as an "
                              "output or an update of K.function or by K.eval, not inside a loop "
                              "such as K.rnn's step function")


# graph.Update: K.function and K.eval replace it by its new value before planning
# (compiler.lift_updates), so this runs only where none did.  Not differentiable,
# as TensorFlow's assign ops are not.
library("update", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        _update_outside_a_function, grad=not_differentiable)

def _in_top_k_infer(inputs, attrs):
    pred, targets = inputs
    if pred.ndim != 2 or targets.ndim != 1:
        raise ValueError(f"in_top_k: predictions must be (batch, classes) and targets (batch,), got "
                         f"{format_shape(pred.shape)} and {format_shape(targets.shape)}")
    if np.dtype(targets.dtype).kind not in "iu":
        raise TypeError(f"in_top_k: targets must be integers (class indices), got {targets.dtype}")
    if None not in (pred.shape[0], targets.shape[0]) and pred.shape[0] != targets.shape[0]:
        raise ValueError(f"in_top_k: predictions {format_shape(pred.shape)} and targets "
                         f"{format_shape(targets.shape)} have different batch sizes")
    return (pred.shape[0],), "bool"


def _in_top_k(pred, targets, k):
    """TensorFlow's in_top_k: a target is in the top k when fewer than k classes
    score strictly higher, so ties at the k-th largest value are all in; a row
    with any non-finite prediction is False (TensorFlow cannot say)."""
    if pred.shape[0] != targets.shape[0]:
        raise ValueError(f"in_top_k: {pred.shape[0]} rows of predictions but {targets.shape[0]} targets")
    out_of_range = (targets < 0) | (targets >= pred.shape[1])
    if out_of_range.any():
        b = int(np.flatnonzero(out_of_range)[0])
        raise ValueError(f"in_top_k: targets[{b}] = {targets[b]} is out of range for "
                         f"{pred.shape[1]} classes")
    target_scores = pred[np.arange(pred.shape[0]), targets]
    higher = (pred > target_scores[:, None]).sum(axis=1)
    return (higher < k) & np.isfinite(pred).all(axis=1)


library("in_top_k", _in_top_k_infer, _in_top_k, grad=not_differentiable)


def _random_shaped_infer(inputs, attrs):
    (dims,) = inputs
    static = tuple(attrs["shape"])
    if dims.ndim != 1 or np.dtype(dims.dtype).kind not in "iu" or dims.shape[0] not in (None, len(static)):
        raise ValueError(f"random: a symbolic shape must be a 1-D integer tensor of length {len(static)}, "
                         f"got shape {format_shape(dims.shape)} and dtype {dims.dtype}")
    return static, attrs["dtype"]


# A random draw whose shape is a runtime 1-D int tensor (attrs: kind, the static shape with
# None where unknown, dtype, rng and the kind's parameters).
library("random_shaped", _random_shaped_infer,
        lambda dims, kind, shape, rng, dtype, **params: _random(kind)(
            rng, tuple(int(d) for d in dims), dtype, **params),
        grad=lambda g, n: [None], stateful=True)


# ---------------------------------------------------------------------------
# CTC (jit_kernels.ctc; imported when first run, so that importing numbackend
# does not import Numba).  Logits are (batch, time, classes), blank last.
# The decoders' results have data-dependent widths: one "ctc_decode" node runs
# the decoder once and packs its outputs into one float64 array, which the
# "ctc_decoded_path" and "ctc_decoded_log_prob" nodes unpack.


def _ctc_kernels():
    from jit_kernels import ctc
    return ctc


def _ctc_check(where, logits, lengths=(), labels=None):
    if logits.ndim != 3 or np.dtype(logits.dtype).kind != "f":
        raise ValueError(f"{where}: predictions must be a float tensor (samples, time, classes), "
                         f"got shape {format_shape(logits.shape)} and dtype {logits.dtype}")
    if labels is not None and labels.ndim != 2:
        raise ValueError(f"{where}: labels must be (samples, max_label_length), got shape "
                         f"{format_shape(labels.shape)}")
    for t in lengths:
        if t.ndim not in (1, 2) or (t.ndim == 2 and t.shape[1] not in (None, 1)):
            raise ValueError(f"{where}: lengths must be (samples,) or (samples, 1), got shape "
                             f"{format_shape(t.shape)}")


def _ctc_loss_infer(inputs, attrs):
    logits, labels, label_lengths, input_lengths = inputs
    _ctc_check("ctc_batch_cost", logits, (label_lengths, input_lengths), labels)
    return (logits.shape[0], 1), logits.dtype


def _ctc_loss(logits, labels, label_lengths, input_lengths):
    loss, _ = _ctc_kernels().ctc_loss_and_grad(logits, labels, label_lengths, input_lengths,
                                               compute_grad=False, where="ctc_batch_cost")
    return loss.reshape(-1, 1)


def _ctc_loss_and_grad(logits, labels, label_lengths, input_lengths):
    loss, grad = _ctc_kernels().ctc_loss_and_grad(logits, labels, label_lengths, input_lengths,
                                                  where="ctc_batch_cost")
    return loss.reshape(-1, 1).astype(logits.dtype), grad.astype(logits.dtype, copy=False)


def _ctc_loss_grad(g, n):
    """d loss / d logits from the kernel, times the incoming (batch, 1) gradient;
    the labels and lengths get none."""
    both = apply("ctc_loss_and_grad", *n.inputs)
    grad = apply("tuple_item", both, index=1, shape=n.inputs[0].shape, dtype=n.dtype)
    return [apply("multiply", grad, apply("reshape", g, shape=(-1, 1, 1))), None, None, None]


# One pass of the lattice gives the loss and its gradient; where a graph has both,
# the loss is read from that pass (rewrite's computed_by) instead of a second one.
library("ctc_loss", _ctc_loss_infer, _ctc_loss, grad=_ctc_loss_grad,
        computed_by=("ctc_loss_and_grad", 0))
library("ctc_loss_and_grad", _ctc_loss_infer, _ctc_loss_and_grad, multi_output=True)


def _ctc_decode_infer(inputs, attrs):
    logits, input_lengths = inputs
    _ctc_check("ctc_decode", logits, (input_lengths,))
    if attrs["mode"] not in ("greedy", "beam", "dictionary"):
        raise ValueError(f"ctc_decode: unknown mode {attrs['mode']!r}")
    return (logits.shape[0], attrs["top_paths"], None), "float64"


def _ctc_decode(logits, input_lengths, mode, top_paths, beam_width=None, merge_repeated=False,
                dict_seq_lens=None, dict_values=None):
    """(batch, top_paths, 1 + longest) float64: [..., 0] the log-probability of
    each decoding, [..., 1:] its labels padded with -1."""
    ctc = _ctc_kernels()
    if mode == "greedy":
        path, log_prob = ctc.ctc_greedy_decode(logits, input_lengths)
        paths = [path]
    elif mode == "beam":
        paths, log_prob = ctc.ctc_beam_search_decode(logits, input_lengths, beam_width, top_paths,
                                                     merge_repeated=merge_repeated,
                                                     where="ctc_decode")
    else:
        paths, log_prob = ctc.ctc_dictionary_decode(logits, input_lengths, dict_seq_lens,
                                                    dict_values, beam_width, top_paths)
    longest = max(p.shape[1] for p in paths)
    packed = np.full((logits.shape[0], top_paths, 1 + longest), -1.0)
    packed[:, :, 0] = log_prob
    for k, p in enumerate(paths):
        packed[:, k, 1:1 + p.shape[1]] = p
    return packed


def _ctc_decoded_path(packed, index):
    labels = packed[:, index, 1:]
    used = int((labels >= 0).any(axis=0).nonzero()[0].max(initial=-1)) + 1
    return labels[:, :used].astype(np.int64)


library("ctc_decode", _ctc_decode_infer, _ctc_decode, grad=not_differentiable)
library("ctc_decoded_path", lambda inputs, attrs: ((inputs[0].shape[0], None), "int64"),
        _ctc_decoded_path, grad=not_differentiable)
library("ctc_decoded_log_prob",
        lambda inputs, attrs: (inputs[0].shape[:2], attrs["dtype"]),
        lambda packed, dtype: packed[:, :, 0].astype(dtype), grad=not_differentiable)


def _ctc_sparse_infer(inputs, attrs):
    labels, label_lengths = inputs
    if labels.ndim != 2 or label_lengths.ndim not in (1, 2):
        raise ValueError(f"ctc_label_dense_to_sparse: labels must be (samples, max_label_length) "
                         f"and label_lengths (samples,), got shapes {format_shape(labels.shape)} "
                         f"and {format_shape(label_lengths.shape)}")
    return {"indices": ((None, 2), "int64"), "values": ((None,), labels.dtype),
            "dense_shape": ((2,), "int64")}[attrs["part"]]


def _ctc_sparse(labels, label_lengths, part):
    indices, values, dense_shape = _ctc_kernels().ctc_label_dense_to_sparse(labels, label_lengths)
    return {"indices": indices, "values": values, "dense_shape": dense_shape}[part]


library("ctc_dense_to_sparse", _ctc_sparse_infer, _ctc_sparse)


# ---------------------------------------------------------------------------
# Convolution, pooling and resizing: channels_last library ops on the
# jit_kernels conv/pool/resize kernels, imported when first run so that
# ``import numbackend`` does not import Numba.  Shapes are (N, *spatial, C);
# conv kernels (*k, C, OC), depthwise kernels (*k, C, M), conv_transpose is
# conv_backward_input with an explicit output shape.

_CONV_PADDINGS = ("valid", "same", "causal")


def _spatial_tuple(where, what, value, rank):
    if isinstance(value, (int, np.integer)):
        value = (int(value),) * rank
    value = tuple(int(v) for v in value)
    if len(value) != rank or min(value, default=1) < 1:
        raise ValueError(f"{where}: {what} must be {rank} positive integer(s), got {value}")
    return value


def _window_out(where, size, kernel, stride, dilation, padding, x_shape):
    """Output size of one spatial axis (None when ``size`` is unknown), as TensorFlow."""
    if size is None:
        return None
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        out = -(-size // stride)
    elif padding == "causal":
        out = (size - 1) // stride + 1
    else:
        out = (size - span) // stride + 1
    if out < 1:
        raise ValueError(f"{where}: a window of {kernel} (dilation {dilation}) does not fit "
                         f"the input of shape {format_shape(x_shape)} with {padding!r} padding")
    return out


def _window_attrs(where, attrs, rank, paddings=_CONV_PADDINGS):
    if attrs.get("padding") not in paddings:
        raise ValueError(f"{where}: padding must be one of {paddings}, got {attrs.get('padding')!r}")
    attrs["strides"] = _spatial_tuple(where, "strides", attrs.get("strides", 1), rank)
    attrs["dilation"] = _spatial_tuple(where, "dilation", attrs.get("dilation", 1), rank)
    if max(attrs["strides"]) > 1 and max(attrs["dilation"]) > 1:
        raise ValueError(f"{where}: strides {attrs['strides']} and dilation {attrs['dilation']} "
                         f"cannot both exceed 1")


def _sweep_shape(where, x, kernel, attrs):
    return tuple(_window_out(where, s, k, st, d, attrs["padding"], x.shape)
                 for s, k, st, d in zip(x.shape[1:-1], kernel, attrs["strides"], attrs["dilation"]))


def _check_kernel(where, x, w, depthwise=False):
    what = "depthwise kernel" if depthwise else "kernel"
    rank = w.ndim - 2
    if not 1 <= rank <= 3 or x.ndim != w.ndim:
        raise ValueError(f"{where}: input of shape {format_shape(x.shape)} and {what} of shape "
                         f"{format_shape(w.shape)} do not match: expected (batch, *spatial, "
                         f"channels) and (*kernel_size, channels, ...) with 1 to 3 spatial axes")
    if any(d is None for d in w.shape):
        raise ValueError(f"{where}: the {what} shape must be fully known, got {format_shape(w.shape)}")
    if x.shape[-1] is not None and x.shape[-1] != w.shape[-2]:
        raise ValueError(f"{where}: input of shape {format_shape(x.shape)} has {x.shape[-1]} "
                         f"channels, the {what} of shape {format_shape(w.shape)} expects {w.shape[-2]}")
    return rank


def _window_of(n):
    return {k: n.attrs[k] for k in ("strides", "padding", "dilation")}


def _conv_dtype(inputs):
    return _float_of(_promote(inputs))


def _as_dtype(y, dtype):
    return y if y.dtype == dtype else y.astype(dtype)


def _runtime_shape(static, like_batch, shape=None):
    """A full shape from the static one, the runtime ``shape`` array when given,
    else the batch of ``like_batch`` where the static batch is None."""
    if shape is not None:
        return tuple(int(d) for d in shape)
    return (like_batch,) + tuple(static[1:])


def _shape_input(target, static):
    """The extra inputs a backward op needs for a shape: none when the static
    shape is known but for the batch, else the runtime shape of ``target``."""
    return [] if all(d is not None for d in static[1:]) else [apply("shape", target)]


def _out_shape_infer(where, inputs, attrs, channels_of):
    """Shape/dtype of a backward-input op: attrs ``x_shape`` with the runtime
    shape (an optional last input) where it has None."""
    dy, w = inputs[:2]
    x_shape = tuple(attrs["x_shape"])
    if len(x_shape) != dy.ndim:
        raise ValueError(f"{where}: output shape {x_shape} does not have the rank of the input "
                         f"{format_shape(dy.shape)}")
    if x_shape[0] is None:
        x_shape = (dy.shape[0],) + x_shape[1:]
    if x_shape[-1] is not None and x_shape[-1] != channels_of(w):
        raise ValueError(f"{where}: output shape {x_shape} has {x_shape[-1]} channels, the kernel "
                         f"of shape {format_shape(w.shape)} gives {channels_of(w)}")
    if len(inputs) == 2 and any(d is None for d in x_shape[1:]):
        raise ValueError(f"{where}: output shape {x_shape} is not known; pass it as a tensor")
    check_sweep(where, x_shape, dy.shape, w.shape[:-2], attrs)
    return x_shape, _conv_dtype(inputs[:2])


def check_sweep(where, x_shape, y_shape, kernel, attrs):
    """Raise unless sliding ``kernel`` over ``x_shape`` gives the spatial shape of
    ``y_shape`` (where both are known): the output shape of a transposed convolution."""
    swept = _sweep_shape(where, _Shaped(x_shape), kernel, attrs)
    if any(a is not None and b is not None and a != b for a, b in zip(swept, y_shape[1:-1])):
        raise ValueError(f"{where}: output shape {format_shape(x_shape)} does not match the input "
                         f"of shape {format_shape(y_shape)}: a convolution with kernel size "
                         f"{tuple(kernel)}, strides {attrs['strides']}, {attrs['padding']!r} "
                         f"padding and dilation {attrs['dilation']} of that shape gives spatial "
                         f"shape {swept}")


# conv: x (N, *s, C), w (*k, C, OC) -> (N, *out, OC); attrs strides, padding, dilation

def _conv_infer(inputs, attrs):
    x, w = inputs
    rank = _check_kernel("conv", x, w)
    _window_attrs("conv", attrs, rank)
    return (x.shape[0],) + _sweep_shape("conv", x, w.shape[:-2], attrs) + (w.shape[-1],), \
        _conv_dtype(inputs)


def _conv(x, w, strides, padding, dilation, epilogue=None, pool=None, pool_first=False):
    from jit_kernels import conv
    return conv.conv_forward(x, w, strides, padding, dilation, epilogue, pool, pool_first)


def _conv_grad(g, n):
    x, w = n.inputs
    a = _window_of(n)
    gx = apply("conv_backward_input", g, w, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    gw = apply("conv_backward_kernel", x, g, w_shape=w.shape, **a)
    return [gx, gw]


def _conv_backward_input_infer(inputs, attrs):
    dy, w = inputs[:2]
    _check_kernel("conv_backward_input", dy, _swap_io(w))
    _window_attrs("conv_backward_input", attrs, w.ndim - 2)
    return _out_shape_infer("conv_backward_input", inputs, attrs, lambda k: k.shape[-2])


class _Shaped:
    """A stand-in with only ``shape``/``ndim`` (for the kernel checks)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.ndim = len(self.shape)


def _swap_io(w):
    """w (*k, C, OC) seen from dy's side: (*k, OC, C)."""
    return _Shaped(w.shape[:-2] + (w.shape[-1], w.shape[-2]))


def _conv_backward_input(dy, w, *shape, x_shape, strides, padding, dilation):
    from jit_kernels import conv
    full = _runtime_shape(x_shape, dy.shape[0], shape[0] if shape else None)
    return conv.conv_backward_input(dy, w, full, strides, padding, dilation)


def _conv_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    a = _window_of(n)
    gdy = apply("conv", g, w, **a)
    gw = apply("conv_backward_kernel", g, dy, w_shape=w.shape, **a)
    return [gdy, gw] + [None] * (len(n.inputs) - 2)


def _conv_backward_kernel_infer(inputs, attrs):
    x = inputs[0]
    w_shape = tuple(attrs["w_shape"])
    rank = _check_kernel("conv_backward_kernel", x, _Shaped(w_shape))
    _window_attrs("conv_backward_kernel", attrs, rank)
    return w_shape, _conv_dtype(inputs)


def _conv_backward_kernel(x, dy, w_shape, strides, padding, dilation):
    from jit_kernels import conv
    return conv.conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)


def _conv_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = _window_of(n)
    gx = apply("conv_backward_input", dy, g, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    return [gx, apply("conv", x, g, **a)]


library("conv", _conv_infer, _conv, grad=_conv_grad, epilogue=True, pools=True)
library("conv_backward_input", _conv_backward_input_infer, _conv_backward_input,
        grad=_conv_backward_input_grad)
library("conv_backward_kernel", _conv_backward_kernel_infer, _conv_backward_kernel,
        grad=_conv_backward_kernel_grad)


# depthwise_conv: x (N, *s, C), w (*k, C, M) -> (N, *out, C*M)

def _depthwise_infer(inputs, attrs):
    x, w = inputs
    rank = _check_kernel("depthwise_conv", x, w, depthwise=True)
    _window_attrs("depthwise_conv", attrs, rank, ("valid", "same"))
    return (x.shape[0],) + _sweep_shape("depthwise_conv", x, w.shape[:-2], attrs) + \
        (w.shape[-2] * w.shape[-1],), _conv_dtype(inputs)


def _depthwise(x, w, strides, padding, dilation):
    from jit_kernels import conv
    return conv.depthwise_conv_forward(x, w, strides, padding, dilation)


def _depthwise_grad(g, n):
    x, w = n.inputs
    a = _window_of(n)
    gx = apply("depthwise_conv_backward_input", g, w, *_shape_input(x, x.shape), x_shape=x.shape, **a)
    gw = apply("depthwise_conv_backward_kernel", x, g, w_shape=w.shape, **a)
    return [gx, gw]


def _depthwise_backward_input_infer(inputs, attrs):
    dy, w = inputs[:2]
    if dy.ndim != w.ndim or (dy.shape[-1] is not None
                             and dy.shape[-1] != w.shape[-2] * w.shape[-1]):
        raise ValueError(f"depthwise_conv_backward_input: gradient {format_shape(dy.shape)} does "
                         f"not match the depthwise kernel {format_shape(w.shape)}")
    _window_attrs("depthwise_conv_backward_input", attrs, w.ndim - 2, ("valid", "same"))
    return _out_shape_infer("depthwise_conv_backward_input", inputs, attrs, lambda k: k.shape[-2])


def _depthwise_backward_input(dy, w, *shape, x_shape, strides, padding, dilation):
    from jit_kernels import conv
    full = _runtime_shape(x_shape, dy.shape[0], shape[0] if shape else None)
    return conv.depthwise_conv_backward_input(dy, w, full, strides, padding, dilation)


def _depthwise_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    a = _window_of(n)
    gdy = apply("depthwise_conv", g, w, **a)
    gw = apply("depthwise_conv_backward_kernel", g, dy, w_shape=w.shape, **a)
    return [gdy, gw] + [None] * (len(n.inputs) - 2)


def _depthwise_backward_kernel_infer(inputs, attrs):
    x = inputs[0]
    w_shape = tuple(attrs["w_shape"])
    rank = _check_kernel("depthwise_conv_backward_kernel", x, _Shaped(w_shape), depthwise=True)
    _window_attrs("depthwise_conv_backward_kernel", attrs, rank, ("valid", "same"))
    return w_shape, _conv_dtype(inputs)


def _depthwise_backward_kernel(x, dy, w_shape, strides, padding, dilation):
    from jit_kernels import conv
    return conv.depthwise_conv_backward_kernel(x, dy, w_shape, strides, padding, dilation)


def _depthwise_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = _window_of(n)
    gx = apply("depthwise_conv_backward_input", dy, g, *_shape_input(x, x.shape),
               x_shape=x.shape, **a)
    return [gx, apply("depthwise_conv", x, g, **a)]


library("depthwise_conv", _depthwise_infer, _depthwise, grad=_depthwise_grad)
library("depthwise_conv_backward_input", _depthwise_backward_input_infer,
        _depthwise_backward_input, grad=_depthwise_backward_input_grad)
library("depthwise_conv_backward_kernel", _depthwise_backward_kernel_infer,
        _depthwise_backward_kernel, grad=_depthwise_backward_kernel_grad)


# pool: x (N, *s, C); attrs pool_size, strides, padding, mode ('max' | 'avg')

def _pool_attrs(where, x, attrs):
    rank = x.ndim - 2
    if not 1 <= rank <= 3:
        raise ValueError(f"{where}: expected an input of shape (batch, *spatial, channels) with "
                         f"1 to 3 spatial axes, got {format_shape(x.shape)}")
    if attrs.get("mode") not in ("max", "avg"):
        raise ValueError(f"{where}: pool_mode must be 'max' or 'avg', got {attrs.get('mode')!r}")
    attrs["pool_size"] = _spatial_tuple(where, "pool_size", attrs["pool_size"], rank)
    _window_attrs(where, attrs, rank, ("valid", "same"))
    if max(attrs["dilation"]) > 1:
        raise ValueError(f"{where}: pooling has no dilation")


def _pool_infer(inputs, attrs):
    (x,) = inputs
    _pool_attrs("pool", x, attrs)
    return (x.shape[0],) + _sweep_shape("pool", x, attrs["pool_size"], attrs) + (x.shape[-1],), \
        _conv_dtype(inputs)


def _pool(x, pool_size, strides, padding, mode, dilation=None):
    from jit_kernels import pool
    forward = pool.max_pool_forward if mode == "max" else pool.avg_pool_forward
    return forward(x, pool_size, strides, padding)


def _pool_backward_infer(inputs, attrs):
    x = inputs[1]
    _pool_attrs("pool_backward", x, attrs)
    return x.shape, _conv_dtype(inputs)


def _pool_backward(dy, x, pool_size, strides, padding, mode, dilation=None):
    from jit_kernels import pool
    if mode == "max":
        return pool.max_pool_backward(dy, x, pool_size, strides, padding)
    return pool.avg_pool_backward(dy, x.shape, pool_size, strides, padding)


def _pool_backward_grad(g, n):
    """avg: the backward op is linear in dy, its adjoint is the pooling itself; max:
    zero w.r.t. x almost everywhere, and w.r.t. dy has no rule (yet)."""
    if n.attrs["mode"] != "avg":
        raise NotImplementedError("gradients: the second derivative of max pooling (pool2d / "
                                  "pool3d with pool_mode='max') is not implemented")
    return [apply("pool", g, **n.attrs), None]


library("pool", _pool_infer, _pool,
        grad=lambda g, n: [apply("pool_backward", g, n.inputs[0], **n.attrs)])
library("pool_backward", _pool_backward_infer, _pool_backward, grad=_pool_backward_grad)


# resize: x (N, *s, C) -> (N, *(s * factors), C); attrs factors, interpolation
# ('nearest': each element repeated; 'bilinear': TensorFlow's old resize_bilinear)

def _resize_infer(inputs, attrs):
    (x,) = inputs
    rank = x.ndim - 2
    if not 1 <= rank <= 3:
        raise ValueError(f"resize: expected an input of shape (batch, *spatial, channels) with "
                         f"1 to 3 spatial axes, got {format_shape(x.shape)}")
    attrs["factors"] = _spatial_tuple("resize", "factors", attrs["factors"], rank)
    if attrs.get("interpolation", "nearest") not in ("nearest", "bilinear"):
        raise ValueError(f"resize: interpolation must be 'nearest' or 'bilinear', "
                         f"got {attrs['interpolation']!r}")
    attrs["interpolation"] = attrs.get("interpolation", "nearest")
    spatial = tuple(None if s is None else s * f for s, f in zip(x.shape[1:-1], attrs["factors"]))
    return (x.shape[0],) + spatial + (x.shape[-1],), _conv_dtype(inputs)


def _resize(x, factors, interpolation):
    from jit_kernels import resize
    if interpolation == "nearest":
        return contiguous(resize.upsample_nearest_forward(x, factors))
    size = tuple(s * f for s, f in zip(x.shape[1:-1], factors))
    return resize.resize_bilinear_forward(x, size)


def _resize_backward(dy, x, factors, interpolation):
    from jit_kernels import resize
    if interpolation == "nearest":
        return resize.upsample_nearest_backward(dy, factors)
    return resize.resize_bilinear_backward(dy, x.shape)


library("resize", _resize_infer, _resize,
        grad=lambda g, n: [apply("resize_backward", g, n.inputs[0], **n.attrs)])
library("resize_backward", lambda inputs, attrs: (inputs[1].shape, _conv_dtype(inputs)),
        _resize_backward, grad=lambda g, n: [apply("resize", g, **n.attrs), None])


# local_conv: x (N, *s, C), w (P, taps*C, F) -> (N, *out, F), 'valid' windows with
# unshared weights; attrs kernel_size, strides, feature_order (the order of a patch's
# features in w: 'channels_last' (taps, C) or 'channels_first' (C, taps))

def _local_infer(inputs, attrs):
    x, w = inputs
    rank = x.ndim - 2
    if not 1 <= rank <= 3 or w.ndim != 3:
        raise ValueError(f"local_conv: expected an input (batch, *spatial, channels) and a kernel "
                         f"(positions, features, filters), got {format_shape(x.shape)} and "
                         f"{format_shape(w.shape)}")
    attrs["kernel_size"] = _spatial_tuple("local_conv", "kernel_size", attrs["kernel_size"], rank)
    attrs["strides"] = _spatial_tuple("local_conv", "strides", attrs["strides"], rank)
    if attrs.get("feature_order") not in ("channels_last", "channels_first"):
        raise ValueError("local_conv: feature_order must be 'channels_last' or 'channels_first'")
    if any(d is None for d in x.shape[1:]):
        raise ValueError(f"local_conv: the input shape but the batch must be known, got "
                         f"{format_shape(x.shape)}")
    out = tuple(_window_out("local_conv", s, k, st, 1, "valid", x.shape)
                for s, k, st in zip(x.shape[1:-1], attrs["kernel_size"], attrs["strides"]))
    want = (int(np.prod(out)), int(np.prod(attrs["kernel_size"])) * x.shape[-1])
    if tuple(w.shape[:2]) != want:
        raise ValueError(f"local_conv: kernel of shape {format_shape(w.shape)} does not match the "
                         f"input of shape {format_shape(x.shape)}: expected ({want[0]}, {want[1]}, "
                         f"filters)")
    return (x.shape[0],) + out + (w.shape[-1],), _conv_dtype(inputs)


def _local(x, w, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_forward(x, w, kernel_size, strides, feature_order)


def _local_backward_input(dy, w, x, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_backward_input(dy, w, x.shape, kernel_size, strides, feature_order)


def _local_backward_kernel(x, dy, kernel_size, strides, feature_order):
    from jit_kernels import conv
    return conv.local_conv_backward_kernel(x, dy, kernel_size, strides, feature_order)


def _local_grad(g, n):
    x, w = n.inputs
    return [apply("local_conv_backward_input", g, w, x, **n.attrs),
            apply("local_conv_backward_kernel", x, g, w_shape=w.shape, **n.attrs)]


library("local_conv", _local_infer, _local, grad=_local_grad)
def _local_backward_input_grad(g, n):
    dy, w = n.inputs[:2]
    return [apply("local_conv", g, w, **n.attrs),
            apply("local_conv_backward_kernel", g, dy, w_shape=w.shape, **n.attrs), None]


def _local_backward_kernel_grad(g, n):
    x, dy = n.inputs
    a = {k: v for k, v in n.attrs.items() if k != "w_shape"}
    return [apply("local_conv_backward_input", dy, g, x, **a), apply("local_conv", x, g, **a)]


library("local_conv_backward_input",
        lambda inputs, attrs: (inputs[2].shape, _conv_dtype(inputs[:2])), _local_backward_input,
        grad=_local_backward_input_grad)
library("local_conv_backward_kernel",
        lambda inputs, attrs: (tuple(attrs["w_shape"]), _conv_dtype(inputs)),
        lambda x, dy, w_shape, **a: _local_backward_kernel(x, dy, **a),
        grad=_local_backward_kernel_grad)


graph.install_operators(apply, getitem)
