"""`apex.amp._initialize`: what `amp.initialize` does to models and optimizers.

Apex demanded CUDA models; the shim takes the device from the models' parameters, so the same
legacy script runs on CPU (autocast "cpu") and on GPUs (autocast "cuda").
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import torch

from ..engine.model_casts import convert_network
from ._amp_state import _amp_state, warn_or_err
from ._master_sources import forget_params_not_cast, remember_before_cast
from ._process_optimizer import _masters, _pending_master_values, _process_optimizer
from .handle import AmpHandle
from .scaler import LossScaler

try:
    import numpy as _np
except ImportError:  # numpy is optional for torch
    _np = None  # type: ignore[assignment]  # checked before use


def models_device(models: list[torch.nn.Module]) -> torch.device:
    for model in models:
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.is_floating_point():
                return tensor.device
    return torch.device("cpu")


def to_type(dtype: torch.dtype, t: Any, *, warn_not_on: torch.device | None = None) -> Any:
    if isinstance(t, torch.Tensor):
        if warn_not_on is not None and warn_not_on.type == "cuda" and not t.is_cuda:
            warnings.warn("An input tensor was not cuda.", stacklevel=1)
        if t.is_floating_point():
            return t.to(dtype)
        return t
    return t.to(dtype)  # a custom batch type: trust its .to()


def applier(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (str, bytes)):
        return value
    if _np is not None and isinstance(value, _np.ndarray):
        return value
    if hasattr(value, "to"):
        return fn(value)
    if isinstance(value, Mapping):
        return {applier(k, fn): applier(v, fn) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(applier(v, fn) for v in value))  # Apex broke on namedtuples
    if isinstance(value, Iterable):
        rebuild: Any = type(value)
        return rebuild(applier(v, fn) for v in value)
    return value


class O2StateDictHook:
    """Report fp32 weights from `state_dict()`: the fp32 master where one exists.

    Apex upcast the fp16 model values, so an O2 resume restarted from rounded masters; with
    the masters saved, a resume continues bit for bit (see docs/differences.md).
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, module, state_dict, prefix, local_metadata) -> None:
        for name, param in module._parameters.items():
            master = _masters.get(param) if param is not None else None
            key = prefix + name
            if master is not None and key in state_dict:
                state_dict[key] = master.detach()
        for key in state_dict:
            value = state_dict[key]
            if isinstance(value, torch.Tensor) and value.dtype == torch.float16:
                state_dict[key] = self.fn(value)


def _restore_masters_on_load(module, state_dict, prefix, *args) -> None:
    """Keep the fp32 values a checkpoint holds for reduced-precision params as their masters."""
    for name, param in module._parameters.items():
        value = state_dict.get(prefix + name)
        if param is None or not isinstance(value, torch.Tensor):
            continue
        if param.dtype in (torch.float16, torch.bfloat16) and value.dtype == torch.float32:
            master = _masters.get(param)
            if master is not None:
                with torch.no_grad():
                    master.copy_(value)
            else:
                _pending_master_values[param] = value.detach().clone()


def check_models(models: list) -> None:
    for model in models:
        parallel_type = None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            parallel_type = "torch.nn.parallel.DistributedDataParallel"
        if type(model).__name__ == "DistributedDataParallel" and type(model).__module__.startswith(
            ("apex.", "amp_shim.")
        ):
            parallel_type = "apex.parallel.DistributedDataParallel"
        if isinstance(model, torch.nn.parallel.DataParallel):
            parallel_type = "torch.nn.parallel.DataParallel"
        if parallel_type is not None:
            raise RuntimeError(
                "Incoming model is an instance of {}. ".format(parallel_type)
                + "Parallel wrappers should only be applied to the model(s) AFTER \n"
                "the model(s) have been returned from amp.initialize."
            )


def check_params_fp32(models: list) -> None:
    """Apex's fp32 check; unlike Apex, any device is accepted."""
    for model in models:
        for name, param in model.named_parameters():
            if param.is_floating_point() and param.dtype == torch.float16:
                warn_or_err(
                    "Found param {} with type {}, expected torch.cuda.FloatTensor.\n"
                    "When using amp.initialize, you do not need to call .half() on your model\n"
                    "before passing it, no matter what optimization level you choose.".format(
                        name, param.type()
                    )
                )
        for name, buf in model.named_buffers():
            if buf.is_floating_point() and buf.dtype == torch.float16:
                warn_or_err(
                    "Found buffer {} with type {}, expected torch.cuda.FloatTensor.\n"
                    "When using amp.initialize, you do not need to call .half() on your model\n"
                    "before passing it, no matter what optimization level you choose.".format(
                        name, buf.type()
                    )
                )


def check_optimizers(optimizers: list) -> None:
    for optim in optimizers:
        cls = type(optim)
        bad_optim_type = None
        if cls.__name__ == "FP16_Optimizer":
            if "contrib" in cls.__module__ or "optimizers" in cls.__module__:
                bad_optim_type = "apex.optimizers.FP16_Optimizer"
            else:
                bad_optim_type = "apex.fp16_utils.FP16_Optimizer"
        if bad_optim_type is not None:
            raise RuntimeError(
                "An incoming optimizer is an instance of {}. ".format(bad_optim_type)
                + "The optimizer(s) passed to amp.initialize() must be bare \n"
                "instances of either ordinary Pytorch optimizers, or Apex fused \n"
                "optimizers.\n"
            )


class CastingForward:
    """The forward `initialize` installs: cast the inputs, run the model's forward, cast the outputs.

    A class rather than Apex's closure so that the model can be pickled, saved whole with
    `torch.save(model)` and deep-copied. A bound method is kept as its function and module, so
    a copy's forward runs the copied module, and unpickling never looks `forward` up on a
    module whose own `forward` is this object.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        input_caster: Callable[[Any], Any] | None,
        output_caster: Callable[[Any], Any],
    ) -> None:
        if isinstance(forward, types.MethodType):
            self.function, self.bound_to = forward.__func__, forward.__self__
        else:
            self.function, self.bound_to = forward, None
        self.input_caster = input_caster
        self.output_caster = output_caster

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.input_caster is not None:
            args, kwargs = applier(args, self.input_caster), applier(kwargs, self.input_caster)
        if self.bound_to is not None:
            output = self.function(self.bound_to, *args, **kwargs)
        else:
            output = self.function(*args, **kwargs)
        return applier(output, self.output_caster)


def _patch_forward(model: torch.nn.Module, input_caster, output_caster) -> None:
    model.forward = CastingForward(model.forward, input_caster, output_caster)


def _activate_o1(models: list, device: torch.device, verbose: bool, loss_scale="dynamic") -> AmpHandle:
    """Apex's `amp_init(loss_scale=..., verbose=...)` at O1: autocast on, registrations applied."""
    from .amp import _activate

    return _activate(device.type, models=models, loss_scale=loss_scale, verbose=verbose)


def _initialize(models, optimizers, properties, num_losses: int = 1, cast_model_outputs=None):
    optimizers_was_list = False
    if isinstance(optimizers, torch.optim.Optimizer) or type(optimizers).__name__ == "LARC":
        optimizers = [optimizers]
    elif optimizers is None:
        optimizers = []
    elif isinstance(optimizers, list):
        optimizers_was_list = True
        check_optimizers(optimizers)
    else:
        check_optimizers([optimizers])
        raise TypeError("optimizers must be either a single optimizer or a list of optimizers.")

    if isinstance(models, torch.nn.Module):
        models_was_list = False
        models = [models]
    elif isinstance(models, list):
        models_was_list = True
    else:
        raise TypeError("models must be either a single model or a list of models.")

    check_models(models)
    if not _amp_state.allow_incoming_model_not_fp32:
        check_params_fp32(models)
    device = models_device(models)

    if properties.cast_model_type:
        if properties.master_weights:
            remember_before_cast(models, optimizers)
        for model in models:
            if properties.keep_batchnorm_fp32:
                convert_network(model, properties.cast_model_type)
            else:
                model.to(properties.cast_model_type)
        input_caster = functools.partial(to_type, properties.cast_model_type, warn_not_on=device)
        output_dtype = cast_model_outputs if cast_model_outputs is not None else torch.float32
        output_caster = functools.partial(to_type, output_dtype, warn_not_on=device)
        for model in models:
            _patch_forward(model, input_caster, output_caster)
        for optimizer in optimizers:
            optimizer.load_state_dict(optimizer.state_dict())
        if properties.master_weights:
            forget_params_not_cast(models, optimizers)
        for model in models:
            for module in model.modules():
                module._register_state_dict_hook(O2StateDictHook(functools.partial(to_type, torch.float32)))
                if properties.master_weights:
                    module._register_load_state_dict_pre_hook(_restore_masters_on_load, with_module=True)
    elif cast_model_outputs is not None:
        output_caster = functools.partial(to_type, cast_model_outputs, warn_not_on=device)
        for model in models:
            _patch_forward(model, None, output_caster)

    for i, optimizer in enumerate(optimizers):
        optimizers[i] = _process_optimizer(optimizer, properties)

    _amp_state.loss_scalers = [
        LossScaler(
            properties.loss_scale,
            min_loss_scale=_amp_state.min_loss_scale,
            max_loss_scale=_amp_state.max_loss_scale,
            device=device,
        )
        for _ in range(num_losses)
    ]

    if properties.patch_torch_functions:
        _activate_o1(models, device, verbose=(_amp_state.verbosity == 2), loss_scale=properties.loss_scale)

    if optimizers_was_list:
        return (models, optimizers) if models_was_list else (models[0], optimizers)
    if models_was_list:
        return models if len(optimizers) == 0 else (models, optimizers[0])
    return models[0] if len(optimizers) == 0 else (models[0], optimizers[0])
