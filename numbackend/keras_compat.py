"""Compatibility fixes that let Keras 2.2.5 run on Python >= 3.10, NumPy 2 and h5py 3.

Keras imports its backend module from ``keras/backend/load_backend.py`` while
``import keras`` is still in progress: ``keras.utils.np_utils``, ``generic_utils``,
``data_utils`` and ``io_utils`` are loaded by then; ``keras.callbacks``,
``keras.engine.*``, ``keras.layers`` and ``keras_preprocessing`` are not. ``apply()``
runs during ``import numbackend`` (whichever of numbackend and keras is imported
first), so every fix below is in place before the code that needs it runs.
This module never imports keras or numpy's submodules; it imports h5py only in
the patched functions, which run after Keras has loaded it.

Fixes, each installed only where the name or behaviour is missing:

Names restored on the shared module. Keras looks them up through the
``collections``, ``inspect`` and ``numpy`` module objects, in modules that are
not imported yet when the backend loads, so there is no Keras-local name to
patch instead. Each is the same object the old name stood for.

``collections.Iterable`` = ``collections.abc.Iterable`` (removed in Python 3.10)
    ``keras/callbacks.py`` does ``from collections import Iterable`` at import
    time: without it ``import keras`` fails.
``collections.Container`` = ``collections.abc.Container`` (removed in Python 3.10)
    ``keras/engine/training_utils.py:should_run_validation``: ``fit(...,
    validation_freq=<list>)``.
``inspect.ArgSpec`` (removed in Python 3.11)
    ``keras/utils/generic_utils.py:getargspec`` builds one; it is called by
    ``keras.preprocessing.image`` (``array_to_img``, ``img_to_array``,
    ``ImageDataGenerator.flow``/``flow_from_directory``/...).
``inspect.getargspec`` (removed in Python 3.11)
    Keras 2.2.5 itself calls it only under Python 2; restored with its old
    semantics (``ArgSpec`` result, ``ValueError`` for keyword-only parameters or
    annotations) for code written against Keras 2.2 (custom layers,
    keras-contrib) that calls it.
``numpy.Inf`` = ``numpy.inf`` (removed in NumPy 2.0)
    ``keras/callbacks.py``: ``ModelCheckpoint()``, ``ReduceLROnPlateau()`` and
    ``EarlyStopping.on_train_begin``.
``numpy.unicode_`` = ``numpy.str_`` (removed in NumPy 2.0)
    ``keras_preprocessing/sequence.py:pad_sequences`` with any non-string dtype
    (the default ``'int32'`` included), i.e. ``keras.preprocessing.sequence.pad_sequences``.

Behaviour patched inside Keras's own modules (as soon as they are imported):

h5py 3 returns every variable-length string attribute as ``str``; h5py 2
returned ``bytes`` for those stored as bytes (variable-length ASCII, or
fixed-length) and ``str`` only for those stored as ``str`` (variable-length
UTF-8). Keras 2.2.5 writes its string attributes as ``bytes`` and calls
``.decode('utf8')`` on what it reads back, so a model saved in this environment
could not be loaded (``AttributeError: 'str' object has no attribute 'decode'``).
``keras.utils.io_utils.H5Dict.__getitem__``
    attributes read from an HDF5 file come back as h5py 2 gave them: ``bytes``
    or ``str`` as they were stored, an array of strings as a list. This replaces
    the branch that compares with ``numpy.string_`` (removed in NumPy 2.0), so
    that name need not be restored.
``keras.engine.saving._deserialize_model``
    reads through a view of the ``H5Dict`` that gives every string as
    ``bytes``, so that ``load_model`` (and unpickling a model) also loads a file
    whose attributes were written as ``str``.
``keras.engine.saving.load_attributes_from_hdf5_group``,
``load_weights_from_hdf5_group``, ``load_weights_from_hdf5_group_by_name``
    accept ``str`` as well as ``bytes`` attributes: ``Model.load_weights``
    (also ``by_name=True``) and the ``keras.applications`` weight files.
``keras.utils.io_utils.save_to_binary_h5py`` (and the name ``keras.engine.saving`` imported)
    opens its in-memory file with ``mode='w'``: h5py 3 opens files read-only by
    default, so ``save_model(model, io.BytesIO())`` (or an open binary file)
    failed with ``OSError: Unable to synchronously open file``.

Keras's long attribute lists (layer and weight names over HDF5's 64 KB header
limit) are split into chunks ``weight_names0``, ``weight_names1``... of
fixed-length strings; the loaders above read them whichever way they are stored.

``keras.backend.clear_session`` = ``numbackend.clear_session``
    ``keras/backend/__init__.py`` exports ``clear_session`` for TensorFlow and
    CNTK only. Installed when ``keras.engine.base_layer`` has been imported
    (``keras.backend`` is still executing when it loads numbackend; base_layer
    comes after it, before any layer is made), and only where Keras's backend
    is numbackend.
``keras.layers.core.Lambda.compute_output_shape``
    without ``output_shape``, Keras 2.2.5 infers a Lambda's output shape only
    for TensorFlow and CNTK, and otherwise takes the input's shape, so that a
    Dense after ``Lambda(lambda x: K.sum(x, axis=-1, keepdims=True))`` was built
    for the wrong shape. With numbackend it runs Keras's TensorFlow branch: the
    function applied to placeholders of the input shapes, read with
    ``K.int_shape``.

Not fixed here (not on a normal path): ``keras/backend/numpy_backend.py`` uses
``np.int``, but it is Keras's test reference, never loaded as a backend.
"""

import collections
import collections.abc
import importlib.machinery
import inspect
import sys

import numpy as np

__all__ = ['applied', 'apply', 'warmup_model']

_APPLIED = []  # names of the fixes installed in this process, in order

ArgSpec = collections.namedtuple('ArgSpec', 'args varargs keywords defaults')
ArgSpec.__module__ = 'inspect'


def getargspec(func):
    """``inspect.getargspec`` as in Python 3.10: ``ArgSpec(args, varargs, keywords, defaults)``."""
    (args, varargs, varkw, defaults,
     kwonlyargs, _kwonlydefaults, annotations) = inspect.getfullargspec(func)
    if kwonlyargs or annotations:
        raise ValueError('Function has keyword-only parameters or annotations, '
                         'use inspect.signature() API which can support them')
    return ArgSpec(args, varargs, varkw, defaults)


def _restore(module, name, value):
    if not hasattr(module, name):
        setattr(module, name, value)
        _APPLIED.append(f'{module.__name__}.{name}')


# ----------------------------------------------------------------- h5py 3 strings

def _text(x):
    return x.decode('utf8') if isinstance(x, bytes) else x


def _as_bytes(value):
    """An HDF5 attribute as Keras 2.2.5's loaders expect it: ``bytes`` for strings."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in 'SOU':
        value = value.tolist()
    if isinstance(value, list):
        return [_as_bytes(v) for v in value]
    if isinstance(value, str):
        # h5py 3 decodes variable-length strings with surrogate escapes: exact bytes back
        return value.encode('utf8', 'surrogateescape')
    return value


def _as_h5py2(attrs, name):
    """Attribute ``name`` as h5py 2 read it (and as Keras's ``H5Dict`` gave it then):
    a string stored as bytes (fixed-length, or variable-length ASCII: what h5py
    writes for ``bytes``) is ``bytes``, a variable-length UTF-8 string (what h5py
    writes for ``str``) is ``str``; an array of strings is a list of them."""
    import h5py  # Keras's io_utils has loaded it before any attribute is read

    value = attrs[name]
    info = h5py.check_string_dtype(attrs.get_id(name).dtype)
    if info is None:
        return value
    as_str = info.length is None and info.encoding == 'utf-8'

    def convert(v):
        if isinstance(v, list):
            return [convert(x) for x in v]
        if isinstance(v, str) and not as_str:
            # h5py 3 decodes variable-length strings with surrogate escapes: exact bytes back
            return v.encode('utf8', 'surrogateescape')
        if isinstance(v, bytes):
            return bytes(v)  # np.bytes_ too, as H5Dict's tolist() gave it
        return v

    return convert(value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value)


class _BytesAttrs:
    """Read-only view of an h5py ``AttributeManager`` that gives strings as bytes."""

    def __init__(self, attrs):
        self._attrs = attrs

    def __contains__(self, name):
        return name in self._attrs

    def __getitem__(self, name):
        return _as_bytes(self._attrs[name])


class _BytesAttrsGroup:
    """An h5py group whose ``attrs`` give strings as bytes; all else is the group's."""

    def __init__(self, group):
        self._group = group
        self.attrs = _BytesAttrs(group.attrs)

    def __getitem__(self, name):
        return self._group[name]

    def __contains__(self, name):
        return name in self._group

    def __iter__(self):
        return iter(self._group)

    def __len__(self):
        return len(self._group)

    def __getattr__(self, name):
        return getattr(self._group, name)


class _BytesH5Dict:
    """Read-only view of a Keras ``H5Dict`` for ``_deserialize_model``: strings
    come back as ``bytes``, which it decodes, however they were stored (a chunked
    name list, which ``H5Dict`` decodes itself, included); groups are views too."""

    def __init__(self, h5dict, h5dict_class):
        self._h5dict = h5dict
        self._h5dict_class = h5dict_class

    def __getitem__(self, key):
        value = self._h5dict[key]
        if isinstance(value, self._h5dict_class):
            return _BytesH5Dict(value, self._h5dict_class)
        return _as_bytes(value)

    def __contains__(self, key):
        return key in self._h5dict

    def get(self, key, default=None):
        if key in self._h5dict:
            return self[key]
        return default

    def __iter__(self):
        return iter(self._h5dict)

    def __len__(self):
        return len(self._h5dict)

    def __getattr__(self, name):
        return getattr(self._h5dict, name)


def _save_to_binary_h5py(save_function, stream):
    """Calls ``save_function`` on an in-memory ``h5py.File``, then writes the file's
    bytes to ``stream`` (anything with ``write``, e.g. ``io.BytesIO``); returns what
    ``save_function`` returned."""
    import h5py

    # h5py 3 opens read-only unless told otherwise, and there is no file to read
    with h5py.File('in-memory-h5py', mode='w', driver='core', backing_store=False) as h5file:
        return_value = save_function(h5file)
        h5file.flush()
        binary_data = h5file.id.get_file_image()  # h5py 2 also called it .fid
    stream.write(binary_data)
    return return_value


def _patch_io_utils(module):
    h5dict = module.H5Dict
    if getattr(h5dict.__getitem__, '_numbackend_compat', False):
        return
    original = h5dict.__getitem__

    def __getitem__(self, attr):
        data = self.data
        if not isinstance(data, dict) and attr in data.attrs:
            return _as_h5py2(data.attrs, attr)
        return original(self, attr)

    __getitem__._numbackend_compat = True
    __getitem__.__doc__ = original.__doc__
    h5dict.__getitem__ = __getitem__
    module.save_to_binary_h5py = _save_to_binary_h5py
    _APPLIED.append('keras.utils.io_utils.H5Dict.__getitem__')
    _APPLIED.append('keras.utils.io_utils.save_to_binary_h5py')


def _patch_saving(module):
    if getattr(module.load_attributes_from_hdf5_group, '_numbackend_compat', False):
        return

    def load_attributes_from_hdf5_group(group, name):
        attrs = group.attrs
        if name in attrs:
            return [_text(n) for n in attrs[name]]
        data = []
        chunk_id = 0
        while f'{name}{chunk_id}' in attrs:
            data.extend(_text(n) for n in attrs[f'{name}{chunk_id}'])
            chunk_id += 1
        return data

    def wrap(original):
        def load(f, *args, **kwargs):
            if not isinstance(f, _BytesAttrsGroup):
                f = _BytesAttrsGroup(f)
            return original(f, *args, **kwargs)
        load.__name__ = original.__name__
        load.__doc__ = original.__doc__
        load._numbackend_compat = True
        return load

    deserialize_model = module._deserialize_model

    def _deserialize_model(h5dict, *args, **kwargs):
        if not isinstance(h5dict, _BytesH5Dict):
            h5dict = _BytesH5Dict(h5dict, module.H5Dict)
        return deserialize_model(h5dict, *args, **kwargs)

    load_attributes_from_hdf5_group._numbackend_compat = True
    load_attributes_from_hdf5_group.__doc__ = module.load_attributes_from_hdf5_group.__doc__
    module.load_attributes_from_hdf5_group = load_attributes_from_hdf5_group
    module.load_weights_from_hdf5_group = wrap(module.load_weights_from_hdf5_group)
    module.load_weights_from_hdf5_group_by_name = wrap(
        module.load_weights_from_hdf5_group_by_name)
    _deserialize_model.__doc__ = deserialize_model.__doc__
    module._deserialize_model = _deserialize_model
    module.save_to_binary_h5py = _save_to_binary_h5py  # imported by name from io_utils
    _APPLIED.append('keras.engine.saving (h5py 3 string attributes)')


# ------------------------------------------------ keras.backend.clear_session

def _install_clear_session(module):
    """``keras.backend.clear_session`` = numbackend's, where Keras left it out.

    Runs when ``keras.engine.base_layer`` (``module``, unused) has been imported:
    ``keras.backend`` is still executing when it loads numbackend, and
    base_layer is imported after it has finished, before any layer is made."""
    backend = sys.modules.get('keras.backend')
    loaded = sys.modules.get('keras.backend.load_backend')
    core = sys.modules.get('numbackend.core')
    if backend is None or loaded is None or core is None or hasattr(backend, 'clear_session'):
        return
    if getattr(loaded, 'clear_session', None) is core.clear_session:  # Keras's backend is ours
        backend.clear_session = core.clear_session
        _APPLIED.append('keras.backend.clear_session')


# ------------------------------------------------------------ Lambda's output shape

def _lambda_output_shape(layer, input_shape, K):
    """``Lambda.compute_output_shape`` without ``output_shape``, as Keras 2.2.5 does it
    for TensorFlow: the function applied to placeholders of the input shapes."""
    if isinstance(input_shape, list):
        xs = [K.placeholder(shape=shape, dtype=dtype)
              for shape, dtype in zip(input_shape, layer._input_dtypes)]
        x = layer.call(xs)
    else:
        x = K.placeholder(shape=input_shape, dtype=layer._input_dtypes)
        x = layer.call(x)
    if isinstance(x, list):
        return [K.int_shape(x_elem) for x_elem in x]
    return K.int_shape(x)


def _patch_layers_core(module):
    lambda_class = module.Lambda
    original = lambda_class.compute_output_shape
    if getattr(original, '_numbackend_compat', False):
        return
    K = module.K

    def compute_output_shape(self, input_shape):
        if self._output_shape is None and K.backend() == 'numbackend':
            return _lambda_output_shape(self, input_shape, K)
        return original(self, input_shape)

    compute_output_shape._numbackend_compat = True
    compute_output_shape.__doc__ = original.__doc__
    lambda_class.compute_output_shape = compute_output_shape
    _APPLIED.append('keras.layers.core.Lambda.compute_output_shape')


_MODULE_PATCHES = {
    'keras.utils.io_utils': _patch_io_utils,
    'keras.engine.base_layer': _install_clear_session,
    'keras.engine.saving': _patch_saving,
    'keras.layers.core': _patch_layers_core,
}


class _PatchAfterImport:
    """``sys.meta_path`` entry: runs a patch on a named module right after it executes.

    It finds nothing itself; for a module named in ``_MODULE_PATCHES`` it asks the
    finders after it for the spec and wraps the (per-module) file loader's
    ``exec_module``. It leaves ``sys.meta_path`` once every patch has run.
    """

    def __init__(self):
        self.pending = {}

    def find_spec(self, fullname, path=None, target=None):
        patch = self.pending.get(fullname)
        if patch is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, 'find_spec'):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        loaders = (importlib.machinery.SourceFileLoader,
                   importlib.machinery.SourcelessFileLoader)
        if spec is None or not isinstance(spec.loader, loaders):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.done(fullname)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec

    def done(self, fullname):
        self.pending.pop(fullname, None)
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)


_FINDER = _PatchAfterImport()


def apply():
    """Install every fix listed in the module docstring that this process lacks.

    Idempotent and cheap (no imports beyond what ``import numba`` loads anyway).
    Returns the list of fixes installed in this process so far.
    """
    _restore(collections, 'Iterable', collections.abc.Iterable)
    _restore(collections, 'Container', collections.abc.Container)
    _restore(inspect, 'ArgSpec', ArgSpec)
    _restore(inspect, 'getargspec', getargspec)
    _restore(np, 'Inf', np.inf)
    _restore(np, 'unicode_', np.str_)
    for name, patch in _MODULE_PATCHES.items():
        module = sys.modules.get(name)
        if module is not None and hasattr(module, '__file__'):
            _FINDER.done(name)
            patch(module)
        else:
            _FINDER.pending[name] = patch
    if _FINDER.pending and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return applied()


def applied():
    """The fixes installed in this process, in the order they were installed."""
    return list(_APPLIED)


def warmup_model(model, batch_sizes=(1,)):
    """Compile everything a Keras model's ``predict`` runs for these batch sizes,
    and wait for it (see ``Function.warmup``): a server calls it before it
    serves, and its predictions then compile nothing.  Keras builds the
    predict function here where it has not yet."""
    model._make_predict_function()
    function = model.predict_function
    warmup = getattr(function, 'warmup', None)
    if warmup is None:
        raise TypeError(f"warmup_model: the model's predict function is a "
                        f"{type(function).__name__}, not numbackend's: is Keras's backend numbackend?")
    warmup(batch_sizes)
