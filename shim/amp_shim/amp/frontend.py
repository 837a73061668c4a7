"""`apex.amp.frontend`: option handling, `initialize`, and the amp checkpoint API.

Legacy scripts depend on the details here: the exact validation messages (tests match on
them), the option table Apex prints (log scrapers and golden logs match on it), the string
coercions that argparse-driven scripts rely on, and the checkpoint format that existing
`ckpt['amp']` entries were saved in. So this module reproduces Apex's behaviour literally,
quirks included, and leaves the real work to `_initialize`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Optional, Protocol

import torch

from .._deprecation import shim_notice
from ._amp_state import _amp_state, maybe_print, warn_or_err


class Properties:
    """The option set `initialize` builds, with Apex's consistency checks on every assignment.

    The options live in a dict rather than as attributes so that every write goes through
    `__setattr__`, which checks it against the opt_level already selected.
    """

    def __init__(self) -> None:
        self.options = {
            "enabled": False,
            "opt_level": None,
            "cast_model_type": None,
            "patch_torch_functions": False,
            "keep_batchnorm_fp32": None,
            "master_weights": None,
            "loss_scale": 1.0,
        }

    def _update_options_dict(self, new_options: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> None:
        """Set several options at once without the checks, so no intermediate state is refused.

        Apex iterated the argument as (key, value) pairs; a mapping is accepted as well.
        """
        pairs = new_options.items() if isinstance(new_options, Mapping) else new_options
        for k, v in pairs:
            if k in self.options:
                self.options[k] = v
            else:
                raise ValueError("Tried to set unexpected option {}".format(k))

    def __getattr__(self, name: str) -> Any:
        if "options" in self.__dict__:
            options = self.__dict__["options"]
            if name in options:
                return options[name]
        raise AttributeError("'{}' object has no attribute '{}'".format(type(self).__name__, name))

    def __setattr__(self, name: str, value: Any) -> None:
        if "options" not in self.__dict__:
            super().__setattr__(name, value)
            return
        # As in Apex, once the options exist any other attribute assignment is silently dropped.
        if name not in self.options:
            return
        if name == "cast_model_type":
            if self.opt_level == "O1" and value is not None:
                if value is not False and value is not torch.float32:
                    warn_or_err(
                        "O1 inserts casts around Torch functions rather than "
                        "model weights, so with O1, the model weights themselves "
                        "should remain FP32. If you wish to cast the model to a "
                        "different type, use opt_level='O2' or 'O3'. "
                        "cast_model_type was {}".format(value)
                    )
            self.options[name] = value
        elif name == "patch_torch_functions":
            if self.opt_level != "O1" and value:
                warn_or_err(
                    "Currently, patch_torch_functions=True should only be set by selecting opt_level='O1'."
                )
            self.options[name] = value
        elif name == "keep_batchnorm_fp32":
            if self.opt_level == "O1" and value is not None:
                warn_or_err(
                    "With opt_level O1, batchnorm functions are automatically patched "
                    "to run in FP32, so keep_batchnorm_fp32 should be None."
                    " keep_batchnorm_fp32 was {}".format(value)
                )
            if value == "False":
                self.options[name] = False
            elif value == "True":
                self.options[name] = True
            else:
                # Raised explicitly so that `python -O` does not drop the check.
                if not (value is True or value is False or value is None):
                    raise AssertionError(
                        "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', "
                        "or None, found keep_batchnorm_fp32={}".format(value)
                    )
                self.options[name] = value
        elif name == "master_weights":
            if self.opt_level == "O1" and value is not None:
                warn_or_err(
                    "It doesn't make sense to use master_weights with O1. "
                    "With O1, your model weights themselves should be FP32."
                )
            self.options[name] = value
        elif name == "loss_scale":
            if value == "dynamic":
                self.options[name] = value
            else:
                self.options[name] = float(value)
        else:
            self.options[name] = value


class O3:
    brief = "O3:  Pure FP16 training."
    more = (
        "Calls .half() on your model, converting the entire model to FP16.\n"
        "A casting operation is also inserted to cast incoming Tensors to FP16,\n"
        "so you don't need to change your data pipeline.\n"
        "This mode is useful for establishing a performance ceiling.\n"
        "It's also possible training may 'just work' in this mode.\n"
        "If not, try other optimization levels."
    )

    def __call__(self, properties: Properties) -> Properties:
        properties.enabled = True
        properties.opt_level = "O3"
        properties.cast_model_type = torch.float16
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = False
        properties.master_weights = False
        properties.loss_scale = 1.0
        return properties


class O2:
    brief = "O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n"
    more = (
        "Calls .half() on your model, converting the entire model (except for batchnorms)\n"
        "to FP16.  Batchnorms are retained in FP32 for additional stability.\n"
        "The forward pass is patched to cast incoming Tensors to FP16, so you don't need to change\n"
        "your data pipeline.\n"
        "O2 creates FP32 master weights outside the model and patches any optimizers to update\n"
        "these master weights, then copy the master weights into the FP16 model weights.\n"
        "Master weights can also improve convergence and stability."
    )

    def __call__(self, properties: Properties) -> Properties:
        properties.enabled = True
        properties.opt_level = "O2"
        properties.cast_model_type = torch.float16
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = True
        properties.master_weights = True
        properties.loss_scale = "dynamic"
        return properties


class O1:
    brief = "O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"
    more = (
        "The type of your model's weights is not altered.  However, internally,\n"
        "Pytorch functions are patched to cast any Tensor Core-friendly ops to FP16 for speed,\n"
        "while operations that might benefit from the additional stability of FP32 are patched\n"
        "to cast their inputs to fp32.\n"
        "O1 is the safest way to try mixed precision training, and is recommended when\n"
        "trying mixed precision training for the first time."
    )

    def __call__(self, properties: Properties) -> Properties:
        properties.enabled = True
        properties.opt_level = "O1"
        properties.cast_model_type = None
        properties.patch_torch_functions = True
        properties.keep_batchnorm_fp32 = None
        properties.master_weights = None
        properties.loss_scale = "dynamic"
        return properties


class O0:
    brief = "O0:  Pure FP32 training.\n"
    more = (
        "Your models are checked to make sure parameters are FP32, but otherwise the\n"
        "types of weights and internal Pytorch operations are not altered.  This mode disables any\n"
        "FP16 arithmetic, although other optimizations like DDP interop may still be requested.\n"
    )

    def __call__(self, properties: Properties) -> Properties:
        properties.enabled = True
        properties.opt_level = "O0"
        properties.cast_model_type = torch.float32
        properties.patch_torch_functions = False
        properties.keep_batchnorm_fp32 = None
        properties.master_weights = False
        properties.loss_scale = 1.0
        return properties


class _OptLevel(Protocol):
    brief: str
    more: str

    def __call__(self, properties: Properties) -> Properties: ...


opt_levels: dict[str, _OptLevel] = {"O3": O3(), "O2": O2(), "O1": O1(), "O0": O0()}


def _print_options(properties: Properties) -> None:
    for k, v in properties.options.items():
        maybe_print("{:22} : {}".format(k, v), True)


def initialize(
    models: Any,
    optimizers: Any = None,
    enabled: bool = True,
    opt_level: Optional[str] = "O1",
    cast_model_type: Optional[torch.dtype] = None,
    patch_torch_functions: Optional[bool] = None,
    keep_batchnorm_fp32: Optional[bool | str] = None,
    master_weights: Optional[bool] = None,
    loss_scale: Optional[float | str] = None,
    cast_model_outputs: Optional[torch.dtype] = None,
    num_losses: int = 1,
    verbosity: int = 1,
    min_loss_scale: Optional[float] = None,
    max_loss_scale: float = 2.0**24,
) -> Any:
    """Apex's `amp.initialize`, argument for argument.

    Validation, printing and state setup follow Apex line by line so that scripts, their logs
    and their tests see what they saw under Apex; `_initialize` then prepares models and
    optimizers on top of torch.amp. With `enabled=False` the arguments come back untouched,
    which scripts use as their "amp off" switch.
    """
    shim_notice()
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity

    if not enabled:
        if optimizers is None:
            return models
        return models, optimizers

    if not torch.backends.cudnn.enabled:
        raise RuntimeError("Amp requires torch.backends.cudnn.enabled = True")

    if opt_level not in opt_levels:
        raise RuntimeError(
            "Unexpected optimization level {}. ".format(opt_level)
            + "Options are 'O0', 'O1', 'O2', 'O3'.  Note that in `O0`, `O1`, etc., the prefix O is the letter O, "
            + "not the number zero."
        )
    _amp_state.opt_properties = opt_levels[opt_level](_amp_state.opt_properties)
    maybe_print("Selected optimization level {}".format(opt_levels[opt_level].brief), True)
    maybe_print("Defaults for this optimization level are:", True)
    _print_options(_amp_state.opt_properties)

    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale

    maybe_print("Processing user overrides (additional kwargs that are not None)...", True)
    properties = _amp_state.opt_properties
    if enabled is not None:
        properties.enabled = enabled
    if opt_level is not None:
        properties.opt_level = opt_level
    if cast_model_type is not None:
        properties.cast_model_type = cast_model_type
    if patch_torch_functions is not None:
        properties.patch_torch_functions = patch_torch_functions
    if keep_batchnorm_fp32 is not None:
        properties.keep_batchnorm_fp32 = keep_batchnorm_fp32
    if master_weights is not None:
        properties.master_weights = master_weights
    if loss_scale is not None:
        properties.loss_scale = loss_scale

    maybe_print("After processing overrides, optimization options are:", True)
    _print_options(properties)

    from ._initialize import _initialize

    return _initialize(models, optimizers, _amp_state.opt_properties, num_losses, cast_model_outputs)


def state_dict(destination: Optional[MutableMapping[str, Any]] = None) -> MutableMapping[str, Any]:
    """The loss scalers' state in Apex's checkpoint format, so `ckpt['amp']` stays loadable by both.

    Only the scale and the clean-step counter are saved, as in Apex; the dynamic flag, the
    limits and the window come from `initialize` on restore.
    """
    if destination is None:
        destination = OrderedDict()
    for idx, loss_scaler in enumerate(_amp_state.loss_scalers):
        destination["loss_scaler%d" % idx] = {
            "loss_scale": loss_scaler.loss_scale(),
            "unskipped": loss_scaler._unskipped,
        }
    return destination


def load_state_dict(state_dict: Mapping[str, Any]) -> None:
    """Restore the loss scalers the way Apex did, quirks included.

    Entries are assigned by position (not by the number in the key), surplus entries are
    reported and dropped, no type check is made, and unexpected keys raise only after the
    valid entries were applied, because checkpoints written and read under Apex relied on
    exactly this.
    """
    if len(state_dict) != len(_amp_state.loss_scalers):
        print(
            "Warning: state_dict contains {} entries, while {} loss_scalers are used".format(
                len(state_dict), len(_amp_state.loss_scalers)
            )
        )

    entries = list(state_dict.items())
    nb_loss_scalers = len(_amp_state.loss_scalers)
    unexpected_keys = []
    idx = 0
    for key, value in entries:
        if "loss_scaler" not in key:
            unexpected_keys.append(key)
            continue
        if idx > nb_loss_scalers - 1:
            print("Skipping loss_scaler[{}], since num_losses was set to {}".format(idx, nb_loss_scalers))
            break
        _amp_state.loss_scalers[idx]._loss_scale = value["loss_scale"]
        _amp_state.loss_scalers[idx]._unskipped = value["unskipped"]
        idx += 1

    if len(unexpected_keys) > 0:
        raise RuntimeError(
            "Error(s) in loading state_dict. Unexpected key(s) in state_dict: {}. ".format(
                ", ".join('"{}"'.format(k) for k in unexpected_keys)
            )
        )
