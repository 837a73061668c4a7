"""A per-loss scaler with Apex's arithmetic (`apex.amp.scaler.LossScaler`) and torch.amp's storage.

Like `torch.amp.GradScaler`, the scale, the clean-step counter and the overflow flag live in
tensors on the gradients' device (the scale in float64, because Apex kept a Python float:
any value a checkpoint or a script sets reads back unchanged), and every update is tensor math: unscaling, the overflow
check and the scale update never read a value back to the host. Callers that need the
skip decision read `found_inf` once; nothing else here syncs unless asked for a Python value.

Apex's rules, kept exactly:
  * dynamic: start at min(max_loss_scale, init_scale); on overflow halve, floored at
    min_loss_scale when it is truthy, and reset the counter; after `scale_window`
    consecutive clean updates double, capped at max_loss_scale, and reset the counter;
  * static: the scale never changes, overflow is never reported, the counter still counts.
"""

from __future__ import annotations

from typing import Union

import torch

from . import ops

LossScaleSpec = Union[str, float]


class DeviceLossScaler:
    def __init__(
        self,
        loss_scale: LossScaleSpec,
        *,
        init_scale: float = 2.0**16,
        scale_window: int = 2000,
        min_loss_scale: float | None = None,
        max_loss_scale: float = 2.0**24,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.dynamic = loss_scale == "dynamic"
        self.scale_window = scale_window
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = max_loss_scale
        if self.dynamic:
            start = min(max_loss_scale, init_scale)
        else:
            assert not isinstance(loss_scale, str), loss_scale  # only 'dynamic' is a string
            start = loss_scale
        # The value exactly as Apex stores it; for a static scaler it is what loss_scale()
        # returns, so the fast-path test `S == 1.0` costs no sync.
        self._static_value = start
        self.scale = torch.full((), float(start), dtype=torch.float64, device=self.device)
        self.unskipped = torch.zeros((), dtype=torch.int64, device=self.device)
        self.found_inf = torch.zeros((1,), dtype=torch.float32, device=self.device)

    # -- host-side views (each reads the device once) ------------------------------------
    def loss_scale(self) -> float:
        if not self.dynamic:
            return self._static_value
        return self.scale.item()

    def set_loss_scale(self, value: float) -> None:
        self._static_value = value
        self.scale.fill_(float(value))

    def unskipped_count(self) -> int:
        return int(self.unskipped.item())

    def set_unskipped(self, value: int) -> None:
        self.unskipped.fill_(int(value))

    # -- the iteration ---------------------------------------------------------------------
    def inv_scale(self) -> torch.Tensor:
        """1/scale in double, rounded to float32 (Apex's `1./scale` handed to a float kernel)."""
        return self.scale.reciprocal().float()

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss.float() * self.scale.to(device=loss.device, dtype=torch.float32)

    def clear_overflow_state(self) -> None:
        self.found_inf.zero_()

    def unscale_(self, grads: ops.Tensors) -> None:
        ops.unscale_(grads, self.found_inf, self.inv_scale())

    def update_(self) -> torch.Tensor:
        """Apply one update on the device; return a snapshot of this update's skip flag."""
        return ops.update_scale_(
            self.scale,
            self.unskipped,
            self.found_inf,
            dynamic=self.dynamic,
            min_loss_scale=self.min_loss_scale,
            max_loss_scale=self.max_loss_scale,
            scale_window=self.scale_window,
        )

    def to(self, device: torch.device | str) -> "DeviceLossScaler":
        """Move the state (e.g. after a CPU-built scaler meets CUDA gradients)."""
        device = torch.device(device)
        if device != self.device:
            self.device = device
            self.scale = self.scale.to(device)
            self.unskipped = self.unskipped.to(device)
            self.found_inf = self.found_inf.to(device)
        return self
