"""Casting a model to a reduced dtype with affine batch norm kept in fp32: what O2 and O3 do
to the models at `amp.initialize` and what `fp16_utils`' `convert_network` does (the same
function: `apex.fp16_utils.convert_network` is this one)."""

from __future__ import annotations

import torch
from torch import nn


def _is_affine_batchnorm(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine is True


def convert_module(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast the module's own floating params, their grads and its own buffers in place."""
    for param in module.parameters(recurse=False):
        if param is not None:
            if param.data.dtype.is_floating_point:
                param.data = param.data.to(dtype=dtype)
            if param._grad is not None and param._grad.data.dtype.is_floating_point:
                param._grad.data = param._grad.data.to(dtype=dtype)
    for buf in module.buffers(recurse=False):
        if buf is not None and buf.data.dtype.is_floating_point:
            buf.data = buf.data.to(dtype=dtype)


def convert_network(network: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast every module except affine BatchNorm, which stays fp32 for stable statistics."""
    for module in network.modules():
        if _is_affine_batchnorm(module):
            continue
        convert_module(module, dtype)
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return network
