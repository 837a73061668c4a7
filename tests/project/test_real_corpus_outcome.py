"""bench/real_corpus.py counts a file as an error only for a defect of amp-migrate; input a
careful person would refuse too (not Python 3, Apex modules the shim's release lacks) is
"refused", with the reason its diagnostic states."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from amp_migrate.cli.file_result import FileResult, Finding
from amp_migrate.cli.runner import Job, process
from amp_migrate.diagnostics import Diagnostic, Severity
from amp_migrate.options import Options

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


rc = _load("real_corpus")

PYTHON2_TRAINER = """\
from apex import amp
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
print "epoch", epoch
"""
TABS_AND_SPACES = "from apex import amp\nif fp16:\n        x = 1\n\ty = 2\n"
REPARAMETERIZED = """\
from apex import amp
from apex.reparameterization import apply_weight_norm
model = apply_weight_norm(model)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
"""
TRAINING_LOOP = """\
from apex import amp
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in data:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
OLD_FP16_OPTIMIZER = """\
from apex.optimizers import FusedAdam, FP16_Optimizer
optimizer = FP16_Optimizer(FusedAdam(model.parameters()), dynamic_loss_scale=True)
"""


def _run(tmp_path: Path, text: str) -> tuple[FileResult, bytes]:
    path = tmp_path / "train.py"
    path.write_text(text)
    return process(Job(str(path), "python", Options("auto"))), path.read_bytes()


@pytest.mark.parametrize("text", [PYTHON2_TRAINER, TABS_AND_SPACES], ids=["python2-print", "tabs-and-spaces"])
def test_input_that_is_not_python3_is_refused_not_an_error(tmp_path, text):
    result, data = _run(tmp_path, text)
    kind, reason = rc.outcome(result, data)
    assert kind == "refused"
    assert "not valid Python 3" in reason and "AMP001" in reason


@pytest.mark.parametrize(
    "text", [REPARAMETERIZED, OLD_FP16_OPTIMIZER], ids=["reparameterization", "old-fp16-optimizer"]
)
def test_apex_modules_the_shims_release_lacks_are_refused_with_the_name(tmp_path, text):
    result, data = _run(tmp_path, text)
    kind, reason = rc.outcome(result, data)
    assert kind == "refused", reason
    assert "AMP470" in reason and "release the shim reproduces" in reason


def test_a_parse_error_on_valid_python_is_our_error():
    """libcst failing on input Python 3 parses is a defect, not the input's fault."""
    finding = Finding(Diagnostic("AMP001", Severity.ERROR, 3, 1, "syntax error: unexpected", False))
    result = FileResult("train.py", "python", scanned=True, findings=(finding,))
    assert rc.outcome(result, b"x = 1\n")[0] == "error"


@pytest.mark.parametrize(
    "result",
    [
        FileResult(
            "train.py", "python", scanned=True, error="internal error, please report it: KeyError: 'x'"
        ),
        FileResult(
            "train.py",
            "python",
            scanned=True,
            findings=(
                Finding(
                    Diagnostic("AMP002", Severity.ERROR, 1, 1, "a second run would change the output", False)
                ),
            ),
        ),
        FileResult(
            "train.py",
            "python",
            scanned=True,
            findings=(
                Finding(Diagnostic("AMP470", Severity.ERROR, 2, 1, "`apex.contrib` is missing", False)),
                Finding(Diagnostic("AMP002", Severity.ERROR, 1, 1, "the output does not compile", False)),
            ),
        ),
    ],
    ids=["internal-error", "verification-failed", "refusal-beside-a-defect"],
)
def test_defects_are_errors(result):
    kind, reason = rc.outcome(result, b"from apex import amp\n")
    assert kind == "error"
    assert reason.startswith("train.py")


def test_migrated_files_count_by_target_and_untouched_ones_as_unchanged(tmp_path):
    native, data = _run(tmp_path, TRAINING_LOOP)
    assert rc.outcome(native, data) == ("native", "")
    assert rc.outcome(FileResult("a.py", "python"), b"x = 1\n") == ("unchanged", "")


def test_an_output_that_does_not_compile_is_a_defect():
    broken = FileResult("train.py", "python", changed=True, target_used="native", new_bytes=b"def f(:\n")
    assert "does not compile" in rc.output_defect(broken, None)


def test_an_output_a_second_run_changes_is_a_defect():
    first = FileResult("train.py", "python", changed=True, target_used="shim", new_bytes=b"x = 1\n")
    again = FileResult("train.py", "python", changed=True, target_used="shim", new_bytes=b"x = 2\n")
    assert "not idempotent" in rc.output_defect(first, again)
    assert rc.output_defect(first, FileResult("train.py", "python")) is None


def test_a_defect_overrides_the_outcome_in_the_table_entry():
    row = {"file_name": "o__r__train.py", "repo": "o/r", "path": "train.py", "lines": "3"}
    fine = FileResult("train.py", "python", changed=True, target_used="native", new_bytes=b"x = 1\n")
    assert rc._entry(row, fine, b"x = 0\n")["outcome"] == "native"
    entry = rc._entry(
        row, fine, b"x = 0\n", "train.py: the native output is not idempotent: a second run changes it"
    )
    assert entry["outcome"] == "error" and entry["reason"].startswith("o__r__train.py")
