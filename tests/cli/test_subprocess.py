"""The installed command, run as a real process: routing of `amp-migrate PATH` to `migrate`,
exit codes, and output."""

import json
import os
import sys
from pathlib import Path

import pytest

from .conftest import NO_APEX, SHIM_INPUT, SHIM_OUTPUT, run_process, write


@pytest.mark.slow
def test_check_fix_check_cycle_and_exit_codes(project):
    write(project / "src" / "a.py", SHIM_INPUT)
    write(project / "src" / "b.py", NO_APEX)
    check = run_process(["--check", "--target", "shim", "src"], project)
    assert check.returncode == 1, check.stderr
    assert "Would migrate src/a.py (shim)" in check.stdout
    fix = run_process(["migrate", "--target", "shim", "--jobs", "2", "src"], project)
    assert fix.returncode == 0, fix.stderr
    assert (project / "src" / "a.py").read_text() == SHIM_OUTPUT
    assert run_process(["--check", "--target", "shim", "src"], project).returncode == 0


@pytest.mark.slow
def test_unparseable_file_exits_2_and_is_untouched(project):
    bad = write(project / "bad.py", "from apex import amp\nprint 'x'\n")
    write(project / "good.py", SHIM_INPUT)
    proc = run_process(["--target", "shim", "."], project)
    assert proc.returncode == 2
    assert "bad.py:2:1: AMP001 syntax error" in proc.stdout
    assert bad.read_text() == "from apex import amp\nprint 'x'\n"
    assert (project / "good.py").read_text() == SHIM_OUTPUT


@pytest.mark.slow
def test_json_is_the_only_thing_on_stdout(project):
    write(project / "a.py", SHIM_INPUT)
    proc = run_process(["--format", "json", "--diff", "--target", "shim", "a.py"], project)
    assert json.loads(proc.stdout)["files"][0]["diff"].startswith("--- a.py")


@pytest.mark.slow
def test_help_lists_the_commands_and_the_default(project):
    proc = run_process(["--help"], project)
    assert proc.returncode == 0
    for word in ("migrate", "explain", "run", "PATH..."):
        assert word in proc.stdout
    assert run_process(["explain", "AMP001"], project).stdout.startswith("## AMP001")
    assert run_process(["nonexistent_dir"], project).returncode == 2


@pytest.mark.slow
def test_console_script(project):
    script = Path(sys.executable).with_name("amp-migrate")
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    write(project / "a.py", SHIM_INPUT)
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(script), "--diff", "--target", "shim", "a.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "+from amp_shim import amp" in proc.stdout
