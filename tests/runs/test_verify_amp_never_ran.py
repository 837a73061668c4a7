"""`amp-migrate verify` never passes a run in which the legacy program made no Apex amp call:
such runs agree whatever the migration wrote, since none of it stands where amp ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_verify_command import verify, verify_text_and_json

#: The program's own code turns mixed precision off on a machine without CUDA.
AMP_ONLY_ON_CUDA = '''\
"""Mixed precision only where CUDA is: on CPU this script never calls amp."""
import torch
import torch.nn as nn
from apex import amp

use_amp = torch.cuda.is_available()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if use_amp:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(8):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    if use_amp:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
'''

#: Apex's amp through FP16_Optimizer only: no amp.initialize anywhere, and amp did run.
FP16_OPTIMIZER_ONLY = """\
import torch
from apex.fp16_utils import FP16_Optimizer

torch.manual_seed(0)
model = torch.nn.Linear(8, 1).half()
optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.01), static_loss_scale=128.0)
for it in range(6):
    x = torch.randn(4, 8).half()
    loss = model(x).float().pow(2).mean()
    optimizer.zero_grad()
    optimizer.backward(loss)
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
"""


@pytest.fixture
def amp_off(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(AMP_ONLY_ON_CUDA)
    return tmp_path


@pytest.mark.slow
def test_a_program_that_switches_amp_off_on_cpu_is_refused_as_amp_never_ran_in_text_and_json(
    amp_off, monkeypatch
):
    """Was two tests, a text and a JSON verify of the same run; one run now, both renderings."""
    args = ("--steps", "4", "--device", "cpu", "--", "python", "train.py")
    result, as_json = verify_text_and_json(monkeypatch, amp_off, *args)
    assert result.exit_code == 1, result.output
    assert "amp never ran in the legacy run" in result.output
    assert "so the migration was not exercised" in result.output
    # The JSON gives the amp-never-ran verdict and the legacy run's amp calls.
    document = json.loads(as_json.output)
    assert document["verdict"] == "amp never ran" and document["passed"] is False
    assert document["exit_code"] == 1
    assert document["amp_calls"] == {}


@pytest.mark.slow
def test_allow_no_amp_accepts_such_a_run_with_a_note(amp_off):
    args = ("--steps", "4", "--device", "cpu", "--allow-no-amp", "--", "python", "train.py")
    result = verify(amp_off, *args)
    assert result.exit_code == 0, result.output
    assert "identical: 4 steps equal bit for bit" in result.output
    assert "note: amp never ran in the legacy run" in result.output and "--allow-no-amp" in result.output


@pytest.mark.slow
def test_a_program_on_fp16_optimizer_alone_ran_amp_and_is_judged_on_its_steps(tmp_path: Path):
    (tmp_path / "train.py").write_text(FP16_OPTIMIZER_ONLY)
    args = ("--steps", "3", "--device", "cpu", "--format", "json", "--", "python", "train.py")
    document = json.loads(verify(tmp_path, *args).output)
    assert document["verdict"] != "amp never ran", document["message"]
    assert document["amp_calls"]["FP16_Optimizer.step"] == 3
    assert document["amp_calls"]["FP16_Optimizer.backward"] == 3
