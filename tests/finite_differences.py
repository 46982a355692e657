"""Central finite differences, the independent reference for gradient tests."""
import numpy as np


def numeric_gradient(loss, x, step=1e-6):
    """d loss / d x for a scalar function ``loss`` of a float64 array ``x``."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += step
        down[i] -= step
        grad[i] = (loss(up) - loss(down)) / (2 * step)
    return grad
