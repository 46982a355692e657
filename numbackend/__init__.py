"""numbackend: a Keras backend that compiles to native CPU code through Numba.

``import numbackend as K`` gives the whole backend API; Keras 2.2.5 loads it
with ``KERAS_BACKEND=numbackend``.  Keras 1 code can use ``numbackend.keras1``.
Numba itself is imported only when a function is first compiled.
"""
import os as _os

# Numba's OpenMP workers must sleep, not spin, between kernels: spinning threads
# fight OpenBLAS's for the cores, and a matrix product next to a fused kernel
# then runs much slower.  Set before Numba starts its threads.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import cpus as _cpus  # before NumPy and Numba load

_cpus.limit_thread_pools()

from . import keras_compat as _keras_compat

_keras_compat.apply()

from . import autodiff, config, conv, core, ctc, math, nn, random, updates
from . import rnn as _rnn_module  # K.rnn is the function
from .autodiff import *
from .config import (
    backend,
    cast_to_floatx,
    epsilon,
    floatx,
    image_data_format,
    image_dim_ordering,
    normalize_data_format,
    set_epsilon,
    set_floatx,
    set_image_data_format,
    set_image_dim_ordering,
)
from .conv import *
from .core import *
from .ctc import *
from .graph import Tensor, Variable
from .math import *
from .nn import *
from .random import *
from .rnn import *
from .sparse import SparseTensorValue
from .updates import *

config.load_config()

__all__ = [
    "SparseTensorValue", "Tensor", "Variable", "backend", "cast_to_floatx", "epsilon", "floatx",
    "image_data_format", "image_dim_ordering", "normalize_data_format", "set_epsilon",
    "set_floatx", "set_image_data_format", "set_image_dim_ordering",
]
__all__ += autodiff.__all__
__all__ += conv.__all__
__all__ += core.__all__
__all__ += ctc.__all__
__all__ += math.__all__
__all__ += nn.__all__
__all__ += random.__all__
__all__ += _rnn_module.__all__
__all__ += updates.__all__


def __getattr__(name):
    # export (a model as a folder that runs with NumPy alone) and warmup (the
    # library compiled ahead of models) load their modules on first use: they
    # import subprocess, which a process serving a model never needs
    if name == "export":
        from .exporting import export
        return export
    if name == "warmup":
        from .compile_report import warmup
        return warmup
    raise AttributeError(f"module 'numbackend' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), "export", "warmup"])
