"""asv_bench/compare_peers.py's command line: the thread counts it takes, the
environment and CPUs it runs them with, and its scaling table (nothing timed)."""

import pytest

from tests import asv_scripts


@pytest.fixture(scope="module")
def peers():
    return asv_scripts.load("compare_peers")


def test_the_options_of_a_default_run_stay(peers):
    args = peers.parse_args(["--quick", "--no-startup", "--no-models", "--busy-core"])
    assert (args.quick, args.no_startup, args.no_models, args.busy_core) == (True,) * 4
    assert (args.threads, args.pin, args.scaling) == (None, False, None)


def test_scaling_takes_a_list_of_counts_or_the_default_one(peers):
    assert peers.parse_args(["--scaling"]).scaling == [1, 2, 4, 8, 16]
    assert peers.parse_args(["--scaling", "4,1,2,2", "--quick"]).scaling == [1, 2, 4]
    assert peers.parse_args(["--threads", "3", "--pin"]).threads == 3


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--threads", "65"], ["--threads", "two"],
                                  ["--scaling", "1,x"], ["--scaling", "--threads", "2"]])
def test_thread_counts_out_of_range_are_refused(peers, argv, capsys):
    with pytest.raises(SystemExit):
        peers.parse_args(argv)
    assert "thread" in capsys.readouterr().err


def test_counts_above_the_cpus_are_skipped(peers):
    assert peers.scaling_counts([1, 2, 4, 8, 16], 2) == ([1, 2], [4, 8, 16])
    assert peers.scaling_counts([1, 2, 4, 8, 16], 16) == ([1, 2, 4, 8, 16], [])


def test_the_environment_holds_every_library_to_the_count(peers):
    env = peers.thread_environment(4, {"XLA_FLAGS": "--xla_dump_to=/tmp/x "
                                                    "--xla_cpu_multi_thread_eigen=false"})
    for name in ("NUMBACKEND_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "COMPARE_THREADS"):
        assert env[name] == "4"
    assert env["JAX_PLATFORMS"] == "cpu"
    # XLA's own threads are on for more than one thread, its other flags kept
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    one = peers.thread_environment(1, {})
    assert one["OPENBLAS_NUM_THREADS"] == "1"
    assert one["XLA_FLAGS"].split() == ["--xla_cpu_multi_thread_eigen=false",
                                        "intra_op_parallelism_threads=1"]


def test_pinning_takes_the_first_cpus_the_process_may_use(peers):
    assert peers.first_cpus(2, {9, 3, 5}) == [3, 5]
    with pytest.raises(ValueError, match=r"--pin: 4 threads, but this process may use only 2 CPUs"):
        peers.first_cpus(4, {0, 1})


def test_the_scaling_table_gives_speed_ups_and_ratios(peers):
    results = {2: {"W1": {"numbackend": 0.002, "onnxruntime": 0.006},
                   "W3a batch 1": {"numbackend": 40e-6, "onnxruntime": 30e-6}},
               1: {"W1": {"numbackend": 0.004, "onnxruntime": 0.008, "jax": 0.002},
                   "W3a batch 1": {"numbackend": 50e-6, "onnxruntime": 60e-6}}}
    lines = peers.scaling_table(results)
    rows, label = {}, None
    for line in lines[1:-1]:  # 16 characters of workload, 13 of system
        label = line[:16].strip() or label
        rows[label, line[16:29].strip()] = line[29:].split()
    assert lines[0].split()[2:] == ["1", "thread", "2", "threads"]
    # ours: time (speed-up against 1 thread); theirs: their time / ours
    assert rows["W1", "numbackend"] == ["4.000", "ms", "(1.00x)", "2.000", "ms", "(2.00x)"]
    assert rows["W1", "onnxruntime"] == ["2.00", "3.00"]
    assert rows["W1", "jax"] == ["0.50", "-"]  # not run at 2 threads
    assert rows["W3a batch 1", "numbackend"] == ["50.0", "us", "(1.00x)", "40.0", "us", "(1.25x)"]
    assert rows["W3a batch 1", "onnxruntime"] == ["1.20", "0.75"]
    assert len(rows) == 5
