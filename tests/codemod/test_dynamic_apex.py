"""Apex reached dynamically (a module name in a string, source text run by `exec`/`eval`, an
attribute named at run time) is reported as AMP035 where it is, keeps the file's Apex names
bound (the shim), and makes `--check` fail, even in a file whose only Apex it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from amp_migrate import migrate_source
from amp_migrate.cli.main import main
from amp_migrate.cli.runner import Job, process
from amp_migrate.diagnostics import Severity
from amp_migrate.migrate import may_touch_apex, might_use_apex, python_ast, touches_apex
from amp_migrate.options import Options

# (source, line, col of the call, what the message says was found)
REPORTED = {
    "import_module": (
        'import importlib\namp = importlib.import_module("apex.amp")\n',
        2,
        7,
        "imports `apex.amp` by name",
    ),
    "import_module_of_apex": (
        'import importlib\napex = importlib.import_module("apex")\n',
        2,
        8,
        "imports `apex` by name",
    ),
    "dunder_import": ('apex = __import__("apex")\n', 1, 8, "imports `apex` by name"),
    "import_module_alias": (
        'from importlib import import_module as load\nopt = load("apex.optimizers")\n',
        2,
        7,
        "imports `apex.optimizers` by name",
    ),
    "import_module_fstring": (
        'import importlib\nm = importlib.import_module(f"apex.{name}")\n',
        2,
        5,
        "imports `apex.<run-time part>` by name",
    ),
    "import_module_package": (
        'import importlib\nm = importlib.import_module(".amp", package="apex")\n',
        2,
        5,
        "imports `apex.amp` by name",
    ),
    "exec": ('exec("from apex import amp")\n', 1, 1, "runs source text that names `apex`"),
    "eval": ('x = eval("apex.amp")\n', 1, 5, "runs source text that names `apex`"),
    "compile": (
        'code = compile("import apex", "<apex>", "exec")\n',
        1,
        8,
        "runs source text that names `apex`",
    ),
    "exec_names_an_apex_import": (
        'from apex import amp\nexec("amp.init()")\n',
        2,
        1,
        "runs source text that names `amp`",
    ),
    "getattr_on_apex": (
        'import apex\nname = "amp"\nm = getattr(apex, name)\n',
        3,
        5,
        "reads an attribute of `apex` named at run time",
    ),
    "getattr_on_amp": (
        "from apex import amp\n\n\ndef f(name):\n    return getattr(amp, name)\n",
        5,
        12,
        "reads an attribute of `apex.amp` named at run time",
    ),
}

NOT_REPORTED = {
    "find_spec": 'import importlib.util\nHAS_APEX = importlib.util.find_spec("apex") is not None\n',
    "import_module_of_a_variable": "import importlib\nm = importlib.import_module(name)  # apex\n",
    "re_compile": 'import re\nAPEX = re.compile(r"apex")\n',
    "eval_of_a_longer_word": 'x = eval("args.apex_level")\n',
    "import_module_of_another_package": 'import importlib\nm = importlib.import_module("apexx.amp")\n',
    "getattr_with_a_literal_name": 'import apex\nm = getattr(apex, "amp")\n',
    "getattr_on_a_non_apex_object": "import apex\nm = getattr(model, name)\n",
}


@pytest.mark.parametrize("target", ["auto", "shim", "native"])
@pytest.mark.parametrize("case", sorted(REPORTED))
def test_dynamic_apex_use_is_reported_at_the_call_under_every_target(case, target):
    source, line, col, found = REPORTED[case]
    result = migrate_source(source, target=target)
    (diagnostic,) = [d for d in result.diagnostics if d.code == "AMP035"]
    assert (diagnostic.line, diagnostic.col) == (line, col)
    assert diagnostic.severity == Severity.WARNING and not diagnostic.fixed
    assert found in diagnostic.message
    assert "dynamic Apex use; not migrated" in diagnostic.message
    assert "cannot see which Apex API it reaches" in diagnostic.message


@pytest.mark.parametrize("case", sorted(NOT_REPORTED))
def test_availability_checks_and_calls_that_do_not_name_apex_are_not_reported(case):
    result = migrate_source(NOT_REPORTED[case])
    assert "AMP035" not in {d.code for d in result.diagnostics}


@pytest.mark.parametrize(
    "case",
    [
        "exec",
        "eval",
        "compile",
        "import_module",
        "dunder_import",
        "import_module_alias",
        "import_module_fstring",
    ],
)
def test_a_file_whose_only_apex_is_dynamic_is_examined(case):
    """Every filter before the rules (the runner's text test, the parse's test of whether the
    code touches Apex, the cheap test that guards the second run) lets such a file through."""
    source = REPORTED[case][0]
    assert might_use_apex(source) and may_touch_apex(source)
    assert touches_apex(python_ast(source))


def test_dynamic_use_keeps_the_files_apex_names_bound_through_the_shim():
    """Native, `exec("amp.init()")` would run without the `amp` the rewrite removes."""
    source = (
        'from apex import amp\n\nmodel, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "exec(\"amp.register_half_function(torch, 'einsum')\")\n"
    )
    result = migrate_source(source)
    assert result.target_used == "shim" and "from amp_shim import amp" in result.code
    assert [d.code for d in result.diagnostics if d.code == "AMP035"] == ["AMP035"]  # reported once
    native = migrate_source(source, target="native")
    assert native.code == source and "AMP003" in {d.code for d in native.diagnostics}


def test_the_worker_reports_a_file_whose_only_apex_is_an_exec_string(tmp_path):
    path = tmp_path / "train.py"
    path.write_text('exec("from apex import amp")\n')
    result = process(Job(str(path), "python", Options()))
    assert result.scanned and not result.changed and result.error is None
    assert [f.diagnostic.code for f in result.findings] == ["AMP035"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _check(*args: str):
    return CliRunner().invoke(main, ["--check", *args], catch_exceptions=False)


@pytest.mark.parametrize(
    "case", ["exec", "eval", "import_module_alias", "import_module_fstring", "import_module_package"]
)
@pytest.mark.parametrize("target", ["auto", "shim"])
def test_check_exits_1_for_a_file_whose_only_apex_is_dynamic(in_tmp, case, target):
    (in_tmp / "train.py").write_text(REPORTED[case][0])
    result = _check("--target", target, "train.py")
    assert result.exit_code == 1, result.output
    assert "AMP035" in result.output and "dynamic Apex use; not migrated" in result.output
    assert (in_tmp / "train.py").read_text() == REPORTED[case][0]


def test_check_exits_0_for_an_availability_check_alone(in_tmp):
    (in_tmp / "train.py").write_text(NOT_REPORTED["find_spec"])
    assert _check("train.py").exit_code == 0


def test_check_counts_a_notebook_that_imports_apex_by_name(in_tmp):
    cell = {
        "cell_type": "code",
        "metadata": {},
        "outputs": [],
        "execution_count": None,
        "source": ["import importlib\n", 'amp = importlib.import_module("apex.amp")\n'],
    }
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (in_tmp / "train.ipynb").write_text(json.dumps(notebook))
    result = _check("train.ipynb")
    assert result.exit_code == 1, result.output
    assert "train.ipynb:cell 1:2:7: AMP035" in result.output


def test_the_tree_pass_report_of_a_run_time_import_is_not_restated(in_tmp):
    """In a Python file the tree pass reports `import_module("apex.amp")` itself (AMP032,
    which says what the files sharing its state do); AMP035 at the same call would say it twice."""
    (in_tmp / "train.py").write_text(REPORTED["import_module"][0])
    result = CliRunner().invoke(main, ["--check", "--format", "json", "train.py"], catch_exceptions=False)
    assert result.exit_code == 1
    (entry,) = json.loads(result.output)["files"]
    assert [(d["code"], d["line"], d["col"]) for d in entry["diagnostics"]] == [("AMP032", 2, 7)]


def test_the_in_memory_tree_pass_does_not_restate_a_run_time_import_either():
    from amp_migrate.project import migrate_project

    results = migrate_project({"train.py": REPORTED["import_module"][0]})
    assert [(d.code, d.line, d.col) for d in results["train.py"].diagnostics] == [("AMP032", 2, 7)]
