"""Element-wise ops: each is one ``elementwise(...)`` entry, which is all the
code generator, autodiff and the NumPy evaluator need to fuse, differentiate
and run it."""
import numpy as np

from . import batch
from .registry import Op, apply, broadcast_shapes, float_dtype, promote_dtype, register


def elementwise(name, arity, template, impl, out="promote", grad=None, rising=()):
    """Define an element-wise op of ``arity`` operands.

    template: the scalar expression fused kernels inline (see Op.template);
    impl: its NumPy form on operands already cast to the compute dtype; out:
    the output dtype, 'promote' (NumPy promotion of the operands), 'float'
    (promotion, then integers and booleans become floatx), 'bool'
    (comparisons: operands are compared in their promoted type), 'cast' (the
    dtype attribute: operands are converted to it, so the template is the
    operand itself) or 'first' (the first operand's dtype); grad: see Op.grad;
    rising: see Op.rising.
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
        promoted = promote_dtype(inputs)
        if out == "float":
            return float_dtype(promoted)
        if out == "bool":
            return "bool"
        return promoted

    def compute_dtype(inputs, attrs):
        if out == "cast":
            return attrs["dtype"]
        if out == "first":
            return inputs[0].dtype
        promoted = promote_dtype(inputs)
        return float_dtype(promoted) if out == "float" else promoted

    return register(Op(name, "elementwise", infer, impl, template=template, grad=grad,
                       compute_dtype=compute_dtype, rising=rising, rows=batch.elementwise))


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
# faster this way than dividing each element).
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
# the code generator converts the operand to the compute dtype, the target (to
# bool as x != 0), as it converts any operand: the template is the operand itself
elementwise("cast", 1, "{0}", _np_cast, out="cast",
            grad=lambda g, n: [apply("cast", g, dtype=n.inputs[0].dtype)
                               if np.dtype(n.inputs[0].dtype).kind == "f"
                               and np.dtype(n.dtype).kind == "f" else None])
