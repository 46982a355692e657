"""W1-W3 of PERFORMANCE.md: warm calls, NumPy in the same run, compile and load times."""

import numpy as np

import numbackend as K
from numbackend import tuning

from .common import (
    F32,
    cold_cache_run,
    mlp_function,
    mlp_numpy,
    mlp_weights,
    ratio,
    rng,
    setup_once,
    softmax_numpy,
    w1_function,
    w1_inputs,
    w1_numpy,
    warm_cache_run,
)


class W1ElementwiseChain:
    """tanh(a*b + c) * sigmoid(a - c) + 0.5*b*b on three 1024x4096 inputs."""

    @setup_once
    def setup(self):
        self.inputs = w1_inputs()
        self.fn = w1_function(K)
        self.fn(self.inputs)

    def time_numbackend(self):
        self.fn(self.inputs)

    def time_numpy(self):
        w1_numpy(*self.inputs)

    def track_speedup_vs_numpy(self):
        return ratio(lambda: w1_numpy(*self.inputs), lambda: self.fn(self.inputs), 10)

    track_speedup_vs_numpy.unit = "x"


class W2aSoftmax:
    """Row softmax, 4096x1000."""

    @setup_once
    def setup(self):
        self.x = rng().standard_normal((4096, 1000)).astype(F32)
        x = K.placeholder((None, 1000))
        self.fn = K.function([x], [K.softmax(x)])
        self.fn([self.x])

    def time_numbackend(self):
        self.fn([self.x])

    def time_numpy(self):
        softmax_numpy(self.x)

    def track_speedup_vs_numpy(self):
        return ratio(lambda: softmax_numpy(self.x), lambda: self.fn([self.x]), 20)

    track_speedup_vs_numpy.unit = "x"


class W2bDenseRelu:
    """relu(x @ W + b), x 256x1024, W 1024x1024."""

    @setup_once
    def setup(self):
        r = rng()
        self.x = r.standard_normal((256, 1024)).astype(F32)
        self.w = r.standard_normal((1024, 1024)).astype(F32)
        self.b = r.standard_normal(1024).astype(F32)
        x = K.placeholder((None, 1024))
        self.fn = K.function([x], [K.relu(K.dot(x, K.variable(self.w)) + K.variable(self.b))])
        self.fn([self.x])

    def numpy(self):
        return np.maximum(self.x @ self.w + self.b, 0)

    def time_numbackend(self):
        self.fn([self.x])

    def time_numpy(self):
        self.numpy()

    def track_speedup_vs_numpy(self):
        return ratio(self.numpy, lambda: self.fn([self.x]), 20)

    track_speedup_vs_numpy.unit = "x"


class W3Mlp:
    """MLP 784-512(relu)-512(relu)-10(softmax) inference."""

    params = (1, 256)
    param_names = ("batch",)

    @setup_once
    def setup(self, batch):
        self.weights = mlp_weights()
        self.x = rng().standard_normal((batch, 784)).astype(F32)
        self.fn = mlp_function(K, self.weights)
        # out of the timed calls: at batch 1 the ONE_CALL_AFTER-th compiles it as one call
        for _ in range(tuning.ONE_CALL_AFTER + 1):
            self.fn([self.x])

    def time_numbackend(self, batch):
        self.fn([self.x])

    def time_numpy(self, batch):
        mlp_numpy(self.weights, self.x)

    def track_speedup_vs_numpy(self, batch):
        return ratio(lambda: mlp_numpy(self.weights, self.x), lambda: self.fn([self.x]), 200)

    track_speedup_vs_numpy.unit = "x"


_BUILD = ("import numpy as np; import numbackend as K; "
          "from benchmarks.common import mlp_function, mlp_weights, w1_function; "
          "w1_function(K)([np.ones((2, 4096), np.float32)] * 3); "
          "mlp_function(K, mlp_weights())([np.ones((2, 784), np.float32)])")


class CompileAndLoad:
    """Building and first-calling the W1 and W3 functions in a fresh process."""

    def timeraw_compile_cold_cache(self):
        return cold_cache_run(_BUILD)

    def timeraw_load_warm_cache(self):
        return warm_cache_run(_BUILD)

    def timeraw_import(self):
        return "import numbackend"
