"""asv_bench/packed_sweep.py: its command line, and one run of a chunk size in a
process of its own (each product there checked against NumPy's)."""
import argparse
import os

import pytest

from tests import asv_scripts


@pytest.fixture(scope="module")
def sweep():
    return asv_scripts.load("packed_sweep")


def test_lists_of_whole_numbers_are_read_and_others_refused(sweep):
    assert sweep.numbers("16384,0,65536") == [16384, 0, 65536]
    for text in ("", "1,x", "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            sweep.numbers(text)


def test_a_run_prints_each_product_for_each_chunk_size(sweep, capsys):
    sweep.main(["--chunks", "0,0", "--threads", "1,1000", "--rounds", "1", "--quick"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# 1 thread(s): GFLOP/s, packed / BLAS, float32"
    assert lines[1].split() == ["product", "whole", "k"]  # a size given twice runs once
    rows = lines[2:2 + len(sweep.SHAPES)]
    for (m, k, n), row in zip(sweep.SHAPES, rows):
        assert row.startswith(f"{m}x{k} by {k}x{n}")
        ours, blas = (float(x) for x in row.split()[-3:] if x != "/")
        assert ours > 0 and blas > 0
    assert lines[-1] == "# skipped thread counts [1000]: this process may use " \
        f"{len(os.sched_getaffinity(0))} CPUs"
