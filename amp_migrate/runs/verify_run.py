"""`amp-migrate verify`: migrate a copy of the user's tree and run both versions, recorded.

The original program runs as it is, through the shim's `apex` alias, in the current
directory; the migrated program runs from a temporary copy of the tree (data and config files
included, so relative paths resolve as they do in the original). Both go through the same
recorder the equivalence tests use, with the same command line, seed, step limit and
environment, one after the other; `compare.judge` gives the verdict.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..project import migrate_project
from .compare import Run, Verdict, judge
from .locate import Location, changed_sources, locate

RECORDER = Path(__file__).with_name("recorder.py")
SUPPORTED = "python SCRIPT [ARGS...]"
#: Folders that are no part of the program: version control, caches, virtual environments.
_SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")
#: The shim's alias switches: the shim run sets its own, the native run must not inherit one.
_ALIAS_VARIABLES = ("AMP_SHIM_ALIAS", "AMP_SHIM_ALIAS_ANNOUNCED")


class UsageProblem(ValueError):
    """A command line `verify` cannot run (the CLI reports it as a usage error, exit 2)."""


@dataclass(frozen=True)
class Command:
    script: Path  # relative to the tree's root
    args: tuple[str, ...]


@dataclass(frozen=True)
class Settings:
    steps: int = 20
    device: str = "cuda"
    dtype: str = "float16"
    target: str = "auto"
    rtol: Optional[float] = None  # None: bit for bit, or compare.PRECISION_RTOL (see compare.judge)


@dataclass(frozen=True)
class Migration:
    changed: tuple[str, ...]  # files of the copy that the migration rewrote, relative paths
    shim_files: tuple[str, ...]  # those rewritten to the shim rather than to native torch.amp


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    shim: Run
    native: Run
    migration: Migration
    command: Command
    # The statements to look at where the runs diverged (None when they did not).
    location: Optional[Location] = None


def parse_command(command: Sequence[str], root: Path) -> Command:
    """`python SCRIPT ARGS...` with SCRIPT a file in the tree; anything else is a usage problem."""
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        shown = " ".join(command[:2]) or "nothing"
        raise UsageProblem(f"verify runs `{SUPPORTED}` (one process); got `{shown}`")
    if len(command) < 2 or command[1].startswith("-"):
        raise UsageProblem(f"verify runs `{SUPPORTED}`: a script path after python, no interpreter options")
    absolute = Path(os.path.normpath(root / command[1]))  # a symlinked script stays in the tree
    if not absolute.is_file():
        raise UsageProblem(f"{command[1]}: no such script")
    try:
        relative = absolute.relative_to(root)
    except ValueError:
        raise UsageProblem(f"{command[1]}: the script must be inside the current directory") from None
    return Command(relative, tuple(command[2:]))


def _ignored(directory: str, names: list[str]) -> list[str]:
    return [
        name
        for name in names
        if name in _SKIPPED
        or name.startswith(".venv")
        or os.path.isfile(os.path.join(directory, name, "pyvenv.cfg"))
    ]


def copy_tree(source: Path, destination: Path) -> None:
    """Everything but version control, caches and virtual environments; symlinks stay links.
    A destination inside the source (a temporary directory under the tree) is not copied into
    itself."""
    inside = os.path.realpath(destination)

    def ignored(directory: str, names: list[str]) -> list[str]:
        own = [name for name in names if os.path.realpath(os.path.join(directory, name)) == inside]
        return _ignored(directory, names) + own

    shutil.copytree(source, destination, symlinks=True, ignore=ignored)


def _python_files(root: Path) -> dict[str, str]:
    texts = {}
    for path in sorted(root.rglob("*.py")):
        if not path.is_file():
            continue
        try:
            texts[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # not a file the codemod could read either
    return texts


def migrate_copy(root: Path, settings: Settings) -> Migration:
    """Migrate the copy's Python files in place as `amp-migrate .` would migrate the tree."""
    texts = _python_files(root)
    results = migrate_project(
        texts,
        target=settings.target,  # type: ignore[arg-type]  # the CLI's click.Choice admits only targets
        device=settings.device,
        dtype=settings.dtype,
    )
    changed = sorted(path for path, result in results.items() if result.changed)
    for path in changed:
        file = root / path
        file.unlink()  # a symlink in the copy is replaced, never written through
        file.write_text(results[path].code, encoding="utf-8")
    shim = tuple(path for path in changed if results[path].target_used == "shim")
    return Migration(tuple(changed), shim)


def run_environment() -> dict[str, str]:
    """The user's environment (OMP_NUM_THREADS and all) less the alias switches."""
    return {k: v for k, v in os.environ.items() if k not in _ALIAS_VARIABLES}


def run_recorded(
    label: str, launcher: Sequence[str], mode: str, cwd: Path, command: Command, result: Path, steps: int
) -> Run:
    """One recorded run of `command` in `cwd` (`launcher` goes between python and the recorder)."""
    argv = [sys.executable, *launcher, str(RECORDER), "--mode", mode, "--max-steps", str(steps)]
    argv += ["--seed", "0", str(result), str(cwd / command.script), *command.args]
    proc = subprocess.run(argv, cwd=cwd, env=run_environment(), capture_output=True, text=True)
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        note = "" if proc.returncode else "\nverify: the recorder wrote no result"
        return Run(label, proc.returncode or 1, (), proc.stderr + note)
    if "step_records" not in data:
        return Run(
            label, proc.returncode or 1, (), proc.stderr + "\nverify: the recorder wrote no step records"
        )
    precision, calls = tuple(data.get("precision", ())), tuple(data.get("step_calls", ()))
    return Run(label, proc.returncode, tuple(data["step_records"]), proc.stderr, precision, calls)


def verify(parsed: Command, root: Path, settings: Settings) -> Outcome:
    """Copy, migrate, run the original on the shim and the copy migrated, compare."""
    with tempfile.TemporaryDirectory(prefix="amp-migrate-verify-") as temporary:
        work = Path(temporary)
        copy = work / "tree"
        copy_tree(root, copy)
        migration = migrate_copy(copy, settings)
        # A copy that keeps the shim imports amp_shim itself: the recorder's shim mode, no alias.
        copy_mode = "shim" if migration.shim_files else "native"
        shim = run_recorded(
            "shim", ["-m", "amp_shim"], "shim", root, parsed, work / "shim.json", settings.steps
        )
        native = run_recorded("native", [], copy_mode, copy, parsed, work / "native.json", settings.steps)
        verdict = judge(shim, native, settings.rtol)
        location = _locate(verdict, shim, native, root, copy, migration)
    return Outcome(verdict, shim, native, migration, parsed, location)


def _read(root: Path, path: str) -> Optional[str]:
    try:
        return (root / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _locate(
    verdict: Verdict, shim: Run, native: Run, root: Path, copy: Path, migration: Migration
) -> Optional[Location]:
    """Where the diverging step's statements are, read while the migrated copy still exists."""
    if verdict.divergence is None:
        return None
    originals = {path: _read(root, path) or "" for path in migration.changed}
    migrated = {path: _read(copy, path) or "" for path in migration.changed}
    sources = changed_sources(originals, migrated)
    return locate(verdict.divergence.step, shim.calls, native.calls, sources, lambda path: _read(copy, path))


def default_device() -> str:
    """cuda where this machine has a GPU torch can use, else cpu: where the script can run at all."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
