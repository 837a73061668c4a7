"""What the shim's `apex.optimizers` share: Apex's `zero_grad`, the per-group step count, and
the per-parameter step tensors that torch's functional optimizers expect.

Apex keeps one `step` per param group (an int; a device tensor when capturable) and counts a
step even for params that had no gradient; torch keeps a step tensor per parameter. The shim
keeps Apex's format and hands torch's kernels fresh step tensors holding the group's count,
so the math is torch's and the state dict is Apex's.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.optim.optimizer import _get_foreach_kernels_supported_devices, _get_fused_kernels_supported_devices


def zero_grad(optimizer: torch.optim.Optimizer, set_grad_none: bool, set_to_none: Optional[bool]) -> None:
    """Apex's `zero_grad()`: `set_grad_none` decides, unless the caller passes `set_to_none`."""
    to_none = set_grad_none if set_to_none is None else set_to_none
    if to_none:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    else:
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)


def can_fuse(params: Sequence[torch.Tensor]) -> bool:
    """torch's fused kernels take every param: floating point, on a device that has them."""
    supported = _get_fused_kernels_supported_devices()
    return all(p.device.type in supported and torch.is_floating_point(p) for p in params)


def can_foreach(params: Sequence[torch.Tensor]) -> bool:
    supported = _get_foreach_kernels_supported_devices()
    return all(p.device.type in supported for p in params)


def next_step(group: dict, found_inf: Optional[torch.Tensor] = None):
    """Advance the group's step as Apex does; return the value before the increment.

    An int step advances by one; a tensor step (capturable) does not advance on overflow.
    """
    prev = group.get("step", 0)
    if isinstance(prev, torch.Tensor):
        inc = torch.ones_like(prev) if found_inf is None else (found_inf.to(prev.device) == 0).to(prev.dtype)
        group["step"] = prev + inc
    else:
        group["step"] = prev + 1
    return prev


def step_tensors(params: Sequence[torch.Tensor], prev_step, on_param_device: bool) -> list[torch.Tensor]:
    """Per-param float32 step tensors holding `prev_step` (torch's kernels add one themselves);
    one allocation per device, the tensors are views of it."""
    out: list[Optional[torch.Tensor]] = [None] * len(params)
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(params):
        device = p.device if on_param_device else torch.device("cpu")
        by_device.setdefault(device, []).append(i)
    for device, idx in by_device.items():
        base = torch.empty(len(idx), dtype=torch.float32, device=device)
        if isinstance(prev_step, torch.Tensor):
            base.copy_(prev_step.detach().reshape(()).to(device=device, dtype=torch.float32).expand(len(idx)))
        else:
            base.fill_(float(prev_step))
        for j, i in enumerate(idx):
            out[i] = base[j]
    return out  # type: ignore[return-value]  # every slot was filled above


def amp_scaling(optimizer, grad_scaler=None):
    """`(grad_scale, found_inf)` for a step that unscales and skips on the device.

    Either torch.amp.GradScaler's current protocol (it sets `grad_scale`/`found_inf` on the
    optimizer) or its older one, which Apex's capturable FusedAdam used (it passes itself as
    `grad_scaler=`; the optimizer then asks it for the inf check and the scale).
    """
    grad_scale = getattr(optimizer, "grad_scale", None)
    found_inf = getattr(optimizer, "found_inf", None)
    if grad_scaler is not None:
        from torch.amp.grad_scaler import OptState

        state = grad_scaler._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            grad_scale = None
            per_device = state["found_inf_per_device"]
        else:
            per_device = grad_scaler._check_inf_per_device(optimizer)
            grad_scale = grad_scaler._get_scale_async()
        device = grad_scale.device if grad_scale is not None else next(iter(per_device.values())).device
        found_inf = sum(t.to(device) for t in per_device.values())
    return grad_scale, found_inf


def skip_for_inf(found_inf: Optional[torch.Tensor]) -> bool:
    """For the Python fallbacks, which cannot skip on the device: one host read."""
    return found_inf is not None and bool(found_inf.item() != 0)


def unscale_grads(grads: list[torch.Tensor], grad_scale: Optional[torch.Tensor]) -> list[torch.Tensor]:
    if grad_scale is None:
        return grads
    return [g / grad_scale.to(g.device, torch.float32) for g in grads]


def check_no_sparse(grad: torch.Tensor, name: str) -> None:
    if grad.is_sparse:
        raise RuntimeError(
            "{} does not support sparse gradients, please consider SparseAdam instead".format(name)
        )
