"""The recorder's migrated mode (`--mode migrated`, verify's run of a copy that keeps some files on
the shim): each run is recorded by what its code used. A program that only uses GradScaler
records what native mode records, even when it imports a shim file; one that only uses the shim
records what shim mode records; `apex` stays unimportable, `amp_shim` does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amp_migrate.runs.recorder import forbidden_imports
from amp_migrate.runs.verify_run import _recorded_exit_code

from .test_recorder_step_records import APEX_O1, MODEL, NATIVE_O1, record

#: A file the migration kept on the shim: it imports amp_shim, the training never calls it.
SHIM_HELPER = """
import torch
from amp_shim.fp16_utils import FP16_Optimizer, network_to_half


def evaluate(model):
    model = network_to_half(model)
    return model, FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.0), dynamic_loss_scale=True)
"""

NATIVE_WITH_SHIM_HELPER = "import shim_helper  # loads amp_shim, never called\n" + NATIVE_O1
SHIM_TARGET_O1 = APEX_O1.replace("from apex import amp", "from amp_shim import amp")

#: GradScaler for one model, the shim's amp (a static scale) for another, in the same loop.
BOTH = (
    MODEL
    + """
from amp_shim import amp

model2 = torch.nn.Linear(8, 4)
optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.05)
model2, optimizer2 = amp.initialize(model2, optimizer2, opt_level="O1", loss_scale=128.0, verbosity=0)
scaler = torch.amp.GradScaler("cpu")
for step in range(3):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    loss2 = torch.nn.functional.mse_loss(model2(x), y)
    optimizer2.zero_grad()
    with amp.scale_loss(loss2, optimizer2) as scaled_loss:
        scaled_loss.backward()
    optimizer2.step()
    print("losses", repr(float(loss)), repr(float(loss2)))
"""
)


def test_a_gradscaler_program_that_imports_a_shim_file_records_as_native_mode_does(tmp_path: Path):
    (tmp_path / "shim_helper.py").write_text(SHIM_HELPER)
    migrated, _ = record(tmp_path, "train", NATIVE_WITH_SHIM_HELPER, "migrated")
    native, _ = record(tmp_path, "alone", NATIVE_O1, "native")
    assert migrated["imported"] == ["amp_shim"] and migrated["amp_used"] == ["GradScaler"]
    # Unscaled losses and GradScaler's scales: shim mode would record the scaled losses.
    assert migrated["step_records"] == native["step_records"]
    assert migrated["step_records"][2]["scales"] == [65536.0]
    assert migrated["precision"] == []


def test_a_program_on_the_shim_alone_records_as_shim_mode_does(tmp_path: Path):
    migrated, _ = record(tmp_path, "shim_target", SHIM_TARGET_O1, "migrated")
    shim, _ = record(tmp_path, "shim_target", SHIM_TARGET_O1, "shim")
    assert migrated["amp_used"] == ["amp_shim"] and migrated["imported"] == ["amp_shim"]
    assert migrated["step_records"] == shim["step_records"]
    assert [r["skipped"] for r in migrated["step_records"]] == [False, False, False, True, False, False]
    assert migrated["amp_calls"] == shim["amp_calls"] and migrated["amp_calls"]["amp.initialize"] == 1


def test_a_program_that_uses_both_records_each_step_by_its_own_hook_and_both_scales(tmp_path: Path):
    migrated, stdout = record(tmp_path, "both", BOTH, "migrated")
    assert migrated["amp_used"] == ["GradScaler", "amp_shim"]
    records = migrated["step_records"]
    assert [r["optimizer"] for r in records] == [0, 1] * 3
    # The GradScaler's scale, then the shim's (static 128) in every record.
    assert all(len(r["scales"]) == 2 and r["scales"][1] == 128.0 for r in records)
    assert records[0]["scales"][0] == 65536.0
    printed = [
        [float(v) for v in line.split()[1:]] for line in stdout.splitlines() if line.startswith("losses")
    ]
    # Unscaled, each by its own scaler: not times 65536, not times 128.
    assert [[a["losses"][0], b["losses"][0]] for a, b in zip(records[::2], records[1::2])] == printed


def test_apex_stays_unimportable(tmp_path: Path):
    _, output = record(tmp_path, "legacy", APEX_O1, "migrated", exit_code=1)
    assert "No module named 'apex' (blocked by the recorder)" in output


@pytest.mark.parametrize("mode", ["migrated", "native"])
def test_apex_imported_past_the_blocker_fails_the_run_with_exit_3(tmp_path: Path, mode):
    source = 'import sys, types\nsys.modules["apex"] = types.ModuleType("apex")\n'
    result, output = record(tmp_path, "sneaky", source, mode, exit_code=3)
    assert result["imported"] == ["apex"] and result["exit_code"] == 0
    assert f"recorder: {mode} run imported ['apex']" in output


def test_only_the_imports_a_mode_forbids_make_a_recorded_exit_code_3(tmp_path: Path):
    assert forbidden_imports("migrated", ["amp_shim"]) == []
    assert forbidden_imports("migrated", ["amp_shim", "apex"]) == ["apex"]
    assert forbidden_imports("native", ["amp_shim"]) == ["amp_shim"]
    assert forbidden_imports("shim", ["amp_shim", "apex"]) == []
    result = tmp_path / "rank0.json"
    result.write_text(json.dumps({"exit_code": 0, "imported": ["amp_shim"]}))
    assert _recorded_exit_code(result, "migrated") == 0
    assert _recorded_exit_code(result, "native") == 3
    result.write_text(json.dumps({"exit_code": 0, "imported": ["amp_shim", "apex"]}))
    assert _recorded_exit_code(result, "migrated") == 3
