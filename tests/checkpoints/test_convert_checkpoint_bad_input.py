"""`amp-migrate convert-checkpoint IN OUT` on bad input and unlucky disks (issue 18, items 8-9).

Every refusal is one line on stderr starting with `error:`, exit 2, no traceback, and nothing
at OUT: neither the file nor a temporary beside it. `--unsafe-load` is suggested only for a
complete pickle that the safe loader refused. Files are created with the umask's mode.
"""

from __future__ import annotations

import errno
import fractions
import io
import os
import random
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from amp_migrate.cli.main import main

APEX_STATE = OrderedDict([("loss_scaler0", {"loss_scale": 32768.0, "unskipped": 17})])


def good_checkpoint() -> dict:
    return {"model": {"w": torch.arange(256.0)}, "amp": APEX_STATE, "epoch": 3}


def checkpoint_bytes(obj, *, legacy: bool = False) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


def convert(source: Path, target: Path, *extra: str):
    return CliRunner().invoke(main, ["convert-checkpoint", str(source), str(target), *extra])


def assert_refused(result, target: Path, *, says: str, inputs: set[str]) -> str:
    """Exit 2 from a handled error, one line naming the problem, and nothing left at TARGET."""
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert says in lines[0], lines[0]
    assert result.stdout == ""
    assert not target.exists()
    if target.parent.is_dir():
        assert {p.name for p in target.parent.iterdir()} <= inputs  # no temporary left either
    return lines[0]


def refuse_file(tmp_path: Path, data: bytes, says: str, *extra: str) -> str:
    source, target = tmp_path / "in.pt", tmp_path / "out.pt"
    source.write_bytes(data)
    return assert_refused(convert(source, target, *extra), target, says=says, inputs={"in.pt"})


# -- files that are not checkpoints ---------------------------------------------------------------


def test_a_text_file_is_refused_without_suggesting_unsafe_load(tmp_path):
    line = refuse_file(tmp_path, b"epoch: 3\nloss: 0.25\n", "neither a zip archive (torch.save) nor a pickle")
    assert "--unsafe-load" not in line


@pytest.mark.parametrize("first", [b"", b"\x80", b"PK\x03\x04"], ids=["random", "pickle-opcode", "zip-magic"])
def test_random_bytes_are_refused_without_suggesting_unsafe_load(tmp_path, first):
    data = first + random.Random(18).randbytes(4096)
    line = refuse_file(tmp_path, data, "not a readable torch checkpoint")
    assert "--unsafe-load" not in line


def test_random_bytes_are_never_unpickled_even_with_unsafe_load(tmp_path):
    data = b"\x80\x02" + random.Random(8).randbytes(4096)
    refuse_file(tmp_path, data, "its pickle is truncated or damaged", "--unsafe-load")


def test_an_empty_file_is_refused(tmp_path):
    refuse_file(tmp_path, b"", "the file is empty")


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.99])
def test_a_truncated_checkpoint_is_refused(tmp_path, fraction):
    data = checkpoint_bytes(good_checkpoint())
    line = refuse_file(tmp_path, data[: int(len(data) * fraction)], "truncated or damaged")
    assert "--unsafe-load" not in line


@pytest.mark.parametrize("cut", [20, 200, -1], ids=["in-header", "in-object", "in-storage"])
def test_a_truncated_legacy_format_checkpoint_is_refused(tmp_path, cut):
    data = checkpoint_bytes(good_checkpoint(), legacy=True)
    line = refuse_file(tmp_path, data[:cut], "not a readable torch checkpoint")
    assert "--unsafe-load" not in line


def test_a_fifo_is_refused_rather_than_waited_on(tmp_path):
    source, target = tmp_path / "in.pt", tmp_path / "out.pt"
    os.mkfifo(source)
    assert_refused(convert(source, target), target, says="not a regular file", inputs={"in.pt"})


@pytest.mark.parametrize("first", [b"", b"\x80\xc7"], ids=["random", "pickle-protocol-199"])
@pytest.mark.slow
def test_nothing_but_the_error_line_reaches_the_user(tmp_path, first):
    """The same as a user runs it: a process, its whole stderr (no traceback, no warning from
    torch about the protocol of what only looked like a pickle)."""
    source, target = tmp_path / "in.pt", tmp_path / "out.pt"
    source.write_bytes(first + random.Random(1).randbytes(2048))
    done = subprocess.run(
        [sys.executable, "-m", "amp_migrate.cli.main", "convert-checkpoint", str(source), str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]


# -- real pickles the safe loader refuses -----------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_real_pickle_with_python_objects_suggests_unsafe_load_and_converts_with_it(tmp_path, legacy):
    source, target = tmp_path / "in.pt", tmp_path / "out.pt"
    source.write_bytes(
        checkpoint_bytes(good_checkpoint() | {"ratio": fractions.Fraction(1, 3)}, legacy=legacy)
    )
    line = assert_refused(convert(source, target), target, says="pass --unsafe-load", inputs={"in.pt"})
    if not legacy:
        assert "fractions.Fraction" in line  # what would be imported is named
    done = convert(source, target, "--unsafe-load")
    assert done.exit_code == 0, done.output
    after = torch.load(target, weights_only=False)
    assert after["ratio"] == fractions.Fraction(1, 3) and after["amp"]["_growth_tracker"] == 17


# -- checkpoints whose Apex entries are malformed ----------------------------------------------------


@pytest.mark.parametrize(
    "amp",
    [
        {"loss_scaler0": {"loss_scale": "big", "unskipped": 1}},
        {"loss_scaler0": {"loss_scale": 1.0}},
        {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0, "min_loss_scale": 1.0}},
        {"loss_scaler0": None},
        {"loss_scaler0": {"loss_scale": torch.tensor([1.0, 2.0]), "unskipped": 1}},
        {"loss_scaler0": {"loss_scale": 1.0, "unskipped": -3}},
    ],
    ids=["scale-text", "no-counter", "extra-key", "none", "scale-tensor", "negative-counter"],
)
def test_a_malformed_amp_state_is_refused_naming_the_entry(tmp_path, amp):
    line = refuse_file(tmp_path, checkpoint_bytes({"model": {}, "amp": amp}), "malformed Apex amp state")
    assert "in.pt['amp']" in line and "--index" not in line


def test_a_file_that_is_a_malformed_amp_state_is_refused(tmp_path):
    refuse_file(
        tmp_path, checkpoint_bytes({"loss_scaler0": {"loss_scale": []}}), "in.pt[]: malformed Apex amp state"
    )


def fused_adam_state(**group) -> dict:
    return {
        "state": {0: {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
        "param_groups": [{"lr": 1e-3, "params": [0], "step": 5} | group],
    }


@pytest.mark.parametrize(
    "optimizer",
    [
        fused_adam_state(step="five"),
        fused_adam_state(step=torch.ones(3)),
        fused_adam_state(step=-1),
        fused_adam_state(params=0),
        {"state": [], "param_groups": [{"params": [0], "step": 1}]},
        {"state": {0: 5}, "param_groups": [{"params": [0], "step": 1}]},
        {"state": {}, "param_groups": [None]},
    ],
    ids=[
        "step-text",
        "step-tensor",
        "step-negative",
        "params-int",
        "state-list",
        "param-state-int",
        "group-none",
    ],
)
def test_a_malformed_fused_adam_state_is_refused_naming_the_entry(tmp_path, optimizer):
    line = refuse_file(
        tmp_path, checkpoint_bytes({"optimizer": optimizer, "amp": APEX_STATE}), "malformed optimizer state"
    )
    assert "in.pt['optimizer']" in line


def test_a_malformed_fp16_optimizer_state_is_refused_naming_the_entry(tmp_path):
    fp16 = {
        "loss_scaler": {},
        "dynamic_loss_scale": False,
        "overflow": False,
        "optimizer_state_dict": {"state": {}, "param_groups": []},
        "fp32_from_fp16": torch.ones(2, 2),
    }
    refuse_file(tmp_path, checkpoint_bytes({"optimizer": fp16}), "in.pt['optimizer']: malformed entry")


def test_a_checkpoint_that_is_no_dict_is_refused(tmp_path):
    refuse_file(tmp_path, checkpoint_bytes([APEX_STATE]), "in.pt[]: the checkpoint is of type list")


# -- targets that cannot be written ---------------------------------------------------------------


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "in.pt"
    path.write_bytes(checkpoint_bytes(good_checkpoint()))
    return path


def test_a_missing_target_folder_is_refused(tmp_path, source):
    target = tmp_path / "missing" / "out.pt"
    assert_refused(convert(source, target), target, says="the folder", inputs=set())
    assert not target.parent.exists()


def _denied_under(folder: Path, real):
    """`real` (an os function taking a path first), failing as a read-only folder makes it fail
    for paths inside `folder` (root writes anywhere, so the denial is simulated). A path relative
    to a folder descriptor (`dir_fd=`) is judged by the folder that descriptor holds open."""

    def denied(path, *args, dir_fd=None, **kwargs):
        full = (
            os.fspath(path) if dir_fd is None else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        )
        if os.path.realpath(os.path.dirname(full)) == os.path.realpath(folder):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, *args, **({} if dir_fd is None else {"dir_fd": dir_fd}), **kwargs)

    return denied


def test_a_read_only_target_folder_is_refused(tmp_path, source, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "out.pt"
    monkeypatch.setattr(os, "open", _denied_under(folder, os.open))
    assert_refused(convert(source, target), target, says="Permission denied", inputs=set())
    assert list(folder.iterdir()) == []


def test_a_read_only_target_file_is_not_replaced(tmp_path, source, monkeypatch):
    target = tmp_path / "out.pt"
    target.write_bytes(b"old")
    target.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode, **kw: (
            False
            if os.fspath(path) == os.fspath(target) and mode & os.W_OK
            else real_access(path, mode, **kw)
        ),
    )
    result = convert(source, target)
    assert result.exit_code == 2 and result.stderr == f"error: {target}: is read-only; not replaced\n"
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["in.pt", "out.pt"]


def _disk_full_after(nbytes: int, folder: Path, real_write):
    """os.write that fills the disk after `nbytes` to files in `folder`, as ENOSPC does."""
    room = [nbytes]

    def write(fd, data):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) != os.fspath(folder):
            return real_write(fd, data)
        if room[0] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = real_write(fd, bytes(data[: room[0]]))
        room[0] -= written
        return written

    return write


@pytest.mark.parametrize("existing", [False, True], ids=["new-target", "existing-target"])
def test_a_full_disk_during_the_write_leaves_no_partial_file(tmp_path, source, monkeypatch, existing):
    folder = tmp_path / "out"
    folder.mkdir()
    target = folder / "out.pt"
    if existing:
        target.write_bytes(b"old")
    monkeypatch.setattr(os, "write", _disk_full_after(100, folder, os.write))
    result = convert(source, target)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2
    assert result.stderr == f"error: {target}: cannot write (no space left on device); nothing written\n"
    assert [p.name for p in folder.iterdir()] == (["out.pt"] if existing else [])
    if existing:
        assert target.read_bytes() == b"old"


def test_a_full_disk_reported_at_fsync_leaves_no_partial_file(tmp_path, source, monkeypatch):
    """Delayed allocation (and NFS) report ENOSPC at fsync, after every write succeeded."""
    target = tmp_path / "out.pt"

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    assert_refused(convert(source, target), target, says="no space left on device", inputs={"in.pt"})


# -- the mode of what is written ----------------------------------------------------------------


@pytest.fixture
def umask():
    def set_umask(mask: int) -> None:
        os.umask(mask)

    before = os.umask(0o022)
    yield set_umask
    os.umask(before)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_a_new_output_file_gets_the_mode_the_umask_gives(tmp_path, source, umask, mask):
    umask(mask)
    target = tmp_path / "out.pt"
    assert convert(source, target).exit_code == 0
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o660])
def test_a_replaced_output_file_keeps_its_mode_as_under_torch_save(tmp_path, source, umask, mode):
    umask(0o022)
    target = tmp_path / "out.pt"
    target.write_bytes(b"old")
    target.chmod(mode)
    assert convert(source, target).exit_code == 0
    assert target.stat().st_mode & 0o777 == mode
    assert torch.load(target, weights_only=True)["amp"]["scale"] == 32768.0


# -- arguments that name the wrong files ------------------------------------------------------------


def test_a_missing_source_is_one_line(tmp_path):
    target = tmp_path / "out.pt"
    assert_refused(convert(tmp_path / "absent.pt", target), target, says="No such file", inputs=set())


def test_a_folder_as_source_or_target_is_one_line(tmp_path, source):
    (tmp_path / "dir").mkdir()
    assert_refused(
        convert(tmp_path / "dir", tmp_path / "out.pt"),
        tmp_path / "out.pt",
        says="not a regular file",
        inputs={"in.pt", "dir"},
    )
    result = convert(source, tmp_path / "dir")
    assert result.exit_code == 2 and result.stderr == f"error: {tmp_path / 'dir'}: is a folder\n"


def test_target_is_source_without_in_place_is_one_line(tmp_path, source):
    before = source.read_bytes()
    result = convert(source, source)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "--in-place" in result.stderr
    assert source.read_bytes() == before
