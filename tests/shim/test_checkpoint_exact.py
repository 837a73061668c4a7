"""Acceptance: save `{model, optimizer, amp}` after N steps, restore in a fresh process, train M
more; the result equals N+M uninterrupted steps bit for bit, at every O-level and num_losses."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROGRAM = Path(__file__).with_name("checkpoint_resume_program.py")
sys.path.insert(0, str(PROGRAM.parent))
from checkpoint_resume_program import CONFIGS, N  # noqa: E402


def run(phase, out_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, str(PROGRAM), phase, str(out_dir)], check=True, env=env)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    run("train", out)
    run("resume", out)
    return (
        torch.load(out / "uninterrupted.pt", weights_only=False),
        torch.load(out / "resumed.pt", weights_only=False),
    )


def assert_same(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b and type(a) is type(b), where


@pytest.mark.slow
@pytest.mark.parametrize("level,num_losses", CONFIGS)
def test_resume_in_fresh_process_continues_bit_for_bit(results, level, num_losses):
    uninterrupted, resumed = results
    want, got = uninterrupted[(level, num_losses)], resumed[(level, num_losses)]
    per_step = num_losses
    assert_same(want["losses"][N * per_step :], got["losses"], "losses")
    assert_same(want["model"], got["model"], "model")
    assert_same(want["optimizer"], got["optimizer"], "optimizer")
    assert_same(want["amp"], got["amp"], "amp")


@pytest.mark.slow
def test_the_runs_exercise_overflow_and_growth(results):
    uninterrupted, _ = results
    for level in ("O1", "O2"):
        amp_state = uninterrupted[(level, 1)]["amp"]["loss_scaler0"]
        assert amp_state["loss_scale"] < 2.0**20  # backed off from the storm
    assert all(v["model"]["0.weight"].dtype == torch.float32 for v in uninterrupted.values())
