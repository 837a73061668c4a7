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

import collections

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


# The tensors last handed to a synchronous collective from each call site (all_reduce_kept).
_handed: dict[str, collections.deque] = {}


def all_reduce_kept(tensor: torch.Tensor, site: str, keep: int = 1, **kwargs) -> None:
    """`torch.distributed.all_reduce(tensor, **kwargs)`, keeping the last `keep` tensors of
    `site` referenced (the shim's call sites that reduce a temporary on gloo).

    The collective's wait returns once the result is in, but gloo's worker thread may let go of
    the tensor a little later. If the tensor's Python object is gone by then, that release
    frees it and needs the GIL; on a loaded machine it can come after the main thread has begun
    interpreter shutdown, and the worker then dies mid-C++ (`terminate called without an active
    exception`). Keeping the site's last tensors means the worker does not hold the last
    reference to a recent one; the ones still kept at exit are freed by the interpreter's own
    teardown, past the point where torch frees a tensor's Python object from another thread.
    """
    kept = _handed.get(site)
    if kept is None or kept.maxlen != keep:
        kept = _handed[site] = collections.deque(kept or (), maxlen=keep)
    kept.append(tensor)
    torch.distributed.all_reduce(tensor, **kwargs)
