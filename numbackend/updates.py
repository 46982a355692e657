"""Keras 2.2.5's update helpers: each returns an Update, the assignment of a
variable read as its new value (see graph.Update)."""
from .graph import Update, Variable, format_shape
from .ops import apply, as_tensor


def _check(x, where):
    if not isinstance(x, Variable):
        raise TypeError(f"{where}: expected a variable, got {x!r}")


def _assignment(x, new_x, where):
    """The Update x <- new_x, its value cast to x's dtype; a new value whose shape
    is known and differs from x's is refused here."""
    _check(x, where)
    new_x = as_tensor(new_x, dtype=x.dtype, where=where)
    if None not in new_x.shape and new_x.shape != x.shape:
        raise ValueError(f"{where}: variable {x.name!r} has shape {format_shape(x.shape)}, "
                         f"the new value shape {format_shape(new_x.shape)}")
    if new_x.dtype != x.dtype:
        new_x = apply("cast", new_x, dtype=x.dtype)
    return Update(x, new_x)


def update(x, new_x):
    """The update x <- new_x."""
    return _assignment(x, new_x, "update")


def update_add(x, increment):
    """The update x <- x + increment."""
    _check(x, "update_add")
    return _assignment(x, apply("add", x, increment), "update_add")


def update_sub(x, decrement):
    """The update x <- x - decrement."""
    _check(x, "update_sub")
    return _assignment(x, apply("subtract", x, decrement), "update_sub")


def moving_average_update(x, value, momentum):
    """The update x <- x * momentum + value * (1 - momentum)."""
    _check(x, "moving_average_update")
    return _assignment(x, apply("add", apply("multiply", x, momentum),
                                apply("multiply", value, apply("subtract", 1, momentum))),
                       "moving_average_update")


def stop_gradient(variables):
    """The same values with no gradient flowing back (a list in, a list out)."""
    if isinstance(variables, (list, tuple)):
        return [apply("stop_gradient", v) for v in variables]
    return apply("stop_gradient", variables)


__all__ = ["moving_average_update", "stop_gradient", "update", "update_add", "update_sub"]
