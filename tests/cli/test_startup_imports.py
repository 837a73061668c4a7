"""What a start of the command imports: `--version` and `--check` over files that never spell
Apex (what pre-commit and editors run on every save) import neither libcst nor the rules nor
torch; `--version` not even rich. Read from the process itself (`python -X importtime`), so
the test proves the structure, not a timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import NO_APEX, write

#: Never needed before a file is found that may use Apex (or a command that needs them runs).
CODEMOD = ("libcst", "amp_migrate.rules", "amp_migrate.migrate", "amp_migrate.io.notebook")
OTHERS = ("torch", "nbformat", "amp_shim", "pygments")


def imported(args: list[str], cwd: Path) -> set[str]:
    """Every module the command `python -m amp_migrate ARGS` imported, as `-X importtime`
    lists them on stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "amp_migrate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    names = {
        line.rpartition("|")[2].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "amp_migrate.cli.main" in names or "click" in names, proc.stderr[-3000:]
    return names


def loaded(names: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in packages))


def test_importing_the_cli_module_imports_no_codemod_rich_or_torch():
    code = (
        "import sys, amp_migrate.cli.main; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('libcst', 'rich', 'torch', 'nbformat') "
        "or m.startswith(('amp_migrate.rules', 'amp_migrate.migrate', 'amp_shim'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_version_imports_neither_the_codemod_nor_rich_nor_torch(tmp_path):
    names = imported(["--version"], tmp_path)
    assert loaded(names, CODEMOD + OTHERS + ("rich",)) == []


@pytest.mark.parametrize("extra", [[], ["--format", "json"], ["--diff"]])
@pytest.mark.slow
def test_check_of_a_file_without_apex_imports_neither_the_codemod_nor_torch(tmp_path, extra):
    write(tmp_path / "train.py", NO_APEX)
    names = imported(["--check", *extra, "train.py"], tmp_path)
    assert loaded(names, CODEMOD + OTHERS) == []


@pytest.mark.slow
def test_check_of_a_file_with_apex_still_imports_the_codemod(tmp_path):
    write(tmp_path / "train.py", "from apex import amp\nmodel = amp.initialize(model)\n")
    names = imported(["--check", "--target", "shim", "train.py"], tmp_path)
    assert {"libcst", "amp_migrate.migrate", "amp_migrate.rules"} <= names
