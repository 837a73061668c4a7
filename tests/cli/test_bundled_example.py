"""The bundled legacy project that README's first command migrates: every Apex file changes,
native where provable, the fp16_utils script on the shim, the notebook still valid; its
requirements.txt then names amp-migrate instead of Apex, and its Dockerfile's Apex build is
reported as no longer needed."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .conftest import run_cli, run_process

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "examples" / "legacy_project"


@pytest.mark.slow
def test_bundled_example_migrates_as_the_readme_shows(tmp_path):
    copy = tmp_path / "legacy_project"
    shutil.copytree(EXAMPLE, copy)
    result = run_cli(["--format", "json", "legacy_project"], tmp_path)
    document = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    targets = {Path(f["path"]).name: f["target_used"] for f in document["files"] if f["written"]}
    assert targets == {
        "explore.ipynb": "native",
        "finetune_fp16.py": "shim",
        "model.py": "native",
        "train.py": "native",
        "requirements.txt": None,
    }
    assert document["summary"]["files"] == 7
    assert document["summary"]["dependency_files"] == 1
    assert (copy / "requirements.txt").read_text().splitlines()[-1] == "amp-migrate"
    (dockerfile,) = [f for f in document["files"] if f["kind"] == "dockerfile"]
    assert [(d["code"], d["line"]) for d in dockerfile["diagnostics"]] == [("AMP084", 4)]
    assert "no longer needed" in dockerfile["diagnostics"][0]["message"]
    assert (copy / "Dockerfile").read_bytes() == (EXAMPLE / "Dockerfile").read_bytes()
    nbformat.validate(nbformat.read(copy / "explore.ipynb", as_version=nbformat.NO_CONVERT))
    for path in copy.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m and m.split(".")[0] == "apex"], path


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.slow
def test_bundled_examples_evaluation_is_named_as_running_in_float32_natively(tmp_path):
    """train.py evaluates on held-out data outside the training forward: Apex O1 ran that in
    float16, the migrated script in float32, and AMP170 says so at the evaluation's forward."""
    copy = tmp_path / "legacy_project"
    shutil.copytree(EXAMPLE, copy)
    result = run_cli(["--check", "--format", "json", "legacy_project"], tmp_path)
    document = json.loads(result.stdout)
    found = [
        (Path(f["path"]).name, d["line"], d["message"])
        for f in document["files"]
        for d in f["diagnostics"]
        if d["code"] == "AMP170"
    ]
    assert [(name, line) for name, line, _ in found] == [
        ("train.py", _line_of(EXAMPLE / "train.py", "logits = model(x)"))
    ]
    assert "natively it runs in float32" in found[0][2]
    assert 'the training region has `enabled=args.opt_level != "O0"`' in found[0][2]


@pytest.mark.slow
def test_bundled_example_trains_and_evaluates_after_a_native_migration(tmp_path):
    copy = tmp_path / "legacy_project"
    shutil.copytree(EXAMPLE, copy)
    assert run_cli(["--device", "cpu", "legacy_project/train.py"], tmp_path).exit_code == 0
    assert 'torch.autocast("cpu", dtype=torch.float16' in (copy / "train.py").read_text()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "train.py", "--steps", "30"], cwd=copy, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    losses = [float(v) for v in re.findall(r"step +\d+  loss (\d+\.\d+)", proc.stdout)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0]
    assert re.search(r"held-out loss \d+\.\d+  accuracy 0\.\d+", proc.stdout)
    assert "'scale': 65536.0" in proc.stdout


README = EXAMPLE.parents[2] / "README.md"


def _tour(command: str) -> list[str]:
    """The README tour's capture of `$ COMMAND`: its shown lines, less `...` and the exit code."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```text\n\$ " + re.escape(command) + r"\n(.*?)\n```", text, re.S)
    assert block, f"README.md has no captured `{command}`"
    return [line for line in block.group(1).splitlines() if line not in ("...", "1", "0")]


@pytest.mark.slow
def test_readme_tour_shows_lines_of_the_real_check_and_diff_output():
    """The tour shortens each capture with `...`; every line it keeps is the command's own output,
    in its order, so a changed message or rewrite shows up as a stale README."""
    for args, shell_tail, exit_code in (
        (["--check", "fixtures/examples/legacy_project"], "; echo $?", 1),
        (["--diff", "fixtures/examples/legacy_project/model.py"], "", 0),
    ):
        shown = _tour(" ".join(["amp-migrate", *args]) + shell_tail)
        real = run_process(args, README.parent)
        assert real.returncode == exit_code, real.stderr
        lines = iter((real.stdout + real.stderr).splitlines())
        missing = [line for line in shown if not any(line == got for got in lines)]
        assert not missing, f"README tour lines not in `amp-migrate {' '.join(args)}`: {missing}"
