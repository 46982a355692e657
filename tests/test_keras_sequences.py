"""Keras 2.2.5 sequence models whose outputs have two unknown dims, (batch, time,
features), trained end to end on numbackend (KERAS_BACKEND=numbackend)."""
import json
import textwrap

from tests.test_keras import run_keras

SEQUENCE_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from keras.models import Sequential
    from keras.layers import Dense, Embedding, LSTM, Masking, TimeDistributed
    from keras.optimizers import Adam

    np.random.seed(0)
    rng = np.random.default_rng(0)
    report = {}

    # Each step's label is the token before it (0 at the first step): the LSTM
    # must carry it over.  Padding (token 0) at the end of some sequences is masked.
    tokens = rng.integers(1, 6, size=(32, 7))
    tokens[::3, 5:] = 0
    labels = np.concatenate([np.zeros((32, 1), dtype=int), tokens[:, :-1]], axis=1)[..., None]
    model = Sequential([Embedding(6, 8, mask_zero=True), LSTM(16, return_sequences=True),
                        TimeDistributed(Dense(6, activation="softmax"))])
    model.compile(Adam(lr=0.05), "sparse_categorical_crossentropy")
    history = model.fit(tokens, labels, epochs=6, batch_size=8, verbose=0)
    report["embedding_lstm"] = {
        "output_shape": list(model.output_shape), "loss": history.history["loss"],
        # shorter sequences through the same compiled functions
        "short": model.evaluate(tokens[:, :4], labels[:, :4], verbose=0)}

    # Keras's test_TimeDistributed_with_masking_layer: mse on a (None, None, 5) output
    x = rng.integers(1, 5, size=(10, 3, 4)).astype("float32")
    for i in range(4):
        x[i, i:] = 0
    y = rng.random((10, 3, 5)).astype("float32")
    model = Sequential([TimeDistributed(Masking(mask_value=0.0), input_shape=(None, 4)),
                        TimeDistributed(Dense(5))])
    model.compile(Adam(lr=0.02), "mse")
    history = model.fit(x, y, epochs=6, batch_size=6, verbose=0)
    kept = np.any(x, axis=-1)
    w, b = model.layers[1].get_weights()
    # Keras's masked loss: each step's mse times the mask, over the mask's mean
    expected = np.mean(np.mean((x @ w + b - y) ** 2, axis=-1) * kept / (kept.mean() + 1e-7))
    report["masking"] = {"output_shape": list(model.output_shape), "loss": history.history["loss"],
                         "evaluate": model.evaluate(x, y, batch_size=10, verbose=0),
                         "expected": float(expected)}
    print(json.dumps(report, default=float))
""")


def test_sequence_models_with_unknown_time_axis_train(tmp_path):
    """The gradients of their losses' reductions over (batch, time) failed to build."""
    # What is checked here is that the graphs build and train: the scans' steps run from
    # Python (SCAN_LOOP_AFTER: never), whose compiled loops took two thirds of the time.
    # Keras's LSTM in compiled loops is checked in tests/test_keras.py, masked K.rnn
    # loops and their gradients in tests/test_rnn.py.
    result = run_keras(SEQUENCE_SCRIPT, tmp_path, NUMBACKEND_TUNE_SCAN_LOOP_AFTER=str(10**9))
    report = json.loads(result.stdout.strip().splitlines()[-1])
    lstm = report["embedding_lstm"]
    assert lstm["output_shape"] == [None, None, 6]
    losses = lstm["loss"]
    assert abs(losses[0] - 1.79) < 0.1  # about log(6): uniform predictions at the start
    assert losses[-1] < 0.6 * losses[0], losses
    assert lstm["short"] < losses[0]
    masking = report["masking"]
    assert masking["output_shape"] == [None, None, 5]
    assert masking["loss"][-1] < 0.7 * masking["loss"][0], masking["loss"]
    assert abs(masking["evaluate"] - masking["expected"]) < 1e-5 * max(1.0, masking["expected"])
