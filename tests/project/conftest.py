"""Project fixtures copied into a temporary folder, and the command line run on them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from amp_migrate.cli.main import main

PROJECTS = Path(__file__).resolve().parents[2] / "fixtures" / "projects"
OUTPUTS = PROJECTS.parent / "project_outputs"


@pytest.fixture
def tree(tmp_path):
    """`tree("checkpoint_helper")`: a copy of that fixture tree, its path."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(PROJECTS / name, target)
        return target

    return copy


def run_json(root: Path, *args: str) -> dict:
    """`amp-migrate --format json ARGS .` in `root`: the document, with files by path."""
    old = os.getcwd()
    os.chdir(root)
    try:
        result = CliRunner().invoke(main, ["--format", "json", "-j", "1", *args, "."], catch_exceptions=False)
    finally:
        os.chdir(old)
    document = json.loads(result.stdout)
    document["by_path"] = {f["path"]: f for f in document["files"]}
    document["exit"] = result.exit_code
    return document


def codes(entry: dict) -> list[str]:
    return [d["code"] for d in entry["diagnostics"]]


def sources(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}


def _diagnostics(results) -> str:
    return "".join(
        f"{path}: {' '.join(d.code for d in r.diagnostics)}\n"
        for path, r in sorted(results.items())
        if r.diagnostics
    )


def assert_project_golden(name: str) -> None:
    """`migrate_project` on fixtures/projects/<name> gives fixtures/project_outputs/<name>: the
    changed modules and diagnostics.txt (AMP_MIGRATE_UPDATE_GOLDEN=1 rewrites them; read every
    changed output before committing)."""
    from amp_migrate.project import migrate_project

    results = migrate_project(sources(PROJECTS / name))
    expected = OUTPUTS / name
    changed = {p: r.code for p, r in results.items() if r.changed}
    if os.environ.get("AMP_MIGRATE_UPDATE_GOLDEN") == "1":
        for path, code in changed.items():
            (expected / path).parent.mkdir(parents=True, exist_ok=True)
            (expected / path).write_text(code)
        (expected / "diagnostics.txt").write_text(_diagnostics(results))
    stored = {str(p.relative_to(expected)): p.read_text() for p in expected.rglob("*.py")}
    assert changed == stored
    assert _diagnostics(results) == (expected / "diagnostics.txt").read_text()
