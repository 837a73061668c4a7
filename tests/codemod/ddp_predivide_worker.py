"""One gloo rank: gradients of torch DDP beside Apex DDP's predivide arithmetic (grads divided by
the factor before the allreduce, multiplied by factor/world_size after)."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))


def _apex_hook(predivide, bucket):
    """Apex's bucket reduction: times 1/F, sum over ranks, times F/world unless F is the world size."""
    world = dist.get_world_size()
    tensor = bucket.buffer()
    if predivide != 1.0:
        tensor.mul_(1.0 / predivide)
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def finish(fut):
        reduced = fut.value()[0]
        if predivide != world:
            reduced.mul_(predivide / world)
        return reduced

    return future.then(finish)


def _grads(rank, predivide=None):
    model = torch.nn.parallel.DistributedDataParallel(_net(), broadcast_buffers=False)
    if predivide is not None:
        model.register_comm_hook(predivide, _apex_hook)
    g = torch.Generator().manual_seed(7 + rank)
    x, y = torch.randn(5, 6, generator=g), torch.randn(5, 4, generator=g)
    F.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def main(rank, world, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = {
            "torch": _grads(rank),
            "apex_world": _grads(rank, float(world)),
            "apex_default": _grads(rank, 1.0),
            "apex_two": _grads(rank, 2.0),
        }
        torch.save(result, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
