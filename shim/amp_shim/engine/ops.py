"""The engine's per-tensor math, in one place, on two paths: torch ops, or the CUDA kernels.

Every function works on lists of tensors and writes the non-finite flag into `found_inf` (a
float32 tensor of shape (1,), set to 1 and never reset here), without reading it back: the
host learns about overflow only when the caller decides to look.

Which path runs (`AMP_SHIM_KERNELS`, read at each call):
  * ``auto`` (default): the CuPy kernels (`engine/cuda.py`, sources in `kernels/`) when CuPy is
    importable, `cupy.is_available()` is true and the tensors are CUDA tensors the kernels
    handle (float32/float16/bfloat16, contiguous, one device); torch ops otherwise;
  * ``torch``: always torch ops;
  * ``cupy``: always the kernels; raises `cuda.KernelsUnavailableError` saying why when they
    cannot run (no CuPy, no GPU, CPU tensors) and ValueError for tensors they do not handle.
The torch path is the reference: the kernels reproduce it bit for bit (tests/kernels/), except
where a function's docstring says otherwise (the norms' summation order).

CuPy is imported only by `engine/cuda.py`, and only when a kernel would run.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

Tensors = Sequence[torch.Tensor]

KERNELS_ENV = "AMP_SHIM_KERNELS"
KERNEL_MODES = ("auto", "torch", "cupy")


def kernel_mode() -> str:
    """The `AMP_SHIM_KERNELS` setting: ``auto`` (the default), ``torch`` or ``cupy``."""
    mode = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise ValueError(
            "%s=%r: expected one of %s" % (KERNELS_ENV, os.environ.get(KERNELS_ENV), ", ".join(KERNEL_MODES))
        )
    return mode


def _kernels(
    device: torch.device,
    lists: Sequence[Tensors],
    scalars: Sequence[Optional[torch.Tensor]] = (),
):
    """The `engine.cuda` module if this call runs on the kernels, None for torch ops."""
    mode = kernel_mode()
    if mode == "torch":
        return None
    from . import cuda

    if mode == "cupy":
        cuda.require(device)
    elif not cuda.accepts(device):
        return None
    reason = cuda.why_ineligible(device, lists, scalars)
    if reason is None:
        return cuda
    if mode == "cupy":
        raise ValueError("%s=cupy, but the CUDA kernels do not handle %s" % (KERNELS_ENV, reason))
    return None


def unscale_(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """grads *= inv_scale in place; flag non-finite inputs (Apex's `multi_tensor_scale`)."""
    if grads:
        kernels = _kernels(grads[0].device, [grads], [found_inf, inv_scale])
        if kernels is not None:
            kernels.unscale_(grads, found_inf, inv_scale)
            return
        torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found_inf, inv_scale)


def unscale_add_(grads: Tensors, stashed: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """grads = grads * inv_scale + stashed; only the incoming grads are checked (Apex's `axpby`)."""
    if grads:
        kernels = _kernels(grads[0].device, [grads, stashed], [found_inf, inv_scale])
        if kernels is not None:
            kernels.unscale_add_(grads, stashed, found_inf, inv_scale)
            return
        unscale_(grads, found_inf, inv_scale)
        torch._foreach_add_(list(grads), list(stashed))


def add_(grads: Tensors, stashed: Tensors) -> None:
    """grads += stashed, nothing checked (recombining stashed grads at a static scale of 1)."""
    if grads:
        kernels = _kernels(grads[0].device, [grads, stashed])
        if kernels is not None:
            kernels.unscale_add_(grads, stashed, None, None)
            return
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
    if model_grads:
        device = model_grads[0].device
        kernels = _kernels(device, [model_grads], [found_inf, inv_scale])
        if kernels is not None:
            masters_ok = all(
                m.dtype == torch.float32
                and m.device == device
                and m.is_contiguous()
                and m.numel() == g.numel()
                for g, m in zip(model_grads, master_grads)
                if m is not None
            )
            if masters_ok:
                return kernels.unscale_to_fp32_(model_grads, master_grads, found_inf, inv_scale)
            if kernel_mode() == "cupy":
                raise ValueError(
                    "%s=cupy, but the CUDA kernels need contiguous float32 master grads on the "
                    "model grads' device, of their sizes" % KERNELS_ENV
                )
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
        kernels = _kernels(dst[0].device, [dst, src])
        if kernels is not None:
            kernels.copy_(dst, src)
            return
        with torch.no_grad():
            torch._foreach_copy_(list(dst), list(src))


# -- gradient norm and clipping ----------------------------------------------------------------
#
# torch's `unscale_` followed by `clip_grad_norm_` passes over the gradient bytes five times
# (unscale: read + write; norm: read; clip: read + write). These ops allow four
# (`unscale_and_norm_` then `clip_scale_`) or three (`unscale_clip_`). On the kernels the norm is
# summed in a fixed order (kernels/norm.cu), deterministic from run to run but not the order of
# the torch path (`l2_norms`), so the two paths agree to float32 rounding, not bit for bit; the
# clipping arithmetic after the norm is clip_grad_norm_'s on both paths.


#: Elements per block of the CPU norm's float32 partial sums (see `l2_norms`).
NORM_BLOCK = 1024


def _blocked_squared_norm(t: torch.Tensor) -> torch.Tensor:
    """sum(t**2) as a float64 0-dim tensor: float32 norms of 1024-element blocks (one fast
    vectorised reduction, no temporary of t's size), combined in float64."""
    flat = t.reshape(-1)
    whole = flat.numel() // NORM_BLOCK * NORM_BLOCK
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    if whole:
        blocks = torch.linalg.vector_norm(flat[:whole].view(-1, NORM_BLOCK), 2.0, dim=1, dtype=torch.float32)
        total = total + blocks.double().square().sum()
    if whole < flat.numel():
        total = total + torch.linalg.vector_norm(flat[whole:], 2.0, dtype=torch.float64).square()
    return total


def l2_norms(tensors: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-tensor 2-norms as a float32 vector, their total 2-norm as a float32 0-dim tensor),
    on `device`; nothing read back to the host.

    On the CPU, torch's float32 2-norm (`linalg.vector_norm`, `_foreach_norm`) accumulates
    along the whole tensor and drifts with its size: 2e-6 relative at 3e5 elements, 7e-5 at
    4e6, 6e-4 at 1.6e7, where Apex's kernel (float32 partial sums per chunk, tree-reduced) stays
    near float32 rounding. So on the CPU the squares are summed like the kernel's: float32 per
    1024-element block, the blocks combined in float64 (within 1e-9 of the float64 norm at 3e7
    elements, as fast as torch's float32 norm). CUDA reductions are tree-shaped already: there
    `_foreach_norm` in float32, one launch for the list.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float32, device=device), torch.zeros(
            (), dtype=torch.float32, device=device
        )
    if tensors[0].device.type == "cpu":
        squares = torch.stack([_blocked_squared_norm(t).to(device) for t in tensors])
        norms, total = squares.sqrt(), squares.sum().sqrt()
    else:
        norms = torch.stack(
            [n.to(device) for n in torch._foreach_norm(list(tensors), 2, dtype=torch.float32)]
        )
        total = torch.linalg.vector_norm(norms, 2.0)
    return norms.to(torch.float32), total.to(torch.float32)


def _total_norm(tensors: Tensors, device: torch.device) -> torch.Tensor:
    """clip_grad_norm_'s total norm (per-tensor 2-norms, then the 2-norm of those), in float32
    (blocked on the CPU, see `l2_norms`)."""
    return l2_norms(tensors, device)[1]


def unscale_and_norm_(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """`unscale_` in place, and return the global L2 norm of the unscaled grads (a float32
    0-dim tensor on the grads' device; nothing read back), in one pass on the kernels."""
    if grads:
        kernels = _kernels(grads[0].device, [grads], [found_inf, inv_scale])
        if kernels is not None:
            return kernels.unscale_and_norm_(grads, found_inf, inv_scale)
    unscale_(grads, found_inf, inv_scale)
    return _total_norm(grads, found_inf.device)


def scaled_norm(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """The global L2 norm of grads * inv_scale (float32, not rounded to the grads' type),
    reading the still-scaled grads once and flagging non-finite ones; grads are not written."""
    if grads:
        kernels = _kernels(grads[0].device, [grads], [found_inf, inv_scale])
        if kernels is not None:
            return kernels.scaled_norm(grads, found_inf, inv_scale)
    fresh = [g.detach().to(torch.float32, copy=True) for g in grads]
    unscale_(fresh, found_inf, inv_scale)
    return _total_norm(fresh, found_inf.device)


def clip_scale_(
    grads: Tensors,
    norm: torch.Tensor,
    max_norm: float,
    *,
    inv_scale: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> None:
    """grads *= min(1, max_norm / (norm + eps)) [* inv_scale], in place.

    The coefficient is clip_grad_norm_'s, with its float32 roundings (`max_norm / (norm + eps)`
    is `reciprocal(norm + eps) * max_norm`, then clamped at 1); with `inv_scale` it is multiplied
    by inv_scale (one float32 rounding) so that unscaling happens in the same pass.
    """
    if not grads:
        return
    kernels = _kernels(grads[0].device, [grads], [norm, inv_scale])
    if kernels is not None:
        kernels.clip_scale_(grads, norm, float(max_norm), float(eps), inv_scale)
        return
    clip_coef = max_norm / (norm + eps)
    factor = torch.clamp(clip_coef, max=1.0)
    if inv_scale is not None:
        factor = factor * inv_scale
    torch._foreach_mul_(list(grads), factor)


def unscale_clip_(
    grads: Tensors,
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
    max_norm: float,
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Unscale and clip to `max_norm` in three passes over the grads (read for the norm of the
    unscaled grads, then read + write once); returns the total norm before clipping."""
    norm = scaled_norm(grads, found_inf, inv_scale)
    clip_scale_(grads, norm, max_norm, inv_scale=inv_scale, eps=eps)
    return norm


# -- the loss-scale update -------------------------------------------------------------------


def update_scale_(
    scale: torch.Tensor,
    unskipped: torch.Tensor,
    found_inf: torch.Tensor,
    *,
    dynamic: bool,
    min_loss_scale: Optional[float],
    max_loss_scale: float,
    scale_window: int,
) -> torch.Tensor:
    """Apex's `LossScaler.update_scale()` on the scaler's device tensors: `scale`
    (float64, 0-dim), `unskipped` (int64, 0-dim), `found_inf` (float32, > 0: overflow).
    Returns this update's should_skip as a 0-dim bool tensor; nothing is read back."""
    kernels = _kernels(scale.device, [], [found_inf])
    if (
        kernels is not None
        and scale.dtype == torch.float64
        and scale.numel() == 1
        and scale.device == found_inf.device
        and unskipped.dtype == torch.int64
        and unskipped.numel() == 1
        and unskipped.device == scale.device
    ):
        return kernels.update_scale_(
            scale,
            unskipped,
            found_inf,
            dynamic=dynamic,
            min_loss_scale=float(min_loss_scale) if min_loss_scale else 0.0,
            max_loss_scale=float(max_loss_scale),
            scale_window=int(scale_window),
        )
    if not dynamic:
        unskipped.add_(1)
        return torch.zeros((), dtype=torch.bool, device=scale.device)
    found = found_inf[0] > 0
    halved = scale / 2.0
    if min_loss_scale:
        halved = torch.clamp(halved, min=float(min_loss_scale))
    scale.copy_(torch.where(found, halved, scale))
    unskipped.copy_(torch.where(found, torch.zeros_like(unskipped), unskipped + 1))
    grow = unskipped == scale_window
    grown = torch.clamp(scale * 2.0, max=float(max_loss_scale))
    scale.copy_(torch.where(grow, grown, scale))
    unskipped.copy_(torch.where(grow, torch.zeros_like(unskipped), unskipped))
    return found.clone()
