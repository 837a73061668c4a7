"""Install files through the command line, on small trees: what the migrated Python files
import decides each Apex entry, and every mode (--check, --diff, JSON, text, in place) covers
dependency files as it covers Python files."""

from __future__ import annotations

import json
import subprocess

from .conftest import NATIVE_INPUT, NO_APEX, run_cli

SHIM_FALLBACK = "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"
CONTRIB = "from apex.contrib.sparsity import ASP\nASP.prune_trained_model(model, optimizer)\n"


def _tree(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        path = tmp_path / "repo" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "repo"


def _entry(document, name):
    (entry,) = [f for f in document["files"] if f["path"].endswith(name) and f["kind"] != "python"]
    return entry


def test_check_exits_1_when_only_a_requirements_file_would_change(tmp_path):
    repo = _tree(tmp_path, {"train.py": NO_APEX, "requirements.txt": "torch\napex\n"})
    result = run_cli(["--check", "--format", "json", "repo"], tmp_path)
    document = json.loads(result.stdout)
    assert result.exit_code == 1
    entry = _entry(document, "requirements.txt")
    assert entry["kind"] == "requirements" and entry["changed"] and not entry["written"]
    assert [d["code"] for d in entry["diagnostics"]] == ["AMP080"]
    assert document["summary"]["dependency_files"] == 1 and document["summary"]["changed"] == 1
    assert (repo / "requirements.txt").read_text() == "torch\napex\n"


def test_check_exits_0_when_the_requirements_already_name_amp_migrate(tmp_path):
    _tree(tmp_path, {"train.py": "from amp_shim import amp\n", "requirements.txt": "torch\namp-migrate\n"})
    assert run_cli(["--check", "repo"], tmp_path).exit_code == 0


def test_diff_shows_the_dependency_edit_and_writes_nothing(tmp_path):
    repo = _tree(tmp_path, {"train.py": SHIM_FALLBACK, "requirements.txt": "torch\napex  # kernels\n"})
    result = run_cli(["--diff", "repo"], tmp_path)
    assert "Would migrate repo/requirements.txt (requirements)" in result.stdout
    assert "-apex  # kernels\n+amp-migrate  # kernels\n" in result.stdout
    assert "repo/requirements.txt:2:1: AMP081 `apex` → `amp-migrate`" in result.stdout
    assert "  dependency files" in result.stdout
    assert (repo / "requirements.txt").read_text() == "torch\napex  # kernels\n"


def test_json_diff_of_a_dependency_file(tmp_path):
    _tree(
        tmp_path,
        {"train.py": NATIVE_INPUT, "pyproject.toml": '[project]\nname = "x"\ndependencies = ["apex"]\n'},
    )
    document = json.loads(run_cli(["--diff", "--format", "json", "repo"], tmp_path).stdout)
    entry = _entry(document, "pyproject.toml")
    assert entry["kind"] == "pyproject" and entry["target_used"] is None
    assert '-dependencies = ["apex"]\n+dependencies = []\n' in entry["diff"]


def test_entry_removed_when_every_file_goes_native(tmp_path):
    repo = _tree(tmp_path, {"train.py": NATIVE_INPUT, "requirements.txt": "torch\napex\nnumpy\n"})
    assert run_cli(["repo"], tmp_path).exit_code == 0
    assert (repo / "requirements.txt").read_text() == "torch\nnumpy\n"


def test_entry_becomes_amp_migrate_when_a_file_falls_back_to_the_shim(tmp_path):
    repo = _tree(
        tmp_path,
        {
            "a.py": NATIVE_INPUT,
            "b.py": SHIM_FALLBACK,
            "requirements.txt": "apex @ git+https://github.com/NVIDIA/apex\n",
        },
    )
    assert run_cli(["repo"], tmp_path).exit_code == 0
    assert (repo / "requirements.txt").read_text() == "amp-migrate\n"


def test_entry_kept_with_a_warning_when_a_file_needs_what_the_shim_lacks(tmp_path):
    repo = _tree(tmp_path, {"train.py": CONTRIB, "requirements.txt": "apex\n"})
    document = json.loads(run_cli(["--format", "json", "repo"], tmp_path).stdout)
    (diagnostic,) = _entry(document, "requirements.txt")["diagnostics"]
    assert diagnostic["code"] == "AMP082" and diagnostic["severity"] == "warning"
    assert "repo/train.py:1 imports `apex.contrib.sparsity` (AMP470" in diagnostic["message"]
    assert (repo / "requirements.txt").read_text() == "apex\n"


def test_kept_entry_gets_amp_migrate_beside_it_when_another_file_uses_the_shim(tmp_path):
    repo = _tree(tmp_path, {"a.py": CONTRIB, "b.py": SHIM_FALLBACK, "requirements.txt": "torch\napex\n"})
    run_cli(["repo"], tmp_path)
    assert (repo / "requirements.txt").read_text() == "torch\napex\namp-migrate\n"


def test_apex_entry_removed_where_amp_migrate_is_already_declared(tmp_path):
    repo = _tree(tmp_path, {"b.py": SHIM_FALLBACK, "requirements.txt": "amp-migrate>=0.1\napex\n"})
    document = json.loads(run_cli(["--format", "json", "repo"], tmp_path).stdout)
    assert (repo / "requirements.txt").read_text() == "amp-migrate>=0.1\n"
    assert [d["code"] for d in _entry(document, "requirements.txt")["diagnostics"]] == ["AMP081"]


def test_a_file_migrated_to_the_shim_earlier_still_needs_amp_migrate(tmp_path):
    repo = _tree(tmp_path, {"train.py": "from amp_shim import amp\n", "requirements.txt": "apex\n"})
    run_cli(["repo"], tmp_path)
    assert (repo / "requirements.txt").read_text() == "amp-migrate\n"


def test_a_notebook_still_on_apex_keeps_the_entry(tmp_path):
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    notebook = {
        "cells": [dict(cell, source=["!nvidia-smi\n", *CONTRIB.splitlines(keepends=True)])],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    repo = _tree(tmp_path, {"explore.ipynb": json.dumps(notebook), "requirements.txt": "apex\n"})
    document = json.loads(run_cli(["--format", "json", "repo"], tmp_path).stdout)
    assert (repo / "requirements.txt").read_text() == "apex\n"
    (diagnostic,) = _entry(document, "requirements.txt")["diagnostics"]
    assert diagnostic["code"] == "AMP082"
    assert "repo/explore.ipynb:cell 1:2 imports `apex.contrib.sparsity` (AMP470)" in diagnostic["message"]


def test_install_files_follow_excludes_and_gitignore(tmp_path):
    repo = _tree(
        tmp_path,
        {
            "train.py": NO_APEX,
            "requirements.txt": "apex\n",
            "vendor/requirements.txt": "apex\n",
            "ignored/Dockerfile": "RUN pip install apex\n",
            ".gitignore": "ignored/\n",
        },
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    document = json.loads(
        run_cli(["--check", "--format", "json", "--exclude", "vendor", "repo"], tmp_path).stdout
    )
    assert [f["path"] for f in document["files"]] == ["repo/requirements.txt"]


def test_line_breaks_and_encoding_of_a_dependency_file_are_kept(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(NATIVE_INPUT)
    (repo / "requirements.txt").write_bytes("# für CUDA\r\ntorch\r\napex\r\nnumpy\r\n".encode())
    run_cli(["repo"], tmp_path)
    assert (repo / "requirements.txt").read_bytes() == "# für CUDA\r\ntorch\r\nnumpy\r\n".encode()


def test_text_report_names_each_apex_install_line_and_never_edits_it(tmp_path):
    dockerfile = "FROM python:3.11\nRUN git clone https://github.com/NVIDIA/apex && cd apex && pip install -v --global-option=--cuda_ext ./\n"
    repo = _tree(
        tmp_path, {"train.py": NATIVE_INPUT, "Dockerfile": dockerfile, "docs/setup.sh": "pip install apex\n"}
    )
    result = run_cli(["repo"], tmp_path)
    assert (
        "repo/Dockerfile:2:5: AMP084 clones Apex's repository, pip installs Apex, builds Apex's C++/CUDA "
        "extensions; no longer needed" in result.stdout
    )
    assert "repo/docs/setup.sh:1:1: AMP084 pip installs Apex; no longer needed" in result.stdout
    assert (repo / "Dockerfile").read_text() == dockerfile
    assert result.exit_code == 0


def test_a_file_that_does_not_mention_apex_is_counted_and_not_listed(tmp_path):
    _tree(tmp_path, {"train.py": NO_APEX, "README.md": "# A project\n", "requirements.txt": "torch\n"})
    document = json.loads(run_cli(["--check", "--format", "json", "repo"], tmp_path).stdout)
    assert document["files"] == [] and document["summary"]["files"] == 3


def test_entries_are_kept_when_no_python_file_was_given_to_judge_by(tmp_path):
    repo = _tree(tmp_path, {"requirements.txt": "apex\n", "Dockerfile": "RUN pip install apex\n"})
    document = json.loads(
        run_cli(["--format", "json", "repo/requirements.txt", "repo/Dockerfile"], tmp_path).stdout
    )
    assert (repo / "requirements.txt").read_text() == "apex\n"
    messages = [d["message"] for f in document["files"] for d in f["diagnostics"]]
    assert messages == [
        "pip installs Apex; no Python file or notebook under the given paths says whether it is still needed",
        "`apex` kept: no Python file or notebook under the given paths says whether it is still needed",
    ]


def test_a_dependency_file_changed_after_it_was_read_is_not_overwritten(tmp_path, monkeypatch):
    from amp_migrate.install import run

    repo = _tree(tmp_path, {"train.py": NATIVE_INPUT, "requirements.txt": "apex\n"})
    real = run.read_stamped

    def read_then_edited(path):
        read = real(path)
        (repo / "requirements.txt").write_text("apex\ntorch\n")  # someone saves the file meanwhile
        return read

    monkeypatch.setattr(run, "read_stamped", read_then_edited)
    result = run_cli(["--format", "json", "repo"], tmp_path)
    assert (repo / "requirements.txt").read_text() == "apex\ntorch\n"
    assert result.exit_code == 2
    assert _entry(json.loads(result.stdout), "requirements.txt")["error"]


def test_pyproject_entries_the_editor_cannot_reach_are_reported_not_skipped(tmp_path):
    pyproject = (
        '[project]\nname = "x"\noptional-dependencies = {cuda = ["apex"]}\n\n'
        '[tool.poetry.dependencies]\napex = {git = "https://github.com/NVIDIA/apex"}\n'
    )
    repo = _tree(tmp_path, {"train.py": NATIVE_INPUT, "pyproject.toml": pyproject})
    document = json.loads(run_cli(["--format", "json", "repo"], tmp_path).stdout)
    diagnostics = _entry(document, "pyproject.toml")["diagnostics"]
    assert [(d["code"], d["line"]) for d in diagnostics] == [("AMP083", 3), ("AMP083", 6)]
    assert "an array the editor does not reach" in diagnostics[0]["message"]
    assert "a Poetry dependency table" in diagnostics[1]["message"]
    assert (repo / "pyproject.toml").read_text() == pyproject


def test_a_run_given_part_of_a_project_judges_its_dependencies_by_the_rest_of_it_too(tmp_path):
    """`amp-migrate train.py requirements.txt` beside a finetune.py the run was not given, which
    still imports Apex: the entry stays, named for that file, instead of being removed."""
    repo = _tree(
        tmp_path,
        {"train.py": NATIVE_INPUT, "finetune.py": SHIM_FALLBACK, "requirements.txt": "torch\napex\n"},
    )
    document = json.loads(
        run_cli(["--format", "json", "repo/train.py", "repo/requirements.txt"], tmp_path).stdout
    )
    assert (repo / "requirements.txt").read_text() == "torch\napex\n"
    (diagnostic,) = _entry(document, "requirements.txt")["diagnostics"]
    assert diagnostic["code"] == "AMP082"
    assert "repo/finetune.py:1 imports `apex`" in diagnostic["message"], diagnostic["message"]
