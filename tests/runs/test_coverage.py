"""Which statements the migration wrote ran (amp_migrate/runs/coverage.py), on sources and
executed lines given by hand, and the recorder's line watch on real code, threads included."""

from __future__ import annotations

import threading
from pathlib import Path

from amp_migrate.runs.coverage import covered, describe, watch_list, written_statements
from amp_migrate.runs.locate import Source
from amp_migrate.runs.recorder import LineWatch

ORIGINAL = """\
import torch
from apex import amp


def save_checkpoint(model, path):
    torch.save(
        {
            "model": model.state_dict(),
            "amp": amp.state_dict(),
        },
        path,
    )


model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x in data:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""

MIGRATED = """\
import torch


def save_checkpoint(model, path):
    torch.save(
        {
            "model": model.state_dict(),
            "amp": scaler.state_dict(),
        },
        path,
    )


scaler = torch.amp.GradScaler(
    "cuda",
)
for x in data:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def statements():
    return written_statements({"train.py": Source.of(ORIGINAL, MIGRATED)})


def test_the_statements_are_the_written_lines_that_hold_code_one_per_statement():
    found = [(s.line, s.original_line, s.text, s.context) for s in statements()]
    assert found == [
        (8, 9, '"amp": scaler.state_dict(),', "save_checkpoint"),
        (14, 15, "scaler = torch.amp.GradScaler(", ""),  # its "cuda", line belongs to it
        (18, None, 'with torch.autocast("cuda", dtype=torch.float16):', ""),
        (20, 19, "scaler.scale(loss).backward()", ""),
        (21, 20, "scaler.step(optimizer)", ""),  # stands for optimizer.step(), by its names
        (22, 18, "scaler.update()", ""),  # no line like it: where the rewritten block starts
    ]
    # A body moved under the new autocast is not a statement the migration wrote.
    assert 19 not in {line for s in statements() for line in s.lines}


def test_a_statement_is_run_when_any_of_its_written_lines_executed(tmp_path: Path):
    executed = {str(tmp_path / "train.py"): [15, 18, 20, 21, 22]}
    coverage = covered(statements(), tmp_path, [executed])
    assert [s.line for s in coverage.ran] == [14, 18, 20, 21, 22]
    assert [s.text for s in coverage.not_run] == ['"amp": scaler.state_dict(),']


def test_ranks_are_merged_a_statement_that_ran_in_one_rank_ran(tmp_path: Path):
    path = str(tmp_path / "train.py")
    coverage = covered(statements(), tmp_path, [{path: [20]}, {path: [8]}])
    assert {s.line for s in coverage.ran} == {8, 20}


def test_the_text_block_names_each_statement_that_never_ran_with_its_function_and_lines(tmp_path: Path):
    executed = {str(tmp_path / "train.py"): [14, 18, 20, 21, 22]}
    lines = describe(covered(statements(), tmp_path, [executed]))
    assert lines == [
        "the migration's statements in the migrated run: 5 ran, 1 never ran",
        '  `"amp": scaler.state_dict(),` in save_checkpoint at train.py:8 (line 9 of the original) never ran',
    ]


def test_the_watch_list_gives_the_recorder_absolute_paths_and_lines(tmp_path: Path):
    watched = watch_list(statements(), tmp_path)
    assert watched == {str(tmp_path / "train.py"): [8, 14, 15, 18, 20, 21, 22]}


WATCHED = """\
def in_thread(out):
    out.append("thread")
    out.append("thread again")


def never_called(out):
    out.append("never")


def loop(out):
    for _ in range(3):
        out.append("loop")
"""


def test_the_line_watch_sees_lines_run_in_threads_and_not_those_never_run(tmp_path: Path):
    path = tmp_path / "watched.py"
    path.write_text(WATCHED)
    namespace: dict = {}
    exec(compile(WATCHED, str(path), "exec"), namespace)
    watch = LineWatch({str(path): [2, 3, 7, 12]})
    out: list = []
    watch.start()
    try:
        thread = threading.Thread(target=namespace["in_thread"], args=(out,))
        thread.start()
        thread.join()
        namespace["loop"](out)
        namespace["loop"](out)  # its one line was seen: no longer traced, still counted once
    finally:
        import sys

        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    assert watch.result() == {str(path): [2, 3, 12]}
    assert out.count("loop") == 6
