"""Replacing a file in one rename, for every file amp-migrate writes: migrated sources in place
and converted checkpoints.

Both must leave their target either as it was or complete, whatever happens meanwhile (kill,
Ctrl-C, a full disk, a file or folder swapped for a symlink). So there is one writer, and its
callers differ only in what they check (hooks) and how they word a failure (`WriteFailed`
says at which step an `OSError` came). The guarantees:

* the target's folder is opened once, and every later step names the file relative to it, so a
  folder swapped for a symlink cannot send the write elsewhere; a symlink at the target itself
  is never followed: its own directory entry is what gets replaced;
* the data goes to a new file beside the target (created `O_EXCL | O_NOFOLLOW`), written in
  chunks, fsynced, renamed over the target, and the folder fsynced so the rename survives a
  power cut; on any failure the temporary file is removed;
* a regular file being replaced keeps its mode and, where allowed, its owner; a new file gets
  the mode `open()` gives (0o666 less the umask), as `torch.save` would;
* Ctrl-C during the write takes effect once it has finished or been undone.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Where the platform cannot open files relative to a folder descriptor, names are full paths.
# os.replace takes src_dir_fd/dst_dir_fd wherever os.rename does (both are renameat), but only
# os.rename is listed in os.supports_dir_fd.
_AT = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and NOFOLLOW != 0
_WRITE_CHUNK = 1 << 20
_TEMP_TRIES = 100

#: The steps a `WriteFailed` names.
OPEN_FOLDER = "open the folder"
CREATE_TEMP = "create the temporary file"
WRITE = "write"


class WriteFailed(Exception):
    """An OSError at one step of a write; the target was left as it was."""

    def __init__(self, step: str, error: OSError) -> None:
        super().__init__(f"cannot {step}: {error.strerror or error}")
        self.step = step
        self.error = error


@dataclass(frozen=True)
class Entry:
    """A file's name in its folder, the folder held open: what hooks look at."""

    dir_fd: Optional[int]  # None where the platform has no *at() calls
    name: str  # relative to dir_fd; a full path where dir_fd is None

    @property
    def at(self) -> dict[str, Any]:
        """Keyword arguments that make an os call resolve `name` in this folder."""
        return {"dir_fd": self.dir_fd} if self.dir_fd is not None else {}

    def lstat(self) -> os.stat_result:
        """The entry itself, never a symlink's target."""
        return os.stat(self.name, follow_symlinks=False, **self.at)

    def folder_stat(self) -> os.stat_result:
        return os.fstat(self.dir_fd) if self.dir_fd is not None else os.stat(os.path.dirname(self.name))

    def open(self, flags: int, mode: int = 0o777) -> int:
        return os.open(self.name, flags, mode, **self.at)

    def close(self) -> None:
        if self.dir_fd is not None:
            os.close(self.dir_fd)


def open_entry(path: Union[str, Path]) -> Entry:
    """`path` as an Entry, its folder opened (OSError if it cannot be); close it when done."""
    folder, name = os.path.split(os.path.abspath(path))
    if not _AT:
        return Entry(None, os.path.join(folder, name))
    return Entry(os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC), name)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C during a write takes effect once the write has finished (or was undone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)


Hook = Callable[[Entry], None]


def replace_atomically(
    path: Union[str, Path],
    data: Union[bytes, memoryview],
    *,
    may_create: bool,
    check: Optional[Hook] = None,
    before_rename: Optional[Hook] = None,
    written: Optional[Callable[[int], None]] = None,
) -> None:
    """Make `path` hold `data`, all at once: see the module's docstring for the guarantees.

    `check` runs before anything is written and `before_rename` after the data is on disk, just
    before the rename: each may raise (the caller's own error) to leave the target alone.
    `written` gets the new file's descriptor once its data is on disk (to lock it before any
    other process can open it). Without `may_create`, a target that is not there is not
    created. Raises WriteFailed for an OSError.
    """
    try:
        entry = open_entry(path)
    except OSError as exc:
        raise WriteFailed(OPEN_FOLDER, exc) from None
    try:
        with interrupts_deferred():
            _replace(entry, data, may_create, check, before_rename, written)
    finally:
        entry.close()


def _replace(
    entry: Entry,
    data: Union[bytes, memoryview],
    may_create: bool,
    check: Optional[Hook],
    before_rename: Optional[Hook],
    written: Optional[Callable[[int], None]] = None,
) -> None:
    if check is not None:
        check(entry)
    existing = _existing_file(entry, may_create)
    try:
        # A new file is created with the mode open() gives; one that replaces a file starts
        # private and then takes that file's mode, so it is never more open than the old one.
        fd, temp = _create_temp(entry, 0o666 if existing is None else 0o600)
    except OSError as exc:
        raise WriteFailed(CREATE_TEMP, exc) from None
    try:
        try:
            if existing is not None:
                _keep_mode_and_owner(fd, existing)
            _write_all(fd, data)
            os.fsync(fd)
            if written is not None:
                written(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename(entry)
        os.replace(
            temp,
            entry.name,
            **({"src_dir_fd": entry.dir_fd, "dst_dir_fd": entry.dir_fd} if entry.dir_fd is not None else {}),
        )
    except BaseException as exc:
        try:
            os.unlink(temp, **entry.at)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise WriteFailed(WRITE, exc) from None
        raise
    _sync_folder(entry)


def _existing_file(entry: Entry, may_create: bool) -> Optional[os.stat_result]:
    """The regular file being replaced; None for a new file, or for an entry that is not a
    regular file (a symlink), which is replaced, not followed."""
    try:
        info = entry.lstat()
    except FileNotFoundError as exc:
        if may_create:
            return None
        raise WriteFailed(WRITE, exc) from None
    except OSError as exc:
        raise WriteFailed(WRITE, exc) from None
    return info if stat.S_ISREG(info.st_mode) else None


def _create_temp(entry: Entry, mode: int) -> tuple[int, str]:
    """A new file beside the target, never an existing one and never through a symlink."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC
    folder, base = os.path.split(entry.name)
    for _ in range(_TEMP_TRIES):
        temp = os.path.join(folder, f".{base}.{secrets.token_hex(4)}.amp-migrate")
        try:
            return os.open(temp, flags, mode, **entry.at), temp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name")


def _keep_mode_and_owner(fd: int, existing: os.stat_result) -> None:
    os.fchmod(fd, stat.S_IMODE(existing.st_mode))
    try:
        os.fchown(fd, existing.st_uid, existing.st_gid)
    except OSError:  # only root (or the owner, for its own groups) may; the mode still holds
        pass


def _write_all(fd: int, data: Union[bytes, memoryview]) -> None:
    """Chunked: one os.write may write less than asked, and a huge one may be refused."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view[:_WRITE_CHUNK])
        view = view[written:]


def _sync_folder(entry: Entry) -> None:
    """Make the rename survive a power cut; the target is complete either way, so failures pass."""
    try:
        if entry.dir_fd is not None:
            os.fsync(entry.dir_fd)
            return
        fd = os.open(os.path.dirname(entry.name), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
