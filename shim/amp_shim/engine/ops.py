"""The engine's per-tensor math, in one place so that a fused CUDA path can replace it.

Every function works on lists of tensors and writes the non-finite flag into `found_inf` (a
float32 tensor of shape (1,), set to 1 and never reset here), without reading it back: the
host learns about overflow only when the caller decides to look.
"""
from __future__ import annotations

from typing import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def unscale_(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """grads *= inv_scale in place; flag non-finite inputs (Apex's `multi_tensor_scale`)."""
    if grads:
        torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found_inf, inv_scale)


def unscale_add_(
    grads: Tensors, stashed: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """grads = grads * inv_scale + stashed; only the incoming grads are checked (Apex's `axpby`)."""
    if grads:
        unscale_(grads, found_inf, inv_scale)
        torch._foreach_add_(list(grads), list(stashed))


def unscale_to_fp32_(
    model_grads: Tensors,
    master_grads: Sequence[torch.Tensor | None],
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
) -> list[torch.Tensor]:
    """Unscale reduced-precision model grads into fp32: new tensors, or added to existing ones.

    Returns the fp32 gradient for each pair; where a master grad existed it is updated in
    place and returned, so callers can assign the result to `master.grad` unconditionally.
    """
    fresh = [g.detach().to(torch.float32, copy=True) for g in model_grads]
    unscale_(fresh, found_inf, inv_scale)
    out: list[torch.Tensor] = []
    for new, old in zip(fresh, master_grads):
        if old is None:
            out.append(new)
        else:
            out.append(old.add_(new))
    return out


def copy_(dst: Tensors, src: Tensors) -> None:
    """dst <- src with a dtype cast (fp32 masters into fp16/bf16 model params)."""
    if dst:
        with torch.no_grad():
            torch._foreach_copy_(list(dst), list(src))
