"""`amp-migrate verify` leaves the user's tree as it was and no process behind.

Each run has a copy of its own; where the machine allows it, the copy is bound over the tree's
path, so a program told to write to an absolute path inside the tree writes into its copy.
Where it does not (the supervisor's switch turns the namespace off, as on such a machine), an
absolute path into the tree on the command line is refused, and a write verify could not see
coming is reported as an error naming the file. A process the program starts in a session of
its own with an empty environment ends with the run all the same."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from amp_migrate.runs import isolate, tree_guard, verify_report, verify_run

from .test_verify_command import verify
from .test_verify_distributed import processes_with

#: Saves a checkpoint and appends to a log where it is told, plus, where config.txt names one,
#: to a path of its own choosing; and leaves a sleeper behind that nothing in verify started.
TRAIN = """\
import argparse
import os
import subprocess
import sys

import torch
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--log")
parser.add_argument("--tag")
args = parser.parse_args()

subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)", args.tag],
    start_new_session=True,
    env={},
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("it {} loss {}".format(it, loss.item()))
    torch.save({"amp": amp.state_dict(), "model": model.state_dict()}, args.out)
    with open(args.log, "a") as log:
        log.write(os.path.abspath(__file__) + "\\n")
    if os.path.exists("config.txt"):
        with open(open("config.txt").read().strip(), "a") as unseen:
            unseen.write("written\\n")
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "data" / "ckpt.pt").write_bytes(b"the user's own Apex checkpoint")
    (root / "log.txt").write_text("the user's log\n")
    return root


def contents(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


@pytest.fixture
def tag():
    """Marks the sleeper; one that survived the test is killed, so that a failure leaks nothing."""
    marker = uuid.uuid4().hex
    yield marker
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue  # gone meanwhile


@pytest.mark.slow
@pytest.mark.skipif(not verify_run.isolate_available(), reason="no user namespaces here")
def test_absolute_outputs_into_the_tree_land_in_each_runs_copy_and_no_process_outlives_verify(tree, tag):
    before = contents(tree)
    out, log = tree / "data" / "ckpt.pt", tree / "log.txt"
    args = ("--steps", "2", "--device", "cpu", "--", "python", "train.py", "--out", str(out))
    result = verify(tree, *args, f"--log={log}", "--tag", tag)
    assert result.exit_code == 0, result.output
    assert "identical: 2 steps equal bit for bit" in result.output
    assert "the migration's statements in the migrated run:" in result.output  # coverage read the copy
    assert contents(tree) == before
    assert processes_with(tag) == []


@pytest.mark.slow
def test_without_namespaces_an_absolute_path_into_the_tree_is_refused(tree, tag, monkeypatch):
    monkeypatch.setenv(isolate.NO_NAMESPACE, "1")
    before = contents(tree)
    result = verify(tree, "--device", "cpu", "--", "python", "train.py", f"--out={tree}/data/ckpt.pt")
    assert result.exit_code == 2, result.output
    assert f"argument --out={tree}/data/ckpt.pt: an absolute path into the current directory" in result.output
    monkeypatch.setenv("CHECKPOINTS", str(tree / "data"))
    result = verify(tree, "--device", "cpu", "--", "python", "train.py", "--out", "ckpt.pt")
    assert result.exit_code == 2, result.output
    assert f"environment variable CHECKPOINTS={tree / 'data'}" in result.output
    assert contents(tree) == before


@pytest.mark.slow
def test_a_write_into_the_tree_verify_could_not_foresee_is_an_error_naming_the_file(tree, tag, monkeypatch):
    # Relative outputs go to the copies; the path read from config.txt reaches the tree itself.
    monkeypatch.setenv(isolate.NO_NAMESPACE, "1")
    (tree / "config.txt").write_text(str(tree / "results.txt"))
    command = ["python", "train.py", "--out", "data/ckpt.pt", "--log", "log.txt", "--tag", tag]
    before = contents(tree)
    outcome = verify_run.verify(
        verify_run.parse_command(command, tree), tree, verify_run.Settings(steps=2, device="cpu")
    )
    assert processes_with(tag) == []
    assert not outcome.verdict.passed and outcome.verdict.kind == "changed your files"
    assert "identical: 2 steps equal bit for bit" in outcome.verdict.message  # the runs agreed
    assert (tree / "results.txt").read_text() == "written\n" * 2  # once per run (the second step stops it)
    assert contents(tree) == {**before, "results.txt": b"written\n" * 2}
    document = verify_report.json_document(outcome, 1)
    assert document["tree_changes"] == [{"path": "results.txt", "change": "created"}]
    assert document["verdict"] == "changed your files" and not document["passed"]
    console = Console(record=True, width=200)
    verify_report.print_text(console, outcome)
    assert "error: the runs created results.txt in your tree" in console.export_text()


def test_paths_into_the_tree_are_found_whole_after_an_equals_sign_and_in_path_lists_but_not_into_a_venv(
    tmp_path,
):
    (tmp_path / ".venv").mkdir()
    args = ["--out", f"{tmp_path}/a.pt", f"--data={tmp_path}", "/elsewhere/b.pt", f"{tmp_path}/.venv/lib"]
    environment = {"PATH": f"/usr/bin:{tmp_path}/bin", "VIRTUAL_ENV": f"{tmp_path}/.venv", "HOME": "/root"}
    found = tree_guard.paths_into_tree(args, environment, tmp_path, verify_run.not_copied())
    assert found == [
        f"argument {tmp_path}/a.pt",
        f"argument --data={tmp_path}",
        f"environment variable PATH=/usr/bin:{tmp_path}/bin",
    ]
