"""One atomic writer serves both commands that write files (issue 18, item 14): `amp-migrate
PATH` rewriting sources in place and `convert-checkpoint` writing its TARGET both go through
`atomic_write.replace_atomically`, so a guarantee added there holds for both, and each still
words a failure its own way.

A fault injected into the one writer's data step must reach both commands: each reports it,
leaves its target as it was, and leaves no temporary file beside it. With a writer per command,
the fault would reach only one of them."""

from __future__ import annotations

import ast
import errno
import io
import os
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import amp_migrate
from amp_migrate.cli.main import main
from amp_migrate.io import atomic_write

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, write

PACKAGE = Path(amp_migrate.__file__).resolve().parent
APEX_CHECKPOINT = {
    "model": {"w": torch.arange(4.0)},
    "amp": OrderedDict([("loss_scaler0", {"loss_scale": 1024.0, "unskipped": 3})]),
}


def _apex_checkpoint(path: Path) -> Path:
    buffer = io.BytesIO()
    torch.save(APEX_CHECKPOINT, buffer)
    path.write_bytes(buffer.getvalue())
    return path


@pytest.fixture
def writes(monkeypatch) -> list[str]:
    """The targets the one writer was asked to replace, in order."""
    seen: list[str] = []
    real = atomic_write._replace

    def counting(entry, *args, **kwargs):
        seen.append(entry.name)
        return real(entry, *args, **kwargs)

    monkeypatch.setattr(atomic_write, "_replace", counting)
    return seen


@pytest.fixture
def full_disk(monkeypatch) -> None:
    """The one writer's data step writes a few bytes and then finds the disk full."""

    def write_some(fd, data):
        os.write(fd, bytes(memoryview(data)[:3]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_write, "_write_all", write_some)


def test_the_in_place_rewrite_and_convert_checkpoint_both_write_through_the_one_writer(tmp_path, writes):
    project = tmp_path / "project"
    project.mkdir()
    source = write(project / "train.py", SHIM_INPUT)
    assert run_cli(["--target", "shim", "-j", "1", "."], project).exit_code == 0
    assert source.read_text() == SHIM_OUTPUT
    assert writes == ["train.py"]

    target = tmp_path / "native.pt"
    result = CliRunner().invoke(
        main, ["convert-checkpoint", str(_apex_checkpoint(tmp_path / "apex.pt")), str(target)]
    )
    assert result.exit_code == 0, result.output
    assert torch.load(target, weights_only=True)["amp"]["scale"] == 1024.0
    assert writes == ["train.py", "native.pt"]


def test_a_fault_in_the_one_writer_fails_the_in_place_rewrite_and_leaves_the_file(tmp_path, full_disk):
    source = write(tmp_path / "train.py", SHIM_INPUT)
    result = run_cli(["--target", "shim", "-j", "1", "."], tmp_path)
    assert result.exit_code == 2, result.output
    assert "train.py: error: cannot write: No space left on device" in result.output
    assert source.read_text() == SHIM_INPUT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("existing", [False, True], ids=["new-target", "existing-target"])
def test_a_fault_in_the_one_writer_fails_convert_checkpoint_and_leaves_the_target(
    tmp_path, full_disk, existing
):
    source = _apex_checkpoint(tmp_path / "apex.pt")
    target = tmp_path / "native.pt"
    if existing:
        target.write_bytes(b"old")
    result = CliRunner().invoke(main, ["convert-checkpoint", str(source), str(target)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {target}: cannot write (no space left on device); nothing written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["apex.pt", "native.pt"] if existing else ["apex.pt"]
    )
    if existing:
        assert target.read_bytes() == b"old"


def _renames_in(path: Path) -> list[int]:
    """Lines of `path` that call os.replace or os.rename: where a file is put in place."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"replace", "rename"}
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "os"
    ]


@pytest.mark.slow
def test_no_module_but_the_one_writer_renames_a_file_into_place():
    renames = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _renames_in(path))
    }
    assert list(renames) == ["io/atomic_write.py"], renames


def test_a_folder_swapped_for_a_symlink_after_it_was_opened_does_not_redirect_the_write(tmp_path):
    """Every step after the folder is opened names the file relative to that folder, so a
    symlink put in its place cannot send the temporary file or the rename elsewhere."""
    folder, moved, outside = tmp_path / "out", tmp_path / "moved", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (folder / "out.pt").write_bytes(b"old")

    def swap_folder(entry):
        folder.rename(moved)
        folder.symlink_to(outside, target_is_directory=True)

    atomic_write.replace_atomically(folder / "out.pt", b"new", may_create=True, check=swap_folder)
    assert list(outside.iterdir()) == []
    assert [p.name for p in moved.iterdir()] == ["out.pt"] and (moved / "out.pt").read_bytes() == b"new"
