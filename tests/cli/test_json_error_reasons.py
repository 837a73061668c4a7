"""Every file the JSON report counts in `summary.errors` says in its `error` why it was left
untouched, whichever way it failed: a reason of its own (unreadable, undecodable, not a
regular file, not written), or its first error diagnostic, code and line included."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema

from .conftest import SHIM_INPUT, run_cli, write
from .test_notebooks import make_notebook

PROJECTS = Path(__file__).resolve().parents[2] / "fixtures" / "projects"
OLD_FP16_OPTIMIZER = (
    "if args.fp16:\n"
    "    from apex.optimizers import FP16_Optimizer, FusedAdam\n"
    "    optimizer = FP16_Optimizer(FusedAdam(params, max_grad_norm=1.0))\n"
)
SPANS_CELLS = [
    ("code", "import torch\nfrom apex import amp\nmodel, opt = amp.initialize(model, opt)\nout = model(x)"),
    ("code", "loss = out.sum()\nwith amp.scale_loss(loss, opt) as s:\n    s.backward()\nopt.step()"),
]


def _report(project: Path, *args: str) -> dict:
    result = run_cli(["--format", "json", "-j", "1", *args], project)
    document = json.loads(result.stdout)
    assert result.exit_code == document["exit_code"] == 2, result.stdout
    return document


def _errors(document: dict) -> dict[str, str]:
    """Each failed file's `error`, by path; every `error` there is a non-empty string."""
    reasons = {f["path"]: f["error"] for f in document["files"] if f["error"] is not None}
    assert all(isinstance(r, str) and r for r in reasons.values()), reasons
    assert document["summary"]["errors"] == len(reasons), (document["summary"], reasons)
    return reasons


def test_every_counted_error_has_its_reason_in_error(project, schema):
    write(project / "syntax.py", "from apex import amp\ndef f(:\n")
    write(project / "latin.py", b"from apex import amp\nx = '\xff'\n")
    write(project / "shim_lacks.py", OLD_FP16_OPTIMIZER)
    make_notebook(project / "broken.ipynb", [("code", "from apex import amp\ndef f(:\n")])
    write(project / "ok.py", SHIM_INPUT)
    os.mkfifo(project / "pipe.py")
    document = _report(project, "--check", "--target", "shim", ".")
    jsonschema.validate(document, schema)
    reasons = _errors(document)
    assert set(reasons) == {"syntax.py", "latin.py", "shim_lacks.py", "broken.ipynb", "pipe.py"}
    assert reasons["syntax.py"].startswith("AMP001 at line 2: ")
    assert reasons["shim_lacks.py"].startswith("AMP470 at line 2: `apex.optimizers.FP16_Optimizer`")
    assert reasons["broken.ipynb"].startswith("AMP001 at cell 1 line 2: ")
    assert "utf-8" in reasons["latin.py"] and "regular file" in reasons["pipe.py"]


def test_a_refused_native_target_and_a_refused_group_say_why(project):
    make_notebook(project / "span.ipynb", SPANS_CELLS)
    shutil.copytree(PROJECTS / "checkpoint_helper_sets_scale", project / "tree")
    reasons = _errors(_report(project, "--check", "--target", "native", "."))
    assert reasons["span.ipynb"].startswith("AMP003 at cell 1 line 1: ")
    assert reasons["tree/train.py"].startswith("AMP034 at line ")


def test_output_that_fails_verification_says_why(project, monkeypatch):
    from amp_migrate import migrate
    from amp_migrate.verify import VerificationError

    def fails(*args):
        raise VerificationError("the output does not compile")

    monkeypatch.setattr(migrate, "verify_output", fails)
    write(project / "a.py", SHIM_INPUT)
    reasons = _errors(_report(project, "--target", "shim", "a.py"))
    assert reasons["a.py"].startswith("AMP002 at line 1: ") and "does not compile" in reasons["a.py"]


def test_tab_indentation_that_cannot_be_kept_says_why(project, monkeypatch):
    from amp_migrate.io.indentation import TabIndents

    from .test_cr_and_tab_indentation import TAB_MIXED

    monkeypatch.setattr(TabIndents, "restore", lambda self, code: None)
    write(project / "train.py", TAB_MIXED)
    reasons = _errors(_report(project, "--target", "shim", "train.py"))
    assert reasons["train.py"].startswith("AMP004 at line 7: ")


def test_a_file_that_cannot_be_written_says_why(project, monkeypatch):
    from amp_migrate.cli import runner
    from amp_migrate.io.source_file import SourceError

    def refuse(path, data, expect=None):
        raise SourceError("cannot write: Read-only file system")

    monkeypatch.setattr(runner, "write_atomic", refuse)
    write(project / "a.py", SHIM_INPUT)
    reasons = _errors(_report(project, "--target", "shim", "a.py"))
    assert reasons == {"a.py": "cannot write: Read-only file system"}
