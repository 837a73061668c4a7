"""A group of files that must share a target (a script and the trainer it hands its amp state
to) is written whole or not at all, as far as any other amp-migrate run can see: a second run
started between two of its writes waits and then sees the whole group; a member edited by
someone else keeps the whole group as it was; Ctrl-C waits for the group's last write; and a
run killed in the middle of the group is completed by the next run.

Races are made deterministic by hooks: `runner.write`, which writes each member, and a
`fcntl.flock` that tells the test when the second run has to wait."""

import os
import signal
import subprocess
import sys
import time

import pytest

from amp_migrate.cli import runner
from amp_migrate.project import migrate as project_migrate

from .conftest import SHIM_INPUT, run_cli, write

TRAIN = """\
import torch
from apex import amp

from trainer import fit


def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    fit(model, optimizer, [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(2)])
    print("trained")


if __name__ == "__main__":
    main()
"""
TRAINER = """\
import torch
from apex import amp


def fit(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""
EDITED = TRAINER + "# edited by hand\n"
ARGS = ["--device", "cpu", "-j", "1", "."]

# Runs amp-migrate with a `fcntl.flock` that creates the file named first whenever a lock is
# busy, so that the test knows this run is waiting for another.
WAITING_RUN = """
import fcntl, sys
real = fcntl.flock
def flock(fd, operation):
    try:
        return real(fd, operation)
    except BlockingIOError:
        open(sys.argv[1], "a").close()
        raise
fcntl.flock = flock
from amp_migrate.cli.main import main
main(sys.argv[2:], prog_name="amp-migrate")
"""
# Runs amp-migrate and kills it (SIGKILL: no cleanup at all) right after the first file written.
KILLED_RUN = """
import os, signal, sys
from amp_migrate.cli import runner
real = runner.write
def write(result):
    done = real(result)
    if done.written:
        os.kill(os.getpid(), signal.SIGKILL)
    return done
runner.write = write
from amp_migrate.cli.main import main
main(sys.argv[1:], prog_name="amp-migrate")
"""


@pytest.fixture(autouse=True)
def state(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("AMP_MIGRATE_STATE_DIR", str(folder))
    return folder


@pytest.fixture
def group(project):
    write(project / "train.py", TRAIN)
    write(project / "trainer.py", TRAINER)
    return project


def targets(root):
    """What each file of the group is on now: apex, shim or native."""
    found = {}
    for name in ("train.py", "trainer.py"):
        text = (root / name).read_text()
        found[name] = "shim" if "amp_shim" in text else "apex" if "apex" in text else "native"
    return found


def assert_trains(root):
    proc = subprocess.run(
        [sys.executable, "train.py"],
        cwd=root,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-2000:]


def wait_until(condition, what):
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.01)


def after_first_write(monkeypatch, action):
    """Run `action(result)` once, right after the first member of the group is written."""
    real_write = runner.write
    done = []

    def write_then_act(result):
        written = real_write(result)
        if written.written and not done:
            done.append(result.path)
            action(written)
        return written

    monkeypatch.setattr(runner, "write", write_then_act)
    return done


def start_second_run(root, waiting, started):
    """Start a second run over `root` and return once it waits for a lock (or has ended)."""
    started.append(
        subprocess.Popen(
            [sys.executable, "-c", WAITING_RUN, str(waiting), *ARGS],
            cwd=root,
            env=dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    wait_until(lambda: waiting.exists() or started[0].poll() is not None, "the second run")


@pytest.mark.slow
def test_a_second_run_started_between_a_groups_writes_waits_and_sees_the_whole_group(
    group, monkeypatch, tmp_path
):
    second: list = []

    def start(written):
        assert written.path.endswith("train.py")
        start_second_run(group, tmp_path / "second-run-waits", second)

    after_first_write(monkeypatch, start)
    first = run_cli(ARGS, group)
    out, err = second[0].communicate(timeout=120)

    assert targets(group) == {"train.py": "native", "trainer.py": "native"}, (first.output, out, err)
    assert first.exit_code == 0, first.output
    assert second[0].returncode == 0, out + err
    assert "Migrated" not in out  # it found the group migrated, and nothing left to do
    assert_trains(group)


def test_a_member_edited_before_the_groups_write_keeps_the_whole_group_unwritten(group, monkeypatch):
    real_settle = project_migrate.Tree._settle

    def settle_then_edit(self, pending):
        finals = real_settle(self, pending)
        write(group / "trainer.py", EDITED)
        return finals

    monkeypatch.setattr(project_migrate.Tree, "_settle", settle_then_edit)
    result = run_cli(ARGS, group)

    assert result.exit_code == 2, result.output
    assert (group / "train.py").read_text() == TRAIN
    assert (group / "trainer.py").read_text() == EDITED
    assert "trainer.py: error: changed during migration, not written" in result.output
    assert (
        "train.py: error: not written: its group is written whole or not at all, and trainer.py "
        "could not be (changed during migration, not written)"
    ) in result.output


def test_a_member_edited_during_the_groups_write_puts_the_written_one_back(group, monkeypatch):
    after_first_write(monkeypatch, lambda written: write(group / "trainer.py", EDITED))
    result = run_cli(ARGS, group)

    assert result.exit_code == 2, result.output
    assert (group / "train.py").read_text() == TRAIN
    assert (group / "trainer.py").read_text() == EDITED
    assert "train.py: error: not written (put back as it was)" in result.output
    assert "trainer.py: error: changed during migration, not written" in result.output


@pytest.mark.slow
def test_a_second_run_never_sees_a_member_written_before_its_group_was_put_back(group, monkeypatch, tmp_path):
    second: list = []

    def edit_then_start(written):
        write(group / "trainer.py", EDITED)  # someone else, in place: the first run puts train.py back
        start_second_run(group, tmp_path / "second-run-waits", second)

    after_first_write(monkeypatch, edit_then_start)
    first = run_cli(ARGS, group)
    out, err = second[0].communicate(timeout=120)

    assert first.exit_code == 2, first.output
    assert "train.py: error: not written (put back as it was)" in first.output
    # The second run read train.py as put back, beside the edited trainer.py: one group again.
    assert second[0].returncode == 0, out + err
    assert targets(group) == {"train.py": "native", "trainer.py": "native"}, out + err
    assert "# edited by hand" in (group / "trainer.py").read_text()


def test_ctrl_c_during_a_groups_writes_takes_effect_after_the_last(
    group, monkeypatch, ctrl_c_as_from_a_terminal
):
    after_first_write(monkeypatch, lambda written: os.kill(os.getpid(), signal.SIGINT))
    result = run_cli(ARGS, group)

    assert result.exit_code == 130, result.output
    assert "Interrupted: 2 file(s) written in full" in result.output
    assert targets(group) == {"train.py": "native", "trainer.py": "native"}


def kill_after_first_write(root):
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, *ARGS],
        cwd=root,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert targets(root) == {"train.py": "native", "trainer.py": "apex"}


@pytest.mark.slow
def test_the_next_run_completes_a_group_whose_run_was_killed_midway(group, state):
    kill_after_first_write(group)
    assert len(list(state.rglob("*.json"))) == 1  # the killed run's journal

    again = run_cli(ARGS, group)

    assert again.exit_code == 0, again.output
    assert targets(group) == {"train.py": "native", "trainer.py": "native"}
    assert (
        "an earlier run was stopped while writing this file's group; this run completed it (written now)"
        in again.output
    )
    assert not list(state.rglob("*.json"))


@pytest.mark.slow
def test_the_next_run_given_only_the_unwritten_member_completes_the_group(group, state):
    kill_after_first_write(group)
    again = run_cli(["--device", "cpu", "trainer.py"], group)

    assert again.exit_code == 0, again.output
    assert targets(group) == {"train.py": "native", "trainer.py": "native"}
    assert "this run completed it (written now)" in again.output


@pytest.mark.slow
def test_a_member_edited_after_the_kill_is_reported_and_left_as_it_is(group, state):
    kill_after_first_write(group)
    write(group / "trainer.py", EDITED)

    again = run_cli(ARGS, group)

    assert again.exit_code == 2, again.output
    assert (group / "trainer.py").read_text() == EDITED
    assert targets(group)["train.py"] == "native"
    assert (
        "trainer.py: error: left as it is: an earlier run was stopped while writing its group, and "
        "completing the group failed here: it changed since that run read it"
    ) in again.output
    assert not list(state.rglob("*.json"))


@pytest.mark.slow
def test_check_after_a_killed_group_write_says_the_group_is_half_written_and_writes_nothing(group, state):
    kill_after_first_write(group)
    check = run_cli(["--check", *ARGS], group)

    assert targets(group) == {"train.py": "native", "trainer.py": "apex"}
    assert "what is shown may be the group half written" in check.output
    assert len(list(state.rglob("*.json"))) == 1  # the next run that writes completes it


HOLD_LOCK = """
import fcntl, sys
with open(sys.argv[1], "rb") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
"""


@pytest.mark.slow
def test_a_file_another_run_keeps_locked_is_reported_after_a_bounded_wait(project, monkeypatch):
    path = write(project / "solo.py", SHIM_INPUT)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        monkeypatch.setattr("amp_migrate.io.file_locks.WAIT_SECONDS", 0.5)
        result = run_cli(["--target", "shim", "-j", "1", "."], project)
    finally:
        holder.communicate("", timeout=60)

    assert result.exit_code == 2, result.output
    assert "solo.py: error: another amp-migrate run kept it locked for over 0.5 s, not read" in result.output
    assert path.read_text() == SHIM_INPUT
