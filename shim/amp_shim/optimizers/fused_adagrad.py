"""`apex.optimizers.FusedAdagrad` on torch's fused Adagrad kernel.

The default (`adagrad_w_mode=False`, L2 added to the gradient) is bit for bit
`torch.optim.Adagrad(..., fused=True)` with torch's `lr_decay=0` and
`initial_accumulator_value=0`. `adagrad_w_mode=True` (decoupled decay), which torch lacks,
runs Apex's kernel formula in tensor ops. State: `sum` per param, `step` in the param group.
"""

from __future__ import annotations

import torch
from torch.optim.adagrad import adagrad as _torch_adagrad

from . import _common
from .fused_adam import _fill_group_defaults, _from_torch_format


class FusedAdagrad(torch.optim.Optimizer):
    def __init__(
        self, params, lr=1e-2, eps=1e-10, weight_decay=0.0, set_grad_none=True, adagrad_w_mode=False
    ):
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adagrad_w_mode = 1 if adagrad_w_mode else 0
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        _common.zero_grad(self, self.set_grad_none, set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(_from_torch_format(self, state_dict, "FusedAdagrad", ("sum",)))
        _fill_group_defaults(self)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = _common.amp_scaling(self)
        for group in self.param_groups:
            prev_step = _common.next_step(group)
            params, grads, sums = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedAdagrad")
                state = self.state[p]
                if len(state) == 0:
                    state["sum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                sums.append(state["sum"])
            if not params:
                continue
            if not self.adagrad_w_mode:
                fused = _common.can_fuse(params)
                steps = _common.step_tensors(params, prev_step, on_param_device=fused)
                _torch_adagrad(
                    params,
                    grads,
                    sums,
                    steps,
                    fused=fused or None,
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                    has_sparse_grad=False,
                    foreach=None if fused else _common.can_foreach(params),
                    differentiable=False,
                    has_complex=False,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    lr_decay=0.0,
                    eps=group["eps"],
                    maximize=False,
                )
            elif not _common.skip_for_inf(found_inf):
                lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
                for p, g, h in zip(params, _common.unscale_grads(grads, grad_scale), sums):
                    g32, p32 = g.float(), p.float()
                    h32 = h.float().addcmul_(g32, g32)
                    p.copy_(p32 - lr * (g32 / (h32.sqrt() + eps) + wd * p32))
                    h.copy_(h32)
        return loss
