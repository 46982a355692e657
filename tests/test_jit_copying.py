"""jit_kernels.copying.copy_into against NumPy's assignment, and the kernels that
must copy through it rather than by a slice assignment."""
import inspect

import numpy as np
import pytest

from jit_kernels import copying, direct, packed, winograd
from tests.source_checks import slice_assignments


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 2), (0, 4), (3, 0)])
def test_copy_into_copies_every_item(dtype, shape):
    src = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) * 3 + 1
    dst = np.full(shape, -9, dtype)
    copying.copy_into(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_copy_into_reads_and_writes_strided_views_and_leaves_the_rest():
    whole = np.zeros((4, 6, 5))
    src = np.arange(60.0).reshape(6, 10)[1::2, ::2]  # (3, 5), neither contiguous
    want = whole.copy()
    want[2, 1:4] = src
    copying.copy_into(whole[2, 1:4], src)
    np.testing.assert_array_equal(whole, want)
    columns = np.zeros((5, 8))
    want = columns.copy()
    want[:, ::3] = np.ones((5, 3)) * 2
    copying.copy_into(columns[:, ::3], np.ones((5, 3)) * 2)
    np.testing.assert_array_equal(columns, want)


def test_copy_into_refuses_other_shapes_rather_than_broadcasting():
    dst = np.zeros((2, 3))
    with pytest.raises(ValueError, match="copy_into: the arrays differ in shape"):
        copying.copy_into(dst, np.ones((1, 3)))
    assert not dst.any()


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_a_steps_rows_are_read_and_written_as_numpy_slices_them(dtype):
    sequence = (np.arange(5 * 6 * 3).reshape(5, 6, 3) % 4).astype(dtype)
    np.testing.assert_array_equal(copying.step_rows(sequence, 3, 1, 4), sequence[3, 1:4])
    np.testing.assert_array_equal(copying.step_rows(sequence, 0, 2, 99), sequence[0, 2:])
    stacked = np.zeros((5, 6, 3), dtype)
    value = np.ones((3, 3), dtype)
    want = stacked.copy()
    want[2, 1:4] = value
    copying.copy_step(stacked, 2, 1, 4, value)
    np.testing.assert_array_equal(stacked, want)
    with pytest.raises(ValueError, match="differ in shape"):
        copying.copy_step(stacked, 2, 1, 3, value)


def test_slice_assignments_are_found():
    assert slice_assignments("a[t, lo:hi] = v\nb[0] = 1\nc[:] = d\n") == [
        "a[t, lo:hi] = v", "c[:] = d"]


@pytest.mark.parametrize("module", [packed, winograd, direct])
def test_compiled_kernels_assign_no_array_to_a_slice(module):
    for name, function in vars(module).items():
        py_func = getattr(function, "py_func", None)
        if py_func is not None and py_func.__module__ == module.__name__:
            assert slice_assignments(inspect.getsource(py_func)) == [], name
