"""`amp-migrate verify` on a tree whose migration keeps some files on the shim: the migrated run
is recorded by what its code used, not by whether any file of the copy stayed on the shim. A
native training script beside an unrelated shim file verifies as it does alone; a script that
runs on the shim itself still verifies identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_verify_command import verify

#: Native-migratable: amp.initialize O1, amp.scale_loss (GradScaler, autocast once migrated).
TRAIN = """\
import torch
import torch.nn as nn
from apex import amp

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(6):
    x = torch.randn(16, 8)
    y = x.sum(dim=1, keepdim=True)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
"""

#: Kept on the shim by the migration (AMP461: an FP16_Optimizer flow over network_to_half's model).
EVAL_TOOL = '''\
"""Evaluates a checkpoint in half precision."""
import torch
from apex.fp16_utils import FP16_Optimizer, network_to_half


def evaluate(model):
    model = network_to_half(model)
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.0), dynamic_loss_scale=True)
    return model, optimizer
'''

ARGS = ("--steps", "3", "--device", "cpu", "--format", "json", "--", "python", "train.py")


def _tree(root: Path, **files: str) -> Path:
    root.mkdir()
    for name, text in files.items():
        (root / f"{name}.py").write_text(text)
    return root


@pytest.mark.slow
def test_a_native_script_beside_an_unrelated_shim_file_verifies_as_it_does_alone(tmp_path: Path):
    mixed = json.loads(verify(_tree(tmp_path / "mixed", train=TRAIN, eval_tool=EVAL_TOOL), *ARGS).output)
    alone = json.loads(verify(_tree(tmp_path / "alone", train=TRAIN), *ARGS).output)
    assert mixed["verdict"] == "identical", mixed["message"]
    assert mixed["message"] == alone["message"] == "identical: 3 steps equal bit for bit"
    assert mixed["records"] == alone["records"]


@pytest.mark.slow
def test_a_script_kept_on_the_shim_by_the_file_it_imports_verifies_identical(tmp_path: Path):
    train = "import eval_tool  # the half-precision evaluation\n" + TRAIN
    tree = _tree(tmp_path / "tree", train=train, eval_tool=EVAL_TOOL)
    document = json.loads(verify(tree, *ARGS).output)
    assert document["verdict"] == "identical", document["message"]
    assert document["message"] == "identical: 3 steps equal bit for bit"
    assert [r["scales"] for r in document["records"]["native"]] == [[32768.0], [16384.0], [16384.0]]
