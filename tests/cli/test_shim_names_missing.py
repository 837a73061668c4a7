"""A file whose Apex names the shim lacks is an error where the file spells them: nothing is
written, `--check` fails, the summary counts it, JSON says so."""

import json
import re

from .conftest import SHIM_INPUT, run_cli, snapshot, write

OLD_FP16_OPTIMIZER = (
    "import torch\n"
    "if args.fp16:\n"
    "    from apex.optimizers import FP16_Optimizer, FusedAdam\n"
    "    optimizer = FusedAdam(params, lr=1e-4, bias_correction=False,\n"
    "                          max_grad_norm=1.0)\n"
    "    optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n"
)


def test_check_fails_with_errors_at_the_lines_that_use_what_the_shim_lacks(project):
    write(project / "train.py", OLD_FP16_OPTIMIZER)
    write(project / "ok.py", SHIM_INPUT)
    before = snapshot(project)
    result = run_cli(["--check", "--target", "shim", "."], project)
    assert result.exit_code == 2, result.output
    assert snapshot(project) == before
    lines = result.output.splitlines()
    assert any(
        re.match(r"train\.py:3:33: AMP470 `apex\.optimizers\.FP16_Optimizer`", line) for line in lines
    ), result.output
    assert any(
        re.match(r"train\.py:5:27: AMP471 `FusedAdam\(\.\.\., max_grad_norm=\.\.\.\)`", line)
        for line in lines
    ), result.output
    assert not any(":0:0:" in line for line in lines)
    (errors,) = [line for line in lines if line.startswith("Errors")]
    assert errors.split()[-1] == "1", errors


def test_fix_leaves_such_a_file_untouched_and_exits_2(project):
    write(project / "train.py", OLD_FP16_OPTIMIZER)
    result = run_cli(["--target", "auto", "train.py"], project)
    assert result.exit_code == 2, result.output
    assert (project / "train.py").read_text() == OLD_FP16_OPTIMIZER


def test_json_reports_the_error_with_its_place(project):
    write(project / "m.py", "from apex.reparameterization import apply_weight_norm\n")
    result = run_cli(["--check", "--format", "json", "--target", "shim", "m.py"], project)
    assert result.exit_code == 2
    document = json.loads(result.output)
    (entry,) = document["files"]
    (finding,) = [d for d in entry["diagnostics"] if d["code"] == "AMP470"]
    assert (finding["line"], finding["col"], finding["severity"]) == (1, 6, "error")
    assert document["summary"]["errors"] == 1
