"""`amp-migrate verify` catches a broken migration and points at the statements to look at.

Each test breaks the migrated copy the way a hand edit or a codemod bug would (by editing what
the project migration returns, so the user's tree stays legacy Apex), runs `verify` on CPU for a
few steps, and checks the verdict and the location: the migrated line that ran wrong for the
diverging step, or the original line whose migration never ran. (`unscale_` dropped before a
clip: tests/runs/test_verify_command.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_verify_command import break_migration, verify

#: A legacy Apex O1 script whose fourth batch holds an inf (a corrupt sample): Apex skips that
#: step and halves the loss scale.
CORRUPT_BATCH = '''\
"""A small legacy Apex O1 regressor; one batch holds an inf."""
import torch
import torch.nn as nn
from apex import amp

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(8):
    x = torch.randn(16, 8)
    if it == 3:
        x[0, 0] = float("inf")
    y = x.sum(dim=1, keepdim=True)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
'''

#: Trains, checkpoints with `amp.state_dict()`, then resumes in one process: a fresh model,
#: optimizer and amp state that load the checkpoint and train on. The first step overflows at
#: Apex's initial scale, so the saved scale is not the one a fresh scaler starts with.
RESUME = '''\
"""A legacy Apex O1 script that saves a checkpoint and resumes from it."""
import torch
import torch.nn as nn
from apex import amp


def batch(phase, it):
    gen = torch.Generator().manual_seed(100 * phase + it)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


for phase in range(2):
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    if phase == 1:
        checkpoint = torch.load("checkpoint.pt")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
    for it in range(3):
        x, y = batch(phase, it)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        print("phase {} it {} loss {}".format(phase, it, loss.item()))
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}
    torch.save(state, "checkpoint.pt")
'''


def line_of(code: str, fragment: str) -> int:
    """The 1-based number of the only line of `code` holding `fragment`."""
    lines = [number for number, line in enumerate(code.splitlines(), 1) if fragment in line]
    assert len(lines) == 1, (fragment, lines)
    return lines[0]


def verify_json(tree: Path, steps: int, script: str) -> dict:
    result = verify(
        tree, "--steps", str(steps), "--device", "cpu", "--format", "json", "--", "python", script
    )
    assert result.exit_code == 1, result.output
    document = json.loads(result.output)
    assert document["verdict"] == "diverged" and document["exit_codes"] == {"shim": 0, "native": 0}
    return document


@pytest.mark.slow
def test_step_and_update_moved_under_a_finite_loss_guard_never_back_off_and_point_at_update(
    tmp_path, monkeypatch
):
    # The guard keeps the native run going (GradScaler refuses a second step without update(),
    # so a guard around update() alone would crash instead), but on the corrupt batch neither
    # the skipped step nor the backoff happens: the next step differs in what was skipped.
    (tmp_path / "train.py").write_text(CORRUPT_BATCH)
    broken = break_migration(
        monkeypatch,
        "    scaler.step(optimizer)\n    scaler.update()\n",
        "    if torch.isfinite(loss):\n        scaler.step(optimizer)\n        scaler.update()\n",
    )
    document = verify_json(tmp_path, 6, "train.py")
    divergence = document["first_divergence"]
    assert divergence == {"step": 4, "quantity": "skipped", "shim": True, "native": False}
    assert document["records"]["shim"][3]["scales"] != document["records"]["native"][3]["scales"]
    location = document["location"]
    assert location["step"] == 4
    ran = {(site["call"], site["line"]): site for site in location["ran"]}
    update = ran[("scaler.update", line_of(broken["code"], "scaler.update()"))]
    assert update["changed"] is True and update["text"] == "scaler.update()"
    guard = line_of(broken["code"], "if torch.isfinite(loss):")
    assert update["note"] == f"under `if torch.isfinite(loss):` (line {guard}), which the migration wrote"
    # The native step 4 ran two iterations' forwards and scales: a step was missing before it.
    assert ran[("scaler.scale", line_of(broken["code"], "scaler.scale(loss)"))]["times"] == 2
    assert ran[("scaler.step", line_of(broken["code"], "scaler.step(optimizer)"))]["times"] == 1


@pytest.mark.slow
def test_autocast_dropped_from_the_forward_diverges_at_the_first_step_and_points_at_the_forward(
    tmp_path, monkeypatch
):
    (tmp_path / "train.py").write_text(CORRUPT_BATCH)
    # The migration autocasts the CPU forward in float16 (--dtype's default), as the shim's O1 does.
    with_autocast = '    with torch.autocast("cpu", dtype=torch.float16):\n        loss = '
    broken = break_migration(monkeypatch, with_autocast, "    loss = ")
    document = verify_json(tmp_path, 3, "train.py")
    assert document["first_divergence"]["step"] == 1
    assert document["first_divergence"]["quantity"] in ("skipped", "losses")
    forward = line_of(broken["code"], "loss = nn.functional.mse_loss")
    [site] = [site for site in document["location"]["ran"] if site["line"] == forward]
    assert site["call"] == "forward (no autocast)"
    assert site["note"] == "the original's forward here ran with autocast cpu float16"
    assert not any(site["call"].startswith("torch.autocast") for site in document["location"]["ran"])


@pytest.mark.slow
def test_a_faithful_migration_of_a_resume_in_one_process_is_identical(tmp_path):
    # The resumed phase builds a second GradScaler; the step records follow the newest one, as
    # the shim's follow the newest amp.initialize, so the faithful migration is bit for bit.
    (tmp_path / "train.py").write_text(RESUME)
    document = json.loads(
        verify(
            tmp_path, "--steps", "6", "--device", "cpu", "--format", "json", "--", "python", "train.py"
        ).output
    )
    assert document["verdict"] == "identical", document["message"]
    assert document["location"] is None
    # The saved scale is not a fresh scaler's: a scaler left unrestored must show.
    assert document["records"]["shim"][3]["scales"] == [16384.0]


@pytest.mark.slow
def test_a_scaler_not_restored_from_the_checkpoint_diverges_after_resume_and_names_the_load(
    tmp_path, monkeypatch
):
    (tmp_path / "train.py").write_text(RESUME)
    broken = break_migration(monkeypatch, '        scaler.load_state_dict(checkpoint["amp"])\n', "")
    result = verify(tmp_path, "--steps", "6", "--device", "cpu", "--", "python", "train.py")
    assert result.exit_code == 1, result.output
    assert "diverged at step 4:" in result.output  # the first step after the resume
    load = line_of(RESUME, 'amp.load_state_dict(checkpoint["amp"])')
    expected = (
        f'train.py:{load} amp.load_state_dict: amp.load_state_dict(checkpoint["amp"])  '
        "-> no scaler.load_state_dict ran; migrated: deleted after line "
        f"{line_of(broken['code'], 'optimizer.load_state_dict(checkpoint')}\n"
    )
    assert expected in result.output
