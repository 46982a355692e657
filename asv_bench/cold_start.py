"""A new process's first prediction and the calls after it, as a new user meets them.

    python asv_bench/cold_start.py [--calls N] [--models mlp,cnn,lstm] [--no-onnx] [--installed]
        [--cold-library]

For each model (the W3 784-512-512-10 MLP written with K.*, Keras 2.2.5's
mnist_cnn, and a Keras LSTM(128) over 100 steps of 32 features with a softmax
Dense), a new process with an empty HOME and an empty NUMBACKEND_CACHE_DIR
builds the model (the Keras models save their weights, as trained ones, which
the second process loads) and predicts N times at batch 1; then, once the native entry's
build that the first started has ended (numbackend/native.py: its function's
inference plan exported into the cache, by a process of its own), a second
process does the same with the caches the first one left (warm).  Each line
gives the time from the process's start to its first prediction, the first call
alone, the slowest later call, and for the warm process whether a native entry
served its first call.  A third kind of process loads that native entry as
the export it is (NumPy alone, as a server of an exported model starts) and
predicts once.  Where ONNX Runtime is installed, the same MLP and CNN are
saved as ONNX files and a new process imports onnxruntime, loads the file and
predicts once, for the comparison.

The processes run this tree's numbackend (``--installed``: the one installed
for this interpreter).  The library's kernels come from the package's seed
where ``python -m numbackend warmup`` wrote one: an empty HOME then compiles
only the model's own kernels (``--cold-library``: the seed is left unread, and
the library's kernels compile too).
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
# The environment a new user's process starts with: taken before the ONNX files'
# import of asv_bench's benchmarks, which sets the harness's own tuning (later
# tiers compiling in the call that makes them due) in os.environ.
USER_ENVIRONMENT = dict(os.environ)

CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import numpy as np
model, calls = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
if model == "mlp":
    import numbackend as K
    x = K.placeholder((None, 784))
    h = x
    for i, (m, n) in enumerate([(784, 512), (512, 512), (512, 10)]):
        h = K.dot(h, K.variable(rng.standard_normal((m, n)).astype("float32") / np.sqrt(m)))
        h = h + K.variable(np.zeros(n, "float32"))
        h = K.relu(h) if i < 2 else K.softmax(h)
    f = K.function([x], [h])
    data = rng.standard_normal((1, 784)).astype("float32")
    predict = lambda: f([data])[0]
else:
    os.environ["KERAS_BACKEND"] = "numbackend"
    from keras import layers
    from keras.models import Sequential
    if model == "cnn":
        net = Sequential([layers.Conv2D(32, (3, 3), activation="relu", input_shape=(28, 28, 1)),
                          layers.Conv2D(64, (3, 3), activation="relu"), layers.MaxPooling2D((2, 2)),
                          layers.Dropout(0.25), layers.Flatten(), layers.Dense(128, activation="relu"),
                          layers.Dropout(0.5), layers.Dense(10, activation="softmax")])
        data = rng.standard_normal((1, 28, 28, 1)).astype("float32")
    else:
        net = Sequential([layers.LSTM(128, input_shape=(100, 32)), layers.Dense(10, activation="softmax")])
        data = rng.standard_normal((1, 100, 32)).astype("float32")
    # the trained weights a server loads: saved by the first process, loaded by the second
    weights = os.path.join(os.environ["HOME"], f"{model}.h5")
    if os.path.exists(weights):
        net.load_weights(weights)
    else:
        net.save_weights(weights)
    predict = lambda: net.predict(data)
times = []
served = None
for _ in range(calls):
    t = time.perf_counter()
    predict()
    times.append(time.perf_counter() - t)
    if served is None:
        function = f if model == "mlp" else net.predict_function
        served = function._native is not None
print(json.dumps({"to_first": time.perf_counter() - start - sum(times[1:]), "calls": times,
                  "native": served}))
"""

# A process that predicts from an export (numbackend/exporting.py) as a user's
# would: the native entry the first process left is one, built for this CPU.
EXPORT_CHILD = r"""
import json, os, sys, time
start = time.perf_counter()
import numpy as np
path, shape = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(path))
model = __import__(os.path.basename(path))
model.predict(np.ones(shape, np.float32))
print(json.dumps({"to_first": time.perf_counter() - start}))
"""

ONNX_CHILD = r"""
import json, sys, time
start = time.perf_counter()
import numpy as np
import onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
shape = json.loads(sys.argv[2])
session.run(None, {"x": np.ones(shape, np.float32)})
print(json.dumps({"to_first": time.perf_counter() - start}))
"""


def run_child(source, args, env):
    # from a folder of its own: ``python -c`` puts the working folder first on sys.path
    out = subprocess.run([sys.executable, "-c", source, *args], env=env, capture_output=True, text=True,
                         check=False, cwd=tempfile.mkdtemp(prefix="cold-start-cwd-"))
    if out.returncode != 0:
        raise RuntimeError(f"cold_start: the child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def numbackend_runs(model, calls, installed=False, cold_library=False):
    """(empty caches, warm caches) results of two new processes sharing one HOME."""
    home = tempfile.mkdtemp(prefix="cold-start-home-")
    env = dict(USER_ENVIRONMENT, HOME=home)
    if not installed:
        env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    for name in ("NUMBACKEND_CACHE_DIR", "NUMBACKEND_CACHE_SEED", "NUMBACKEND_PACKAGE_SEED"):
        env.pop(name, None)
    if cold_library:
        env["NUMBACKEND_PACKAGE_SEED"] = "0"
    env.pop("XDG_CACHE_HOME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cold = run_child(CHILD, [model, str(calls)], env)
    native = os.path.join(home, ".cache", "numbackend", "native")
    cold["build"] = wait_for_builds(native)
    warm = run_child(CHILD, [model, str(calls)], env)
    entries = [name for name in os.listdir(native) if "." not in name] if os.path.isdir(native) else []
    if len(entries) == 1:
        # a copy under an importable name, as `python -m numbackend export` would write
        exported = os.path.join(tempfile.mkdtemp(prefix="cold-start-export-"), f"exported_{model}")
        shutil.copytree(os.path.join(native, entries[0]), exported)
        warm["export"] = min(run_child(EXPORT_CHILD, [exported, json.dumps(EXAMPLE_SHAPES[model])],
                                       env)["to_first"] for _ in range(3))
    return [cold, warm]


# the examples' shapes (Keras's channels-last)
EXAMPLE_SHAPES = {"mlp": [1, 784], "cnn": [1, 28, 28, 1], "lstm": [1, 100, 32]}


def wait_for_builds(folder, timeout=300):
    """Seconds waited until no native entry's build is under way in ``folder``
    (None where none was: no ``.building`` mark there)."""
    start = time.perf_counter()
    waited = None
    while time.perf_counter() - start < timeout:
        marks = glob.glob(os.path.join(folder, "*.building"))
        if not marks:
            if waited is not None:
                time.sleep(1.0)  # the build's process removes its mark, then exits
            return waited
        waited = time.perf_counter() - start
        time.sleep(0.2)
    raise RuntimeError(f"cold_start: a native entry's build in {folder} ran over {timeout} s")


def onnx_files():
    """{model: (path, input shape)} of the MLP and the CNN saved as ONNX files."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import compare_peers
    import onnx
    from benchmarks.common import cnn_weights
    from onnx import helper, numpy_helper
    graphs = {"mlp": (*compare_peers.onnx_mlp_graph(compare_peers.workloads()[3]), [1, 784]),
              "cnn": (*compare_peers.onnx_cnn_graph(cnn_weights()), [1, 1, 28, 28])}
    folder = tempfile.mkdtemp(prefix="cold-start-onnx-")
    files = {}
    for name, (nodes, inputs, outputs, inits, shape) in graphs.items():
        graph = helper.make_graph(nodes, name, inputs, outputs,
                                  [numpy_helper.from_array(v, k) for k, v in inits])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path = os.path.join(folder, f"{name}.onnx")
        onnx.save(model, path)
        files[name] = (path, shape)
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--models", default="mlp,cnn,lstm")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--installed", action="store_true")
    parser.add_argument("--cold-library", action="store_true")
    args = parser.parse_args()
    onnx = {}
    if not args.no_onnx:
        try:
            onnx = onnx_files()
        except ImportError as error:
            print(f"(no ONNX Runtime comparison: {error})")
    for model in args.models.split(","):
        for label, result in zip(("empty caches", "warm caches"), numbackend_runs(model, args.calls, args.installed, args.cold_library)):
            calls = result["calls"]
            later = max(calls[1:]) if len(calls) > 1 else float("nan")
            slowest = 2 + calls[1:].index(later) if len(calls) > 1 else 0
            line = (f"{model:5s} {label:12s}: start -> first prediction {result['to_first']:6.2f} s "
                    f"(the call {calls[0]:6.2f} s), slowest later call {later:6.3f} s (call {slowest})")
            if label == "empty caches" and result.get("build") is not None:
                line += f"; its native entry built {result['build']:.1f} s after it ended"
            if label == "warm caches":
                line += "; a native entry served it" if result["native"] else "; no native entry"
            if model in onnx and label == "warm caches":
                path, shape = onnx[model]
                ort_first = min(run_child(ONNX_CHILD, [path, json.dumps(shape)], dict(os.environ))["to_first"]
                                for _ in range(3))
                line += f"; ONNX Runtime {ort_first:.2f} s ({result['to_first'] / ort_first:.2f}x)"
            print(line, flush=True)
            if label == "warm caches" and "export" in result:
                line = (f"{model:5s} {'its export':12s}: start -> first prediction "
                        f"{result['export']:6.2f} s (NumPy alone: the native entry, loaded as an export)")
                if model in onnx:
                    line += f"; ONNX Runtime {ort_first:.2f} s ({result['export'] / ort_first:.2f}x)"
                print(line, flush=True)


if __name__ == "__main__":
    main()
