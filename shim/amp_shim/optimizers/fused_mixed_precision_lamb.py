"""`apex.optimizers.FusedMixedPrecisionLamb`: FusedLAMB's update with `lr` and
`step` as tensors in the param group, and fp32 master copies of the params whose dtype is
`reduced_precision_dtype` (created at the first step, as in Apex), so the model can be bf16/fp16
while the update runs on fp32 values. The moments are fp32 for those params.
"""

from __future__ import annotations

import torch

from . import _common
from .fused_lamb import FusedLAMB, global_grad_norm, lamb_update_


class FusedMixedPrecisionLamb(FusedLAMB):
    def __init__(
        self,
        params,
        lr=1e-3,
        step=0,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        amsgrad=False,
        adam_w_mode=True,
        grad_averaging=True,
        max_grad_norm=1.0,
        use_nvlamb=False,
        reduced_precision_dtype=None,
    ):
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        super().__init__(
            params,
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            adam_w_mode=adam_w_mode,
            grad_averaging=grad_averaging,
            set_grad_none=True,
            max_grad_norm=max_grad_norm,
            use_nvlamb=use_nvlamb,
        )
        device = self._device()
        for group in self.param_groups:
            group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32).to(device)
            group["step"] = torch.tensor([step], dtype=torch.int, device=device)
        self.reduced_precision_dtype = reduced_precision_dtype
        self.param_groups_full_precision = []
        self._step_supports_amp_scaling = True

    def _reduced_precision(self, p) -> bool:
        return self.reduced_precision_dtype is not None and p.dtype == self.reduced_precision_dtype

    def _setup_full_precision_params(self):
        for group in self.param_groups:
            self.param_groups_full_precision.append(
                {
                    "params": [
                        p.detach().clone().float() if self._reduced_precision(p) else None
                        for p in group["params"]
                    ]
                }
            )

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.param_groups_full_precision:
            self._setup_full_precision_params()
        grad_scale, found_inf = _common.amp_scaling(self, grad_scaler)
        if _common.skip_for_inf(found_inf):
            return loss
        all_grads = _common.unscale_grads(self._all_grads(), grad_scale)
        norm = global_grad_norm(all_grads, self._device())
        max_grad_norm = self.defaults["max_grad_norm"]
        clip_divisor = torch.where(norm > max_grad_norm, norm / max_grad_norm, torch.ones_like(norm))
        for group, full in zip(self.param_groups, self.param_groups_full_precision):
            _common.next_step(group)
            targets, grads, exp_avgs, exp_avg_sqs, models = [], [], [], [], []
            for p, master in zip(group["params"], full["params"]):
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedMixedPrecisionLamb")
                target = master if master is not None else p
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(target)
                    state["exp_avg_sq"] = torch.zeros_like(target)
                targets.append(target)
                grad = p.grad if grad_scale is None else p.grad / grad_scale.to(p.grad.device, torch.float32)
                grads.append(grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                models.append(p if master is not None else None)
            beta1, beta2 = group["betas"]
            lamb_update_(
                targets,
                grads,
                exp_avgs,
                exp_avg_sqs,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                step=group["step"].float(),
                bias_correction=group["bias_correction"],
                weight_decay=group["weight_decay"],
                grad_averaging=group["grad_averaging"],
                adam_w_mode=bool(self.adam_w_mode),
                clip_divisor=clip_divisor,
                use_nvlamb=self.use_nvlamb,
                out_params=models,
            )
        return loss
