"""Checkpoint conversion (`amp_migrate.checkpoints.convert`): Apex formats to what migrated code loads,
every other entry untouched, unsafe pickles refused unless asked for, and a resume across the
migration that continues bit for bit."""

from __future__ import annotations

import os
import sys
import types
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from amp_migrate import migrate_source
from amp_migrate.checkpoints.convert import (
    CheckpointError,
    convert,
    fused_step_to_torch,
    load,
    save_atomically,
)
from forked_runs import launch

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "fixtures" / "programs" / "resume_legacy.py"
APEX_STATE = OrderedDict([("loss_scaler0", {"loss_scale": 32768.0, "unskipped": 17})])


def checkpoint():
    return {
        "model": {"w": torch.arange(4.0)},
        "optimizer": {"state": {}, "param_groups": []},
        "amp": APEX_STATE,
        "epoch": 3,
    }


def test_amp_entry_becomes_grad_scaler_state_and_nothing_else_changes():
    before = checkpoint()
    after, changes = convert(before)
    assert after["amp"] == {
        "scale": 32768.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "_growth_tracker": 17,
    }
    assert torch.equal(after["model"]["w"], before["model"]["w"])
    assert after["epoch"] == 3 and after["optimizer"] == before["optimizer"]
    assert list(after) == list(before)
    assert before["amp"] is APEX_STATE  # the input is not modified
    assert [c.where for c in changes] == ["['amp']"]


def test_converted_state_loads_into_a_grad_scaler():
    after, _ = convert(checkpoint())
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(after["amp"])
    assert scaler.get_scale() == 32768.0 and scaler._init_growth_tracker == 17


def test_amp_state_under_another_key_is_found():
    after, changes = convert({"scaler_state": APEX_STATE, "step": 5})
    assert after["scaler_state"]["scale"] == 32768.0 and after["step"] == 5
    assert changes[0].where == "['scaler_state']"


def test_a_file_that_is_just_amp_state_dict_converts_whole():
    after, changes = convert(APEX_STATE)
    assert after["_growth_tracker"] == 17 and len(changes) == 1


def test_several_loss_scalers_are_refused_naming_the_options():
    state = OrderedDict(
        [
            ("loss_scaler0", {"loss_scale": 8.0, "unskipped": 1}),
            ("loss_scaler1", {"loss_scale": 4.0, "unskipped": 2}),
        ]
    )
    with pytest.raises(CheckpointError, match="--index") as info:
        convert({"amp": state})
    assert "shim" in str(info.value)
    after, _ = convert({"amp": state}, index=1)
    assert after["amp"]["scale"] == 4.0


def test_grad_scaler_state_converts_back_to_apex_exactly():
    torch_state, _ = convert(checkpoint())
    back, changes = convert(torch_state, to="apex")
    assert back["amp"] == {"loss_scaler0": {"loss_scale": 32768.0, "unskipped": 17}}
    assert changes and back["epoch"] == 3


def test_nothing_to_convert_reports_no_changes():
    after, changes = convert({"model": {"w": torch.ones(1)}})
    assert changes == [] and torch.equal(after["model"]["w"], torch.ones(1))


def _adamw_run(steps, state=None):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.0)
    if state is not None:
        opt.load_state_dict(state)
    for i in range(steps):
        opt.zero_grad()
        (params[0].sum() * (i + 1) + params[1].pow(2).sum()).backward()
        opt.step()
    return params, opt


def fused_adam_layout(torch_state):
    """What FusedAdam saved: `step` once per param group, not per parameter (in the group's dict)."""
    state = {
        "state": {
            k: {n: v.clone() for n, v in s.items() if n != "step"} for k, s in torch_state["state"].items()
        },
        "param_groups": [
            {k: g[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "params")}
            | {"bias_correction": True}
            for g in torch_state["param_groups"]
        ],
    }
    for group in state["param_groups"]:
        group["step"] = int(torch_state["state"][group["params"][0]]["step"].item())
    return state


@pytest.mark.slow
def test_fused_adam_state_loads_into_torch_adamw_after_conversion():
    _, opt = _adamw_run(3)
    apex_state = fused_adam_layout(opt.state_dict())
    with pytest.raises(KeyError):
        torch.optim.AdamW(
            [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))]
        ).load_state_dict(apex_state)
    after, changes = convert({"optimizer": apex_state})
    assert "2 parameter states" in changes[0].what
    assert fused_step_to_torch(after["optimizer"]) == 0  # already torch's layout
    assert all(group["fused"] is True for group in after["optimizer"]["param_groups"])
    resumed = torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))], fused=True
    )
    resumed.load_state_dict(after["optimizer"])
    assert resumed.param_groups[0]["fused"] is True
    for k, s in opt.state_dict()["state"].items():
        for name, value in s.items():
            assert torch.equal(after["optimizer"]["state"][k][name], value), name


def test_unsafe_pickle_is_refused_unless_asked_for(tmp_path, monkeypatch):
    """FP16_Optimizer.state_dict() pickles Apex's LossScaler object; saved here under a fake
    `apex` package that is gone again when the file is read, as on a machine without Apex."""
    module = types.ModuleType("apex.amp.scaler")

    class LossScaler:
        def __init__(self):
            self._loss_scale = 512.0
            self._unskipped = 9
            self.dynamic = True

    LossScaler.__module__ = "apex.amp.scaler"
    LossScaler.__qualname__ = "LossScaler"
    module.LossScaler = LossScaler
    with monkeypatch.context() as fake:
        fake.setitem(sys.modules, "apex", types.ModuleType("apex"))
        fake.setitem(sys.modules, "apex.amp", types.ModuleType("apex.amp"))
        fake.setitem(sys.modules, "apex.amp.scaler", module)
        fp16_optimizer_state = {
            "loss_scaler": LossScaler(),
            "dynamic_loss_scale": True,
            "overflow": False,
            "first_closure_call_this_step": True,
            "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "fp32_from_fp16": [[torch.ones(2)]],
        }
        path = tmp_path / "fp16.pt"
        torch.save({"optimizer": fp16_optimizer_state, "model": {"w": torch.ones(2).half()}}, path)
    assert "apex" not in sys.modules
    with pytest.raises(CheckpointError, match="--unsafe-load"):
        load(path)
    loaded = load(path, unsafe=True)
    after, changes = convert(loaded)
    assert after["optimizer"] == {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    assert after["optimizer_scaler"]["scale"] == 512.0 and after["optimizer_scaler"]["_growth_tracker"] == 9
    assert torch.equal(after["optimizer_fp32_from_fp16"][0][0], torch.ones(2))
    assert len(changes) == 3


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "out.pt"
    save_atomically({"a": torch.ones(1)}, target)
    assert torch.equal(torch.load(target)["a"], torch.ones(1))
    assert [p.name for p in tmp_path.iterdir()] == ["out.pt"]


# Resume across the migration ---------------------------------------------------------------


def _run(args, cwd, shim=False):
    """`python [-m amp_shim] ARGS` in `cwd`, forked from a fork server that already imported
    torch (tests/forked_runs.py); its stdout."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc, stdout, stderr = launch([str(a) for a in args], shim=shim, env=env, cwd=cwd, timeout=120)
    assert rc == 0, stderr
    return stdout


@pytest.mark.parametrize("level", ["O1", "O0"])
@pytest.mark.slow
def test_shim_checkpoint_resumes_in_the_migrated_native_program_bit_for_bit(tmp_path, level):
    legacy = PROGRAM.read_text()
    native = migrate_source(legacy, target="native", device="cpu")
    assert native.target_used == "native"
    native_program = tmp_path / "resume_native.py"
    native_program.write_text(native.code)
    opts = ["--opt-level", level]

    full = _run([PROGRAM, *opts, "--steps", "8", "--save", tmp_path / "full.pt"], tmp_path, shim=True)
    _run([PROGRAM, *opts, "--steps", "5", "--save", tmp_path / "half.pt"], tmp_path, shim=True)
    converted, _ = convert(torch.load(tmp_path / "half.pt", weights_only=True))
    save_atomically(converted, tmp_path / "half_native.pt")
    resumed = _run(
        [
            str(native_program),
            *opts,
            "--start",
            "5",
            "--steps",
            "3",
            "--resume",
            str(tmp_path / "half_native.pt"),
            "--save",
            str(tmp_path / "resumed.pt"),
        ],
        tmp_path,
    )

    assert resumed.splitlines() == [line for line in full.splitlines() if line.startswith("step")][5:]
    want = torch.load(tmp_path / "full.pt", weights_only=True)
    got = torch.load(tmp_path / "resumed.pt", weights_only=True)
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), name
    for index, state in want["optimizer"]["state"].items():
        assert torch.equal(got["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])
    expected_scaler, _ = convert({"amp": want["amp"]})
    if level == "O1":
        assert got["amp"] == expected_scaler["amp"]
        assert got["amp"]["scale"] == 2.0**15  # the overflow at step 3 halved it
    else:
        assert got["amp"] == {}  # a disabled GradScaler saves nothing


# The command ---------------------------------------------------------------------------------


def test_convert_checkpoint_command_writes_the_converted_file_and_says_what_changed(tmp_path):
    from click.testing import CliRunner

    from amp_migrate.cli.main import main

    source, target = tmp_path / "old.pt", tmp_path / "new.pt"
    torch.save(checkpoint(), source)
    result = CliRunner().invoke(main, ["convert-checkpoint", str(source), str(target)])
    assert result.exit_code == 0, result.output
    assert "['amp']: Apex amp scaler state → GradScaler state" in result.output
    assert torch.load(target, weights_only=True)["amp"]["_growth_tracker"] == 17
    assert torch.load(source, weights_only=True)["amp"] == APEX_STATE  # the source is untouched


def test_convert_checkpoint_refuses_to_overwrite_its_input_unless_in_place(tmp_path):
    from click.testing import CliRunner

    from amp_migrate.cli.main import main

    source = tmp_path / "old.pt"
    torch.save(checkpoint(), source)
    refused = CliRunner().invoke(main, ["convert-checkpoint", str(source), str(source)])
    assert refused.exit_code == 2 and "--in-place" in refused.output
    assert torch.load(source, weights_only=True)["amp"] == APEX_STATE
    done = CliRunner().invoke(main, ["convert-checkpoint", str(source), str(source), "--in-place"])
    assert done.exit_code == 0 and torch.load(source, weights_only=True)["amp"]["scale"] == 32768.0


def test_convert_checkpoint_errors_exit_2_and_write_nothing(tmp_path):
    from click.testing import CliRunner

    from amp_migrate.cli.main import main

    source, target = tmp_path / "old.pt", tmp_path / "new.pt"
    state = OrderedDict(
        [
            ("loss_scaler0", {"loss_scale": 8.0, "unskipped": 1}),
            ("loss_scaler1", {"loss_scale": 4.0, "unskipped": 2}),
        ]
    )
    torch.save({"amp": state}, source)
    result = CliRunner().invoke(main, ["convert-checkpoint", str(source), str(target)])
    assert result.exit_code == 2 and "--index" in result.output and not target.exists()
    assert (
        CliRunner().invoke(main, ["convert-checkpoint", str(source), str(target), "--index", "0"]).exit_code
        == 0
    )
