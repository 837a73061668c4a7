"""`amp-migrate PATH` in place under races and odd files: an edit made while the run computed
is never lost, nothing outside the tree is written through a symlink swapped in meanwhile,
symlinks found in folders are reported and not followed unless asked, a FIFO or a device
never hangs the run, and an unreadable folder or file is reported with exit 2.

Races are made deterministic by a hook in `runner.write`, which the command line calls for
each file between reading it (in `runner.process`) and replacing it."""

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from amp_migrate.cli import discover as discover_module
from amp_migrate.cli import runner
from amp_migrate.io.source_file import SourceError, read_bytes

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, write

EDITED = SHIM_INPUT + "print('edited while the run was computing')\n"


def hook_before_write(monkeypatch, action):
    """Run `action(result)` after the file was read and migrated, just before it is written."""
    real_write = runner.write

    def write_after(result):
        action(result)
        return real_write(result)

    monkeypatch.setattr(runner, "write", write_after)


def test_a_file_edited_during_the_run_is_not_overwritten(project, monkeypatch):
    edited = write(project / "edited.py", SHIM_INPUT)
    write(project / "other.py", SHIM_INPUT)

    def edit(result):
        if result.path.endswith("edited.py"):
            edited.write_text(EDITED)

    hook_before_write(monkeypatch, edit)
    result = run_cli(["--target", "shim", "-j", "1", "."], project)
    assert result.exit_code == 2, result.output
    assert "edited.py: error: changed during migration, not written" in result.output
    assert edited.read_text() == EDITED
    assert (project / "other.py").read_text() == SHIM_OUTPUT


def test_a_file_rewritten_with_the_same_bytes_during_the_run_is_still_migrated(project, monkeypatch):
    path = write(project / "a.py", SHIM_INPUT)
    hook_before_write(monkeypatch, lambda result: path.write_text(SHIM_INPUT))
    result = run_cli(["--target", "shim", "-j", "1", "."], project)
    assert result.exit_code == 0, result.output
    assert path.read_text() == SHIM_OUTPUT


def test_a_file_swapped_for_a_symlink_during_the_run_is_not_written_through_it(
    tmp_path, project, monkeypatch
):
    outside = write(tmp_path / "outside" / "victim.py", SHIM_INPUT)  # the bytes that were read
    path = write(project / "a.py", SHIM_INPUT)

    def swap(result):
        path.unlink()
        path.symlink_to(outside)

    hook_before_write(monkeypatch, swap)
    result = run_cli(["--target", "shim", "-j", "1", "."], project)
    assert result.exit_code == 2, result.output
    assert "a.py: error: now a symbolic link (replaced during migration), not written" in result.output
    assert outside.read_text() == SHIM_INPUT
    assert path.is_symlink()


def test_a_folder_swapped_for_a_symlink_during_the_run_is_not_written_through_it(
    tmp_path, project, monkeypatch
):
    outside = write(tmp_path / "outside" / "a.py", SHIM_INPUT)
    write(project / "pkg" / "a.py", SHIM_INPUT)

    def swap(result):
        (project / "pkg").rename(project / "pkg_moved")
        (project / "pkg").symlink_to(outside.parent, target_is_directory=True)

    hook_before_write(monkeypatch, swap)
    result = run_cli(["--target", "shim", "-j", "1", "pkg"], project)
    assert result.exit_code == 2, result.output
    assert "pkg/a.py: error: its folder was moved or replaced during migration" in result.output
    assert outside.read_text() == SHIM_INPUT
    assert (project / "pkg_moved" / "a.py").read_text() == SHIM_INPUT


def symlinked_tree(tmp_path, project):
    outside = tmp_path / "outside"
    write(outside / "linked.py", SHIM_INPUT)
    write(outside / "lib" / "inner.py", SHIM_INPUT)
    write(project / "a.py", SHIM_INPUT)
    (project / "link.py").symlink_to(outside / "linked.py")
    (project / "libdir").symlink_to(outside / "lib", target_is_directory=True)
    return outside


@pytest.mark.parametrize("gitignore", [True, False], ids=["git", "walk"])
def test_symlinks_found_in_folders_are_reported_and_not_followed(tmp_path, project, gitignore):
    outside = symlinked_tree(tmp_path, project)
    if gitignore:
        subprocess.run(["git", "init", "-q", str(project)], check=True)
    result = run_cli(["--target", "shim", *([] if gitignore else ["--no-gitignore"]), "."], project)
    assert result.exit_code == 0, result.output
    assert "note: link.py: a symbolic link, not followed (--follow-symlinks follows it)" in result.output
    assert "note: libdir: a symbolic link, not followed" in result.output
    assert (outside / "linked.py").read_text() == SHIM_INPUT
    assert (outside / "lib" / "inner.py").read_text() == SHIM_INPUT
    assert (project / "a.py").read_text() == SHIM_OUTPUT


@pytest.mark.parametrize("gitignore", [True, False], ids=["git", "walk"])
def test_follow_symlinks_migrates_each_linked_file_once_and_keeps_the_links(tmp_path, project, gitignore):
    outside = symlinked_tree(tmp_path, project)
    (project / "again.py").symlink_to(outside / "linked.py")
    (project / "libdir" / "loop").symlink_to(outside / "lib", target_is_directory=True)
    if gitignore:
        subprocess.run(["git", "init", "-q", str(project)], check=True)
    args = ["--target", "shim", "--follow-symlinks", "--format", "json", "."]
    result = run_cli(args if gitignore else ["--no-gitignore", *args], project)
    assert result.exit_code == 0, result.output
    assert (outside / "linked.py").read_text() == SHIM_OUTPUT
    assert (outside / "lib" / "inner.py").read_text() == SHIM_OUTPUT
    assert (project / "link.py").is_symlink() and (project / "again.py").is_symlink()
    assert '"written": true' in result.output
    assert result.output.count(str(outside / "linked.py")) == 1


def test_a_symlink_named_on_the_command_line_is_followed(tmp_path, project):
    outside = write(tmp_path / "outside" / "t.py", SHIM_INPUT)
    (project / "link.py").symlink_to(outside)
    result = run_cli(["--target", "shim", "link.py"], project)
    assert result.exit_code == 0, result.output
    assert outside.read_text() == SHIM_OUTPUT and (project / "link.py").is_symlink()


@pytest.mark.slow
def test_a_fifo_named_py_is_reported_and_does_not_hang_the_run(project):
    os.mkfifo(project / "pipe.py")
    write(project / "a.py", SHIM_INPUT)
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    for args in (["."], ["pipe.py", "a.py"]):
        write(project / "a.py", SHIM_INPUT)
        # The timeout only turns a hang into a failure; nothing here depends on timing.
        proc = subprocess.run(
            [sys.executable, "-m", "amp_migrate", "--target", "shim", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "pipe.py: error: not a regular file (a FIFO), not read" in proc.stdout
        assert (project / "a.py").read_text() == SHIM_OUTPUT


def test_a_device_is_reported_not_read(project):
    result = run_cli(["--target", "shim", os.devnull], project)
    assert result.exit_code == 2, result.output
    assert f"{os.devnull}: error: not a regular file (a character device), not read" in result.output


def test_reading_refuses_anything_but_a_regular_file(project):
    # A file swapped for a device or a FIFO after discovery is refused where it is read.
    with pytest.raises(SourceError, match=r"not a regular file \(a character device\)"):
        read_bytes(os.devnull)
    os.mkfifo(project / "pipe.py")
    with pytest.raises(SourceError, match=r"not a regular file \(a FIFO\)"):
        read_bytes(project / "pipe.py")


def refuse_to_list(monkeypatch, name):
    """Folders called `name` cannot be listed, whoever runs the test (root included)."""
    real_scandir = os.scandir

    def scandir(path="."):
        if os.path.basename(os.path.normpath(os.fspath(path))) == name:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_an_unreadable_folder_is_reported_and_the_run_exits_2(project, monkeypatch):
    write(project / "secret" / "hidden.py", SHIM_INPUT)
    write(project / "a.py", SHIM_INPUT)
    refuse_to_list(monkeypatch, "secret")
    result = run_cli(["--target", "shim", "--no-gitignore", "."], project)
    assert result.exit_code == 2, result.output
    assert "secret: error: cannot read folder: Permission denied" in result.output
    assert (project / "a.py").read_text() == SHIM_OUTPUT


def test_a_folder_git_cannot_read_is_reported_and_the_run_exits_2(project, monkeypatch):
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write(project / "a.py", SHIM_INPUT)
    real_run = subprocess.run

    def run(args, **kwargs):
        # What git prints (and exits 0) when it cannot open a folder it walks.
        proc = real_run(args, **kwargs)
        proc.stderr += b"warning: could not open directory 'secret/': Permission denied\n"
        return proc

    monkeypatch.setattr(discover_module.subprocess, "run", run)
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 2, result.output
    assert "secret: error: cannot read folder: Permission denied" in result.output
    assert (project / "a.py").read_text() == SHIM_OUTPUT


def test_an_unreadable_file_is_reported_and_the_run_exits_2(project, monkeypatch):
    # Root reads whatever the mode says, so the refusal is made at the open itself.
    write(project / "secret.py", SHIM_INPUT)
    write(project / "a.py", SHIM_INPUT)
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if os.fspath(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    result = run_cli(["--target", "shim", "-j", "1", "."], project)
    assert result.exit_code == 2, result.output
    assert "secret.py: error: cannot read: Permission denied" in result.output
    assert (project / "secret.py").read_text() == SHIM_INPUT
    assert (project / "a.py").read_text() == SHIM_OUTPUT


def test_what_discovery_reports_fits_the_json_schema(tmp_path, project, schema, monkeypatch):
    symlinked_tree(tmp_path, project)
    write(project / "secret" / "hidden.py", SHIM_INPUT)
    refuse_to_list(monkeypatch, "secret")
    result = run_cli(["--target", "shim", "--no-gitignore", "--format", "json", "."], project)
    document = json.loads(result.output)
    jsonschema.validate(document, schema)
    by_path = {f["path"]: f for f in document["files"]}
    assert by_path["libdir"]["kind"] == "folder" and by_path["libdir"]["notes"]
    assert by_path["secret"]["kind"] == "folder"
    assert by_path["secret"]["error"] == "cannot read folder: Permission denied"
    assert document["exit_code"] == 2
