"""Advisory locks on the source files themselves, so that no amp-migrate run reads a group of
files that another one is in the middle of writing.

A writer holds an exclusive lock on every file it is about to replace, from the last look at
its bytes until every file of the group is renamed into place; a reader takes a shared lock
on the file it opened and, once it has it, checks that the name still leads to that file. A
reader that waited out a writer finds the name now leads to the new file (the rename replaced
the entry, not the locked inode), so it opens that one and reads the written content. While a
group is written, each new file is locked before it is renamed into place and held until the
last member is (`new_files_held`): a reader, or a run completing a journal, that reaches a
member already written waits too, and no other process ever holds a member's lock mid-group.

The locks are `flock` locks: only other amp-migrate runs honour them, and where the platform
(no `fcntl`) or the file system (some network mounts) has none, runs go on unlocked. A process
never waits on itself: a file it holds exclusively is read and written without a second lock.
Waiting is bounded, so a run wedged while holding locks delays the next one, never hangs it.
"""

from __future__ import annotations

import os
import stat
import time
from contextlib import contextmanager
from typing import Iterator, Optional

try:
    import fcntl
except ImportError:
    fcntl = None  # type: ignore[assignment]  # not POSIX: runs go on unlocked

from .atomic_write import Entry

#: How long a run waits for another run to finish writing a file before giving up on it.
WAIT_SECONDS = 120.0
_FIRST_DELAY, _MAX_DELAY = 0.005, 0.1

#: (device, inode) of the files this process holds exclusively.
_held: set[tuple[int, int]] = set()
#: While a group is written: the descriptors of the files it wrote, held until it ends.
_kept: Optional[list[int]] = None


class Busy(Exception):
    """Another process held the file for longer than WAIT_SECONDS."""


def _key(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _lock(fd: int, exclusive: bool, deadline: float) -> None:
    if fcntl is None:
        return
    kind = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    delay = _FIRST_DELAY
    while True:
        try:
            fcntl.flock(fd, kind)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Busy() from None
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)
        except OSError:  # a file system without flock: go on unlocked
            return


def open_locked(entry: Entry, flags: int, exclusive: bool) -> tuple[int, bool]:
    """A descriptor of the file `entry` names, locked, and still the file the name leads to
    once the lock is held (a file replaced meanwhile is opened again); and whether this call
    took an exclusive hold, for `release`. Files that are not regular, and files this process
    already holds exclusively, come back unlocked. Raises OSError from the open, Busy when the
    wait runs out."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        fd = entry.open(flags)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or _key(info) in _held:
                return fd, False
            _lock(fd, exclusive, deadline)
            if _same_file(entry, info):
                if exclusive:
                    _held.add(_key(info))
                return fd, exclusive
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if time.monotonic() >= deadline:  # replaced again and again
            raise Busy()


def _same_file(entry: Entry, info: os.stat_result) -> bool:
    try:
        return _key(entry.lstat()) == _key(info)
    except OSError:
        return True  # gone or unreadable now: the caller's next step says so


def release(fd: int, held: bool) -> None:
    """Close a descriptor from `open_locked`, which drops its lock; `held` as it returned."""
    try:
        if held:
            _held.discard(_key(os.fstat(fd)))
    finally:
        os.close(fd)


@contextmanager
def new_files_held() -> Iterator[None]:
    """Every file written meanwhile (`hold_new`) stays locked until the block ends, so another
    run that opens a member already renamed into place waits until the whole group is, and
    never reads part of the group new and part old."""
    global _kept
    outer, _kept = _kept, []
    try:
        yield
    finally:
        kept, _kept = _kept, outer
        for fd in kept:
            release(fd, True)


def hold_new(fd: int) -> None:
    """Lock a new file, still under its temporary name (no other process has it open), while
    `new_files_held` is active; otherwise nothing."""
    if _kept is None:
        return
    try:
        held = os.dup(fd)
    except OSError:  # out of descriptors (a huge group): this file goes unheld
        return
    try:
        _lock(held, True, time.monotonic() + WAIT_SECONDS)
    except BaseException:
        os.close(held)
        raise
    _held.add(_key(os.fstat(held)))
    _kept.append(held)
