"""What a group of files becomes, recorded while the group is written, so that a run killed in
the middle (SIGKILL, a power cut) is completed by the next run over any of its files instead
of leaving a native file beside a partner still on Apex.

One journal per group, in the user's state folder (`$AMP_MIGRATE_STATE_DIR`, else
`$XDG_STATE_HOME/amp-migrate`, else `~/.local/state/amp-migrate`), named for its members'
absolute paths: a later run finds it whatever path it was given, and nothing is left in the
user's tree for discovery, git or a build to pick up. It holds each member's path, the digest
of the bytes it had and the bytes it gets; it is written (fsynced, renamed into place) before
the first member and removed after the last.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .atomic_write import WriteFailed, interrupts_deferred, replace_atomically
from .file_locks import new_files_held
from .source_file import SourceError, locked_for_write, read_stamped, write_atomic

_VERSION = 1


@dataclass(frozen=True)
class Member:
    path: str  # absolute
    old: str  # digest of the bytes it had
    data: bytes  # what it gets


@dataclass(frozen=True)
class Completed:
    """What the completion of an interrupted group did to one member."""

    path: str  # absolute
    state: str  # "written" now, "already" written by the killed run, or "left" as it is
    reason: str = ""  # why a member was left


def state_folder() -> Path:
    explicit = os.environ.get("AMP_MIGRATE_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "amp-migrate"


def _folder() -> Path:
    return state_folder() / "journals"


def record(members: Sequence[Member]) -> Optional[Path]:
    """Write the journal of a group about to be written; None where the state folder cannot
    be written (the group is still written whole, unless the run is killed meanwhile)."""
    paths = sorted(m.path for m in members)
    name = hashlib.sha256("\0".join(paths).encode()).hexdigest()[:32] + ".json"
    document = {
        "version": _VERSION,
        "members": [
            {"path": m.path, "old": m.old, "new": base64.b64encode(m.data).decode("ascii")} for m in members
        ],
    }
    target = _folder() / name
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_atomically(target, json.dumps(document).encode(), may_create=True)
    except (OSError, WriteFailed):
        return None
    return target


def remove(journal: Optional[Path]) -> None:
    if journal is None:
        return
    try:
        journal.unlink()
    except OSError:
        pass


def _load(journal: Path) -> Optional[list[Member]]:
    """The journal's members; None when it is gone or is not one this version wrote."""
    try:
        document = json.loads(journal.read_bytes())
        if document.get("version") != _VERSION:
            return None
        return [Member(m["path"], m["old"], base64.b64decode(m["new"])) for m in document["members"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _journals_for(paths: Iterable[str]) -> list[tuple[Path, list[Member]]]:
    """The journals with a member among `paths`."""
    wanted = {os.path.abspath(p) for p in paths}
    try:
        journals = sorted(_folder().glob("*.json"))
    except OSError:
        return []
    found = []
    for journal in journals:
        members = _load(journal)
        if members and wanted & {m.path for m in members}:
            found.append((journal, members))
    return found


def pending(paths: Iterable[str]) -> set[str]:
    """The members (absolute paths) of groups with a member among `paths` that a run began
    writing and has not finished (killed, or still writing)."""
    return {m.path for _, members in _journals_for(paths) for m in members}


def complete_interrupted(paths: Iterable[str]) -> list[Completed]:
    """Finish every group a killed run left half written that has a member among `paths`:
    each member that still has its old bytes gets its new ones; a member changed since (or
    unreadable) is left as it is and says why. Runs still writing their group are waited out
    (their journal is gone by then)."""
    done: list[Completed] = []
    for journal, _ in _journals_for(paths):
        done += _complete(journal)
    return done


def _complete(journal: Path) -> list[Completed]:
    members = _load(journal) or []
    with ExitStack() as held:
        try:
            for path in sorted(m.path for m in members):
                held.enter_context(locked_for_write(path))
        except SourceError:  # a live run holds the group past the wait: it finishes the group
            return []
        members = _load(journal) or []  # its run may have finished while this one waited
        with interrupts_deferred(), new_files_held():
            completed = [_complete_member(m) for m in members]
            remove(journal)
    return completed


def _complete_member(member: Member) -> Completed:
    try:
        current, stamp = read_stamped(member.path)  # held exclusively here: read without waiting
    except SourceError as exc:
        return Completed(member.path, "left", str(exc))
    if current == member.data:
        return Completed(member.path, "already")
    if stamp.digest != member.old:
        return Completed(member.path, "left", "it changed since that run read it")
    try:
        write_atomic(member.path, member.data, expect=stamp)
    except SourceError as exc:
        return Completed(member.path, "left", str(exc))
    return Completed(member.path, "written")
