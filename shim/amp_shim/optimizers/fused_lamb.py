"""`apex.optimizers.FusedLAMB`: LAMB as Apex's `multi_tensor_lamb` computes it.

No torch equivalent exists; this is Apex's update rule in tensor ops, fp32 math for every
param dtype, without host syncs:

* the global grad norm over all params of all groups (fp16/bf16 and fp32 alike) is clipped to
  `max_grad_norm` (the constructor's, as in Apex): grads are divided by `norm / max_grad_norm`
  when the norm exceeds it;
* per param: L2 mode adds `weight_decay * p` to the grad; `m = b1*m + b3*g` (`b3 = 1-b1` with
  `grad_averaging`, else 1); `v = b2*v + (1-b2)*g*g`; `update = (m/bc1) / (sqrt(v/bc2) + eps)`
  (`bc = 1 - b**step` with `bias_correction`, else 1); AdamW mode adds `weight_decay * p` to the
  update;
* trust ratio: `p -= lr * |p|/|update| * update` when `use_nvlamb` or `weight_decay != 0` and
  both norms are non-zero, else `p -= lr * update`.

The state dict is Apex's: `exp_avg`/`exp_avg_sq` per param (in the param's dtype), `step` in
the param group.
"""

from __future__ import annotations

import torch

from ..engine import ops
from . import _common
from .fused_adam import _fill_group_defaults, _from_torch_format

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def global_grad_norm(grads, device) -> torch.Tensor:
    """The L2 norm of all grads together, as a float32 0-dim tensor (Apex's
    `multi_tensor_l2norm`; summed in blocks as `ops.l2_norms` does)."""
    return ops.l2_norms(grads, device)[1]


def lamb_update_(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    *,
    lr,
    beta1,
    beta2,
    eps,
    step,
    bias_correction,
    weight_decay,
    grad_averaging,
    adam_w_mode,
    clip_divisor,
    use_nvlamb,
    out_params=None,
) -> None:
    """One LAMB update of `params` (fp32 math; moments keep their dtype).

    `clip_divisor` is a tensor (`max(1, norm / max_grad_norm)`); `out_params`, when given,
    receives the new values too (reduced-precision model copies of fp32 masters).
    """
    if bias_correction:
        bc1 = 1 - beta1**step
        bc2 = 1 - beta2**step
    else:
        bc1 = bc2 = 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    adaptive = use_nvlamb or weight_decay != 0
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        # Fresh temporaries are updated in place (the same operations in the same order, so
        # the same bits): at tens of millions of elements the allocations are the cost.
        p32 = p.float()
        g32 = g.float() / clip_divisor.to(g.device)
        if not adam_w_mode and weight_decay != 0:
            g32.add_(weight_decay * p32)
        m32 = m.float().mul_(beta1).add_(g32, alpha=beta3)
        v32 = v.float().mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
        del g32
        update = (m32 / bc1).div_((v32 / bc2).sqrt_().add_(eps))
        if adam_w_mode and weight_decay != 0:
            update.add_(weight_decay * p32)
        if adaptive:
            (p_norm, u_norm), _ = ops.l2_norms([p32, update], p32.device)
            ratio = torch.where((p_norm != 0) & (u_norm != 0), p_norm / u_norm, torch.ones_like(p_norm))
            new = p32 - update.mul_(lr * ratio)
        else:
            new = p32 - update.mul_(lr)
        p.copy_(new)
        if out_params is not None and out_params[i] is not None:
            out_params[i].copy_(new)
        m.copy_(m32)
        v.copy_(v32)


class FusedLAMB(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        amsgrad=False,
        adam_w_mode=True,
        grad_averaging=True,
        set_grad_none=True,
        max_grad_norm=1.0,
        use_nvlamb=False,
    ):
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm,
        )
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb

    def zero_grad(self, set_to_none=None):
        _common.zero_grad(self, self.set_grad_none, set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(_from_torch_format(self, state_dict, "FusedLAMB", ("exp_avg", "exp_avg_sq")))
        _fill_group_defaults(self)

    def _device(self):
        return self.param_groups[0]["params"][0].device

    def _all_grads(self):
        grads = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype not in _DTYPES:
                    raise RuntimeError("FusedLAMB only support fp16, fp32, and bf16.")
                grads.append(p.grad)
        return grads

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        norm = global_grad_norm(self._all_grads(), self._device())
        max_grad_norm = self.defaults["max_grad_norm"]
        clip_divisor = torch.where(norm > max_grad_norm, norm / max_grad_norm, torch.ones_like(norm))
        for group in self.param_groups:
            _common.next_step(group)
            params, grads, exp_avgs, exp_avg_sqs = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedLAMB")
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
            beta1, beta2 = group["betas"]
            lamb_update_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                step=group["step"],
                bias_correction=group["bias_correction"],
                weight_decay=group["weight_decay"],
                grad_averaging=group["grad_averaging"],
                adam_w_mode=bool(self.adam_w_mode),
                clip_divisor=clip_divisor,
                use_nvlamb=self.use_nvlamb,
            )
        return loss
