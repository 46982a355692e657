"""numbackend.keras_compat: the fixes Keras 2.2.5 needs on Python 3.11, NumPy 2, h5py 3."""

import collections
import collections.abc
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from numbackend import keras_compat


def test_apply_is_idempotent():
    first = keras_compat.apply()
    state = (collections.Iterable, collections.Container, inspect.ArgSpec,
             inspect.getargspec, np.Inf, np.unicode_, list(sys.meta_path))
    second = keras_compat.apply()
    assert second == first == keras_compat.applied()
    assert len(second) == len(set(second))
    assert state == (collections.Iterable, collections.Container, inspect.ArgSpec,
                     inspect.getargspec, np.Inf, np.unicode_, list(sys.meta_path))
    assert sum(f is keras_compat._FINDER for f in sys.meta_path) <= 1


def test_restored_names_are_the_old_objects():
    keras_compat.apply()
    assert collections.Iterable is collections.abc.Iterable
    assert collections.Container is collections.abc.Container
    assert np.Inf == np.inf and isinstance(np.Inf, float)
    assert -np.Inf == float('-inf')
    assert np.unicode_ is np.str_
    assert np.issubdtype('U3', np.unicode_) and not np.issubdtype('int32', np.unicode_)


def test_existing_names_are_left_alone(monkeypatch):
    keras_compat.apply()
    sentinel = object()
    monkeypatch.setattr(collections, 'Iterable', sentinel)
    monkeypatch.setattr(inspect, 'getargspec', sentinel)
    monkeypatch.setattr(np, 'Inf', sentinel, raising=False)
    keras_compat.apply()
    assert collections.Iterable is sentinel
    assert inspect.getargspec is sentinel
    assert np.Inf is sentinel


def _f(a, b=2, *args, **kw):
    pass


def _g():
    pass


def _annotated(x: int):
    pass


class _C:
    def method(self, x, y=None):
        pass


@pytest.mark.parametrize('getargspec', [keras_compat.getargspec, 'inspect'])
def test_getargspec_old_semantics(getargspec):
    keras_compat.apply()
    if getargspec == 'inspect':
        getargspec = inspect.getargspec
    spec = getargspec(_f)
    assert spec == (['a', 'b'], 'args', 'kw', (2,))
    assert (spec.args, spec.varargs, spec.keywords, spec.defaults) == (['a', 'b'], 'args', 'kw', (2,))
    assert getargspec(_g) == ([], None, None, None)
    assert getargspec(_C().method) == (['self', 'x', 'y'], None, None, (None,))
    with pytest.raises(ValueError):
        getargspec(lambda x, *, y=1: x)
    with pytest.raises(ValueError):
        getargspec(_annotated)


def test_argspec_as_keras_builds_it():
    # keras/utils/generic_utils.py:getargspec
    keras_compat.apply()
    full = inspect.getfullargspec(_f)
    spec = inspect.ArgSpec(args=full.args, varargs=full.varargs, keywords=full.varkw,
                           defaults=full.defaults)
    assert inspect.ArgSpec._fields == ('args', 'varargs', 'keywords', 'defaults')
    assert spec == (['a', 'b'], 'args', 'kw', (2,))
    assert 'b' in spec.args


# --------------------------------------------------------------- h5py 3 strings

class _FakeH5Dict:
    """The part of keras.utils.io_utils.H5Dict the patch relies on."""

    def __init__(self, data):
        self.data = data

    def __getitem__(self, attr):
        return ('original', attr)


def _patched_io_utils():
    module = types.ModuleType('fake_io_utils')
    module.H5Dict = type('H5Dict', (_FakeH5Dict,), {})
    keras_compat._patch_io_utils(module)
    keras_compat._patch_io_utils(module)  # idempotent
    return module


def test_h5dict_attributes_come_back_as_h5py_2_gave_them(tmp_path):
    # h5py 2: fixed-length and variable-length ASCII strings (what h5py writes for
    # bytes) read as bytes, variable-length UTF-8 ones (what it writes for str) as str
    h5py = pytest.importorskip('h5py')
    H5Dict = _patched_io_utils().H5Dict
    with h5py.File(tmp_path / 'a.h5', 'w') as f:
        f.attrs['scalar'] = b'{"a": 1}'                        # h5py 3 stores it variable-length
        f.attrs['names'] = [b'dense_1', b'dense_2']           # list of bytes: variable-length
        f.attrs['fixed'] = np.array([b'w0', b'w1'])            # 'S' array: fixed-length
        f.attrs['one'] = np.bytes_(b'2.2.5')                   # as h5py 2 wrote scalars
        f.attrs['raw'] = b'a\xffz'                             # not UTF-8
        f.attrs['text'] = 'abcd'
        f.attrs['texts'] = ['dense_1', 'd\u00e9nse']
        f.attrs['number'] = 3
        f.attrs['empty'] = []                                  # a layer without weights
        f.create_group('grp')
    with h5py.File(tmp_path / 'a.h5', 'r') as f:
        d = H5Dict(f)
        assert d['scalar'] == b'{"a": 1}' and type(d['scalar']) is bytes
        assert d['names'] == [b'dense_1', b'dense_2']
        assert d['fixed'] == [b'w0', b'w1'] and type(d['fixed'][0]) is bytes
        assert d['one'] == b'2.2.5' and type(d['one']) is bytes
        assert d['raw'] == b'a\xffz'
        assert d['text'] == 'abcd' and type(d['text']) is str
        assert d['texts'] == ['dense_1', 'd\u00e9nse']
        assert d['number'] == 3
        assert isinstance(d['empty'], np.ndarray) and d['empty'].size == 0
        assert d['grp'] == ('original', 'grp')
    assert H5Dict({'scalar': 'x'})['scalar'] == ('original', 'scalar')


def _fake_saving(h5py):
    """keras.engine.saving's loaders and H5Dict, reduced to their attribute reads."""
    module = types.ModuleType('fake_saving')

    class H5Dict:
        def __init__(self, data):
            self.data = data

        def __getitem__(self, attr):
            value = self.data[attr]
            return H5Dict(value) if isinstance(value, h5py.Group) else value[()]

        def __contains__(self, key):
            return key in self.data or key in self.data.attrs

    def load_attributes_from_hdf5_group(group, name):
        return [n.decode('utf8') for n in group.attrs[name]]

    def load_weights_from_hdf5_group(f, layers, reshape=False):
        version = f.attrs['keras_version'].decode('utf8')
        backend = f.attrs['backend'].decode('utf8') if 'backend' in f.attrs else None
        names = module.load_attributes_from_hdf5_group(f, 'layer_names')
        weights = [module.load_attributes_from_hdf5_group(f[n], 'weight_names')
                   for n in names]
        return version, backend, names, weights, layers, reshape

    def _deserialize_model(h5dict, custom_objects=None, compile=True):
        config = h5dict['model_config'].decode('utf-8')
        weights = h5dict['model_weights']
        version = weights['keras_version'].decode('utf8')
        names = weights['layer_names']
        weight_names = [weights[n]['weight_names'] for n in names]
        training = h5dict.get('training_config').decode('utf-8')
        missing = h5dict.get('missing', 'default')
        optimizer = [n.decode('utf8') for n in h5dict['optimizer_weights']['weight_names']]
        return (config, version, names, weight_names, training, missing, optimizer,
                custom_objects, compile)

    module.H5Dict = H5Dict
    module.load_attributes_from_hdf5_group = load_attributes_from_hdf5_group
    module.load_weights_from_hdf5_group = load_weights_from_hdf5_group
    module.load_weights_from_hdf5_group_by_name = load_weights_from_hdf5_group
    module._deserialize_model = _deserialize_model
    keras_compat._patch_io_utils(module)
    keras_compat._patch_saving(module)
    keras_compat._patch_saving(module)  # idempotent
    return module


@pytest.mark.parametrize('style', ['h5py3', 'h5py2', 'str'])
def test_saving_loaders_accept_str_and_bytes_attributes(tmp_path, style):
    # h5py3: Keras 2.2.5's bytes as h5py 3 stores them (variable-length ASCII);
    # h5py2: fixed-length, as h5py 2 stored lists; str: variable-length UTF-8
    h5py = pytest.importorskip('h5py')
    saving = _fake_saving(h5py)

    def string(value):
        return {'h5py3': value, 'h5py2': np.bytes_(value), 'str': value.decode()}[style]

    def strings(values):
        return {'h5py3': list(values), 'h5py2': np.array(values),
                'str': [v.decode() for v in values]}[style]

    with h5py.File(tmp_path / 'w.h5', 'w') as f:
        f.attrs['keras_version'] = string(b'2.2.5')
        f.attrs['backend'] = string(b'numbackend')
        f.attrs['layer_names'] = strings([b'd1', b'd2'])
        f.create_group('d1').attrs['weight_names'] = strings([b'd1/kernel:0', b'd1/bias:0'])
        g = f.create_group('d2')
        g.attrs['weight_names0'] = strings([b'd2/kernel:0'])   # chunked, as Keras splits
        g.attrs['weight_names1'] = strings([b'd2/bias:0'])     # attributes over 64 KB
        f.attrs['model_config'] = string(b'{"class_name": "Model"}')
        f.attrs['training_config'] = string(b'{"loss": "mse"}')
        f.create_group('model_weights').attrs.update(
            {'keras_version': string(b'2.2.5'), 'layer_names': strings([b'd1'])})
        f['model_weights'].create_group('d1').attrs['weight_names'] = strings([b'd1/kernel:0'])
        f.create_group('optimizer_weights').attrs['weight_names'] = strings([b'Adam/lr:0'])
    with h5py.File(tmp_path / 'w.h5', 'r') as f:
        for load in (saving.load_weights_from_hdf5_group,
                     saving.load_weights_from_hdf5_group_by_name):
            assert load(f, ['L'], reshape=True) == (
                '2.2.5', 'numbackend', ['d1', 'd2'],
                [['d1/kernel:0', 'd1/bias:0'], ['d2/kernel:0', 'd2/bias:0']], ['L'], True)
        assert saving.load_attributes_from_hdf5_group(f, 'missing') == []
        assert saving._deserialize_model(saving.H5Dict(f), {'a': 1}, compile=False) == (
            '{"class_name": "Model"}', '2.2.5', [b'd1'], [[b'd1/kernel:0']], '{"loss": "mse"}',
            'default', ['Adam/lr:0'], {'a': 1}, False)


def test_patch_runs_when_module_is_imported_later(tmp_path, monkeypatch):
    (tmp_path / 'nbc_late_module.py').write_text('VALUE = 1\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'nbc_late_module', raising=False)
    seen = []

    def patch(module):
        seen.append(module.VALUE)
        module.VALUE = 2

    monkeypatch.setattr(keras_compat, '_MODULE_PATCHES',
                        dict(keras_compat._MODULE_PATCHES, nbc_late_module=patch))
    keras_compat.apply()
    keras_compat.apply()
    assert keras_compat._FINDER in sys.meta_path
    import nbc_late_module
    assert seen == [1] and nbc_late_module.VALUE == 2
    assert 'nbc_late_module' not in keras_compat._FINDER.pending
    monkeypatch.delitem(sys.modules, 'nbc_late_module')


# ------------------------------------------------- Keras 2.2.5 itself, with a stub backend

_KERAS = importlib.util.find_spec('keras')

_SCRIPT = """
import sys
import numpy as np
if sys.argv[1] == 'first':
    from numbackend import keras_compat
    keras_compat.apply()
import keras
import keras.engine.saving as saving
from keras.utils.io_utils import H5Dict
ok = []
keras.callbacks.ModelCheckpoint('unused.h5')
keras.callbacks.ReduceLROnPlateau()
cb = keras.callbacks.EarlyStopping()
cb.on_train_begin()
ok.append(cb.best == np.inf)
ok.append(keras.preprocessing.sequence.pad_sequences([[1, 2], [3]], maxlen=3).tolist()
          == [[0, 1, 2], [0, 0, 3]])
ok.append(keras.utils.generic_utils.getargspec(lambda a, b=1: 0).args == ['a', 'b'])
ok.append(keras.engine.training_utils.should_run_validation([1, 3], 2) is True)
import h5py
with h5py.File(sys.argv[2], 'w') as f:
    d = H5Dict(f)
    d['model_config'] = b'{"x": 1}'
    d['layer_names'] = [b'd1', b'd2']
    saving.save_attributes_to_hdf5_group(f.create_group('g'), 'weight_names', [b'w:0'])
with h5py.File(sys.argv[2], 'r') as f:
    d = H5Dict(f, mode='r')
    ok.append(d['model_config'].decode('utf-8') == '{"x": 1}')
    ok.append([n.decode('utf8') for n in d['layer_names']] == ['d1', 'd2'])
    ok.append(saving.load_attributes_from_hdf5_group(f['g'], 'weight_names') == ['w:0'])
print(ok)
"""


@pytest.mark.skipif(_KERAS is None, reason='keras 2.2.5 is not installed')
@pytest.mark.parametrize('order', ['backend', 'first'])
def test_keras_loads_and_runs_with_a_stub_backend(tmp_path, order):
    pytest.importorskip('h5py')
    init = os.path.join(_KERAS.submodule_search_locations[0], 'backend', '__init__.py')
    with open(init) as f:
        names = sorted(set(re.findall(r'from \.load_backend import (\w+)', f.read())))
    lines = [f'def {n}(*args, **kwargs):\n    raise NotImplementedError({n!r})\n'
             for n in names + ['placeholder', 'variable', 'function']]
    if order == 'backend':
        lines.insert(0, 'from numbackend import keras_compat\nkeras_compat.apply()\n')
    (tmp_path / 'nbc_stub_backend.py').write_text('\n'.join(lines))
    (tmp_path / 'script.py').write_text(textwrap.dedent(_SCRIPT))
    root = os.path.dirname(os.path.dirname(os.path.abspath(keras_compat.__file__)))
    env = dict(os.environ, KERAS_BACKEND='nbc_stub_backend', KERAS_HOME=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    out = subprocess.run([sys.executable, str(tmp_path / 'script.py'), order,
                          str(tmp_path / 'd.h5')], check=False, cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == str([True] * 7)


# ------------------------------------------------------- Keras 2.2.5 with numbackend

def _run_with_numbackend(tmp_path, script, *args):
    """Runs ``script`` in a new process where Keras loads numbackend; its last line of output."""
    (tmp_path / 'script.py').write_text(textwrap.dedent(script))
    root = os.path.dirname(os.path.dirname(os.path.abspath(keras_compat.__file__)))
    env = dict(os.environ, KERAS_BACKEND='numbackend', KERAS_HOME=str(tmp_path),
               PYTHONPATH=root)
    out = subprocess.run([sys.executable, str(tmp_path / 'script.py'), *map(str, args)],
                         check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


_NESTED_SAVE = """
import json, sys
import numpy as np
from keras.layers import Dense, Input
from keras.models import Model, Sequential

inner = Sequential([Dense(4, input_shape=(3,), activation='tanh'), Dense(2)], name='inner')
x = Input((3,))
outer = Model(x, Dense(1)(inner(x)))
outer.compile('adam', 'mse')
rng = np.random.RandomState(0)
data = rng.rand(5, 3).astype('float32')
outer.train_on_batch(data, rng.rand(5, 1).astype('float32'))
got = outer.predict(data)
w1, b1, w2, b2, w3, b3 = outer.get_weights()
want = (np.tanh(data @ w1 + b1) @ w2 + b2) @ w3 + b3
outer.save(sys.argv[1])
np.save(sys.argv[2], np.stack([data[:, 0], got[:, 0]]))
np.save(sys.argv[3], data)
print(json.dumps({'error': float(np.abs(got - want).max()),
                  'inner': [w.name for w in inner.weights],
                  'outer': [w.name for w in outer.weights],
                  'optimizer': [w.name for w in outer.optimizer.weights]}))
"""

_NESTED_LOAD = """
import json, sys
import h5py
import numpy as np
from keras import backend as K
from keras.models import load_model

def rewrite_strings_as_str(group):
    # as h5py 3 writes str: variable-length UTF-8, which h5py 2 read as str
    for name, value in list(group.attrs.items()):
        if isinstance(value, (bytes, str)):
            group.attrs[name] = value if isinstance(value, str) else value.decode()
        elif isinstance(value, np.ndarray) and value.dtype.kind in 'SO':
            group.attrs[name] = [v if isinstance(v, str) else v.decode() for v in value]
    for item in group.values():
        if isinstance(item, h5py.Group):
            rewrite_strings_as_str(item)

path, data = sys.argv[1], np.load(sys.argv[3])
want = np.load(sys.argv[2])[1]
errors = []
model = load_model(path)
errors.append(float(np.abs(model.predict(data)[:, 0] - want).max()))
iterations = int(K.get_value(model.optimizer.iterations))
with h5py.File(path, 'r+') as f:
    rewrite_strings_as_str(f)
model = load_model(path)
errors.append(float(np.abs(model.predict(data)[:, 0] - want).max()))
for by_name in (False, True):
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(path, by_name=by_name)
    errors.append(float(np.abs(model.predict(data)[:, 0] - want).max()))
print(json.dumps({'errors': errors, 'iterations': iterations}))
"""


@pytest.mark.skipif(_KERAS is None, reason='keras 2.2.5 is not installed')
def test_nested_model_saves_and_loads_in_a_new_process(tmp_path):
    # a model used as a layer: its weights are named '<layer>/kernel:0' as with
    # TensorFlow, so they no longer collide in the nested model's HDF5 group
    pytest.importorskip('h5py')
    files = [tmp_path / 'm.h5', tmp_path / 'predictions.npy', tmp_path / 'data.npy']
    saved = json.loads(_run_with_numbackend(tmp_path, _NESTED_SAVE, *files))
    dense = ['dense_1/kernel:0', 'dense_1/bias:0', 'dense_2/kernel:0', 'dense_2/bias:0']
    assert saved['error'] < 1e-5
    assert saved['inner'] == dense
    assert saved['outer'] == dense + ['dense_3/kernel:0', 'dense_3/bias:0']
    assert saved['optimizer'] == ['Adam/iterations:0'] + [
        'training/Adam/Variable:0'] + [f'training/Adam/Variable_{i}:0' for i in range(1, 18)]
    loaded = json.loads(_run_with_numbackend(tmp_path, _NESTED_LOAD, *files))
    assert loaded['iterations'] == 1
    assert len(loaded['errors']) == 4 and max(loaded['errors']) < 1e-6


_STREAMS = """
import io, json, pickle, sys
import h5py
import numpy as np
from keras.layers import Dense
from keras.models import Sequential, load_model, save_model

model = Sequential([Dense(3, input_shape=(2,), activation='relu'), Dense(1)])
model.compile('sgd', 'mse')
data = np.random.RandomState(0).rand(4, 2).astype('float32')
w1, b1, w2, b2 = model.get_weights()
want = np.maximum(data @ w1 + b1, 0) @ w2 + b2

def error(loaded):
    return float(np.abs(loaded.predict(data) - want).max())

errors = {'model': error(model)}
stream = io.BytesIO()
save_model(model, stream)
stream.seek(0)
errors['bytes_io'] = error(load_model(stream))
with open(sys.argv[1], 'wb') as raw:
    save_model(model, raw)
with open(sys.argv[1], 'rb') as raw:
    errors['binary_file'] = error(load_model(raw))
with h5py.File(sys.argv[1], 'w') as f:
    save_model(model, f)
    errors['h5py_file'] = error(load_model(f))
with h5py.File(sys.argv[1], 'w') as f:
    save_model(model, f.create_group('model'))
    errors['h5py_group'] = error(load_model(f['model']))
errors['pickle'] = error(pickle.loads(pickle.dumps(model)))
print(json.dumps(errors))
"""


@pytest.mark.skipif(_KERAS is None, reason='keras 2.2.5 is not installed')
def test_model_saves_to_streams_groups_and_pickles(tmp_path):
    # h5py 3 opens files read-only by default: Keras 2.2.5's in-memory file for a
    # stream could not be created
    pytest.importorskip('h5py')
    errors = json.loads(_run_with_numbackend(tmp_path, _STREAMS, tmp_path / 'm.h5'))
    assert sorted(errors) == ['binary_file', 'bytes_io', 'h5py_file', 'h5py_group', 'model',
                              'pickle']
    assert max(errors.values()) < 1e-6


_CLEAR_SESSION = """
import json
import numbackend
from keras import backend as K
from keras.layers import Dense, Input
from keras.models import Model

def build():
    x = Input((2,))
    return Model(x, Dense(1)(x))

first = build()
K.clear_session()
second = build()
print(json.dumps({'ours': K.clear_session is numbackend.clear_session,
                  'layers': [[layer.name for layer in m.layers] for m in (first, second)],
                  'weights': [[w.name for w in m.weights] for m in (first, second)]}))
"""


@pytest.mark.skipif(_KERAS is None, reason='keras 2.2.5 is not installed')
def test_clear_session_through_keras_backend_restarts_names(tmp_path):
    report = json.loads(_run_with_numbackend(tmp_path, _CLEAR_SESSION))
    assert report == {'ours': True, 'layers': [['input_1', 'dense_1']] * 2,
                      'weights': [['dense_1/kernel:0', 'dense_1/bias:0']] * 2}


_LAMBDA = """
import json
import numpy as np
from keras import backend as K
from keras.layers import Dense, Input, Lambda
from keras.models import Model

x = Input((4,))
total = Lambda(lambda t: K.sum(t, axis=-1, keepdims=True))
y = Dense(3)(total(x))
a, b = Input((2,)), Input((3,))
joined = Lambda(lambda ts: K.concatenate(ts, axis=-1))
z = Dense(2)(joined([a, b]))
model = Model([x, a, b], [y, z])
rng = np.random.RandomState(0)
xs = [rng.rand(5, n).astype('float32') for n in (4, 2, 3)]
got_y, got_z = model.predict(xs)
w1, b1, w2, b2 = model.get_weights()
want_y = xs[0].sum(axis=-1, keepdims=True) @ w1 + b1
want_z = np.concatenate(xs[1:], axis=-1) @ w2 + b2
print(json.dumps({'shapes': [total.output_shape, joined.output_shape, w1.shape, w2.shape],
                  'error': max(float(np.abs(got_y - want_y).max()),
                               float(np.abs(got_z - want_z).max()))}))
"""


@pytest.mark.skipif(_KERAS is None, reason='keras 2.2.5 is not installed')
def test_lambda_without_output_shape_infers_it(tmp_path):
    # Keras 2.2.5 infers it only for TensorFlow and CNTK; otherwise the next layer
    # was built for the Lambda's input shape
    report = json.loads(_run_with_numbackend(tmp_path, _LAMBDA))
    assert report['shapes'] == [[None, 1], [None, 5], [1, 3], [5, 2]]
    assert report['error'] < 1e-5
