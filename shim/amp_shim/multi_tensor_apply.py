"""`apex.multi_tensor_apply`: the `multi_tensor_applier` object, which real code calls directly.

Apex's applier is a thin dispatcher: `multi_tensor_applier(op, noop_flag, tensor_lists, *args)`
calls `op(chunk_size, noop_flag, tensor_lists, *args)`, where `op` is an `amp_C` entry point and
`chunk_size` is 2048 * 32. It raised RuntimeError when `amp_C` was not built. The shim keeps the
dispatcher, always available: the shim ships `amp_C` itself (`amp_shim.amp_C`, importable as
`amp_C` under the `apex` alias), with torch implementations of the kernels:

    import amp_C
    multi_tensor_applier(amp_C.multi_tensor_scale, overflow_buf, [src, dst], scale)
    norm, per_tensor = multi_tensor_applier(amp_C.multi_tensor_l2norm, overflow_buf, [tensors], True)
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

    def __call__(
        self,
        op: Callable,
        noop_flag_buffer: torch.Tensor,
        tensor_lists: Sequence[Sequence[torch.Tensor]],
        *args: Any,
    ) -> Any:
        self.check_avail()
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
