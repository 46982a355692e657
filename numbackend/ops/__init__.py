"""The ops: every op numbackend's graphs use is defined once, in this package,
by family: each module registers its ops in ``OPS`` when imported.

- registry: ``Op`` (an op's kind, rules and traits), ``OPS``, ``register``,
  ``apply`` and ``as_tensor`` (building nodes), shape and dtype helpers;
- elementwise: the element-wise ops (one ``elementwise.elementwise`` entry each);
- reductions: reductions with their fused forms, and ops along one axis;
- shape, indexing: reshaping, joining, slicing and gathering;
- linalg: dot and matmul;
- windows, conv, pool: convolution, pooling and resizing;
- ctc, sparse, random, passthrough: CTC, sparse tensors' parts, random draws,
  and the ops that pass a value through;
- scan: a step sub-graph run along axis 0 of its sequences (K.rnn's op);
  its gradient differentiates the step (autodiff passes ``gradients`` in);
- batch: where the batch axis of a value lies, and the ``rows`` rules by
  which ops declare that they keep the rows of a batch apart (an export
  checks its program with them).

Nothing here imports Numba or the jit_kernels kernels until an op runs.
"""
from .. import graph

# importing a family's module registers its ops in OPS
from . import (  # noqa: F401
    conv,
    ctc,
    elementwise,
    indexing,
    linalg,
    passthrough,
    pool,
    random,
    reductions,
    scan,
    shape,
    sparse,
)
from .indexing import getitem, last_axis_window
from .linalg import is_float_matrix_product, merge_sibling_dots
from .reductions import reduction
from .registry import (
    OPS,
    Op,
    apply,
    as_tensor,
    broadcast_shapes,
    contiguous,
    float_dtype,
    is_float,
    library,
    normalize_axes,
    normalize_axis,
    not_differentiable,
    promote_dtype,
    register,
)
from .shape import dim_read_at_run_time, static_int, sum_to_shape
from .windows import check_sweep

# a tensor's operators (x + y, x[key]) build their nodes with these
graph.install_operators(apply, getitem)

__all__ = ["OPS", "Op", "apply", "as_tensor", "broadcast_shapes", "check_sweep", "contiguous",
           "dim_read_at_run_time", "float_dtype", "getitem", "is_float", "is_float_matrix_product",
           "last_axis_window", "library", "merge_sibling_dots", "normalize_axes", "normalize_axis",
           "not_differentiable", "promote_dtype", "reduction", "register", "static_int",
           "sum_to_shape"]
