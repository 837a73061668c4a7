"""One file's job, and running many in a process pool.

A job never raises: whatever goes wrong with a file (unreadable, undecodable, not Python, a
bug in a rule) becomes that file's result, so the run goes on and the file stays untouched.
Workers only compute; the parent alone writes, one atomic rename per file, so that Ctrl-C
(which the workers ignore) stops the run between two files and never inside one.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, MutableSequence, Optional

from ..analysis.prefilter import might_use_apex
from ..io.source_file import SourceError, decode, read_stamped, write_atomic
from ..options import Options
from .file_result import FileResult, Finding
from .output_lines import line_map

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from ..plan.types import SharedScaler


@dataclass(frozen=True)
class Job:
    path: str
    kind: str  # "python" or "notebook"
    options: Options
    want_diff: bool = False
    project: Optional[SharedScaler] = None  # its part in a scaler shared across modules


def _migrate_python(job: Job, data: bytes) -> FileResult:
    from ..migrate import MigrationError, migrate_source
    from .report import unified_diff

    source = decode(data)
    result = FileResult(job.path, "python", scanned=True)
    try:
        migrated = migrate_source(
            source.text,
            target=job.options.target,
            device=job.options.device,
            dtype=job.options.dtype,
            unsafe_fixes=job.options.unsafe_fixes,
            project=job.project,
        )
    except MigrationError as exc:
        return replace(result, findings=(Finding(exc.as_diagnostic()),))
    result = replace(result, findings=tuple(Finding(d) for d in migrated.diagnostics))
    if not migrated.changed:
        return result
    diff = unified_diff(source.text, migrated.code, job.path) if job.want_diff else ""
    return replace(
        result,
        changed=True,
        target_used=migrated.target_used,
        new_bytes=source.to_bytes(migrated.code),
        diff=diff,
        line_maps=((None, line_map(source.text, migrated.code)),),
    )


def process(job: Job) -> FileResult:
    """Read and migrate one file; never raises. The result carries the read's Stamp, so that
    `write` leaves a file alone that someone edited meanwhile."""
    try:
        data, stamp = read_stamped(job.path)
    except SourceError as exc:
        return FileResult(job.path, job.kind, error=str(exc))
    result = _process(job, data)
    return replace(result, stamp=stamp) if result.new_bytes is not None else result


def _process(job: Job, data: bytes) -> FileResult:
    # Source encodings are ASCII-compatible, so the markers read the same in latin-1.
    # A file with a part in a project's group is migrated whatever it spells (a caller of a
    # provider of Apex's module spells no `apex`).
    if job.project is None and not might_use_apex(data.decode("latin-1")):
        return FileResult(job.path, job.kind)
    try:
        if job.kind == "notebook":
            from ..io import notebook

            return notebook.migrate(job.path, data, job.options, job.want_diff)
        return _migrate_python(job, data)
    except SourceError as exc:
        return FileResult(job.path, job.kind, scanned=True, error=str(exc))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a bug in the codemod: report it, keep the file, go on
        return FileResult(
            job.path,
            job.kind,
            scanned=True,
            error=f"internal error, please report it: {type(exc).__name__}: {exc}",
        )


def write(result: FileResult) -> FileResult:
    """Write a changed file in place; a failure becomes the file's error."""
    if not result.changed or result.new_bytes is None or result.error is not None:
        return result
    try:
        write_atomic(result.path, result.new_bytes, expect=result.stamp)
    except SourceError as exc:
        return result.with_error(str(exc))
    return replace(result, written=True)


#: Cyclic-GC thresholds while files are processed (CPython's default: 700, 10, 10).
GC_THRESHOLDS = (70_000, 10, 10)

#: A worker's pid in its job's slot while it migrates the file, minus it once done: after a
#: worker dies, the slot holding its pid names the file it was migrating.
_claims: Optional[MutableSequence[int]] = None


def _start_worker(claims: Optional[MutableSequence[int]]) -> None:
    global _claims
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _claims = claims


def _work(slot: int, job: Job) -> FileResult:
    pid = os.getpid()
    if _claims is not None:
        _claims[slot] = pid
    result = process(job)
    if _claims is not None:
        _claims[slot] = -pid
    return result


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


STOPPED = "not migrated: the run stopped when a worker died"


def _death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = f", {signal.Signals(-exitcode).name}"
        except ValueError:
            name = ""
        how = f"killed by signal {-exitcode}{name}"
    else:
        how = f"exit status {exitcode}"
    return f"the worker migrating this file died ({how})"


class Workers:
    """A process pool (or none, for one job or one worker) that yields results as they come.

    Enter it before starting anything that runs a thread (rich's progress bar): the pool
    forks on Linux. A worker that dies (killed, or crashed in native code) stops the run: the
    results already back are kept, the file it held becomes an error that says so, and every
    file not back yet an error saying the run stopped (`stopped` is then true).
    """

    def __init__(self, jobs: int, files: int) -> None:
        self.size = max(1, min(jobs, files))
        self.files = files
        self.pool: Optional[ProcessPoolExecutor] = None
        self.stopped = False
        # pid: multiprocessing.Process, from the executor's own table: it has no other way to
        # read a worker's exit status.
        self._workers: dict[int, Any] = {}

    def __enter__(self) -> "Workers":
        if self.size > 1:
            # The codemod is imported on first use (a run over files without Apex never needs
            # it); before a fork it is imported here, once, rather than by every worker.
            from ..io import notebook  # noqa: F401 - loaded for the workers to inherit

        # What the imports made (libcst's grammar and node classes) lives as long as the
        # process: out of the collector's sight, the first files do not pay for rescanning it,
        # and forked workers do not copy it page by page. Syntax trees hold no reference
        # cycles, so the collector runs a hundred times less often than by default (as mypy
        # does); reference counting frees each file's trees as before.
        # Both are process-wide: put back at exit, so a long-running caller of the API keeps
        # its own collector settings (and what it froze itself stays frozen).
        self._thresholds, self._froze = gc.get_threshold(), gc.get_freeze_count() == 0
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        if self.size > 1:
            self._start_pool()
        return self

    def _start_pool(self) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        method = "fork" if sys.platform.startswith("linux") else None
        context = multiprocessing.get_context(method)
        self._claims = context.RawArray("q", self.files)
        # Forked workers inherit "ignore SIGINT" from the start; the initializer covers
        # spawned ones. The executor starts its workers on the first job: one that does nothing
        # starts them here, before the caller starts a thread.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.pool = ProcessPoolExecutor(
                self.size, mp_context=context, initializer=_start_worker, initargs=(self._claims,)
            )
            self.pool.submit(int).result()
        finally:
            signal.signal(signal.SIGINT, previous)
        self._workers = dict(getattr(self.pool, "_processes", None) or {})

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if self.pool is not None:
                if kind is not None:  # an interrupt: the files in the workers' hands are dropped
                    for worker in self._workers.values():
                        worker.terminate()
                # One shutdown that waits: the executor's thread must have ended before the
                # interpreter's exit wakes it (a second shutdown no longer waits for it).
                self.pool.shutdown(wait=True, cancel_futures=kind is not None)
        finally:
            gc.set_threshold(*self._thresholds)
            if self._froze:
                gc.unfreeze()

    def results(self, jobs: Iterable[Job]) -> Iterator[FileResult]:
        """Results in completion order; callers sort. The workers start at once, so the caller
        can do its own work (the project index) before reading the first result."""
        if self.pool is None:
            return (process(job) for job in jobs)
        # Largest files first: one big Apex file started last would leave the other workers idle.
        ordered = sorted(jobs, key=_size, reverse=True)
        assert len(ordered) <= self.files
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        futures: dict[Future, tuple[int, Job]] = {}
        for slot, job in enumerate(ordered):
            try:
                future = self.pool.submit(_work, slot, job)
            except BrokenProcessPool as broken:  # a worker died while the jobs were handed out
                future = Future()
                future.set_exception(broken)
            futures[future] = (slot, job)
        self._workers.update(getattr(self.pool, "_processes", None) or {})  # spawned as jobs came
        return self._collect(futures)

    def _collect(self, futures: dict[Future, tuple[int, Job]]) -> Iterator[FileResult]:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        pending = futures  # a result leaves it as it is handed on: nothing here keeps it
        for future in as_completed(list(pending)):
            if isinstance(future.exception(), BrokenProcessPool):
                break
            yield self._result(future, pending.pop(future)[1])
        else:
            return
        self.stopped = True
        assert self.pool is not None
        self.pool.shutdown(wait=True)  # every worker has ended: their exit statuses are final
        dead = self._dead_workers()
        for future, (slot, job) in sorted(pending.items(), key=lambda item: item[1][0]):
            if future.exception() is None:  # back before the pool broke: kept
                yield future.result()
                continue
            holder = self._claims[slot]
            error = _death(dead[holder]) if holder in dead else STOPPED
            yield FileResult(job.path, job.kind, error=error)

    def _result(self, future: Future, job: Job) -> FileResult:
        error = future.exception()
        if error is None:
            return future.result()
        # `process` never raises; a result that could not be sent back ends here.
        return FileResult(job.path, job.kind, error=f"internal error, please report it: {error!r}")

    def _dead_workers(self) -> dict[int, Optional[int]]:
        """The workers that died by themselves, with their exit status: not those the pool ended
        (SIGTERM) once it broke; all of them where that cannot be told apart (a SIGTERM sent to
        a worker from outside), so that no file a dying worker held goes unnamed."""
        ended = {pid: worker.exitcode for pid, worker in self._workers.items()}
        died = {pid: code for pid, code in ended.items() if code not in (0, -signal.SIGTERM)}
        return died or {pid: code for pid, code in ended.items() if code != 0}


def _size(job: Job) -> int:
    try:
        return os.path.getsize(job.path)
    except OSError:
        return 0
