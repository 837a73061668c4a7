"""A legacy Apex DDP script exits cleanly through the `apex` alias (issue 18, item 11).

The abort it once showed (`terminate called without an active exception` at interpreter exit,
about 1 run in 14 on a loaded machine) comes from Python work left to gloo's worker thread: the
shim's comm hook chained its post-multiply onto the all-reduce's future (`future.then`), so the
worker ran that callback, and released it and the tensors it held, after DDP had already been
told the bucket was done. When the worker reached for the GIL after the main thread had begun
interpreter shutdown, it was torn down in the middle of C++ code and the process aborted. The
hook now finishes each bucket in the calling thread and keeps the tensor it handed to the group.

The unit tests below pin that mechanism deterministically (a stand-in all-reduce whose future
nothing completes); the program runs check a real two-rank script end to end (a 30-run stress
lives in bench/ddp_teardown_stress.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from amp_shim.parallel import DistributedDataParallel

PROGRAM = Path(__file__).with_name("ddp_teardown_program.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def single_rank_group(tmp_path):
    """A 1-rank gloo group in this process (constructing torch DDP needs one)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Bucket:
    """What the hook reads of a `dist.GradBucket`."""

    def __init__(self, buffer: torch.Tensor, index: int = 0) -> None:
        self._buffer, self._index = buffer, index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index


class _PendingWork:
    """An all-reduce still running on the process group's thread: nothing completes its future."""

    def __init__(self) -> None:
        self.future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def wait(self) -> bool:
        return True


@pytest.fixture
def apex_hook(single_rank_group, monkeypatch):
    """The comm hook and state that Apex's DDP arguments install, over a stand-in all-reduce
    that sums as two equal ranks would; the tensors it was handed are recorded."""
    model = DistributedDataParallel(torch.nn.Linear(3, 2), allreduce_always_fp32=True,
                                    gradient_predivide_factor=2.0)
    [(hook, state)] = model._comm_hooks
    handed = []

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        handed.append(tensor)
        tensor.mul_(2.0)
        return _PendingWork() if async_op else None

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return hook, state, handed


def test_the_apex_comm_hook_leaves_nothing_for_the_process_groups_thread(apex_hook):
    hook, state, _ = apex_hook
    buffer = torch.full((4,), 3.0, dtype=torch.float16)

    future = hook(state, _Bucket(buffer))

    # Complete on return: no Python continuation waits on the group's thread.
    assert future.done()
    # Apex's arithmetic, in fp32: 3 / 2 (pre-divide), x2 (two ranks), x 2/1 (post-multiply).
    assert torch.equal(future.value(), torch.full((4,), 6.0, dtype=torch.float16))
    assert torch.equal(buffer, future.value())  # DDP reads the bucket's own buffer


def test_the_apex_comm_hook_keeps_the_tensor_it_handed_to_the_group(apex_hook):
    hook, state, handed = apex_hook
    for index in (0, 1):
        hook(state, _Bucket(torch.ones(2, dtype=torch.float16), index))

    # The fp32 copies live on in the hook's state, one per bucket: a gloo worker that lets go
    # of one late never drops the last reference to a tensor whose Python object needs the GIL.
    assert [state.sent[0], state.sent[1]] == handed
    assert all(t.dtype == torch.float32 for t in handed)


def _run_program(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", AMP_SHIM_ALIAS="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, attempt", [(("--apex-hook",), 1), (("--apex-hook",), 2), ((), 1)],
                         ids=["apex-hook-1", "apex-hook-2", "apex-default"])
def test_a_two_rank_apex_ddp_script_without_teardown_exits_cleanly(args, attempt):
    run = _run_program(*args)

    assert run.returncode == 0, run.stderr[-3000:]
    assert "terminate called" not in run.stderr
    assert "Fatal Python error" not in run.stderr
    assert run.stdout.count("4 steps") == 2
