"""`apex.optimizers.FusedSGD` on torch's fused SGD kernel.

Apex's default numerics are torch's (weight decay before momentum, `buf = grad` on the first
step, the same Nesterov rule), so a step is bit for bit `torch.optim.SGD(..., fused=True)`.
`wd_after_momentum=True`, which torch lacks, runs Apex's kernel formula in tensor ops
(`_sgd_apex_kernel`).
`set_grad_none` defaults to False here, unlike the other Apex optimizers.

Like `torch.optim.SGD(fused=True)` (and unlike Apex's FusedSGD) the step supports amp scaling
(`_step_supports_amp_scaling`): given `grad_scale`/`found_inf` (torch.amp.GradScaler's protocol,
also what the shim's amp uses to skip a step after an overflow) the fused kernel unscales and
skips on the device. Where it cannot (the first momentum step, which would otherwise store an
uninitialised momentum buffer on overflow, as torch's fused SGD does; `wd_after_momentum`;
devices without the fused kernel) found_inf is read once on the host and a skipped step leaves
params and state untouched.

fp16/bf16 params on the CPU do not go to torch's fused kernel: torch's CPU fused SGD leaves a
reduced-precision tensor of 16 or more elements almost unchanged (only the scalar tail of its
vectorised loop is written back; seen on torch 2.13). They run torch's `sgd` without the fused
kernel instead: bit for bit `torch.optim.SGD(...)` with its CPU default (the per-tensor loop),
which is what Apex's own FusedSGD test compares with. Apex's kernel rounds once per step where
torch rounds per op: a few fp16 ulps apart after several steps. Under a grad scaler they are
unscaled and skipped on the host.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.optim.optimizer import required
from torch.optim.sgd import sgd as _torch_sgd

from . import _common


class FusedSGD(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr=required,
        momentum=0,
        dampening=0,
        weight_decay=0,
        nesterov=False,
        wd_after_momentum=False,
        materialize_master_grads=True,
        set_grad_none=False,
    ):
        if lr is not required and lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if momentum < 0.0:
            raise ValueError("Invalid momentum value: {}".format(momentum))
        if weight_decay < 0.0:
            raise ValueError("Invalid weight_decay value: {}".format(weight_decay))
        defaults = dict(
            lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov
        )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        # Only meaningful under amp O2 (whether fp16 grads are copied into fp32 master grads).
        self.materialize_master_grads = materialize_master_grads
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        self.set_grad_none = set_grad_none
        self._step_supports_amp_scaling = True

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def zero_grad(self, set_to_none=None):
        _common.zero_grad(self, self.set_grad_none, set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)  # torch SGD's format is Apex's
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = _common.amp_scaling(self)
        host_skip = None  # found_inf read on the host, at most once per step

        def skip_on_host() -> bool:
            nonlocal host_skip
            if host_skip is None:
                host_skip = _common.skip_for_inf(found_inf)
            return host_skip

        for group in self.param_groups:
            params, grads, bufs = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                _common.check_no_sparse(p.grad, "FusedSGD")
                params.append(p)
                grads.append(p.grad)
                state = self.state.get(p)
                bufs.append(state.get("momentum_buffer") if state else None)
            if not params:
                continue
            if self.wd_after_momentum:
                if not skip_on_host():
                    _sgd_apex_kernel(params, grads, bufs, group, grad_scale, wd_after_momentum=True)
            else:
                unfusable = [_cpu_reduced_precision(p) for p in params]
                for fusable in (True, False):
                    idx = [i for i, u in enumerate(unfusable) if u != fusable]
                    if not idx:
                        continue
                    sub_bufs = [bufs[i] for i in idx]
                    self._torch_step(
                        [params[i] for i in idx],
                        [grads[i] for i in idx],
                        sub_bufs,
                        group,
                        grad_scale,
                        found_inf,
                        skip_on_host,
                        fusable,
                    )
                    for i, buf in zip(idx, sub_bufs):
                        bufs[i] = buf
            if group["momentum"] != 0:
                for p, buf in zip(params, bufs):
                    if buf is not None:
                        self.state[p]["momentum_buffer"] = buf
        return loss

    @staticmethod
    def _torch_step(params, grads, bufs, group, grad_scale, found_inf, skip_on_host, fusable) -> None:
        """torch's `sgd` (fused where it can unscale and skip on the device); fills `bufs`."""
        first_momentum_step = group["momentum"] != 0 and any(b is None for b in bufs)
        fused = fusable and _common.can_fuse(params)
        if fused and not first_momentum_step:
            _torch_sgd(
                params,
                grads,
                bufs,
                has_sparse_grad=False,
                foreach=None,
                fused=True,
                grad_scale=grad_scale,
                found_inf=found_inf,
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=group["lr"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=False,
            )
        elif not skip_on_host():
            _torch_sgd(
                params,
                _common.unscale_grads(grads, grad_scale),
                bufs,
                has_sparse_grad=False,
                foreach=None if fused else _common.can_foreach(params),
                fused=fused or None,
                grad_scale=None,
                found_inf=None,
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=group["lr"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=False,
            )


def _cpu_reduced_precision(p: torch.Tensor) -> bool:
    """A param torch's CPU fused SGD kernel does not update (module docstring)."""
    return p.device.type == "cpu" and p.dtype in (torch.float16, torch.bfloat16)


def _sgd_apex_kernel(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    bufs: list,
    group: dict,
    grad_scale: Optional[torch.Tensor],
    wd_after_momentum: bool,
) -> None:
    """Apex's `multi_tensor_sgd` per element (used for `wd_after_momentum`, which torch lacks):
    fp32 arithmetic on the unscaled grad, weight decay before or after the momentum update,
    `buf = grad` on the first step, one rounding of the param and the momentum buffer (kept in
    the param's dtype) per step. Fills `bufs`."""
    lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
    wd, nesterov = group["weight_decay"], group["nesterov"]
    for i, (p, g) in enumerate(zip(params, grads)):
        weight = p.float()
        incoming = g.float()
        if grad_scale is not None:
            incoming = incoming / grad_scale.to(g.device, torch.float32)
        if wd != 0 and not wd_after_momentum:
            incoming = incoming.add(weight, alpha=wd)
        if momentum != 0:
            if bufs[i] is None:
                buf = incoming.clone()
                bufs[i] = buf.to(p.dtype) if p.dtype != torch.float32 else buf
            else:
                buf = bufs[i].float().mul_(momentum).add_(incoming, alpha=1 - dampening)
                bufs[i].copy_(buf)
            incoming = incoming.add(buf, alpha=momentum) if nesterov else buf
        if wd != 0 and wd_after_momentum:
            incoming = incoming.add(weight, alpha=wd)
        p.copy_(weight.add(incoming, alpha=-lr))
