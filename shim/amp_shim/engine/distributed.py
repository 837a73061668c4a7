"""Make every rank of a distributed job take the same skip decision.

Under DDP the gradients are averaged during backward, so an inf in one rank's gradients
normally reaches every rank before the overflow check. Not always: gradients of parameters
outside the DDP module, a manual all-reduce after `scale_loss` (`apex.parallel.Reducer`), or a
non-finite value produced after the all-reduce are seen by one rank only, and then one rank
skips its step while the others apply theirs; their parameters diverge for good. (torch's
`GradScaler` has the same hole: it does not share `found_inf` across ranks.)

So before the skip decision the engine MAX-reduces its found-inf flag over the default process
group. The collective runs on the flag's device and is never read back here: the one host read
per iteration stays the skip decision itself.
"""
from __future__ import annotations

import torch


def is_distributed() -> bool:
    """True in an initialised process group with more than one rank (no device access)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_found_inf_(found_inf: torch.Tensor) -> torch.Tensor:
    """found_inf <- max over ranks, in place; a no-op outside a multi-rank job.

    Every rank must call it the same number of times (it is a collective): the engine calls it
    once per unscaling `scale_loss` exit of a dynamic scaler, which every rank runs alike.
    """
    if is_distributed():
        torch.distributed.all_reduce(found_inf, op=torch.distributed.ReduceOp.MAX)
    return found_inf
