"""`--diff` and `--check` write nothing; `--check` says through its exit code whether any file
would change, for CI and pre-commit."""

import re

import pytest

from .conftest import NO_APEX, SHIM_INPUT, SHIM_OUTPUT, run_cli, snapshot, write


def test_diff_prints_a_unified_diff_and_a_summary_and_writes_nothing(project):
    write(project / "a.py", SHIM_INPUT)
    write(project / "b.py", NO_APEX)
    before = snapshot(project)
    result = run_cli(["--diff", "--target", "shim", "."], project)
    assert result.exit_code == 0, result.output
    assert snapshot(project) == before
    assert (
        "--- a.py\n+++ a.py\n@@ -1,2 +1,2 @@\n-from apex import amp\n+from amp_shim import amp\n"
        in result.output
    )
    assert "Would migrate a.py (shim)" in result.output
    for row in ("Files scanned", "Mention Apex", "Would change", "shim fallback", "Diagnostics", "Time"):
        assert row in result.output
    assert "\x1b[" not in result.output  # plain text when not a terminal


def test_dry_run_is_diff(project):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["--dry-run", "--target", "shim", "a.py"], project)
    assert result.exit_code == 0 and "+from amp_shim import amp" in result.output
    assert (project / "a.py").read_text() == SHIM_INPUT


@pytest.mark.slow
def test_check_exits_1_when_a_file_would_change_and_0_when_none(project):
    write(project / "a.py", SHIM_INPUT)
    write(project / "b.py", NO_APEX)
    result = run_cli(["--check", "--target", "shim", "."], project)
    assert result.exit_code == 1, result.output
    assert (project / "a.py").read_text() == SHIM_INPUT
    assert run_cli(["--check", "--target", "shim", "b.py"], project).exit_code == 0
    write(project / "a.py", SHIM_OUTPUT)
    assert run_cli(["--check", "--target", "shim", "."], project).exit_code == 0


def test_check_with_diff_shows_what_would_change(project):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["--check", "--diff", "--target", "shim", "a.py"], project)
    assert result.exit_code == 1
    assert "+from amp_shim import amp" in result.output


def test_diagnostics_print_as_path_line_col_code_with_a_hint(project):
    write(project / "pkg" / "a.py", SHIM_INPUT)
    result = run_cli(["--diff", "pkg"], project)
    lines = result.output.splitlines()
    # `auto`: initialize without a training loop cannot go native; the file falls back.
    (diagnostic,) = [line for line in lines if line.startswith("pkg/a.py:")]
    assert re.match(r"pkg/a\.py:2:\d+: AMP\d{3} \S", diagnostic), diagnostic
    code = diagnostic.split()[1]
    assert f"Would migrate pkg/a.py (shim fallback: {code})" in lines
    hint = lines[lines.index(diagnostic) + 1]
    assert hint.strip().startswith("hint:") and f"amp-migrate explain {code}" in hint


def test_quiet_drops_the_summary(project):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["--diff", "-q", "--target", "shim", "a.py"], project)
    assert "+from amp_shim import amp" in result.output
    assert "Files scanned" not in result.output
