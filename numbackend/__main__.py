"""``python -m numbackend demo``: build, compile and time two small models.
``python -m numbackend warmup`` and ``compile-report``: see compile_report.py.
``python -m numbackend export MODEL.h5 DEST``: see exporting.py.
``python -m numbackend native-build FOLDER KEY``: see native.py (started by numbackend itself).

W1 is a chain of element-wise operations (one fused kernel); W3 is a
784-512-512-10 MLP (BLAS products, fused bias+activation kernels, a fused
row softmax).  Each is compared with the same computation in plain NumPy.
"""
import itertools
import sys
import time

import numpy as np


def _median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _fmt(seconds):
    return f"{seconds * 1e6:9.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.2f} ms"


def _report(title, fn, reference, inputs, repeat):
    """Run a compiled function (single output) and its NumPy reference; print the plan and times."""
    print(f"\n== {title}")
    start = time.perf_counter()
    got = fn(inputs)[0]
    first = time.perf_counter() - start
    want = reference(*inputs)
    error = float(np.max(np.abs(got - want)))
    from . import tuning
    with tuning.override(NATIVE_TIER="off"):  # no native entry: these calls run in this process
        fn.warmup(batch_sizes=(len(inputs[0]),))  # its later tiers, which the timed calls then run
    ours = _median_time(lambda: fn(inputs), repeat)
    numpy_time = _median_time(lambda: reference(*inputs), repeat)
    print(fn.explain())  # after the timed calls: it says what they ran (one compiled call or not)
    print(f"first call (compile or load): {first:.2f} s; max abs difference from NumPy: {error:.2e}")
    print(f"numbackend {_fmt(ours)}   NumPy {_fmt(numpy_time)}   speed-up {numpy_time / ours:5.1f}x")


def demo():
    import numbackend as K

    rng = np.random.default_rng(0)
    f32 = np.float32

    # W1: tanh(a*b + c) * sigmoid(a - c) + 0.5*b*b on three 1024x4096 inputs
    a, b, c = (K.placeholder((None, 4096), name=n) for n in "abc")
    w1 = K.function([a, b, c], [K.tanh(a * b + c) * K.sigmoid(a - c) + 0.5 * b * b])
    data = [rng.standard_normal((1024, 4096)).astype(f32) for _ in range(3)]

    def w1_numpy(a, b, c):
        return np.tanh(a * b + c) * (1 / (1 + np.exp(-(a - c)))) + f32(0.5) * b * b

    _report("W1 fused element-wise chain, 1024x4096 float32", w1, w1_numpy, data, 20)

    # W3: MLP 784-512(relu)-512(relu)-10(softmax)
    sizes = [784, 512, 512, 10]
    weights = [(rng.standard_normal((m, n)).astype(f32) / f32(np.sqrt(m)), rng.standard_normal(n).astype(f32) * f32(0.1))
               for m, n in itertools.pairwise(sizes)]
    x = K.placeholder((None, 784), name="x")
    h = x
    for i, (w, bias) in enumerate(weights):
        h = K.dot(h, K.variable(w)) + K.variable(bias)
        h = K.relu(h) if i < len(weights) - 1 else K.softmax(h)
    mlp = K.function([x], [h])

    def mlp_numpy(x):
        h = x
        for i, (w, bias) in enumerate(weights):
            h = h @ w + bias
            if i < len(weights) - 1:
                h = np.maximum(h, 0)
            else:
                e = np.exp(h - h.max(axis=-1, keepdims=True))
                h = e / e.sum(axis=-1, keepdims=True)
        return h

    for batch, repeat in ((1, 2000), (256, 100)):
        xs = [rng.standard_normal((batch, 784)).astype(f32)]
        _report(f"W3 MLP 784-512-512-10, batch {batch}", mlp, mlp_numpy, xs, repeat)

    import numba
    from numba.np.ufunc import parallel

    from jit_kernels import blas
    # Numba's own threads start only where NumPy has no OpenBLAS pool (or for huge pooling)
    layer = numba.threading_layer() if getattr(parallel, "_is_initialized", True) else "not started"
    print(f"\nNumba {numba.__version__} (its threading layer: {layer}); {blas.threads()} threads "
          "of OpenBLAS's pool run numbackend's parts")


def main(argv):
    if argv[:1] == ["demo"]:
        demo()
        return 0
    if argv[:1] in (["warmup"], ["compile-report"]):
        from . import compile_report
        return compile_report.main(argv[0], argv[1:])
    if argv[:1] == ["export"]:
        return export_command(argv[1:])
    if argv[:1] == ["native-build"] and len(argv) == 3:
        return native_build_command(*argv[1:])
    print("usage: python -m numbackend demo|warmup|compile-report|export MODEL.h5 DEST",
          file=sys.stderr)
    return 2


def export_command(argv):
    """``python -m numbackend export MODEL.h5 DEST [--target T] [--serial]
    [--overwrite] [--no-verify]``: the
    Keras 2.2.5 model saved by ``model.save`` in MODEL.h5, exported into the
    folder DEST (see numbackend.export)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m numbackend export",
                                     description="Export a Keras model saved with model.save "
                                     "into a folder that predicts with NumPy alone.")
    parser.add_argument("model", help="the .h5 file of model.save (Keras 2.2.5)")
    parser.add_argument("dest", help="the folder to write (an importable package)")
    parser.add_argument("--target", default=None,
                        help="CPU target: x86-64-v2, x86-64-v3 (default), x86-64-v4 (avx512) "
                        "or host")
    parser.add_argument("--serial", action="store_true", help="a library without threads")
    parser.add_argument("--overwrite", action="store_true", help="replace DEST where it exists")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the check of DEST's predictions against the model's on a "
                        "random batch")
    args = parser.parse_args(argv)
    if os.environ.setdefault("KERAS_BACKEND", "numbackend") != "numbackend":
        print(f"export: KERAS_BACKEND is {os.environ['KERAS_BACKEND']!r}; the model loads on "
              "numbackend", file=sys.stderr)
        return 2
    import keras

    from . import exporting
    model = keras.models.load_model(args.model, compile=False)
    exporting.export(model, args.dest, target=args.target or exporting.DEFAULT_TARGET,
                     threads=not args.serial, overwrite=args.overwrite,
                     verify=not args.no_verify)
    print(f"exported {args.model} into {args.dest}")
    return 0


def native_build_command(folder, key):
    """``python -m numbackend native-build FOLDER KEY``, which numbackend starts
    itself (numbackend/native.py): export the function pickled in
    FOLDER/KEY.pickle into FOLDER/KEY, for this CPU, verified; its files'
    hashes added and the folder renamed into place whole.  An export that
    fails leaves its reason in FOLDER/KEY.refused."""
    import contextlib
    import json
    import os
    import pickle
    import py_compile
    import shutil
    import traceback

    from jit_kernels.cache_folders import write_atomically

    from . import exporting, native
    with contextlib.suppress(OSError):
        os.nice(10)  # the calls of the process that started it go first
    entry = os.path.join(folder, key)
    staging = os.path.join(folder, f".{key}.{os.getpid()}.staging")
    try:
        with open(entry + ".pickle", "rb") as f:
            function = pickle.load(f)  # written by this user's process, in a folder of theirs
        exporting.export(function, staging, target="host", verify=True)
        # the loader's bytecode, which the first process to load the entry would compile
        py_compile.compile(os.path.join(staging, "__init__.py"), doraise=True)
        write_atomically(os.path.join(staging, native.HASHES),
                         json.dumps(native.file_hashes(staging)).encode())
        try:
            os.rename(staging, entry)
        except OSError:
            if not os.path.isdir(entry):  # else another process's build is in place
                raise
        with contextlib.suppress(OSError):
            os.remove(entry + ".log")  # kept where the build failed
        native.trim(folder, keep=key)
        return 0
    except Exception:  # noqa: BLE001 - kept: no later process tries this one again
        write_atomically(entry + ".refused", traceback.format_exc().encode())
        return 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        native.release(folder, key)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
