"""Native code written for device "cuda" on a machine without CUDA trains in float32 there
(torch turns GradScaler and autocast off with one warning): the run says so in one note, in
text and JSON, with how to target the CPU, and looks at the machine only when such code is
written. CUDA_VISIBLE_DEVICES="" hides every GPU from torch, so these tests hold on a GPU
machine too."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jsonschema
import pytest

from amp_migrate.cli import cuda_here

from .conftest import NATIVE_INPUT, SHIM_INPUT, run_cli, run_process, write
from .test_notebooks import make_notebook

NOTE = 'this machine has no CUDA, and the native code this run would write for device "cuda" (1 file)'
WRITTEN_NOTE = 'this machine has no CUDA, and the native code written for device "cuda" (1 file)'


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _note_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "this machine has no CUDA" in line]


@pytest.mark.slow
def test_a_subprocess_without_cuda_prints_the_note_in_text_and_json(project, monkeypatch, schema):
    write(project / "train.py", NATIVE_INPUT)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    text = run_process(["--check", "train.py"], project)
    assert text.returncode == 1, text.stderr
    (line,) = _note_lines(text.stdout)
    assert line.startswith("note: " + NOTE)
    assert "`--device cpu`" in line and "`--device cpu --dtype bfloat16`" in line and "float32" in line
    document = json.loads(run_process(["--check", "--format", "json", "train.py"], project).stdout)
    jsonschema.validate(document, schema)
    (note,) = document["notes"]
    assert note == line.removeprefix("note: ")


def test_fix_mode_says_to_migrate_the_original_files_again(project, no_gpu):
    write(project / "train.py", NATIVE_INPUT)
    (line,) = _note_lines(run_cli(["train.py"], project).output)
    assert WRITTEN_NOTE in line and "migrate the original files again with `--device cpu`" in line


def test_no_note_for_device_cpu(project, no_gpu):
    write(project / "train.py", NATIVE_INPUT)
    result = run_cli(["--check", "--format", "json", "--device", "cpu", "train.py"], project)
    document = json.loads(result.stdout)
    assert document["files"][0]["target_used"] == "native" and document["notes"] == []
    assert not _note_lines(run_cli(["--check", "--device", "cpu", "train.py"], project).output)


def test_no_note_and_no_look_at_the_machine_without_a_native_file(project, no_gpu, monkeypatch):
    def looked():
        raise AssertionError("the machine was looked at")

    monkeypatch.setattr(cuda_here, "cuda_available", looked)
    write(project / "train.py", SHIM_INPUT)
    write(project / "plain.py", "import torch\n")
    document = json.loads(run_cli(["--check", "--format", "json", "."], project).stdout)
    assert document["files"][0]["target_used"] == "shim" and document["notes"] == []
    assert not _note_lines(run_cli(["--diff", "."], project).output)


def test_no_note_for_native_code_without_a_cuda_scaler_or_autocast(project, no_gpu):
    write(project / "norm.py", "from apex.normalization import FusedLayerNorm\nnorm = FusedLayerNorm(8)\n")
    document = json.loads(run_cli(["--check", "--format", "json", "norm.py"], project).stdout)
    assert document["files"][0]["target_used"] == "native" and document["notes"] == []


def test_a_notebook_written_for_cuda_counts(project, no_gpu):
    make_notebook(project / "nb.ipynb", [("code", NATIVE_INPUT)])
    write(project / "train.py", NATIVE_INPUT)
    (line,) = _note_lines(run_cli(["--check", "."], project).output)
    assert "(2 files)" in line


def test_no_note_where_cuda_is_there(project, monkeypatch):
    monkeypatch.setattr(cuda_here, "cuda_available", lambda: True)
    write(project / "train.py", NATIVE_INPUT)
    assert json.loads(run_cli(["--check", "--format", "json", "train.py"], project).stdout)["notes"] == []


@pytest.mark.parametrize(
    ("visible", "hidden"),
    [(None, False), ("", True), ("-1", True), (" ", True), ("0", False), ("1,0", False), ("GPU-5e1f", False)],
)
def test_cuda_visible_devices_is_read_as_torch_reads_it(visible, hidden):
    assert cuda_here._devices_hidden(visible) is hidden


@pytest.mark.parametrize(
    ("version_py", "build"),
    [
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", (False, False)),
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", (True, False)),
        ("cuda = None\nhip = '6.2.41133'\n", (False, True)),
    ],
)
def test_the_torch_build_is_read_from_its_version_file(tmp_path, monkeypatch, version_py, build):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "torch" / "version.py").write_text("from typing import Optional\n" + version_py)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cuda_here._torch_build() == build
    if not any(build):
        assert cuda_here.cuda_available() is False


@pytest.mark.slow
def test_the_check_does_not_import_torch(project):
    write(project / "train.py", NATIVE_INPUT)
    script = textwrap.dedent(
        """
        import sys
        from amp_migrate.cli.main import main
        try:
            main(["--check", "--format", "json", "train.py"], prog_name="amp-migrate")
        except SystemExit:
            pass
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert '"target_used": "native"' in done.stdout
