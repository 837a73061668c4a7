"""The bundled legacy project that README's first command migrates: every Apex file changes,
native where provable, the fp16_utils script on the shim, the notebook still valid; its
requirements.txt then names amp-migrate instead of Apex, and its Dockerfile's Apex build is
reported as no longer needed."""

import ast
import json
import shutil
from pathlib import Path

import nbformat

from .conftest import run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "examples" / "legacy_project"


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
