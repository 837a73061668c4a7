"""`apex_C`: Apex's small compiled helper, `flatten` and `unflatten` of dense tensor lists.

Apex built it from `csrc/flatten_unflatten.cpp`, a binding of torch's own
`torch::utils::flatten_dense_tensors` / `unflatten_dense_tensors`; the same functions are
reachable from Python as `torch._utils._flatten_dense_tensors` / `_unflatten_dense_tensors`,
which is what this module calls. Code such as `apex_C.unflatten(flat, grads)` after an
allreduce of a flat buffer imports it directly; the `apex` alias makes `import apex_C` resolve
here when no compiled `apex_C` is importable (see `amp_shim.alias`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["flatten", "unflatten"]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One 1-D tensor holding every tensor's elements in order (they share one dtype)."""
    return _flatten_dense_tensors(list(tensors))


def unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat` shaped like `tensors`, in order (the inverse of `flatten`)."""
    return list(_unflatten_dense_tensors(flat, list(tensors)))
