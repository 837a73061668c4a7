"""`amp-migrate verify` over a script whose batches come from DataLoader worker processes, and
the start-up state both runs share (seeds, deterministic algorithms).

The dataset draws its samples with torch's global RNG inside `__getitem__`, in the workers:
the runs can only agree if both seed the workers alike (DataLoader derives their seeds from the
main process's RNG, which the recorder seeds). `--steps` stops the program by an exception from
the optimizer step, in the middle of the loop over the loader: the workers must end with it,
without a hang and without errors on stderr. Where the step runs in a thread of the program's
own, the stop ends that thread instead of the main one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from amp_migrate.runs import verify_run

from .test_verify_command import verify
from .test_verify_distributed import processes_with

ROOT = Path(__file__).resolve().parents[2]

LOADER_TRAIN = '''\
"""A legacy Apex O1 script fed by a DataLoader with two worker processes."""
import argparse
import os
import random

import numpy
import torch
import torch.nn as nn
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1000)  # far more than any test's --steps
parser.add_argument("--persistent-workers", action="store_true")
parser.add_argument("--spawn", action="store_true")
parser.add_argument("--report", default=None, help="append the start-up state to this file")
parser.add_argument("--tag", default="")  # marks the processes, so a test can look for leftovers
args = parser.parse_args()


class Noisy(torch.utils.data.Dataset):
    """Samples drawn in the worker, from the worker's own (seeded) torch RNG."""

    def __len__(self):
        return 48

    def __getitem__(self, index):
        x = torch.randn(8)
        return x, x.sum(0, keepdim=True) + 0.1 * torch.randn(1)


def main():
    if args.report:
        with open(args.report, "a") as f:
            f.write(" ".join(str(v) for v in (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
                os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                torch.initial_seed(),
                random.random(),
                numpy.random.rand(),
            )) + "\\n")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loader = torch.utils.data.DataLoader(
        Noisy(),
        batch_size=8,
        num_workers=2,
        persistent_workers=args.persistent_workers,
        multiprocessing_context="spawn" if args.spawn else None,
    )
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            print("epoch {} loss {}".format(epoch, loss.item()))


if __name__ == "__main__":  # spawn workers import this file again
    main()
'''

#: Nothing a clean stop writes: the shim's own notices and warnings are all a run's stderr holds.
TROUBLE = ("Traceback", "Error", "Exception ignored", "killed by signal", "leaked")


@pytest.fixture
def loader_tree(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(LOADER_TRAIN)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["workers-per-epoch", "persistent-workers"])
def test_a_script_with_two_dataloader_workers_is_identical_and_stops_cleanly(loader_tree, persistent):
    # 6 batches an epoch: 8 steps cross into the second epoch, where per-epoch workers are new
    # processes seeded anew and persistent ones go on with their RNG.
    command = ["python", "train.py", *(["--persistent-workers"] if persistent else [])]
    outcome = verify_run.verify(
        verify_run.parse_command(command, loader_tree),
        loader_tree,
        verify_run.Settings(steps=8, device="cpu"),
    )
    assert outcome.verdict.message == "identical: 8 steps equal bit for bit", outcome.native.stderr
    for run in (outcome.shim, outcome.native):
        assert run.exit_code == 0 and len(run.records) == 8
        assert not [word for word in TROUBLE if word in run.stderr], run.stderr
    # Different batches every step: the workers' draws reached the training.
    assert len({record["losses"][0] for record in outcome.shim.records}) == 8


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [[], ["--persistent-workers"], ["--spawn", "--persistent-workers"]],
    ids=["forked-workers", "forked-persistent-workers", "spawned-persistent-workers"],
)
def test_the_recorder_stopping_mid_epoch_leaves_no_worker_behind(loader_tree, options):
    # The recorder alone, as verify starts it, so that nothing but its own stop ends the workers.
    tag = uuid.uuid4().hex
    result = loader_tree / "result.json"
    argv = [sys.executable, "-m", "amp_shim", str(verify_run.RECORDER), "--mode", "shim", "--max-steps", "3"]
    argv += ["--seed", "0", str(result), "train.py", *options, "--tag", tag]
    env = dict(verify_run.run_environment(), OMP_NUM_THREADS="1")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=loader_tree, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(result.read_text())
    assert data["stopped"] is True and len(data["step_records"]) == 3
    assert not [word for word in TROUBLE if word in proc.stderr], proc.stderr
    assert processes_with(tag) == []
    assert time.monotonic() - started < 120  # a worker's hang would show as the shutdown's timeout


@pytest.mark.slow
def test_both_runs_start_seeded_with_deterministic_algorithms_on(loader_tree):
    report = loader_tree.parent / f"{loader_tree.name}-start-up.txt"  # outside the copied tree
    result = verify(
        loader_tree, "--steps", "2", "--device", "cpu", "--", "python", "train.py", "--report", str(report)
    )
    assert result.exit_code == 0, result.output
    shim, native = report.read_text().splitlines()
    assert shim == native
    deterministic, warn_only, workspace, seed, *draws = shim.split()
    # warn_only: an op without a deterministic implementation warns instead of failing the run.
    assert (deterministic, warn_only, seed) == ("True", "True", "0")
    assert workspace == os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import random

    import numpy

    random.seed(0)
    numpy.random.seed(0)
    assert [float(v) for v in draws] == [random.random(), numpy.random.rand()]


THREAD_TRAIN = """\
import threading

import torch
import torch.nn as nn
from apex import amp

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")


def train():
    for it in range(100000):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()


thread = threading.Thread(target=train)
thread.start()
thread.join()
print("the main thread goes on after the training thread")
"""


@pytest.mark.slow
def test_a_training_loop_in_a_thread_of_its_own_stops_there_quietly(tmp_path):
    (tmp_path / "train.py").write_text(THREAD_TRAIN)
    outcome = verify_run.verify(
        verify_run.parse_command(["python", "train.py"], tmp_path),
        tmp_path,
        verify_run.Settings(steps=3, device="cpu"),
    )
    assert outcome.verdict.message == "identical: 3 steps equal bit for bit", outcome.native.stderr
    for run in (outcome.shim, outcome.native):
        assert run.exit_code == 0 and len(run.records) == 3
        assert "Exception in thread" not in run.stderr and "_StopRun" not in run.stderr, run.stderr
