"""Names of variables, placeholders and constants, as TensorFlow 1 gives them.

``name_scope`` keeps a name stack per thread (as a TensorFlow graph's name stack
is per thread); a variable, placeholder or constant made inside it is named
``<scope>/<name>:0``.  Names are unique in the process until
``K.clear_session()`` (TensorFlow's graph): a name already taken, compared
without case, gets ``_1``, ``_2``... appended, and so does a scope entered
again (a Keras layer called twice: ``dense_1/``, then ``dense_1_1/``).  Keras
builds a layer's weights inside ``K.name_scope(layer.name)``, so weight names
are ``dense_1/kernel:0`` as with TensorFlow, and the weights of a model nested
in another do not collide in an HDF5 file.

Names are only labels: they never reach generated source, and unlike
TensorFlow any characters are accepted.
"""
import threading
from contextlib import contextmanager

__all__ = ["name_scope"]

_local = threading.local()   # .scope: this thread's current scope, '' at the root
_lock = threading.Lock()      # guards _names_in_use
_names_in_use = {}            # lower-cased full name -> how many times it was asked for


def _text(name, where):
    if isinstance(name, bytes):
        return name.decode("utf8")
    if not isinstance(name, str):
        raise TypeError(f"{where}: a name must be a string, got {type(name).__name__} {name!r}")
    return name


def current_scope():
    """This thread's current name scope, without its trailing '/' ('' at the root)."""
    return getattr(_local, "scope", "")


def unique_name(name):
    """``name`` prefixed with the current scope and made unique, as TensorFlow's
    ``Graph.unique_name``: the first ``a`` is ``a``, then ``a_1``, ``a_2``...;
    the name returned is marked as taken."""
    scope = current_scope()
    if scope:
        name = f"{scope}/{name}"
    key = name.lower()
    with _lock:
        count = _names_in_use.get(key, 0)
        _names_in_use[key] = count + 1
        if count == 0:
            return name
        base = key
        while key in _names_in_use:   # 'a_1' may have been taken as a name of its own
            key = f"{base}_{count}"
            count += 1
        _names_in_use[key] = 1
        return f"{name}_{count - 1}"


def tensor_name(name, default, where):
    """The name of a new variable, placeholder or constant: ``name`` (``default``
    when None or empty) in the current scope, made unique, with ``:0`` appended.
    A name ending in '/' is taken whole, as TensorFlow takes a scope's name."""
    name = _text(name, where) if name else default
    if name.endswith("/"):
        return name[:-1] + ":0"
    return unique_name(name) + ":0"


@contextmanager
def name_scope(name):
    """A context manager that opens name scope ``name`` in this thread, as
    TensorFlow 1's ``tf.name_scope``; it yields the scope with a trailing '/'.

    Inside the current scope ``s``, ``name`` opens ``s/name`` (``s/name_1`` when
    that was taken, see ``unique_name``); a name ending in '/' is an absolute
    scope, re-entered as it is; None or '' goes back to the root scope.  Tensors
    named inside are ``<scope>/<name>:0``."""
    if name:
        name = _text(name, "name_scope")
    old = current_scope()
    if not name:
        new = ""
    elif name.endswith("/"):
        new = name[:-1]
    else:
        new = unique_name(name)
    _local.scope = new
    try:
        yield new + "/" if new else ""
    finally:
        _local.scope = old


def reset():
    """Forget every name taken (``K.clear_session``: a new TensorFlow graph)."""
    with _lock:
        _names_in_use.clear()
