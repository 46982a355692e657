"""numbackend.export: a model's inference plan as a folder that predicts with NumPy alone.

Each export is loaded in a subprocess whose sys.modules must hold no Numba,
llvmlite, Keras or numbackend after predict, and its results are compared
with NumPy formulas of the model and with the JIT's (or Keras's) own.  One
export per model, shared by the tests (module fixtures): compiling the plan is
the cost.
"""
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

import numbackend as K
from jit_kernels.compiling import by_address
from numbackend.exporting import ExportError, cpu_flags

if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
    pytest.skip("an export links its library with a C compiler", allow_module_level=True)
if platform.system() != "Linux" or platform.machine() != "x86_64":
    pytest.skip("the export's default target is an x86-64 level, tested on Linux",
                allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 33 and 64 rows: a partial chunk after a whole one, and two whole chunks (tuning.EXPORT_CHUNK_ROWS)
BATCHES = (1, 3, 33, 64)
rng = np.random.default_rng(31)

# Runs in the subprocess: imports the export, predicts every saved batch (the
# arrays "<rows>_<input>") at each thread count, saves the results
# ("<rows>-<threads>-<output>") and reports which heavy modules were loaded.
PREDICT = textwrap.dedent('''
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    model = __import__(sys.argv[2])
    data = np.load(sys.argv[3])
    results = {}
    for rows in sorted({int(key.split("_")[0]) for key in data.files}):
        x = [data[f"{rows}_{i}"] for i in range(len(model.MANIFEST["inputs"]))]
        for threads in (1, 2):
            outputs = model.predict(x if len(x) > 1 else x[0], threads=threads)
            for j, output in enumerate(outputs if isinstance(outputs, list) else [outputs]):
                results[f"{rows}-{threads}-{j}"] = output
    np.savez(sys.argv[4], **results)
    loaded = sorted(m for m in sys.modules
                    if m.split(".")[0] in ("numba", "llvmlite", "keras", "numbackend"))
    print(json.dumps(loaded))
''')


def _clean_env():
    """The environment of a process that must find nothing of numbackend's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def predict_in_subprocess(folder, inputs, tmp_path):
    """{(batch, threads): outputs} of the export ``folder`` for each batch of
    ``inputs`` (an array, or a list of arrays for several inputs; rows cut
    from each), run by a process that imports it with NumPy alone: an array,
    or a list for several outputs.  Asserts that the process loaded no Numba,
    llvmlite, Keras or numbackend."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    arrays = inputs if isinstance(inputs, list) else [inputs]
    data = tmp_path / "inputs.npz"
    np.savez(data, **{f"{b}_{i}": a[:b] for b in BATCHES for i, a in enumerate(arrays)})
    out = tmp_path / "outputs.npz"
    script = tmp_path / "predict.py"
    script.write_text(PREDICT)
    parent, name = os.path.split(os.path.abspath(folder))
    done = subprocess.run([sys.executable, str(script), parent, name, str(data), str(out)],
                          check=False, capture_output=True, text=True, env=_clean_env(),
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    results = np.load(out)
    got = {}
    for b in BATCHES:
        for t in (1, 2):
            outputs = [results[k] for k in sorted((k for k in results.files
                                                   if k.startswith(f"{b}-{t}-")),
                                                  key=lambda k: int(k.split("-")[2]))]
            got[b, t] = outputs[0] if len(outputs) == 1 else outputs
    return got


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def files_of(folder):
    """The export's own files in ``folder``: without the bytecode Python writes
    there when a test imports it (where PYTHONDONTWRITEBYTECODE is not set)."""
    return sorted(name for name in os.listdir(folder) if name != "__pycache__")


def mlp_numpy(x, w1, b1, w2):
    return _softmax(np.maximum(x @ w1 + b1, 0) @ w2)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(export folder, the JIT's function, its weights) of a 20-16-4 softmax MLP."""
    w1 = rng.standard_normal((20, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    x = K.placeholder((None, 20))
    f = K.function([x], [K.softmax(K.dot(K.relu(K.dot(x, K.variable(w1)) + K.variable(b1)),
                                         K.variable(w2)))])
    folder = tmp_path_factory.mktemp("exports") / "mlp_model"
    assert K.export(f, str(folder)) == str(folder)
    return folder, f, (w1, b1, w2)


def test_mlp_export_predicts_with_numpy_alone(mlp, tmp_path):
    folder, f, weights = mlp
    x = rng.standard_normal((64, 20)).astype(np.float32)
    got = predict_in_subprocess(folder, x, tmp_path)
    for b in BATCHES:
        np.testing.assert_allclose(got[b, 1], mlp_numpy(x[:b], *weights), rtol=1e-5, atol=1e-6)
        assert np.abs(got[b, 1] - f([x[:b]])[0]).max() <= 1e-6
        # chunks of rows, each on one thread: the thread count changes no bit
        np.testing.assert_array_equal(got[b, 2], got[b, 1])


def test_export_folder_holds_library_weights_loader_header_manifest(mlp):
    folder, _, _ = mlp
    assert files_of(folder) == ["__init__.py", "manifest.json", "model.h", "model.so",
                                "weights.bin"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": manifest["inputs"][0]["name"], "shape": [None, 20],
                                   "dtype": "float32"}]
    assert manifest["outputs"][0]["shape"] == [None, 4]
    assert manifest["target"]["name"] == "x86-64-v3"
    assert {"avx2", "fma"} <= set(manifest["target"]["cpuinfo_flags"])
    assert manifest["threads"] is True
    # the library exports the C API alone
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(folder / "model.so")],
                             check=True, capture_output=True, text=True).stdout
    assert sorted(line.split()[-1] for line in symbols.splitlines()) == [
        "numbackend_model_close", "numbackend_model_error", "numbackend_model_open",
        "numbackend_model_predict", "numbackend_model_set_blas"]


C_PROGRAM = textwrap.dedent('''
    #include <stdio.h>
    #include "model.h"
    int main(int argc, char **argv) {
        numbackend_model *model = numbackend_model_open(argv[1]);
        if (!model) { printf("open: %s\\n", numbackend_model_error(NULL)); return 1; }
        float x[2 * 20], y[2 * 4];
        for (int i = 0; i < 2 * 20; i++) x[i] = (float)(i % 7) * 0.25f - 0.5f;
        const void *inputs[] = {x};
        void *outputs[] = {y};
        int status = numbackend_model_predict(model, 2, inputs, outputs, 0);
        if (status) { printf("predict %d: %s\\n", status, numbackend_model_error(model)); return 1; }
        for (int i = 0; i < 2 * 4; i++) printf("%.9g\\n", y[i]);
        numbackend_model_close(model);
        if (numbackend_model_open("no-such-file.bin") != NULL) return 1;
        printf("%s\\n", numbackend_model_error(NULL));
        return 0;
    }
''')


def test_a_c_program_calls_the_library(mlp, tmp_path):
    folder, _, weights = mlp
    source = tmp_path / "main.c"
    source.write_text(C_PROGRAM)
    program = tmp_path / "main"
    cc = next(shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c))
    subprocess.run([cc, "-I", str(folder), str(source), str(folder / "model.so"), "-o",
                    str(program), f"-Wl,-rpath,{folder}"], check=True)
    done = subprocess.run([str(program), str(folder / "weights.bin")], capture_output=True,
                          text=True, check=True)
    lines = done.stdout.splitlines()
    x = ((np.arange(40) % 7) * 0.25 - 0.5).astype(np.float32).reshape(2, 20)
    np.testing.assert_allclose(np.array(lines[:8], np.float64).reshape(2, 4),
                               mlp_numpy(x, *weights), rtol=1e-5, atol=1e-6)
    assert lines[8] == "numbackend_model_open: cannot open no-such-file.bin"


GEMV_DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
void numbackend_sgemv(int32_t order, int32_t ta, int64_t m, int64_t n, float alpha,
                      const float *a, int64_t lda, const float *x, int64_t incx, float beta,
                      float *y, int64_t incy);
int main(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};                    /* 2 x 3, row-major */
    float x[6] = {1, -9, 2, -9, 3, -9}, y[4] = {-1, 7, -1, 7};
    numbackend_sgemv(101, 111, 2, 3, 1.0f, a, 3, x, 2, 0.0f, y, 2);
    float ones[2] = {1, 1}, yt[3] = {1, 1, 1};
    numbackend_sgemv(101, 112, 2, 3, 2.0f, a, 3, ones, 1, 1.0f, yt, 1);
    float reversed[3] = {3, 2, 1}, yr[2] = {0, 0};
    numbackend_sgemv(101, 111, 2, 3, 1.0f, a, 3, reversed, -1, 0.0f, yr, 1);
    printf("%g %g %g %g %g %g %g %g\n", y[0], y[1], y[2], yt[0], yt[1], yt[2], yr[0], yr[1]);
    return 0;
}
"""


def test_the_shims_own_gemv_follows_increments(tmp_path):
    # without a BLAS from the loader (a C program), the shim's own loop runs: it
    # once left y unchanged for a vector with an increment other than 1
    cc = next(shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c))
    shim = os.path.join(os.path.dirname(K.__file__), "export_files", "shim.c")
    (tmp_path / "driver.c").write_text(GEMV_DRIVER)
    # the shim as a library whose plan symbol stays undefined: only its BLAS runs here
    subprocess.run([cc, "-shared", "-fPIC", "-DNUMBACKEND_PLAN_KEY=1", shim, "-lm", "-lpthread",
                    "-Wl,--unresolved-symbols=ignore-all", "-o", str(tmp_path / "libshim.so")],
                   check=True)
    subprocess.run([cc, str(tmp_path / "driver.c"), str(tmp_path / "libshim.so"),
                    f"-Wl,-rpath,{tmp_path}", "-Wl,--unresolved-symbols=ignore-all", "-o",
                    str(tmp_path / "driver")], check=True)
    out = subprocess.run([str(tmp_path / "driver")], check=True, capture_output=True, text=True)
    a = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    want = [*(a @ [1, 2, 3]), 7]  # y[0], y[2] by the product, y[1] untouched
    want = [want[0], 7, want[1], *(2 * a.T @ [1, 1] + 1), *(a @ [1, 2, 3])]
    np.testing.assert_array_equal([float(v) for v in out.stdout.split()], want)


def _import_copy(folder, tmp_path, name, edit_manifest=None):
    """Copy the export into tmp_path/name, edit its manifest, import it in a
    subprocess; the CompletedProcess."""
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    if edit_manifest:
        manifest = json.loads((copy / "manifest.json").read_text())
        edit_manifest(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest))
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import {name}; "
            f"import numpy as np; print({name}.predict(np.zeros((2, 20), np.float32)).shape)")
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          env=_clean_env(), cwd=tmp_path, timeout=60)


def test_load_refuses_a_cpu_without_the_targets_features(mlp, tmp_path):
    done = _import_copy(mlp[0], tmp_path, "needs_fake",
                        lambda m: m["target"]["cpuinfo_flags"].append("fake_feature_x"))
    assert done.returncode != 0
    assert "RuntimeError" in done.stderr and "lacks fake_feature_x" in done.stderr
    assert "'x86-64-v3'" in done.stderr
    assert _import_copy(mlp[0], tmp_path, "as_built").stdout.strip() == "(2, 4)"


def test_predict_checks_its_inputs(mlp, tmp_path):
    code = textwrap.dedent(f'''
        import sys
        import numpy as np
        sys.path.insert(0, {str(mlp[0].parent)!r})
        import mlp_model
        for bad in (np.zeros((2, 21), np.float32), np.zeros(20, np.float32), [np.zeros((2, 20))] * 2):
            try:
                mlp_model.predict(bad)
            except ValueError as exc:
                print(exc)
        print(mlp_model.predict(np.zeros((0, 20), np.float32)).shape)
    ''')
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          env=_clean_env(), cwd=tmp_path, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0].startswith("predict: input 0") and "(2, 21)" in lines[0]
    assert lines[1].startswith("predict: input 0") and "(20,)" in lines[1]
    assert lines[2] == "predict: the model has 1 input(s), got 2"
    assert lines[3] == "(0, 4)"


def test_an_existing_folder_is_replaced_only_when_asked(mlp, tmp_path):
    folder, f, _ = mlp
    before = (folder / "weights.bin").read_bytes()
    with pytest.raises(ExportError, match="exists; pass overwrite=True"):
        K.export(f, str(folder))
    assert (folder / "weights.bin").read_bytes() == before
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    (kept / "stale.txt").write_text("from an earlier export")
    K.export(f, str(kept), overwrite=True)
    assert files_of(kept) == files_of(folder)  # replaced whole
    assert os.listdir(tmp_path) == ["kept"]


def test_an_export_that_predicts_otherwise_is_refused(mlp, tmp_path, monkeypatch):
    """The folder's predictions of a random batch are checked against the
    function's before it takes DEST's place: here its weights are doubled on
    their way to weights.bin.  A failed export leaves DEST as it was and
    nothing beside it."""
    from numbackend import compiled_plan, exporting
    folder, f, _ = mlp
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept)
    write_weights = exporting._write_weights

    def doubled(path, key, inputs, outputs, held):
        held = [compiled_plan.Held(h.name, h.shape, h.dtype, constant=h.array() * 2)
                if h.dtype.kind == "f" else h for h in held]
        write_weights(path, key, inputs, outputs, held)

    monkeypatch.setattr(exporting, "_write_weights", doubled)
    with pytest.raises(ExportError, match=r"on a random batch of 40 rows, output 0 of the "
                                          r"exported library differs from the function's"):
        K.export(f, str(kept), overwrite=True)
    with pytest.raises(ExportError, match="differs from the function's"):
        K.export(f, str(tmp_path / "new"))
    for name in files_of(folder):
        assert (kept / name).read_bytes() == (folder / name).read_bytes()
    assert os.listdir(tmp_path) == ["kept"]
    # verify=False writes what it built, unchecked
    K.export(f, str(tmp_path / "unchecked"), verify=False)
    assert (tmp_path / "unchecked" / "weights.bin").read_bytes() != (folder / "weights.bin").read_bytes()


def test_an_op_without_compiled_form_is_named_at_export(tmp_path):
    x = K.placeholder((None, 5))
    f = K.function([x], [K.cumsum(x * 2.0, axis=1)])
    with pytest.raises(ExportError, match=r"no compiled form.*cumsum 'cumsum_\d+' \(None, 5\)"):
        K.export(f, str(tmp_path / "cumsum_model"))


def test_an_output_without_the_batch_axis_is_refused(tmp_path):
    x = K.placeholder((None, 3))
    f = K.function([x], [K.transpose(x)])
    with pytest.raises(ExportError, match=r"output 0 \(transpose 'transpose_\d+' \(3, None\) "
                                          r"float32\) carries the batch on axis 1"):
        K.export(f, str(tmp_path / "transpose_model"))


def _mixing_steps():
    """{name: (f(x) for x (None, 3), the op the export must name)}: steps that
    mix the rows of a batch, each of which an export run in chunks of rows
    would get wrong."""
    return {
        "centred": (lambda x: x - K.mean(x, axis=0), "mean"),
        "times_gram": (lambda x: K.dot(x, K.dot(K.transpose(x), x)), "dot"),
        "first_row": (lambda x: x * x[:1], "getitem"),
        "softmax_across_rows": (lambda x: K.reshape(K.softmax(K.reshape(x, (3, -1))), (-1, 3)),
                                "reshape"),
        "rows_reversed": (lambda x: K.reverse(x, 0) + x, "reverse"),
        "rows_joined": (lambda x: K.reshape(K.concatenate([x, x], axis=0), (-1, 6)), "concatenate"),
        "rows_tiled": (lambda x: K.reshape(K.tile(x, (2, 1)), (-1, 6)), "tile"),
        "sum_over_rows": (lambda x: K.sum(x, axis=0), "sum"),
    }


@pytest.mark.parametrize("name", list(_mixing_steps()))
def test_a_step_that_mixes_rows_is_refused_by_name(name, tmp_path):
    build, op = _mixing_steps()[name]
    x = K.placeholder((None, 3))
    f = K.function([x], [build(x)])
    with pytest.raises(ExportError, match=rf"export: {op} '{op}_\d+' .*: an export runs each "
                                          r"chunk of 32 rows of a batch on its own"):
        K.export(f, str(tmp_path / name))
    assert not (tmp_path / name).exists()


EPSILON = 1e-7  # Keras's fuzz factor: the CTC ops see log(y_pred + epsilon)


def ctc_greedy_numpy(probabilities, lengths):
    """Keras 2.2.5's ctc_decode(y_pred, input_length, greedy=True) on the
    TensorFlow backend, by its definition: on log(y_pred + epsilon), each used
    frame's most likely class (the first of equals), runs of one class merged,
    blanks (the last class) dropped, the decodings padded with -1 to the
    longest of the batch (int64); and the log probability, minus the sum of
    each used frame's largest log(y_pred + epsilon), (batch, 1) in y_pred's type."""
    logits = np.log(probabilities.astype(np.float64) + EPSILON)
    blank = probabilities.shape[2] - 1
    paths, totals = [], []
    for row, n in zip(logits, lengths):
        best = row[:n].argmax(axis=1)
        merged = [c for t, c in enumerate(best) if t == 0 or c != best[t - 1]]
        paths.append([int(c) for c in merged if c != blank])
        totals.append(-row[:n].max(axis=1).sum())
    width = max((len(p) for p in paths), default=0)
    decoded = np.array([p + [-1] * (width - len(p)) for p in paths], np.int64)
    return decoded.reshape(len(paths), width), np.array(totals, probabilities.dtype).reshape(-1, 1)


def dense_softmax_numpy(x, w, b):
    z = x.astype(np.float64) @ w + b
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def ctc_greedy(tmp_path_factory):
    """(export folder, the JIT's function, its weights) of softmax(Dense) over
    (batch, 7 steps, 5 features) into 4 classes (the blank last), decoded by
    K.ctc_decode(greedy=True) with each row's input length (Keras's image_ocr
    feeds them as (batch, 1)): the decodings and their log probabilities."""
    w = rng.standard_normal((5, 4)).astype(np.float32)
    b = np.array([0.0, 0.0, 0.0, 0.5], np.float32)  # blanks more often
    x = K.placeholder((None, 7, 5))
    lengths = K.placeholder((None, 1), dtype="int64")
    (decoded,), log_prob = K.ctc_decode(K.softmax(K.dot(x, K.variable(w)) + K.variable(b)),
                                        lengths, greedy=True)
    f = K.function([x, lengths], [decoded, log_prob])
    folder = tmp_path_factory.mktemp("exports") / "ctc_model"
    K.export(f, str(folder))
    return folder, f, (w, b)


def test_ctc_greedy_decoding_exports(ctc_greedy, tmp_path):
    """Rows of every input length (0 to all 7 steps): each batch's decodings
    padded to its own longest, as the function gives them."""
    folder, f, (w, b) = ctc_greedy
    x = rng.standard_normal((64, 7, 5)).astype(np.float32)
    lengths = rng.integers(0, 8, (64, 1))
    lengths[:3, 0] = [1, 7, 0]
    got = predict_in_subprocess(folder, [x, lengths], tmp_path)
    for batch in BATCHES:
        want = ctc_greedy_numpy(dense_softmax_numpy(x[:batch], w, b), lengths[:batch, 0])
        jit = f([x[:batch], lengths[:batch]])
        decoded, log_prob = got[batch, 1]
        for value, expected in zip((decoded, jit[0]), (want[0], want[0])):
            assert value.shape == expected.shape and value.dtype == np.int64
            np.testing.assert_array_equal(value, expected)
        assert log_prob.dtype == jit[1].dtype == np.float32
        np.testing.assert_allclose(log_prob, want[1], rtol=1e-5, atol=1e-5)
        assert np.abs(log_prob - jit[1]).max() <= 1e-5
        for value, same in zip(got[batch, 2], got[batch, 1]):
            np.testing.assert_array_equal(value, same)
    assert got[1, 1][0].shape[1] <= 1 < got[64, 1][0].shape[1]  # each batch's own width


def test_ctc_export_writes_decodings_at_the_width_of_the_time_steps(ctc_greedy):
    """What a C program sees (model.h): the decodings at the width of the
    time steps, padded with -1, which manifest.json's "trim" says the loader drops."""
    manifest = json.loads((ctc_greedy[0] / "manifest.json").read_text())
    decoded, log_prob = manifest["outputs"]
    assert (decoded["shape"], decoded["dtype"], decoded["trim"]) == (
        [None, 7], "int64", {"axis": 1, "pad": -1})
    assert (log_prob["shape"], log_prob["dtype"]) == ([None, 1], "float32")
    assert "trim" not in log_prob


CTC_EDGES = textwrap.dedent('''
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import ctc_model
    data = np.load(sys.argv[2])
    x, lengths = data["x"], data["lengths"]
    results = {"in_parts": ctc_model.predict([x, lengths], batch_size=5),
               "no_steps": ctc_model.predict([x, 0 * lengths]),
               "blank_steps": ctc_model.predict([0 * x, lengths]),
               "no_rows": ctc_model.predict([x[:0], lengths[:0]])}
    for name, outputs in results.items():
        for j, output in enumerate(outputs):
            np.save(f"{name}-{j}.npy", output)
''')


def test_ctc_export_trims_the_whole_batch_and_empty_decodings(ctc_greedy, tmp_path):
    """predict in parts of 5 rows trims the whole batch at its longest decoding;
    a batch whose decodings are all empty (no steps used, or every step a
    blank) or that has no rows gives width 0, as the function does."""
    folder, f, (w, b) = ctc_greedy
    x = rng.standard_normal((33, 7, 5)).astype(np.float32)
    lengths = rng.integers(1, 8, (33, 1))
    lengths[7, 0] = 7  # a decoding longer than the others of its part of 5 rows
    np.savez(tmp_path / "inputs.npz", x=x, lengths=lengths)
    done = subprocess.run([sys.executable, "-c", CTC_EDGES, str(folder.parent),
                           str(tmp_path / "inputs.npz")], check=False, capture_output=True,
                          text=True, env=_clean_env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    cases = {"in_parts": (x, lengths), "no_steps": (x, 0 * lengths),
             "blank_steps": (0 * x, lengths), "no_rows": (x[:0], lengths[:0])}
    for name, (images, used) in cases.items():
        want = ctc_greedy_numpy(dense_softmax_numpy(images, w, b), used[:, 0])
        jit = f([images, used])
        for j in (0, 1):
            got = np.load(tmp_path / f"{name}-{j}.npy")
            assert got.shape == want[j].shape == jit[j].shape, name
            assert got.dtype == jit[j].dtype, name
            np.testing.assert_allclose(got, want[j], rtol=1e-5, atol=1e-5)
    assert np.load(tmp_path / "no_steps-0.npy").shape == (33, 0)
    assert np.load(tmp_path / "blank_steps-0.npy").shape == (33, 0)  # the bias favours blanks
    assert (np.load(tmp_path / "blank_steps-1.npy") > 0).all()
    assert np.load(tmp_path / "no_rows-0.npy").shape == (0, 0)


def test_ctc_float_lengths_export(tmp_path):
    """Input lengths fed as floats (Keras's image_ocr decodes with
    np.ones(n) * steps) are truncated as the function truncates them; the
    export's check feeds lengths within 0..steps."""
    y_pred = K.placeholder((None, 3, 3))
    lengths = K.placeholder((None,))
    (decoded,), log_prob = K.ctc_decode(y_pred, lengths)
    f = K.function([y_pred, lengths], [decoded, log_prob])
    folder = tmp_path / "float_lengths"
    K.export(f, str(folder))
    probabilities = rng.dirichlet(np.ones(3), (64, 3)).astype(np.float32)
    used = rng.uniform(-0.5, 3.9, 64).astype(np.float32)
    got = predict_in_subprocess(folder, [probabilities, used], tmp_path)
    for batch in BATCHES:
        want = ctc_greedy_numpy(probabilities[:batch], used[:batch].astype(np.int64))
        np.testing.assert_array_equal(got[batch, 1][0], want[0])
        np.testing.assert_allclose(got[batch, 1][1], want[1], rtol=1e-5, atol=1e-5)


def test_ctc_beam_search_is_refused_by_name(tmp_path):
    y_pred = K.placeholder((None, 6, 4))
    lengths = K.placeholder((None,), dtype="int32")
    decoded = K.ctc_decode(y_pred, lengths, greedy=False, beam_width=3)[0][0]
    f = K.function([y_pred, lengths], [decoded])
    with pytest.raises(ExportError, match=r"ctc_decode 'ctc_decode_\d+' .*beam search "
                                          r"\(greedy=False\) is not exported"):
        K.export(f, str(tmp_path / "beam_model"))
    assert not (tmp_path / "beam_model").exists()


def test_a_padded_decoding_read_by_another_step_is_refused(tmp_path):
    """An export writes each decoding at the width of the time steps and only
    its loader trims them: a step reading them would see the padding (here a
    sum of the labels, which the -1s would change), even unverified."""
    y_pred = K.placeholder((None, 6, 4))
    lengths = K.placeholder((None,), dtype="int32")
    decoded = K.ctc_decode(y_pred, lengths)[0][0]
    f = K.function([y_pred, lengths], [K.sum(K.cast(decoded, "float32"), axis=1)])
    with pytest.raises(ExportError, match=r"export: ctc_decoded_path 'ctc_decoded_path_\d+' "
                                          r".* is read by cast 'cast_\d+'"):
        K.export(f, str(tmp_path / "read_model"), verify=False)


def test_steps_that_move_the_batch_axis_but_keep_rows_apart_export(tmp_path):
    """The batch moved to axis 1 and reduced over axis 0 there; merged with the
    axis after it (as TimeDistributed does) and split again: rows stay apart,
    so it exports, and its predictions cross the chunks' boundary."""
    x = K.placeholder((None, 4, 5))
    across = K.sum(K.permute_dimensions(x, (1, 0, 2)), axis=0)
    merged = K.reshape(K.tanh(K.reshape(x, (-1, 5))), (-1, 4, 5))
    f = K.function([x], [across * K.max(merged, axis=1)])
    folder = tmp_path / "moved_model"
    K.export(f, str(folder))
    images = rng.standard_normal((64, 4, 5)).astype(np.float32)
    got = predict_in_subprocess(folder, images, tmp_path)
    want = images.sum(axis=1) * np.tanh(images).max(axis=1)
    for b in BATCHES:
        np.testing.assert_allclose(got[b, 1], want[:b], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[b, 2], got[b, 1])


KERAS_LAMBDA = textwrap.dedent('''
    import keras.backend as K
    from keras import layers
    from keras.models import Sequential
    import numbackend
    model = Sequential([layers.Dense(4, input_shape=(3,)),
                        layers.Lambda(lambda x: x - K.mean(x, axis=0), name="centre"),
                        layers.Dense(2)])
    try:
        numbackend.export(model, "centre_model")
    except numbackend.exporting.ExportError as exc:
        print(exc)
''')


@pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                    reason="Keras 2.2.5 comes with the test extra")
def test_a_keras_layer_that_mixes_rows_is_named(tmp_path):
    done = subprocess.run([sys.executable, "-c", KERAS_LAMBDA], check=True, capture_output=True,
                          text=True, env=_keras_env(), cwd=tmp_path, timeout=300)
    assert done.stdout.startswith("export: layer 'centre': mean 'mean_"), done.stdout
    assert "reduces over the batch (axis 0)" in done.stdout
    assert not (tmp_path / "centre_model").exists()


def test_target_names_are_checked(tmp_path):
    x = K.placeholder((None, 3))
    f = K.function([x], [x * 2.0])
    with pytest.raises(ExportError, match="target must be one of"):
        K.export(f, str(tmp_path / "m"), target="pentium")
    flags = cpu_flags()
    if flags is not None and "avx512f" not in flags:
        with pytest.raises(ExportError, match="lacks avx512"):
            K.export(f, str(tmp_path / "m"), target="avx512")


def test_fused_kernels_are_vectorised_for_the_targets_width(tmp_path, monkeypatch, tuned):
    # on an AVX-512 host fused kernels fill 512-bit vectors (FUSED_VECTOR_BITS); an
    # export for a CPU without AVX-512 generates them at that CPU's own width
    from jit_kernels.compiling import target_vector_bytes
    from numbackend import codegen
    if target_vector_bytes() < 64:
        pytest.skip("this host's kernels use vectors of 256 bits at most")
    tuned(FUSED_VECTOR_BITS=512)
    sources, generate = [], codegen.generate_source

    def recorded(*args, **kwargs):
        sources.append(generate(*args, **kwargs))
        return sources[-1]
    monkeypatch.setattr(codegen, "generate_source", recorded)
    x = K.placeholder((None, 7))
    f = K.function([x], [K.tanh(x * 1.7 + 0.25) * 3.0])
    sources.clear()  # those of the function itself
    K.export(f, str(tmp_path / "v3"))
    assert sources and not any("prefer_vector_width" in text for text in sources)
    xv = np.random.default_rng(3).standard_normal((64, 7)).astype(np.float32)
    got = predict_in_subprocess(tmp_path / "v3", xv, tmp_path)
    for b in BATCHES:
        np.testing.assert_allclose(got[b, 1], np.tanh(xv[:b] * 1.7 + 0.25) * 3.0, rtol=1e-5,
                                   atol=1e-6)
    flags = cpu_flags()
    if flags is not None and "avx512f" in flags:
        sources.clear()
        K.export(f, str(tmp_path / "v4"), target="x86-64-v4")
        assert any("prefer_vector_width(512)" in text for text in sources)


# Runs with KERAS_BACKEND=numbackend: builds a small mnist_cnn, saves it with
# model.save, its weights and its predictions.
KERAS_CNN = textwrap.dedent('''
    import sys
    import numpy as np
    import keras
    from keras import layers
    from keras.models import Sequential
    np.random.seed(0)
    model = Sequential([
        layers.Conv2D(4, (3, 3), activation="relu", input_shape=(10, 10, 1)),
        layers.Conv2D(8, (3, 3), activation="relu"),
        layers.MaxPooling2D((2, 2)), layers.Dropout(0.25), layers.Flatten(),
        layers.Dense(16, activation="relu"), layers.Dropout(0.5),
        layers.Dense(5, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy")
    x = np.random.rand(64, 10, 10, 1).astype(np.float32)
    model.save(sys.argv[1] + "/model.h5")
    np.savez(sys.argv[1] + "/cnn.npz", x=x, predicted=model.predict(x), *model.get_weights())
''')


def _keras_env():
    env = dict(os.environ, KERAS_BACKEND="numbackend")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def conv2d_valid(x, w, b):
    """Cross-correlation of x (N, H, W, C) with w (3, 3, C, O), 'valid', plus b."""
    windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[:2], axis=(1, 2))
    return np.einsum("nhwcij,ijco->nhwo", windows, w) + b


def cnn_numpy(x, k1, b1, k2, b2, w3, b3, w4, b4):
    h = np.maximum(conv2d_valid(x, k1, b1), 0)
    h = np.maximum(conv2d_valid(h, k2, b2), 0)
    n, height, width, c = h.shape
    h = h.reshape(n, height // 2, 2, width // 2, 2, c).max(axis=(2, 4)).reshape(n, -1)
    h = np.maximum(h @ w3 + b3, 0)
    return _softmax(h @ w4 + b4)


@pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                    reason="Keras 2.2.5 comes with the test extra")
def test_keras_cnn_exported_by_the_command_line(tmp_path):
    subprocess.run([sys.executable, "-c", KERAS_CNN, str(tmp_path)], check=True,
                   capture_output=True, env=_keras_env(), cwd=tmp_path, timeout=300)
    folder = tmp_path / "cnn_model"
    done = subprocess.run([sys.executable, "-m", "numbackend", "export", str(tmp_path / "model.h5"),
                           str(folder)], check=False, capture_output=True, text=True,
                          env=_keras_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    saved = np.load(tmp_path / "cnn.npz")
    x, weights = saved["x"], [saved[f"arr_{i}"] for i in range(8)]
    got = predict_in_subprocess(folder, x, tmp_path)
    for b in BATCHES:
        assert np.abs(got[b, 1] - saved["predicted"][:b]).max() <= 1e-4
        np.testing.assert_allclose(got[b, 1], cnn_numpy(x[:b], *weights), rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[b, 2], got[b, 1])


@pytest.mark.parametrize("path", ["winograd", "direct"])
def test_pooled_convolution_paths(path, tmp_path, tune):
    """A 3x3 convolution with bias, ReLU and a 2x2 max pooling (one step, pooled
    first) on each compiled path; an inf in an image sends its chunk from
    Winograd to the direct loop."""
    tune(CONV_PATH=path)
    kernel = rng.standard_normal((3, 3, 16, 8)).astype(np.float32) * np.float32(0.2)
    bias = rng.standard_normal(8).astype(np.float32)
    x = K.placeholder((None, 10, 10, 16))
    y = K.pool2d(K.relu(K.bias_add(K.conv2d(x, K.variable(kernel)), K.variable(bias))), (2, 2),
                 strides=(2, 2), pool_mode="max")
    f = K.function([x], [y])
    folder = tmp_path / f"conv_{path}"
    K.export(f, str(folder))
    if path == "winograd" and shutil.which("nm"):
        # Winograd's kernels call one another through symbols bound to addresses
        # of the exporting process: the library holds their code instead
        library = str(folder / "model.so")
        defined = subprocess.run(["nm", "--defined-only", library], check=True, capture_output=True,
                                 text=True).stdout
        undefined = subprocess.run(["nm", "-D", "--undefined-only", library], check=True,
                                   capture_output=True, text=True).stdout
        assert "numbackend_by_address.jit_kernels.winograd._winograd_bands." in defined
        assert "numbackend_by_address" not in undefined
    images = rng.standard_normal((64, 10, 10, 16)).astype(np.float32)
    images[40, 3, 4, 5] = np.inf
    got = predict_in_subprocess(folder, images, tmp_path)
    h = np.maximum(conv2d_valid(images, kernel, bias), 0)
    want = h.reshape(64, 4, 2, 4, 2, 8).max(axis=(2, 4))
    for b in BATCHES:
        np.testing.assert_allclose(got[b, 1], want[:b], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(got[b, 2], got[b, 1])
    assert_no_avx512(folder / "model.so")


def assert_no_avx512(library):
    """The default target (x86-64-v3) runs on AVX2 CPUs: its library holds no
    AVX-512 instruction (zmm or mask registers, embedded broadcasts), even where
    the exporting host's kernels use 512-bit vectors."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], check=True,
                          capture_output=True, text=True).stdout
    wide = re.findall(r"^.*(?:%zmm|%k[1-7]|\{1to).*$", code, re.MULTILINE)
    assert not wide, wide[:5]


@numba.njit
def _three_x_plus_one(x):
    if x < 0:
        raise ValueError("_three_x_plus_one: x must not be negative")
    return 3.0 * x + 1.0


_three_x_plus_one_by_address = by_address(_three_x_plus_one)


@numba.njit
def _twice_three_x_plus_one(x):
    return 2.0 * _three_x_plus_one_by_address(x)


_twice_by_address = by_address(_twice_three_x_plus_one)


@numba.njit
def _calls_by_address_and_directly(x):
    # a kernel called by address from one called by address, and one called
    # both by address and directly
    return _twice_by_address(x) + _three_x_plus_one_by_address(x) + _three_x_plus_one(x)


def test_kernels_called_by_address_are_linked_into_the_plans_module():
    import ctypes

    import llvmlite.binding as llvm

    from numbackend.exporting import _link_kernels_by_address
    assert _calls_by_address_and_directly(2.0) == 4 * (3 * 2.0 + 1)  # compiled here
    compiled = _calls_by_address_and_directly.overloads[_calls_by_address_and_directly.signatures[0]]
    module = llvm.parse_assembly(compiled.library.get_llvm_str())
    declared = {f.name for f in module.functions if f.is_declaration}
    assert any(name.startswith("numbackend_by_address.") for name in declared)
    _link_kernels_by_address(module)
    module.verify()
    assert not [f.name for f in module.functions
                if f.is_declaration and f.name.startswith("numbackend_by_address.")]
    # run the linked module's code (Numba's calling convention: the status
    # returned; pointers to the result and to the exception's record)
    for function in module.functions:
        if not function.is_declaration and function.name != compiled.fndesc.mangled_name:
            function.linkage = "internal"
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_double)(engine.get_function_address(compiled.fndesc.mangled_name))
    result, exception = ctypes.c_double(), ctypes.c_void_p()
    assert call(ctypes.byref(result), ctypes.byref(exception), 2.5) == 0
    assert result.value == 4 * (3 * 2.5 + 1)
    assert call(ctypes.byref(result), ctypes.byref(exception), -1.0) != 0  # the kernel's raise
    assert exception.value


def test_a_serial_build_gives_the_same_bits(mlp, tmp_path):
    folder, f, _ = mlp
    serial = tmp_path / "serial_model"
    K.export(f, str(serial), threads=False)
    assert json.loads((serial / "manifest.json").read_text())["threads"] is False
    symbols = subprocess.run(["nm", "-D", "--undefined-only", str(serial / "model.so")],
                             check=True, capture_output=True, text=True).stdout
    assert "pthread_create" not in symbols
    x = rng.standard_normal((64, 20)).astype(np.float32)
    threaded = predict_in_subprocess(folder, x, tmp_path / "threaded")
    alone = predict_in_subprocess(serial, x, tmp_path / "alone")
    for key, value in threaded.items():
        np.testing.assert_array_equal(alone[key], value)


# Runs with KERAS_BACKEND=numbackend: builds each small Keras model named on the
# command line (its weights drawn at random: batch statistics too), saves its
# inputs, weights and predictions (FOLDER/<name>.npz) and exports it
# (FOLDER/<name>_model), or writes why it did not (FOLDER/<name>.error).
KERAS_EXPORTS = textwrap.dedent('''
    import sys, traceback
    import numpy as np
    from keras import layers
    from keras.models import Sequential
    import numbackend
    folder = sys.argv[1]
    np.random.seed(0)
    floats = lambda *shape: np.random.uniform(-1, 1, (64,) + shape).astype(np.float32)
    MODELS = {
        "lstm": lambda: ([layers.LSTM(6, input_shape=(7, 3)), layers.Dense(2)], floats(7, 3)),
        # a Dense layer on a sequence: a product of a 3-D value by weights
        "gru_simple_rnn": lambda: ([layers.GRU(5, return_sequences=True, input_shape=(7, 3)),
                                    layers.SimpleRNN(4, return_sequences=True), layers.Dense(2)],
                                   floats(7, 3)),
        "bidirectional": lambda: ([layers.Bidirectional(layers.LSTM(4, return_sequences=True),
                                                        input_shape=(7, 3)),
                                   layers.TimeDistributed(layers.Dense(3)),
                                   layers.GlobalMaxPooling1D(), layers.Dense(2)], floats(7, 3)),
        "embedding_conv1d": lambda: ([layers.Embedding(11, 4, input_length=9),
                                      layers.Conv1D(4, 3, activation="relu"),
                                      layers.MaxPooling1D(2),
                                      layers.Conv1D(3, 2, padding="same"),
                                      layers.AveragePooling1D(2, strides=1, padding="same"),
                                      layers.GlobalAveragePooling1D(), layers.Dense(2)],
                                     np.random.randint(0, 11, (64, 9)).astype(np.float32)),
        # pools after epilogues that do not commute with them, and pools alone
        "batch_norm_pooling": lambda: ([layers.Conv2D(4, 3, input_shape=(10, 10, 2)),
                                        layers.BatchNormalization(), layers.MaxPooling2D(2),
                                        layers.Conv2D(3, 1, activation="relu"),
                                        layers.AveragePooling2D(2),
                                        layers.MaxPooling2D(2, strides=1, padding="same"),
                                        layers.AveragePooling2D(3, strides=1, padding="same"),
                                        layers.Flatten(), layers.Dense(5),
                                        layers.BatchNormalization(), layers.Dense(2)],
                                       floats(10, 10, 2)),
    }
    for name in sys.argv[2:]:
        try:
            stack, x = MODELS[name]()
            model = Sequential(stack)
            for layer in model.layers:  # a batch normalisation's variances must be positive
                low, high = (0.5, 1.5) if isinstance(layer, layers.BatchNormalization) else (-0.6, 0.6)
                layer.set_weights([np.random.uniform(low, high, w.shape).astype(w.dtype)
                                   for w in layer.get_weights()])
            np.savez(f"{folder}/{name}.npz", x=x, predicted=model.predict(x), *model.get_weights())
            numbackend.export(model, f"{folder}/{name}_model")
        except Exception:
            with open(f"{folder}/{name}.error", "w") as f:
                f.write(traceback.format_exc())
''')


@pytest.fixture(scope="module")
def keras_exports(tmp_path_factory):
    """``export(name)``: (folder of the export, {x, predicted, arr_0...: the
    model's weights}) of the Keras model ``name`` of KERAS_EXPORTS, all exported
    by one process."""
    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras 2.2.5 comes with the test extra")
    folder = tmp_path_factory.mktemp("keras_exports")
    subprocess.run([sys.executable, "-c", KERAS_EXPORTS, str(folder), *KERAS_NUMPY], check=True,
                   capture_output=True, env=_keras_env(), cwd=folder, timeout=900)

    def export(name):
        error = folder / f"{name}.error"
        assert not error.exists(), error.read_text()
        return folder / f"{name}_model", np.load(folder / f"{name}.npz")
    return export


def _hard_sigmoid(z):
    return np.clip(0.2 * z + 0.5, 0.0, 1.0)


def lstm_numpy(x, kernel, recurrent, bias):
    """Keras 2.2.5's LSTM (gates i, f, c, o; hard sigmoid, tanh): every step's output."""
    units = recurrent.shape[0]
    h = c = np.zeros((x.shape[0], units))
    outputs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ kernel + h @ recurrent + bias
        i, f, o = (_hard_sigmoid(z[:, k * units:(k + 1) * units]) for k in (0, 1, 3))
        c = f * c + i * np.tanh(z[:, 2 * units:3 * units])
        h = o * np.tanh(c)
        outputs.append(h)
    return np.stack(outputs, axis=1)


def gru_numpy(x, kernel, recurrent, bias):
    """Keras 2.2.5's GRU (reset_after=False; gates z, r, h): every step's output."""
    units = recurrent.shape[0]
    h = np.zeros((x.shape[0], units))
    gate = [slice(k * units, (k + 1) * units) for k in range(3)]
    outputs = []
    for t in range(x.shape[1]):
        xw = x[:, t] @ kernel + bias
        z = _hard_sigmoid(xw[:, gate[0]] + h @ recurrent[:, gate[0]])
        r = _hard_sigmoid(xw[:, gate[1]] + h @ recurrent[:, gate[1]])
        candidate = np.tanh(xw[:, gate[2]] + (r * h) @ recurrent[:, gate[2]])
        h = z * h + (1 - z) * candidate
        outputs.append(h)
    return np.stack(outputs, axis=1)


def simple_rnn_numpy(x, kernel, recurrent, bias):
    """Keras's SimpleRNN (tanh): every step's output."""
    h = np.zeros((x.shape[0], recurrent.shape[0]))
    outputs = []
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ kernel + h @ recurrent + bias)
        outputs.append(h)
    return np.stack(outputs, axis=1)


def pool_numpy(x, size, stride, padding, reduce):
    """Pooling of x (N, *spatial, C) by brute force: each window's input
    positions (TensorFlow's 'same' pads (total // 2) before), ``reduce``d."""
    spatial = x.shape[1:-1]
    size, stride = (size,) * len(spatial), (stride,) * len(spatial)
    if padding == "valid":
        out = [(n - k) // s + 1 for n, k, s in zip(spatial, size, stride)]
        before = [0] * len(spatial)
    else:
        out = [-(-n // s) for n, s in zip(spatial, stride)]
        before = [max((o - 1) * s + k - n, 0) // 2 for o, s, k, n in zip(out, stride, size, spatial)]
    y = np.empty((x.shape[0], *out, x.shape[-1]))
    for position in np.ndindex(*out):
        window = tuple(slice(max(p * s - b, 0), p * s - b + k)
                       for p, s, b, k in zip(position, stride, before, size))
        y[(slice(None), *position)] = reduce(x[(slice(None), *window)],
                                             axis=tuple(range(1, 1 + len(spatial))))
    return y


def conv_numpy(x, w, b, padding="valid"):
    """Cross-correlation of x (N, *spatial, C) with w (*taps, C, O), stride 1,
    plus b ('same': TensorFlow's padding, (taps - 1) // 2 before)."""
    taps = w.shape[:-2]
    axes = tuple(range(1, 1 + len(taps)))
    if padding == "same":
        x = np.pad(x, [(0, 0)] + [((k - 1) // 2, k // 2) for k in taps] + [(0, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(x, taps, axis=axes)
    # windows: (N, *out, C, *taps)
    letters = "ijk"[:len(taps)]
    return np.einsum(f"n...c{letters},{letters}co->n...o", windows, w) + b


def batch_norm_numpy(h, gamma, beta, mean, variance):
    return (h - mean) / np.sqrt(variance + 1e-3) * gamma + beta


def _bidirectional(x, w):
    both = np.concatenate([lstm_numpy(x, *w[:3]), lstm_numpy(x[:, ::-1], *w[3:6])[:, ::-1]],
                          axis=2)
    return (both @ w[6] + w[7]).max(axis=1) @ w[8] + w[9]


def _embedding_conv1d(x, w):
    h = w[0][x.astype(np.int64)]
    h = pool_numpy(np.maximum(conv_numpy(h, w[1], w[2]), 0), 2, 2, "valid", np.max)
    h = pool_numpy(conv_numpy(h, w[3], w[4], "same"), 2, 1, "same", np.mean)
    return h.mean(axis=1) @ w[5] + w[6]


def _batch_norm_pooling(x, w):
    h = batch_norm_numpy(conv_numpy(x, w[0], w[1]), *w[2:6])
    h = pool_numpy(h, 2, 2, "valid", np.max)
    h = pool_numpy(np.maximum(conv_numpy(h, w[6], w[7]), 0), 2, 2, "valid", np.mean)
    h = pool_numpy(h, 2, 1, "same", np.max)
    h = pool_numpy(h, 3, 1, "same", np.mean).reshape(len(x), -1)
    return batch_norm_numpy(h @ w[8] + w[9], *w[10:14]) @ w[14] + w[15]


KERAS_NUMPY = {
    "lstm": lambda x, w: lstm_numpy(x, *w[:3])[:, -1] @ w[3] + w[4],
    "gru_simple_rnn": lambda x, w: simple_rnn_numpy(gru_numpy(x, *w[:3]), *w[3:6]) @ w[6] + w[7],
    # the backward LSTM reads the sequence from its end; its outputs put back in order
    "bidirectional": _bidirectional,
    "embedding_conv1d": _embedding_conv1d,
    "batch_norm_pooling": _batch_norm_pooling,
}


@pytest.mark.parametrize("name", list(KERAS_NUMPY))
def test_keras_models_export(name, keras_exports, tmp_path):
    """The scan's loop over time runs in the export (LSTM, GRU, SimpleRNN,
    Bidirectional), and so do Embedding, Conv1D, BatchNormalization,
    TimeDistributed(Dense), Dense on a sequence, pooling alone or after an
    epilogue it does not commute with, max and average, 1-D and 2-D."""
    folder, saved = keras_exports(name)
    x = saved["x"]
    weights = [saved[f"arr_{i}"].astype(np.float64) for i in range(len(saved.files) - 2)]
    want = KERAS_NUMPY[name](x.astype(np.float64), weights)
    np.testing.assert_allclose(saved["predicted"], want, rtol=1e-4, atol=1e-5)  # the formula's check
    got = predict_in_subprocess(folder, x, tmp_path)
    for b in BATCHES:
        assert np.abs(got[b, 1] - saved["predicted"][:b]).max() <= 1e-4
        np.testing.assert_allclose(got[b, 1], want[:b], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got[b, 2], got[b, 1])


def test_an_embedding_id_out_of_range_is_an_index_error(keras_exports, tmp_path):
    folder, _ = keras_exports("embedding_conv1d")
    code = textwrap.dedent(f'''
        import sys
        import numpy as np
        sys.path.insert(0, {str(folder.parent)!r})
        import embedding_conv1d_model as model
        ids = np.zeros((40, 9), np.float32)
        ids[37, 4] = 11
        try:
            model.predict(ids)
        except IndexError as exc:
            print(exc)
        print(model.predict(ids[:37]).shape)
    ''')
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          env=_clean_env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "jit_kernels.copying.gather_rows: an index is out of range for the rows of the table",
        "(37, 2)"]
