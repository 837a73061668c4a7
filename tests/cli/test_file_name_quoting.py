"""A file name is printed so that it cannot forge a line of the text report nor drive the
terminal: a name with a control character, a backslash or a double quote is printed quoted,
with C escapes, as git does; ordinary names as they are. JSON keeps the real names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from amp_migrate.cli import main as cli
from amp_migrate.cli.quoting import quote_path
from amp_migrate.runs import verify_report, verify_run
from amp_migrate.runs.compare import Run, judge

from .conftest import SHIM_INPUT, run_cli, write

FORGING = "a.py\nb.py:8:14: AMP102 forged.py"
FORGING_SHOWN = '"a.py\\nb.py:8:14: AMP102 forged.py"'
TERMINAL = "t\tab\x1b[31m.py"
TERMINAL_SHOWN = '"t\\tab\\033[31m.py"'
FUSED_ADAM = "from apex.optimizers import FusedAdam\nopt = FusedAdam(model.parameters())\n"


@pytest.fixture
def tree(tmp_path):
    write(tmp_path / FORGING, FUSED_ADAM)
    write(tmp_path / TERMINAL, SHIM_INPUT)
    write(tmp_path / "café.py", SHIM_INPUT)
    write(tmp_path / "requirements.txt", "apex\n")
    return tmp_path


def assert_no_forged_line(output: str) -> None:
    assert not [line for line in output.splitlines() if line.startswith("b.py")], output
    assert "\x1b" not in output and "\t" not in output, output


def test_a_newline_in_a_name_forges_no_diagnostic_line(tree):
    result = run_cli(["--target", "native", "--diff", "."], tree)

    assert_no_forged_line(result.output)
    assert f"Would migrate {FORGING_SHOWN} (native)\n" in result.output
    assert f"\n--- {FORGING_SHOWN}\n+++ {FORGING_SHOWN}\n" in result.output
    assert f"\n{FORGING_SHOWN}:2:7: AMP500 FusedAdam" in result.output
    assert f"\n{TERMINAL_SHOWN}:1:1: AMP003 " in result.output
    assert "AMP082 `apex` kept: café.py:1 imports `apex`" in result.output


def test_names_in_migrated_lines_and_install_file_messages_are_quoted(tree):
    result = run_cli(["--target", "shim", "."], tree)

    assert result.exit_code == 0, result.output
    assert_no_forged_line(result.output)
    assert f"Migrated {FORGING_SHOWN} (shim" in result.output
    assert f"Migrated {TERMINAL_SHOWN} (shim" in result.output
    assert "Migrated café.py (shim" in result.output
    assert f"provides amp_shim: {FORGING_SHOWN}:1 imports `amp_shim.optimizers`" in result.output
    assert (tree / FORGING).read_text().startswith("from amp_shim.optimizers import FusedAdam")


def test_json_keeps_the_real_names(tree):
    result = run_cli(["--target", "shim", "--check", "--format", "json", "."], tree)

    document = json.loads(result.output)
    assert {entry["path"] for entry in document["files"]} == {
        FORGING,
        TERMINAL,
        "café.py",
        "requirements.txt",
    }


def test_errors_and_notes_quote_the_name(tmp_path):
    write(tmp_path / "bad\n.py", b"from apex import amp\n\xff\xfe\n")
    write(tmp_path / "target.py", SHIM_INPUT)
    os.symlink("target.py", tmp_path / "link\n.py")
    result = run_cli(["--target", "shim", "."], tmp_path)

    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith('"bad\\n.py": error: ')], result.output
    assert [line for line in lines if line.startswith('note: "link\\n.py": ')], result.output
    assert not [line for line in lines if line.startswith(".py")], result.output


def test_the_interactive_prompt_quotes_the_name(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_stdin_is_terminal", lambda: True)
    write(tmp_path / TERMINAL, SHIM_INPUT)
    result = run_cli(["-i", "--target", "shim", "."], tmp_path, input="n\n")

    assert result.output.startswith(f"{TERMINAL_SHOWN}\n"), result.output
    assert_no_forged_line(result.output)


@pytest.mark.parametrize(
    "name, shown",
    [
        ("pkg/train.py", "pkg/train.py"),
        ("my model.py", "my model.py"),
        ("café/模型.py", "café/模型.py"),
        ('say "hi".py', '"say \\"hi\\".py"'),
        ("back\\slash.py", '"back\\\\slash.py"'),
        ("cr\r.py", '"cr\\r.py"'),
        ("del\x7f.py", '"del\\177.py"'),
        (os.fsdecode(b"latin1-\xe9.py"), '"latin1-\\351.py"'),
        ("rtl\u202e.py", '"rtl\\342\\200\\256.py"'),
    ],
)
def test_a_name_is_quoted_only_where_a_terminal_would_not_show_it_as_it_is(name, shown):
    assert quote_path(name) == shown


def test_verify_quotes_the_names_of_the_copys_files():
    record = {"optimizer": 1, "skipped": False, "losses": [2.0], "scales": [65536.0], "param_sum": 1.5}
    shim, native = Run("shim", 0, (record,)), Run("native", 0, (record,))
    migration = verify_run.Migration((FORGING, "train.py"), (FORGING,))
    outcome = verify_run.Outcome(
        judge(shim, native), shim, native, migration, verify_run.Command(Path("train.py"), ())
    )
    console = Console(width=160, record=True)
    verify_report.print_text(console, outcome)
    text = console.export_text()

    assert f"migrated 2 file(s) in the copy: {FORGING_SHOWN}, train.py\n" in text
    assert f"kept on the shim (the copy runs with amp_shim): {FORGING_SHOWN}\n" in text
    assert_no_forged_line(text)
