"""Apex's O1 lists for `torch.Tensor` methods (data only; see `amp_shim.amp.lists`)."""

import torch

from . import torch_overrides

MODULE = torch.Tensor

FP16_FUNCS = [
    "__matmul__",
]

FP32_FUNCS = [
    "__ipow__",
    "__pow__",
    "__rpow__",
    # Cast to fp32 before transfer to CPU
    "cpu",
]

CASTS = [
    "__add__",
    "__div__",
    "__eq__",
    "__ge__",
    "__gt__",
    "__iadd__",
    "__idiv__",
    "__imul__",
    "__isub__",
    "__itruediv__",
    "__le__",
    "__lt__",
    "__mul__",
    "__ne__",
    "__radd__",
    "__rdiv__",
    "__rmul__",
    "__rsub__",
    "__rtruediv__",
    "__sub__",
    "__truediv__",
]

# Every torch-namespace entry that also exists as a Tensor method.
for _list, _source in (
    (FP16_FUNCS, torch_overrides.FP16_FUNCS),
    (FP32_FUNCS, torch_overrides.FP32_FUNCS),
    (CASTS, torch_overrides.CASTS),
):
    _list.extend(fn for fn in _source if hasattr(MODULE, fn))

# The sequence functions have no Tensor method form.
SEQUENCE_CASTS: list[str] = []
