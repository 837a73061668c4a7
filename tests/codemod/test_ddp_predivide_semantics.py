"""AMP530 drops Apex DDP's `gradient_predivide_factor`: torch DDP's own reduction must be Apex's
arithmetic with the factor equal to the world size, bit for bit, and any other factor the same mean."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

#: The process groups this module starts take most of a minute: whole-module slow.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("ddp_predivide_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=[3], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    """A world size that is not a power of two, where dividing before or after the sum rounds apart."""
    world, out = request.param, tmp_path_factory.mktemp("predivide")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(world), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
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
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.mark.slow
def test_torch_ddp_reduces_like_apex_with_the_factor_equal_to_the_world_size(ranks):
    for rank in ranks:
        assert all(torch.equal(a, b) for a, b in zip(rank["torch"], rank["apex_world"]))


def test_other_factors_give_the_same_mean_up_to_float32_rounding(ranks):
    for rank in ranks:
        for key in ("apex_default", "apex_two"):
            for a, b in zip(rank["torch"], rank[key]):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_the_factor_changes_the_last_bits_so_the_bitwise_check_can_fail(ranks):
    """Guards the first test: its comparison sees a difference where the arithmetic differs."""
    assert any(not torch.equal(a, b) for rank in ranks for a, b in zip(rank["torch"], rank["apex_two"]))
