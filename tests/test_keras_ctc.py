"""Keras 2.2.5 (KERAS_BACKEND=numbackend) trains a CTC model as its image_ocr example does."""
import json
import textwrap

from .test_keras import run_keras  # skips this module too where Keras is missing

# image_ocr's model in small: a softmax over 5 classes (the blank last) per
# frame, ctc_batch_cost in a Lambda layer, and the Lambda's output as the loss.
# Two samples are image_ocr's blank samples: a one-item label of the blank.
SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from keras import backend as K
    from keras.layers import Dense, Input, Lambda
    from keras.models import Model
    from keras.optimizers import SGD

    frames, features, classes = 6, 4, 5
    rng = np.random.default_rng(0)
    images = Input(name="x", shape=(frames, features))
    y_pred = Dense(classes, activation="softmax")(images)
    labels = Input(name="labels", shape=[3], dtype="float32")
    input_length = Input(name="input_length", shape=[1], dtype="int64")
    label_length = Input(name="label_length", shape=[1], dtype="int64")

    def ctc_lambda_func(args):
        y_pred, labels, input_length, label_length = args
        return K.ctc_batch_cost(labels, y_pred, input_length, label_length)

    loss_out = Lambda(ctc_lambda_func, output_shape=(1,), name="ctc")(
        [y_pred, labels, input_length, label_length])
    model = Model(inputs=[images, labels, input_length, label_length], outputs=loss_out)
    model.compile(loss={"ctc": lambda y_true, y_pred: y_pred}, optimizer=SGD(lr=0.02))

    x = rng.standard_normal((4, frames, features)).astype("float32")
    batch = {"x": x, "labels": np.array([[0, 1, 2], [4, 0, 0], [3, 3, 1], [4, 0, 0]], "float32"),
             "input_length": np.full((4, 1), frames), "label_length": np.array([[3], [1], [3], [1]])}
    per_sample = model.predict(batch)[:, 0]
    # TensorFlow 1's loss for a label of blanks only (tensorflow/tensorflow#13457):
    # -(sum of log p_blank over all frames but the last) - log(1 + p_blank(last)),
    # p the softmax of log(y_pred + epsilon) that the CTC op sees.
    p = Model(images, y_pred).predict(x).astype(np.float64) + K.epsilon()
    p_blank = (p / p.sum(axis=-1, keepdims=True))[:, :, classes - 1]
    want = -(np.log(p_blank[:, :-1]).sum(axis=1) + np.log1p(p_blank[:, -1]))
    losses = [float(model.train_on_batch(batch, np.zeros(4))) for _ in range(5)]
    print(json.dumps({"blank_error": float(np.abs(per_sample[[1, 3]] - want[[1, 3]]).max()),
                      "losses": losses}))
""")


def test_image_ocr_model_trains_on_blank_labels(tmp_path):
    result = run_keras(SCRIPT, tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["blank_error"] < 1e-4
    losses = report["losses"]
    assert all(abs(loss) < 1e3 for loss in losses) and losses[-1] < losses[0], losses
