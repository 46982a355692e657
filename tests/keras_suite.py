"""Run Keras 2.2.5's own test suite against numbackend.

    python tests/keras_suite.py               # the whole suite (see SUITE)
    python tests/keras_suite.py --fast        # the subset CI runs (see FAST)
    python tests/keras_suite.py tests/keras/layers/core_test.py -k Lambda   # files, pytest options

The tests come from Keras 2.2.5's source distribution, fetched with pip (``pip download``) into
``$NUMBACKEND_KERAS_SDIST`` (default ``~/.cache/numbackend/keras-sdist``) the first time; nothing
else is downloaded.  They are copied to a temporary folder, the few patches of PATCHES are applied
there, and pytest runs them with ``KERAS_BACKEND=numbackend`` against the installed Keras.  Tests
that need the internet or a TensorFlow/Theano/CNTK-only feature, and tests broken by the Python,
NumPy or pytest of today rather than by the backend, are deselected in DESELECTED, each with its
reason.  At the end a table gives each file's passed / failed / skipped counts and wall time.
"""
import argparse
import collections
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from xml.etree import ElementTree

KERAS_VERSION = "2.2.5"

# The files run by default (paths inside the sdist).
SUITE = [
    "tests/keras",
    "tests/test_model_saving.py",
    "tests/integration_tests",
]

# The subset CI runs on every change: the backend against Keras's NumPy reference, and files that
# build, fit and save small models of every layer family, chosen to stay within a few minutes.
# In two parts of about equal time (the functions and losses; the models), which
# tests/test_keras_suite.py runs as two tests so that pytest-xdist's workers can share them.
FAST_PARTS = [
    ["tests/keras/backend/backend_test.py",
     "tests/keras/losses_test.py",
     "tests/keras/activations_test.py",
     "tests/keras/constraints_test.py"],
    ["tests/keras/initializers_test.py",
     "tests/keras/metrics_test.py",
     "tests/keras/regularizers_test.py",
     "tests/keras/layers/core_test.py",
     "tests/keras/layers/merge_test.py",
     "tests/keras/test_sequential_model.py",
     "tests/test_model_saving.py"],
]
FAST = [path for part in FAST_PARTS for path in part]

# Whole folders that cannot run here.
EXCLUDED = {
    "tests/keras/datasets": "downloads the datasets from the internet",
    "tests/integration_tests/test_datasets.py": "downloads the datasets from the internet",
    "tests/keras/utils/multi_gpu_test.py": "multi_gpu_model is TensorFlow's; the file imports it",
}

# Single tests that cannot run here: node id -> reason.
DESELECTED = {
    "tests/integration_tests/imagenet_utils_test.py::test_decode_predictions":
        "downloads imagenet_class_index.json from the internet",
    "tests/integration_tests/preprocessing/text_test.py::test_tokenizer":
        "keras_preprocessing calls np.max on a ragged list, an error since NumPy 1.24",
    "tests/keras/utils/generic_utils_test.py::test_func_dump_and_load_backwards_compat[argmax]":
        "dumps np.argmax's __code__; NumPy 2's functions are dispatchers without one",
    "tests/keras/utils/vis_utils_test.py::test_plot_model":
        "plot_model needs Graphviz's dot program, which pip does not install",
    "tests/keras/utils/vis_utils_test.py::test_plot_sequential_embedding":
        "plot_model needs Graphviz's dot program, which pip does not install",
    **{f"tests/keras/test_callbacks.py::{name}":
       "keras.callbacks.TensorBoard writes TensorFlow summaries: it needs TensorFlow"
       for name in ["test_TensorBoard", "test_TensorBoard_multi_input_output",
                    "test_TensorBoard_convnet", "test_TensorBoard_display_float_from_logs",
                    "test_TensorBoard_with_ReduceLROnPlateau"]},
    "tests/keras/backend/backend_test.py::TestBackend::test_resize_images_bilinear":
        "compares TensorFlow's bilinear resize with Theano's and expects Theano's "
        "NotImplementedError for factors other than 2; ours is checked against a NumPy "
        "formula of TensorFlow's in tests/test_conv_ops.py",
}

# Text patches of the copied tests.  Each old text must be found, so a patch that no longer
# applies fails loudly instead of silently doing nothing; every occurrence is replaced.
Patch = collections.namedtuple("Patch", "file old new reason")

PATCHES = [
    Patch(file="tests/keras/backend/backend_test.py",
          old="    WITH_NP = [KTF, KNP]",
          new="    KTF = importlib.import_module(K.backend())\n    WITH_NP = [KTF, KNP]",
          reason=("TensorFlow is not installed: the backend module under test stands where "
                  "TensorFlow's (KTF) stood, compared with Keras's NumPy reference backend")),
    Patch(file="tests/keras/backend/backend_test.py",
          old="[KTH, KTF]",
          new="[KTF]",
          reason=("test_gradient and test_function compare Theano with TensorFlow, neither "
                  "installed: run them on the backend under test alone (their own checks apply)")),
    Patch(file="tests/conftest.py",
          old="    if K.backend() == 'tensorflow' or K.backend() == 'cntk':\n        K.clear_session()",
          new="    if K.backend() in ('tensorflow', 'cntk', 'numbackend'):\n        K.clear_session()",
          reason=("Keras's conftest clears the session after each test for the backends whose "
                  "keras.backend has clear_session in 2.2.5; numbackend has it too (without it "
                  "normalization_test's set_learning_phase(1) stays for every later test)")),
    Patch(file="tests/keras/engine/test_training.py",
          old="pytest.warns(None)",
          new="_recorded_warnings()",
          reason="pytest 8 removed pytest.warns(None); record all warnings instead"),
    Patch(file="tests/keras/engine/test_topology.py",
          old=("    if K.backend() == 'tensorflow' or K.backend() == 'cntk':\n"
               "        inputs = Input(shape=(10, 20, 20, 1))"),
          new=("    if K.image_data_format() == 'channels_last':\n"
               "        inputs = Input(shape=(10, 20, 20, 1))"),
          reason=("test_load_layers picks Theano's channels_first input for any backend but "
                  "TensorFlow and CNTK; numbackend is channels_last by default, as TensorFlow")),
    Patch(file="tests/test_model_saving.py",
          old="    with h5py.File('does not matter', driver='core',\n",
          new="    with h5py.File('does not matter', mode='w', driver='core',\n",
          reason=("h5py 3 opens a file read-only unless a mode is given (h5py 2 defaulted to "
                  "'a'): the in-memory file the test saves into needs mode='w'")),
    Patch(file="tests/keras/activations_test.py",
          old=("    true_result = (np.exp(negative_values) - 1) * scale * alpha\n\n"
               "    assert_allclose(result, true_result)"),
          new=("    true_result = (np.exp(negative_values) - 1) * scale * alpha\n\n"
               "    assert_allclose(result, true_result, rtol=2e-7)"),
          reason=("float32 rounding: selu is scale * elu(x, alpha), the reference multiplies in "
                  "another order and the two differ by 1 ulp at x=-1 (TensorFlow 2's selu too)")),
]

# Definitions the patches above use, added at the top of the patched file.
PATCH_PRELUDE = {
    "tests/keras/backend/backend_test.py": "import importlib\n",
    "tests/keras/engine/test_training.py": (
        "import contextlib as _contextlib\n"
        "import warnings as _warnings\n\n\n"
        "@_contextlib.contextmanager\n"
        "def _recorded_warnings():\n"
        "    with _warnings.catch_warnings(record=True) as w:\n"
        "        _warnings.simplefilter('always')\n"
        "        yield w\n\n\n"),
}

# Added to the copied tests' conftest.py: Keras's NumPy reference backend uses NumPy aliases removed
# in NumPy 1.24 (np.bool, np.int); give that module, and only it, a NumPy that still has them, and
# the stable sort its in_top_k relied on.
CONFTEST_ADDITION = '''

import types as _types

import numpy as _np
from keras.backend import numpy_backend as _numpy_backend


class _NumpyWithOldAliases(_types.ModuleType):
    """numpy, plus the aliases Keras 2.2.5's numpy_backend still uses."""
    bool = bool
    int = int
    float = float

    def __getattr__(self, name):
        return getattr(_np, name)


_numpy_backend.np = _NumpyWithOldAliases("numpy")


def _in_top_k(predictions, targets, k):
    # Keras's reference sorts with np.argsort's default kind, stable in NumPy 1 (so a
    # target tied with the k-th value is in the top k, TensorFlow's rule) but not in
    # NumPy 2 on x86, whose SIMD sort orders ties at random
    top_k = _np.argsort(-predictions, kind="stable")[:, :k]
    return _np.any(targets.reshape(-1, 1) == top_k, axis=-1)


_numpy_backend.in_top_k = _in_top_k
'''


def sdist_folder():
    """The unpacked Keras sdist, fetched with pip the first time."""
    root = os.environ.get("NUMBACKEND_KERAS_SDIST") or os.path.join(
        os.path.expanduser("~"), ".cache", "numbackend", "keras-sdist")
    unpacked = os.path.join(root, f"Keras-{KERAS_VERSION}")
    if os.path.isdir(os.path.join(unpacked, "tests")):
        return unpacked
    os.makedirs(root, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", f"keras=={KERAS_VERSION}", "-d", root], check=True)
    archives = glob.glob(os.path.join(root, f"[Kk]eras-{KERAS_VERSION}.tar.gz"))
    if not archives:
        raise SystemExit(f"keras_suite: pip did not leave keras-{KERAS_VERSION}.tar.gz in {root}")
    with tarfile.open(archives[0]) as archive:
        members = [m for m in archive.getmembers()
                   if m.name.startswith(f"Keras-{KERAS_VERSION}/tests/") and (m.isfile() or m.isdir())]
        archive.extractall(root, members=members, filter="data")
    return unpacked


def prepare(sdist, workdir):
    """Copy the sdist's tests into workdir and apply PATCHES; returns the tests' root."""
    shutil.copytree(os.path.join(sdist, "tests"), os.path.join(workdir, "tests"))
    for path, prelude in PATCH_PRELUDE.items():
        _rewrite(workdir, path, lambda text, prelude=prelude: prelude + text)
    for path, old, new, _reason in PATCHES:
        def replace(text, path=path, old=old, new=new):
            if old not in text:
                raise SystemExit(f"keras_suite: patch for {path} no longer applies: {old!r}")
            return text.replace(old, new)
        _rewrite(workdir, path, replace)
    _rewrite(workdir, "tests/conftest.py", lambda text: text + CONFTEST_ADDITION)
    return workdir


def _rewrite(workdir, path, change):
    full = os.path.join(workdir, path)
    with open(full, encoding="utf-8") as f:
        text = f.read()
    with open(full, "w", encoding="utf-8") as f:
        f.write(change(text))


def run(paths, pytest_args, workdir):
    """Run pytest on paths inside workdir; returns (exit code, per-file results)."""
    report = os.path.join(workdir, "report.xml")
    env = dict(os.environ, KERAS_BACKEND="numbackend",
               KERAS_HOME=os.path.join(workdir, "keras-home"))
    # no native entries: each function a test calls often would start a build process
    env.setdefault("NUMBACKEND_TUNE_NATIVE_TIER", "off")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}",
               "-o", "junit_family=xunit1", *paths]
    for folder in EXCLUDED:
        command += ["--ignore", folder]
    for node in DESELECTED:
        command += ["--deselect", node]
    command += pytest_args
    code = subprocess.run(command, cwd=workdir, env=env, check=False).returncode
    return code, per_file(report) if os.path.exists(report) else {}


def per_file(report):
    """{file: [passed, failed, skipped, seconds]} from a junit report."""
    files = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        counts = files.setdefault(path, [0, 0, 0, 0.0])
        if case.find("skipped") is not None:
            counts[2] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            counts[1] += 1
        else:
            counts[0] += 1
        counts[3] += float(case.get("time", 0))
    return files


def print_table(files, wall):
    print(f"\n{'file':60} {'passed':>7} {'failed':>7} {'skipped':>8} {'seconds':>8}")
    totals = [0, 0, 0, 0.0]
    for path in sorted(files):
        counts = files[path]
        totals = [a + b for a, b in zip(totals, counts)]
        print(f"{path:60} {counts[0]:7d} {counts[1]:7d} {counts[2]:8d} {counts[3]:8.1f}")
    print(f"{'total':60} {totals[0]:7d} {totals[1]:7d} {totals[2]:8d} {totals[3]:8.1f}"
          f"   (wall {wall:.0f} s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="run the subset CI runs")
    parser.add_argument("--keep", metavar="DIR", help="prepare the tests in DIR and keep them")
    args, rest = parser.parse_known_args(argv)
    paths = [a for a in rest if a.startswith("tests/")]
    pytest_args = [a for a in rest if not a.startswith("tests/")]
    if not paths:
        paths = FAST if args.fast else SUITE
    workdir = args.keep or tempfile.mkdtemp(prefix="keras-suite-")
    os.makedirs(workdir, exist_ok=True)
    if os.path.exists(os.path.join(workdir, "tests")):
        shutil.rmtree(os.path.join(workdir, "tests"))
    start = time.perf_counter()
    try:
        prepare(sdist_folder(), workdir)
        code, files = run(paths, pytest_args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(files, time.perf_counter() - start)
    return code


if __name__ == "__main__":
    sys.exit(main())
