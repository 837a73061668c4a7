"""`apex.optimizers.FusedNovoGrad`: NovoGrad as Apex's `multi_tensor_novograd`
computes it, in tensor ops with fp32 math.

Per param, with the layer's grad norm `n` (L2 for `norm_type=2`, max-abs for `norm_type=0`)
blended into the group's per-layer norms `v` (`v = sqrt(b2*v**2 + (1-b2)*n**2)` for L2,
`v = b2*v + (1-b2)*n` for inf; the first step starts from `v = n` unless `init_zero`),
`bc1 = 1 - b1**step`, `bc2 = sqrt(1 - b2**step)` (1 without `bias_correction`),
`b3 = 1 - b1` with `grad_averaging`, else 1:

* `reg_inside_moment=True`: `g = g / (v/bc2 + eps) + wd*p; m = b1*m + b3*g; p -= lr * m/bc1`;
* `reg_inside_moment=False` (default): `m = b1*m + b3*g; p -= lr * ((m/bc1) / (v/bc2 + eps) + wd*p)`.

As in Apex, the norms live in the param group (`group['exp_avg_sq'] = [fp16 norms, fp32 norms]`,
norms rather than squares) and `step` in the param group; `exp_avg` per param.
"""

from __future__ import annotations

import math

import torch

from ..engine import ops
from . import _common
from .fused_adam import _fill_group_defaults, _from_torch_format


def _layer_norms(grads, norm_type, device):
    """Per-layer grad norms (float32): max-abs, or L2 summed in blocks as `ops.l2_norms` does
    (torch's float32 CPU norm of a large layer drifts: 6e-4 relative at 16M elements)."""
    if not grads:
        return torch.zeros(0, dtype=torch.float32, device=device)
    if norm_type == 0:
        return torch.stack([g.float().abs().max() for g in grads]).to(device)
    return ops.l2_norms(grads, device)[0]


class FusedNovoGrad(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        amsgrad=False,
        reg_inside_moment=False,
        grad_averaging=True,
        norm_type=2,
        init_zero=False,
        set_grad_none=True,
    ):
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            norm_type=norm_type,
            init_zero=init_zero,
        )
        super().__init__(params, defaults)
        self.moment_mode = 0 if reg_inside_moment else 1
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        _common.zero_grad(self, self.set_grad_none, set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(_from_torch_format(self, state_dict, "FusedNovoGrad", ("exp_avg",)))
        _fill_group_defaults(self)
        # The per-layer norms live in the param group; move them to the params' device.
        for group in self.param_groups:
            if len(group["params"]) > 0 and "exp_avg_sq" in group:
                device = group["params"][0].device
                group["exp_avg_sq"] = [t.to(device) for t in group["exp_avg_sq"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            _common.next_step(group)
            step = group["step"]
            beta1, beta2 = group["betas"]
            if group["bias_correction"]:
                bc1 = 1 - beta1**step
                bc2 = math.sqrt(1 - beta2**step)
            else:
                bc1 = bc2 = 1.0
            beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            norm_type = group["norm_type"]

            lists = ([], []), ([], [])  # (params, grads) for reduced precision [0] and fp32 [1]
            for p in group["params"]:
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedNovoGrad")
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                if p.dtype in (torch.float16, torch.bfloat16):
                    kind = 0
                elif p.dtype == torch.float32:
                    kind = 1
                else:
                    raise RuntimeError("FusedNovoGrad only support fp16 and fp32.")
                lists[kind][0].append(p)
                lists[kind][1].append(p.grad)
            if not (lists[0][0] or lists[1][0]):
                continue
            device = (lists[0][0] or lists[1][0])[0].device
            if norm_type not in (0, 2):
                raise RuntimeError("FusedNovoGrad only support l2/inf norm now.")
            norms = [_layer_norms(lists[k][1], norm_type, device) for k in (0, 1)]
            if "exp_avg_sq" not in group:
                if group["init_zero"]:
                    group["exp_avg_sq"] = [torch.zeros_like(n) for n in norms]
                else:  # the first step's norms, so the first blend changes nothing
                    group["exp_avg_sq"] = [n.clone() for n in norms]
            else:
                assert len(lists[0][1]) == group["exp_avg_sq"][0].numel()
                assert len(lists[1][1]) == group["exp_avg_sq"][1].numel()

            for k in (0, 1):
                params, grads = lists[k]
                if not params:
                    continue
                v = group["exp_avg_sq"][k]
                if norm_type == 0:
                    v.mul_(beta2).add_(norms[k], alpha=1 - beta2)
                else:
                    v.copy_((beta2 * v * v + (1 - beta2) * norms[k] * norms[k]).sqrt())
                denoms = v / bc2 + eps
                for i, (p, g) in enumerate(zip(params, grads)):
                    m = self.state[p]["exp_avg"]
                    p32, g32, m32 = p.float(), g.float(), m.float()
                    denom = denoms[i]
                    if self.moment_mode == 0:
                        g32 = g32 / denom + wd * p32
                        m32 = beta1 * m32 + beta3 * g32
                        new = p32 - lr * (m32 / bc1)
                    else:
                        m32 = beta1 * m32 + beta3 * g32
                        new = p32 - lr * ((m32 / bc1) / denom + wd * p32)
                    p.copy_(new)
                    m.copy_(m32)
        return loss
