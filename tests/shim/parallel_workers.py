"""Rank programs for tests/shim/test_parallel.py: `python parallel_workers.py CASE RANK WORLD PORT OUT`.

Each joins a gloo group on 127.0.0.1, runs CASE and saves what it observed to
OUT/CASE.rank<RANK>.pt; the test compares the ranks' files with single-process references.
Every rank derives the whole job's data from shared seeds, so it can also compute what
the other ranks did.
"""

from __future__ import annotations

import contextlib
import io
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from amp_shim.engine.host_syncs import CountHostSyncs

SPLIT = (3, 5)  # uneven per-rank batches: the global statistics must weight them by size


def _slice(t, rank):
    start = sum(SPLIT[:rank])
    return t[start : start + SPLIT[rank]]


# -- SyncBatchNorm -------------------------------------------------------------------------
def _syncbn_run(rank, make_input, grad_shape=None, z_shape=None, **bn_kwargs):
    from amp_shim.parallel import SyncBatchNorm

    g = torch.Generator().manual_seed(7)
    x = make_input(g)
    grad_out = torch.randn(x.shape, generator=g)
    z = torch.randn(z_shape, generator=g) if z_shape else None
    bn = SyncBatchNorm(
        x.shape[-1] if bn_kwargs.get("channel_last") and x.dim() > 2 else x.shape[1], **bn_kwargs
    )
    with torch.no_grad():
        bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(bn.bias.shape, generator=g))
    result = {"outputs": []}
    for step in range(2):  # two steps: running statistics and momentum compound
        xs = _slice(x * (step + 1), rank).clone().requires_grad_()
        zs = _slice(z, rank) if z is not None else None
        out = bn(xs, zs) if zs is not None else bn(xs)
        (out * _slice(grad_out, rank)).sum().backward()
        result["outputs"].append(out.detach())
        result.setdefault("x_grads", []).append(xs.grad)
    result.update(
        weight_grad=bn.weight.grad,
        bias_grad=bn.bias.grad,
        running_mean=bn.running_mean.clone(),
        running_var=bn.running_var.clone(),
        num_batches_tracked=bn.num_batches_tracked.clone(),
    )
    bn.eval()
    result["eval_output"] = bn(_slice(x, rank)).detach()
    return result


def case_syncbn(rank, world):
    n = sum(SPLIT)
    return {
        "nchw": _syncbn_run(rank, lambda g: torch.randn(n, 4, 3, 5, generator=g)),
        "nc": _syncbn_run(rank, lambda g: torch.randn(n, 6, generator=g)),
        "ncl_cumulative": _syncbn_run(rank, lambda g: torch.randn(n, 3, 7, generator=g), momentum=None),
        "channel_last_z_relu": _syncbn_run(
            rank,
            lambda g: torch.randn(n, 3, 5, 4, generator=g),
            z_shape=(n, 3, 5, 4),
            channel_last=True,
            fuse_relu=True,
        ),
    }


# -- the engine's found-inf all-reduce -------------------------------------------------------
def _overflow_run(rank, opt_level):
    """No DDP: each rank's grads stay local, so only the engine can make rank 0 skip too."""
    from amp_shim import amp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level=opt_level, verbosity=0)
    amp._amp_state.verbosity = 1  # the skip message, not the option table
    x = torch.linspace(-1, 1, 32).reshape(4, 8) * (rank + 1)

    def iteration(poison):
        opt.zero_grad()
        loss = F.mse_loss(model(x), torch.zeros(4, 4))
        if poison:
            loss = loss * float("inf")
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()

    def params():
        return [p.detach().clone() for p in model.parameters()]

    iteration(False)
    counter = CountHostSyncs()
    with counter:
        iteration(False)
    clean_syncs = list(counter.calls)
    before = params()
    stdout = io.StringIO()
    counter = CountHostSyncs()
    with contextlib.redirect_stdout(stdout), counter:
        iteration(poison=(rank == 1))
    skipped = all(torch.equal(a, b) for a, b in zip(before, params()))
    return {
        "clean_syncs": clean_syncs,
        "overflow_syncs": list(counter.calls),
        "printed": stdout.getvalue(),
        "skipped": skipped,
        "scale": amp._amp_state.loss_scalers[0].loss_scale(),
    }


def case_overflow(rank, world):
    import amp_shim.amp.handle as handle

    result = {level: _overflow_run(rank, level) for level in ("O1", "O2")}
    # Control: without the engine's all-reduce, the clean rank steps and the ranks diverge.
    reduce = handle.all_reduce_found_inf_
    handle.all_reduce_found_inf_ = lambda found_inf: found_inf
    try:
        result["without_reduce"] = _overflow_run(rank, "O1")
    finally:
        handle.all_reduce_found_inf_ = reduce
    return result


# -- DistributedDataParallel and Reducer ----------------------------------------------------
def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _data(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)


def _local_grads(rank):
    """The gradients rank `rank` computes alone, from rank 0's initial weights."""
    net = _net(0)
    x, y = _data(rank)
    F.mse_loss(net(x), y).backward()
    return [p.grad for p in net.parameters()]


def _ddp_grads(rank, **kwargs):
    from amp_shim.parallel import DistributedDataParallel

    model = DistributedDataParallel(_net(rank), **kwargs)  # rank 1 starts from other weights
    x, y = _data(rank)
    F.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()], model


def case_ddp(rank, world):
    from amp_shim.parallel import Reducer

    result = {"local": [_local_grads(r) for r in range(world)]}
    grads, model = _ddp_grads(rank)
    result["params_after_wrap"] = [p.detach().clone() for p in model.parameters()]
    result["default"] = grads
    result["delay_allreduce"] = _ddp_grads(rank, delay_allreduce=True, message_size=1)[0]
    result["sum"] = _ddp_grads(rank, gradient_average=False)[0]
    result["predivide"] = _ddp_grads(rank, gradient_predivide_factor=4.0, allreduce_always_fp32=True)[0]

    # disable_allreduce(): this backward stays local; enable_allreduce(): the next is averaged.
    from amp_shim.parallel import DistributedDataParallel

    model = DistributedDataParallel(_net(0))
    x, y = _data(rank)
    model.disable_allreduce()
    F.mse_loss(model(x), y).backward()
    result["disabled"] = [p.grad.clone() for p in model.parameters()]
    model.enable_allreduce()
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    result["reenabled"] = [p.grad.clone() for p in model.parameters()]
    result["state_dict_keys"] = list(model.state_dict())

    # Reducer(module): broadcast at construction, averaged grads on reduce().
    net = _net(rank)
    reducer = Reducer(net)
    result["reducer_params"] = [p.detach().clone() for p in net.parameters()]
    F.mse_loss(net(x), y).backward()
    reducer.reduce()
    result["reducer_module"] = [p.grad.clone() for p in net.parameters()]
    # Reducer(list of tensors)
    tensors = [torch.full((2,), float(rank + 1)), [torch.full((3,), 10.0 * (rank + 1))]]
    Reducer(tensors).reduce()
    result["reducer_list"] = [tensors[0], tensors[1][0]]
    return result


def main(argv):
    case, rank, world, port, out = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = globals()["case_" + case](rank, world)
        torch.save(result, f"{out}/{case}.rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv)
