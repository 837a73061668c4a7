"""Per-optimizer Amp state and patches: grad stashing, O2 master weights, and the patched
`optimizer.step` that applies the skip after an overflow.

`optimizer.step` is patched once, at initialize, instead of being swapped back and forth as
Apex did (so lr schedulers see a stable method); the skip decision it applies, and its two
paths (host and device), are the engine's (engine/skip.py).
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..engine import ops, skip
from ..engine.skip import SKIP_MSG
from . import _master_sources
from ._amp_state import _amp_state, maybe_print
from .casts_off import disable_casts

_CLOSURE_MSG = "Currently, Amp does not support closure use with optimizers."

# model param -> its fp32 master; fp32 values its master starts from (_master_sources.py).
_masters: WeakIdKeyDictionary = WeakIdKeyDictionary()
_pending_master_values = _master_sources.pending_master_values


class AmpOptimizerState:
    pass


def _type_error(param: torch.Tensor) -> TypeError:
    return TypeError(
        "Optimizer's parameters must be either torch.cuda.FloatTensor or "
        "torch.cuda.HalfTensor. Received {}".format(param.type())
    )


def _is_reduced(param: torch.Tensor) -> bool:
    return param.dtype in (torch.float16, torch.bfloat16)


def _kind(param: torch.Tensor) -> str:
    """'half' or 'float', device-agnostic; bf16 counts as half (the shim accepts it)."""
    if _is_reduced(param):
        return "half"
    if param.dtype == torch.float32:
        return "float"
    raise _type_error(param)


def _make_master(param: torch.Tensor) -> torch.Tensor:
    """The fp32 master of `param`: from the fp32 value remembered before O2's cast or loaded
    since (`_master_sources`), else (a param cast by the user) from the param itself."""
    loaded = _master_sources.take_master_value(param)
    source = loaded if loaded is not None else param.detach()
    master = source.clone().float()
    master.requires_grad = True
    _masters[param] = master
    return master


# -- lazy init ----------------------------------------------------------------------------
def lazy_init_with_master_weights(self) -> None:
    stash = self._amp_stash
    stash.fp16_groups = []
    stash.fp32_from_fp16_groups = []
    stash.fp32_from_fp32_groups = []
    for param_group in self.param_groups:
        fp16_this_group, fp32_this_group, masters_this_group = [], [], []
        for i, param in enumerate(param_group["params"]):
            if not param.requires_grad:
                continue
            if _kind(param) == "half":
                fp16_this_group.append(param)
                master = _make_master(param)
                param_group["params"][i] = master
                masters_this_group.append(master)
                if param in self.state:
                    self.state[master] = self.state.pop(param)
            else:
                fp32_this_group.append(param)
        stash.fp16_groups.append(fp16_this_group)
        stash.fp32_from_fp16_groups.append(masters_this_group)
        stash.fp32_from_fp32_groups.append(fp32_this_group)
    stash.all_fp16_params = [p for g in stash.fp16_groups for p in g]
    stash.all_fp32_from_fp16_params = [p for g in stash.fp32_from_fp16_groups for p in g]
    stash.all_fp32_from_fp32_params = [p for g in stash.fp32_from_fp32_groups for p in g]
    stash.all_fp16_grad_stash = [None for _ in stash.all_fp16_params]
    stash.all_fp32_from_fp32_grad_stash = [None for _ in stash.all_fp32_from_fp32_params]
    for param in stash.all_fp32_from_fp16_params:
        param.grad = None
    for param in stash.all_fp32_from_fp32_params:
        param.grad = None
    # Recast per-param state (e.g. momentum) to the masters' fp32, then put back the fp32
    # state remembered before the cast where there is one (not rounded through fp16).
    stash.original_load_state_dict(self.state_dict())
    for param, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        if master in self.state:
            _master_sources.restore_master_state(param, self.state[master])


def lazy_init_no_master_weights(self) -> None:
    stash = self._amp_stash
    stash.all_fp16_params = []
    stash.all_fp32_params = []
    for param_group in self.param_groups:
        for param in param_group["params"]:
            if _kind(param) == "half":
                stash.all_fp16_params.append(param)
            else:
                stash.all_fp32_params.append(param)
    stash.all_fp16_grad_stash = [None for _ in stash.all_fp16_params]
    stash.all_fp32_grad_stash = [None for _ in stash.all_fp32_params]


def _amp_lazy_init(self) -> None:
    stash = self._amp_stash
    if not stash.lazy_init_called:
        self._lazy_init_maybe_master_weights()
        stash.lazy_init_called = True


def _master_params_to_model_params(self) -> None:
    stash = self._amp_stash
    ops.copy_(stash.all_fp16_params, stash.all_fp32_from_fp16_params)


# -- backward: stash before, unscale and recombine after ----------------------------------
def prepare_backward_with_master_weights(self) -> None:
    stash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params:
        param.grad = None  # the fp32 master grads hold what was accumulated so far
    for i, param in enumerate(stash.all_fp32_from_fp32_params):
        stash.all_fp32_from_fp32_grad_stash[i] = param.grad
        param.grad = None


def prepare_backward_no_master_weights(self) -> None:
    stash = self._amp_stash
    self._amp_lazy_init()
    for i, param in enumerate(stash.all_fp16_params):
        stash.all_fp16_grad_stash[i] = param.grad
        param.grad = None
    for i, param in enumerate(stash.all_fp32_params):
        stash.all_fp32_grad_stash[i] = param.grad
        param.grad = None


def post_backward_models_are_masters(scaler, params, stashed_grads) -> None:
    static_one = not scaler.dynamic and scaler.loss_scale() == 1.0
    fresh, fresh_with_stash, stashed = [], [], []
    for param, stashed_grad in zip(params, stashed_grads):
        if param.grad is None and stashed_grad is not None:
            param.grad = stashed_grad
        elif param.grad is not None and stashed_grad is None:
            fresh.append(param.grad)
        elif param.grad is not None and stashed_grad is not None:
            fresh_with_stash.append(param.grad)
            stashed.append(stashed_grad)
    if static_one:
        # Nothing to unscale; Apex drops the stash here, the shim keeps the accumulated sum.
        if fresh_with_stash:
            ops.add_(fresh_with_stash, stashed)
    else:
        inv = scaler.inv_scale()
        ops.unscale_(fresh, scaler.found_inf, inv)
        ops.unscale_add_(fresh_with_stash, stashed, scaler.found_inf, inv)
    for i in range(len(stashed_grads)):
        stashed_grads[i] = None


def post_backward_with_master_weights(self, scaler) -> None:
    stash = self._amp_stash
    self._amp_lazy_init()
    model_grads, masters = [], []
    for fp16_param, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        if fp16_param.grad is not None:
            model_grads.append(fp16_param.grad)
            masters.append(master)
    if model_grads:
        new = ops.unscale_to_fp32_(
            model_grads, [m.grad for m in masters], scaler.found_inf, scaler.inv_scale()
        )
        for master, grad in zip(masters, new):
            master.grad = grad
    post_backward_models_are_masters(
        scaler, stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash
    )


def post_backward_no_master_weights(self, scaler) -> None:
    stash = self._amp_stash
    self._amp_lazy_init()
    post_backward_models_are_masters(scaler, stash.all_fp16_params, stash.all_fp16_grad_stash)
    post_backward_models_are_masters(scaler, stash.all_fp32_params, stash.all_fp32_grad_stash)


def restore_stashed_grads(optimizer) -> None:
    """Undo `_prepare_amp_backward` when the `scale_loss` body raised (Apex loses the grads)."""
    stash = optimizer._amp_stash
    pairs = []
    if hasattr(stash, "all_fp32_params"):
        pairs += [
            (stash.all_fp16_params, stash.all_fp16_grad_stash),
            (stash.all_fp32_params, stash.all_fp32_grad_stash),
        ]
    if hasattr(stash, "all_fp32_from_fp32_params"):
        pairs.append((stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash))
        for param in stash.all_fp16_params:
            param.grad = None
    for params, stashed in pairs:
        for i, param in enumerate(params):
            param.grad = stashed[i]
            stashed[i] = None


def _patch_step(optimizer, properties) -> None:
    inner = optimizer.step  # the bound original
    real_step: Callable[..., Any]

    if properties.master_weights:

        def real_step(self, closure=None):
            if closure is not None:
                raise RuntimeError(_CLOSURE_MSG)
            retval = inner()
            self._master_params_to_model_params()
            for param in self._amp_stash.all_fp32_from_fp16_params:
                param.grad = None
            return retval
    else:

        def real_step(self, *args, **kwargs):
            return inner(*args, **kwargs)

    if properties.patch_torch_functions:
        casting_step = real_step

        def real_step(self, *args, **kwargs):  # noqa: F811 - O1 runs the step with casts off
            with disable_casts():
                return casting_step(self, *args, **kwargs)

    def step(self, *args, **kwargs):
        stash = self._amp_stash
        if skip.landing:
            skip.print_landed_skip_messages()
        if stash.skip_check_pending:
            closure = args[0] if args else kwargs.get("closure")
            scalers = _amp_state.loss_scalers
            if closure is None and skip.skips_on_device(self):
                return skip.device_path_step(self, real_step, args, kwargs, scalers, _amp_state.verbosity > 0)
            loss_id, scale = skip.take_skip_decision(self, scalers)
            skip.print_landed_skip_messages(wait=True)  # earlier ones first; the read above synced
            if loss_id >= 0:
                if closure is not None:
                    stash.skip_armed.fill_(loss_id)
                    stash.skip_check_pending = True
                    raise RuntimeError(_CLOSURE_MSG)
                maybe_print(SKIP_MSG.format(loss_id, scale))
                if hasattr(stash, "all_fp32_from_fp16_params"):
                    for param in stash.all_fp32_from_fp16_params:
                        param.grad = None
                return None
        return real_step(self, *args, **kwargs)

    optimizer.step = types.MethodType(step, optimizer)


# -- installing the patches ----------------------------------------------------------------
def _process_optimizer(optimizer, properties) -> Any:
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    optimizer._amp_stash = AmpOptimizerState()
    stash = optimizer._amp_stash
    stash.lazy_init_called = False
    stash.already_patched = False
    stash.params_have_scaled_gradients = False
    stash.skip_check_pending = False
    stash.skip_armed = torch.full((), -1, dtype=torch.int64, device=_optimizer_device(optimizer))

    for name in (
        "_lazy_init_maybe_master_weights",
        "_master_params_to_model_params",
        "_prepare_amp_backward",
        "_post_amp_backward",
        "_amp_lazy_init",
    ):
        if hasattr(optimizer, name):
            raise RuntimeError("Incoming optimizer already has {} defined.".format(name))

    bind = lambda fn: types.MethodType(fn, optimizer)  # noqa: E731 - a one-line binder reads best as a lambda
    stash.original_load_state_dict = optimizer.load_state_dict

    if properties.master_weights:
        optimizer._lazy_init_maybe_master_weights = bind(lazy_init_with_master_weights)
        optimizer._master_params_to_model_params = bind(_master_params_to_model_params)
        optimizer._prepare_amp_backward = bind(prepare_backward_with_master_weights)
        optimizer._post_amp_backward = bind(post_backward_with_master_weights)

        def zero_grad(self, set_to_none=None):
            """Apex's O2 `zero_grad()`: model grads (fp16 params, fp32 params without a master)
            zeroed in place, master grads set to None. Apex's takes no arguments; the shim also
            takes torch's `set_to_none` (True: the model grads are set to None as well; False
            or None: Apex's behaviour), so code written for torch optimizers runs under O2."""
            stash = self._amp_stash
            self._amp_lazy_init()
            for param in stash.all_fp16_params + stash.all_fp32_from_fp32_params:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_()
                    param.grad.zero_()
            for param in stash.all_fp32_from_fp16_params:
                param.grad = None

        def load_state_dict(self, state_dict):
            # Masters first, so saved fp32 state lands on fp32 tensors without a round trip
            # through the fp16 model params.
            self._amp_lazy_init()
            return self._amp_stash.original_load_state_dict(state_dict)

        optimizer.zero_grad = bind(zero_grad)
        optimizer.load_state_dict = bind(load_state_dict)
    else:
        optimizer._lazy_init_maybe_master_weights = bind(lazy_init_no_master_weights)
        optimizer._prepare_amp_backward = bind(prepare_backward_no_master_weights)
        optimizer._post_amp_backward = bind(post_backward_no_master_weights)

    optimizer._amp_lazy_init = bind(_amp_lazy_init)
    _patch_add_param_group(optimizer, properties)
    _patch_step(optimizer, properties)
    return optimizer


def _patch_add_param_group(optimizer, properties) -> None:
    old_add_param_group = optimizer.add_param_group

    def add_param_group(self, new_group):
        stash = self._amp_stash
        self._amp_lazy_init()
        assert isinstance(new_group, dict), "param group must be a dict"
        new_params = new_group["params"]
        if isinstance(new_params, torch.Tensor):
            new_group["params"] = [new_params]
        elif isinstance(new_params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but "
                "the ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            new_group["params"] = list(new_params)

        if properties.master_weights:
            fp16_this_group, fp32_this_group, masters_this_group = [], [], []
            for i, param in enumerate(new_group["params"]):
                if not param.requires_grad:
                    continue
                if _kind(param) == "half":
                    fp16_this_group.append(param)
                    master = _make_master(param)
                    new_group["params"][i] = master
                    masters_this_group.append(master)
                else:
                    fp32_this_group.append(param)
            stash.fp16_groups.append(fp16_this_group)
            stash.fp32_from_fp16_groups.append(masters_this_group)
            stash.fp32_from_fp32_groups.append(fp32_this_group)
            stash.all_fp16_params += fp16_this_group
            stash.all_fp32_from_fp16_params += masters_this_group
            stash.all_fp32_from_fp32_params += fp32_this_group
            stash.all_fp32_from_fp32_grad_stash += [None for _ in fp32_this_group]
        else:
            for param in new_group["params"]:
                if _kind(param) == "half":
                    stash.all_fp16_params.append(param)
                    stash.all_fp16_grad_stash.append(None)
                else:
                    stash.all_fp32_params.append(param)
                    stash.all_fp32_grad_stash.append(None)
        old_add_param_group(new_group)

    optimizer.add_param_group = types.MethodType(add_param_group, optimizer)


def _optimizer_device(optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")
