"""The kernels that split their work between threads, run in a process of 1, 2,
3 and 8 threads (NUMBACKEND_NUM_THREADS, more threads than this machine's
CPUs where it has fewer): each splits into the parts its work and the thread
count call for (jit_kernels.machine's rules), and gives NumPy's numbers."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.kernel_helpers import needs_blas

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view
    import numbackend as K
    from jit_kernels import blas, conv, packed, parts, pool
    from numbackend import scan_blocks

    counts = []  # [kind, parts] of each run: compiled parts, parts of Python, shared steps
    run, run_parts = parts.run, parts.run_parts
    parts.run = lambda part, rows: counts.append(["compiled", len(rows)]) or run(part, rows)
    parts.run_parts = lambda count, part: counts.append(["python", count]) or run_parts(count, part)
    prepare = scan_blocks.StepBlocks.prepare

    def prepare_spied(self, *args, shared=1):
        if shared > 1:
            counts.append(["shared", shared])
        return prepare(self, *args, shared=shared)
    scan_blocks.StepBlocks.prepare = prepare_spied
    rng = np.random.default_rng(3)
    report = {"threads": blas.threads()}

    def check(name, got, want, tolerance):
        error = float(np.abs(got - want).max() / np.abs(want).max())
        report[name] = {"parts": list(counts), "error": error, "tolerance": tolerance}
        counts.clear()

    def reference_conv(x, w):  # 'valid', stride 1
        windows = sliding_window_view(x, w.shape[:2], axis=(1, 2))  # (N, OH, OW, C, KH, KW)
        return np.einsum("nhwcij,ijco->nhwo", windows, w)

    # a layer's weights at batch 1, packed, their panels split
    for k in (784, 128):
        a, b = rng.standard_normal((1, k)), rng.standard_normal((k, 512))
        out = np.empty((1, 512))
        packed.matmul_packed_in_parts(a, packed.pack(b, False), out)
        check(f"packed {k}", out, a @ b, 1e-12)
    # Winograd's bands as compiled parts (mnist_cnn's second layer), pooled in them
    x, w = rng.standard_normal((2, 26, 26, 32)), rng.standard_normal((3, 3, 32, 64))
    y = conv.conv_forward(x, w, pool="max")
    want = reference_conv(x, w).reshape(2, 12, 2, 12, 2, 64).max(axis=(2, 4))
    check("winograd pooled", y, want, 1e-10)
    x = rng.standard_normal((8, 26, 26, 32))  # bands enough for several chunks
    check("winograd", conv.conv_forward(x, w), reference_conv(x, w), 1e-10)
    # the direct loop, its images split between compiled parts (mnist_cnn's first
    # layer at batch 64), its chunk held to 2 MB (the L2 cache of some Xeons)
    x = rng.standard_normal((64, 28, 28, 1)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, 32)).astype(np.float32)
    check("direct", conv.conv_forward(x, w), reference_conv(x.astype(float), w.astype(float)), 1e-5)
    # im2col (a 5x5 kernel) and its kernel gradient
    x, w = rng.standard_normal((40, 20, 20, 8)), rng.standard_normal((5, 5, 8, 16))
    y = conv.conv_forward(x, w)
    check("columns", y, reference_conv(x, w), 1e-12)
    dy = rng.standard_normal(y.shape)
    windows = sliding_window_view(x, (5, 5), axis=(1, 2))
    check("columns kernel gradient", conv.conv_backward_kernel(x, dy, w.shape),
          np.einsum("nhwcij,nhwo->ijco", windows, dy), 1e-12)
    # max pooling by images
    x = rng.standard_normal((64, 24, 24, 64))
    check("pool", pool.max_pool_forward(x, 2), x.reshape(64, 12, 2, 12, 2, 64).max(axis=(2, 4)), 0)
    def check_rnn(name, rows, steps, units):
        wv, uv = rng.standard_normal((16, units)) * 0.3, rng.standard_normal((units, units)) * 0.1
        w_, u_ = K.variable(wv, dtype="float64"), K.variable(uv, dtype="float64")
        xs = K.placeholder((None, steps, 16), dtype="float64")
        h0 = K.placeholder((None, units), dtype="float64")

        def step(x_t, states):
            h = K.tanh(K.dot(x_t, w_) + K.dot(states[0], u_))
            return h, [h]

        outputs = K.rnn(step, xs, [h0])[1]
        f = K.function([xs, h0], [outputs])
        xv, hv = rng.standard_normal((rows, steps, 16)), rng.standard_normal((rows, units))
        for _ in range(3):  # the loop takes over from the second call
            counts.clear()
            got = f([xv, hv])[0]
        h, want = hv, []
        for t in range(steps):
            h = np.tanh(xv[:, t] @ wv + h @ uv)
            want.append(h)
        check(name, got, np.stack(want, axis=1), 1e-10)

    # a tanh RNN's loop over time, its rows split (32 rows, 50 steps)
    check_rnn("rnn", 32, 50, 128)
    # 8 rows, 4 a thread at least: on 8 threads, the threads share each step, its
    # 256 x 256 product (the input's is done before the loop) split between as
    # many as get 128K multiply-adds
    check_rnn("rnn shared", 8, 90, 256)
    print(json.dumps(report))
""")


def _parts(kind, *counts):
    """{threads: the runs expected on 1, 2, 3 and 8 threads}: one run of ``kind``
    of each count, none where the count is 1 and the parts are of Python (the
    images then run on the calling thread without a run)."""
    return {threads: [] if kind == "python" and count == 1 else [[kind, count]]
            for threads, count in zip((1, 2, 3, 8), counts)}


# The parts of each kernel (see jit_kernels.machine): compiled parts one per thread
# where each gets tuning.PARTS_MIN_WORK (16K elements), parts of Python about
# sqrt(work / tuning.PARTS_PYTHON_HANDOFF_WORK (32K)), a scan's rows 4 a part at least,
# its steps shared where that leaves threads idle (tuning.SCAN_SHARE_MIN_WORK, 128K,
# by 4 threads at least).
EXPECTED_PARTS = {
    "packed 784": _parts("compiled", 1, 2, 3, 8),  # 784 x 512 weights: 401K items
    "packed 128": _parts("compiled", 1, 2, 3, 4),  # 64K items: 4 parts at most
    # 12 bands of 6 blocks by 32 + 64 channels, 20.7K elements each; 12 bands on 8
    # threads take 2 a part, so 6 parts
    "winograd pooled": _parts("compiled", 1, 2, 3, 6),
    "winograd": _parts("compiled", 1, 2, 3, 8),  # 48 bands: 4 chunks of 11
    # 64 x 676 x 32 outputs, one part a thread; on 1 thread the images run on the calling
    # thread without a run
    "direct": {1: [], 2: [["compiled", 2]], 3: [["compiled", 3]], 8: [["compiled", 8]]},
    "columns": _parts("python", 1, 2, 3, 8),  # 40 x 256 x (200 + 16): sqrt(2.2M / 32K) = 8
    "columns kernel gradient": _parts("python", 1, 2, 3, 8),
    "pool": _parts("python", 1, 2, 3, 8),  # 2.36M elements: sqrt = 8
    "rnn": _parts("python", 1, 2, 3, 8),  # 32 rows
    # 8 rows: split in 2 parts of 4, or shared by up to 4 threads (512K
    # multiply-adds a step), where that is more and 4 at least
    "rnn shared": {1: [], 2: [["python", 2]], 3: [["python", 2]],
                   8: [["shared", 4], ["python", 4]]},
}


@needs_blas
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_each_kernel_splits_between_the_threads_and_gives_numpys_numbers(threads):
    env = dict(os.environ, NUMBACKEND_NUM_THREADS=str(threads),
               NUMBACKEND_TUNE_TIER_COMPILE="in_call", NUMBACKEND_TUNE_SCAN_LOOP_AFTER="1",
               NUMBACKEND_TUNE_CONV_DIRECT_CHUNK_BYTES=str(2 << 20),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          cwd=ROOT, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report.pop("threads") == threads
    for name, result in report.items():
        assert result["error"] <= result["tolerance"], (name, result)
        assert result["parts"] == EXPECTED_PARTS[name][threads], (name, result)
