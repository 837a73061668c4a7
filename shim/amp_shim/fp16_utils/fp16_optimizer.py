"""`apex.fp16_utils.FP16_Optimizer`: fp32 master weights and loss scaling
around any torch optimizer, driven by `optimizer.backward(loss)` and `optimizer.step()`.

The masters are built eagerly, as amp O2 builds them lazily; loss scaling is amp's
`LossScaler` (the engine's tensor-resident scaler), so the fp16 -> fp32 unscale and the
overflow check are the engine's ops, with one host read per iteration (the skip decision).
"""

from __future__ import annotations

import torch

from .._deprecation import deprecated_warning
from ..amp._amp_state import maybe_print
from ..amp.scaler import LossScaler
from ..engine import ops
from .fp16util import DEPRECATION_MESSAGE, clip_grad_norm, master_params_to_model_params  # noqa: F401 - re-exported: Apex exposed them here

_HALF_TYPES = (torch.float16, torch.bfloat16)


def _as_shim_scaler(scaler, device):
    """A `LossScaler` as the shim keeps it, from whatever a checkpoint held.

    A checkpoint written by Apex pickles `apex.amp.scaler.LossScaler` with Apex's plain
    attributes (`_loss_scale`, `_unskipped`, `dynamic`, ...); unpickled through the alias it
    lands in the shim's class without the engine's tensors, so it is rebuilt from them.
    """
    raw = vars(scaler)
    if "scale" in raw and "found_inf" in raw:
        return scaler.to(device)
    dynamic = bool(raw.get("dynamic", False))
    value = raw.get("_loss_scale", 1.0)
    rebuilt = LossScaler(
        "dynamic" if dynamic else value,
        init_scale=value,
        scale_window=raw.get("_scale_seq_len", 2000),
        min_loss_scale=raw.get("_min_loss_scale"),
        max_loss_scale=raw.get("_max_loss_scale", 2.0**24),
        device=device,
    )
    if dynamic:
        rebuilt.set_loss_scale(value)  # not clamped by max_loss_scale, as Apex's value was not
    rebuilt.set_unskipped(raw.get("_unskipped", 0))
    return rebuilt


class FP16_Optimizer(object):
    def __init__(
        self,
        init_optimizer,
        static_loss_scale=1.0,
        dynamic_loss_scale=False,
        dynamic_loss_args=None,
        verbose=True,
    ):
        deprecated_warning(DEPRECATION_MESSAGE)
        print(
            "Warning:  FP16_Optimizer is deprecated and dangerous, and will be deleted soon.  "
            "If it still works, you're probably getting lucky.  "
            "For mixed precision, use the documented API https://nvidia.github.io/apex/amp.html, with opt_level=O1."
        )

        self.verbose = verbose
        self.optimizer = init_optimizer

        self.fp16_groups = []
        self.fp32_from_fp16_groups = []
        self.fp32_from_fp32_groups = []
        device = None
        for i, param_group in enumerate(self.optimizer.param_groups):
            self.maybe_print("FP16_Optimizer processing param group {}:".format(i))
            fp16_params_this_group = []
            fp32_params_this_group = []
            fp32_from_fp16_params_this_group = []
            for i, param in enumerate(param_group["params"]):
                if not param.requires_grad:
                    continue
                device = device or param.device
                if param.dtype in _HALF_TYPES:
                    self.maybe_print("FP16_Optimizer received {} with {}".format(param.type(), param.size()))
                    fp16_params_this_group.append(param)
                    master_param = param.detach().clone().float()
                    master_param.requires_grad = True
                    param_group["params"][i] = master_param
                    fp32_from_fp16_params_this_group.append(master_param)
                    # The state (e.g. momentum) follows the master; it is recast to fp32 below.
                    if param in self.optimizer.state:
                        self.optimizer.state[master_param] = self.optimizer.state.pop(param)
                elif param.dtype == torch.float32:
                    self.maybe_print("FP16_Optimizer received {} with {}".format(param.type(), param.size()))
                    fp32_params_this_group.append(param)
                    param_group["params"][i] = param
                else:
                    raise TypeError(
                        "Wrapped parameters must be either "
                        "torch.cuda.FloatTensor or torch.cuda.HalfTensor. "
                        "Received {}".format(param.type())
                    )
            self.fp16_groups.append(fp16_params_this_group)
            self.fp32_from_fp16_groups.append(fp32_from_fp16_params_this_group)
            self.fp32_from_fp32_groups.append(fp32_params_this_group)

        self.all_fp16_params = [p for g in self.fp16_groups for p in g]
        self.all_fp32_from_fp16_params = [p for g in self.fp32_from_fp16_groups for p in g]
        self.all_fp32_from_fp32_params = [p for g in self.fp32_from_fp32_groups for p in g]

        # state_dict() + load_state_dict() recasts preexisting per-param state to the masters.
        self.optimizer.load_state_dict(self.optimizer.state_dict())

        device = device or torch.device("cpu")
        if dynamic_loss_scale:
            self.dynamic_loss_scale = True
            self.loss_scaler = LossScaler("dynamic", device=device, **(dynamic_loss_args or {}))
        else:
            self.dynamic_loss_scale = False
            self.loss_scaler = LossScaler(static_loss_scale, device=device)

        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm

    # Distinct from _amp_state's maybe_print, as in Apex: governed by `verbose`.
    def maybe_print(self, msg):
        if self.verbose:
            print(msg)

    def __getstate__(self):
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state):
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    def zero_grad(self, set_grads_to_None=False):
        """Zero (or set to None) the optimizer-owned grads and the fp16 model grads."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if set_grads_to_None:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_()
                    p.grad.zero_()
        for fp16_group in self.fp16_groups:
            for param in fp16_group:
                if set_grads_to_None:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_()
                    param.grad.zero_()

    def _master_params_to_model_params(self):
        ops.copy_(self.all_fp16_params, self.all_fp32_from_fp16_params)

    def clip_master_grads(self, max_norm, norm_type=2):
        """`clip_grad_norm_` over the fp32 params the optimizer steps; -1 after an overflow."""
        if not self.overflow:
            fp32_params = []
            for param_group in self.optimizer.param_groups:
                for param in param_group["params"]:
                    fp32_params.append(param)
            return self.clip_grad_norm(fp32_params, max_norm, norm_type)
        return -1

    def state_dict(self):
        """Apex's format: the LossScaler object itself, flags, the wrapped optimizer's state dict
        and the fp32 masters (list of lists)."""
        state_dict = {}
        state_dict["loss_scaler"] = self.loss_scaler
        state_dict["dynamic_loss_scale"] = self.dynamic_loss_scale
        state_dict["overflow"] = self.overflow
        state_dict["first_closure_call_this_step"] = self.first_closure_call_this_step
        state_dict["optimizer_state_dict"] = self.optimizer.state_dict()
        state_dict["fp32_from_fp16"] = self.fp32_from_fp16_groups
        return state_dict

    def load_state_dict(self, state_dict):
        """Restore what `state_dict()` saved; call `model.load_state_dict()` first."""
        device = self.loss_scaler.device
        self.loss_scaler = _as_shim_scaler(state_dict["loss_scaler"], device)
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        # The saved fp32 masters, not fp32 copies of the (rounded) fp16 model values.
        for current_group, saved_group in zip(self.fp32_from_fp16_groups, state_dict["fp32_from_fp16"]):
            for current, saved in zip(current_group, saved_group):
                current.data.copy_(saved.data)

    def step(self, closure=None):
        """Step the fp32 masters and copy them into the fp16 model; skipped after an overflow."""
        if self.overflow:
            maybe_print(
                "Gradient overflow.  Skipping step, reducing loss scale to {}".format(
                    self.loss_scaler.loss_scale()
                )
            )
            return
        if closure is not None:
            retval = self._step_with_closure(closure)
        else:
            retval = self.optimizer.step()
        self._master_params_to_model_params()
        return retval

    def _step_with_closure(self, closure):
        def wrapped_closure():
            if self.first_closure_call_this_step:
                # The fp16 params are fresh on entering step().
                self.first_closure_call_this_step = False
            else:
                # The wrapped optimizer may have moved the masters since the last call.
                self._master_params_to_model_params()
            temp_loss = closure()
            while self.overflow:
                print(
                    "OVERFLOW within closure! Skipping step, reducing loss scale to {}".format(
                        self.loss_scaler.loss_scale()
                    )
                )
                temp_loss = closure()
            return temp_loss

        retval = self.optimizer.step(wrapped_closure)
        self.first_closure_call_this_step = True
        return retval

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        """`(loss.float() * loss_scale).backward()`, then `update_master_grads()` if asked."""
        scaled_loss = self.loss_scaler.scaled(loss)
        scaled_loss.backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self):
        """Unscale the fp16 grads into the fp32 master grads and the fp32 grads in place, then
        update the loss scale; `self.overflow` says whether the next step is skipped."""
        scaler = self.loss_scaler
        scaler.clear_overflow_state()
        inv_scale = scaler.inv_scale()
        if self.all_fp16_params:
            model_grads, masters = [], []
            for model_param, master_param in zip(self.all_fp16_params, self.all_fp32_from_fp16_params):
                if model_param.grad is not None:
                    model_grads.append(model_param.grad)
                    masters.append(master_param)
            fresh = ops.unscale_to_fp32_(model_grads, [None] * len(model_grads), scaler.found_inf, inv_scale)
            existing_dst, existing_src = [], []
            for master, grad in zip(masters, fresh):
                if master.grad is None:
                    master.grad = grad
                else:
                    existing_dst.append(master.grad)
                    existing_src.append(grad)
            ops.copy_(existing_dst, existing_src)
        if self.all_fp32_from_fp32_params:
            grads = [p.grad for p in self.all_fp32_from_fp32_params if p.grad is not None]
            ops.unscale_(grads, scaler.found_inf, inv_scale)
        self.overflow = scaler.update_scale()

    def inspect_master_grad_data(self):
        """The fp32 master grads, a list per param group; None (with a warning) after an overflow."""
        if self.overflow:
            print(
                "Warning:  calling FP16_Optimizer.inspect_master_grad_data while in an overflow state.  "
                "Gradients are currently invalid (may be inf, nan, or stale).  Returning None."
            )
            return None
        master_grads_data = []
        for param_group in self.optimizer.param_groups:
            master_grads_this_group = []
            for param in param_group["params"]:
                master_grads_this_group.append(param.grad.data if param.grad is not None else None)
            master_grads_data.append(master_grads_this_group)
        return master_grads_data

    # `optimizer.loss_scale` reads and sets the scale.
    def _get_loss_scale(self):
        return self.loss_scaler.loss_scale()

    def _set_loss_scale(self, value):
        self.loss_scaler._loss_scale = value

    loss_scale = property(_get_loss_scale, _set_loss_scale)

    # `optimizer.state` and `optimizer.param_groups` are the wrapped optimizer's (e.g. for lr schedules).
    def _get_state(self):
        return self.optimizer.state

    def _set_state(self, value):
        self.optimizer.state = value

    state = property(_get_state, _set_state)

    def _get_param_groups(self):
        return self.optimizer.param_groups

    def _set_param_groups(self, value):
        self.optimizer.param_groups = value

    param_groups = property(_get_param_groups, _set_param_groups)
