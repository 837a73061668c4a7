"""`apex.fp16_utils.fp16util`: network conversion and manual master-weight helpers.

These are the building blocks of the 2018 "mixed precision by hand" recipe: a half model
(`network_to_half`, `FP16Model`), fp32 master copies of its params (`prep_param_lists`), and
the two copies around the optimizer step. The copies go through the engine's multi-tensor ops
(`engine/ops.py`) so that a fused path speeds them up as it does the amp ones.
"""

from __future__ import annotations

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .._deprecation import deprecated_warning
from ..engine import ops
from ..engine.model_casts import _is_affine_batchnorm, convert_module, convert_network  # noqa: F401 (Apex's names)

DEPRECATION_MESSAGE = (
    "apex.fp16_utils is deprecated and will be removed by the end of February 2023. "
    "Use [PyTorch AMP](https://pytorch.org/docs/stable/amp.html)"
)


class tofp16(nn.Module):
    """A module whose forward returns `input.half()`."""

    def __init__(self):
        super().__init__()

    def forward(self, input):
        return input.half()


def BN_convert_float(module: nn.Module) -> nn.Module:
    """Recursively call `.float()` on affine BatchNorm modules; returns `module`."""
    if _is_affine_batchnorm(module):
        module.float()
    for child in module.children():
        BN_convert_float(child)
    return module


def network_to_half(network: nn.Module) -> nn.Sequential:
    """`nn.Sequential(tofp16(), BN_convert_float(network.half()))`: state-dict keys gain `1.`."""
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


class FP16Model(nn.Module):
    """A half copy of `network` (affine BatchNorm kept fp32) that casts positional inputs to half.

    State-dict keys gain the prefix `network.`.
    """

    def __init__(self, network: nn.Module):
        deprecated_warning(DEPRECATION_MESSAGE)
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs):
        inputs = tuple(t.half() for t in inputs)
        return self.network(*inputs)


def backwards_debug_hook(grad):
    raise RuntimeError("master_params recieved a gradient in the backward pass!")


def prep_param_lists(model: nn.Module, flat_master: bool = False):
    """`(model_params, master_params)`: the trainable params and fp32 copies of them.

    With `flat_master=True` the masters are one flat fp32 `nn.Parameter` (with a preallocated
    grad), returned in a one-element list.
    """
    model_params = [param for param in model.parameters() if param.requires_grad]

    if flat_master:
        try:
            master_params = _flatten_dense_tensors([param.data for param in model_params]).float()
        except BaseException:
            print(
                "Error in prep_param_lists:  model may contain a mixture of parameters "
                "of different types.  Use flat_master=False, or use F16_Optimizer."
            )
            raise
        master_params = nn.Parameter(master_params)
        master_params.requires_grad = True
        if master_params.grad is None:
            master_params.grad = master_params.new(*master_params.size())
        return model_params, [master_params]

    master_params = [param.clone().float().detach() for param in model_params]
    for param in master_params:
        param.requires_grad = True
    return model_params, master_params


def model_grads_to_master_grads(model_params, master_params, flat_master: bool = False) -> None:
    """Copy model grads into master grads (cast to the master's dtype).

    A model param without a grad leaves its master without one (`master.grad = None`).
    """
    if flat_master:
        master_params[0].grad.data.copy_(_flatten_dense_tensors([p.grad.data for p in model_params]))
        return
    dst, src = [], []
    for model, master in zip(model_params, master_params):
        if model.grad is not None:
            if master.grad is None:
                master.grad = torch.empty_like(master.data)
            dst.append(master.grad.data)
            src.append(model.grad.data)
        else:
            master.grad = None
    ops.copy_(dst, src)


def master_params_to_model_params(model_params, master_params, flat_master: bool = False) -> None:
    """Copy master values into the model params (`model.data.copy_(master.data)`)."""
    if flat_master:
        unflat = _unflatten_dense_tensors(master_params[0].data, model_params)
        ops.copy_([m.data for m in model_params], list(unflat))
        return
    pairs = list(zip(model_params, master_params))
    ops.copy_([m.data for m, _ in pairs], [s.data for _, s in pairs])


def to_python_float(t):
    """`t.item()`; `t[0]` for objects without `.item()` (Apex's torch 0.3 fallback)."""
    if hasattr(t, "item"):
        return t.item()
    return t[0]


clip_grad_norm = torch.nn.utils.clip_grad_norm_
