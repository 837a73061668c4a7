"""`amp-migrate verify -- python SCRIPT ...` end to end: a legacy Apex O1 script in a temporary
folder runs on the shim and migrated (CPU, a few steps), and the verdict says whether the
migration trains the same. Broken migrations are made by editing what the project migration
returns, so each test shows that verify catches and locates that kind of mistake."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from amp_migrate.cli.main import main
from amp_migrate.runs import verify_run

TRAIN = '''\
"""A small legacy Apex O1 training script: an MLP regressor, gradients clipped."""
import argparse

import torch
import torch.nn as nn
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=12)
parser.add_argument("--device", default="cpu")
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

with open("data/scale.txt") as f:  # a data file: the copy must have it too
    scale = float(f.read())
for it in range(args.iterations):
    x = torch.randn(16, 8) * scale
    y = x.sum(dim=1, keepdim=True)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
'''

NEVER_STEPS = """\
import torch
from apex import amp

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(3):
    loss = model(torch.randn(2, 4)).sum()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    print("it {} loss {}".format(it, loss.item()))
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scale.txt").write_text("0.5\n")
    return tmp_path


def verify(cwd: Path, *args: str):
    """`amp-migrate verify ARGS` in process, in `cwd` (the runs are real subprocesses)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, ["verify", *args], catch_exceptions=False)
    finally:
        os.chdir(old)


def verify_text_and_json(monkeypatch, cwd: Path, *args: str):
    """`amp-migrate verify ARGS` in text, then with `--format json`, both whole CLI invocations
    (parsing, settings, rendering, exit status) that read one verify run: the second is handed the
    outcome of the first, whose arguments it repeats (`--format` only chooses the rendering; with
    no --show-output and no terminal both give the runs a plain progress.Watch). Returns the two
    results."""
    real = verify_run.verify
    done: list = []

    def once(parsed, root, settings, watch=None):
        if not done:
            done.append(((parsed, root, settings), real(parsed, root, settings, watch)))
        assert done[0][0] == (parsed, root, settings), "the JSON verify was asked another run"
        return done[0][1]

    monkeypatch.setattr(verify_run, "verify", once)
    try:
        text = verify(cwd, *args)
        split = args.index("--")
        as_json = verify(cwd, *args[:split], "--format", "json", *args[split:])
    finally:
        monkeypatch.setattr(verify_run, "verify", real)
    assert len(done) == 1
    return text, as_json


def break_migration(monkeypatch, old: str, new: str) -> dict[str, str]:
    """Make the migration return its code with `old` replaced by `new` (which must be there);
    the broken code is left under "code" of the returned dict once verify has migrated the copy."""
    real = verify_run.migrate_project
    broken_code: dict[str, str] = {}

    def broken(files, **options):
        results = real(files, **options)
        for path, result in results.items():
            if old in result.code:
                broken_code["code"] = result.code.replace(old, new)
                results[path] = type(result)(broken_code["code"], result.diagnostics, "native", True)
                return results
        raise AssertionError(f"the migration never wrote {old!r}")

    monkeypatch.setattr(verify_run, "migrate_project", broken)
    return broken_code


@pytest.mark.slow
def test_a_faithful_migration_is_identical_and_leaves_the_tree_alone(tree):
    result = verify(tree, "--steps", "5", "--device", "cpu", "--", "python", "train.py", "--iterations", "8")
    assert result.exit_code == 0, result.output
    assert "identical: 5 steps equal bit for bit" in result.output
    assert "loss legacy" in result.output and "param sum" in result.output  # the side-by-side table
    assert (tree / "train.py").read_text() == TRAIN  # the user's script is not migrated
    assert sorted(p.name for p in tree.iterdir()) == ["data", "train.py"]


@pytest.mark.slow
def test_a_dropped_unscale_before_the_clip_is_caught_at_the_first_clipped_step(tree, monkeypatch):
    break_migration(monkeypatch, "    scaler.unscale_(optimizer)\n", "")
    result = verify(tree, "--steps", "5", "--device", "cpu", "--format", "json", "--", "python", "train.py")
    assert result.exit_code == 1, result.output
    document = json.loads(result.output)
    assert document["verdict"] == "diverged" and document["passed"] is False
    divergence = document["first_divergence"]
    # Step 1 overflows at the initial scale in both runs and is skipped; step 2 clips scaled grads.
    assert [r["skipped"] for r in document["records"]["shim"][:2]] == [True, False]
    assert divergence["step"] == 2 and divergence["quantity"] == "grad_norm"
    assert divergence["shim"] != divergence["native"]
    assert document["exit_codes"] == {"shim": 0, "native": 0}
    assert document["message"].startswith("diverged at step 2: grad_norm")
    # Located: the original's clip over amp.master_params made no unscale_ at step 2, and the
    # line the migration put in its place is the clip alone.
    [missing] = document["location"]["missing"]
    clip = (
        TRAIN.splitlines().index("    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 0.5)") + 1
    )
    assert (missing["call"], missing["file"], missing["original_line"]) == (
        "amp.master_params",
        "train.py",
        clip,
    )
    assert missing["expected"] == ["scaler.unscale_"]
    [migrated] = missing["migrated_text"]
    assert migrated.startswith("torch.nn.utils.clip_grad_norm_((p for group in optimizer.param_groups")


@pytest.mark.slow
def test_a_small_difference_passes_within_rtol_with_its_size_per_quantity(tree, monkeypatch):
    # The migrated copy clips at a max norm 1e-6 larger: every clipped step differs a little.
    break_migration(monkeypatch, '["params"]), 0.5)', '["params"]), 0.5000005)')
    result = verify(
        tree,
        "--steps",
        "4",
        "--device",
        "cpu",
        "--rtol",
        "1e-4",
        "--format",
        "json",
        "--",
        "python",
        "train.py",
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["verdict"], document["passed"]) == ("within tolerance", True)
    largest = document["max_relative_difference"]
    assert 1e-7 < largest["grad_norm"] <= 1e-4 and 0 < largest["param_sum"] <= 1e-4
    assert largest["scales"] == 0.0


@pytest.mark.slow
def test_a_deleted_scaler_update_fails_the_native_run_and_shows_why(tree, monkeypatch):
    # Without update() GradScaler refuses the second step: the run fails, and verify says
    # which run failed and prints the end of its traceback instead of a verdict on the steps.
    break_migration(monkeypatch, "    scaler.update()\n", "")
    result = verify(tree, "--steps", "4", "--device", "cpu", "--", "python", "train.py")
    assert result.exit_code == 1, result.output
    assert "the native run failed (exit 1)" in result.output
    assert "RuntimeError: unscale_() is being called after step()." in result.output
    assert "identical" not in result.output
    # The first step kept its scale (no update), and the location names the original's step,
    # whose migration made no update().
    assert "the runs had already diverged at step 1: scales shim [32768.0], native [65536.0]" in result.output
    step = TRAIN.splitlines().index("    optimizer.step()") + 1
    located = f"train.py:{step} optimizer.step: optimizer.step()  -> no scaler.update ran; migrated: line "
    assert re.search(re.escape(located) + r"\d+: scaler\.step\(optimizer\)\n", result.output), result.output


@pytest.mark.slow
def test_a_script_that_never_steps_is_reported_as_such(tmp_path):
    (tmp_path / "eval_only.py").write_text(NEVER_STEPS)
    result = verify(tmp_path, "--steps", "3", "--device", "cpu", "--", "python", "eval_only.py")
    assert result.exit_code == 1, result.output
    assert "neither run recorded an optimizer step" in result.output


@pytest.mark.slow
def test_a_migrated_copy_that_crashes_is_a_failed_run_with_its_traceback(tree, monkeypatch):
    break_migration(monkeypatch, "scaler.step(optimizer)", "scaler.step(optimiser)")
    result = verify(tree, "--steps", "3", "--device", "cpu", "--", "python", "train.py")
    assert result.exit_code == 1, result.output
    assert "the native run failed (exit 1)" in result.output
    assert "NameError: name 'optimiser' is not defined" in result.output


@pytest.mark.parametrize(
    "command, message",
    [
        (
            ["accelerate", "launch", "train.py"],
            "verify runs `python SCRIPT [ARGS...]` or `torchrun [--standalone] [--nnodes 1] "
            "--nproc-per-node N SCRIPT [ARGS...]`; got `accelerate launch`",
        ),
        (["python", "-m", "train"], "no interpreter options"),
        (["python", "missing.py"], "missing.py: no such script"),
        (["python", "../outside.py"], "must be inside the current directory"),
    ],
)
def test_commands_other_than_python_script_are_usage_errors(tree, command, message):
    (tree.parent / "outside.py").write_text("print('x')\n")
    result = verify(tree, "--device", "cpu", "--", *command)
    assert result.exit_code == 2
    assert message in result.output


def test_a_symlinked_script_inside_the_tree_is_accepted(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "train.py").write_text(TRAIN)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").symlink_to(tmp_path / "shared" / "train.py")
    command = verify_run.parse_command(["python3", "train.py", "--iterations", "2"], tmp_path / "project")
    assert command == verify_run.Command(Path("train.py"), ("--iterations", "2"))


def test_the_copy_skips_version_control_caches_and_virtualenvs_and_keeps_the_rest(tmp_path):
    source, copy = tmp_path / "src", tmp_path / "copy"
    for folder in (".git", ".venv-3.11", "env", "__pycache__", ".pytest_cache", "pkg", "configs"):
        (source / folder).mkdir(parents=True)
    (source / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    (source / "pkg" / "model.py").write_text("x = 1\n")
    (source / "configs" / "run.yaml").write_text("lr: 0.1\n")
    (source / ".env").write_text("A=1\n")
    verify_run.copy_tree(source, copy)
    kept = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    assert kept == [".env", "configs", "configs/run.yaml", "pkg", "pkg/model.py"]


def test_a_temporary_directory_inside_the_tree_is_not_copied_into_itself(tmp_path):
    (tmp_path / "train.py").write_text("x = 1\n")
    (tmp_path / "tmp").mkdir()  # as TMPDIR under the tree would be, before the copy starts
    verify_run.copy_tree(tmp_path, tmp_path / "tmp" / "copy")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "tmp",
        "tmp/copy",
        "tmp/copy/tmp",
        "tmp/copy/train.py",
        "train.py",
    ]


def test_migrating_the_copy_never_writes_through_a_symlink_into_the_original(tmp_path):
    outside = tmp_path / "shared_train.py"
    outside.write_text(TRAIN)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "train.py").symlink_to(outside)
    verify_run.copy_tree(tmp_path / "tree", tmp_path / "copy")
    migration = verify_run.migrate_copy(tmp_path / "copy", verify_run.Settings(device="cpu"))
    assert migration.changed == ("train.py",)
    assert outside.read_text() == TRAIN
    assert "torch.amp.GradScaler" in (tmp_path / "copy" / "train.py").read_text()
