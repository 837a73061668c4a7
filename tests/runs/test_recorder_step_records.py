"""The recorder's step records (amp_migrate/runs/recorder.py): one per optimizer step the
program asked for, equal between a legacy Apex program through the shim and its native
rewrite; `--max-steps` ends a run cleanly, `--seed` makes runs repeat.

Each program runs as the equivalence harness runs it: the recorder as a script
(`python [-m amp_shim] recorder.py --mode ... RESULT.json PROGRAM.py`), forked from an
interpreter that already imported torch (tests/forked_runs.py), fresh where the test is about
what a new process starts from.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from forked_runs import launch

ROOT = Path(__file__).resolve().parents[2]
RECORDER = ROOT / "amp_migrate" / "runs" / "recorder.py"

MODEL = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(32, 8)
y = torch.randn(32, 4)
"""

APEX_O1 = (
    MODEL
    + """
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == 3:
        loss = loss * float("inf")  # every grad overflows: this step is skipped
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
)

APEX_HANDLE = (
    MODEL
    + """
from apex import amp

# The old API: amp.init() and handle.wrap_optimizer, whose step skips after an overflow.
handle = amp.init(enabled=True)
optimizer = handle.wrap_optimizer(optimizer)
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if step == 3:
        loss = loss * float("inf")
    optimizer.zero_grad()
    with optimizer.scale_loss(loss) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
)

NATIVE_O1 = (
    MODEL
    + """
scaler = torch.amp.GradScaler("cpu")
for step in range(6):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    if step == 3:
        loss = loss * float("inf")
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""
)

TEN_STEPS_NATIVE = (
    MODEL
    + """
scaler = torch.amp.GradScaler("cpu")
for step in range(10):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    print("finished step", step)
"""
)

TEN_STEPS_PLAIN = (
    MODEL
    + """
for step in range(10):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("finished step", step)
"""
)

ACCUMULATION = (
    MODEL
    + """
scaler = torch.amp.GradScaler("cpu")
for step in range(3):
    optimizer.zero_grad()
    for micro in range(2):
        rows = slice(16 * micro, 16 * micro + 16)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows]) / 2
        print("micro loss", repr(float(loss)))
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""
)

RANDOM_DRAWS = """
import random

import numpy
import torch

# No seeding of its own: the weights and data come from whatever state --seed leaves.
model = torch.nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(32, 8)
y = torch.randn(32, 4)

for step in range(3):
    noise = torch.rand(()) + random.random() + float(numpy.random.rand())
    print("draws", float(torch.rand(())), random.random(), float(numpy.random.rand()))
    loss = torch.nn.functional.mse_loss(model(x), y) * noise
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def record(
    tmp_path: Path,
    name: str,
    source: str,
    mode: str,
    *options: str,
    exit_code: int = 0,
    fresh: bool = False,
) -> tuple[dict, str]:
    """Run `source` under the recorder, which must exit with `exit_code`; the result and the
    program's stdout (stderr after it, for a run that fails). The run is forked from a fork
    server that already imported torch (tests/forked_runs.py), as the equivalence harness runs
    it; `fresh=True` starts an interpreter of its own."""
    program = tmp_path / f"{name}.py"
    program.write_text(textwrap.dedent(source))
    result = tmp_path / f"{name}-{mode}.json"
    argv = [str(RECORDER), "--mode", mode, *options, str(result), str(program)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), str(ROOT), env.get("PYTHONPATH")]))
    rc, stdout, stderr = launch(argv, shim=mode == "shim", env=env, cwd=tmp_path, fresh=fresh, timeout=180)
    assert rc == exit_code, stderr
    return json.loads(result.read_text()), stdout + ("" if exit_code == 0 else stderr)


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [APEX_O1, APEX_HANDLE], ids=["initialize", "old_handle_api"])
def test_apex_o1_and_its_native_rewrite_give_equal_step_records_through_an_overflow(tmp_path, legacy):
    shim, _ = record(tmp_path, "apex_o1", legacy, "shim")
    native, _ = record(tmp_path, "native_o1", NATIVE_O1, "native")

    records = native["step_records"]
    assert [r["skipped"] for r in records] == [False, False, False, True, False, False]
    assert records[3]["losses"] == ["inf"] and records[3]["grad_norm"] is None
    assert records[2]["scales"] == [65536.0] and records[3]["scales"] == [32768.0]
    assert all(isinstance(r["grad_norm"], float) for i, r in enumerate(records) if i != 3)
    # A skipped step leaves the parameters as they were.
    assert records[3]["param_sum"] == records[2]["param_sum"]
    assert records[4]["param_sum"] != records[3]["param_sum"]
    assert shim["step_records"] == records


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, source, last_scales",
    [
        ("native", TEN_STEPS_PLAIN, []),
        ("native", TEN_STEPS_NATIVE, [65536.0]),
        # The fourth step overflows: its record has the halved scale, which native's
        # GradScaler sets only at the update() after the step.
        ("native", NATIVE_O1, [32768.0]),
        ("shim", APEX_O1, [32768.0]),
    ],
    ids=["plain", "grad_scaler", "grad_scaler_overflow", "apex_o1_overflow"],
)
def test_max_steps_ends_the_run_cleanly_after_that_many_records(tmp_path, mode, source, last_scales):
    result, stdout = record(
        tmp_path, "stop", source + 'print("program ran to its end")\n', mode, "--max-steps", "4"
    )
    assert result["stopped"] is True
    assert result["exit_code"] == 0
    assert len(result["step_records"]) == 4
    assert result["step_records"][-1]["scales"] == last_scales
    assert "program ran to its end" not in stdout


@pytest.mark.slow
def test_a_program_that_raises_keeps_its_step_records_and_fails(tmp_path):
    source = TEN_STEPS_PLAIN.replace('    print("finished step", step)', "    assert step < 2, 'boom'")
    result, output = record(tmp_path, "raises", source, "native", exit_code=1)
    assert "AssertionError: boom" in output
    assert result["exit_code"] == 1 and result["stopped"] is False
    assert len(result["step_records"]) == 3


@pytest.mark.slow
def test_a_run_that_ends_by_itself_is_not_stopped(tmp_path):
    source = TEN_STEPS_PLAIN + 'print("program ran to its end")\n'
    result, stdout = record(tmp_path, "plain", source, "native", "--max-steps", "40")
    assert result["stopped"] is False
    assert len(result["step_records"]) == 10
    assert "program ran to its end" in stdout


@pytest.mark.slow
def test_each_record_holds_the_unscaled_loss_of_every_accumulated_backward(tmp_path):
    result, stdout = record(tmp_path, "accumulation", ACCUMULATION, "native")
    printed = [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("micro loss")]
    records = result["step_records"]
    assert [len(r["losses"]) for r in records] == [2, 2, 2]
    assert [loss for r in records for loss in r["losses"]] == printed


@pytest.mark.slow
def test_seed_makes_two_runs_of_a_random_program_identical(tmp_path):
    # The two runs that must repeat each other are fresh interpreters: forked runs would start
    # from their fork server's random state, and `--seed` is what must make two new processes
    # draw alike. The other seed's run only has to draw otherwise: forked is enough.
    first = record(tmp_path, "draws", RANDOM_DRAWS, "native", "--seed", "7", fresh=True)
    again = record(tmp_path, "draws", RANDOM_DRAWS, "native", "--seed", "7", fresh=True)
    other = record(tmp_path, "draws", RANDOM_DRAWS, "native", "--seed", "8")
    assert first[0]["step_records"] == again[0]["step_records"]
    assert first[1] == again[1]
    draws = [line.split()[1:] for line in first[1].splitlines()]
    other_draws = [line.split()[1:] for line in other[1].splitlines()]
    # Each source (torch, random, numpy) follows the seed.
    for source in range(3):
        assert [d[source] for d in draws] != [d[source] for d in other_draws]
    assert first[0]["step_records"] != other[0]["step_records"]


FP16_OPTIMIZER = """
import torch
from apex.fp16_utils import FP16_Optimizer

torch.manual_seed(0)
model = torch.nn.Linear(8, 4).half()
optimizer = FP16_Optimizer(
    torch.optim.SGD(model.parameters(), lr=0.05),
    dynamic_loss_scale=True,
    dynamic_loss_args={"init_scale": 2.0**10},
    verbose=False,
)
x = torch.randn(32, 8).half()
y = torch.randn(32, 4)
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    if step == 3:
        loss = loss * float("inf")
    print("loss value", repr(float(loss)))
    optimizer.zero_grad()
    optimizer.backward(loss)
    optimizer.step()
"""


@pytest.mark.slow
def test_fp16_optimizer_steps_are_records_with_their_own_scale_and_unscaled_losses(tmp_path):
    result, stdout = record(tmp_path, "fp16_optimizer", FP16_OPTIMIZER, "shim")
    records = result["step_records"]
    assert [r["skipped"] for r in records] == [False, False, False, True, False, False]
    printed = [line.split()[-1] for line in stdout.splitlines() if line.startswith("loss value")]
    assert [str(r["losses"][0]) for r in records] == printed
    assert [r["scales"] for r in records[2:4]] == [[1024.0], [512.0]]
    assert records[3]["grad_norm"] is None and records[3]["param_sum"] == records[2]["param_sum"]
