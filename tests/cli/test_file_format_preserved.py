"""A rewritten file keeps its encoding (coding cookie, BOM), line endings, trailing-newline
state and permission bits; only the migrated lines differ."""

import os
import stat

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, write


def migrate_shim(project, name):
    result = run_cli(["--target", "shim", name], project)
    assert result.exit_code == 0, result.output
    return (project / name).read_bytes()


def test_crlf_stays_crlf(project):
    write(project / "a.py", SHIM_INPUT.replace("\n", "\r\n").encode())
    assert migrate_shim(project, "a.py") == SHIM_OUTPUT.replace("\n", "\r\n").encode()


def test_utf8_bom_is_kept(project):
    write(project / "a.py", b"\xef\xbb\xbf" + SHIM_INPUT.encode())
    assert migrate_shim(project, "a.py") == b"\xef\xbb\xbf" + SHIM_OUTPUT.encode()


def test_latin1_coding_cookie_is_kept_and_honoured(project):
    header = "# -*- coding: latin-1 -*-\n# Ré-entraînement\n"
    write(project / "a.py", (header + SHIM_INPUT).encode("latin-1"))
    assert migrate_shim(project, "a.py") == (header + SHIM_OUTPUT).encode("latin-1")


def test_missing_trailing_newline_stays_missing(project):
    write(project / "a.py", SHIM_INPUT.rstrip("\n"))
    assert migrate_shim(project, "a.py") == SHIM_OUTPUT.rstrip("\n").encode()


def test_mixed_line_endings_outside_the_change_survive(project):
    text = "from apex import amp\r\nx = 1\ny = 2\r\nmodel, optimizer = amp.initialize(model, optimizer)\n"
    write(project / "a.py", text.encode())
    assert migrate_shim(project, "a.py") == text.replace("from apex", "from amp_shim").encode()


def test_file_mode_is_preserved(project):
    path = write(project / "tool.py", "#!/usr/bin/env python\n" + SHIM_INPUT)
    os.chmod(path, 0o750)
    migrate_shim(project, "tool.py")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o750
    assert path.read_text().startswith("#!/usr/bin/env python\nfrom amp_shim import amp\n")


def test_a_symlink_is_kept_and_its_target_rewritten(project):
    target = write(project / "real.py", SHIM_INPUT)
    (project / "link.py").symlink_to("real.py")
    migrate_shim(project, "link.py")
    assert (project / "link.py").is_symlink()
    assert target.read_text() == SHIM_OUTPUT


def test_no_temporary_files_are_left_behind(project):
    write(project / "a.py", SHIM_INPUT)
    migrate_shim(project, "a.py")
    assert sorted(p.name for p in project.iterdir()) == ["a.py"]
