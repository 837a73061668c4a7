"""AMP531 rewrites Apex's `create_syncbn_process_group(n)` to `torch.distributed.new_subgroups(n)[0]`:
each rank must land in the same group of consecutive ranks, and reduce over it the same way."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

#: The process groups this module starts take most of a minute: whole-module slow.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("syncbn_group_worker.py")
SHIM = Path(__file__).resolve().parents[2] / "shim"
WORLD = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("subgroups")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM), env.get("PYTHONPATH")]))
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(WORLD), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("size", [1, 2, WORLD])
@pytest.mark.slow
def test_each_rank_gets_the_same_group_of_consecutive_ranks(ranks, size):
    for rank, result in enumerate(ranks):
        apex_members, apex_sum = result[size]["apex"]
        torch_members, torch_sum = result[size]["torch"]
        first = rank - rank % size
        assert apex_members == torch_members == list(range(first, first + size))
        assert apex_sum == torch_sum == sum(r + 1.0 for r in range(first, first + size))


def test_a_group_size_of_zero_is_no_group_in_apex(ranks):
    assert all(result[0] is None for result in ranks)
