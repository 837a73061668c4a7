"""`apex.parallel.LARC`: layer-wise adaptive rate control as an optimizer wrapper.

Per parameter p with gradient g, in the wrapped optimizer's group (lr, weight_decay wd):

    local = trust_coefficient * ||p|| / (||g|| + ||p|| * wd + eps)
    clip=True:  local = min(local / lr, 1)        (the effective lr is min(local, lr))
    g <- (g + wd * p) * local                      (only when ||p|| != 0 and ||g|| != 0)

then the wrapped optimizer steps with its weight decay temporarily zeroed (LARC has already
added it to the gradient). Apex tested the norms on the host (`if param_norm != 0`), one sync
per parameter; here the test is a `torch.where`, with the same values bit for bit.

Like Apex's class it is not a `torch.optim.Optimizer`: it proxies `state`, `param_groups`,
`state_dict`, `load_state_dict`, `zero_grad` and `add_param_group`, and its `step()` takes no
closure. `amp.initialize` and `amp.scale_loss` accept it as a single optimizer.
"""

from __future__ import annotations

import torch


class LARC(object):
    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    @property
    def state(self):
        return self.optim.state

    def __repr__(self):
        return self.optim.__repr__()

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self):
        self.optim.zero_grad()

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self):
        weight_decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                weight_decay = group["weight_decay"] if "weight_decay" in group else 0
                weight_decays.append(weight_decay)
                group["weight_decay"] = 0
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    self._rescale_grad(p, weight_decay, group["lr"])
        try:
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = weight_decay

    def _rescale_grad(self, p, weight_decay, lr) -> None:
        grad = p.grad
        param_norm = torch.norm(p.data)
        grad_norm = torch.norm(grad.data)
        adaptive_lr = self.trust_coefficient * param_norm / (grad_norm + param_norm * weight_decay + self.eps)
        if self.clip:
            adaptive_lr = torch.clamp(adaptive_lr / lr, max=1)
        rescaled = (grad.data + weight_decay * p.data) * adaptive_lr
        active = (param_norm != 0) & (grad_norm != 0)
        grad.data.copy_(torch.where(active, rescaled, grad.data))
