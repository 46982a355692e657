"""jit_kernels' tuning entries: each says its unit, where its value comes from
and why it exists; pins list the decision they fix; overrides reach the code."""
import numpy as np
import pytest

from jit_kernels import tuning

JIT_PREFIXES = ("LIBRARY_", "CONV_", "PACKED_", "PARTS_")


def test_every_jit_kernels_entry_is_described():
    entries = [e for e in tuning.entries() if e.name.startswith(JIT_PREFIXES)]
    assert len(entries) >= 19
    for entry in entries:
        assert entry.unit and entry.source and entry.why, entry.name
    assert {e.name for e in entries if e.decides} >= {"CONV_PATH", "PARTS_LATE_START_NS", "PARTS_LATE_RUNS",
                                                       "PARTS_CONTENDED_SERIAL_NS"}
    assert {e.name for e in entries if e.compiled} == {"PACKED_VECTOR_BYTES", "PACKED_ONE_ROW_PANELS",
                                                       "PACKED_CHUNK_BYTES", "PACKED_BLOCK_BYTES",
                                                       "PARTS_MIN_WORK",
                                                       "PARTS_LATE_START_NS", "PARTS_LATE_RUNS",
                                                       "PARTS_CONTENDED_SERIAL_NS"}


def test_entries_compiled_into_kernels_refuse_an_override():
    with pytest.raises(ValueError, match="NUMBACKEND_TUNE_PACKED_BLOCK_BYTES"), \
            tuning.override(PACKED_BLOCK_BYTES=8):
        pass


def test_an_override_of_the_column_chunk_reaches_im2col(monkeypatch):
    """CONV_COLUMN_CHUNK_BYTES is read when im2col chunks a batch: at 1 byte,
    one image a chunk, the same values."""
    from jit_kernels import columns, conv
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((3, 6, 7, 4)), rng.standard_normal((3, 3, 4, 8))
    with tuning.override(CONV_PATH="columns"):
        whole = conv.conv_forward(x, w)
        copies = []
        fill = columns.fill_columns
        monkeypatch.setattr(columns, "fill_columns", lambda *a: copies.append(a[2].shape[0]) or fill(*a))
        with tuning.override(CONV_COLUMN_CHUNK_BYTES=1):
            chunked = conv.conv_forward(x, w)
    assert copies == [4 * 5] * 3
    np.testing.assert_allclose(chunked, whole, rtol=1e-13, atol=1e-13)
