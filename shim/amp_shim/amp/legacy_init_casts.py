"""What the old API's `amp.init()` adds to autocast: Apex's own O1 lists where autocast differs.

`amp.initialize(opt_level="O1")` is `torch.autocast` and nothing more, because its native
migration is `torch.autocast` and the two must train bit for bit alike. The old handle API
(`amp.init()`, `handle.wrap_optimizer`) has no native migration (the codemod leaves it to the
shim), so the only measure of it is Apex, and where torch's autocast lists differ from Apex's
(on the CPU above all) `init()` puts Apex's rules back, as Apex's `amp.init()` did, by patching
the functions for as long as the handle is active:

* Apex's FP32 lists (`torch`, `torch.nn.functional`, `torch.Tensor`: softmax, group_norm, pow,
  sum, `.cpu()`, ...) run in float32 with autocast off;
* the in-place forms of the FP32 functions raise Apex's `NotImplementedError` on half tensors
  (`x.exp_()`), where autocast would silently run them in half;
* RNN cells and the full RNN/GRU/LSTM functions run in half: `torch.nn.modules.rnn._VF` is
  replaced by a pass-through object whose RNN entries cast their tensors (inputs, hiddens,
  weights) to the half type, as Apex's `VariableFunctionsShim` did.

Apex's FP16 lists and its promotions need nothing: autocast (on CPU and CUDA) and torch's type
promotion already give the same dtypes. On CUDA autocast runs the FP32 list in float32 too, so
there the patches change nothing but the in-place errors.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.modules.rnn

from .lists import functional_overrides, tensor_overrides, torch_overrides

FP32_LISTS = (
    (functional_overrides.MODULE, functional_overrides.FP32_FUNCS),
    (torch_overrides.MODULE, torch_overrides.FP32_FUNCS),
    (tensor_overrides.MODULE, tensor_overrides.FP32_FUNCS),
)
RNN_FUNCTIONS = tuple(
    name + suffix for name in ("rnn_relu", "rnn_tanh", "gru", "lstm") for suffix in ("", "_cell")
)


class VariableFunctions:
    """`torch._VF` with replaceable attributes (torch's own object does not take them)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch._VF, name)


def _in_place(names) -> list[str]:
    return [name + "_" for name in names]


def _is_half(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def _install_in_place_check(
    handle, module: Any, name: str, casts_on: Callable[[], bool], message: str, only_self: bool
) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if casts_on():
            checked = args[:1] if only_self else (*args, *kwargs.values())
            if any(_is_half(value) for value in checked):
                raise NotImplementedError(message.format(name))
        return original(*args, **kwargs)

    handle._save_func(module, name, original)
    setattr(module, name, wrapper)


def install(
    handle, install_cast: Callable[[Any, Any, str, str], None], float_kind: str, half_kind: str
) -> None:
    """Patch Apex's O1 rules for the life of `handle` (its `_deactivate` restores every one)."""
    device_type = handle._casts.device_type

    def casts_on() -> bool:
        return torch.is_autocast_enabled(device_type)

    for module, names in FP32_LISTS:
        for name in names:
            if hasattr(module, name):
                install_cast(handle, module, name, float_kind)
    for name in _in_place(torch_overrides.FP32_FUNCS):
        if hasattr(torch, name):
            _install_in_place_check(
                handle, torch, name, casts_on, "Cannot call in-place function {} with fp16 arguments.", False
            )
    for name in _in_place(tensor_overrides.FP32_FUNCS):
        if hasattr(torch.Tensor, name):
            _install_in_place_check(
                handle, torch.Tensor, name, casts_on, "Cannot call in-place method {} on fp16 Tensors.", True
            )

    rnn = torch.nn.modules.rnn
    handle._save_func(rnn, "_VF", rnn._VF)
    rnn._VF = VariableFunctions()  # type: ignore[assignment]  # stands in for torch._VF's module
    for name in RNN_FUNCTIONS:
        install_cast(handle, rnn._VF, name, half_kind)
