"""`apex.optimizers.FusedAdam` on torch's fused Adam/AdamW kernel.

`adam_w_mode=True` (the default) is `torch.optim.AdamW`, `adam_w_mode=False` is
`torch.optim.Adam` (L2 added to the gradient); both run torch's `fused=True` kernel (foreach on
devices without one), so a step is bit for bit the step of `torch.optim.AdamW(..., fused=True)`
with the same hyperparameters, which is what the codemod migrates FusedAdam to.
`bias_correction=False`, which torch lacks, runs Apex's formula in tensor ops.

The state dict is Apex's: `exp_avg`/`exp_avg_sq` per param, `step` in the param group.
`load_state_dict` also takes a torch Adam/AdamW state dict (per-param steps, which must agree
within a group).
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam as _torch_adam

from . import _common


class FusedAdam(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-8,
        adam_w_mode=True,
        weight_decay=0.0,
        amsgrad=False,
        set_grad_none=True,
        capturable=False,
        master_weights=False,
    ):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and not capturable:
            raise RuntimeError("Master weights is currently only supported with the capturable version.")
        defaults = dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay
        )
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        self.master_weights = master_weights
        # As in Apex: only the capturable variant unscales and skips by itself under GradScaler.
        self._step_supports_amp_scaling = bool(capturable)
        if capturable:
            for group in self.param_groups:
                if group["params"]:
                    group["step"] = torch.zeros((), dtype=torch.int32, device=group["params"][0].device)
        self.param_groups_master = []
        if master_weights:
            for group in self.param_groups:
                self.param_groups_master.append(
                    [
                        p.detach().clone().float() if p.dtype in (torch.float16, torch.bfloat16) else None
                        for p in group["params"]
                    ]
                )

    def zero_grad(self, set_to_none=None):
        _common.zero_grad(self, self.set_grad_none, set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(
            _from_torch_format(
                self, state_dict, "FusedAdam", ("exp_avg", "exp_avg_sq"), refuse=("max_exp_avg_sq",)
            )
        )
        _fill_group_defaults(self)

    @torch.no_grad()
    def step(
        self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None, grad_scaler=None
    ):
        if any(p is not None for p in [grads, output_params, scale, grad_norms]):
            raise RuntimeError(
                "FusedAdam has been updated.  Simply initialize it identically to "
                "torch.optim.Adam, and call step() with no arguments."
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        grad_scale, found_inf = _common.amp_scaling(self, grad_scaler)
        for gi, group in enumerate(self.param_groups):
            prev_step = _common.next_step(group, found_inf if self.capturable else None)
            masters = self.param_groups_master[gi] if self.master_weights else None
            params, grads_, exp_avgs, exp_avg_sqs, copy_back = [], [], [], [], []
            model_grads = []  # each param's own `.grad` (for a master, not the fp32 copy)
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedAdam")
                target, grad = p, p.grad
                if masters is not None and masters[pi] is not None:
                    target, grad = masters[pi], p.grad.float()
                    copy_back.append((p, target))
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(target, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(target, memory_format=torch.preserve_format)
                params.append(target)
                grads_.append(grad)
                model_grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            l2_term = self.capturable and not self.adam_w_mode and group["weight_decay"] != 0
            params_before = [t.detach().clone() for t in params] if l2_term else None
            unscaled = grads_  # torch's fused kernel unscales these in place
            if group["bias_correction"]:
                fused = _common.can_fuse(params)
                steps = _common.step_tensors(params, prev_step, on_param_device=fused)
                _torch_adam(
                    params,
                    grads_,
                    exp_avgs,
                    exp_avg_sqs,
                    [],
                    steps,
                    foreach=None if fused else _common.can_foreach(params),
                    capturable=False,
                    differentiable=False,
                    fused=fused or None,
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                    has_complex=False,
                    decoupled_weight_decay=bool(self.adam_w_mode),
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
            elif not _common.skip_for_inf(found_inf):
                unscaled = _common.unscale_grads(grads_, grad_scale)
                _adam_no_bias_correction(
                    params, unscaled, exp_avgs, exp_avg_sqs, group, beta1, beta2, bool(self.adam_w_mode)
                )
            else:
                unscaled = None  # skipped on the host: grads stay as they are
            if self.capturable and unscaled is not None:
                _write_back_grads(model_grads, unscaled, params_before, group["weight_decay"], found_inf)
            for p, master in copy_back:
                p.copy_(master)
        return loss


def _write_back_grads(model_grads, unscaled, params_before, weight_decay, found_inf) -> None:
    """What Apex's capturable kernels leave in `p.grad` (`multi_tensor_adam_capturable` and its
    master variant write back the grad they used): the unscaled grad, plus `weight_decay * p`
    (the pre-step value, the fp32 master where there is one) in L2 mode, in the grad's dtype.
    After an overflow the kernel returns at once and the scaled grad stays. Needed because
    torch's kernel unscales the grads it is given in place, and for master weights those are
    fp32 copies of `p.grad`, not `p.grad`."""
    keep = None if found_inf is None else found_inf.reshape(()) != 0
    for i, (grad, new) in enumerate(zip(model_grads, unscaled)):
        if params_before is not None:
            new = new.float().add(params_before[i].float(), alpha=weight_decay)
        elif new is grad:
            continue  # already unscaled in place
        new = new.to(grad.dtype)
        if keep is not None:
            new = torch.where(keep.to(grad.device), grad, new)
        grad.copy_(new)


def _adam_no_bias_correction(params, grads, exp_avgs, exp_avg_sqs, group, beta1, beta2, adam_w_mode):
    """Apex's kernel with bias corrections of 1, computed in fp32 (torch has no such option)."""
    lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        p32, g32, m32, v32 = p.float(), g.float(), m.float(), v.float()
        if not adam_w_mode and wd != 0:
            g32 = g32 + wd * p32
        m32 = beta1 * m32 + (1 - beta1) * g32
        v32 = beta2 * v32 + (1 - beta2) * g32 * g32
        update = m32 / (v32.sqrt() + eps)
        if adam_w_mode:
            update = update + wd * p32
        p.copy_(p32 - lr * update)
        m.copy_(m32)
        v.copy_(v32)


def _fill_group_defaults(optimizer) -> None:
    """A state dict saved by a torch optimizer lacks Apex-only group keys; keep this
    optimizer's defaults for them."""
    for group in optimizer.param_groups:
        for key, value in optimizer.defaults.items():
            group.setdefault(key, value)


def _from_torch_format(optimizer, state_dict, name, keys, refuse=()):
    """Turn a torch state dict (a `step` per param) into Apex's (a `step` per group).

    Apex's own format passes through. The conversion refuses state this optimizer cannot
    continue from: per-param steps that differ within a group (one count per group is all
    Apex's format holds) and state Apex's optimizer never has (e.g. AMSGrad's `max_exp_avg_sq`).
    """
    state = state_dict.get("state", {})
    if not any(isinstance(s, dict) and "step" in s for s in state.values()):
        return state_dict
    new_state = {}
    new_groups = []
    for gi, group in enumerate(state_dict["param_groups"]):
        steps = set()
        for pid in group["params"]:
            s = state.get(pid)
            if not s:
                continue
            for key in refuse:
                if key in s:
                    raise ValueError(
                        "{} cannot load this state dict: parameter {} has '{}' state, which {} "
                        "never keeps (a torch optimizer created with amsgrad=True?)".format(
                            name, pid, key, name
                        )
                    )
            if "step" in s:
                step = s["step"]
                steps.add(float(step.item() if isinstance(step, torch.Tensor) else step))
            new_state[pid] = {k: v for k, v in s.items() if k != "step"}
        if len(steps) > 1:
            raise ValueError(
                "{} cannot load this state dict: the parameters of param group {} were stepped "
                "different numbers of times ({}); {} keeps one step count per param group "
                "(Apex's fused optimizers store `step` in the group, not per parameter), so the "
                "bias corrections could not be continued".format(
                    name, gi, sorted(int(s) for s in steps), name
                )
            )
        new_group = dict(group)
        if steps:
            new_group["step"] = int(steps.pop())
        new_groups.append(new_group)
    return {"state": new_state, "param_groups": new_groups}
