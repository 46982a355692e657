"""Keras 2.2.5's update helpers: they return (variable, new_value) pairs for K.function."""
from .graph import Variable
from .ops import apply, as_tensor


def _check(x, where):
    if not isinstance(x, Variable):
        raise TypeError(f"{where}: expected a variable, got {x!r}")


def update(x, new_x):
    """The update x <- new_x."""
    _check(x, "update")
    return (x, as_tensor(new_x, dtype=x.dtype))


def update_add(x, increment):
    """The update x <- x + increment."""
    _check(x, "update_add")
    return (x, apply("add", x, increment))


def update_sub(x, decrement):
    """The update x <- x - decrement."""
    _check(x, "update_sub")
    return (x, apply("subtract", x, decrement))


def moving_average_update(x, value, momentum):
    """The update x <- x * momentum + value * (1 - momentum)."""
    _check(x, "moving_average_update")
    return (x, apply("add", apply("multiply", x, momentum),
                     apply("multiply", value, apply("subtract", 1, momentum))))


def stop_gradient(variables):
    """The same values with no gradient flowing back (a list in, a list out)."""
    if isinstance(variables, (list, tuple)):
        return [apply("stop_gradient", v) for v in variables]
    return apply("stop_gradient", variables)


__all__ = ["moving_average_update", "stop_gradient", "update", "update_add", "update_sub"]
