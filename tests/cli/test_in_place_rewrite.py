"""`amp-migrate PATH...` rewrites Apex-using files in place, leaves the others alone, and a
second run has nothing left to do."""

import pytest

from amp_migrate import migrate_source

from .conftest import NATIVE_INPUT, NO_APEX, SHIM_INPUT, SHIM_OUTPUT, run_cli, snapshot, write


def test_rewrites_apex_files_in_place_with_what_migrate_source_returns(project):
    write(project / "pkg" / "train.py", NATIVE_INPUT)
    write(project / "pkg" / "data.py", NO_APEX)
    result = run_cli(["pkg"], project)
    assert result.exit_code == 0, result.output
    expected = migrate_source(NATIVE_INPUT).code
    assert (project / "pkg" / "train.py").read_text() == expected
    assert "torch.amp.GradScaler" in expected
    assert (project / "pkg" / "data.py").read_text() == NO_APEX
    assert "Migrated pkg/train.py (native)" in result.output


@pytest.mark.slow
def test_second_run_reports_nothing_to_change(project):
    write(project / "a.py", NATIVE_INPUT)
    write(project / "b.py", SHIM_INPUT)
    assert run_cli(["."], project).exit_code == 0
    after_first = snapshot(project)
    second = run_cli(["--check", "."], project)
    assert second.exit_code == 0, second.output
    assert "Would migrate" not in second.output
    assert snapshot(project) == after_first


def test_files_without_apex_are_never_parsed(project):
    # Not Python at all, but it never mentions Apex: the prefilter skips it without a word.
    write(project / "broken_but_unrelated.py", "def f(:\n    print 'x'\n")
    result = run_cli(["--target", "shim", "."], project)
    assert result.exit_code == 0, result.output
    assert "broken_but_unrelated" not in result.output


def test_target_device_and_dtype_reach_the_codemod(project):
    write(project / "a.py", NATIVE_INPUT)
    write(project / "b.py", SHIM_INPUT)
    result = run_cli(["--device", "cpu", "--dtype", "bfloat16", "a.py"], project)
    assert result.exit_code == 0, result.output
    assert (project / "a.py").read_text() == migrate_source(NATIVE_INPUT, device="cpu", dtype="bfloat16").code
    assert run_cli(["--target", "shim", "b.py"], project).exit_code == 0
    assert (project / "b.py").read_text() == SHIM_OUTPUT


def test_bad_option_values_and_missing_paths_are_usage_errors(project):
    write(project / "a.py", SHIM_INPUT)
    for args in (
        ["--target", "fast", "a.py"],
        ["--dtype", "float8", "a.py"],
        ["missing.py"],
        ["--device", "cu da", "a.py"],
        ["--jobs", "0", "a.py"],
    ):
        result = run_cli(args, project)
        assert result.exit_code == 2, (args, result.output)
        assert "Usage:" in result.output or "Error" in result.output
    assert (project / "a.py").read_text() == SHIM_INPUT
