"""Copied and unpickled tensors are nodes of their own: the graph code tells nodes
apart by ``Tensor.id``, so a copy that kept its original's id was taken for it."""
import copy
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numbackend as K

COPIES = {"deepcopy": copy.deepcopy, "copy": copy.copy,
          "pickle": lambda x: pickle.loads(pickle.dumps(x))}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copied_variable_is_another_node(how):
    x = K.placeholder((3,))
    v = K.variable(np.array([1.0, 2.0, 3.0]))
    v_copy = COPIES[how](v)
    v_copy.value = np.array([10.0, 20.0, 30.0], "float32")
    f = K.function([x], [x + v + v_copy])
    a = np.array([0.5, -1.0, 4.0], "float32")
    np.testing.assert_allclose(f([a])[0], a + np.array([1, 2, 3]) + np.array([10, 20, 30]))


def test_a_deep_copied_subgraph_keeps_its_structure():
    x = K.placeholder((2, 3))
    w = K.variable(np.arange(6.0).reshape(2, 3))
    e = K.exp(x)
    y = e * w + e
    x2, y2, w2 = copy.deepcopy((x, y, w))
    assert y2.inputs[0].inputs[0] is y2.inputs[1]  # the one exp, read twice
    w2.value = w2.value * 2
    a = np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)
    original, copied = K.function([x, x2], [y, y2])([a, a])
    np.testing.assert_allclose(original, np.exp(a) * np.arange(6.0).reshape(2, 3) + np.exp(a),
                               rtol=1e-6)
    np.testing.assert_allclose(copied, np.exp(a) * 2 * np.arange(6.0).reshape(2, 3) + np.exp(a),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="not among the inputs"):
        K.function([x], [y2])  # the copy reads the copy of x


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_graph_reads_the_one_learning_phase(how):
    x = K.placeholder((3,))
    y = K.in_train_phase(x * 2.0, x)
    x2, y2 = COPIES[how]((x, y))
    f = K.function([x2, K.learning_phase()], [y2])
    a = np.array([1.0, 2.0, 3.0], "float32")
    np.testing.assert_array_equal(f([a, 1])[0], 2 * a)
    np.testing.assert_array_equal(f([a, 0])[0], a)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_recurrence_copies_after_it_ran(how):
    x = K.placeholder((2, 5, 3))
    w = K.variable(np.linspace(-0.5, 0.5, 9).reshape(3, 3))

    def step(x_t, states):
        h = K.tanh(K.dot(x_t, w) + K.dot(states[0], w))
        return h, [h]

    last = K.rnn(step, x, [K.zeros((2, 3))])[0]
    a = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
    K.function([x], [last])([a])  # compiles the step's plan
    x2, last2, w2 = COPIES[how]((x, last, w))
    w2.value = -w2.value
    h = np.zeros((2, 3))
    for t in range(5):
        h = np.tanh(a[:, t] @ -K.get_value(w) + h @ -K.get_value(w))
    np.testing.assert_allclose(K.function([x2], [last2])([a])[0], h, rtol=1e-5, atol=1e-6)


# A variable holding 1000, pickled to stdout by a new process after twenty
# placeholders (so its id is one that the next process hands out too).
PICKLE = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    import numbackend as K
    for _ in range(20):
        K.placeholder((1,))
    sys.stdout.buffer.write(pickle.dumps(K.variable(np.array([1000.0]), dtype="float64")))
""")
# Unpickles it from stdin and adds to it new variables holding 1, 2, 4, ... 2 ** 39.
UNPICKLE_AND_BUILD = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    import numbackend as K
    total = pickle.loads(sys.stdin.buffer.read())
    for k in range(40):
        total = total + K.variable(np.array([2.0 ** k]), dtype="float64")
    print(repr(float(K.eval(total)[0])))
""")


def run_python(script, stdin=b""):
    result = subprocess.run([sys.executable, "-c", script], input=stdin, capture_output=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:].decode()
    return result.stdout


def test_a_variable_unpickled_in_another_process_keeps_apart_from_new_tensors():
    total = run_python(UNPICKLE_AND_BUILD, stdin=run_python(PICKLE))
    assert float(total.decode().split()[-1]) == 1000.0 + (2.0 ** 40 - 1)
