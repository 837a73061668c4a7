"""`apex.parallel` (DDP, Reducer, SyncBatchNorm, LARC) on torch.distributed.

Exports Apex's names: `DistributedDataParallel` and `Reducer` (torch DDP / a manual
all-reduce), `SyncBatchNorm` (torch's on CUDA, an autograd-aware all-reduce elsewhere),
`convert_syncbn_model`, `create_syncbn_process_group`, `LARC` and `ReduceOp`.
"""

from __future__ import annotations

import torch

from .._deprecation import deprecated_warning
from .distributed import DistributedDataParallel, Reducer
from .LARC import LARC
from .sync_batchnorm import SyncBatchNorm

# Apex re-exported torch's enum; builds without distributed support have none.
ReduceOp = getattr(torch.distributed, "ReduceOp", None)

__all__ = [
    "DistributedDataParallel",
    "LARC",
    "ReduceOp",
    "Reducer",
    "SyncBatchNorm",
    "convert_syncbn_model",
    "create_syncbn_process_group",
]


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Replace every `_BatchNorm` in `module` by `SyncBatchNorm`, keeping its state.

    Running statistics and `num_batches_tracked` are carried over (the same tensors, as in
    Apex), affine weights are copied; instance norms are left alone. Returns the new module.
    """
    deprecated_warning(
        "apex.parallel.convert_syncbn_model is deprecated and will be removed by the end of "
        "February 2023. Use `torch.nn.SyncBatchNorm.convert_sync_batchnorm`."
    )
    return _convert(module, process_group, channel_last)


def _convert(module, process_group, channel_last):
    mod = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        mod = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
            channel_last=channel_last,
        )
        mod.running_mean = module.running_mean
        mod.running_var = module.running_var
        mod.num_batches_tracked = module.num_batches_tracked
        if module.affine:
            with torch.no_grad():
                mod.weight = torch.nn.Parameter(
                    module.weight.detach().clone(), requires_grad=module.weight.requires_grad
                )
                mod.bias = torch.nn.Parameter(
                    module.bias.detach().clone(), requires_grad=module.bias.requires_grad
                )
        mod.train(module.training)
    for name, child in module.named_children():
        mod.add_module(name, _convert(child, process_group, channel_last))
    return mod


def create_syncbn_process_group(group_size):
    """Split the job into groups of `group_size` consecutive ranks; return this rank's group.

    0 means the whole job (returns None). Every rank must call it: each group is created
    collectively.
    """
    if group_size == 0:
        return None
    world_size = torch.distributed.get_world_size()
    assert world_size >= group_size
    assert world_size % group_size == 0
    group = None
    for group_num in range(world_size // group_size):
        group_ids = range(group_num * group_size, (group_num + 1) * group_size)
        cur_group = torch.distributed.new_group(ranks=list(group_ids))
        if torch.distributed.get_rank() // group_size == group_num:
            group = cur_group
    assert group is not None
    return group
