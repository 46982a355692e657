"""Time the workloads of WORKLOADS.md with numbackend, NumPy and, when installed,
JAX and ONNX Runtime, all in one run, and print each time with its ratio to ours.

    python asv_bench/compare_peers.py [--quick] [--no-startup]

Pin it for figures comparable with WORKLOADS.md's 2-core machine, e.g.
``taskset -c 0,1 python asv_bench/compare_peers.py``.  Absolute times move
between runs on shared machines: quote the ratios.
"""
import itertools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

F32 = np.float32
THREADS = int(os.environ.get("COMPARE_THREADS", "2"))


def median_time(fn, seconds):
    fn()
    times, deadline = [], time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def workloads():
    rng = np.random.default_rng(0)
    w1 = [rng.standard_normal((1024, 4096)).astype(F32) for _ in range(3)]
    w2a = rng.standard_normal((4096, 1000)).astype(F32)
    w2b = (rng.standard_normal((256, 1024)).astype(F32), rng.standard_normal((1024, 1024)).astype(F32),
           rng.standard_normal(1024).astype(F32))
    sizes = [784, 512, 512, 10]
    mlp = [(rng.standard_normal((m, n)).astype(F32) / F32(np.sqrt(m)), rng.standard_normal(n).astype(F32))
           for m, n in itertools.pairwise(sizes)]
    return w1, w2a, w2b, mlp, {b: rng.standard_normal((b, 784)).astype(F32) for b in (1, 256)}


def numbackend_fns(w1, w2a, w2b, mlp):
    import numbackend as K
    a, b, c = (K.placeholder((None, 4096)) for _ in range(3))
    f1 = K.function([a, b, c], [K.tanh(a * b + c) * K.sigmoid(a - c) + 0.5 * b * b])
    x = K.placeholder((None, 1000))
    f2a = K.function([x], [K.softmax(x)])
    x = K.placeholder((None, 1024))
    f2b = K.function([x], [K.relu(K.dot(x, K.variable(w2b[1])) + K.variable(w2b[2]))])
    x = K.placeholder((None, 784))
    h = x
    for i, (w, bias) in enumerate(mlp):
        h = K.dot(h, K.variable(w)) + K.variable(bias)
        h = K.relu(h) if i < 2 else K.softmax(h)
    f3 = K.function([x], [h])
    return {"W1": lambda: f1(w1), "W2a": lambda: f2a([w2a]), "W2b": lambda: f2b([w2b[0]]),
            "W3": lambda x: f3([x])}


def numpy_fns(w1, w2a, w2b, mlp):
    def softmax(z):
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def mlp_fn(x):
        h = x
        for i, (w, bias) in enumerate(mlp):
            h = h @ w + bias
            h = np.maximum(h, 0) if i < 2 else softmax(h)
        return h

    a, b, c = w1
    return {"W1": lambda: np.tanh(a * b + c) * (1 / (1 + np.exp(-(a - c)))) + F32(0.5) * b * b,
            "W2a": lambda: softmax(w2a), "W2b": lambda: np.maximum(w2b[0] @ w2b[1] + w2b[2], 0),
            "W3": mlp_fn}


def jax_fns(w1, w2a, w2b, mlp):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_platforms", "cpu")
    f1 = jax.jit(lambda a, b, c: jnp.tanh(a * b + c) * jax.nn.sigmoid(a - c) + 0.5 * b * b)
    f2a = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    f2b = jax.jit(lambda x, w, b: jax.nn.relu(x @ w + b))

    @jax.jit
    def f3(x, params):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            h = jax.nn.relu(h) if i < 2 else jax.nn.softmax(h, axis=-1)
        return h

    cpu = jax.devices("cpu")[0]
    put = lambda v: jax.device_put(v, cpu)
    d1 = [put(v) for v in w1]
    d2a, d2b = put(w2a), [put(v) for v in w2b]
    params = [(put(w), put(b)) for w, b in mlp]
    return {"W1": lambda: f1(*d1).block_until_ready(), "W2a": lambda: f2a(d2a).block_until_ready(),
            "W2b": lambda: f2b(*d2b).block_until_ready(),
            "W3": lambda x: f3(x, params).block_until_ready()}


def onnx_fns(w1, w2a, w2b, mlp):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    def session(nodes, inputs, outputs, inits=()):
        graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = THREADS
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    n = helper.make_node
    s1 = session([n("Mul", ["a", "b"], ["ab"]), n("Add", ["ab", "c"], ["abc"]), n("Tanh", ["abc"], ["t"]),
                  n("Sub", ["a", "c"], ["amc"]), n("Sigmoid", ["amc"], ["s"]), n("Mul", ["t", "s"], ["ts"]),
                  n("Mul", ["b", "b"], ["bb"]), n("Mul", ["bb", "half"], ["hbb"]), n("Add", ["ts", "hbb"], ["y"])],
                 [vi(v, ["n", 4096]) for v in "abc"], [vi("y", ["n", 4096])], [("half", np.array(0.5, F32))])
    s2a = session([n("Softmax", ["x"], ["y"], axis=-1)], [vi("x", ["n", 1000])], [vi("y", ["n", 1000])])
    s2b = session([n("MatMul", ["x", "w"], ["xw"]), n("Add", ["xw", "b"], ["z"]), n("Relu", ["z"], ["y"])],
                  [vi("x", ["n", 1024])], [vi("y", ["n", 1024])], [("w", w2b[1]), ("b", w2b[2])])
    nodes, inits, h = [], [], "x"
    for i, (w, b) in enumerate(mlp):
        nodes += [n("MatMul", [h, f"w{i}"], [f"m{i}"]), n("Add", [f"m{i}", f"b{i}"], [f"z{i}"])]
        nodes.append(n("Relu" if i < 2 else "Softmax", [f"z{i}"], [f"h{i}"]))
        inits += [(f"w{i}", w), (f"b{i}", b)]
        h = f"h{i}"
    s3 = session(nodes, [vi("x", ["n", 784])], [vi(h, ["n", 10])], inits)
    a, b, c = w1
    return {"W1": lambda: s1.run(None, {"a": a, "b": b, "c": c}), "W2a": lambda: s2a.run(None, {"x": w2a}),
            "W2b": lambda: s2b.run(None, {"x": w2b[0]}), "W3": lambda x: s3.run(None, {"x": x})}


def _cell(t, ours):
    shown = f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.3f} ms"
    return f"{shown} ({t / ours:4.2f}x)"


def numbackend_train(mlp):
    from benchmarks.bench_training import w7_step

    import numbackend as K
    step = w7_step(K, mlp)
    return lambda xy: step(list(xy))


def numpy_train(mlp):
    from benchmarks.bench_training import w7_numpy_step
    step = w7_numpy_step(mlp)
    return lambda xy: step(*xy)


def jax_train(mlp):
    import jax
    import jax.numpy as jnp
    from benchmarks.bench_training import LEARNING_RATE

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            h = jax.nn.relu(h) if i < 2 else h
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h), axis=-1))

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)

    state = {"params": [(jnp.asarray(w), jnp.asarray(b)) for w, b in mlp]}

    def run(xy):
        loss, state["params"] = step(state["params"], *xy)
        loss.block_until_ready()
    return run


def main():
    seconds = 0.5 if "--quick" in sys.argv else 2.0
    w1, w2a, w2b, mlp, mlp_inputs = workloads()
    systems = {"numbackend": numbackend_fns, "numpy": numpy_fns, "jax": jax_fns, "onnxruntime": onnx_fns}
    fns = {}
    for name, build in systems.items():
        try:
            fns[name] = build(w1, w2a, w2b, mlp)
        except ImportError as exc:
            print(f"# {name}: not installed ({exc.name})")
    cases = [("W1", None), ("W2a", None), ("W2b", None), ("W3a batch 1", 1), ("W3b batch 256", 256)]
    print(f"{'workload':16s}" + "".join(f"{name:>22s}" for name in fns))
    for label, batch in cases:
        key = label.split()[0][:2] if batch else label
        times = {}
        x = mlp_inputs.get(batch)
        for name, table in fns.items():
            fn = table["W3"] if batch else table[key]
            call = (lambda fn=fn, x=x: fn(x)) if batch else fn
            times[name] = median_time(call, seconds)
        print(f"{label:16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()),
              flush=True)
    from benchmarks.bench_training import w7_batch
    xy = w7_batch()
    train = {"numbackend": numbackend_train, "numpy": numpy_train, "jax": jax_train}
    times = {}
    for name, build in train.items():
        if name in fns:
            fn = build(mlp)
            times[name] = median_time(lambda fn=fn: fn(xy), seconds)
    print(f"{'W7 train step':16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()))
    print("(each cell: median time (time / numbackend's time); above 1.00x is slower than numbackend)")
    if "--no-startup" not in sys.argv:
        startup()


STARTUP = """
import time, numpy as np
t0 = time.perf_counter()
import numbackend as K
t1 = time.perf_counter()
x = K.placeholder((None, 784))
h = x
rng = np.random.default_rng(0)
for i, (m, n) in enumerate([(784, 512), (512, 512), (512, 10)]):
    h = K.dot(h, K.variable(rng.standard_normal((m, n)) / np.sqrt(m))) + K.variable(np.zeros(n))
    h = K.relu(h) if i < 2 else K.softmax(h)
K.function([x], [h])([np.ones((1, 784), np.float32)])
t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
"""


def startup():
    """W8: a new process importing numbackend, and building and running the W3 MLP."""
    import subprocess
    import tempfile
    env = dict(os.environ, NUMBACKEND_CACHE_DIR=tempfile.mkdtemp())
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")

    def run():
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", STARTUP], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        return float(out[0]), time.perf_counter() - start

    _, cold_total = run()
    warm = [run() for _ in range(5)]
    plain = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numbackend"], env=env, check=True)
        plain.append(time.perf_counter() - start)
    print(f"W8a python -c 'import numbackend': {min(plain):.3f} s (best of 5; in-process import "
          f"{min(w[0] for w in warm):.3f} s)")
    print(f"W8b new process -> first MLP prediction: warm kernel cache {min(w[1] for w in warm):.3f} s, "
          f"cold cache {cold_total:.3f} s")


if __name__ == "__main__":
    main()
