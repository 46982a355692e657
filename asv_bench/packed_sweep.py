"""Time jit_kernels.packed's products against NumPy's BLAS for each size of the
chunks of k they run in, at each thread count, and print GFLOP/s: the check
behind tuning.PACKED_CHUNK_BYTES and PACKED_BLOCK_BYTES on a new CPU.

    python asv_bench/packed_sweep.py [--chunks 16384,65536,0] [--threads 1,2] [--rounds N] [--quick]

A chunk size of 0 runs each product as one chunk, the whole of k.  The sizes
are compiled into the kernels (set by the environment alone), so each
(chunk size, thread count) runs in a new process, held to the first CPUs
this one may use; the first run of a size compiles the products (a few
seconds; the cache is keyed by it).  At one thread the product runs on the
calling thread (``matmul_packed``), at more in parts of whole panels
(``matmul_packed_in_parts``), against ``np.matmul`` on as many threads; the
settings' processes run in turns, ``--rounds`` times, and each rate is the best
of its rounds (a shared machine's phases move every rate by 10-20%).  The
shapes are the workloads' products by weights (W2b, W3b's first two layers,
mnist_cnn's dense layer at batch 64, W5's step) and one of long k.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = [(256, 1024, 1024), (256, 784, 512), (256, 512, 512), (64, 9216, 128), (32, 128, 512),
          (256, 4096, 512)]
WHOLE_K = 1 << 40  # bytes: a chunk longer than any k


def numbers(text):
    """Whole numbers separated by commas: ``1,2`` -> [1, 2]."""
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"whole numbers separated by commas, got {text!r}")
    return values


def median_seconds(call, seconds):
    """The median time of ``call`` over about ``seconds`` of calls, after one."""
    call()
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(threads, seconds):
    """{shape text: (packed GFLOP/s, BLAS GFLOP/s)} in this process, float32."""
    from jit_kernels import packed
    rng = np.random.default_rng(0)
    rates = {}
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        panels = packed.pack(b, False)
        out, want = np.empty((m, n), np.float32), a.astype(np.float64) @ b
        product = packed.matmul_packed if threads == 1 else packed.matmul_packed_in_parts
        product(a, panels, out)
        if not np.allclose(out, want, rtol=1e-4, atol=1e-3 * np.sqrt(k)):
            raise AssertionError(f"packed_sweep: {m}x{k} by {k}x{n} differs from NumPy's product")
        flops = 2.0 * m * k * n
        # in turns, twice, so that a noisy phase of the machine meets both
        calls = {"ours": lambda a=a, panels=panels, out=out, product=product: product(a, panels, out),
                 "blas": lambda a=a, b=b, out=out: np.matmul(a, b, out=out)}
        ours, blas = [], []
        for _ in range(2):
            ours.append(median_seconds(calls["ours"], seconds / 4))
            blas.append(median_seconds(calls["blas"], seconds / 4))
        rates[f"{m}x{k} by {k}x{n}"] = (flops / min(ours) / 1e9, flops / min(blas) / 1e9)
    return rates


def run_setting(chunk, threads, seconds):
    """:func:`measure` in a new process with the chunk size and thread count set."""
    env = dict(os.environ)
    for name in ("NUMBACKEND_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                 "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[name] = str(threads)
    env["NUMBACKEND_TUNE_PACKED_CHUNK_BYTES"] = str(chunk or WHOLE_K)
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    code = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); import packed_sweep; "
            "os.sched_setaffinity(0, set(json.loads(sys.argv[2]))); "
            "print(json.dumps(packed_sweep.measure(int(sys.argv[3]), float(sys.argv[4]))))")
    done = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)),
                           json.dumps(cpus), str(threads), str(seconds)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"packed_sweep: chunk {chunk}, {threads} threads failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--chunks", type=numbers, default=[16 << 10, 32 << 10, 64 << 10, 0],
                        help="chunk sizes in bytes, 0 for the whole of k (default 16384,32768,65536,0)")
    parser.add_argument("--threads", type=numbers, default=[1, 2],
                        help="thread counts (default 1,2)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per setting, in turns (default 2)")
    parser.add_argument("--quick", action="store_true", help="time each product 0.4 s instead of 1.6 s")
    args = parser.parse_args(argv)
    chunks = list(dict.fromkeys(args.chunks))
    cpus = len(os.sched_getaffinity(0))
    counts = [n for n in args.threads if 1 <= n <= cpus]
    seconds = 0.4 if args.quick else 1.6
    for threads in counts:
        print(f"# {threads} thread(s): GFLOP/s, packed / BLAS, float32", flush=True)
        table = {}
        for _ in range(max(1, args.rounds)):
            for chunk in chunks:
                rates = run_setting(chunk, threads, seconds)
                best = table.setdefault(chunk, rates)
                for shape, (ours, blas) in rates.items():
                    best[shape] = (max(best[shape][0], ours), max(best[shape][1], blas))
        print(f"{'product':24s}" + "".join(f"{('whole k' if c == 0 else f'{c} B'):>16s}" for c in chunks))
        for shape in table[chunks[0]]:
            print(f"{shape:24s}" + "".join(f"{table[c][shape][0]:7.1f} /{table[c][shape][1]:6.1f} "
                                           for c in chunks), flush=True)
    skipped = [n for n in args.threads if n not in counts]
    if skipped:
        print(f"# skipped thread counts {skipped}: this process may use {cpus} CPUs")


if __name__ == "__main__":
    main()
