"""The fp32 values O2's master weights (and their optimizer state) start from.

Apex casts the model to fp16 at `initialize` and builds each fp32 master lazily from the fp16
param, so masters and their fp32 optimizer state (momentum, Adam moments, recast through the
fp16 params by `load_state_dict(state_dict())`) start rounded to fp16. A checkpoint loaded into
the fp32 model before `initialize` (the order of Apex's own checkpoint test) then resumes from
rounded values. The shim remembers, just before the cast, the fp32 value of each param and its
floating optimizer state, and the lazily built masters start from them (docs/differences.md
row 6): a resume is bit for bit whichever order the checkpoint is loaded in.

Values are keyed by the model param (the cast replaces `param.data`, the Parameter stays); the
value held is the pre-cast tensor itself, which the cast no longer references, so remembering
costs no copy. Values loaded after `initialize` (the state-dict hook) replace them.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

# model param -> fp32 value its master starts from; model param -> {state key: fp32 tensor}
pending_master_values: WeakIdKeyDictionary = WeakIdKeyDictionary()
pending_master_state: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _float32_state(state: dict) -> dict:
    return {
        k: v
        for k, v in state.items()
        if isinstance(v, torch.Tensor) and v.dtype == torch.float32 and k != "step"
    }


def remember_before_cast(models: Iterable[torch.nn.Module], optimizers: Iterable) -> None:
    """Before O2's cast: each fp32 param's value and fp32 optimizer state (what masters use)."""
    for model in models:
        for param in model.parameters():
            if param.dtype == torch.float32 and param.requires_grad:
                pending_master_values[param] = param.detach()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = optimizer.state.get(param)
                if param.dtype == torch.float32 and state:
                    pending_master_state[param] = _float32_state(state)


def forget_params_not_cast(models: Iterable[torch.nn.Module], optimizers: Iterable) -> None:
    """After the cast: params left in fp32 (e.g. BatchNorm) get no master; drop their values."""
    params = [p for m in models for p in m.parameters()]
    params += [p for o in optimizers for g in o.param_groups for p in g["params"]]
    for param in params:
        if param.dtype not in (torch.float16, torch.bfloat16):
            pending_master_values.pop(param, None)
            pending_master_state.pop(param, None)


def take_master_value(param: torch.Tensor) -> Optional[torch.Tensor]:
    return pending_master_values.pop(param, None)


def restore_master_state(param: torch.Tensor, state: dict) -> None:
    """Put the remembered fp32 optimizer state of `param` into its master's `state`, where the
    key still holds a tensor of that shape (the fp16 round trip's result is replaced)."""
    saved = pending_master_state.pop(param, None)
    if not saved:
        return
    for key, value in saved.items():
        current = state.get(key)
        if isinstance(current, torch.Tensor) and current.shape == value.shape:
            state[key] = value.to(device=current.device, dtype=torch.float32, copy=True)
