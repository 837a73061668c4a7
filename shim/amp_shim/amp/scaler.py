"""`apex.amp.scaler.LossScaler`: Apex's names over the tensor-backed engine scaler.

Scripts in the wild read and write `_loss_scale`, `_unskipped`, `_has_overflow` and
`_overflow_buf`, and call `loss_scale()`, `update_scale()`, `unscale(...)`; those stay
available here, each reading the device only when the caller asks for a Python value.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine import ops
from ..engine.loss_scaler import DeviceLossScaler
from ._amp_state import _amp_state, master_params, maybe_print  # noqa: F401 (Apex's scaler names)


class LossScaler(DeviceLossScaler):
    warned_unscaling_non_fp32_grad = False
    has_fused_kernel = False

    def __init__(
        self,
        loss_scale,
        init_scale: float = 2.0**16,
        scale_factor: float = 2.0,
        scale_window: int = 2000,
        min_loss_scale: float | None = None,
        max_loss_scale: float = 2.0**24,
        device: torch.device | str = "cpu",
    ) -> None:
        # scale_factor is accepted and ignored, as in Apex: the factors are 2 and 1/2.
        super().__init__(
            loss_scale,
            init_scale=init_scale,
            scale_window=scale_window,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            device=device,
        )

    # Apex attribute names -----------------------------------------------------------------
    @property
    def _loss_scale(self) -> float:
        return self.loss_scale()

    @_loss_scale.setter
    def _loss_scale(self, value: float) -> None:
        self.set_loss_scale(value)

    @property
    def _unskipped(self) -> int:
        return self.unskipped_count()

    @_unskipped.setter
    def _unskipped(self, value: int) -> None:
        self.set_unskipped(value)

    @property
    def _has_overflow(self) -> bool:
        return bool(self.found_inf.item() != 0)

    @_has_overflow.setter
    def _has_overflow(self, value: bool) -> None:
        self.found_inf.fill_(1.0 if value else 0.0)

    @property
    def _overflow_buf(self) -> torch.Tensor:
        return self.found_inf

    @_overflow_buf.setter
    def _overflow_buf(self, buf: torch.Tensor) -> None:
        self.found_inf = buf

    @property
    def _min_loss_scale(self):
        return self.min_loss_scale

    @property
    def _max_loss_scale(self):
        return self.max_loss_scale

    @property
    def _scale_seq_len(self) -> int:
        return self.scale_window

    # Apex methods --------------------------------------------------------------------------
    def update_scale(self) -> bool:
        """Apex's update; returns should_skip (one read of the device flag)."""
        if self.found_inf.dtype != torch.float32:  # a user-supplied int overflow buffer
            self.found_inf = self.found_inf.float()
        return bool(self.update_().item())

    def unscale(
        self,
        model_grads: Sequence[torch.Tensor],
        master_grads: Sequence[torch.Tensor],
        unused_scale=None,
        models_are_masters: bool = False,
        scale_override: float | None = None,
    ) -> None:
        inv = self._inv(scale_override)
        if models_are_masters:
            ops.unscale_(model_grads, self.found_inf, inv)
            return
        fresh = ops.unscale_to_fp32_(model_grads, [None] * len(model_grads), self.found_inf, inv)
        ops.copy_(master_grads, fresh)

    def unscale_with_stashed(
        self,
        model_grads: Sequence[torch.Tensor],
        stashed_master_grads: Sequence[torch.Tensor],
        master_grads: Sequence[torch.Tensor],
        scale_override: float | None = None,
    ) -> None:
        inv = self._inv(scale_override)
        fresh = ops.unscale_to_fp32_(model_grads, list(stashed_master_grads), self.found_inf, inv)
        for dst, src in zip(master_grads, fresh):
            if dst is not src:
                dst.copy_(src)

    def _inv(self, scale_override: float | None) -> torch.Tensor:
        if scale_override is None:
            return self.inv_scale()
        return torch.full((), 1.0 / scale_override, dtype=torch.float32, device=self.device)
