"""The skip of the step after an overflow: Apex's protocol on the device, as GradScaler keeps it.

Apex decides at `scale_loss` exit whether to skip and swaps `optimizer.step` for a one-shot
closure. Here the decision stays on the device until the next `step()`: `scale_loss` records
which loss scaler overflowed first in a device tensor (`arm_skip`), and the step, patched once
at initialize (amp/_process_optimizer.py), takes one of two paths:

* the host path (any optimizer): read the decision once (`take_skip_decision`, the iteration's
  only host sync) and, on overflow, print Apex's message and return without calling the
  optimizer;
* the device path (an optimizer whose step supports amp scaling, `_step_supports_amp_scaling`,
  e.g. `torch.optim.AdamW(fused=True)`, the shim's FusedSGD, FusedAdam(capturable=True)): hand
  the decision to the optimizer as torch.amp.GradScaler does (`optimizer.found_inf`, with
  `optimizer.grad_scale = None` because the grads are already unscaled), so its kernel leaves
  params and state untouched on overflow, with no host sync (`device_path_step`). Apex's
  message is then printed from a copy of the decision and the scale made without blocking (on
  CPU at once, on CUDA once the copy has landed: at a later `step()` or `scale_loss`, or at a
  step that syncs anyway, or at exit), in order. Taken only when no closure is passed and
  every param with a grad already has optimizer state (`skips_on_device`): a skipped first step
  must leave the lazily created state absent, as the host path does (torch's kernels would
  create it, or leave SGD's first momentum buffer uninitialised). docs/differences.md, row 42.

The optimizer's `_amp_stash` holds the armed decision (`skip_armed`: -1, or the id of the loss
scaler that overflowed first) and whether a step must look at it (`skip_check_pending`).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import struct
from typing import Sequence

import torch

SKIP_MSG = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"


def arm_skip(optimizer, loss_id: int, found: torch.Tensor) -> None:
    """Remember, on the device, that `loss_id` overflowed (the first one wins, as in Apex)."""
    stash = optimizer._amp_stash
    armed = stash.skip_armed
    if armed.device != found.device:
        armed = stash.skip_armed = armed.to(found.device)
    candidate = torch.where(found, torch.full_like(armed, loss_id), torch.full_like(armed, -1))
    armed.copy_(torch.where(armed >= 0, armed, candidate))
    stash.skip_check_pending = True


def _skip_record(optimizer, loss_scalers: Sequence) -> tuple[torch.Tensor, list]:
    """On the device, nothing read back: [loss id that armed the skip (-1: none), each loss
    scaler's current scale] in float64, and the scalers it refers to."""
    armed = optimizer._amp_stash.skip_armed
    scalers = list(loss_scalers)
    record = torch.cat(
        [armed.double().view(1)] + [s.scale.to(armed.device, torch.float64).view(1) for s in scalers]
    )
    return record, scalers


def _skip_message(values, scalers) -> tuple[int, float]:
    loss_id = int(values[0])
    if loss_id < 0:
        return -1, 0.0
    scaler = scalers[loss_id]
    return loss_id, (values[1 + loss_id] if scaler.dynamic else scaler.loss_scale())


def take_skip_decision(optimizer, loss_scalers: Sequence) -> tuple[int, float]:
    """One host read: which loss scaler armed the skip (-1: none) and its current scale."""
    stash = optimizer._amp_stash
    stash.skip_check_pending = False
    record, scalers = _skip_record(optimizer, loss_scalers)
    loss_id, scale = _skip_message(record.tolist(), scalers)
    if loss_id >= 0:
        stash.skip_armed.fill_(-1)
    return loss_id, scale


# Skip records still to print: (host copy of a skip record, CUDA event or None when the copy is already on the host,
#  the record's loss scalers, whether to print: the verbosity at the step)
landing: collections.deque = collections.deque()


def _read_landed(host: torch.Tensor) -> list[float]:
    """The float64 values of a CPU tensor whose copy has landed. Nothing waits for a device;
    read through its memory rather than `.tolist()`, which CountHostSyncs would count as a
    device read."""
    raw = ctypes.string_at(host.data_ptr(), host.numel() * host.element_size())
    return list(struct.unpack("=%dd" % host.numel(), raw))


def _queue_skip_record(record: torch.Tensor, scalers: list, verbose: bool) -> None:
    if record.device.type == "cpu":
        host, event = record, None
    else:
        host = torch.empty(record.shape, dtype=record.dtype, pin_memory=True)
        host.copy_(record, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(record.device))
    landing.append((host, event, scalers, verbose))


def print_landed_skip_messages(wait: bool = False) -> None:
    """Print, in step order, Apex's message for each device-path step that skipped, as far as
    the copies have landed; `wait=True` (at a point that syncs anyway, and at exit) waits."""
    while landing:
        host, event, scalers, verbose = landing[0]
        if event is not None and not event.query():
            if not wait:
                return
            event.synchronize()
        landing.popleft()
        loss_id, scale = _skip_message(_read_landed(host), scalers)
        if loss_id >= 0 and verbose:
            print(SKIP_MSG.format(loss_id, scale))


def _print_at_exit() -> None:
    try:
        print_landed_skip_messages(wait=True)
    except Exception:  # pragma: no cover - e.g. CUDA already torn down
        pass


atexit.register(_print_at_exit)


def skips_on_device(optimizer) -> bool:
    """Whether this step can leave the skip to the optimizer's kernel (module docstring)."""
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        return False
    if hasattr(optimizer, "found_inf") or hasattr(optimizer, "grad_scale"):
        return False  # someone else (a GradScaler) drives it
    if optimizer._amp_stash.skip_armed.device.type not in ("cpu", "cuda"):
        return False
    state = optimizer.state
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None and not state.get(p):
                return False
    return True


def device_path_step(optimizer, real_step, args, kwargs, loss_scalers: Sequence, verbose: bool):
    """Step with the skip decision handed to the optimizer (`found_inf`), as GradScaler does;
    Apex's message is queued and printed once its copy has landed."""
    stash = optimizer._amp_stash
    stash.skip_check_pending = False
    record, scalers = _skip_record(optimizer, loss_scalers)
    armed = stash.skip_armed
    found_inf = (armed >= 0).to(torch.float32)
    armed.fill_(-1)
    _queue_skip_record(record, scalers, verbose)
    optimizer.grad_scale = None  # the grads were unscaled at scale_loss exit
    optimizer.found_inf = found_inf
    try:
        return real_step(optimizer, *args, **kwargs)
    finally:
        del optimizer.grad_scale
        del optimizer.found_inf
        print_landed_skip_messages()
