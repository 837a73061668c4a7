"""`apex.normalization.fused_layer_norm`: Apex's fused norms as torch's `LayerNorm`/`RMSNorm`.

The modules subclass `torch.nn.LayerNorm` and `torch.nn.RMSNorm`, so parameter names
(`weight`, `bias`), shapes and `extra_repr` match Apex's and checkpoints load both ways.
Apex's arguments and defaults are kept: module `eps=1e-5` (always passed to torch, whose
RMSNorm would otherwise use the dtype's machine epsilon), `memory_efficient` accepted and
stored (it only traded memory for recomputation in Apex's kernels). Output dtypes follow Apex:
`Fused*` return the input's dtype, `MixedFused*` the parameters' dtype (and reject
`elementwise_affine=False`). The functional forms keep Apex's `eps=1e-6` default and argument
order, and, as Apex's did, run under autocast on inputs cast to the autocast dtype.
"""

from __future__ import annotations

import numbers
import warnings

import torch
import torch.nn.functional as F

__all__ = [
    "FusedLayerNorm",
    "FusedRMSNorm",
    "MixedFusedLayerNorm",
    "MixedFusedRMSNorm",
    "fused_layer_norm",
    "fused_layer_norm_affine",
    "fused_rms_norm",
    "fused_rms_norm_affine",
    "mixed_dtype_fused_layer_norm_affine",
    "mixed_dtype_fused_rms_norm_affine",
    "manual_rms_norm",
]


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(normalized_shape)


def _cast_if_autocast_enabled(*args):
    """Apex's `_cast_if_autocast_enabled`: floating tensors to the autocast dtype, if on."""
    device = next((a.device.type for a in args if torch.is_tensor(a)), "cpu")
    if not torch.is_autocast_enabled(device):
        return args
    dtype = torch.get_autocast_dtype(device)
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def _rms_norm(input, normalized_shape, weight, eps, out_dtype):
    """RMS norm computed in fp32 (as Apex's kernels and CPU fallback do), then cast."""
    w = None if weight is None else weight.float()
    return F.rms_norm(input.float(), _shape(normalized_shape), w, eps).to(out_dtype)


def manual_rms_norm(input, normalized_shape, weight, eps):
    """Apex's reference RMS norm (fp32 statistics; cast to a reduced-precision weight's dtype)."""
    dims = tuple(range(-1, -len(_shape(normalized_shape)) - 1, -1))
    variance = input.to(torch.float32).pow(2).mean(dims, keepdim=True)
    input = input * torch.rsqrt(variance + eps)
    if weight is None:
        return input
    if weight.dtype in (torch.float16, torch.bfloat16):
        input = input.to(weight.dtype)
    return weight * input


# -- functional forms (default eps 1e-6, Apex's argument order) ------------------------------
def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    input, weight, bias = _cast_if_autocast_enabled(input, weight, bias)
    with torch.autocast(input.device.type, enabled=False):
        return F.layer_norm(input, _shape(normalized_shape), weight, bias, eps)


def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    (input,) = _cast_if_autocast_enabled(input)
    with torch.autocast(input.device.type, enabled=False):
        return F.layer_norm(input, _shape(normalized_shape), None, None, eps)


def mixed_dtype_fused_layer_norm_affine(
    input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False
):
    input, weight, bias = _cast_if_autocast_enabled(input, weight, bias)
    with torch.autocast(input.device.type, enabled=False):
        return F.layer_norm(input, _shape(normalized_shape), weight, bias, eps).to(weight.dtype)


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    input, weight = _cast_if_autocast_enabled(input, weight)
    with torch.autocast(input.device.type, enabled=False):
        return _rms_norm(input, normalized_shape, weight, eps, input.dtype)


def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    (input,) = _cast_if_autocast_enabled(input)
    with torch.autocast(input.device.type, enabled=False):
        return _rms_norm(input, normalized_shape, None, eps, input.dtype)


def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    input, weight = _cast_if_autocast_enabled(input, weight)
    with torch.autocast(input.device.type, enabled=False):
        return _rms_norm(input, normalized_shape, weight, eps, weight.dtype)


# -- modules (default eps 1e-5) ---------------------------------------------------------------
class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(_shape(normalized_shape), eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient


class FusedRMSNorm(torch.nn.RMSNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(_shape(normalized_shape), eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input):
        return _rms_norm(input, self.normalized_shape, self.weight, self.eps, input.dtype)


def _mixed_kwargs(cls_name: str, kwargs: dict) -> None:
    if "elementwise_affine" in kwargs:
        warnings.warn(f"{cls_name} does not support `elementwise_affine` argument", stacklevel=1)
        if not kwargs.pop("elementwise_affine"):
            raise RuntimeError(f"{cls_name} does not support `elementwise_affine = False`")
    # Any other keyword is ignored, as Apex's constructor ignored it.


class MixedFusedLayerNorm(FusedLayerNorm):
    """LayerNorm whose output dtype is the parameters' dtype (e.g. fp32 params, fp16 input)."""

    def __init__(self, normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs):
        _mixed_kwargs("MixedFusedLayerNorm", kwargs)
        super().__init__(
            normalized_shape, eps=eps, elementwise_affine=True, memory_efficient=memory_efficient
        )

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps).to(
            self.weight.dtype
        )


class MixedFusedRMSNorm(FusedRMSNorm):
    """RMSNorm whose output dtype is the parameters' dtype."""

    def __init__(self, normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs):
        _mixed_kwargs("MixedFusedRMSNorm", kwargs)
        super().__init__(
            normalized_shape, eps=eps, elementwise_affine=True, memory_efficient=memory_efficient
        )

    def forward(self, input):
        return _rms_norm(input, self.normalized_shape, self.weight, self.eps, self.weight.dtype)
