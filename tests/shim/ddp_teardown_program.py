"""A legacy Apex DDP training script, as users write them: two gloo ranks, amp O1, no teardown.

    AMP_SHIM_ALIAS=1 python ddp_teardown_program.py [--apex-hook]   # through the `apex` alias
    python ddp_teardown_program.py --native                        # the torch equivalent

Each rank joins a gloo group on 127.0.0.1 (a free port), trains a few steps and returns without
`destroy_process_group`, so the process group and its threads are still alive when the
interpreter exits. `--late-gloo` lowers the priority of gloo's worker threads (nice 19), so
that on a busy machine they run late, as the report's loaded machine made them; it is how
bench/ddp_teardown_stress.py widens the window. `--hook-exit` is the mechanism alone, in
one process: the comm hook that Apex's DDP arguments install is called as DDP calls it, on a
large bucket of a 1-rank group, and the interpreter exits at once; a hook that left its
post-processing to gloo's worker thread aborts the process there. `--apex-hook` passes the DDP
arguments that install the shim's comm hook (Apex's fp32 all-reduce with a pre-divide factor).
Used by tests/shim/test_ddp_teardown.py and
bench/ddp_teardown_stress.py, which count the runs that do not exit cleanly.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

NATIVE = "--native" in sys.argv
APEX_HOOK = "--apex-hook" in sys.argv
LATE_GLOO = "--late-gloo" in sys.argv
HOOK_EXIT = "--hook-exit" in sys.argv
if not NATIVE:
    from apex import amp
    from apex.parallel import DistributedDataParallel

STEPS = 4


def _lower_gloo_threads() -> None:
    """nice 19 for this process's gloo worker threads (Linux names them pt_gloo_runloop)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "pt_gloo_runloop":
                    os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        except OSError:
            pass


def _train(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if LATE_GLOO:
        _lower_gloo_threads()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if NATIVE:
        model = torch.nn.parallel.DistributedDataParallel(model)
        scaler = torch.amp.GradScaler("cpu")
    else:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        ddp_args = {"allreduce_always_fp32": True, "gradient_predivide_factor": 2.0}
        model = DistributedDataParallel(model, **(ddp_args if APEX_HOOK else {}))
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=generator)
        optimizer.zero_grad()
        if NATIVE:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss = model(x).float().pow(2).mean()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    print(f"rank {rank}: {STEPS} steps", flush=True)


class _Bucket:
    """What the comm hook reads of a `dist.GradBucket`."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0


def _hook_then_exit(port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if LATE_GLOO:
        _lower_gloo_threads()
    model = DistributedDataParallel(
        nn.Linear(3, 2), allreduce_always_fp32=True, gradient_predivide_factor=2.0
    )
    [(hook, state)] = model._comm_hooks
    hook(state, _Bucket(torch.ones(30_000_000, dtype=torch.float16)))
    print("hook called; exiting", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if HOOK_EXIT:
        _hook_then_exit(_free_port())
    else:
        mp.spawn(_train, args=(2, _free_port()), nprocs=2)
