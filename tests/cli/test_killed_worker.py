"""A worker process killed mid-file (the OOM killer, a crash in an extension) ends the run with
exit 2: the file it held is named, every other file is migrated in full or left as it was.

The kill is made deterministic by a hook, installed before the command line starts, that makes
a worker SIGKILL itself as it starts the chosen file (forked workers inherit the hook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SHIM_INPUT, SHIM_OUTPUT, write

DOOMED = "doomed.py"
REQUIREMENTS = "requirements.txt"

HOOKED_CLI = f"""
import os, runpy, signal, sys
from amp_migrate.cli import runner

parent = os.getpid()
real = runner._process

def dying(job, data):
    if os.path.basename(job.path) == {DOOMED!r} and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(job, data)

runner._process = dying
sys.argv[0] = "amp_migrate"
runpy.run_module("amp_migrate", run_name="__main__", alter_sys=True)
"""


def run_with_a_dying_worker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    # The timeout only turns a hang into a failure; nothing here depends on timing.
    return subprocess.run(
        [sys.executable, "-c", HOOKED_CLI, "--target", "shim", "-j", "2", *args, "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def tree(tmp_path) -> dict[Path, bytes]:
    # The doomed file is the largest, so that it is among the first files the workers take.
    files = {tmp_path / DOOMED: SHIM_INPUT + "# padding\n" * 50}
    files.update((tmp_path / f"pkg/mod{i}.py", SHIM_INPUT) for i in range(12))
    files[tmp_path / REQUIREMENTS] = "torch\napex\n"  # migrated after the Python files: not at all
    for path, text in files.items():
        write(path, text)
    return {path: path.read_bytes() for path in files}


def assert_each_file_whole(root: Path, tree: dict[Path, bytes]) -> list[Path]:
    """Every file but the doomed one is migrated or as it was, and parses; the migrated ones."""
    migrated = []
    for path, old in tree.items():
        content = path.read_bytes()
        compile(content, str(path), "exec")
        if path.name in (DOOMED, REQUIREMENTS):
            assert content == old
        else:
            assert content in (old, SHIM_OUTPUT.encode()), path
            if content != old:
                migrated.append(path)
    assert not [p for p in root.rglob("*") if p.name.startswith(".")], "temporary files left behind"
    return migrated


@pytest.mark.slow
def test_a_killed_worker_ends_the_run_naming_its_file(tmp_path, tree):
    proc = run_with_a_dying_worker(tmp_path)

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (
        f"{DOOMED}: error: the worker migrating this file died (killed by signal 9, SIGKILL)" in proc.stdout
    ), proc.stdout
    migrated = assert_each_file_whole(tmp_path, tree)
    for path in tree:
        rel = os.path.relpath(path, tmp_path)
        if path in migrated:
            assert f"Migrated {rel} (shim)" in proc.stdout
        elif path.name != DOOMED:  # the requirements file too
            assert f"{rel}: error: not migrated: the run stopped when a worker died" in proc.stdout


@pytest.mark.slow
def test_a_killed_worker_is_an_error_in_the_json_report(tmp_path, tree):
    proc = run_with_a_dying_worker(tmp_path, "--format", "json")

    assert proc.returncode == 2, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    assert document["exit_code"] == 2
    entries = {entry["path"]: entry for entry in document["files"]}
    assert entries[DOOMED]["error"].startswith("the worker migrating this file died (killed by signal 9")
    assert entries[DOOMED]["written"] is False
    migrated = assert_each_file_whole(tmp_path, tree)
    for path in tree:
        entry = entries[os.path.relpath(path, tmp_path)]
        assert entry["written"] == (path in migrated)
        assert (entry["error"] is None) == (path in migrated)
    assert document["summary"]["errors"] == len(tree) - len(migrated)
