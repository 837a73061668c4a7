"""`amp-migrate verify` itself, end to end, on a sample of the equivalence programs: one of each
verdict a correct migration earns. tests/equivalence/test_verify_verdict_on_every_program.py
judges every program's recorded runs the same way; this shows the command reaching the same
verdicts from the user's side (copy, migrate with the project pass, run both, compare)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .test_verify_command import verify

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "fixtures" / "programs" / "equivalence"

SAMPLE = [
    # (program, its arguments, steps, verdict, what the message must say)
    ("convnet_opt_levels.py", ("--opt-level", "O1"), 8, "identical", "8 steps equal bit for bit"),
    ("convnet_opt_levels.py", ("--opt-level", "O3"), 8, "within tolerance", "expected: O3 steps float16"),
    ("gan_num_losses.py", ("--corrupt-step", "3"), 8, "identical", "8 steps equal bit for bit"),
    (
        "static_loss_scale.py",
        ("--steps", "12", "--corrupt-step", "4"),
        10,
        "differs as documented",
        "(AMP111)",
    ),
    ("trainer_package", ("--corrupt-step", "3"), 8, "identical", "8 steps equal bit for bit"),
    # native amp around the shim's FusedLAMB (AMP505): the migrated run may import amp_shim
    ("lamb_and_novograd.py", ("--corrupt-step", "3"), 8, "identical", "8 steps equal bit for bit"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "program, args, steps, kind, says", SAMPLE, ids=[f"{p}-{k.replace(' ', '-')}" for p, _, _, k, _ in SAMPLE]
)
def test_verify_gives_a_correct_migration_of_a_fixture_program_its_verdict(
    tmp_path, program, args, steps, kind, says
):
    source = PROGRAMS / program
    if source.is_dir():
        shutil.copytree(source, tmp_path / "tree")
        script = "main.py"
    else:
        (tmp_path / "tree").mkdir()
        shutil.copy(source, tmp_path / "tree" / program)
        script = program
    command = ["--steps", str(steps), "--device", "cpu", "--format", "json", "--", "python", script, *args]
    result = verify(tmp_path / "tree", *command)
    document = json.loads(result.output)
    assert document["verdict"] == kind, document["message"] + "\n" + json.dumps(document["stderr_tail"])
    assert says in document["message"]
    assert result.exit_code == 0 and document["passed"] is True
    assert document["kept_shim"] == []  # the native migration ran, not the shim
    assert len(document["records"]["native"]) == steps


@pytest.mark.slow
def test_verify_with_unsafe_fixes_says_differs_as_documented_and_without_them_the_program_keeps_the_shim(
    tmp_path,
):
    """Both losses of one step overflow: Apex halved its scale twice, the GradScaler once (entry
    U1). With `--unsafe-fixes` the copy goes native and the verdict names the entry; without,
    the copy keeps the shim and the runs are identical."""
    program = "two_forwards_then_two_scaled_backwards.py"
    (tmp_path / "tree").mkdir()
    shutil.copy(PROGRAMS / program, tmp_path / "tree" / program)
    run = ["--", "python", program, "--fp16", "--corrupt-both-step", "3"]
    flagged = verify(
        tmp_path / "tree", "--steps", "8", "--device", "cpu", "--format", "json", "--unsafe-fixes", *run
    )
    document = json.loads(flagged.output)
    assert document["verdict"] == "differs as documented", document["message"]
    assert "entry U1" in document["message"] and "scales differ" in document["message"]
    assert document["unsafe_fixes"] == ["AMP216"] and document["documented"] == ["U1"]
    assert document["kept_shim"] == [] and flagged.exit_code == 0
    safe = verify(tmp_path / "tree", "--steps", "8", "--device", "cpu", "--format", "json", *run)
    document = json.loads(safe.output)
    assert document["verdict"] == "identical" and document["kept_shim"] == [program], document["message"]
    assert document["unsafe_fixes"] == [] and document["documented"] == []
