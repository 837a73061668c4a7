"""Project fixtures copied into a temporary folder, and the command line run on them."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from amp_migrate.cli import main

PROJECTS = Path(__file__).resolve().parents[2] / "fixtures" / "projects"


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
        result = CliRunner().invoke(main, ["--format", "json", "-j", "1", *args, "."],
                                    catch_exceptions=False)
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
