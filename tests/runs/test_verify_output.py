"""What `amp-migrate verify` shows and keeps: the note when the copy is migrated for another
device than the tree, the tree's `[tool.amp-migrate]` settings, progress while it runs, each
run's own output (kept in files, streamed with `--show-output`), and a step table that names
what each run is and stays whole in an 80-column terminal."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Optional

import pytest
import torch
from rich.console import Console

from amp_migrate.runs import progress, tree_migration, verify_report, verify_run
from amp_migrate.runs.compare import Run, judge

from .test_verify_command import TRAIN, verify

#: The O1 script, writing a line to stderr as it starts.
LOUD = TRAIN.replace(
    "import argparse\n", "import argparse\nimport sys\n\nprint('starting', file=sys.stderr)\n", 1
)
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the copy runs on cuda where torch sees one")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "data" / "scale.txt").write_text("0.5\n")
    return root


class Recording(progress.Watch):
    """Every phase, step count and output line verify reports, in order."""

    wants_output = True

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def phase(self, name: str, steps: Optional[int] = None) -> None:
        self.events.append(("phase", name, steps))

    def step(self, done: int) -> None:
        self.events.append(("step", done))

    def output(self, prefix: str, line: str) -> None:
        self.events.append(("output", prefix + line))


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """One real verify of the O1 script, 4 steps, followed by a recording watch."""
    root = tmp_path_factory.mktemp("watched")
    (root / "data").mkdir()
    (root / "train.py").write_text(LOUD)
    (root / "data" / "scale.txt").write_text("0.5\n")
    watch = Recording()
    command = verify_run.parse_command(["python", "train.py", "--iterations", "6"], root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("system-temp")))
        outcome = verify_run.verify(command, root, verify_run.Settings(steps=4, device="cpu"), watch)
    return root, outcome, watch


@pytest.mark.slow
def test_verify_reports_each_phase_and_each_run_reaching_its_last_step(watched):
    _, outcome, watch = watched
    assert outcome.verdict.kind == "identical"
    phases = [event[1:] for event in watch.events if event[0] == "phase"]
    assert phases == [
        ("copying the tree", None),
        ("migrating the copy", None),
        ("legacy run", 4),
        ("migrated run", 4),
    ]
    for run, following in (("legacy run", "migrated run"), ("migrated run", None)):
        start = watch.events.index(("phase", run, 4))
        end = watch.events.index(("phase", following, 4)) if following else len(watch.events)
        counts = [event[1] for event in watch.events[start:end] if event[0] == "step"]
        assert counts == sorted(counts) and counts[-1] == 4  # never backwards, ends at the last step


@pytest.mark.slow
def test_each_runs_output_is_followed_line_by_line_with_its_prefix(watched):
    _, _, watch = watched
    lines = [event[1] for event in watch.events if event[0] == "output"]
    for prefix in ("[legacy] ", "[migrated] "):
        ours = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
        losses = [line for line in ours if line.startswith("it ")]
        # The 4th step stops the run inside its optimizer step, before the script prints "it 3".
        assert [line.split(" loss ")[0] for line in losses] == ["it 0", "it 1", "it 2"]
    # stderr too.
    assert "[legacy] starting" in lines and "[migrated] starting" in lines


@pytest.mark.slow
def test_each_runs_stdout_and_stderr_are_kept_outside_the_tree_after_verify(watched):
    root, outcome, _ = watched
    assert outcome.log_folder is not None and outcome.log_folder.is_dir()
    assert root not in outcome.log_folder.parents
    names = [(log.run, log.stdout.name, log.stderr.name) for log in outcome.logs]
    assert names == [
        ("legacy", "legacy.stdout", "legacy.stderr"),
        ("migrated", "migrated.stdout", "migrated.stderr"),
    ]
    for log in outcome.logs:
        stdout = log.stdout.read_text()
        # The script's own prints, the loss lines the recorder parses among them.
        assert re.findall(r"^it (\d) loss ", stdout, re.M) == ["0", "1", "2"]
        assert "starting\n" in log.stderr.read_text()
    legacy, migrated = outcome.logs
    assert "opt_level" in legacy.stdout.read_text()  # the shim's amp.initialize report
    assert "opt_level" not in migrated.stdout.read_text()
    assert sorted(p.name for p in root.iterdir()) == ["data", "train.py"]


@pytest.mark.slow
def test_the_step_table_fits_80_columns_with_every_value_whole(watched):
    _, outcome, _ = watched
    console = Console(width=80, record=True)
    verify_report.print_text(console, outcome)
    text = console.export_text()
    assert f"kept in\n  {outcome.log_folder}/\n" in text  # a path is not wrapped
    assert max(len(line) for line in text.replace(str(outcome.log_folder), "").splitlines()) <= 80
    assert "…" not in text
    for shim, native in zip(outcome.shim.records, outcome.native.records):
        for record in (shim, native):
            assert f"{record['param_sum']:.8g}" in text
            assert all(f"{loss:.8g}" in text for loss in record["losses"])
    assert re.search(r"┃ step ┃ +┃ legacy +┃ migrated \(native\) +┃", text)


def test_values_that_differ_are_shown_whole_at_80_columns():
    # Where the runs differ, values are shown exactly as recorded (repr): the widest cells.
    sums = [(-4.887525081634521, -4.887525081634522), (1e-05, 1.0000001e-05)]
    norm = 0.4999997436
    records = []
    for index, (sum_a, sum_b) in enumerate(sums):
        a = {"optimizer": 1, "skipped": False, "losses": [2.0041234567, 3.1234567e-7, 12.5]}
        a |= {"scales": [65536.0, 32768.0], "grad_norm": norm, "param_sum": sum_a}
        records.append((a, a | {"param_sum": sum_b, "grad_norm": norm + 5e-17 * index}))
    assert records[1][1]["grad_norm"] != norm
    shim = Run("shim", 0, tuple(a for a, _ in records))
    native = Run("native", 0, tuple(b for _, b in records))
    migration = verify_run.Migration(("train.py",), ("train.py",))
    command = verify_run.Command(Path("train.py"), ())
    outcome = verify_run.Outcome(judge(shim, native), shim, native, migration, command)
    console = Console(width=80, record=True)
    verify_report.print_text(console, outcome)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    words = set(text.replace(",", " ").split())
    for value in (*sums[0], *sums[1], norm, records[1][1]["grad_norm"]):
        assert repr(value) in words
    assert {"2.0041235", "3.1234567e-07", "12.5", "65536", "32768"} <= words
    assert re.search(r"┃ step ┃ +┃ legacy +┃ migrated \(shim\) +┃", text)


@pytest.mark.slow
def test_a_wide_console_keeps_one_row_per_step(watched):
    _, outcome, _ = watched
    console = Console(width=160, record=True)
    verify_report.print_text(console, outcome)
    text = console.export_text()
    assert re.search(r"step .*loss legacy .*loss migrated \(native\) .*param sum", text)
    assert len([line for line in text.splitlines() if re.match(r"│ \d +│", line)]) == 4


@pytest.mark.slow
@cpu_only
def test_the_copy_migrated_for_cpu_says_so_first_and_what_the_tree_migration_targets(tree):
    result = verify(tree, "--steps", "3", "--show-output", "--", "python", "train.py", "--iterations", "4")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "note: the copy is migrated with --device cpu --dtype float16",
        "      (torch cannot run cuda here); `amp-migrate .` in this tree targets",
        "      --device cuda --dtype float16 (the defaults).",
    ]
    # The script's own "cpu" default is no difference: only lines the migrations wrote count.
    assert "note: the two migrations differ only in the device and dtype arguments." in lines
    assert any(re.fullmatch(r"\[legacy\] it 0 loss [\d.]+", line) for line in lines)
    assert any(re.fullmatch(r"\[migrated\] it 1 loss [\d.]+", line) for line in lines)
    kept = lines.index("the runs' stdout and stderr are kept in")
    folder = Path(lines[kept + 1].strip())
    assert lines[kept + 2 :] == [
        "  [legacy] legacy.stdout  legacy.stderr",
        "  [migrated] migrated.stdout  migrated.stderr",
    ]
    assert "it 1 loss" in (folder / "migrated.stdout").read_text()


@pytest.mark.slow
def test_the_trees_config_chooses_target_and_dtype_and_json_says_so(tree):
    (tree / "pyproject.toml").write_text('[tool.amp-migrate]\ntarget = "shim"\ndevice = "cpu"\n')
    result = verify(tree, "--steps", "3", "--format", "json", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kept_shim"] == ["train.py"]  # the config's target, as `amp-migrate .` would
    assert document["migration"] == {
        "target": "shim",
        "unsafe_fixes": False,
        "device": "cpu",
        "dtype": "float16",
        "tree_device": "cpu",
        "tree_dtype": "float16",
        "config": str(tree / "pyproject.toml"),
        "differs_from_tree": False,
        "beyond_arguments": None,
        "same_code": None,
    }
    assert document["labels"] == {"shim": "legacy", "native": "migrated (shim)"}
    runs = document["logs"]["runs"]
    assert [(r["run"], r["rank"]) for r in runs] == [("legacy", None), ("migrated", None)]
    assert all(Path(r["stdout"]).is_file() and Path(r["stderr"]).is_file() for r in runs)
    assert Path(document["logs"]["folder"]) == Path(runs[0]["stdout"]).parent


@pytest.mark.slow
def test_a_terminal_shows_the_runs_progress_live(tree, monkeypatch):
    class Terminal(Console):
        def __init__(self, **options) -> None:
            super().__init__(force_terminal=True, width=80, **options)

    monkeypatch.setattr("rich.console.Console", Terminal)  # verify imports it when it runs
    result = verify(tree, "--steps", "3", "--device", "cpu", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    # The live line is drawn over and over; its last drawing, before it is cleared, is the end.
    assert "migrated run: step 3 of 3" in result.stdout
    assert "identical: 3 steps equal bit for bit" in result.stdout


@pytest.mark.slow
def test_a_plain_run_writes_no_progress_lines(tree):
    result = verify(tree, "--steps", "2", "--device", "cpu", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "step 2 of 2" not in result.output and "[legacy]" in result.output  # only the log list


def test_verify_takes_device_and_dtype_as_migrate_does(tree):
    result = verify(tree, "--device", "cuda:0", "--", "python", "train.py")
    assert result.exit_code == 2
    assert "device must be a device type such as 'cuda' or 'cpu', not 'cuda:0'" in result.output
    (tree / "pyproject.toml").write_text('[tool.amp-migrate]\ndtype = "float32"\n')
    result = verify(tree, "--", "python", "train.py")
    assert result.exit_code == 2
    assert "[tool.amp-migrate] dtype must be one of float16, bfloat16, not 'float32'" in result.output


def test_flags_win_over_the_config_and_an_unrunnable_device_becomes_cpu(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.amp-migrate]\ndevice = "cuda"\ndtype = "bfloat16"\n')
    monkeypatch.setattr(tree_migration, "runnable", lambda device: device == "cpu")
    choice = tree_migration.choose(tmp_path, None, None, None)
    assert (choice.device, choice.dtype, choice.tree_device, choice.tree_dtype) == (
        "cpu",
        "bfloat16",
        "cuda",
        "bfloat16",
    )
    assert choice.device_reason == "torch cannot run cuda here" and choice.target == "auto"
    flagged = tree_migration.choose(tmp_path, "native", "cpu", "float16")
    assert (flagged.target, flagged.device, flagged.dtype, flagged.device_reason) == (
        "native",
        "cpu",
        "float16",
        "verify's --device",
    )
    assert (flagged.tree_device, flagged.tree_dtype) == ("cuda", "bfloat16")
    monkeypatch.setattr(tree_migration, "runnable", lambda device: True)
    assert tree_migration.choose(tmp_path, None, None, None).differs is False


SYNCBN = """\
import torch
from apex import amp
from apex.parallel import convert_syncbn_model

model = convert_syncbn_model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for it in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).sum()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


def test_a_copy_migrated_otherwise_than_the_tree_is_named_beyond_the_arguments(tmp_path):
    # On cpu SyncBatchNorm has no torch equivalent, so the copy stays on the shim; for cuda
    # the tree's migration is native. verify must not claim the two differ in arguments only.
    (tmp_path / "train.py").write_text(SYNCBN)
    choice = tree_migration.Choice("auto", "cpu", "float16", "cuda", "float16", "--device cpu", None)
    migration = verify_run.migrate_copy(tmp_path, verify_run.Settings(device="cpu", tree=choice))
    assert migration.beyond_arguments == ("train.py: native in the tree, shim in the copy",)
    assert tree_migration.comparison_lines(migration.beyond_arguments) == [
        "note: the two migrations differ beyond the device and dtype arguments, first at:",
        "  train.py: native in the tree, shim in the copy",
    ]


@pytest.mark.parametrize(
    "target, beyond, same, note",
    [
        ("auto", (), False, "note: the two migrations differ only in the device and dtype arguments."),
        (
            "shim",
            (),
            True,
            "note: the two migrations write the same code (none of it names the device or dtype).",
        ),
    ],
)
def test_a_copy_migrated_for_cpu_is_compared_with_the_trees_cuda_migration(
    tmp_path, target, beyond, same, note
):
    (tmp_path / "train.py").write_text(TRAIN)
    choice = tree_migration.Choice(target, "cpu", "float16", "cuda", "float16", "verify's --device", None)
    settings = verify_run.Settings(device="cpu", target=target, tree=choice)
    migration = verify_run.migrate_copy(tmp_path, settings)
    assert (migration.beyond_arguments, migration.same_as_tree) == (beyond, same)
    assert tree_migration.comparison_lines(migration.beyond_arguments, migration.same_as_tree) == [note]
    assert ('GradScaler("cpu")' in (tmp_path / "train.py").read_text()) is (target == "auto")
