"""jit_kernels.parts: compiled parts run on OpenBLAS's threads or one after another."""
import numpy as np
import pytest

from jit_kernels import blas, parts


def _fill_row(d):
    """Row d[1] of the (d[2], d[3]) float64 matrix at d[0] gets d[1] + 0.5 in every column."""
    out = parts.array_at(d[0], (d[2], d[3]), np.float64)
    for j in range(d[3]):
        out[d[1], j] = d[1] + 0.5


_fill_row_part = parts.compiled_part(_fill_row)


@pytest.mark.parametrize('count', [1, 2, 3])
@pytest.mark.parametrize('threads', [1, 2])
def test_parts_run_every_row_once(monkeypatch, count, threads):
    """Each descriptor row runs once, on the pool where it has as many threads
    as rows, else one after another (3 rows on 2 threads, or on 1)."""
    if threads > blas.threads():
        pytest.skip("OpenBLAS has fewer threads here")
    monkeypatch.setattr(blas, 'threads', lambda: threads)
    out = np.zeros((count, 5))
    descriptors = [[out.ctypes.data, i, count, 5] for i in range(count)]
    parts.run(_fill_row_part, np.array(descriptors, np.int64))
    np.testing.assert_array_equal(out, np.arange(count)[:, None] + np.full((count, 5), 0.5))
