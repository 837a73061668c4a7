"""`apex.amp.opt.OptimWrapper`: the old API's `handle.wrap_optimizer(opt, num_loss)` (the pre-2019 Amp).

    optimizer = amp_handle.wrap_optimizer(optimizer, num_loss=2)
    with optimizer.scale_loss(loss1) as scaled: scaled.backward()
    with optimizer.scale_loss(loss2) as scaled: scaled.backward()
    optimizer.step()          # skipped, with "Gradient overflow, skipping update", on overflow

One dynamic loss scaler per loss (the engine's, so the scale and the overflow flag stay on the
device); the second and later losses of an iteration set the grads accumulated so far aside,
so that each loss's grads are unscaled by their own scale, and add them back afterwards. The
step reads the overflow flags once.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ._amp_state import master_params, maybe_print
from .scaler import LossScaler

_CLOSURE_MESSAGE = "The `closure` argument is unsupported by the amp optimizer wrapper."


def _optimizer_device(optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")


class OptimWrapper(object):
    def __init__(self, optimizer, amp_handle, num_loss: int) -> None:
        self._optimizer = optimizer
        self._amp_handle = amp_handle
        self._num_loss = num_loss
        self._loss_idx = 0
        self._skip_next: list = [False] * num_loss
        device = _optimizer_device(optimizer)
        self._loss_scaler = [LossScaler("dynamic", device=device) for _ in range(num_loss)]

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor) -> Iterator[torch.Tensor]:
        if not self._amp_handle.is_active():
            yield loss
            return

        # Grads of earlier losses are set aside: once mixed with this loss's (differently
        # scaled) grads they could not be unscaled.
        cached_grads = []
        if self._loss_idx > 0:
            for p in master_params(self._optimizer):
                cached_grads.append(p.grad.detach().clone() if p.grad is not None else None)
            self._optimizer.zero_grad()

        scaler = self._cur_loss_scaler()
        # Apex multiplied by the Python float: the scaled loss keeps the loss's dtype.
        scaled = (loss * scaler.scale.to(device=loss.device, dtype=torch.float32)).to(loss.dtype)
        with self._amp_handle._casts.disabled():  # the body runs backward
            yield scaled

        scaler.clear_overflow_state()
        grads = [p.grad for p in master_params(self._optimizer) if p.grad is not None]
        scaler.unscale_(grads)
        self._skip_next[self._loss_idx] = scaler.update_()
        self._loss_idx += 1

        for p, cached_grad in zip(master_params(self._optimizer), cached_grads):
            if cached_grad is None:
                continue
            if p.grad is None:  # unused by this loss (Apex raised AttributeError here)
                p.grad = cached_grad
            else:
                p.grad.add_(cached_grad)
        self._amp_handle._clear_cache()

    def _cur_loss_scaler(self) -> LossScaler:
        assert 0 <= self._loss_idx < self._num_loss
        return self._loss_scaler[self._loss_idx]

    def _should_skip(self) -> bool:
        flags = [f for f in self._skip_next if isinstance(f, torch.Tensor)]
        if not flags:
            return any(self._skip_next)
        return bool(torch.stack([f.reshape(()).to(flags[0].device) for f in flags]).any().item())

    def step(self, closure=None):
        if not self._amp_handle.is_active():
            return self._optimizer.step(closure=closure)

        self._loss_idx = 0
        if self._amp_handle.has_cache:  # Apex dropped the params' cached casts one by one
            self._amp_handle._clear_cache()

        if closure is not None:
            raise NotImplementedError(_CLOSURE_MESSAGE)
        skip = self._should_skip()
        self._skip_next = [False] * self._num_loss
        if skip:
            maybe_print("Gradient overflow, skipping update")
            return None
        with self._amp_handle._casts.disabled():  # as the patched step of amp.initialize's O1
            return self._optimizer.step(closure=closure)

    # Forward any attribute lookups
    def __getattr__(self, attr: str) -> Any:
        if attr == "_optimizer":  # not yet set (unpickling, copy)
            raise AttributeError(attr)
        return getattr(self._optimizer, attr)

    def __repr__(self) -> str:
        return self._optimizer.__repr__()

    def state_dict(self):
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict):
        return self._optimizer.load_state_dict(state_dict)

    def zero_grad(self, *args, **kwargs):
        return self._optimizer.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        return self._optimizer.add_param_group(param_group)
