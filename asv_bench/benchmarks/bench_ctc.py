"""W6 of PERFORMANCE.md: CTC loss and its gradient with respect to the softmax output
(Keras's ctc_batch_cost), batch 32, 100 frames, 30 classes (blank last), labels of 20,
with a NumPy log-space forward-backward in the same run."""
import numpy as np

import numbackend as K

from .common import ctc_function, ctc_inputs, ctc_numpy, ratio, setup_once


class W6CtcLossAndGradient:
    """loss (32, 1) and d sum(loss) / d y_pred (32, 100, 30) in one call."""

    @setup_once
    def setup(self):
        self.y_pred, self.labels, self.input_length, self.label_length = ctc_inputs()
        self.feeds = [self.y_pred, self.labels, self.input_length, self.label_length]
        self.fn = ctc_function(K, *self.y_pred.shape, self.labels.shape[1])
        loss, grad = self.fn(self.feeds)
        ref_loss, ref_grad = ctc_numpy(self.y_pred, self.labels)
        np.testing.assert_allclose(loss[:, 0], ref_loss, rtol=1e-5)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-5 * np.abs(ref_grad).max())

    def time_numbackend(self):
        self.fn(self.feeds)

    def time_numpy(self):
        ctc_numpy(self.y_pred, self.labels)

    def track_speedup_vs_numpy(self):
        return ratio(lambda: ctc_numpy(self.y_pred, self.labels), lambda: self.fn(self.feeds), 20)

    track_speedup_vs_numpy.unit = "x"
