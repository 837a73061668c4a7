"""`apex.multi_tensor_apply`: the `multi_tensor_applier` object (apex_api.md §1, §15).

Apex's applier is a thin dispatcher: `multi_tensor_applier(op, noop_flag, tensor_lists, *args)`
calls `op(chunk_size, noop_flag, tensor_lists, *args)`, where `op` is an `amp_C` kernel and
`chunk_size` is 2048 * 32. It raised RuntimeError when `amp_C` was not built. The shim keeps the
dispatcher (always available: it needs no extension) and adds torch implementations of the
three `amp_C` kernels that user code drives through it, with the same signatures:

    multi_tensor_applier(multi_tensor_scale, overflow_buf, [src, dst], scale)
    multi_tensor_applier(multi_tensor_axpby, overflow_buf, [x, y, out], a, b, arg_to_check)
    norm, per_tensor = multi_tensor_applier(multi_tensor_l2norm, overflow_buf, [tensors], True)

As in the kernels, the math is in float32, the overflow flag is only ever set (to 1, for a
non-finite input), never cleared, and nothing is read back to the host.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


class MultiTensorApply(object):
    available = True
    warned = False

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """Apex raised here without `amp_C`; the shim's applier needs no extension."""

    def __call__(self, op: Callable, noop_flag_buffer: torch.Tensor,
                 tensor_lists: Sequence[Sequence[torch.Tensor]], *args: Any) -> Any:
        self.check_avail()
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)


def _flag_non_finite(noop_flag: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    if not tensors:
        return
    bad = torch.stack([(~torch.isfinite(t)).any().to(noop_flag.device) for t in tensors]).any()
    noop_flag.copy_(torch.where(bad, torch.ones_like(noop_flag), noop_flag))


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor,
                       tensor_lists: Sequence[Sequence[torch.Tensor]], scale: float) -> None:
    """`dst = src * scale` (float32 math, stored in dst's dtype); flag non-finite sources."""
    src, dst = tensor_lists
    _flag_non_finite(noop_flag, src)
    with torch.no_grad():
        for s, d in zip(src, dst):
            d.copy_(s.float() * scale)


def multi_tensor_axpby(chunk_size: int, noop_flag: torch.Tensor,
                       tensor_lists: Sequence[Sequence[torch.Tensor]], a: float, b: float,
                       arg_to_check: int) -> None:
    """`out = a * x + b * y`; `arg_to_check` -1 checks x and y, 0 only x, 1 only y."""
    xs, ys, outs = tensor_lists
    if arg_to_check in (-1, 0):
        _flag_non_finite(noop_flag, xs)
    if arg_to_check in (-1, 1):
        _flag_non_finite(noop_flag, ys)
    with torch.no_grad():
        for x, y, out in zip(xs, ys, outs):
            out.copy_(a * x.float() + b * y.float())


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor,
                        tensor_lists: Sequence[Sequence[torch.Tensor]],
                        per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(global L2 norm as a 1-element float32 tensor, per-tensor norms or an empty tensor)."""
    (tensors,) = tensor_lists
    device = tensors[0].device if tensors else noop_flag.device
    if not tensors:
        return torch.zeros(1, device=device), torch.empty(0, device=device)
    with torch.no_grad():
        norms = torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])
        total = torch.linalg.vector_norm(norms).reshape(1)
    return total, (norms if per_tensor else torch.empty(0, device=device))
