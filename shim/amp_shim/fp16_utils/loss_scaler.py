"""`apex.fp16_utils.loss_scaler`: the 2018 standalone scalers (`LossScaler`, `DynamicLossScaler`).

Not used by `FP16_Optimizer` (which uses `apex.amp.scaler.LossScaler`) nor by amp; scripts
that did their own loss scaling used them directly. Note their defaults (2**32, window 1000)
and the floor of 1, which differ from amp's scaler.
"""

from __future__ import annotations

from .._deprecation import deprecated_warning
from .fp16util import DEPRECATION_MESSAGE


def to_python_float(t):
    if hasattr(t, "item"):
        return t.item()
    return t[0]


class LossScaler:
    """A static loss scale."""

    def __init__(self, scale=1):
        deprecated_warning(DEPRECATION_MESSAGE)
        self.cur_scale = scale

    # `params` is a list / generator of parameters
    def has_overflow(self, params):
        return False

    # `x` is a torch.Tensor; called through the class, as Apex does
    def _has_inf_or_nan(x):
        return False

    def update_scale(self, overflow):
        pass

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_gradient(self, module, grad_in, grad_out):
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss, retain_graph=False):
        scaled_loss = loss * self.loss_scale
        scaled_loss.backward(retain_graph=retain_graph)


class DynamicLossScaler:
    """Dynamic loss scaling: halve (floored at 1) on overflow, multiply by `scale_factor` every
    `scale_window` iterations since the last overflow."""

    def __init__(self, init_scale=2**32, scale_factor=2.0, scale_window=1000):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    # `params` is a list / generator of parameters
    def has_overflow(self, params):
        for p in params:
            if p.grad is not None and DynamicLossScaler._has_inf_or_nan(p.grad.data):
                return True
        return False

    # `x` is a torch.Tensor; called through the class, as Apex does
    def _has_inf_or_nan(x):
        try:
            cpu_sum = float(x.float().sum())
        except RuntimeError as instance:
            # Only the "value cannot be converted" error means overflow; anything else propagates.
            if "value cannot be converted" not in instance.args[0]:
                raise
            return True
        else:
            if cpu_sum == float("inf") or cpu_sum == -float("inf") or cpu_sum != cpu_sum:
                return True
            return False

    # `overflow` is a bool saying whether the gradients overflowed
    def update_scale(self, overflow):
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
            self.last_overflow_iter = self.cur_iter
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_gradient(self, module, grad_in, grad_out):
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss, retain_graph=False):
        scaled_loss = loss * self.loss_scale
        scaled_loss.backward(retain_graph=retain_graph)
