"""Time the workloads of PERFORMANCE.md with numbackend, NumPy and, when installed,
JAX, ONNX Runtime and torch, all in one run, and print each time with its ratio to ours.

    python asv_bench/compare_peers.py [--quick] [--no-startup] [--no-models] [--busy-core]
                                      [--threads N] [--pin] [--scaling [COUNTS]]

Each system's result is first checked against ours.  The models (W4, W5, W6)
are compared with JAX, ONNX Runtime and torch where they are installed (torch:
W4 and W6; its LSTM has sigmoid gates where Keras's has hard-sigmoid ones).
``--busy-core`` times everything beside a process that keeps the last CPU
this one may use busy, as a co-tenant on a shared machine would.

``--threads N`` holds every library to N threads: numbackend, OpenBLAS, MKL,
OpenMP and Numba through their environment variables, ONNX Runtime's
intra-op threads, torch.set_num_threads, and JAX on the CPU (XLA sizes its
pool by the CPUs the process may use, so only ``--pin`` holds it to N; with
N = 1 its flags turn its threads off).  The variables are read when the
libraries load, so the script starts itself again with them set.  ``--pin``
holds the process to the first N CPUs it may use (N: ``--threads``, else 2).
``--scaling 1,2,4,8,16`` (the default list) runs each count in a new process
with ``--threads`` (and ``--pin`` where given), skips the counts above the
CPUs this process may use, and then prints one table: per workload, our time
and speed-up against the lowest count, and each peer's time over ours.

Pin it for figures comparable with PERFORMANCE.md's 2-core machine
(``--threads 2 --pin``).  Absolute times move between runs on shared
machines: quote the ratios.
"""
import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

F32 = np.float32
# the thread count of ONNX Runtime and torch (--threads sets it)
THREADS = int(os.environ.get("COMPARE_THREADS", "2"))
SCALING_COUNTS = (1, 2, 4, 8, 16)
MAX_THREADS = 64
# the environment variables that hold a library's thread pool to a count
THREAD_VARIABLES = ("NUMBACKEND_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS", "NUMBA_NUM_THREADS", "COMPARE_THREADS")
# XLA's flags that run its CPU code on the calling thread alone
XLA_ONE_THREAD = ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1")


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


def torch_fns(w1, w2a, w2b, mlp):
    import torch
    torch.set_num_threads(THREADS)
    a, b, c = (torch.from_numpy(v) for v in w1)
    x2a = torch.from_numpy(w2a)
    x2b, w2, b2 = (torch.from_numpy(v) for v in w2b)
    params = [(torch.from_numpy(w), torch.from_numpy(bias)) for w, bias in mlp]

    @torch.inference_mode()
    def f1():
        return torch.tanh(a * b + c) * torch.sigmoid(a - c) + 0.5 * b * b

    @torch.inference_mode()
    def f3(x):
        h = torch.from_numpy(x)
        for i, (w, bias) in enumerate(params):
            h = torch.addmm(bias, h, w)
            h = torch.relu(h) if i < 2 else torch.softmax(h, dim=-1)
        return h

    return {"W1": f1, "W2a": torch.inference_mode()(lambda: torch.softmax(x2a, dim=-1)),
            "W2b": torch.inference_mode()(lambda: torch.relu(torch.addmm(b2, x2b, w2))), "W3": f3}


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


def torch_train(mlp):
    import torch
    from benchmarks.bench_training import LEARNING_RATE
    torch.set_num_threads(THREADS)
    params = [torch.tensor(v, requires_grad=True) for wb in mlp for v in wb]

    def run(xy):
        x, y = (torch.from_numpy(v) for v in xy)
        h = x
        for i in range(0, len(params), 2):
            h = torch.addmm(params[i + 1], h, params[i])
            h = torch.relu(h) if i < len(params) - 2 else h
        loss = -(y * torch.log_softmax(h, dim=-1)).sum(dim=-1).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= LEARNING_RATE * g
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

    functional = torch.nn.functional
    (k1, c1), (k2, c2), (w3, b3), (w4, b4) = cnn_w
    # the kernels in torch's (out, in, height, width) order, from Keras's (height, width, in, out)
    kernels = [torch.from_numpy(k.transpose(3, 2, 0, 1).copy()) for k in (k1, k2)]
    c1, c2, w3, b3, w4, b4 = (torch.from_numpy(v) for v in (c1, c2, w3, b3, w4, b4))
    nchw = {b: torch.from_numpy(cnn_x[b].transpose(0, 3, 1, 2).copy()) for b in cnn_x}

    @torch.inference_mode()
    def cnn(x):
        h = torch.relu(functional.conv2d(x, kernels[0], c1))
        h = torch.relu(functional.conv2d(h, kernels[1], c2))
        h = functional.max_pool2d(h, 2)
        h = h.permute(0, 2, 3, 1).reshape(h.shape[0], -1)  # flattened in Keras's NHWC order
        h = torch.relu(torch.addmm(b3, h, w3))
        return torch.softmax(torch.addmm(b4, h, w4), dim=-1)

    return {"W4 batch 1": lambda: cnn(nchw[1]), "W4 batch 64": lambda: cnn(nchw[64]),
            "W6 CTC": ctc_call}


def _result(value):
    """A call's result as an array: ONNX Runtime's and numbackend's come in a list."""
    return np.asarray(value[0] if isinstance(value, list) else value)


def _check_same(label, calls):
    """Every system must compute numbackend's numbers, or its time means nothing."""
    ours = _result(calls["numbackend"]())
    for name, call in calls.items():
        theirs = _result(call())
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


def thread_count(text):
    """A thread count of the command line: a whole number from 1 to MAX_THREADS."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"a thread count is a whole number from 1 to {MAX_THREADS}, "
                                         f"got {text!r}")
    return count


def thread_counts(text):
    """The thread counts of ``--scaling``: whole numbers separated by commas, sorted."""
    return sorted({thread_count(part) for part in text.split(",")})


def parse_args(argv):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="time each workload 0.5 s instead of 2 s")
    parser.add_argument("--no-startup", action="store_true", help="leave out W8, a new process's start")
    parser.add_argument("--no-models", action="store_true", help="leave out W4, W5 and W6")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep the last CPU this process may use busy with another process")
    parser.add_argument("--threads", type=thread_count, metavar="N",
                        help="hold every library to N threads")
    parser.add_argument("--pin", action="store_true",
                        help="run on the first N CPUs this process may use (N: --threads, else 2)")
    parser.add_argument("--scaling", nargs="?", type=thread_counts, metavar="COUNTS",
                        const=list(SCALING_COUNTS),
                        help="run each thread count (default 1,2,4,8,16) in a new process and "
                             "print a table of them")
    # where a --scaling run's process writes its times, as JSON
    parser.add_argument("--results", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scaling and args.threads is not None:
        parser.error("--scaling runs its own thread counts: leave --threads out")
    return args


def thread_environment(count, environ):
    """The variables to set in ``environ`` (a mapping like os.environ) for every
    library to run on ``count`` threads; XLA_FLAGS keeps the other flags it has."""
    env = {name: str(count) for name in THREAD_VARIABLES}
    env["JAX_PLATFORMS"] = "cpu"
    flags = [flag for flag in environ.get("XLA_FLAGS", "").split()
             if flag.split("=")[0] not in {f.split("=")[0] for f in XLA_ONE_THREAD}]
    env["XLA_FLAGS"] = " ".join(flags + (list(XLA_ONE_THREAD) if count == 1 else []))
    return env


def first_cpus(count, allowed):
    """The first ``count`` of the CPUs ``allowed``, for --pin."""
    allowed = sorted(allowed)
    if count > len(allowed):
        raise ValueError(f"compare_peers: --pin: {count} threads, but this process may use only "
                         f"{len(allowed)} CPUs ({allowed})")
    return allowed[:count]


def scaling_counts(counts, cpus):
    """(the thread counts of ``counts`` to run, those skipped) on ``cpus`` CPUs."""
    return [n for n in counts if n <= cpus], [n for n in counts if n > cpus]


def machine():
    """The CPU's model name and whether it has AVX-512, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "an unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "an unknown CPU")
    return f"{model}, {'AVX-512' if ' avx512f' in info else 'no AVX-512'}"


def main():
    args = parse_args(sys.argv[1:])
    # Each tier is timed as it runs once compiled: a later tier compiling on the
    # background worker during the timed calls would time the plan beside a compile
    # (a server warms up first: Function.warmup).
    os.environ.setdefault("NUMBACKEND_TUNE_TIER_COMPILE", "in_call")
    # nor a native entry's build (numbackend/native.py), a process of its own beside them
    os.environ.setdefault("NUMBACKEND_TUNE_NATIVE_TIER", "off")
    if args.scaling:
        scaling(args)
        return
    if args.pin:
        os.sched_setaffinity(0, first_cpus(args.threads or THREADS, os.sched_getaffinity(0)))
    if args.threads is not None:
        env = thread_environment(args.threads, os.environ)
        if any(os.environ.get(name) != value for name, value in env.items()):
            # NumPy, and with it OpenBLAS, is loaded already: start again with them set
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
                      {**os.environ, **env})
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {machine()}; this process {'is pinned to' if args.pin else 'may use'} CPUs {cpus}; "
          f"threads: numbackend {os.environ.get('NUMBACKEND_NUM_THREADS', 'one per CPU')}, "
          f"ONNX Runtime and torch {THREADS}, JAX one per CPU"
          + (" (XLA's threads off)" if args.threads == 1 else ""), flush=True)
    if args.busy_core:
        with busy_core() as cpu:
            print(f"# a process keeps CPU {cpu} busy throughout")
            results = compare(args)
    else:
        results = compare(args)
    if args.results:
        with open(args.results, "w") as f:
            json.dump(results, f)


def compare(args):
    """Times every workload and prints them; {workload: {system: median time in s}}."""
    seconds = 0.5 if args.quick else 2.0
    w1, w2a, w2b, mlp, mlp_inputs = workloads()
    systems = {"numbackend": numbackend_fns, "numpy": numpy_fns, "jax": jax_fns, "onnxruntime": onnx_fns,
               "torch": torch_fns}
    fns = {}
    for name, build in systems.items():
        try:
            fns[name] = build(w1, w2a, w2b, mlp)
        except ImportError as exc:
            print(f"# {name}: not installed ({exc.name})")
    results = {}
    cases = [("W1", None), ("W2a", None), ("W2b", None), ("W3a batch 1", 1), ("W3b batch 256", 256)]
    print(f"{'workload':16s}" + "".join(f"{name:>22s}" for name in fns))
    for label, batch in cases:
        key = label.split()[0][:2] if batch else label
        x = mlp_inputs.get(batch)
        calls = {}
        for name, table in fns.items():
            fn = table["W3"] if batch else table[key]
            calls[name] = (lambda fn=fn, x=x: fn(x)) if batch else fn
        _check_same(label, calls)
        times = results[label] = median_times(calls, seconds)
        print(f"{label:16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()),
              flush=True)
    from benchmarks.bench_training import w7_batch
    xy = w7_batch()
    train = {"numbackend": numbackend_train, "numpy": numpy_train, "jax": jax_train, "torch": torch_train}
    steps = {name: build(mlp) for name, build in train.items() if name in fns}
    calls = {name: (lambda step=step: step(xy)) for name, step in steps.items()}
    times = results["W7 train step"] = median_times(calls, seconds)
    print(f"{'W7 train step':16s}" + "".join(f"{_cell(t, times['numbackend']):>22s}" for t in times.values()))
    if not args.no_models:
        for label, calls in model_workloads().items():
            _check_same(label, calls)
            times = results[label] = median_times(calls, seconds)
            print(f"{label:16s}" + "".join(f"{name}: {_cell(t, times['numbackend'])}  "
                                            for name, t in times.items()), flush=True)
    print("(each cell: median time (time / numbackend's time); above 1.00x is slower than numbackend)")
    if not args.no_startup:
        startup()
    return results


def scaling(args):
    """Runs compare() in a new process per thread count of ``args.scaling`` and prints
    the scaling table."""
    cpus = len(os.sched_getaffinity(0))
    counts, skipped = scaling_counts(args.scaling, cpus)
    notes = [f"# {n} threads: skipped, this process may use {cpus} CPUs" for n in skipped]
    for note in notes:
        print(note, flush=True)
    passed = [f"--{name.replace('_', '-')}" for name in ("quick", "no_models", "busy_core", "pin")
              if getattr(args, name)]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for n in counts:
            print(f"## {n} thread{'s' if n > 1 else ''}", flush=True)
            path = os.path.join(folder, f"{n}.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--threads", str(n),
                            "--no-startup", "--results", path, *passed], check=True)
            with open(path) as f:
                results[n] = json.load(f)
    print()
    print("\n".join(scaling_table(results) + notes))


def scaling_table(results):
    """The lines of the scaling table of ``results``, {thread count: {workload:
    {system: time}}}: per workload, numbackend's time and its speed-up against the
    lowest count, then each other system's time over numbackend's."""
    counts = sorted(results)
    base = counts[0]
    workloads = list(dict.fromkeys(label for n in counts for label in results[n]))
    width = 20
    lines = [f"{'workload':16s}{'system':13s}" + "".join(
        f"{f'{n} thread' + ('s' if n > 1 else ''):>{width}s}" for n in counts)]
    for label in workloads:
        systems = list(dict.fromkeys(name for n in counts for name in results[n].get(label, {})))
        for name in systems:
            cells = []
            for n in counts:
                times = results[n].get(label, {})
                if name not in times or "numbackend" not in times:
                    cells.append("-")
                elif name == "numbackend":
                    ours, first = times[name], results[base].get(label, {}).get(name)
                    shown = f"{ours * 1e6:.1f} us" if ours < 1e-3 else f"{ours * 1e3:.3f} ms"
                    cells.append(shown + (f" ({first / ours:.2f}x)" if first else ""))
                else:
                    cells.append(f"{times[name] / times['numbackend']:.2f}")
            lines.append(f"{label if name == systems[0] else '':16s}{name:13s}"
                         + "".join(f"{cell:>{width}s}" for cell in cells))
    lines.append(f"(numbackend: median time (speed-up against {base} thread{'s' if base > 1 else ''}); "
                 "other systems: their time / numbackend's, above 1.00 slower than numbackend)")
    return lines


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
