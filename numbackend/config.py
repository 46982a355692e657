"""Configuration: keras.json, floatx, epsilon, image layout.

The file lives in ``$KERAS_HOME/keras.json`` or ``~/.keras/keras.json`` (in
``/tmp/.keras`` when the home folder is read-only, as Keras does) and is
created with the defaults when missing.  When Keras 2.2.5 loads numbackend
it keeps these settings in ``keras.backend.common``; ``floatx()`` and
``epsilon()`` then read them from there so that both agree.
"""
import contextlib
import json
import os
import sys
import tempfile

import numpy as np

_DEFAULTS = {
    "epsilon": 1e-07,
    "floatx": "float32",
    "image_dim_ordering": "tf",
    "image_data_format": "channels_last",
    "backend": "numbackend",
}
_FLOAT_TYPES = ("float16", "float32", "float64")
_DATA_FORMATS = ("channels_last", "channels_first")
_DIM_ORDERINGS = {"tf": "channels_last", "th": "channels_first"}

_settings = dict(_DEFAULTS)


def keras_dir():
    """The folder that holds keras.json."""
    if "KERAS_HOME" in os.environ:
        return os.environ["KERAS_HOME"]
    home = os.path.expanduser("~")
    if not os.access(home, os.W_OK):
        home = "/tmp"
    return os.path.join(home, ".keras")


def config_path():
    return os.path.join(keras_dir(), "keras.json")


def load_config():
    """Read keras.json (creating it with the defaults when missing) into the settings."""
    path = config_path()
    if os.path.exists(path):
        try:
            with open(path) as f:
                loaded = json.load(f)
            if not isinstance(loaded, dict):
                raise TypeError("top level is not a JSON object")
        except (ValueError, TypeError, OSError) as exc:
            raise ValueError(f"numbackend: cannot read Keras config file {path}: {exc}") from None
        settings = dict(_DEFAULTS)
        settings.update(loaded)
        if settings["floatx"] not in _FLOAT_TYPES:
            raise ValueError(f"numbackend: {path}: floatx must be one of {_FLOAT_TYPES}, "
                             f"got {settings['floatx']!r}")
        if settings["image_data_format"] not in _DATA_FORMATS:
            raise ValueError(f"numbackend: {path}: image_data_format must be one of "
                             f"{_DATA_FORMATS}, got {settings['image_data_format']!r}")
        if not isinstance(settings["epsilon"], (int, float)):
            raise ValueError(f"numbackend: {path}: epsilon must be a number")
        settings["epsilon"] = float(settings["epsilon"])
        if "image_data_format" not in loaded and settings.get("image_dim_ordering") in _DIM_ORDERINGS:
            settings["image_data_format"] = _DIM_ORDERINGS[settings["image_dim_ordering"]]
        _settings.update(settings)
    else:
        try:
            os.makedirs(keras_dir(), exist_ok=True)
            _create_whole(path, json.dumps(_DEFAULTS, indent=4))
        except OSError:
            pass  # a read-only home is fine: the defaults stand


def _create_whole(path, text):
    """Create the file ``path`` holding ``text``, where it does not exist: written
    under another name, then linked to ``path``, so that another process reading
    it (several starting at once) or a full disk never leaves or sees part of it,
    and a file another process made in the meantime is kept."""
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".keras.json.",
                                             suffix=".tmp")
    os.close(descriptor)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)  # as open() would have made it
        with open(temporary, "w") as f:
            f.write(text)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.remove(temporary)


def _keras_common():
    """Keras 2.2.5's own settings module, when Keras is the one loading us."""
    return sys.modules.get("keras.backend.common")


def epsilon():
    """The fuzz factor used in numeric expressions (default 1e-7)."""
    common = _keras_common()
    return common.epsilon() if common is not None else _settings["epsilon"]


def set_epsilon(e):
    """Set the fuzz factor used in numeric expressions."""
    _settings["epsilon"] = float(e)
    common = _keras_common()
    if common is not None:
        common.set_epsilon(e)


def floatx():
    """The default float type, as a string ('float16', 'float32' or 'float64')."""
    common = _keras_common()
    return common.floatx() if common is not None else _settings["floatx"]


def set_floatx(value):
    """Set the default float type: 'float16', 'float32' or 'float64'."""
    if value not in _FLOAT_TYPES:
        raise ValueError(f"set_floatx: unknown floatx type {value!r}; expected one of {_FLOAT_TYPES}")
    _settings["floatx"] = str(value)
    common = _keras_common()
    if common is not None:
        common.set_floatx(value)


def cast_to_floatx(x):
    """Cast a NumPy array (or scalar) to the default float type; returns a NumPy array."""
    return np.asarray(x, dtype=floatx())


def image_data_format():
    """'channels_last' or 'channels_first'."""
    common = _keras_common()
    return common.image_data_format() if common is not None else _settings["image_data_format"]


def set_image_data_format(data_format):
    """Set the image layout: 'channels_last' or 'channels_first'."""
    if data_format not in _DATA_FORMATS:
        raise ValueError(f"set_image_data_format: unknown data_format {data_format!r}; "
                         f"expected one of {_DATA_FORMATS}")
    _settings["image_data_format"] = str(data_format)
    _settings["image_dim_ordering"] = "tf" if data_format == "channels_last" else "th"
    common = _keras_common()
    if common is not None:
        common.set_image_data_format(data_format)


def image_dim_ordering():
    """Keras 1 spelling of the image layout: 'tf' (channels last) or 'th' (channels first)."""
    return "tf" if image_data_format() == "channels_last" else "th"


def set_image_dim_ordering(dim_ordering):
    """Keras 1 setter of the image layout: 'tf' or 'th'."""
    if dim_ordering not in _DIM_ORDERINGS:
        raise ValueError(f"set_image_dim_ordering: unknown dim_ordering {dim_ordering!r}; "
                         "expected 'tf' or 'th'")
    set_image_data_format(_DIM_ORDERINGS[dim_ordering])


def normalize_data_format(value):
    """Accept 'channels_first'/'channels_last', the Keras 1 'th'/'tf', or None (the default)."""
    if value is None:
        return image_data_format()
    value = str(value).lower()
    if value in _DIM_ORDERINGS:
        return _DIM_ORDERINGS[value]
    if value not in _DATA_FORMATS:
        raise ValueError(f"data_format must be 'channels_first' or 'channels_last' "
                         f"(or 'th'/'tf'), got {value!r}")
    return value


def backend():
    """The name of this backend: 'numbackend'."""
    return "numbackend"
