"""`apex.parallel.SyncBatchNorm`: batch statistics reduced over ranks.

One class with the signature of Apex's optimized (fused-kernel) SyncBatchNorm, the one real
jobs used: `channel_last`, `fuse_relu` and the residual `z` of `forward(input, z=None)` are
accepted and honoured (as separate ops, not fused).

The statistics come from
  * torch's SyncBatchNorm function on CUDA tensors (the NCCL-backed kernels), and
  * on any other device, two autograd-aware all-reduces (the function of
    `torch.distributed.nn.functional.all_reduce`): the backward all-reduces the statistics' gradients, so the
    forward and the input, weight and bias gradients equal those of one BatchNorm over the
    ranks' concatenated batches (`torch.nn.SyncBatchNorm` refuses CPU modules under DDP).
Batches of different sizes per rank are weighted by their element counts (Apex's fallback
averaged the per-rank means as if the sizes were equal).

Outside a multi-rank job, or in eval mode with running statistics, it is `F.batch_norm`.
The class derives from `_BatchNorm`, as Apex's did, so `isinstance(m, _BatchNorm)`, the
parameter and buffer names (`weight`, `bias`, `running_mean`, `running_var`,
`num_batches_tracked`) and therefore checkpoints are those of `torch.nn.BatchNorm*d`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..engine.distributed import all_reduce_kept

_REDUCED = (torch.float16, torch.bfloat16)


def _world(process_group) -> tuple[object, int]:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None, 1
    group = process_group if process_group is not None else dist.group.WORLD
    return group, dist.get_world_size(group)


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks whose backward sums the gradients over ranks.

    The same function as `torch.distributed.nn.functional.all_reduce` (deprecated in recent
    torch with no autograd-aware replacement), kept here so that every forward does not warn.
    """

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        # the last few stay referenced: gloo's thread must not free them (all_reduce_kept)
        all_reduce_kept(out, "SyncBatchNorm", keep=4, group=group)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        return _AllReduceSum.apply(grad_output, ctx.group), None


def all_reduce(tensor, group=None):
    return _AllReduceSum.apply(tensor, group)


def _sync_batch_norm(x, weight, bias, running_mean, running_var, eps, factor, group):
    """Global-batch normalization of x (N, C, *) over the ranks of `group`, in fp32."""
    dtype = x.dtype
    xf = x.float() if dtype in _REDUCED else x
    channels = xf.size(1)
    dims = [0] + list(range(2, xf.dim()))
    shape = [1, channels] + [1] * (xf.dim() - 2)

    # (1) per-channel sums and the element count -> global mean
    count = xf.new_full((1,), float(xf.numel() // max(channels, 1)))
    totals = all_reduce(torch.cat([xf.sum(dims), count]), group=group)
    n = totals[channels:].detach()
    mean = totals[:channels] / n
    # (2) centred sum of squares -> global (biased) variance; two passes for accuracy
    centred = xf - mean.view(shape)
    var = all_reduce((centred * centred).sum(dims), group=group) / n

    out = centred * torch.rsqrt(var + eps).view(shape)
    if weight is not None:
        out = out * weight.view(shape).to(out.dtype) + bias.view(shape).to(out.dtype)

    if running_mean is not None and factor:
        with torch.no_grad():
            unbiased = var.detach() * (n / torch.clamp(n - 1, min=1))
            running_mean.mul_(1 - factor).add_(mean.detach().to(running_mean.dtype), alpha=factor)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
    return out.to(dtype)


class SyncBatchNorm(_BatchNorm):
    """Synchronized BatchNorm over the ranks of `process_group` (default: the whole job)."""

    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_group=None,
        channel_last=False,
        fuse_relu=False,
    ):
        super().__init__(
            num_features, eps=eps, momentum=momentum, affine=affine, track_running_stats=track_running_stats
        )
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def _specify_process_group(self, process_group) -> None:
        self.process_group = process_group

    def _specify_channel_last(self, channel_last) -> None:
        self.channel_last = channel_last

    def _check_input_dim(self, input) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input, z=None):
        self._check_input_dim(input)
        # Apex's channel_last: channels are the last dimension (a 2-D input is (N, C) either way).
        channel_last = self.channel_last and input.dim() > 2
        x = input.movedim(-1, 1) if channel_last else input
        out = self._normalize(x)
        if z is not None:
            out = out + (z.movedim(-1, 1) if channel_last else z)
        if self.fuse_relu:
            out = F.relu(out)
        return out.movedim(1, -1) if channel_last else out

    def _normalize(self, x):
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        running_mean = self.running_mean if self.training else None
        running_var = self.running_var if self.training else None
        group, world_size = _world(self.process_group)
        if world_size == 1:
            return F.batch_norm(x, running_mean, running_var, self.weight, self.bias, True, factor, self.eps)
        if x.is_cuda:
            from torch.nn.modules._functions import SyncBatchNorm as _TorchSyncBN

            return _TorchSyncBN.apply(
                x, self.weight, self.bias, running_mean, running_var, self.eps, factor, group, world_size
            )
        return _sync_batch_norm(x, self.weight, self.bias, running_mean, running_var, self.eps, factor, group)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.channel_last:
            text += ", channel_last=True"
        if self.fuse_relu:
            text += ", fuse_relu=True"
        return text
