"""numbackend's tuning entries: this name is jit_kernels.tuning itself (one
module for both packages, which jit_kernels may import and numbackend may
not be imported by).  See that module's docstring."""
import sys

from jit_kernels import tuning as _tuning

sys.modules[__name__] = _tuning
