"""`--interactive` asks per file (and refuses without a terminal); `explain CODE` prints the
code's documentation with its example."""

import pytest

from amp_migrate.cli import main as cli

from .conftest import SHIM_INPUT, SHIM_OUTPUT, run_cli, write


def test_interactive_refuses_without_a_terminal(project):
    write(project / "a.py", SHIM_INPUT)
    result = run_cli(["-i", "a.py"], project)
    assert result.exit_code == 2 and "stdin is not a terminal" in result.output
    assert (project / "a.py").read_text() == SHIM_INPUT


@pytest.mark.slow
def test_interactive_applies_skips_and_quits(project, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    for name in ("a.py", "b.py", "c.py"):
        write(project / name, SHIM_INPUT)
    result = run_cli(["-i", "--target", "shim", "."], project, input="y\nn\nq\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("Apply this change?") == 3
    assert [(project / n).read_text() == SHIM_OUTPUT for n in ("a.py", "b.py", "c.py")] == [
        True,
        False,
        False,
    ]
    result = run_cli(["-i", "--target", "shim", "."], project, input="a\n")
    assert result.output.count("Apply this change?") == 1
    assert all((project / n).read_text() == SHIM_OUTPUT for n in ("a.py", "b.py", "c.py"))


def test_interactive_cannot_be_combined_with_check(project, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    write(project / "a.py", SHIM_INPUT)
    assert run_cli(["-i", "--check", "a.py"], project).exit_code == 2


def test_explain_prints_the_long_description_with_an_example(project):
    result = run_cli(["explain", "AMP101"], project)
    assert result.exit_code == 0, result.output
    assert "AMP101 scaler-unreachable" in result.output
    assert "Before:" in result.output and "After:" in result.output and "```python" in result.output
    assert run_cli(["explain", "amp001"], project).output.startswith("## AMP001 parse-error")


def test_explain_without_a_code_lists_them_and_an_unknown_code_is_an_error(project):
    listing = run_cli(["explain"], project)
    assert listing.exit_code == 0 and "AMP001" in listing.output and "AMP900" in listing.output
    unknown = run_cli(["explain", "AMP999"], project)
    assert unknown.exit_code == 2 and "no diagnostic 'AMP999'" in unknown.output


def test_interactive_asks_about_a_dependency_file_after_the_python_files(project, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    write(project / "a.py", SHIM_INPUT)
    write(project / "requirements.txt", "apex\n")
    result = run_cli(["-i", "--target", "shim", "."], project, input="y\ny\n")
    assert result.output.count("Apply this change?") == 2
    assert (project / "requirements.txt").read_text() == "amp-migrate\n"


def test_interactive_keeps_the_apex_entry_of_a_file_the_user_skipped(project, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    write(project / "a.py", SHIM_INPUT)
    write(project / "requirements.txt", "apex\n")
    result = run_cli(["-i", "--target", "shim", "."], project, input="n\n")
    assert result.output.count("Apply this change?") == 1
    assert "requirements.txt:1:1: AMP082 `apex` kept: a.py:1 imports `apex`" in result.output
    assert (project / "requirements.txt").read_text() == "apex\n"


def test_interactive_apply_all_covers_the_dependency_files_too(project, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    write(project / "a.py", SHIM_INPUT)
    write(project / "requirements.txt", "apex\n")
    result = run_cli(["-i", "--target", "shim", "."], project, input="a\n")
    assert result.output.count("Apply this change?") == 1
    assert (project / "requirements.txt").read_text() == "amp-migrate\n"
