"""The bundled legacy project that README's first command migrates: every Apex file changes,
native where provable, the fp16_utils script on the shim, the notebook still valid."""

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
    }
    assert document["summary"]["files"] == 5
    nbformat.validate(nbformat.read(copy / "explore.ipynb", as_version=nbformat.NO_CONVERT))
    for path in copy.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m and m.split(".")[0] == "apex"], path
