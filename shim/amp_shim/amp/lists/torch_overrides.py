"""Apex's O1 lists for the `torch` namespace (data only; see `amp_shim.amp.lists`)."""

import torch

MODULE = torch

FP16_FUNCS = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_tbc",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "mm",
    "mv",
]

FP32_FUNCS = [
    # Pointwise
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    # Other math
    "pow",
    # Reduction
    "cumprod",
    "cumsum",
    "dist",
    "norm",
    "prod",
    "std",
    "sum",
    "var",
    # Misc
    "renorm",
]

# Apex put the bmm family on the FP16 list for CUDA >= 9.1 (on the FP32 list for older CUDA);
# a CPU-only torch has neither, as in Apex.
if torch.version.cuda is not None:
    FP16_FUNCS.extend(["addbmm", "baddbmm", "bmm"])

# Multi-tensor functions that promote to the widest input type.
CASTS = [
    "addcdiv",
    "addcmul",
    "atan2",
    "cross",
    "bilinear",
    "dot",
    # Element-wise _or_ tensor-wise math
    "add",
    "div",
    "mul",
    # Comparison
    "eq",
    "equal",
    "ge",
    "gt",
    "le",
    "lt",
    "ne",
]

# Functions that take a sequence of tensors and promote them together.
SEQUENCE_CASTS = [
    "cat",
    "stack",
]
