"""Writing the files of a group (project/groups.py) so that no other amp-migrate run ever sees
the group half written: a native `train.py` beside a `trainer.py` still on Apex fails at its
first step, and a run that read that mix would settle the partner alone, on the shim.

The members are locked exclusively (file_locks.py), in sorted order so that two runs never
wait on each other; then every member is checked unchanged since it was read, before any is
written, so a member edited meanwhile keeps the whole group as it was; then a journal records
the group's new bytes (journal.py, for a run killed midway) and the members are written one
after another, each new file locked before it is renamed into place and held until the last
is. Ctrl-C takes effect once the last is written. Readers in other runs wait on the locks and
then read the whole group written.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import replace
from typing import Sequence

from ..cli import runner
from ..cli.file_result import FileResult
from . import journal
from .atomic_write import interrupts_deferred
from .file_locks import new_files_held
from .source_file import (
    SourceError,
    Stamp,
    check_unchanged,
    digest,
    locked_for_write,
    read_bytes,
    write_atomic,
)


def _to_write(result: FileResult) -> bool:
    return result.changed and result.new_bytes is not None and result.error is None


def write_group(results: Sequence[FileResult]) -> list[FileResult]:
    """Write a group's changed files all or none; each member's result, in the given order."""
    # One order for every run, whatever paths it was given: two runs never wait on each other.
    todo = sorted((r for r in results if _to_write(r)), key=lambda r: os.path.abspath(r.path))
    if len(todo) < 2:
        return [runner.write(r) for r in results]
    with ExitStack() as held:
        for result in todo:
            try:
                held.enter_context(locked_for_write(result.path))
            except SourceError as exc:
                done = _refused(todo, {result.path: str(exc)})
                break
        else:
            with interrupts_deferred(), new_files_held():
                done = _write_checked(todo)
    return [done.get(r.path, r) for r in results]


def _write_checked(todo: list[FileResult]) -> dict[str, FileResult]:
    """With every member locked: check them all, then write them all."""
    old, refused = {}, {}
    for result in todo:
        try:
            old[result.path] = _current(result)
        except SourceError as exc:
            refused[result.path] = str(exc)
    if refused:
        return _refused(todo, refused)
    record = journal.record(
        [journal.Member(os.path.abspath(r.path), digest(old[r.path]), r.new_bytes or b"") for r in todo]
    )
    written: list[FileResult] = []
    for result in todo:
        outcome = runner.write(result)
        if outcome.error is not None:
            done = {r.path: r for r in _put_back(written, old, result.path, outcome.error)}
            if all(not r.written for r in done.values()):
                journal.remove(record)
            return {**_refused(todo, {result.path: outcome.error}), **done, result.path: outcome}
        written.append(outcome)
    journal.remove(record)
    return {r.path: r for r in written}


def _current(result: FileResult) -> bytes:
    """The member's bytes now, or SourceError where it would not be written."""
    if result.stamp is None:
        return read_bytes(result.path)
    return check_unchanged(result.path, result.stamp)


def _refused(todo: list[FileResult], reasons: dict[str, str]) -> dict[str, FileResult]:
    """Every member unwritten: those refused with their reason, the others naming one."""
    first = min(reasons)
    why = (
        f"not written: its group is written whole or not at all, and {first} could not be ({reasons[first]})"
    )
    return {r.path: r.with_error(reasons.get(r.path, why)) for r in todo}


def _put_back(written: list[FileResult], old: dict[str, bytes], failed: str, reason: str) -> list[FileResult]:
    """Undo the members written before `failed` could not be: each gets its old bytes again,
    unless it changed since (then it stays written and says so)."""
    out = []
    for result in written:
        stamp = result.stamp
        expect = Stamp(stamp.folder, digest(result.new_bytes or b"")) if stamp is not None else None
        try:
            write_atomic(result.path, old[result.path], expect=expect)
        except SourceError as exc:
            out.append(
                replace(
                    result,
                    error=f"written, but {failed} of its group could not be ({reason}) and putting this "
                    f"file back failed ({exc}); the next run over these files completes the group",
                )
            )
            continue
        out.append(
            result.with_error(
                f"not written (put back as it was): its group is written whole or not at all, "
                f"and {failed} could not be ({reason})"
            )
        )
    return out
