"""`amp-migrate verify`: migrate a copy of the user's tree and run both versions, recorded.

Neither run may change the user's files, so each runs in a temporary copy of the tree (data
and config files included, so relative paths resolve as they do in the original): the original
program as it is, through the shim's `apex` alias, in one; the migrated program in another.
Where the machine allows it, each copy is bound over the tree's own path in a private mount
namespace (`isolate.py`), so that the program runs at the path the user runs it at and writes
by absolute paths into the tree land in its copy too; where it does not, absolute paths into
the tree on the command line or in the environment are refused. Whatever the runs changed in
the tree all the same is reported as an error (`tree_guard`). Both go through the same
recorder the equivalence tests use, with the same command line, seed, step limit and
environment, one after the other; `compare.judge` gives the verdict. A torchrun command runs
as torchrun on each side, the recorder in every rank; each rank is judged, and the verdict is
the worst rank's (`judge_ranks`). No run outlives verify: each runs under a supervisor that
ends every process below it, and a run past the timeout is stopped the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from .. import project
from ..differences import Difference, for_codes
from ..project import migrate_project
from . import isolate, tree_guard
from .compare import (
    AMP_NEVER_RAN,
    AS_DOCUMENTED,
    DIVERGED,
    FAILED,
    IDENTICAL,
    NO_STEPS,
    STEP_COUNTS,
    TREE_CHANGED,
    WITHIN_TOLERANCE,
    Run,
    Verdict,
    failed_before_first_step,
    judge,
    with_tree_changes,
)
from .coverage import Coverage, Statement, covered, watch_list, written_statements
from .locate import Location, Source, changed_sources, locate
from .progress import Watch
from .recorder import forbidden_imports
from .run_logs import LEGACY, MIGRATED, RunLog, Tail, new_folder, rank_logs, steps_done
from .tree_migration import Choice, beyond_arguments, same_code

RECORDER = Path(__file__).with_name("recorder.py")
SUPERVISOR = Path(isolate.__file__)
SUPPORTED = "python SCRIPT [ARGS...]"
DISTRIBUTED = "torchrun [--standalone] [--nnodes 1] --nproc-per-node N SCRIPT [ARGS...]"
#: Folders that are no part of the program: version control, caches, virtual environments.
_SKIPPED = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
#: Of those, what a run has no use for: its copy lacks them at the tree's path too.
_CACHES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?")
#: The shim's alias switches: the shim run sets its own, the native run must not inherit one.
_ALIAS_VARIABLES = ("AMP_SHIM_ALIAS", "AMP_SHIM_ALIAS_ANNOUNCED")
#: The spellings of torchrun's processes-per-node option.
_NPROC = ("--nproc-per-node", "--nproc_per_node")
#: The exit status of a run stopped at the timeout, as coreutils' `timeout` reports it.
TIMED_OUT = 124
#: Carries a token unique to each run into every process the run starts, so that none outlives it.
_RUN_TOKEN = "AMP_MIGRATE_VERIFY_RUN"
#: The migrated run where the legacy run failed before its first step: nothing to compare it with.
NOT_STARTED = Run("native", 0, started=False)
#: How often a running run is looked at for progress and output, in seconds.
_POLL = 0.2
#: How long a supervisor asked to stop may take to end its run's processes, in seconds.
_STOPPING = 10.0
#: Verdicts from worst to best: a distributed verdict is its worst rank's.
_WORST_FIRST = (
    TREE_CHANGED,
    FAILED,
    NO_STEPS,
    STEP_COUNTS,
    DIVERGED,
    AMP_NEVER_RAN,
    AS_DOCUMENTED,
    WITHIN_TOLERANCE,
    IDENTICAL,
)


class UsageProblem(ValueError):
    """A command line `verify` cannot run (the CLI reports it as a usage error, exit 2)."""


@dataclass(frozen=True)
class Command:
    script: Path  # relative to the tree's root
    args: tuple[str, ...]
    nproc: int = 0  # torchrun's processes (ranks) on this machine; 0: one `python SCRIPT` process


@dataclass(frozen=True)
class Settings:
    steps: int = 20
    device: str = "cuda"
    dtype: str = "float16"
    target: str = "auto"
    rtol: Optional[float] = None  # None: bit for bit, or compare.PRECISION_RTOL (see compare.judge)
    timeout: Optional[float] = 900.0  # seconds each run may take before it counts as hung; None: no limit
    allow_no_amp: bool = False  # a legacy run in which no amp call ran may pass (compare.judge)
    # The tree's own migration, when it is not the copy's (the copy's migration is compared with it).
    tree: Optional[Choice] = None
    unsafe_fixes: bool = False  # the copy is migrated with --unsafe-fixes

    @classmethod
    def of(
        cls, choice: Choice, steps: int, rtol: Optional[float], timeout: Optional[float], allow_no_amp: bool
    ) -> "Settings":
        """The settings of a run whose migration options `choice` settled."""
        return cls(
            steps,
            choice.device,
            choice.dtype,
            choice.target,
            rtol,
            timeout,
            allow_no_amp,
            choice,
            choice.unsafe_fixes,
        )


@dataclass(frozen=True)
class Migration:
    changed: tuple[str, ...]  # files of the copy that the migration rewrote, relative paths
    shim_files: tuple[str, ...]  # those rewritten to the shim rather than to native torch.amp
    # Where the copy's code differs from the tree's migration beyond the device and dtype
    # arguments (tree_migration.beyond_arguments); None: the two are migrated alike.
    beyond_arguments: Optional[tuple[str, ...]] = None
    same_as_tree: bool = False  # compared, and the two codes are the same
    #: The unsafe fixes applied (codes), whose docs/differences.md entries the verdict accepts.
    unsafe_codes: tuple[str, ...] = ()
    #: Native files that keep a class torch has none of from `amp_shim` (AMP505: FusedLAMB).
    shim_classes: tuple[str, ...] = ()

    @property
    def imports_shim(self) -> bool:
        """Whether the migrated copy imports `amp_shim` where it runs (the recorder's migrated mode)."""
        return bool(self.shim_files or self.shim_classes)

    @property
    def documented(self) -> tuple[Difference, ...]:
        return for_codes(self.unsafe_codes)


@dataclass(frozen=True)
class RankOutcome:
    """One rank of a torchrun command: its two runs and their verdict."""

    rank: int
    verdict: Verdict
    shim: Run
    native: Run
    failed_at: float = float("inf")  # when the first of its runs raised (time.time()); inf: neither


@dataclass(frozen=True)
class Outcome:
    """The verdict and the runs it is about. Under torchrun `ranks` holds every rank, and
    `shim`, `native` and the verdict's divergence are those of the worst one, `rank`."""

    verdict: Verdict
    shim: Run
    native: Run
    migration: Migration
    command: Command
    ranks: tuple[RankOutcome, ...] = ()
    rank: Optional[int] = None
    # The statements to look at where the runs diverged (None when they did not).
    location: Optional[Location] = None
    # Which statements the migration wrote ran in the migrated run (None: it did not run, or
    # wrote nothing about them).
    coverage: Optional[Coverage] = None
    logs: tuple[RunLog, ...] = ()  # each run's stdout and stderr, kept after verify ends
    log_folder: Optional[Path] = None
    # The tree's files that changed while verify ran (the verdict is then TREE_CHANGED).
    tree_changes: tuple[tree_guard.Change, ...] = ()


def parse_command(command: Sequence[str], root: Path) -> Command:
    """`python SCRIPT ARGS...`, or `torchrun [options] SCRIPT ARGS...` (also written `python -m
    torch.distributed.run`), with SCRIPT a file in the tree; anything else is a usage problem."""
    command = list(command)
    launcher = os.path.basename(command[0]) if command else ""
    if launcher == "torchrun":
        return _script_command(*_torchrun_options(command[1:]), root)
    if _PYTHON.fullmatch(launcher) and command[1:3] == ["-m", "torch.distributed.run"]:
        return _script_command(*_torchrun_options(command[3:]), root)
    if not _PYTHON.fullmatch(launcher):
        shown = " ".join(command[:2]) or "nothing"
        raise UsageProblem(f"verify runs `{SUPPORTED}` or `{DISTRIBUTED}`; got `{shown}`")
    if len(command) < 2 or command[1].startswith("-"):
        raise UsageProblem(
            f"verify runs `{SUPPORTED}`: a script path after python, no interpreter options "
            "(but `python -m torch.distributed.run`)"
        )
    return _script_command(command[1:], 0, root)


def _torchrun_options(argv: list[str]) -> tuple[list[str], int]:
    """The arguments after torchrun's options, and its processes per node. verify runs one
    node and picks its own rendezvous, so only the options that fit that are accepted."""
    nproc = 1  # torchrun's own default
    while argv and argv[0].startswith("-"):
        option, equals, value = argv[0].partition("=")
        if option == "--standalone" and not equals:
            argv = argv[1:]
            continue
        if option not in (*_NPROC, "--nnodes"):
            raise UsageProblem(
                f"torchrun option {option} is not supported: verify runs `{DISTRIBUTED}` on this "
                "machine, with a rendezvous of its own"
            )
        if not equals:
            if len(argv) < 2:
                raise UsageProblem(f"torchrun option {option} needs a value")
            value, argv = argv[1], argv[1:]
        argv = argv[1:]
        if option == "--nnodes":
            if value not in ("1", "1:1"):
                raise UsageProblem(f"verify runs torchrun on one node (--nnodes 1); got --nnodes {value}")
        elif not value.isdigit() or int(value) < 1:
            raise UsageProblem(f"{option} takes a number of processes here; got {value!r}")
        else:
            nproc = int(value)
    return argv, nproc


def _script_command(argv: list[str], nproc: int, root: Path) -> Command:
    if not argv or argv[0].startswith("-"):
        raise UsageProblem(f"verify runs `{DISTRIBUTED}`: a script path after torchrun's options")
    absolute = Path(os.path.normpath(root / argv[0]))  # a symlinked script stays in the tree
    if not absolute.is_file():
        raise UsageProblem(f"{argv[0]}: no such script")
    try:
        relative = absolute.relative_to(root)
    except ValueError:
        raise UsageProblem(f"{argv[0]}: the script must be inside the current directory") from None
    return Command(relative, tuple(argv[1:]), nproc)


def _ignored(directory: str, names: list[str]) -> list[str]:
    return [
        name
        for name in names
        if name in _SKIPPED
        or name.startswith(".venv")
        or os.path.isfile(os.path.join(directory, name, "pyvenv.cfg"))
    ]


def not_copied(*outside: Path) -> tree_guard.Ignored:
    """The copy's ignore function: version control, caches, virtual environments, and the
    `outside` folders (verify's own, where the temporary directory is under the tree)."""
    own_paths = {os.path.realpath(path) for path in outside}

    def ignored(directory: str, names: list[str]) -> list[str]:
        own = [name for name in names if os.path.realpath(os.path.join(directory, name)) in own_paths]
        return _ignored(directory, names) + own

    return ignored


def copy_tree(source: Path, destination: Path, *outside: Path) -> list[str]:
    """Everything but version control, caches and virtual environments; symlinks stay links.
    A destination inside the source (a temporary directory under the tree) is not copied into
    itself, nor are the `outside` folders. The version-control folders and virtual
    environments left out, relative to the source: what a run should still find at the tree's
    path."""
    ignore, own = not_copied(destination, *outside), not_copied()
    left_out: list[str] = []

    def ignored(directory: str, names: list[str]) -> list[str]:
        dropped = ignore(directory, names)
        kept = [name for name in own(directory, dropped) if name not in _CACHES]
        left_out.extend(os.path.relpath(os.path.join(directory, name), source) for name in kept)
        return dropped

    shutil.copytree(source, destination, symlinks=True, ignore=ignored)
    return sorted(left_out)


def _python_files(root: Path) -> dict[str, str]:
    texts = {}
    for path in sorted(root.rglob("*.py")):
        if not path.is_file():
            continue
        try:
            texts[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # not a file the codemod could read either
    return texts


_SHIM_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+amp_shim\b", re.M)


def migrate_copy(root: Path, settings: Settings) -> Migration:
    """Migrate the copy's Python files in place as `amp-migrate .` would migrate the tree."""
    texts = _python_files(root)
    results = migrate_project(
        texts,
        target=settings.target,  # type: ignore[arg-type]  # the CLI's click.Choice admits only targets
        device=settings.device,
        dtype=settings.dtype,
        unsafe_fixes=settings.unsafe_fixes,
    )
    changed = sorted(path for path, result in results.items() if result.changed)
    unsafe = tuple(
        sorted(
            {
                d.code
                for path in changed
                if results[path].target_used == "native"
                for d in results[path].diagnostics
                if d.unsafe
            }
        )
    )
    for path in changed:
        file = root / path
        file.unlink()  # a symlink in the copy is replaced, never written through
        file.write_text(results[path].code, encoding="utf-8")
    shim = tuple(path for path in changed if results[path].target_used == "shim")
    classes = tuple(
        path
        for path in changed
        if results[path].target_used == "native" and _SHIM_IMPORT.search(results[path].code)
    )
    beyond = None
    tree = settings.tree
    if tree is not None and tree.differs:
        # What `amp-migrate .` writes in the tree (project's own, also where a test breaks verify's).
        theirs = project.migrate_project(
            texts,
            target=settings.target,  # type: ignore[arg-type]  # as above
            device=tree.tree_device,
            dtype=tree.tree_dtype,
            unsafe_fixes=settings.unsafe_fixes,
        )
        beyond = tuple(beyond_arguments(results, theirs, tree))
        return Migration(tuple(changed), shim, beyond, same_code(results, theirs), unsafe, classes)
    return Migration(tuple(changed), shim, beyond, unsafe_codes=unsafe, shim_classes=classes)


def run_environment(unbuffered: bool = False) -> dict[str, str]:
    """The user's environment (OMP_NUM_THREADS and all) less the alias switches, plus the
    cuBLAS workspace that deterministic CUDA matmuls need (unless the user set one); with
    `unbuffered`, PYTHONUNBUFFERED=1, so that output streamed live comes as it is written."""
    environment = {k: v for k, v in os.environ.items() if k not in _ALIAS_VARIABLES}
    environment.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if unbuffered:
        environment["PYTHONUNBUFFERED"] = "1"
    return environment


@dataclass(frozen=True)
class Place:
    """Where one run's program runs: `copy`, its copy of the tree, seen at `seen` (the tree's
    own path where the copy is bound over it, else the copy's), under the supervisor."""

    copy: Path
    seen: Path
    supervisor: tuple[str, ...]  # the supervisor and its options, before the program's argv

    @property
    def environment(self) -> dict[str, str]:
        """What the run's environment says differently: the directory it starts in."""
        return {} if self.seen != self.copy else {"PWD": str(self.copy)}


def place(copy: Path, root: Path, keep: Sequence[str], bound: bool, own: Sequence[Path] = ()) -> Place:
    """The copy bound over the tree's path (`bound`, with the `keep` entries of the tree, and
    verify's `own` folders inside it, bound into it), or run as it is, the `keep` entries
    linked into it."""
    if not bound:
        for relative in keep:
            if not os.path.lexists(copy / relative):
                os.symlink(root / relative, copy / relative)
        return Place(copy, copy, (str(SUPERVISOR), "--"))
    real = [Path(os.path.realpath(path)) for path in own]
    inside = [os.path.relpath(path, root) for path in real if path.is_relative_to(root)]
    options = ["--tree", str(root), "--copy", str(copy)]
    for relative in [*keep, *inside]:
        options += ["--keep", relative]
    return Place(copy, root, (str(SUPERVISOR), *options, "--"))


@dataclass(frozen=True)
class _Launch:
    returncode: int
    stderr: str


def _recorder(
    mode: str, steps: int, progress: Optional[Path] = None, lines: Optional[Path] = None
) -> list[str]:
    """The recorder's options, the same for every run: the steps, the seed, deterministic
    algorithms; the file it reports each step record to; the lines whose execution it records."""
    options = [str(RECORDER), "--mode", mode, "--max-steps", str(steps), "--seed", "0", "--deterministic"]
    options += ["--progress", str(progress)] if progress is not None else []
    return options + (["--watch-lines", str(lines)] if lines is not None else [])


def _wait(proc: subprocess.Popen, timeout: Optional[float], poll: Optional[Callable[[], None]]) -> bool:
    """Wait for `proc`, calling `poll` every _POLL seconds meanwhile; False when `timeout` ran out."""
    if poll is None:
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
        try:
            proc.wait(timeout=max(left, 0.0))
            return True
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                return False
        poll()


def _launch(
    argv: Sequence[str],
    where: Place,
    log: RunLog,
    timeout: Optional[float],
    poll: Optional[Callable[[], None]] = None,
    unbuffered: bool = False,
) -> _Launch:
    """Run `argv` under the supervisor, and when it ends, times out or verify is interrupted,
    kill what is left of it: a hung rank, a DataLoader worker. Output goes to the log's files,
    not to pipes, which a leftover process would hold open; `poll` looks at them while the run
    goes."""
    token = uuid.uuid4().hex
    with open(log.stdout, "w") as stdout, open(log.stderr, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, *where.supervisor, *argv],
            cwd=where.copy,
            env={**run_environment(unbuffered), **where.environment, _RUN_TOKEN: token},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        finished = False
        try:
            finished = _wait(proc, timeout, poll)
        finally:
            _kill_leftovers(proc, token)
    timed_out = not finished
    text = log.stderr.read_text(errors="replace")
    if timed_out:
        note = f"\nverify: the run had not finished after {timeout:g} s and was killed (hung?)"
        return _Launch(TIMED_OUT, text + note)
    return _Launch(proc.returncode, text)


def _kill_leftovers(proc: subprocess.Popen, token: str) -> None:
    """The supervisor, still running (the timeout, Ctrl-C), is asked to end every process below
    it; then, should any escape it (the supervisor killed, a system without subreapers),
    SIGKILL to the run's process group and to every process that carries the run's token in
    its environment."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=_STOPPING)
        except (OSError, subprocess.TimeoutExpired):
            pass  # it is killed below with the rest
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group
    marker = f"{_RUN_TOKEN}={token}".encode()
    processes = Path("/proc")
    for entry in processes.iterdir() if processes.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    proc.wait()


def _read_result(label: str, result: Path, exit_code: int, stderr: str) -> tuple[Run, float]:
    """The run a result file describes (none: the recorder never got to write it), and when
    its program raised (inf: it did not)."""
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        note = "" if exit_code else "\nverify: the recorder wrote no result"
        return Run(label, exit_code or 1, (), stderr + note), float("inf")
    if "step_records" not in data:
        return Run(label, exit_code or 1, (), stderr + "\nverify: the recorder wrote no step records"), float(
            "inf"
        )
    failed_at = data.get("failed_at")
    precision, calls = tuple(data.get("precision", ())), tuple(data.get("step_calls", ()))
    amp_calls = dict(data.get("amp_calls") or {})
    executed = data.get("executed_lines")
    run = Run(
        label, exit_code, tuple(data["step_records"]), stderr, precision, calls, amp_calls, executed=executed
    )
    return run, float("inf" if failed_at is None else failed_at)


class _Follow:
    """The poll of a running run: its step records from the recorder's progress file, and with
    output wanted, the new lines of its logs (under torchrun, of every rank's as torchrun makes
    them), each after its run's prefix."""

    def __init__(self, watch: Watch, progress: Path, ranks: int, logs: Callable[[], list[RunLog]]) -> None:
        self.watch, self.progress, self.ranks, self.logs = watch, progress, ranks, logs
        self._tails: dict[Path, tuple[str, Tail]] = {}

    def __call__(self, final: bool = False) -> None:
        self.watch.step(steps_done(self.progress, self.ranks))
        if not self.watch.wants_output:
            return
        for log in self.logs():
            for path in (log.stdout, log.stderr):
                self._tails.setdefault(path, (log.prefix, Tail(path)))
        for prefix, tail in self._tails.values():
            for line in tail.lines(final):
                self.watch.output(prefix, line)


def run_recorded(
    label: str,
    launcher: Sequence[str],
    mode: str,
    where: Place,
    command: Command,
    result: Path,
    steps: int,
    timeout: Optional[float] = None,
    log: Optional[RunLog] = None,
    watch: Optional[Watch] = None,
    lines: Optional[Path] = None,
) -> Run:
    """One recorded run of `command` in `where` (`launcher` goes between python and the recorder);
    its output in `log` (beside `result` when none is given), followed by `watch`; the
    recorder records which of the `lines` file's lines executed."""
    if log is None:
        log = RunLog(label, None, result.with_suffix(".stdout"), result.with_suffix(".stderr"))
    progress = result.with_suffix(".progress")
    argv = [sys.executable, *launcher, *_recorder(mode, steps, progress, lines), str(result)]
    argv += [str(where.seen / command.script), *command.args]
    follow = None if watch is None else _Follow(watch, progress, 1, lambda: [log])
    launch = _launch(argv, where, log, timeout, follow, unbuffered=bool(watch and watch.wants_output))
    if follow is not None:
        follow(final=True)
    return _read_result(label, result, launch.returncode, launch.stderr)[0]


def run_ranks(
    label: str,
    launcher: Sequence[str],
    mode: str,
    where: Place,
    command: Command,
    work: Path,
    steps: int,
    timeout: Optional[float] = None,
    logs: Optional[Path] = None,
    watch: Optional[Watch] = None,
    name: Optional[str] = None,
    lines: Optional[Path] = None,
) -> tuple[list[tuple[Run, float]], list[RunLog]]:
    """A recorded torchrun of `command` in `where`: each rank runs the recorder, which writes its own
    result. A standalone rendezvous on a free port, so that runs never share one; each rank's
    stdout and stderr in its own log under `logs` (a folder in `work` when none is given), named
    `name` (the label when none is given). Per rank: its run, and when its program raised (inf:
    never); and the logs: torchrun's own, then each rank's."""
    name = name or label
    logs = logs or work
    rank_dir, results = logs / f"{name}-ranks", work / f"{label}-rank{{rank}}.json"
    progress = work / f"{label}.progress"
    own = RunLog(name, None, logs / f"{name}-torchrun.stdout", logs / f"{name}-torchrun.stderr")
    argv = [sys.executable, *launcher, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    argv += ["--nproc-per-node", str(command.nproc), "--log-dir", str(rank_dir), "--redirects", "3"]
    argv += [*_recorder(mode, steps, progress, lines), str(results), str(where.seen / command.script)]
    argv += command.args

    def every_log() -> list[RunLog]:
        return [own, *rank_logs(name, rank_dir, command.nproc)]

    follow = None if watch is None else _Follow(watch, progress, command.nproc, every_log)
    launch = _launch(argv, where, own, timeout, follow, unbuffered=bool(watch and watch.wants_output))
    if follow is not None:
        follow(final=True)
    paths = [Path(str(results).replace("{rank}", str(rank))) for rank in range(command.nproc)]
    recorded = [_recorded_exit_code(path, mode) for path in paths]
    # torchrun failed (or was killed) after every rank said it succeeded: at their exit.
    after_all = launch.returncode != 0 and all(code == 0 for code in recorded)
    ranks = []
    for rank, (path, code) in enumerate(zip(paths, recorded)):
        logged = sorted(rank_dir.glob(f"*/attempt_*/{rank}/stderr.log"))
        stderr = "".join(log.read_text(errors="replace") for log in logged)
        if code is None or after_all:
            code = launch.returncode or 1
            stderr += launch.stderr  # torchrun's own account: rendezvous, signals, the timeout
        ranks.append(_read_result(label, path, code, stderr))
    return ranks, every_log()


def _recorded_exit_code(result: Path, mode: str) -> Optional[int]:
    """A rank's exit status as its recorder wrote it; None where it wrote no result."""
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        return None
    return 3 if forbidden_imports(mode, data.get("imported", ())) else int(data.get("exit_code", 1))


def verify(parsed: Command, root: Path, settings: Settings, watch: Optional[Watch] = None) -> Outcome:
    """Copy twice, migrate one copy, run the original on the shim in the other and the migrated
    copy, compare; then check that the tree is as it was. Each run's output is kept in a folder
    of its own under the system's temporary directory."""
    watch = watch or Watch()
    bound = isolate_available()
    if not bound:
        refuse_paths_into(parsed, root, run_environment())
    folder = new_folder()
    with tempfile.TemporaryDirectory(prefix="amp-migrate-verify-") as temporary:
        work = Path(temporary)
        ignored = not_copied(work, folder)
        before = tree_guard.snapshot(root, ignored)
        copy = work / "tree"
        watch.phase("copying the tree")
        keep = copy_tree(root, copy, work, folder)
        copy_tree(root, work / "legacy", work, folder)
        watch.phase("migrating the copy")
        migration = migrate_copy(copy, settings)
        legacy, migrated = (
            place(path, root, keep, bound, (work, folder)) for path in (work / "legacy", copy)
        )
        statements = written_statements(_sources(root, copy, migration))
        lines, no_lines = work / "watch-lines.json", work / "watch-no-lines.json"
        lines.write_text(json.dumps(watch_list(statements, migrated.seen)))
        # The legacy run is traced too, watching nothing: both runs execute under the same trace
        # function, whatever the program does differently under one (torch.compile).
        no_lines.write_text("{}")
        # A copy that keeps files on the shim imports amp_shim itself where it runs them: the
        # recorder's migrated mode records each run by what it used (GradScaler, the shim), no alias.
        copy_mode = "migrated" if migration.imports_shim else "native"
        both = _Both(
            parsed, root, copy, work, folder, settings, watch, copy_mode, lines, no_lines, legacy, migrated
        )
        if parsed.nproc:
            shim_ranks, native_ranks, logs = _run_ranks_both(both)
            outcome = judge_ranks(
                shim_ranks, native_ranks, migration, parsed, settings.rtol, settings.allow_no_amp
            )
            natives = [run for run, _ in native_ranks]
        else:
            shim, native, logs = _run_both(both)
            verdict = judge(shim, native, settings.rtol, settings.allow_no_amp, migration.documented)
            outcome, natives = Outcome(verdict, shim, native, migration, parsed), [native]
        location = _locate(outcome.verdict, outcome.shim, outcome.native, root, copy, migration)
        coverage = _coverage(statements, migrated.seen, natives)
        changes = tuple(tree_guard.changes(before, tree_guard.snapshot(root, ignored)))
    outcome = dataclasses.replace(outcome, location=location, coverage=coverage, logs=logs, log_folder=folder)
    if not changes:
        return outcome
    listed = [f"{change.path} ({change.how})" for change in changes]
    return dataclasses.replace(
        outcome, verdict=with_tree_changes(outcome.verdict, listed), tree_changes=changes
    )


def isolate_available() -> bool:
    """Whether each run's copy can be bound over the tree's path here (one probe, by the
    supervisor itself, under this interpreter)."""
    try:
        probe = subprocess.run(
            [sys.executable, str(SUPERVISOR), "--probe"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def refuse_paths_into(parsed: Command, root: Path, environment: dict[str, str]) -> None:
    """Where the copies cannot be bound over the tree, a program given an absolute path into
    the tree would write into the user's files: such a command is a usage problem. PWD and
    OLDPWD are set by the shell, not by the user; each run's PWD is its copy."""
    shown = {name: value for name, value in environment.items() if name not in ("PWD", "OLDPWD")}
    found = tree_guard.paths_into_tree(parsed.args, shown, root, not_copied())
    if found:
        raise UsageProblem(
            f"{'; '.join(found)}: an absolute path into the current directory, which verify "
            "cannot map to its copies here (no user namespaces: see docs/cli.md, verify), so a run "
            "could write into your files; give it relative to the current directory"
        )


@dataclass(frozen=True)
class _Both:
    """What the two runs of one verify share."""

    command: Command
    root: Path
    copy: Path
    work: Path
    folder: Path
    settings: Settings
    watch: Watch
    copy_mode: str
    lines: Path  # the lines of the migration whose execution the migrated run records
    no_lines: Path  # the legacy run's: none
    legacy: Place  # where the original program runs: an unmigrated copy
    migrated: Place  # where the migrated one runs: the migrated copy


def _run_both(both: _Both) -> tuple[Run, Run, tuple[RunLog, ...]]:
    """The legacy run, then the migrated one unless the legacy run failed before its first step."""
    steps, timeout, folder = both.settings.steps, both.settings.timeout, both.folder
    legacy_log = RunLog(LEGACY, None, folder / "legacy.stdout", folder / "legacy.stderr")
    migrated_log = RunLog(MIGRATED, None, folder / "migrated.stdout", folder / "migrated.stderr")
    both.watch.phase("legacy run", steps)
    shim = run_recorded(
        "shim",
        ["-m", "amp_shim"],
        "shim",
        both.legacy,
        both.command,
        both.work / "shim.json",
        steps,
        timeout,
        legacy_log,
        both.watch,
        both.no_lines,
    )
    if failed_before_first_step(shim):
        return shim, NOT_STARTED, (legacy_log,)
    both.watch.phase("migrated run", steps)
    native = run_recorded(
        "native",
        [],
        both.copy_mode,
        both.migrated,
        both.command,
        both.work / "native.json",
        steps,
        timeout,
        migrated_log,
        both.watch,
        both.lines,
    )
    return shim, native, (legacy_log, migrated_log)


def _run_ranks_both(
    both: _Both,
) -> tuple[list[tuple[Run, float]], list[tuple[Run, float]], tuple[RunLog, ...]]:
    """`_run_both` under torchrun: the migrated run starts unless every legacy rank failed
    before its first step."""
    steps, timeout, command = both.settings.steps, both.settings.timeout, both.command
    ranks = f" ({command.nproc} ranks)"
    both.watch.phase(f"legacy run{ranks}", steps)
    shim_ranks, shim_logs = run_ranks(
        "shim",
        ["-m", "amp_shim"],
        "shim",
        both.legacy,
        command,
        both.work,
        steps,
        timeout,
        both.folder,
        both.watch,
        LEGACY,
        both.no_lines,
    )
    if all(failed_before_first_step(run) for run, _ in shim_ranks):
        return shim_ranks, [(NOT_STARTED, float("inf")) for _ in shim_ranks], tuple(shim_logs)
    both.watch.phase(f"migrated run{ranks}", steps)
    native_ranks, native_logs = run_ranks(
        "native",
        [],
        both.copy_mode,
        both.migrated,
        command,
        both.work,
        steps,
        timeout,
        both.folder,
        both.watch,
        MIGRATED,
        both.lines,
    )
    return shim_ranks, native_ranks, (*shim_logs, *native_logs)


def _read(root: Path, path: str) -> Optional[str]:
    try:
        return (root / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _sources(root: Path, copy: Path, migration: Migration) -> dict[str, Source]:
    """The migrated files of the copy with their originals, read while the copy exists."""
    originals = {path: _read(root, path) or "" for path in migration.changed}
    migrated = {path: _read(copy, path) or "" for path in migration.changed}
    return changed_sources(originals, migrated)


def _coverage(statements: Sequence[Statement], copy: Path, runs: Sequence[Run]) -> Optional[Coverage]:
    """The migration's statements that ran in the migrated run (any rank); None where no run
    recorded its lines (not started, or no result)."""
    executed = [run.executed for run in runs if run.executed is not None]
    return covered(statements, copy, executed) if executed else None


def _locate(
    verdict: Verdict, shim: Run, native: Run, root: Path, copy: Path, migration: Migration
) -> Optional[Location]:
    """Where the diverging step's statements are, read while the migrated copy still exists."""
    if verdict.divergence is None:
        return None
    sources = _sources(root, copy, migration)
    return locate(verdict.divergence.step, shim.calls, native.calls, sources, lambda path: _read(copy, path))


def judge_ranks(
    shim: list[tuple[Run, float]],
    native: list[tuple[Run, float]],
    migration: Migration,
    command: Command,
    rtol: Optional[float],
    allow_no_amp: bool = False,
) -> Outcome:
    """Every rank judged on its own; the verdict is the worst rank's, named in its message.
    Among failed ranks the one whose program raised first is the worst: when one rank fails,
    the others fail after it (a collective whose peer is gone), and the first is the cause."""
    ranks = tuple(
        RankOutcome(rank, judge(a, b, rtol, allow_no_amp, migration.documented), a, b, min(a_at, b_at))
        for rank, ((a, a_at), (b, b_at)) in enumerate(zip(shim, native))
    )
    worst = min(ranks, key=_badness)
    verdict = worst.verdict
    largest: dict[str, float] = {}
    for rank in ranks:
        for quantity, value in rank.verdict.max_relative.items():
            largest[quantity] = max(largest.get(quantity, 0.0), value)
    if all(rank.verdict.kind == IDENTICAL for rank in ranks):
        message = f"{verdict.message} on each of {len(ranks)} ranks"
    else:
        message = f"rank {worst.rank} of {len(ranks)}: {verdict.message}"
        others = [str(r.rank) for r in ranks if r is not worst and not r.verdict.passed]
        if others:
            message += f" (rank {', '.join(others)} did not pass either)"
    verdict = dataclasses.replace(verdict, message=message, max_relative=largest)
    return Outcome(verdict, worst.shim, worst.native, migration, command, ranks, worst.rank)


def _badness(rank: RankOutcome) -> tuple:
    divergence = rank.verdict.divergence
    return (
        _WORST_FIRST.index(rank.verdict.kind),
        rank.failed_at,
        divergence.step if divergence else 0,
        rank.rank,
    )


def default_device() -> str:
    """cuda where this machine has a GPU torch can use, else cpu: where the script can run at all."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
