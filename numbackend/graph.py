"""The lazy graph: tensors are nodes that record an op, its inputs and attributes,
and carry a static shape (None where unknown) and a dtype inferred at construction.

Leaves are placeholders (fed at call time), variables (hold a NumPy value) and
constants.  Every other node is made by ``ops.apply``, which checks the call
and infers the shape and dtype on the spot.
"""
import itertools

import numpy as np

_ids = itertools.count()

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool")


def canonical_dtype(dtype, where="dtype"):
    """The dtype as one of the names in DTYPES; raises for anything else."""
    if dtype is None:
        raise TypeError(f"{where}: dtype is None")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"{where}: unknown dtype {dtype!r}") from None
    if name not in DTYPES:
        raise TypeError(f"{where}: unsupported dtype {name!r}; expected one of {DTYPES}")
    return name


def _new_node(cls):
    """An empty node of class ``cls`` with an id of its own: what a copy or an
    unpickled tensor starts from, before its attributes are restored."""
    node = cls.__new__(cls)
    node.id = next(_ids)
    return node


class Tensor:
    """A node of the graph.  Keras sets attributes of its own on tensors
    (``_keras_shape``, ``_uses_learning_phase``...), so this is a plain class.

    ``id`` tells nodes apart in the graph code (toposort, rewrite, plans): a
    copy (``copy.copy``, ``copy.deepcopy``) or an unpickled tensor gets an id
    of its own, never the original's, which in another process may belong to
    another node.  A deep copy of a sub-graph copies each node once, so the
    copies link to each other as the originals do.  A copy keeps no link to the
    Keras layer that made its original (``_keras_history``)."""

    def __init__(self, op, inputs, attrs, shape, dtype, name=None):
        self.id = next(_ids)
        self.op = op
        self.inputs = tuple(inputs)
        self.attrs = attrs
        self.shape = tuple(shape)
        self.dtype = dtype
        self.name = name if name is not None else f"{op}_{self.id}"

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        shape = "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"<{type(self).__name__} {self.name!r} {self.op} shape={shape} dtype={self.dtype}>"

    def __hash__(self):
        return self.id

    def __reduce_ex__(self, protocol):
        # The new node gets its id first (in a cycle back to itself it may be
        # hashed before its state is restored).  Keras's _keras_history (the layer that
        # made the tensor, and through it the whole model) is not part of the
        # graph: a copy is no layer's output, and an unpickled graph needs no Keras.
        state = dict(self.__dict__)
        del state["id"]
        state.pop("_keras_history", None)
        return _new_node, (type(self),), state

    def __bool__(self):
        raise TypeError("a symbolic tensor has no truth value; use K.switch or compare with K.equal")

    def __len__(self):
        if not self.shape or self.shape[0] is None:
            raise TypeError(f"len() of tensor {self.name!r} with shape {self.shape} is unknown")
        return self.shape[0]

    def __iter__(self):
        raise TypeError("a symbolic tensor is not iterable; index it or use K.gather")

    # Python operators build graph nodes through the op registry.
    def __add__(self, other):
        return _apply("add", self, other)

    def __radd__(self, other):
        return _apply("add", other, self)

    def __sub__(self, other):
        return _apply("subtract", self, other)

    def __rsub__(self, other):
        return _apply("subtract", other, self)

    def __mul__(self, other):
        return _apply("multiply", self, other)

    def __rmul__(self, other):
        return _apply("multiply", other, self)

    def __truediv__(self, other):
        return _apply("divide", self, other)

    def __rtruediv__(self, other):
        return _apply("divide", other, self)

    def __floordiv__(self, other):
        return _apply("floor_divide", self, other)

    def __rfloordiv__(self, other):
        return _apply("floor_divide", other, self)

    def __mod__(self, other):
        return _apply("mod", self, other)

    def __rmod__(self, other):
        return _apply("mod", other, self)

    def __pow__(self, other):
        return _apply("power", self, other)

    def __rpow__(self, other):
        return _apply("power", other, self)

    def __neg__(self):
        return _apply("negative", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _apply("abs", self)

    def __lt__(self, other):
        return _apply("less", self, other)

    def __le__(self, other):
        return _apply("less_equal", self, other)

    def __gt__(self, other):
        return _apply("greater", self, other)

    def __ge__(self, other):
        return _apply("greater_equal", self, other)

    def __and__(self, other):
        return _apply("logical_and", self, other)

    def __rand__(self, other):
        return _apply("logical_and", other, self)

    def __or__(self, other):
        return _apply("logical_or", self, other)

    def __ror__(self, other):
        return _apply("logical_or", other, self)

    def __invert__(self):
        return _apply("logical_not", self)

    def __getitem__(self, key):
        return _OPERATORS["getitem"](self, key)

    def __array__(self, *args, **kwargs):
        raise TypeError(f"tensor {self.name!r} is symbolic: use K.eval or K.function to get its value")

    # np.ndarray op tensor should build a node, not loop over the array.
    __array_priority__ = 1000


class Placeholder(Tensor):
    """An input fed when a compiled function is called."""

    # fed one of a few values, each selecting what the graph computes (Keras's
    # learning phase): a function compiles a plan per value fed, the value a constant
    plan_per_value = False

    def __init__(self, shape, dtype, name=None, default=None):
        super().__init__("placeholder", (), {}, shape, dtype, name)
        self.default = default  # used when the function is called without feeding it


# How many times any variable's value has been replaced: what a compiled
# whole call read of the values stays valid while it is the same (see
# compiled_plan.Call).
values_version = 0


class Variable(Tensor):
    """A tensor holding a mutable NumPy value.  The value is replaced, never
    written in place: ``value = array`` and :meth:`assign` store new arrays."""

    def __init__(self, value, dtype, name=None, constraint=None):
        value = np.array(value, dtype=dtype, copy=True, order="C")
        super().__init__("variable", (), {}, value.shape, dtype, name)
        self.value = value
        self.constraint = constraint

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, value):
        global values_version
        self._value = value
        values_version += 1

    def assign(self, value, where="set_value"):
        value = np.asarray(value)
        if value.shape != self.shape:
            raise ValueError(f"{where}: variable {self.name!r} has shape {self.shape}, "
                             f"got a value of shape {value.shape}")
        self.value = np.array(value, dtype=self.dtype, copy=True, order="C")


class Update(Tensor):
    """What ``K.update`` and its kin return: the assignment ``variable <- new_value``,
    read as the new value.  As TensorFlow's assign ops, computing it (``K.eval``,
    an output of ``K.function``) writes the variable, once per call; passed in
    ``K.function``'s ``updates`` it is the (variable, new_value) pair."""

    def __init__(self, variable, new_value, name=None):
        super().__init__("update", (variable, new_value), {}, variable.shape, variable.dtype, name)

    @property
    def variable(self):
        return self.inputs[0]

    @property
    def new_value(self):
        return self.inputs[1]


class Constant(Tensor):
    """A constant NumPy value baked into the graph."""

    def __init__(self, value, dtype=None, name=None):
        value = np.array(value, dtype=dtype, order="C")
        value.flags.writeable = False
        super().__init__("constant", (), {}, value.shape, canonical_dtype(value.dtype), name)
        self.value = value


class SparseTensor(Tensor):
    """A 2-D sparse tensor, as TensorFlow's SparseTensor: three dense tensors,
    ``indices`` (nonzeros, 2) int64, ``values`` (nonzeros,) and ``dense_shape``
    (2,) int64; each index appears once.  ``shape`` is its static shape.

    No op takes a sparse tensor as an input (ops.apply refuses one): the sparse
    ops (sparse.py) read its three parts, and ``K.function`` feeds and returns
    them."""

    def __init__(self, indices, values, dense_shape, shape, name=None):
        super().__init__("sparse_tensor", (indices, values, dense_shape), {}, shape, values.dtype,
                         name)

    @property
    def indices(self):
        return self.inputs[0]

    @property
    def values(self):
        return self.inputs[1]

    @property
    def dense_shape(self):
        return self.inputs[2]

    @property
    def is_placeholder(self):
        """Whether it is an input of compiled functions (``K.placeholder(sparse=True)``)."""
        return all(isinstance(part, Placeholder) for part in self.inputs)


def is_tensor(x):
    return isinstance(x, Tensor)


def _apply(op, *args, **attrs):
    """ops.apply, for a tensor's operators (``x + y``): installed by the ops
    package when it loads (:func:`install_operators`), which builds on this
    module."""
    return _OPERATORS["apply"](op, *args, **attrs)


def install_operators(apply, getitem):
    """Make a tensor's operators build their nodes with the ops package's
    ``apply`` and ``getitem``."""
    _OPERATORS.update(apply=apply, getitem=getitem)


def _not_installed(*args, **attrs):
    raise RuntimeError("numbackend.graph: a tensor's operators need the ops package loaded")


_OPERATORS = {"apply": _not_installed, "getitem": _not_installed}




def toposort(outputs):
    """All nodes the outputs depend on, inputs before their consumers."""
    order, seen = [], set()
    stack = [(node, False) for node in reversed(list(outputs))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node.id in seen:
            continue
        seen.add(node.id)
        stack.append((node, True))
        for inp in reversed(node.inputs):
            if inp.id not in seen:
                stack.append((inp, False))
    return order


def consumers_of(order):
    """{node id: the nodes in ``order`` that take it as an input}."""
    users = {}
    for node in order:
        for inp in node.inputs:
            users.setdefault(inp.id, []).append(node)
    return users


def format_shape(shape):
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def substitute(targets, replacements):
    """Copies of ``targets`` with each node whose id is a key of ``replacements``
    replaced by its value; nodes that depend on no replaced node are shared."""
    new = dict(replacements)
    for node in toposort(targets):
        if node.id in new:
            continue
        inputs = [new.get(i.id, i) for i in node.inputs]
        if any(a is not b for a, b in zip(inputs, node.inputs)):
            new[node.id] = Tensor(node.op, inputs, node.attrs, node.shape, node.dtype, node.name)
    return [new.get(t.id, t) for t in targets]
