"""Variables, placeholders, constants, compiled functions and their values."""
import gc

import numpy as np

from . import codegen, config, names
from . import sparse as sparse_tensors
from .graph import Constant, Placeholder, Variable, canonical_dtype, is_tensor
from .names import name_scope
from .ops import apply, as_tensor
from .runtime import Function

_uid_prefixes = {}


def _dtype_or_floatx(dtype, where):
    return canonical_dtype(config.floatx() if dtype is None else dtype, where)


def variable(value, dtype=None, name=None, constraint=None):
    """A variable initialised with ``value`` (a NumPy array or number).

    Keras 2.2.5: ``variable(value, dtype=None, name=None, constraint=None)``.
    Its name is TensorFlow's: ``name`` (default ``'Variable'``) inside the current
    name scope, made unique, with ``:0`` appended (see ``name_scope``).
    As with its TensorFlow backend, a scipy.sparse matrix makes a sparse tensor
    of its nonzeros (of ``dtype``, floatx by default), which is not a variable:
    fixed and not trainable; ``get_value`` gives its SparseTensorValue and
    ``eval`` its dense array.
    """
    if sparse_tensors.is_scipy_sparse(value):
        v = sparse_tensors.variable(value, dtype=dtype,
                                    name=names.tensor_name(name, "Variable", "variable"))
        v._keras_shape = v.shape
        v._uses_learning_phase = False
        return v
    if is_tensor(value):
        value = eval(value)
    dtype = _dtype_or_floatx(dtype, "variable")
    v = Variable(np.asarray(value), dtype, name=names.tensor_name(name, "Variable", "variable"),
                 constraint=constraint)
    v._keras_shape = v.shape
    v._uses_learning_phase = False
    return v


def constant(value, dtype=None, shape=None, name=None):
    """A constant tensor; a scalar ``value`` is filled into ``shape`` when given.
    Named as TensorFlow names it (default ``'Const'``, see ``variable``)."""
    dtype = _dtype_or_floatx(dtype, "constant")
    value = np.asarray(value, dtype=dtype)
    if shape is not None:
        value = np.full(tuple(shape), value, dtype=dtype) if value.ndim == 0 else value.reshape(shape)
    return Constant(value, dtype=dtype, name=names.tensor_name(name, "Const", "constant"))


def placeholder(shape=None, ndim=None, dtype=None, sparse=False, name=None):
    """An input of a compiled function; ``shape`` may hold None entries; one of
    ``shape``/``ndim`` is required and ``shape`` wins.  Named as TensorFlow names
    it (default ``'Placeholder'``, see ``variable``).

    ``sparse=True`` (Keras's ``Input(sparse=True)``): a 2-D sparse tensor,
    which ``K.function`` feeds with a scipy.sparse matrix of any format."""
    if shape is None:
        if ndim is None:
            raise ValueError("placeholder: give a shape or an ndim")
        shape = (None,) * int(ndim)
    shape = tuple(None if d is None else int(d) for d in shape)
    if any(d is not None and d < 0 for d in shape):
        raise ValueError(f"placeholder: negative dimension in shape {shape}")
    name = names.tensor_name(name, "Placeholder", "placeholder")
    if sparse:
        p = sparse_tensors.placeholder(shape, _dtype_or_floatx(dtype, "placeholder"), name=name)
    else:
        p = Placeholder(shape, _dtype_or_floatx(dtype, "placeholder"), name=name)
    p._keras_shape = shape
    p._uses_learning_phase = False
    return p


def is_placeholder(x):
    """True if x is a placeholder (a sparse one too)."""
    return isinstance(x, Placeholder) or (sparse_tensors.is_sparse(x) and x.is_placeholder)


def is_keras_tensor(x):
    """True if x is a tensor made by a Keras layer (it carries ``_keras_history``)."""
    if not is_tensor(x):
        raise ValueError("Unexpectedly found an instance of type `" + str(type(x)) + "`. "
                         "Expected a symbolic tensor instance.")
    return hasattr(x, "_keras_history")


def is_sparse(tensor):
    """True if ``tensor`` is a sparse tensor (``K.placeholder(..., sparse=True)``,
    ``K.variable`` of a scipy.sparse matrix, ``K.concatenate`` of sparse tensors)."""
    return sparse_tensors.is_sparse(tensor)


def to_dense(tensor):
    """The dense tensor of a sparse tensor; any other tensor is returned as it is."""
    return sparse_tensors.to_dense(tensor)


def shape(x):
    """The symbolic shape of x, as an int32 tensor (of a sparse tensor: its dense shape)."""
    if sparse_tensors.is_sparse(x):
        return sparse_tensors.shape(x)
    return apply("shape", x)


def int_shape(x):
    """The static shape of x as a tuple of ints and None.

    As with Keras's TensorFlow backend, the shape Keras computed for a layer's
    output (``_keras_shape``) wins: a Lambda layer's ``output_shape`` may know
    more than the graph does."""
    if hasattr(x, "_keras_shape"):
        return tuple(x._keras_shape)
    if is_tensor(x):
        return tuple(x.shape)
    return tuple(np.shape(x))


def get_variable_shape(x):
    """The static shape of a variable, as a tuple of ints (Keras's ``int_shape``)."""
    return int_shape(x)


def ndim(x):
    """The rank of x."""
    return len(int_shape(x))


def dtype(x):
    """The dtype of x, as a string."""
    if is_tensor(x):
        return x.dtype
    return np.asarray(x).dtype.name


def eval(x):
    """The value of a tensor, as a NumPy array (of a sparse tensor: its dense array,
    as with Keras's TensorFlow backend)."""
    if sparse_tensors.is_sparse(x):
        x = sparse_tensors.to_dense(x)
    if isinstance(x, Variable):
        return x.value.copy()
    if isinstance(x, Constant):
        return np.array(x.value)
    if not is_tensor(x):
        return np.asarray(x)
    return Function([], [x])([])[0]


def zeros(shape, dtype=None, name=None):
    """A variable of zeros."""
    return variable(np.zeros(_int_tuple(shape, "zeros")), dtype=dtype, name=name)


def ones(shape, dtype=None, name=None):
    """A variable of ones."""
    return variable(np.ones(_int_tuple(shape, "ones")), dtype=dtype, name=name)


def eye(size, dtype=None, name=None):
    """An identity-matrix variable; ``size`` is an int or an (rows, cols) pair."""
    if isinstance(size, (tuple, list)):
        n, m = size
    else:
        n, m = size, size
    return variable(np.eye(int(n), int(m)), dtype=dtype, name=name)


def zeros_like(x, dtype=None, name=None):
    """Zeros of the shape of x (a tensor: its runtime shape)."""
    return _filled_like(x, 0, dtype)


def ones_like(x, dtype=None, name=None):
    """Ones of the shape of x (a tensor: its runtime shape)."""
    return _filled_like(x, 1, dtype)


def _filled_like(x, value, dtype):
    # broadcast, not x * 0: an inf or NaN in x must not leak into the result
    dtype = canonical_dtype(dtype or _like_dtype(x), "zeros_like")
    return apply("broadcast_like", Constant(np.full((), value, dtype=dtype)), as_tensor(x))


def _like_dtype(x):
    return x.dtype if is_tensor(x) else np.asarray(x).dtype.name


def identity(x, name=None):
    """A copy of x."""
    return apply("identity", x)


def count_params(x):
    """The number of scalars in x (its static shape must be known)."""
    shp = int_shape(x)
    if any(d is None for d in shp):
        raise ValueError(f"count_params: shape {shp} is not fully known")
    return int(np.prod(shp, dtype=np.int64))


def cast(x, dtype):
    """x converted to ``dtype``."""
    dtype = canonical_dtype(dtype, "cast")
    x = as_tensor(x)
    if x.dtype == dtype:
        return x
    return apply("cast", x, dtype=dtype)


def get_value(x):
    """The value of a variable, as a NumPy array (a copy); of a sparse tensor, its
    SparseTensorValue (indices, values, dense_shape), as TensorFlow gives it."""
    if sparse_tensors.is_sparse(x):
        return function([], [x])([])[0]
    if not isinstance(x, Variable):
        if is_tensor(x):
            return eval(x)
        raise TypeError(f"get_value: expected a variable, got {type(x).__name__}")
    return x.value.copy()


def batch_get_value(ops):
    """The values of several variables."""
    return [get_value(x) for x in ops]


def set_value(x, value):
    """Set a variable's value from a NumPy array of the same shape."""
    if not isinstance(x, Variable):
        raise TypeError(f"set_value: expected a variable, got {_describe_tensor(x)}")
    x.assign(value)


def batch_set_value(tuples):
    """Set several variables; all shapes are checked before any is written."""
    tuples = list(tuples)
    for x, value in tuples:
        if not isinstance(x, Variable):
            raise TypeError(f"batch_set_value: expected variables, got {_describe_tensor(x)}")
        if np.shape(value) != x.shape:
            raise ValueError(f"batch_set_value: variable {x.name!r} has shape {x.shape}, "
                             f"got a value of shape {np.shape(value)}; no variable was changed")
    for x, value in tuples:
        x.assign(value)


def print_tensor(x, message=""):
    """x, printing ``message`` and its value each time it is computed."""
    return apply("print_tensor", x, message=str(message))


def _describe_tensor(x):
    if sparse_tensors.is_sparse(x):
        return f"the sparse tensor {x.name!r} of shape {x.shape}, whose value is fixed"
    return type(x).__name__


def function(inputs, outputs, updates=None, **kwargs):
    """Compile a function from placeholders to outputs; ``updates`` are
    (variable, new_value) pairs computed from the values before the call and
    written after it succeeds.

    A sparse input (``K.placeholder(..., sparse=True)``) is fed a scipy.sparse
    matrix of any format (or a SparseTensorValue); a dense input refuses one, as
    with TensorFlow.  A sparse output comes back as a SparseTensorValue
    (indices in row-major order, values, dense shape).

    Threads: calls of one function with updates run one at a time (each
    function with updates has a lock, held from reading the variables to
    writing their new values), so a training step called from several threads
    loses no update.  Functions without updates take no lock, and two
    different functions run at the same time even where they update the same
    variable."""
    allowed = {"name"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise ValueError(f"function: invalid keyword argument(s) {sorted(unknown)}")
    inputs = list(inputs)
    if sparse_tensors.uses_sparse(inputs, outputs):
        return sparse_tensors.SparseFunction(inputs, outputs, updates or [], name=kwargs.get("name"))
    return Function(inputs, outputs, updates or [], name=kwargs.get("name"))


def explain(fn):
    """The compiled plan of a function, one line per step."""
    return fn.explain()


def get_uid(prefix=""):
    """A unique integer per prefix, counting from 1."""
    _uid_prefixes[prefix] = _uid_prefixes.get(prefix, 0) + 1
    return _uid_prefixes[prefix]


def reset_uids():
    """Reset the counters of get_uid."""
    _uid_prefixes.clear()


def clear_session():
    """Start afresh, as Keras's TensorFlow backend does: reset the counters of
    get_uid (Keras's layer names) and the names taken (a new variable may be
    named as one made before), unfix the learning phase (see
    set_learning_phase), and drop from memory the loaded kernel modules that
    no compiled function holds.  Tensors, variables and compiled functions made
    before keep working.  With Keras, ``keras.backend.clear_session`` is this
    function (see ``numbackend.keras_compat``)."""
    global _fixed_learning_phase
    reset_uids()
    names.reset()
    _fixed_learning_phase = None
    gc.collect()  # a function dropped in a reference cycle (a Keras model's) holds no kernel after
    codegen.forget_kernels()


def manual_variable_initialization(value):
    """Kept for API compatibility: numbackend variables always hold their initial value."""
    global _manual_var_init
    _manual_var_init = bool(value)


_manual_var_init = False


# ---------------------------------------------------------------------------
# Learning phase

class LearningPhase(Placeholder):
    """The one learning-phase placeholder, which Keras's functions feed: copied or
    unpickled, it stays this one (a copy would be another input, left at its
    default, and a copied model's dropout would never be on in training).
    A function compiles a plan per value fed (see runtime.Function), where the
    switches on it (K.in_train_phase) take their branch and the other is never
    computed: at test time no dropout mask is drawn."""

    plan_per_value = True

    def __reduce_ex__(self, protocol):
        return "_LEARNING_PHASE"  # pickled by reference, as a module's global


_LEARNING_PHASE = LearningPhase((), "uint8", name="keras_learning_phase", default=np.uint8(0))
_LEARNING_PHASE._uses_learning_phase = False
_fixed_learning_phase = None


def learning_phase():
    """The learning phase: an int tensor fed by Keras (0 = test, 1 = train; 0 when not
    fed), or the Python int fixed by ``set_learning_phase``."""
    if _fixed_learning_phase is not None:
        return _fixed_learning_phase
    return _LEARNING_PHASE


def set_learning_phase(value):
    """Fix the learning phase to 0 (test) or 1 (train)."""
    global _fixed_learning_phase
    if value not in (0, 1):
        raise ValueError(f"set_learning_phase: expected 0 or 1, got {value!r}")
    _fixed_learning_phase = int(value)


def _int_tuple(shape, where):
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"{where}: shape must be a tuple of ints, got {shape!r}") from None


__all__ = [
    "batch_get_value",
    "batch_set_value",
    "cast",
    "clear_session",
    "constant",
    "count_params",
    "dtype",
    "eval",
    "explain",
    "eye",
    "function",
    "get_uid",
    "get_value",
    "get_variable_shape",
    "identity",
    "int_shape",
    "is_keras_tensor",
    "is_placeholder",
    "is_sparse",
    "is_tensor",
    "learning_phase",
    "manual_variable_initialization",
    "name_scope",
    "ndim",
    "ones",
    "ones_like",
    "placeholder",
    "print_tensor",
    "reset_uids",
    "set_learning_phase",
    "set_value",
    "shape",
    "to_dense",
    "variable",
    "zeros",
    "zeros_like",
]
