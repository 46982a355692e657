"""Source shared by tests that run a small RNN in new processes (a scan's
compiled loop and its cache)."""

# A tanh RNN over 4 steps of 3 features, float64, named x, h0, w (w_value its
# weights) and step; the script defines np and K before it.
TANH_RNN = """
w_value = np.random.default_rng(0).standard_normal((3, 3)) * 0.5
x = K.placeholder((None, 4, 3), dtype="float64")
h0 = K.placeholder((None, 3), dtype="float64")
w = K.variable(w_value, dtype="float64")


def step(x_t, states):
    h = K.tanh(K.dot(states[0], w) + x_t)
    return h, [h]

"""
