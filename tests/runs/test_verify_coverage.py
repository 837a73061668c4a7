"""`amp-migrate verify` says which statements the migration wrote ran in the migrated run and
which never did: equal runs prove nothing about a statement they never reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_verify_command import verify, verify_text_and_json

#: A legacy Apex O1 script that saves a checkpoint once training is over: verify's runs stop
#: after --steps steps, so the migrated `scaler.state_dict()` there never runs.
SAVES_AT_THE_END = '''\
"""A legacy Apex O1 script that saves a checkpoint once training is over."""
import torch
import torch.nn as nn
from apex import amp


def save_checkpoint(model, optimizer, path):
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "amp": amp.state_dict(),
        },
        path,
    )


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(8):
    x = torch.randn(16, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
save_checkpoint(model, optimizer, "checkpoint.pt")
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SAVES_AT_THE_END)
    return tmp_path


@pytest.mark.slow
def test_a_checkpoint_save_the_steps_never_reach_is_listed_as_never_ran_in_text_and_json(tree, monkeypatch):
    """Was two tests, a text and a JSON verify of the same run; one run now, both renderings."""
    args = ("--steps", "4", "--device", "cpu", "--", "python", "train.py")
    result, as_json = verify_text_and_json(monkeypatch, tree, *args)
    assert result.exit_code == 0, result.output
    assert "the migration's statements in the migrated run: 5 ran, 1 never ran" in result.output
    assert (
        '`"amp": scaler.state_dict(),` in save_checkpoint at train.py:11 (line 12 of the original) never ran'
        in result.output
    )
    # The JSON lists the statements that ran and those that never did.
    coverage = json.loads(as_json.output)["coverage"]
    [never] = coverage["not_run"]
    assert never == {
        "file": "train.py",
        "line": 11,
        "original_line": 12,
        "text": '"amp": scaler.state_dict(),',
        "context": "save_checkpoint",
    }
    ran = {entry["text"]: entry for entry in coverage["ran"]}
    assert ran["scaler.step(optimizer)"] == {
        "file": "train.py",
        "line": 27,
        "original_line": 28,
        "text": "scaler.step(optimizer)",
        "context": None,
    }
    assert set(ran) == {
        'scaler = torch.amp.GradScaler("cpu")',
        'with torch.autocast("cpu", dtype=torch.float16):',
        "scaler.scale(loss).backward()",
        "scaler.step(optimizer)",
        "scaler.update()",
    }


@pytest.mark.slow
def test_a_run_to_the_end_runs_the_checkpoint_save_too(tree):
    args = ("--steps", "20", "--device", "cpu", "--format", "json", "--", "python", "train.py")
    coverage = json.loads(verify(tree, *args).output)["coverage"]
    assert coverage["not_run"] == []
    assert '"amp": scaler.state_dict(),' in {entry["text"] for entry in coverage["ran"]}


@pytest.mark.slow
def test_each_torchrun_rank_watches_its_own_lines(tmp_path: Path):
    from .test_verify_distributed import DDP_TRAIN

    (tmp_path / "train.py").write_text(DDP_TRAIN)
    command = ("torchrun", "--nproc-per-node", "2", "train.py", "--iterations", "3")
    result = verify(tmp_path, "--steps", "3", "--device", "cpu", "--format", "json", "--", *command)
    document = json.loads(result.output)
    assert document["passed"], document["message"]
    ran = {entry["text"] for entry in document["coverage"]["ran"]}
    assert {"scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"} <= ran
    assert document["coverage"]["not_run"] == []
