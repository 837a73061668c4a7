"""`amp-migrate verify -- torchrun --nproc-per-node 2 SCRIPT`: a legacy Apex O1 program on two
DDP ranks over gloo (127.0.0.1) runs on the shim and migrated, each rank recorded and compared.

Each verify here starts two torchruns of two ranks (about 10 s each on a loaded 2-core
machine); how the ranks' verdicts combine is tested on records made by hand, and the command
parsing without running anything."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from amp_migrate.runs import verify_report, verify_run
from amp_migrate.runs.compare import Run

from .test_verify_command import break_migration, verify

DDP_TRAIN = '''\
"""A legacy Apex O1 program on DDP ranks: each rank draws its own batches, apex's DDP averages
the grads over gloo, so the ranks step in lockstep."""
import argparse
import time

import apex
import torch
import torch.distributed as dist
import torch.nn as nn
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=1000)
parser.add_argument("--tag", default="")  # marks the processes, so a test can look for leftovers
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
model = apex.parallel.DistributedDataParallel(model)
generator = torch.Generator().manual_seed(100 + rank)
for it in range(args.iterations):
    x = torch.randn(16, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print("rank {} it {} loss {}".format(rank, it, loss.item()))
dist.destroy_process_group()
'''

#: What the migrated copy's rank 1 does after its second step, in the tests that break it.
RANK_1_RAISES = (
    "    scaler.update()\n    if rank == 1 and it == 1:\n        raise RuntimeError('rank 1 broke')\n"
)
RANK_1_HANGS = "    scaler.update()\n    if rank == 1 and it == 1:\n        time.sleep(3600)\n"


@pytest.fixture
def ddp_tree(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(DDP_TRAIN)
    return tmp_path


def processes_with(marker: str) -> list[str]:
    """Command lines of the live processes that hold `marker` (torchrun agents and ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        if marker in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.slow
def test_a_faithful_ddp_migration_is_identical_on_every_rank(ddp_tree):
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"]
    result = verify(
        ddp_tree, "--steps", "4", "--device", "cpu", "--format", "json", "--show-output", "--", *command
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # --show-output streams to stderr in JSON mode
    assert document["verdict"] == "identical" and document["passed"] is True
    assert document["message"] == "identical: 4 steps equal bit for bit on each of 2 ranks"
    assert [(r["rank"], r["verdict"]) for r in document["ranks"]] == [(0, "identical"), (1, "identical")]
    assert all(r["exit_codes"] == {"shim": 0, "native": 0} for r in document["ranks"])
    assert len(document["records"]["shim"]) == 4  # every rank stopped at --steps, none hung
    assert document["migrated"] == ["train.py"]  # apex's DDP and amp became torch's
    assert (ddp_tree / "train.py").read_text() == DDP_TRAIN
    for run in ("legacy", "migrated"):
        for rank in (0, 1):
            assert f"[{run} rank {rank}] rank {rank} it 2 loss " in result.stderr
    logs = [(r["run"], r["rank"]) for r in document["logs"]["runs"]]
    assert logs == [
        (run, rank) for run in ("legacy", "migrated") for rank in (None, 0, 1)
    ]  # torchrun's own first
    rank_1 = Path(document["logs"]["runs"][2]["stdout"]).read_text()
    assert "rank 1 it 2 loss " in rank_1 and "rank 0 it" not in rank_1


@pytest.mark.slow
def test_a_rank_that_fails_in_the_migrated_copy_is_named_with_its_traceback(ddp_tree, monkeypatch):
    break_migration(monkeypatch, "    scaler.update()\n", RANK_1_RAISES)
    command = ["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"]
    result = verify(ddp_tree, "--steps", "4", "--device", "cpu", "--", *command)
    assert result.exit_code == 1, result.output
    assert "rank 1 of 2: the native run failed (exit 1)" in result.output
    assert "rank 1 migrated (native) run, end of stderr:" in result.output
    assert "RuntimeError: rank 1 broke" in result.output
    assert "identical" not in result.output.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.minutes
def test_a_rank_that_hangs_is_killed_at_the_timeout_and_fails(ddp_tree, monkeypatch):
    # Rank 1 of the migrated copy sleeps after its second step while rank 0 waits in the next
    # step's all-reduce: without the timeout verify would wait as long as gloo does (30 min).
    break_migration(monkeypatch, "    scaler.update()\n", RANK_1_HANGS)
    tag = uuid.uuid4().hex
    command = ["torchrun", "--nproc-per-node", "2", "train.py", "--tag", tag]
    result = verify(
        ddp_tree, "--steps", "4", "--device", "cpu", "--timeout", "40", "--format", "json", "--", *command
    )
    assert result.exit_code == 1, result.output
    document = json.loads(result.output)
    assert document["verdict"] == "run failed"
    # Both ranks were killed, rank 0 waiting for rank 1: neither raised first, so rank 0 is named.
    assert document["message"] == "rank 0 of 2: the native run failed (exit 124) (rank 1 did not pass either)"
    for rank in document["ranks"]:
        assert rank["exit_codes"] == {"shim": 0, "native": 124}
        assert "had not finished after 40 s and was killed" in rank["stderr_tail"]["native"]
    assert processes_with(tag) == []  # the agent and both ranks are gone


def step(param_sum: float) -> dict:
    return {
        "optimizer": 0,
        "skipped": False,
        "losses": [0.5],
        "scales": [65536.0],
        "grad_norm": 1.0,
        "param_sum": param_sum,
        "param_abs_sum": 3.0,
    }


def judged(shim: list[tuple[Run, float]], native: list[tuple[Run, float]], rtol: float = 0.0):
    migration = verify_run.Migration(("train.py",), ())
    command = verify_run.Command(Path("train.py"), (), len(shim))
    return verify_run.judge_ranks(shim, native, migration, command, rtol)


def ok(*sums: float) -> tuple[Run, float]:
    return Run("shim", 0, tuple(step(s) for s in sums)), float("inf")


def test_the_verdict_is_the_rank_that_diverged_and_the_report_names_it():
    native = [(Run("native", 0, (step(1.0), step(2.0))), float("inf"))]
    native.append((Run("native", 0, (step(1.0), step(2.5))), float("inf")))
    outcome = judged([ok(1.0, 2.0), ok(1.0, 2.0)], native)
    assert outcome.verdict.kind == "diverged" and outcome.rank == 1
    assert outcome.verdict.message == "rank 1 of 2: diverged at step 2: param_sum shim 2.0, native 2.5"
    assert outcome.native.records[1]["param_sum"] == 2.5  # the table shows the rank named
    document = verify_report.json_document(outcome, 1)
    assert document["rank"] == 1 and document["first_divergence"]["step"] == 2
    assert [(r["rank"], r["verdict"]) for r in document["ranks"]] == [(0, "identical"), (1, "diverged")]
    console = Console(record=True, width=160)
    verify_report.print_text(console, outcome)
    text = console.export_text()
    assert "rank 0: identical: 2 steps equal bit for bit\nrank 1: diverged at step 2" in text
    assert "rank 1, step by step:" in text


def test_among_failed_ranks_the_one_that_raised_first_is_named():
    # Rank 1 raised at t=100; rank 0's all-reduce lost its peer and raised at t=101.
    shim = [ok(1.0), ok(1.0)]
    native = [(Run("native", 1, (step(1.0),), "RuntimeError: Connection closed by peer"), 101.0)]
    native.append((Run("native", 1, (step(1.0),), "RuntimeError: rank 1 broke"), 100.0))
    outcome = judged(shim, native)
    assert outcome.rank == 1 and outcome.native.stderr.endswith("rank 1 broke")
    assert (
        outcome.verdict.message == "rank 1 of 2: the native run failed (exit 1) (rank 0 did not pass either)"
    )


def test_within_tolerance_reports_the_largest_difference_over_all_ranks():
    shim = [ok(1.0, 2.0), ok(1.0, 2.0)]
    native = [(Run("native", 0, (step(1.0), step(2.0002))), float("inf"))]
    native.append((Run("native", 0, (step(1.0), step(2.00002))), float("inf")))
    outcome = judged(shim, native, rtol=1e-3)
    assert outcome.verdict.passed and outcome.verdict.kind == "within tolerance" and outcome.rank == 0
    assert outcome.verdict.max_relative["param_sum"] == pytest.approx(1e-4, rel=1e-3)


@pytest.mark.parametrize(
    "command, nproc, args",
    [
        (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"], 2, ("--lr", "1")),
        (["torchrun", "--nproc_per_node=3", "--standalone", "train.py"], 3, ()),
        (["torchrun", "--standalone", "--nnodes=1", "train.py"], 1, ()),
        (
            [
                "python3",
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1:1",
                "--nproc-per-node",
                "2",
                "train.py",
            ],
            2,
            (),
        ),
        (["python", "train.py", "--nproc-per-node", "2"], 0, ("--nproc-per-node", "2")),
    ],
)
def test_torchrun_commands_are_read_for_their_ranks_and_script(ddp_tree, command, nproc, args):
    assert verify_run.parse_command(command, ddp_tree) == verify_run.Command(Path("train.py"), args, nproc)


@pytest.mark.parametrize(
    "command, message",
    [
        (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "train.py"], "one node (--nnodes 1)"),
        (
            ["torchrun", "--master-port", "29500", "train.py"],
            "torchrun option --master-port is not supported",
        ),
        (["torchrun", "--rdzv-endpoint=localhost:0", "train.py"], "option --rdzv-endpoint is not supported"),
        (["torchrun", "-m", "train"], "torchrun option -m is not supported"),
        (["torchrun", "--no-python", "train.py"], "torchrun option --no-python is not supported"),
        (["torchrun", "--nproc-per-node", "gpu", "train.py"], "takes a number of processes here; got 'gpu'"),
        (["torchrun", "--nproc-per-node"], "needs a value"),
        (["torchrun", "--nproc-per-node", "2"], "a script path after torchrun's options"),
        (["python", "-m", "torch.distributed.launch", "train.py"], "no interpreter options"),
        (["deepspeed", "train.py"], "got `deepspeed train.py`"),
    ],
)
def test_other_launchers_and_torchrun_options_are_usage_errors(ddp_tree, command, message):
    result = verify(ddp_tree, "--device", "cpu", "--", *command)
    assert result.exit_code == 2, result.output
    assert message in result.output
