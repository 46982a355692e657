"""numbackend.config: keras.json, floatx, epsilon, image layout, backend name, learning phase."""
import errno
import json
import os
import sys
import types

import numpy as np
import pytest

import numbackend as K
from numbackend import config, core

DEFAULTS = {"epsilon": 1e-07, "floatx": "float32", "image_dim_ordering": "tf",
            "image_data_format": "channels_last", "backend": "numbackend"}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """Each test sees its own KERAS_HOME, settings, learning phase and no Keras."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setattr(config, "_settings", dict(config._DEFAULTS))
    monkeypatch.setattr(core, "_fixed_learning_phase", None)
    monkeypatch.delitem(sys.modules, "keras.backend.common", raising=False)


def write_config(tmp_path, text):
    folder = tmp_path / "keras_home"
    folder.mkdir(exist_ok=True)
    path = folder / "keras.json"
    path.write_text(text)
    return path


def test_load_config_creates_the_file(tmp_path):
    path = tmp_path / "keras_home" / "keras.json"
    assert config.config_path() == str(path)
    config.load_config()
    assert json.loads(path.read_text()) == DEFAULTS
    assert K.floatx() == "float32" and K.epsilon() == 1e-7


def test_a_keras_json_cut_short_by_a_full_disk_is_never_left(tmp_path, monkeypatch):
    # keras.json was written in place: a full disk (or a process starting at the
    # same time, reading it) left half of it, and every later import failed
    class FullDisk:
        def __init__(self, file):
            self.file = file

        def write(self, data):
            self.file.write(data[:len(data) // 2])
            self.file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        opened = open(file, mode, *args, **kwargs)  # noqa: SIM115 - closed by FullDisk
        return opened if "r" in mode else FullDisk(opened)

    with monkeypatch.context() as patched:
        patched.setattr(config, "open", open_on_a_full_disk, raising=False)
        config.load_config()  # the defaults stand
    assert not (tmp_path / "keras_home" / "keras.json").exists()
    assert os.listdir(tmp_path / "keras_home") == []
    config.load_config()
    assert json.loads((tmp_path / "keras_home" / "keras.json").read_text()) == DEFAULTS


def test_load_config_reads_the_file(tmp_path):
    write_config(tmp_path, json.dumps({"epsilon": 1e-5, "floatx": "float64",
                                       "image_data_format": "channels_first"}))
    config.load_config()
    assert K.floatx() == "float64"
    assert K.epsilon() == 1e-5
    assert K.image_data_format() == "channels_first"
    assert K.image_dim_ordering() == "th"


def test_keras1_file_sets_the_data_format(tmp_path):
    write_config(tmp_path, json.dumps({"image_dim_ordering": "th", "backend": "numbackend"}))
    config.load_config()
    assert K.image_data_format() == "channels_first"


def test_home_folder_without_keras_home(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    config.load_config()
    assert (tmp_path / "home" / ".keras" / "keras.json").exists()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"floatx": "int8"}',
                                  '{"image_data_format": "sideways"}', '{"epsilon": "small"}'])
def test_bad_file_error_names_it(tmp_path, text):
    path = write_config(tmp_path, text)
    with pytest.raises(ValueError) as info:
        config.load_config()
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value", ["float16", "float32", "float64"])
def test_floatx_round_trip(value):
    K.set_floatx(value)
    assert K.floatx() == value
    out = K.cast_to_floatx([1, 2])
    assert isinstance(out, np.ndarray) and out.dtype == value
    np.testing.assert_array_equal(out, [1, 2])


def test_floatx_is_the_default_dtype():
    K.set_floatx("float64")
    assert K.variable([1.0]).dtype == "float64"
    assert K.placeholder((2,)).dtype == "float64"


@pytest.mark.parametrize("value", ["int32", "float128", "double", None])
def test_set_floatx_rejects_bad_values(value):
    with pytest.raises(ValueError):
        K.set_floatx(value)
    assert K.floatx() == "float32"


def test_epsilon_round_trip():
    K.set_epsilon(1e-4)
    assert K.epsilon() == 1e-4
    K.set_epsilon(5)
    assert K.epsilon() == 5.0 and isinstance(K.epsilon(), float)


def test_image_data_format_round_trip():
    K.set_image_data_format("channels_first")
    assert K.image_data_format() == "channels_first"
    assert K.image_dim_ordering() == "th"
    K.set_image_data_format("channels_last")
    assert (K.image_data_format(), K.image_dim_ordering()) == ("channels_last", "tf")
    with pytest.raises(ValueError):
        K.set_image_data_format("th")
    assert K.image_data_format() == "channels_last"


def test_image_dim_ordering_round_trip():
    K.set_image_dim_ordering("th")
    assert (K.image_dim_ordering(), K.image_data_format()) == ("th", "channels_first")
    K.set_image_dim_ordering("tf")
    assert (K.image_dim_ordering(), K.image_data_format()) == ("tf", "channels_last")
    with pytest.raises(ValueError):
        K.set_image_dim_ordering("channels_first")


def test_normalize_data_format():
    assert K.normalize_data_format(None) == "channels_last"
    assert K.normalize_data_format("th") == "channels_first"
    assert K.normalize_data_format("TF") == "channels_last"
    assert K.normalize_data_format("Channels_First") == "channels_first"
    with pytest.raises(ValueError):
        K.normalize_data_format("nchw")


def test_settings_follow_keras_when_keras_loads_the_backend(monkeypatch):
    state = {"floatx": "float16", "epsilon": 1e-3, "image_data_format": "channels_first"}
    common = types.SimpleNamespace(
        floatx=lambda: state["floatx"], epsilon=lambda: state["epsilon"],
        image_data_format=lambda: state["image_data_format"],
        set_floatx=lambda v: state.update(floatx=v), set_epsilon=lambda v: state.update(epsilon=v),
        set_image_data_format=lambda v: state.update(image_data_format=v))
    monkeypatch.setitem(sys.modules, "keras.backend.common", common)
    assert (K.floatx(), K.epsilon(), K.image_data_format()) == \
        ("float16", 1e-3, "channels_first")
    K.set_floatx("float64")
    K.set_epsilon(1e-6)
    K.set_image_dim_ordering("tf")
    assert state == {"floatx": "float64", "epsilon": 1e-6, "image_data_format": "channels_last"}


def test_backend_name():
    assert K.backend() == "numbackend"


def test_learning_phase_defaults_to_test():
    phase = K.learning_phase()
    assert phase.shape == () and np.dtype(phase.dtype).kind in "biu"
    (value,) = K.function([], [phase + 0])([])
    assert value == 0
    (fed,) = K.function([phase], [phase + 0])([1])
    assert fed == 1


def test_set_learning_phase():
    K.set_learning_phase(1)
    assert K.learning_phase() == 1
    K.set_learning_phase(0)
    assert K.learning_phase() == 0
    for bad in (2, -1, "train"):
        with pytest.raises(ValueError):
            K.set_learning_phase(bad)
    assert K.learning_phase() == 0
