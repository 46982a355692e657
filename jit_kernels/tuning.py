"""Every threshold and size that numbackend and jit_kernels choose by.

Each entry has a unit, where its value comes from (derived from the machine,
or measured: on what), why it exists, and an environment override,
``NUMBACKEND_TUNE_<NAME>`` (an int, a float, a word, or ``none``), read
when this module is imported.  Code reads an entry as a module attribute,
``tuning.NAME``, at the moment it decides, so that :func:`override` takes
effect at once::

    from numbackend import tuning
    with tuning.override(CONV_PATH="columns"):
        ...

Entries marked ``compiled`` are constants inside compiled kernels: they are
set by the environment alone (before the first kernel compiles), and the disk
caches are keyed by their values (see :func:`compiled_values`).

Pins.  Some decisions depend on how a function has been called (how often,
with what) rather than on shapes alone; each such entry says so in its
``decides`` and can be pinned to a fixed choice.

Results.  Paths of one op compute the same values, but not always the same
bits: a product summed in another order (BLAS's blocking against the packed
micro-kernel, Winograd's transforms against a direct loop, two threads'
partial sums against one) may differ in the last bits.  For the same input,
the same path and the same thread count, a function gives the same bits on
every call.

This module imports nothing of NumPy or Numba: importing numbackend reads it.
"""
import contextlib
import numbers
import os
import threading

__all__ = ["Entry", "compiled_values", "entries", "override", "pins"]


class Entry:
    """One tunable: ``name``, ``default`` (its value before any override),
    ``unit``, ``source`` (derived from what, or measured on what), ``why``,
    ``compiled`` (a constant inside compiled kernels) and ``decides`` (for a
    pin: the run-time decision it fixes)."""

    __slots__ = ("choices", "compiled", "decides", "default", "name", "source", "unit", "why")

    def __init__(self, name, default, unit, source, why, compiled=False, decides=None,
                 choices=None):
        self.name = name
        self.default = default
        self.unit = unit
        self.source = source
        self.why = why
        self.compiled = compiled
        self.decides = decides
        self.choices = choices

    def __repr__(self):
        return f"Entry({self.name}={self.default!r} {self.unit})"


_ENTRIES = {}
_LOCK = threading.Lock()


def _parse(name, text):
    text = text.strip()
    if text.lower() in ("", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text, 0) if kind is int else kind(text)
        except ValueError:
            pass
    return text


def _check(entry, value):
    """``value`` where ``entry`` may take it: one of its choices, else a value of
    its default's kind (a number for a number, an int for an int, a word for a
    word); anything where the default is None and there are no choices."""
    if entry.choices is not None:
        if value not in entry.choices:
            raise ValueError(f"tuning: {entry.name} must be one of {entry.choices!r}, "
                             f"got {value!r}")
        return value
    default = entry.default
    if default is None:
        return value
    if isinstance(default, bool):
        kind, fits = "bool", isinstance(value, bool)
    elif isinstance(default, numbers.Integral):
        kind, fits = "whole number", isinstance(value, numbers.Integral)
    elif isinstance(default, numbers.Real):
        kind, fits = "number", isinstance(value, numbers.Real)
    else:
        kind, fits = type(default).__name__, isinstance(value, type(default))
    if not fits or (isinstance(value, bool) and kind != "bool"):
        raise ValueError(f"tuning: {entry.name} takes a {kind} ({entry.unit}), got {value!r}")
    return value


def _define(name, default, unit, source, why, compiled=False, decides=None, choices=None):
    """Register an entry and set ``name`` in this module to its value: the
    environment's ``NUMBACKEND_TUNE_<NAME>`` where set, else ``default``."""
    if name in _ENTRIES:
        raise ValueError(f"tuning: {name} is defined twice")
    entry = Entry(name, default, unit, source, why, compiled, decides, choices)
    _ENTRIES[name] = entry
    text = os.environ.get(f"NUMBACKEND_TUNE_{name}")
    value = default
    if text is not None:
        try:
            value = _check(entry, _parse(name, text))
        except ValueError as error:
            raise ValueError(f"{error} (from NUMBACKEND_TUNE_{name}={text!r})") from None
    globals()[name] = value
    return value


def entries():
    """Every entry, in the order defined."""
    return list(_ENTRIES.values())


def pins():
    """The entries that fix a decision made by how a function has been called
    (how often, how fast) rather than by shapes alone: those with a
    ``decides``."""
    return [entry for entry in _ENTRIES.values() if entry.decides]


def compiled_values():
    """{name: value} of the entries compiled into kernels, as they are in this
    process (part of the kernels' cache keys)."""
    return {name: globals()[name] for name, e in _ENTRIES.items() if e.compiled}


@contextlib.contextmanager
def override(**values):
    """Set entries for the ``with`` block, process-wide, and restore them after.
    For tests and experiments: calls in other threads see the new values too.
    Refuses unknown names and entries compiled into kernels."""
    for name, value in values.items():
        entry = _ENTRIES.get(name)
        if entry is None:
            raise KeyError(f"tuning: no entry {name!r}; see tuning.entries()")
        if entry.compiled:
            raise ValueError(f"tuning: {name} is compiled into kernels; set "
                             f"NUMBACKEND_TUNE_{name} in the environment instead")
        _check(entry, value)
    with _LOCK:
        before = {name: globals()[name] for name in values}
        globals().update(values)
    try:
        yield
    finally:
        with _LOCK:
            globals().update(before)


# ---------------------------------------------------------------------------
# The entries.  Grouped by the code that reads them; each says its unit,
# where its value comes from, and why it exists.
