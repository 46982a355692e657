"""Time the workloads of PERFORMANCE.md with numbackend, NumPy and, when installed,
JAX and ONNX Runtime, all in one run, and print each time with its ratio to ours.

    python asv_bench/compare_peers.py [--quick] [--no-startup] [--no-models] [--busy-core]

The models (W4, W5, W6) are compared with JAX, ONNX Runtime and torch where
they are installed; each system's result is first checked against ours.
``--busy-core`` times everything beside a process that keeps the last CPU
this one may use busy, as a co-tenant on a shared machine would.

Pin it for figures comparable with PERFORMANCE.md's 2-core machine, e.g.
``taskset -c 0,1 python asv_bench/compare_peers.py``.  Absolute times move
between runs on shared machines: quote the ratios.
"""
import contextlib
import itertools
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Each tier is timed as it runs once compiled: a later tier compiling on the
# background worker during the timed calls would time the plan beside a compile
# (a server warms up first: Function.warmup).
os.environ.setdefault("NUMBACKEND_TUNE_TIER_COMPILE", "in_call")

F32 = np.float32
THREADS = int(os.environ.get("COMPARE_THREADS", "2"))


def median_times(calls, seconds, rounds=5):
    """{name: median time} of each call, timed in turns: ``rounds`` rounds, and in each
    a pause and then seconds / rounds of calls of every system in turn.  Thread pools
    that spin after their work (ONNX Runtime's, OpenBLAS's) would otherwise slow
    whichever system happens to be timed after them."""
    times = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            time.sleep(0.05)
            deadline = time.perf_counter() + seconds / rounds
            while time.perf_counter() < deadline or len(times[name]) < 5:
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


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
    import onnxruntime  # noqa: F401 - fail here, before the models are built, when missing
    from onnx import TensorProto, helper
    session = _onnx_session

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
    s3 = session(*onnx_mlp_graph(mlp))
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


def model_workloads():
    """W4 (mnist_cnn at batch 1 and 64), W5 (LSTM) and W6 (CTC loss and gradient):
    {label: {system: call}}, each system's call computing the same numbers."""
    from benchmarks import bench_rnn, common

    import numbackend as K
    cnn_w = common.cnn_weights()
    cnn_x = {b: common.cnn_inputs(b) for b in (1, 64)}
    lstm_w, lstm_x = bench_rnn.lstm_weights(), bench_rnn.lstm_inputs()
    ctc = common.ctc_inputs()
    cases = {f"W4 batch {b}": {} for b in (1, 64)}
    cases["W5 LSTM"], cases["W6 CTC"] = {}, {}
    f4 = common.cnn_function(K, cnn_w)
    x = K.placeholder((None, bench_rnn.STEPS, bench_rnn.INPUTS))
    f5 = K.function([x], [bench_rnn.lstm_last_output(x, *[K.variable(w) for w in lstm_w])])
    f6 = common.ctc_function(K, *ctc[0].shape, ctc[1].shape[1])
    for b in (1, 64):
        cases[f"W4 batch {b}"]["numbackend"] = lambda b=b: f4([cnn_x[b]])[0]
        cases[f"W4 batch {b}"]["numpy"] = lambda b=b: common.cnn_numpy(cnn_w, cnn_x[b])
    cases["W5 LSTM"]["numbackend"] = lambda: f5([lstm_x])[0]
    cases["W5 LSTM"]["numpy"] = lambda: bench_rnn.lstm_numpy(lstm_x, *lstm_w)
    cases["W6 CTC"]["numbackend"] = lambda: f6(list(ctc))[1]
    cases["W6 CTC"]["numpy"] = lambda: common.ctc_numpy(ctc[0], ctc[1])[1]
    for name, build in (("jax", _jax_models), ("onnxruntime", _onnx_models), ("torch", _torch_models)):
        try:
            built = build(cnn_w, cnn_x, lstm_w, lstm_x, ctc)
        except ImportError as exc:
            print(f"# {name}: not installed ({exc.name})")
            continue
        for label, call in built.items():
            cases[label][name] = call
    return cases


def _jax_models(cnn_w, cnn_x, lstm_w, lstm_x, ctc):
    import jax
    import jax.numpy as jnp
    from jax import lax
    (k1, c1), (k2, c2), (w3, b3), (w4, b4) = cnn_w

    @jax.jit
    def cnn(x):
        dims = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(lax.conv_general_dilated(x, k1, (1, 1), "VALID", dimension_numbers=dims) + c1)
        h = jax.nn.relu(lax.conv_general_dilated(h, k2, (1, 1), "VALID", dimension_numbers=dims) + c2)
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(h.reshape(h.shape[0], -1) @ w3 + b3)
        return jax.nn.softmax(h @ w4 + b4, axis=-1)

    kernel, recurrent, bias = lstm_w
    units = recurrent.shape[0]

    @jax.jit
    def lstm(x):
        projected = jnp.einsum("bti,ig->tbg", x, kernel) + bias

        def step(carry, z_x):
            h, c = carry
            z = z_x + h @ recurrent
            gate = lambda k: jnp.clip(0.2 * z[:, k * units:(k + 1) * units] + 0.5, 0, 1)
            c = gate(1) * c + gate(0) * jnp.tanh(z[:, 2 * units:3 * units])
            h = gate(3) * jnp.tanh(c)
            return (h, c), None

        zeros = jnp.zeros((x.shape[0], units), x.dtype)
        (h, _), _ = lax.scan(step, (zeros, zeros), projected)
        return h

    return {"W4 batch 1": lambda: cnn(cnn_x[1]).block_until_ready(),
            "W4 batch 64": lambda: cnn(cnn_x[64]).block_until_ready(),
            "W5 LSTM": lambda: lstm(lstm_x).block_until_ready()}


def onnx_mlp_graph(mlp):
    """(nodes, inputs, outputs, initialisers) of the W3 MLP as an ONNX graph."""
    from onnx import TensorProto, helper
    n = helper.make_node
    nodes, inits, h = [], [], "x"
    for i, (w, b) in enumerate(mlp):
        nodes += [n("MatMul", [h, f"w{i}"], [f"m{i}"]), n("Add", [f"m{i}", f"b{i}"], [f"z{i}"])]
        nodes.append(n("Relu" if i < 2 else "Softmax", [f"z{i}"], [f"h{i}"]))
        inits += [(f"w{i}", w), (f"b{i}", b)]
        h = f"h{i}"
    return (nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 784])],
            [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["n", 10])], inits)


def onnx_cnn_graph(cnn_w):
    """(nodes, inputs, outputs, initialisers) of the W4 CNN as an ONNX graph: NCHW, as a
    converted model takes it; the flatten goes back to Keras's NHWC order."""
    from onnx import TensorProto, helper
    n = helper.make_node
    (k1, c1), (k2, c2), (w3, b3), (w4, b4) = cnn_w
    nodes = [n("Conv", ["x", "k1", "c1"], ["h1"]), n("Relu", ["h1"], ["r1"]),
             n("Conv", ["r1", "k2", "c2"], ["h2"]), n("Relu", ["h2"], ["r2"]),
             n("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Transpose", ["p"], ["pt"], perm=[0, 2, 3, 1]), n("Flatten", ["pt"], ["f"]),
             n("Gemm", ["f", "w3", "b3"], ["d"]), n("Relu", ["d"], ["dr"]),
             n("Gemm", ["dr", "w4", "b4"], ["z"]), n("Softmax", ["z"], ["y"], axis=-1)]
    inits = [("k1", k1.transpose(3, 2, 0, 1).copy()), ("c1", c1), ("k2", k2.transpose(3, 2, 0, 1).copy()),
             ("c2", c2), ("w3", w3), ("b3", b3), ("w4", w4), ("b4", b4)]
    return (nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 28, 28])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits)


def _onnx_models(cnn_w, cnn_x, lstm_w, lstm_x, ctc):
    import onnxruntime  # noqa: F401 - fail here, before the model is built, when missing
    from onnx import TensorProto, helper
    n = helper.make_node
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    cnn = _onnx_session(*onnx_cnn_graph(cnn_w))
    nchw = {b: cnn_x[b].transpose(0, 3, 1, 2).copy() for b in cnn_x}

    kernel, recurrent, bias = lstm_w
    units = recurrent.shape[0]
    order = [0, 3, 1, 2]  # ONNX gates i, o, f, c from Keras's i, f, c, o
    pick = lambda m: np.concatenate([m[..., g * units:(g + 1) * units] for g in order], axis=-1)
    lstm_inits = [("W", pick(kernel).T[None].copy()), ("R", pick(recurrent).T[None].copy()),
                  ("B", np.concatenate([pick(bias), np.zeros(4 * units, F32)])[None])]
    lstm_nodes = [n("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                  n("LSTM", ["xt", "W", "R", "B"], ["all", "h"], hidden_size=units,
                    activations=["HardSigmoid", "Tanh", "Tanh"], activation_alpha=[0.2, 1.0, 1.0],
                    activation_beta=[0.5, 0.0, 0.0]),
                  n("Squeeze", ["h", "axis0"], ["y"])]
    lstm_inits.append(("axis0", np.array([0], np.int64)))
    batch, steps, inputs = lstm_x.shape
    lstm = _onnx_session(lstm_nodes, [vi("x", [batch, steps, inputs])], [vi("y", [batch, units])],
                         lstm_inits)
    return {"W4 batch 1": lambda: cnn.run(None, {"x": nchw[1]})[0],
            "W4 batch 64": lambda: cnn.run(None, {"x": nchw[64]})[0],
            "W5 LSTM": lambda: lstm.run(None, {"x": lstm_x})[0]}


def _onnx_session(nodes, inputs, outputs, inits=()):
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _torch_models(cnn_w, cnn_x, lstm_w, lstm_x, ctc):
    import torch
    torch.set_num_threads(THREADS)
    y_pred, labels, input_length, label_length = ctc
    classes = y_pred.shape[2]
    targets = torch.from_numpy(labels.astype(np.int64))
    lengths_in = torch.from_numpy(input_length[:, 0].astype(np.int64))
    lengths_label = torch.from_numpy(label_length[:, 0].astype(np.int64))

    def ctc_call():
        # Keras's ctc_batch_cost: log(y_pred + epsilon), blank last, per-sample losses.
        y = torch.from_numpy(y_pred).requires_grad_()
        log_probs = torch.log(y + 1e-7).transpose(0, 1)
        loss = torch.nn.functional.ctc_loss(log_probs, targets, lengths_in, lengths_label,
                                            blank=classes - 1, reduction="sum", zero_infinity=False)
        loss.backward()
        return y.grad.numpy()

    return {"W6 CTC": ctc_call}


def _check_same(label, calls):
    """Every system must compute numbackend's numbers, or its time means nothing."""
    ours = np.asarray(calls["numbackend"]())
    for name, call in calls.items():
        theirs = np.asarray(call())
        scale = np.abs(ours).max()
        if theirs.shape != ours.shape or not np.allclose(theirs, ours, rtol=1e-3, atol=1e-4 * scale):
            raise AssertionError(f"{label}: {name} computes other numbers than numbackend")


@contextlib.contextmanager
def busy_core():
    """A process spinning on the last CPU this one may use, for the block's duration."""
    cpu = max(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c",
                                f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    time.sleep(0.2)
    try:
        yield cpu
    finally:
        spinner.kill()
        spinner.wait()


def main():
    if "--busy-core" in sys.argv:
        with busy_core() as cpu:
            print(f"# a process keeps CPU {cpu} busy throughout")
            compare()
    else:
        compare()


def compare():
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
        x = mlp_inputs.get(batch)
        calls = {}
        for name, table in fns.items():
            fn = table["W3"] if batch else table[key]
            calls[name] = (lambda fn=fn, x=x: fn(x)) if batch else fn
        times = median_times(calls, seconds)
        print(f"{label:16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()),
              flush=True)
    from benchmarks.bench_training import w7_batch
    xy = w7_batch()
    train = {"numbackend": numbackend_train, "numpy": numpy_train, "jax": jax_train}
    steps = {name: build(mlp) for name, build in train.items() if name in fns}
    calls = {name: (lambda step=step: step(xy)) for name, step in steps.items()}
    times = median_times(calls, seconds)
    print(f"{'W7 train step':16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()))
    if "--no-models" not in sys.argv:
        for label, calls in model_workloads().items():
            _check_same(label, calls)
            times = median_times(calls, seconds)
            print(f"{label:16s}" + "".join(f"{name}: {_cell(t, times['numbackend'])}  "
                                            for name, t in times.items()), flush=True)
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
    # Python as it runs by default, caching bytecode: with PYTHONDONTWRITEBYTECODE
    # set (some sandboxes set it), every start compiles numbackend's sources and
    # the kernel cache's modules again (0.13 s of a 0.55 s W8b on a slow VM).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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
