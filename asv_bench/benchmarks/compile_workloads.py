"""The workloads whose compiles ``python -m numbackend compile-report`` records and
times: W1-W7, the Keras example models, recurrent layers at batch 1 and 32, and
the convolution and pooling paths in float32 and float64.

Each workload builds its functions and calls them past ONE_CALL_AFTER at batch 1
(where a function becomes one compiled call, whose compile brings new library
signatures) and once at a larger batch.  Nothing here is timed by asv itself
(bench_compile.py times these in fresh processes)."""
import numpy as np

from .common import F32, rng


def _calls(fn, inputs):
    """Call ``fn(inputs)`` past the point where a small call becomes one compiled call."""
    from numbackend import tuning
    for _ in range(tuning.ONE_CALL_AFTER + 2):
        fn(inputs)


def w1():
    import numbackend as K

    from .common import w1_function
    fn = w1_function(K)
    r = rng()
    _calls(fn, [r.standard_normal((1, 4096)).astype(F32) for _ in range(3)])
    fn([r.standard_normal((1024, 4096)).astype(F32) for _ in range(3)])


def w2():
    import numbackend as K
    x = K.placeholder((None, 1000))
    softmax = K.function([x], [K.softmax(x)])
    r = rng()
    _calls(softmax, [r.standard_normal((1, 1000)).astype(F32)])
    softmax([r.standard_normal((4096, 1000)).astype(F32)])
    x = K.placeholder((None, 1024))
    w = r.standard_normal((1024, 1024)).astype(F32)
    dense = K.function([x], [K.relu(K.dot(x, K.variable(w)) + K.variable(np.zeros(1024, F32)))])
    _calls(dense, [r.standard_normal((1, 1024)).astype(F32)])
    dense([r.standard_normal((256, 1024)).astype(F32)])


def w3():
    import numbackend as K

    from .common import mlp_function, mlp_weights
    fn = mlp_function(K, mlp_weights())
    _calls(fn, [rng().standard_normal((1, 784)).astype(F32)])
    fn([rng().standard_normal((256, 784)).astype(F32)])


def w4():
    import numbackend as K

    from .bench_conv import cnn_batch, cnn_step
    from .common import cnn_function, cnn_inputs, cnn_weights
    fn = cnn_function(K, cnn_weights())
    _calls(fn, [cnn_inputs(1)])
    fn([cnn_inputs(64)])
    x, y = cnn_batch(64)
    cnn_step(K, cnn_weights())([x, y])


def w5():
    import numbackend as K

    from .bench_rnn import STEPS, lstm_inputs, lstm_last_output, lstm_training_step, lstm_weights
    x = K.placeholder((None, STEPS, lstm_inputs().shape[-1]))
    fn = K.function([x], [lstm_last_output(x, *[K.variable(w) for w in lstm_weights()])])
    inputs = lstm_inputs()
    _calls(fn, [inputs[:1]])
    fn([inputs])
    from numbackend import tuning
    with tuning.override(SCAN_SPLIT_MIN_ROWS_PER_THREAD=len(inputs), SCAN_SHARE_MIN_THREADS=2):
        fn([inputs])  # threads sharing each step, where there are two or more
    step = lstm_training_step()
    step([inputs, np.zeros((len(inputs), 128), F32)])


def w6():
    import numbackend as K

    from .common import ctc_function, ctc_inputs
    y_pred, labels, input_length, label_length = ctc_inputs()
    fn = ctc_function(K, *y_pred.shape, labels.shape[1])
    fn([y_pred, labels, input_length, label_length])
    x = K.placeholder((None, y_pred.shape[1], y_pred.shape[2]))
    lengths = K.placeholder((None,), dtype="int32")
    for greedy in (True, False):
        decoded, _ = K.ctc_decode(x, lengths, greedy=greedy, beam_width=10)
        K.function([x, lengths], decoded)([y_pred, input_length[:, 0]])


def w7():
    import numbackend as K

    from .bench_training import w7_batch, w7_step
    from .common import mlp_weights
    step = w7_step(K, mlp_weights())
    x, y = w7_batch()
    _calls(step, [x[:1], y[:1]])
    step([x, y])


def conv_paths():
    """Every convolution path forward and backward, then max and average pooling,
    in float32 and float64."""
    import numbackend as K
    from numbackend import tuning
    r = rng()
    for dtype in (np.float32, np.float64):
        data = r.standard_normal((2, 12, 12, 8)).astype(dtype)
        for path, size in (("pointwise", 1), ("direct", 3), ("winograd", 3), ("columns", 3)):
            kernel = r.standard_normal((size, size, 8, 16)).astype(dtype)
            with tuning.override(CONV_PATH=path):
                x = K.placeholder((None, 12, 12, 8), dtype=str(np.dtype(dtype)))
                w = K.variable(kernel, dtype=str(np.dtype(dtype)))
                y = K.relu(K.conv2d(x, w, padding="same"))
                for mode in ("max", "avg"):
                    pooled = K.pool2d(y, (2, 2), strides=(2, 2), pool_mode=mode)
                    grads = K.gradients(K.sum(pooled), [x, w])
                    fn = K.function([x], [pooled] + grads)
                    _calls(fn, [data[:1]])
                    fn([data])


def other_ops():
    """Resizing, depthwise convolution, sparse products and row reductions, forward
    and backward, in float32 and float64."""
    import numbackend as K
    r = rng()
    for dtype in ("float32", "float64"):
        data = r.standard_normal((2, 8, 8, 4)).astype(dtype)
        x = K.placeholder((None, 8, 8, 4), dtype=dtype)
        depthwise = K.variable(r.standard_normal((3, 3, 4, 1)), dtype=dtype)
        outputs = [K.resize_images(x, 2, 2, "channels_last", interpolation=mode)
                   for mode in ("nearest", "bilinear")]
        outputs.append(K.depthwise_conv2d(x, depthwise, padding="same"))
        flat = K.reshape(x, (-1, 8 * 8 * 4))
        outputs += [op(flat, axis=-1) for op in (K.sum, K.prod, K.max, K.min, K.mean)]
        outputs += [K.any(flat > 0, axis=-1), K.all(flat > 0, axis=-1)]
        grads = K.gradients(sum(K.sum(y) for y in outputs[:-2]), [x, depthwise])
        fn = K.function([x], outputs + grads)
        _calls(fn, [data[:1]])
        fn([data])
        sparse = K.placeholder((None, 6), dtype=dtype, sparse=True)
        dense = K.variable(r.standard_normal((6, 3)), dtype=dtype)
        product = K.dot(sparse, dense)
        fn = K.function([sparse], [product, K.gradients(K.sum(product), [dense])[0]])
        from numbackend import SparseTensorValue
        value = SparseTensorValue(np.array([[0, 1], [1, 4]]), np.array([1.5, -2.0], dtype), (2, 6))
        fn([value])


def _keras_model(name):
    """A Keras example model of keras_models.py: its first calls, then predictions
    at batch 1 past ONE_CALL_AFTER."""
    from .keras_models import build, predictor, rows
    model, x, y, batch = build(name)
    predicting, inputs = predictor(model, x)
    _calls(predicting.predict_on_batch, rows(inputs, 1))
    predicting.predict_on_batch(rows(inputs, 32))
    model.train_on_batch(rows(x, batch), rows(y, batch))


def _recurrent(layer_name):
    """A Keras recurrent layer of 128 units over 100 steps of 32 inputs, then a
    softmax readout: predictions at batch 1 and 32 and a training step."""
    from .keras_models import keras_modules
    _, layers, models, _ = keras_modules()
    np.random.seed(0)
    model = models.Sequential([getattr(layers, layer_name)(128, input_shape=(100, 32)),
                               layers.Dense(10, activation="softmax")])
    model.compile(loss="categorical_crossentropy", optimizer="sgd")
    x = rng().standard_normal((32, 100, 32)).astype(F32)
    _calls(model.predict_on_batch, x[:1])
    model.predict_on_batch(x)
    model.train_on_batch(x, np.eye(10, dtype=F32)[np.arange(32) % 10])


def _keras_workloads():
    from .keras_models import MODEL_NAMES
    workloads = {f"keras_{name}": (lambda name=name: _keras_model(name)) for name in MODEL_NAMES}
    workloads.update({f"keras_{layer.lower()}": (lambda layer=layer: _recurrent(layer))
                      for layer in ("LSTM", "GRU", "SimpleRNN")})
    return workloads


WORKLOADS = {"w1": w1, "w2": w2, "w3": w3, "w4": w4, "w5": w5, "w6": w6, "w7": w7,
             "conv_paths": conv_paths, "other_ops": other_ops, **_keras_workloads()}


def run(name):
    """Run the workload ``name``."""
    if name not in WORKLOADS:
        raise KeyError(f"compile_workloads.run: no workload {name!r}; there are {sorted(WORKLOADS)}")
    WORKLOADS[name]()
