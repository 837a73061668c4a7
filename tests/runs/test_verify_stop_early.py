"""`amp-migrate verify` stops at a legacy run that failed before its first step: with nothing
to compare it with, the migrated run is not started, and the failure is reported at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_verify_command import verify, verify_text_and_json

#: Logs where it runs from (its own file: the original tree or the migrated copy), then fails
#: before training, as a script whose data is missing does.
FAILS_BEFORE_TRAINING = """\
import os
import sys

import torch
from apex import amp

with open(sys.argv[1], "a") as log:
    log.write(os.path.abspath(__file__) + "\\n")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
raise FileNotFoundError("data/train.csv")
"""


@pytest.mark.slow
def test_a_legacy_run_failing_before_its_first_step_never_starts_the_migrated_run_in_text_and_json(
    tmp_path: Path, monkeypatch
):
    """Was two tests, a text and a JSON verify of the same run; one run now, both renderings
    (the log of started programs is that one run's: the original, once)."""
    tree, log = tmp_path / "tree", tmp_path / "started.log"
    tree.mkdir()
    (tree / "train.py").write_text(FAILS_BEFORE_TRAINING)
    args = ("--steps", "3", "--device", "cpu", "--", "python", "train.py", str(log))
    result, as_json = verify_text_and_json(monkeypatch, tree, *args)
    assert result.exit_code == 1, result.output
    assert log.read_text().splitlines() == [str(tree / "train.py")]  # the original only
    assert (
        "the legacy run (shim) failed (exit 1) before its first step; the migrated run was not started"
        in result.output
    )
    assert "FileNotFoundError: data/train.csv" in result.output  # its stderr tail
    # The JSON says the migrated run was not started.
    document = json.loads(as_json.output)
    assert document["verdict"] == "run failed" and document["exit_code"] == 1
    assert document["started"] == {"shim": True, "native": False}
    assert document["exit_codes"] == {"shim": 1, "native": None}
    assert "FileNotFoundError: data/train.csv" in document["stderr_tail"]["shim"]


@pytest.mark.slow
def test_every_torchrun_rank_failing_before_its_first_step_never_starts_the_migrated_ranks(tmp_path: Path):
    tree, log = tmp_path / "tree", tmp_path / "started.log"
    tree.mkdir()
    (tree / "train.py").write_text(FAILS_BEFORE_TRAINING)
    command = ("torchrun", "--nproc-per-node", "2", "train.py", str(log))
    result = verify(tree, "--steps", "3", "--device", "cpu", "--format", "json", "--", *command)
    document = json.loads(result.output)
    assert result.exit_code == 1
    assert sorted(log.read_text().splitlines()) == [str(tree / "train.py")] * 2  # two original ranks
    assert [rank["exit_codes"]["native"] for rank in document["ranks"]] == [None, None]
    assert "before its first step; the migrated run was not started" in document["message"]
