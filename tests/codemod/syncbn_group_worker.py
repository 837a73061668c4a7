"""One gloo rank: Apex's create_syncbn_process_group (through the shim) beside torch's new_subgroups."""

import sys

import torch
import torch.distributed as dist


def _members(group):
    return None if group is None else dist.get_process_group_ranks(group)


def _group_sum(group, rank):
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=group)
    return value.item()


def main(rank, world, port, out):
    from amp_shim.parallel import create_syncbn_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = {}
        for size in (1, 2, world):
            apex_group = create_syncbn_process_group(size)
            torch_group = dist.new_subgroups(size)[0]
            result[size] = {
                "apex": (_members(apex_group), _group_sum(apex_group, rank)),
                "torch": (_members(torch_group), _group_sum(torch_group, rank)),
            }
        result[0] = create_syncbn_process_group(0)
        torch.save(result, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
