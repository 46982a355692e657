"""W5 of PERFORMANCE.md (LSTM inference) and an LSTM training step.

The LSTM is Keras 2.2.5's LSTMCell in its default implementation (1): one
product per gate with slices of the kernels, hard-sigmoid gates, tanh."""
import numpy as np

import numbackend as K

from .common import F32, ratio, rng, setup_once

BATCH, STEPS, INPUTS, UNITS = 32, 100, 64, 128
LEARNING_RATE = 0.01


def lstm_weights():
    r = rng()
    return (r.standard_normal((INPUTS, 4 * UNITS)).astype(F32) / F32(np.sqrt(INPUTS)),
            r.standard_normal((UNITS, 4 * UNITS)).astype(F32) / F32(np.sqrt(UNITS)),
            np.zeros(4 * UNITS, F32))


def lstm_inputs():
    return rng().standard_normal((BATCH, STEPS, INPUTS)).astype(F32)


def lstm_last_output(x, kernel, recurrent, bias):
    """The last output of an LSTM over x (batch, steps, inputs), as Keras builds it."""
    gates = [slice(k * UNITS, (k + 1) * UNITS) for k in range(4)]
    w = [kernel[:, g] for g in gates]
    u = [recurrent[:, g] for g in gates]
    b = [bias[g] for g in gates]

    def step(x_t, states):
        h, c = states[0], states[1]
        i = K.hard_sigmoid(K.bias_add(K.dot(x_t, w[0]), b[0]) + K.dot(h, u[0]))
        f = K.hard_sigmoid(K.bias_add(K.dot(x_t, w[1]), b[1]) + K.dot(h, u[1]))
        c = f * c + i * K.tanh(K.bias_add(K.dot(x_t, w[2]), b[2]) + K.dot(h, u[2]))
        o = K.hard_sigmoid(K.bias_add(K.dot(x_t, w[3]), b[3]) + K.dot(h, u[3]))
        h = o * K.tanh(c)
        return h, [h, c]

    zeros = K.zeros_like(K.dot(x[:, 0, :], w[0]))  # (batch, units), as Keras's initial state
    last, _, _ = K.rnn(step, x, [zeros, zeros])
    return last


def lstm_numpy(x, kernel, recurrent, bias):
    """The same LSTM in NumPy, the input projection done once for all steps."""
    projected = (x.reshape(-1, INPUTS) @ kernel + bias).reshape(BATCH, STEPS, 4 * UNITS)
    h = np.zeros((BATCH, UNITS), F32)
    c = np.zeros((BATCH, UNITS), F32)
    for t in range(STEPS):
        z = projected[:, t] + h @ recurrent
        i = np.clip(F32(0.2) * z[:, :UNITS] + F32(0.5), 0, 1)
        f = np.clip(F32(0.2) * z[:, UNITS:2 * UNITS] + F32(0.5), 0, 1)
        c = f * c + i * np.tanh(z[:, 2 * UNITS:3 * UNITS])
        o = np.clip(F32(0.2) * z[:, 3 * UNITS:] + F32(0.5), 0, 1)
        h = o * np.tanh(c)
    return h


class W5LSTMInference:
    """LSTM, batch 32, 100 steps, 64 inputs -> 128 units, last output."""

    @setup_once
    def setup(self):
        self.x = lstm_inputs()
        self.weights = lstm_weights()
        x = K.placeholder((None, STEPS, INPUTS))
        variables = [K.variable(w) for w in self.weights]
        self.fn = K.function([x], [lstm_last_output(x, *variables)])
        got = self.fn([self.x])[0]
        np.testing.assert_allclose(got, lstm_numpy(self.x, *self.weights), rtol=1e-3, atol=1e-4)

    def time_numbackend(self):
        self.fn([self.x])

    def time_numpy(self):
        lstm_numpy(self.x, *self.weights)

    def track_speedup_vs_numpy(self):
        return ratio(lambda: lstm_numpy(self.x, *self.weights), lambda: self.fn([self.x]), 10)

    track_speedup_vs_numpy.unit = "x"


def lstm_training_step():
    """An SGD step of the LSTM with a dense readout and a mean squared error."""
    x = K.placeholder((None, STEPS, INPUTS))
    target = K.placeholder((None, UNITS))
    variables = [K.variable(w) for w in lstm_weights()]
    loss = K.mean(K.square(lstm_last_output(x, *variables) - target))
    grads = K.gradients(loss, variables)
    updates = [(v, v - LEARNING_RATE * g) for v, g in zip(variables, grads)]
    return K.function([x, target], [loss], updates=updates)


class LSTMTrainingStep:
    """The W5 LSTM's training step (forward, BPTT, SGD update), next to its forward time."""

    @setup_once
    def setup(self):
        self.x = lstm_inputs()
        self.target = rng().standard_normal((BATCH, UNITS)).astype(F32) * F32(0.1)
        self.step = lstm_training_step()
        self.step([self.x, self.target])
        x = K.placeholder((None, STEPS, INPUTS))
        self.forward = K.function([x], [lstm_last_output(x, *[K.variable(w) for w in
                                                              lstm_weights()])])
        self.forward([self.x])

    def time_numbackend(self):
        self.step([self.x, self.target])

    def track_step_over_forward(self):
        """Training step time / forward time (both measured here)."""
        return ratio(lambda: self.step([self.x, self.target]), lambda: self.forward([self.x]), 5)

    track_step_over_forward.unit = "x"
