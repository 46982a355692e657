"""Keras 2.2.5's mnist_cnn (examples/mnist_cnn.py, its Dropout layers included)
on numbackend against the same network written with K.* in one K.function, in
one process, on the same weights and input, the outputs checked equal.

    KERAS_BACKEND=numbackend taskset -c 0,1 python asv_bench/keras_mnist_cnn.py [--calls N] [--batch B]

Prints the first call of each (loading its kernels from the kernel cache) and
the call that compiles its plan as one call, each in a process of its own
(``--cold``: compiling them, with an empty kernel cache each); then the medians of N
interleaved calls of the Keras predict function itself
(``model.predict_function([x, 0.])``) and the K.* function, and again with
``model.predict(x, batch_size=B)`` and ``model.predict_on_batch(x)``, which end
in the predict function, each with its ratio to the K.* function; then one training step
(``model.train_on_batch``, SGD) next to the same step written with K.*, with
the steps of each plan.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # numbackend of this tree
sys.path.insert(0, HERE)  # the benchmarks' shared builders

from benchmarks.bench_keras import import_keras, interleaved_times, keras_mnist_cnn
from benchmarks.common import cnn_function, cnn_graph, cnn_inputs, cnn_weights, timed

LEARNING_RATE = 0.01


def kstar_step(K, weights, lr=LEARNING_RATE):
    """The training step with K.*: mean categorical cross-entropy, plain SGD."""
    x, y = K.placeholder((None, 28, 28, 1)), K.placeholder((None, 10))
    probs, params = cnn_graph(K, weights, x)
    loss = K.mean(K.categorical_crossentropy(y, probs))
    grads = K.gradients(loss, params)
    return K.function([x, y], [loss], updates=[(p, p - lr * g) for p, g in zip(params, grads)])


def print_medians(times, base):
    """Each call's median time and its ratio to ``base``'s: of the medians, and the
    median of the ratios within a round (steadier on a busy machine)."""
    reference = np.array(times[base])
    for name, t in times.items():
        t = np.array(t)
        print(f"  {name:30s} {us(float(np.median(t)))}  ({np.median(t) / np.median(reference):.3f}x "
              f"the {base}'s median; median ratio in a round {np.median(t / reference):.3f})")
    return {name: float(np.median(t)) for name, t in times.items()}


def us(seconds):
    return f"{seconds * 1e6:9.1f} us" if seconds < 0.01 else f"{seconds * 1e3:9.2f} ms"


def first_calls(which, batch):
    """In this process: {'build': s, 'first': s, 'one_call': s} of the Keras model's
    predict (``which`` 'keras': model.predict builds its function) or the K.*
    function ('kstar'); 'one_call' is the slowest of the calls up to the one
    that compiles the plan as one call."""
    import numbackend as K
    from numbackend import tuning
    keras = import_keras()
    weights, x = cnn_weights(), cnn_inputs(batch)
    if which == "keras":
        model, build = timed(lambda: keras_mnist_cnn(keras, weights,
                                                     keras.optimizers.SGD(lr=LEARNING_RATE)))
        _, first = timed(lambda: model.predict(x, batch_size=batch))
        fn = model.predict_function
        fed = [x, 0.0] if len(fn.inputs) == 2 else [x]
    else:
        fn, build = timed(lambda: cnn_function(K, weights))
        fed = [x]
        _, first = timed(lambda: fn(fed))
    one_call = max(timed(lambda: fn(fed))[1] for _ in range(tuning.ONE_CALL_AFTER))
    return {"build": build, "first": first, "one_call": one_call, "compiled": bool(fn._one_call)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="timed calls of each (default 500)")
    parser.add_argument("--batch", type=int, default=1, help="images per call (default 1)")
    parser.add_argument("--train-batch", type=int, default=64, help="images per training step")
    parser.add_argument("--train-calls", type=int, default=10,
                        help="timed training steps of each (default 10)")
    parser.add_argument("--no-train", action="store_true", help="skip the training step")
    parser.add_argument("--cold", action="store_true",
                        help="first calls with an empty kernel cache (minutes)")
    parser.add_argument("--first-calls", choices=("keras", "kstar"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_calls:
        print(json.dumps(first_calls(args.first_calls, args.batch)))
        return

    for which, name in (("keras", "Keras model.predict"), ("kstar", "K.* function")):
        env = dict(os.environ)
        if args.cold:
            env["NUMBACKEND_CACHE_DIR"] = tempfile.mkdtemp(prefix="numbackend-cold-")
        command = [sys.executable, os.path.abspath(__file__), "--first-calls", which,
                   "--batch", str(args.batch)]
        if not args.cold:  # a first process fills the cache where it lacks a kernel
            subprocess.run(command, env=env, capture_output=True, check=True)
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        t = json.loads(out.strip().splitlines()[-1])
        print(f"{name:20s} in a new process{' (cold cache)' if args.cold else ''}: build "
              f"{us(t['build'])}, first call {us(t['first'])}, the call compiling it as one call "
              f"{us(t['one_call'])} ({'compiled' if t['compiled'] else 'NOT compiled'})")

    start = time.perf_counter()
    keras = import_keras()
    print(f"import keras + numbackend: {time.perf_counter() - start:.2f} s")

    import numbackend as K
    from numbackend import tuning

    weights = cnn_weights()
    x = cnn_inputs(args.batch)
    model = keras_mnist_cnn(keras, weights, keras.optimizers.SGD(lr=LEARNING_RATE))
    fn = cnn_function(K, weights)
    keras_out, kstar_out = model.predict(x, batch_size=args.batch), fn([x])[0]
    predict_function = model.predict_function
    fed = [x, 0.0] if len(predict_function.inputs) == 2 else [x]  # the learning phase
    difference = float(np.abs(keras_out - kstar_out).max())
    print(f"outputs: max |Keras - K.*| = {difference:.3g} "
          f"({'identical' if difference == 0 else 'differ'})")
    np.testing.assert_allclose(keras_out, kstar_out, rtol=1e-5, atol=1e-7)
    for _ in range(tuning.ONE_CALL_AFTER):
        predict_function(fed), fn([x])
    print(f"one compiled call: Keras {bool(predict_function._one_call)}, K.* {bool(fn._one_call)}")
    print("Keras predict plan:\n" + K.explain(predict_function))
    np.testing.assert_array_equal(predict_function(fed)[0], fn([x])[0])

    print(f"\nbatch {args.batch}, medians of {args.calls} interleaved calls, the two functions:")
    print_medians(interleaved_times({"predict_function([x, 0.])": lambda: predict_function(fed),
                                     "K.* function([x])": lambda: fn([x])}, args.calls),
                  "K.* function([x])")
    # model.predict and predict_on_batch call predict_function: its weights stay in
    # the caches through the three, which favours it over the K.* function here
    print(f"the same with Keras's own calls, {args.calls} interleaved calls:")
    calls = {
        "model.predict(x, batch_size)": lambda: model.predict(x, batch_size=args.batch),
        "model.predict_on_batch(x)": lambda: model.predict_on_batch(x),
        "predict_function([x, 0.])": lambda: predict_function(fed),
        "K.* function([x])": lambda: fn([x]),
    }
    medians = print_medians(interleaved_times(calls, args.calls), "K.* function([x])")
    print(f"  Keras's own Python (the time over predict_function's): in model.predict "
          f"{us(medians['model.predict(x, batch_size)'] - medians['predict_function([x, 0.])'])}, "
          f"in predict_on_batch "
          f"{us(medians['model.predict_on_batch(x)'] - medians['predict_function([x, 0.])'])}")

    if args.no_train:
        return
    xt = cnn_inputs(args.train_batch)
    yt = np.eye(10, dtype=np.float32)[np.random.default_rng(1).integers(0, 10, args.train_batch)]
    _, keras_step_first = timed(lambda: model.train_on_batch(xt, yt))
    step, kstar_step_build = timed(lambda: kstar_step(K, weights))
    _, kstar_step_first = timed(lambda: step([xt, yt]))
    print(f"\ntraining step, batch {args.train_batch}: first call Keras {us(keras_step_first)}, "
          f"K.* build {us(kstar_step_build)} + first call {us(kstar_step_first)} (after Keras's)")
    steps = K.explain(model.train_function).splitlines()
    print(f"  Keras train plan: {len(steps)} steps, {sum('identity' in s for s in steps)} with "
          f"identity, {sum('random_' in s for s in steps)} drawing random numbers, "
          f"{sum('where' in s for s in steps)} with a 'where'; the K.* step's plan: "
          f"{len(K.explain(step).splitlines())} steps")
    times = interleaved_times({"model.train_on_batch": lambda: model.train_on_batch(xt, yt),
                               "K.* step": lambda: step([xt, yt])}, args.train_calls, untimed=1)
    print_medians(times, "K.* step")

if __name__ == "__main__":
    main()
