"""A legacy Apex DDP script exits cleanly through the `apex` alias (issue 18, item 11).

The abort it was reported with (`terminate called without an active exception` at interpreter
exit, about 1 run in 14 on a loaded machine, none for native torch) is what a gloo worker thread
does when it reaches for the GIL after the main thread has begun interpreter shutdown: it is
torn down in the middle of C++ code. The shim gave that thread Python work native torch does
not: its comm hook chained the post-multiply onto the all-reduce's future (`future.then`), so
the worker ran that callback, and released it, after DDP had been told the bucket was done; and
the worker could be the last holder of a temporary the shim all-reduced (the hook's fp32 copy,
`Reducer`'s flattened gradients, SyncBatchNorm's statistics), whose Python object needs the GIL
to be freed. The hook now finishes each bucket in the calling thread, and every such temporary
stays referenced after the call.

The unit tests pin both deterministically (a stand-in all-reduce whose future nothing completes,
weak references to what it was handed); the program runs check a real two-rank script end to
end (a 30-run stress lives in bench/ddp_teardown_stress.py).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from amp_shim.parallel import DistributedDataParallel, Reducer, SyncBatchNorm

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
def handed(monkeypatch):
    """A stand-in all-reduce that sums as two equal ranks would; weak references to the tensors
    it was handed (a gloo worker may hold them after the call returns)."""
    refs = []

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        refs.append(weakref.ref(tensor))
        tensor.mul_(2.0)
        return _PendingWork() if async_op else None

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return refs


@pytest.fixture
def apex_hook(single_rank_group, handed):
    """The comm hook and state that Apex's DDP arguments install."""
    model = DistributedDataParallel(
        torch.nn.Linear(3, 2), allreduce_always_fp32=True, gradient_predivide_factor=2.0
    )
    [(hook, state)] = model._comm_hooks
    return hook, state


def _alive(refs) -> list[bool]:
    gc.collect()
    return [ref() is not None for ref in refs]


def test_the_apex_comm_hook_leaves_nothing_for_the_process_groups_thread(apex_hook):
    hook, state = apex_hook
    buffer = torch.full((4,), 3.0, dtype=torch.float16)

    future = hook(state, _Bucket(buffer))

    # Complete on return: no Python continuation waits on the group's thread.
    assert future.done()
    # Apex's arithmetic, in fp32: 3 / 2 (pre-divide), x2 (two ranks), x 2/1 (post-multiply).
    assert torch.equal(future.value(), torch.full((4,), 6.0, dtype=torch.float16))
    assert torch.equal(buffer, future.value())  # DDP reads the bucket's own buffer


def test_the_apex_comm_hook_keeps_the_tensors_it_handed_to_the_group(apex_hook, handed):
    hook, state = apex_hook
    for index in (0, 1):
        hook(state, _Bucket(torch.ones(2, dtype=torch.float16), index))

    # The fp32 copies outlive the call, one per bucket: a gloo worker that lets go of one late
    # never drops the last reference to a tensor whose Python object needs the GIL to be freed.
    assert _alive(handed) == [True, True]


def test_reducer_keeps_the_flattened_tensor_it_handed_to_the_group(handed, monkeypatch):
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    grads = [torch.ones(2), torch.ones(3)]

    Reducer(grads).reduce()

    assert [g.tolist() for g in grads] == [[1.0, 1.0], [1.0, 1.0, 1.0]]  # summed, averaged
    assert _alive(handed) == [True]


def test_syncbatchnorm_keeps_the_statistics_it_handed_to_the_group(handed, monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    bn = SyncBatchNorm(3, process_group=object())

    bn(torch.randn(4, 3, requires_grad=True)).sum().backward()

    # the forward's two reductions and the backward's two
    assert len(handed) == 4 and _alive(handed) == [True] * 4


def _run_program(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", AMP_SHIM_ALIAS="1", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, attempt",
    [(("--apex-hook",), 1), (("--apex-hook",), 2), ((), 1)],
    ids=["apex-hook-1", "apex-hook-2", "apex-default"],
)
def test_a_two_rank_apex_ddp_script_without_teardown_exits_cleanly(args, attempt):
    run = _run_program(*args)

    assert run.returncode == 0, run.stderr[-3000:]
    assert "terminate called" not in run.stderr
    assert "Fatal Python error" not in run.stderr
    assert run.stdout.count("4 steps") == 2
