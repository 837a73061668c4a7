"""`apex.parallel.DistributedDataParallel` and `Reducer` on torch's DDP.

`DistributedDataParallel` *is* a `torch.nn.parallel.DistributedDataParallel` built from Apex's
constructor arguments:

  * `message_size` (elements) -> `bucket_cap_mb` (elements x the params' element size);
  * `delay_allreduce` -> accepted: torch overlaps the all-reduce with backward, Apex's delayed
    mode reduced at the end; the reduced gradients are the same;
  * `gradient_average`, `gradient_predivide_factor`, `allreduce_always_fp32` -> a comm hook with
    Apex's arithmetic (cast, multiply by 1/predivide, all-reduce, multiply by
    predivide/world_size unless not averaging), installed only when one differs from the
    default. The hook finishes each bucket in the thread that calls it and returns a completed
    future: a Python continuation (`future.then`) would run, and be released, on gloo's worker
    thread, which then needs the GIL; when that happens after the main thread has begun
    interpreter shutdown (a script that ends without `destroy_process_group`, on a loaded
    machine) the worker is torn down mid-C++ and the process aborts with `terminate called
    without an active exception`. For the same reason the hook keeps a reference to the last
    tensor it handed to the process group per bucket, so a gloo worker never drops the last
    reference of a tensor whose Python object needs the GIL to be freed;
  * `disable_allreduce()` / `enable_allreduce()` -> torch's `require_backward_grad_sync` (what
    `no_sync()` toggles); read by torch at forward time, so call them before the forward;
  * `retain_allreduce_buffers`, `num_allreduce_streams`, `allreduce_communicators`,
    `allreduce_trigger_params` and `prof` have no torch equivalent: accepted, each warns once
    per process when set away from its default, and is otherwise ignored;
  * Apex's argument errors (`shared_param`, and the `delay_allreduce` conflicts) are kept.

As in Apex, parameters are broadcast from rank 0 at construction and buffers are not
synchronised in forward (each rank keeps its own BatchNorm running statistics unless the
model uses SyncBatchNorm); unlike Apex, torch also copies rank 0's buffers once at
construction, where they are normally equal anyway. `device_ids` is left unset: the module is
used on the device it is on, which is what Apex assumed (`torch.cuda.set_device` done by the
script); CPU modules (gloo) work as well.
"""

from __future__ import annotations

import inspect
import warnings

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .._deprecation import deprecated_warning
from ..engine.distributed import all_reduce_kept

_SHARED_PARAM_MSG = (
    "shared_param is no longer supported as an option.  It was misleadingly named from the "
    "start.  It turns out overlapping communication with computation should work fine with "
    "shared parameters.  If you still wish to delay communication to the end of the backward "
    "pass, use delay_allreduce=True|False instead."
)
_warned: set[str] = set()

# Apex never synchronised buffers in forward. Recent torch spells that `forward_sync_buffers`
# (and deprecates `broadcast_buffers`); older torch only has `broadcast_buffers`.
_NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def _warn_once(argument: str, value) -> None:
    if argument in _warned:
        return
    _warned.add(argument)
    warnings.warn(
        "amp_shim: apex.parallel.DistributedDataParallel({}={!r}) has no equivalent in "
        "torch.nn.parallel.DistributedDataParallel; it is ignored.".format(argument, value),
        UserWarning,
        stacklevel=3,
    )


def flat_dist_call(tensors, call, extra_args=None):
    """Apex's helper: run `call` once per dtype on the flattened tensors (all-reduce averages)."""
    buckets: dict = {}
    for tensor in tensors:
        buckets.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for (dtype, device), bucket in buckets.items():
        coalesced = _flatten_dense_tensors(bucket)
        if extra_args is not None:
            call(coalesced, *extra_args)
        elif call is dist.all_reduce and device.type == "cpu":
            # a temporary gloo may release late: keep it (engine.distributed.all_reduce_kept)
            all_reduce_kept(coalesced, "Reducer {} {}".format(dtype, device))
        else:
            call(coalesced)
        if call is dist.all_reduce:
            coalesced /= dist.get_world_size()
        for buf, synced in zip(bucket, _unflatten_dense_tensors(coalesced, bucket)):
            buf.copy_(synced)


class _ApexHookState:
    """What the Apex-arithmetic hook needs, plus the tensors it last all-reduced (one per bucket).

    Holding the last tensor of each bucket keeps its Python object alive while a gloo worker
    may still hold the tensor; the next iteration's bucket replaces it.
    """

    __slots__ = ("group", "world_size", "always_fp32", "predivide", "average", "sent")

    def __init__(self, group, world_size: float, always_fp32: bool, predivide: float, average: bool) -> None:
        self.group = group
        self.world_size = world_size
        self.always_fp32 = always_fp32
        self.predivide = predivide
        self.average = average
        self.sent: dict[int, torch.Tensor] = {}


def _apex_allreduce_hook(state: _ApexHookState, bucket):
    """One bucket, Apex's way: optional fp32, pre-divide, all-reduce, post-multiply.

    Everything runs here, in the backward's thread, and the returned future is already
    complete, so nothing is left for gloo's worker thread to run in Python (module docstring).
    The price: on gloo a bucket's all-reduce no longer overlaps the rest of the backward (on
    NCCL the wait only orders the streams). No return annotation: DDP accepts only the object
    `Future[Tensor]`, and this module's annotations are strings.
    """
    buffer = bucket.buffer()
    tensor = buffer.float() if state.always_fp32 and buffer.dtype != torch.float32 else buffer
    if state.predivide != 1.0:
        tensor.mul_(1.0 / state.predivide)
    state.sent[bucket.index()] = tensor
    dist.all_reduce(tensor, group=state.group)
    if state.average:
        tensor.mul_(state.predivide / state.world_size)
    if tensor is not buffer:
        buffer.copy_(tensor)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(
        self,
        module,
        message_size=10000000,
        delay_allreduce=False,
        shared_param=None,
        allreduce_trigger_params=None,
        retain_allreduce_buffers=False,
        allreduce_always_fp32=False,
        num_allreduce_streams=1,
        allreduce_communicators=None,
        gradient_average=True,
        gradient_predivide_factor=1.0,
        gradient_average_split_factor=None,
        prof=False,
    ):
        deprecated_warning(
            "apex.parallel.DistributedDataParallel is deprecated and will be removed by the end "
            "of February 2023."
        )
        if num_allreduce_streams > 1 and delay_allreduce:
            raise ValueError("self.allreduce_different_streams may only be used if delay_allreduce=False.")
        if shared_param is not None:
            raise ValueError(_SHARED_PARAM_MSG)
        if allreduce_trigger_params is not None and delay_allreduce:
            raise ValueError("Setting allreduce_trigger_params is only valid if delay_allreduce=False.")
        for name, value, default in (
            ("allreduce_trigger_params", allreduce_trigger_params, None),
            ("retain_allreduce_buffers", retain_allreduce_buffers, False),
            ("num_allreduce_streams", num_allreduce_streams, 1),
            ("allreduce_communicators", allreduce_communicators, None),
            ("prof", prof, False),
        ):
            if value is not default and value != default:
                _warn_once(name, value)

        element_size = next((p.element_size() for p in module.parameters()), 4)
        super().__init__(
            module,
            bucket_cap_mb=message_size * element_size / 2**20,
            **_NO_FORWARD_BUFFER_SYNC,
        )
        # Apex's attributes, which scripts read back.
        self.message_size = message_size
        self.delay_allreduce = delay_allreduce
        self.retain_allreduce_buffers = retain_allreduce_buffers
        self.allreduce_always_fp32 = allreduce_always_fp32
        self.num_allreduce_streams = num_allreduce_streams
        self.allreduce_communicators = allreduce_communicators
        self.gradient_average = gradient_average
        self.gradient_predivide_factor = gradient_predivide_factor
        self.prof = prof
        self.world_size = float(dist.get_world_size())
        if allreduce_always_fp32 or gradient_predivide_factor != 1.0 or not gradient_average:
            state = _ApexHookState(
                None,
                self.world_size,
                allreduce_always_fp32,
                float(gradient_predivide_factor),
                bool(gradient_average),
            )
            self.register_comm_hook(state, _apex_allreduce_hook)

    def enable_allreduce(self) -> None:
        self.require_backward_grad_sync = True

    def disable_allreduce(self) -> None:
        self.require_backward_grad_sync = False


class Reducer(object):
    """Apex's manual gradient averaging: `Reducer(module).reduce()` after backward.

    Given a module it broadcasts the module's parameters from rank 0 at construction and
    reduces their gradients; given a list of tensors (nested lists allowed) it reduces those.
    """

    def __init__(self, module_or_grads_list):
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module = module_or_grads_list
            flat_dist_call([param.data for param in self.module.parameters()], dist.broadcast, (0,))
        else:
            self.module = None
            self.grads = []
            _extract_tensors(module_or_grads_list, self.grads)

    def reduce(self) -> None:
        if self.module:
            grads = [param.grad.data for param in self.module.parameters() if param.grad is not None]
            flat_dist_call(grads, dist.all_reduce)
        else:
            flat_dist_call(self.grads, dist.all_reduce)


def _extract_tensors(maybe_tensor, tensor_list) -> None:
    if torch.is_tensor(maybe_tensor):
        tensor_list.append(maybe_tensor)
    else:
        try:
            for item in maybe_tensor:
                _extract_tensors(item, tensor_list)
        except TypeError:
            return
