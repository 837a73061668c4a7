"""A file that cannot be migrated is reported with its path and the reason, left byte for
byte as it was, the run goes on with the other files, and the exit code is 2."""

import os

import pytest

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, snapshot, write

BAD = {
    "py2.py": b"from apex import amp\nprint 'hello'\n",
    "syntax.py": b"from apex import amp\ndef f(:\n    pass\n",
    "latin1_without_cookie.py": b"# caf\xe9 with apex\nx = 1\n",
    "lying_cookie.py": b"# -*- coding: ascii -*-\n# apex \xff\n",
    "broken.ipynb": b'{"cells": [{"cell_type": "code", "source": "from apex import amp"',
    "old_format.ipynb": b'{"nbformat": 3, "worksheets": [{"cells": [{"input": "import apex"}]}]}',
}
REASONS = {
    "py2.py": "py2.py:2:1: AMP001 syntax error: Missing parentheses",
    "syntax.py": "syntax.py:2:7: AMP001 syntax error",
    "latin1_without_cookie.py": "latin1_without_cookie.py: error: not valid UTF-8",
    "lying_cookie.py": "lying_cookie.py: error: not decodable as ascii",
    "broken.ipynb": "broken.ipynb: error: not a notebook: invalid JSON",
    "old_format.ipynb": "old_format.ipynb: error: nbformat 3 notebooks are not supported",
}


def test_unmigratable_files_are_reported_untouched_and_the_run_goes_on(project):
    for name, data in BAD.items():
        write(project / name, data)
    write(project / "good.py", SHIM_INPUT)
    before = snapshot(project)
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 2, result.output
    for name, reason in REASONS.items():
        assert reason in result.output, name
        assert (project / name).read_bytes() == before[name]
    assert (project / "good.py").read_text() == SHIM_OUTPUT


def test_read_only_file_is_reported_and_untouched(project):
    path = write(project / "ro.py", SHIM_INPUT)
    os.chmod(path, 0o444)
    write(project / "rw.py", SHIM_INPUT)
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 2
    assert "ro.py: error: not writable: the file is read-only (left untouched)" in result.output
    assert path.read_text() == SHIM_INPUT and oct(os.stat(path).st_mode & 0o777) == "0o444"
    assert (project / "rw.py").read_text() == SHIM_OUTPUT


def test_symlink_loop_is_reported(project):
    (project / "loop.py").symlink_to("loop.py")
    write(project / "ok.py", SHIM_INPUT)
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 0, result.output
    assert "note: loop.py: a symbolic link, not followed" in result.output
    assert (project / "ok.py").read_text() == SHIM_OUTPUT
    result = run_cli(["--target", "shim", "--follow-symlinks", "."], project)
    assert result.exit_code == 2
    assert (
        "loop.py: error: a symbolic link that cannot be followed: Too many levels of symbolic links"
    ) in result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_reported(project):
    path = write(project / "secret.py", SHIM_INPUT)
    os.chmod(path, 0)
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 2 and "secret.py: error: cannot read: Permission denied" in result.output


def test_check_still_exits_2_when_a_file_failed(project):
    write(project / "a.py", SHIM_INPUT)
    write(project / "b.py", BAD["syntax.py"])
    assert run_cli(["--check", "--target", "shim", "."], project).exit_code == 2
