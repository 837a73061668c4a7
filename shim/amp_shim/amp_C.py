"""`amp_C`: Apex's compiled multi-tensor extension, as torch ops with the kernels' conventions.

Real projects (and Apex's own tests and reference optimizers) import `amp_C` directly and drive
its entry points through `apex.multi_tensor_apply.multi_tensor_applier`, which calls
`op(chunk_size, noop_flag, tensor_lists, *args)`. The `apex` alias makes `import amp_C` resolve
to this module when no compiled `amp_C` is importable (see `amp_shim.alias`).

Conventions kept from `csrc/multi_tensor_*.cu`:

* `chunk_size` comes first; it only decided how the kernels split work, so it is accepted and
  ignored (the results do not depend on it);
* `noop_flag` is a one-element int tensor. The kernels that check their inputs set it to 1 on
  a non-finite value and never clear it; nothing is read back to the host. `multi_tensor_sgd`
  does nothing when it is already set; the other kernels write their outputs regardless, so
  infs and NaNs propagate, as in Apex;
* math is float32 whatever the storage type; results are stored in each output's own dtype;
* the norms return `(total, per_tensor)`: `total` a float32 tensor of shape [1], `per_tensor` a
  float32 vector with one norm per tensor when asked for, else an empty one. On the CPU they are
  summed as the kernels do, float32 partial sums per block combined in float64
  (`engine.ops.l2_norms`), so they stay within float32 rounding of the exact norm at any size.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .engine import ops

TensorLists = Sequence[Sequence[torch.Tensor]]

__all__ = [
    "multi_tensor_scale",
    "multi_tensor_axpby",
    "multi_tensor_l2norm",
    "multi_tensor_l2norm_scale",
    "multi_tensor_unscale_l2norm",
    "multi_tensor_adam",
    "multi_tensor_sgd",
    "multi_tensor_lamb",
    "multi_tensor_novograd",
    "update_scale_hysteresis",
]


# -- shared pieces -----------------------------------------------------------------------------


def _raise_flag(noop_flag: torch.Tensor, bad: torch.Tensor) -> None:
    """noop_flag <- 1 where `bad` (a 0-dim bool tensor) holds; never cleared, never read back."""
    noop_flag.masked_fill_(bad.to(noop_flag.device), 1)


def _any_non_finite(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One reduction per tensor: min and max are finite exactly when every element is (NaN
    propagates through both), with no boolean temporary the size of the tensor."""
    extremes = [x.to(device) for t in tensors if t.numel() for x in torch.aminmax(t)]
    if not extremes:
        return torch.zeros((), dtype=torch.bool, device=device)
    return ~torch.isfinite(torch.stack(extremes)).all()


def _norms(
    noop_flag: torch.Tensor, tensors: Sequence[torch.Tensor], per_tensor: Optional[bool]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The norms' return convention, flagging a non-finite sum of squares (a non-finite value,
    or squares past float32's range) as the kernels do."""
    device = tensors[0].device if tensors else noop_flag.device
    norms, total = ops.l2_norms(tensors, device)
    _raise_flag(noop_flag, ~torch.isfinite(norms * norms).all())
    return total.reshape(1), (norms if per_tensor else torch.empty(0, dtype=torch.float32, device=device))


# -- element-wise kernels ----------------------------------------------------------------------


@torch.no_grad()
def multi_tensor_scale(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists, scale: float
) -> None:
    """`[src, dst]`: dst = src * scale; a non-finite src raises the flag."""
    src, dst = tensor_lists
    if not src:
        return
    _raise_flag(noop_flag, _any_non_finite(src, noop_flag.device))
    for s, d in zip(src, dst):
        d.copy_(s.float() * scale)


@torch.no_grad()
def multi_tensor_axpby(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists, a: float, b: float, arg_to_check: int
) -> None:
    """`[x, y, out]`: out = a*x + b*y; `arg_to_check` -1 checks x and y, 0 only x, 1 only y."""
    xs, ys, outs = tensor_lists
    if not xs:
        return
    checked = (list(xs) if arg_to_check in (-1, 0) else []) + (list(ys) if arg_to_check in (-1, 1) else [])
    _raise_flag(noop_flag, _any_non_finite(checked, noop_flag.device))
    for x, y, out in zip(xs, ys, outs):
        out.copy_(a * x.float() + b * y.float())


# -- norms -------------------------------------------------------------------------------------


@torch.no_grad()
def multi_tensor_l2norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists, per_tensor: Optional[bool] = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[tensors]`: (total norm [1], per-tensor norms [n] or [0])."""
    (tensors,) = tensor_lists
    return _norms(noop_flag, list(tensors), per_tensor)


@torch.no_grad()
def multi_tensor_l2norm_scale(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    scale: float,
    per_tensor: Optional[bool] = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[in, out]`: out = in * scale, and the norms of `in` (before scaling)."""
    ins, outs = tensor_lists
    result = _norms(noop_flag, list(ins), per_tensor)
    for i, o in zip(ins, outs):
        o.copy_(i.float() * scale)
    return result


@torch.no_grad()
def multi_tensor_unscale_l2norm(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    inv_scale: torch.Tensor,
    per_tensor: Optional[bool] = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[tensors]`: the norms of tensors * inv_scale (a float32 tensor); tensors unchanged."""
    (tensors,) = tensor_lists
    unscaled = [t.float() * inv_scale.to(t.device) for t in tensors]
    return _norms(noop_flag, unscaled, per_tensor)


# -- optimizers --------------------------------------------------------------------------------


def _bias_corrections(beta1: float, beta2: float, step: int, bias_correction: int) -> tuple[float, float]:
    if bias_correction == 1:
        return 1 - beta1**step, 1 - beta2**step
    return 1.0, 1.0


@torch.no_grad()
def multi_tensor_adam(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    lr: float,
    beta1: float,
    beta2: float,
    epsilon: float,
    step: int,
    mode: int,
    bias_correction: int,
    weight_decay: float,
) -> None:
    """`[g, p, m, v]`: one Adam step (`mode` 0: L2, grad += wd*p; 1: AdamW, update += wd*p).

    The flag is neither read nor set: non-finite grads propagate into p, m and v.
    """
    bc1, bc2 = _bias_corrections(beta1, beta2, step, bias_correction)
    for g, p, m, v in zip(*tensor_lists):
        g32, p32, m32, v32 = g.float(), p.float(), m.float(), v.float()
        if mode == 0:
            g32 = g32 + weight_decay * p32
        m32 = beta1 * m32 + (1 - beta1) * g32
        v32 = beta2 * v32 + (1 - beta2) * g32 * g32
        update = (m32 / bc1) / ((v32 / bc2).sqrt() + epsilon)
        if mode != 0:
            update = update + weight_decay * p32
        p.copy_(p32 - lr * update)
        m.copy_(m32)
        v.copy_(v32)


@torch.no_grad()
def multi_tensor_sgd(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    wd: float,
    momentum: float,
    dampening: float,
    lr: float,
    nesterov: bool,
    first_run: bool,
    wd_after_momentum: bool,
    scale: float = 1.0,
) -> None:
    """`[g, p, momentum_buf]` or `[g, p, momentum_buf, model_copy]`: one SGD step on
    `grad * scale`, skipped (on the device, no host read) when the flag is already set; the
    fourth list receives the new weights in its own dtype (fp16 model copies of fp32 masters).
    """
    go = noop_flag.reshape(-1)[0] == 0
    lists = [list(lst) for lst in tensor_lists]
    copies = lists[3] if len(lists) == 4 else [None] * len(lists[0])
    for g, p, buf, copy in zip(lists[0], lists[1], lists[2], copies):
        g32, p32 = g.float() * scale, p.float()
        if wd != 0 and not wd_after_momentum:
            g32 = g32 + wd * p32
        if momentum != 0:
            buf32 = g32 if first_run else buf.float() * momentum + (1 - dampening) * g32
            g32 = g32 + momentum * buf32 if nesterov else buf32
            buf.copy_(torch.where(go.to(buf.device), buf32, buf.float()))
        if wd != 0 and wd_after_momentum:
            g32 = g32 + wd * p32
        new = torch.where(go.to(p.device), p32 - lr * g32, p32)
        p.copy_(new)
        if copy is not None:
            copy.copy_(torch.where(go.to(copy.device), new.to(copy.dtype), copy))


@torch.no_grad()
def multi_tensor_lamb(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    lr: float,
    beta1: float,
    beta2: float,
    epsilon: float,
    step: int,
    bias_correction: int,
    weight_decay: float,
    grad_averaging: int,
    mode: int,
    global_grad_norm: torch.Tensor,
    max_grad_norm: float,
    use_nvlamb: Optional[bool] = None,
) -> None:
    """`[g, p, m, v]`: one LAMB step, in the kernel's two stages.

    Stage 1 divides the grads by `global_grad_norm / max_grad_norm` when the norm exceeds
    `max_grad_norm`, updates m and v, and writes the Adam-style update into g (in g's dtype:
    the grads are overwritten, as in Apex). Stage 2 takes each tensor's param norm (before the
    step) and update norm (of the stored update) and applies `p -= lr * ratio * update`, with
    ratio = |p| / |update| when `use_nvlamb` or `weight_decay != 0` and both are non-zero, else 1.
    Both norms raise the flag on a non-finite value.
    """
    grads, params, exp_avgs, exp_avg_sqs = (list(lst) for lst in tensor_lists)
    if not grads:
        return
    bc1, bc2 = _bias_corrections(beta1, beta2, step, bias_correction)
    beta3 = 1 - beta1 if grad_averaging == 1 else 1.0
    param_norms = _norms(noop_flag, params, True)[1]
    norm = global_grad_norm.reshape(-1)[0].float()
    divisor = torch.where(norm > max_grad_norm, norm / max_grad_norm, torch.ones_like(norm))
    for g, p, m, v in zip(grads, params, exp_avgs, exp_avg_sqs):
        scaled = g.float() / divisor.to(g.device)
        p32 = p.float() if weight_decay != 0 else torch.zeros_like(scaled)
        if mode == 0:
            scaled = scaled + weight_decay * p32
        m32 = m.float() * beta1 + beta3 * scaled
        v32 = v.float() * beta2 + (1 - beta2) * scaled * scaled
        update = (m32 / bc1) / ((v32 / bc2).sqrt() + epsilon)
        if mode != 0:
            update = update + weight_decay * p32
        g.copy_(update)
        m.copy_(m32)
        v.copy_(v32)
    update_norms = _norms(noop_flag, grads, True)[1]
    adaptive = bool(use_nvlamb) or weight_decay != 0
    for i, (g, p) in enumerate(zip(grads, params)):
        ratio = torch.tensor(lr, dtype=torch.float32, device=p.device)
        if adaptive:
            pn, un = param_norms[i].to(p.device), update_norms[i].to(p.device)
            ratio = torch.where((pn != 0) & (un != 0), lr * (pn / un), ratio)
        p.copy_(p.float() - ratio * g.float())


@torch.no_grad()
def multi_tensor_novograd(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: TensorLists,
    grad_norms: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    epsilon: float,
    step: int,
    bias_correction: int,
    weight_decay: float,
    grad_averaging: int,
    mode: int,
    norm_type: int,
) -> None:
    """`[g, p, m]`: one NovoGrad step; `grad_norms` (float32, one per tensor) is blended in
    place with this step's per-tensor grad norms first: `sqrt(b2*n_old**2 + (1-b2)*n**2)` for
    `norm_type` 2, `b2*n_old + (1-b2)*n` for 0 (max-abs).

    `mode` 0: g = g/(n/bc2 + eps) + wd*p; m = b1*m + b3*g; p -= lr*m/bc1. `mode` 1:
    m = b1*m + b3*g; p -= lr*((m/bc1)/(n/bc2 + eps) + wd*p). bc1 = 1 - b1**step,
    bc2 = sqrt(1 - b2**step) with `bias_correction`; b3 = 1 - b1 with `grad_averaging`, else 1.
    """
    grads, params, exp_avgs = (list(lst) for lst in tensor_lists)
    if not grads:
        return
    device = grad_norms.device
    if norm_type == 0:
        new = torch.stack([g.float().abs().max().to(device) for g in grads])
        _raise_flag(noop_flag, ~torch.isfinite(new).all())
        grad_norms.copy_(beta2 * grad_norms + (1 - beta2) * new)
    else:
        new = _norms(noop_flag, grads, True)[1].to(device)
        grad_norms.copy_((beta2 * grad_norms * grad_norms + (1 - beta2) * new * new).sqrt())
    if bias_correction == 1:
        bc1, bc2 = 1 - beta1**step, math.sqrt(1 - beta2**step)
    else:
        bc1, bc2 = 1.0, 1.0
    beta3 = 1 - beta1 if grad_averaging == 1 else 1.0
    for i, (g, p, m) in enumerate(zip(grads, params, exp_avgs)):
        denom = grad_norms[i].to(p.device) / bc2 + epsilon
        g32, p32 = g.float(), p.float()
        if mode == 0:
            g32 = g32 / denom + weight_decay * p32
            m32 = beta1 * m.float() + beta3 * g32
            new_p = p32 - lr * (m32 / bc1)
        else:
            m32 = beta1 * m.float() + beta3 * g32
            new_p = p32 - lr * ((m32 / bc1) / denom + weight_decay * p32)
        p.copy_(new_p)
        m.copy_(m32)


# -- loss scale --------------------------------------------------------------------------------


@torch.no_grad()
def update_scale_hysteresis(
    current_scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    hysteresis_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
) -> torch.Tensor:
    """Apex's dynamic loss-scale update with hysteresis (`csrc/update_scale_hysteresis.cu`), on
    the device tensors in place (scale float32, trackers int32, all shape [1]); returns
    `current_scale`. Not a multi-tensor op: no chunk size or flag.

    An overflow (`found_inf > 0`) first spends one unit of hysteresis; while some is left only
    the growth tracker resets. Otherwise a non-zero `found_inf` backs the scale off (a result
    below float32's smallest normal becomes 0: Apex builds the kernel with fast math, which
    flushes subnormals), and a clean step counts towards `growth_interval`, growing the scale
    unless that would overflow float32. A clean step refills the hysteresis.
    """
    found = found_inf.reshape(-1)[0].to(current_scale.device)
    positive, nonzero = found > 0, found != 0
    hyst = torch.where(positive, hysteresis_tracker - 1, hysteresis_tracker)
    held = positive & (hyst > 0)
    backed = (current_scale.double() * backoff_factor).float()
    backed = torch.where(backed.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(backed), backed)
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (current_scale.double() * growth_factor).float()
    clean_scale = torch.where(grow & torch.isfinite(grown), grown, current_scale)
    clean_tracker = torch.where(grow, torch.zeros_like(successful), successful)
    new_scale = torch.where(nonzero, backed, clean_scale)
    new_tracker = torch.where(nonzero, torch.zeros_like(growth_tracker), clean_tracker)
    current_scale.copy_(torch.where(held, current_scale, new_scale))
    growth_tracker.copy_(torch.where(held, torch.zeros_like(growth_tracker), new_tracker))
    hysteresis_tracker.copy_(torch.where(found <= 0, torch.full_like(hyst, hysteresis), hyst))
    return current_scale
