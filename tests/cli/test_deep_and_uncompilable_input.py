"""Hostile input: a file nested too deeply for Python, or refused by Python's compiler, is that
one file's AMP001 error, left untouched, and the run migrates every other file; a file Python
compiles, however deep, is migrated."""

from __future__ import annotations

import json

import pytest

from .conftest import NATIVE_INPUT, run_cli, snapshot, write

TOO_DEEP = "AMP001 expressions nested too deeply to read (Python's recursion limit)"


def _sum(terms: int) -> str:
    return "x = " + " + ".join(["a"] * terms) + "\n"


def _migrated_natively(text: str) -> bool:
    return "apex" not in text and "torch.amp.GradScaler" in text


@pytest.mark.slow
def test_a_sum_too_deep_for_python_is_one_files_error_and_the_others_are_migrated(project):
    write(project / "deep.py", NATIVE_INPUT + _sum(5000))
    write(project / "plain_deep.py", "# scale_loss is done elsewhere\n" + _sum(5000))
    write(project / "one.py", NATIVE_INPUT)
    write(project / "two.py", NATIVE_INPUT.replace("O1", "O2"))
    before = snapshot(project)
    result = run_cli(["--jobs", "2", "."], project)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert [line for line in result.output.splitlines() if ": AMP001 " in line] == [
        f"deep.py:1:1: {TOO_DEEP}"
    ]
    assert (project / "deep.py").read_bytes() == before["deep.py"]
    assert (project / "plain_deep.py").read_bytes() == before["plain_deep.py"]
    for name in ("one.py", "two.py"):
        assert f"Migrated {name} (native)" in result.output
        assert _migrated_natively((project / name).read_text()), name


@pytest.mark.slow
def test_a_sum_python_compiles_is_migrated_and_the_output_compiles(project):
    write(project / "long_sum.py", NATIVE_INPUT + _sum(1500))
    result = run_cli(["--jobs", "1", "."], project)
    assert result.exit_code == 0, result.output
    assert "Migrated long_sum.py (native)" in result.output
    code = (project / "long_sum.py").read_text()
    assert _migrated_natively(code) and code.endswith(_sum(1500))
    compile(code, "long_sum.py", "exec")


def test_parentheses_nested_past_pythons_limit_are_amp001_and_untouched(project):
    write(project / "parens.py", NATIVE_INPUT + "x = " + "(" * 1000 + "1" + ")" * 1000 + "\n")
    write(project / "one.py", NATIVE_INPUT)
    before = snapshot(project)
    result = run_cli(["--jobs", "1", "--format", "json", "."], project)
    assert result.exit_code == 2, result.output
    files = {f["path"]: f for f in json.loads(result.output)["files"]}
    [error] = [d for d in files["parens.py"]["diagnostics"] if d["severity"] == "error"]
    assert (error["code"], error["line"], error["message"]) == (
        "AMP001",
        10,
        "syntax error: too many nested parentheses",
    )
    assert (project / "parens.py").read_bytes() == before["parens.py"]
    assert _migrated_natively((project / "one.py").read_text())


def test_a_notebook_cell_too_deep_or_refused_by_python_is_amp001_and_untouched(project):
    import nbformat

    for name, cell in (("deep.ipynb", _sum(5000)), ("parens.ipynb", "x = " + "(" * 300 + "1" + ")" * 300)):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(NATIVE_INPUT), nbformat.v4.new_code_cell(cell)]
        write(project / name, nbformat.writes(nb))
    before = snapshot(project)
    result = run_cli(["--jobs", "1", "."], project)
    assert result.exit_code == 2, result.output
    assert TOO_DEEP in result.output
    assert "AMP001 syntax error: too many nested parentheses" in result.output
    assert "internal error" not in result.output
    assert snapshot(project) == before


def test_a_magics_code_too_deep_for_python_stays_as_text_and_the_notebook_is_migrated(project):
    import nbformat

    nb = nbformat.v4.new_notebook()
    magic = "%time x = " + " + ".join(["a"] * 5000)
    nb.cells = [nbformat.v4.new_code_cell(NATIVE_INPUT), nbformat.v4.new_code_cell(magic)]
    write(project / "timed.ipynb", nbformat.writes(nb))
    result = run_cli(["--jobs", "1", "."], project)
    assert result.exit_code == 0, result.output
    assert "Migrated timed.ipynb (native)" in result.output
    cells = nbformat.reads((project / "timed.ipynb").read_text(), as_version=4).cells
    assert _migrated_natively(cells[0].source) and cells[1].source == magic
