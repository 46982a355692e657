"""Ops that pass a value through or stand in for one: tuple_item (one output of
a multi-output node), print_tensor, identity, stop_gradient, update."""
import numpy as np

from . import batch
from .registry import library, not_differentiable

# One output of a multi-output node (whose value is a tuple); autodiff gathers
# the gradients of a node's items into a dict {index: gradient} for its rule.
library("tuple_item", lambda inputs, attrs: (attrs["shape"], attrs["dtype"]),
        lambda packed, index, shape, dtype: packed[index], grad=lambda g, n: [g],
        rows=batch.tuple_item)


def _print_impl(x, message):
    print(message, x)
    return x


library("print_tensor", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype), _print_impl,
        grad=lambda g, n: [g], rows=batch.same)
library("identity", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        lambda x: np.array(x), grad=lambda g, n: [g], rows=batch.same)
library("stop_gradient", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        lambda x: x, grad=lambda g, n: [None], rows=batch.same)



def _update_outside_a_function(variable, new_value):
    raise NotImplementedError("update: an update (K.update, K.update_add, ...) is applied only as an "
                              "output or an update of K.function or by K.eval, not inside a loop "
                              "such as K.rnn's step function")


# graph.Update: K.function and K.eval replace it by its new value before planning
# (runtime.lift_updates), so this runs only where none did.  Not differentiable,
# as TensorFlow's assign ops are not.
library("update", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
        _update_outside_a_function, grad=not_differentiable)
