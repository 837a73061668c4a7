"""Python files as bytes on disk and as text for the codemod, and writing them back safely.

The codemod works on `str` with `\\n` newlines (its rules build code with `\\n`), while users'
files carry a PEP 263 cookie or a BOM, CRLF, CR or mixed newlines, no trailing newline, a
mode. Everything the codemod did not touch must come back byte for byte, so decoding refuses
any file whose bytes would not survive the round trip, and a write replaces the file in one
rename (by `atomic_write`, which convert-checkpoint uses too) so that an interruption never
leaves half a file.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tokenize
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from . import file_locks
from .atomic_write import (
    CREATE_TEMP,
    NOFOLLOW,
    OPEN_FOLDER,
    WRITE,
    Entry,
    WriteFailed,
    open_entry,
    replace_atomically,
)
from .file_locks import Busy, open_locked, release
from .lines import LineBreaks, normalise_line_breaks


class SourceError(Exception):
    """The file cannot be read, decoded or written; the message is the reason, for the user."""


@dataclass(frozen=True)
class SourceText:
    text: str  # every line break as "\n"
    encoding: str  # a codec name; "utf-8-sig" when the file starts with a BOM
    breaks: LineBreaks = LineBreaks("\n")  # the file's own line breaks

    @property
    def newline(self) -> str:
        """The break new lines get: the file's, or its most common one."""
        return self.breaks.style

    def to_bytes(self, text: str) -> bytes:
        """`text` (a migration of `self.text`) as the file's bytes: its encoding, and its line
        breaks on every line the migration kept."""
        text = self.breaks.restore(self.text, text)
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise SourceError(
                f"the migrated text cannot be encoded as {self.encoding}: {exc.reason}"
            ) from None


def decode(data: bytes) -> SourceText:
    """The text of a Python file, or SourceError when it is not decodable by its own declared
    encoding or would not encode back to the same bytes."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding declaration" in exc.msg:
            raise SourceError(
                "not valid UTF-8, and no PEP 263 coding cookie names another encoding"
            ) from None
        raise SourceError(f"bad encoding declaration: {exc.msg}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        reason = exc.reason if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise SourceError(f"not decodable as {encoding} ({reason})") from None
    text, breaks = normalise_line_breaks(text)
    source = SourceText(text, encoding, breaks)
    try:
        same = source.to_bytes(source.text) == data
    except SourceError:
        same = False
    if not same:
        raise SourceError(f"the bytes do not survive decoding and encoding as {encoding}")
    return source


@dataclass(frozen=True)
class Stamp:
    """What a read saw, so that the write can tell the file is still the one that was migrated:
    its folder (device, inode) and a digest of its bytes."""

    folder: tuple[int, int]
    digest: str


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def file_type(mode: int) -> str:
    """What a file that is not a regular one is, for messages: "a FIFO", "a socket", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_entry(path: Union[str, Path]) -> Entry:
    """The file's name in its folder, opened once: later steps then cannot be sent elsewhere by
    a folder swapped for a symlink."""
    try:
        return open_entry(path)
    except OSError as exc:
        raise SourceError(_os_reason(exc, "cannot open its folder")) from None


_READ_FLAGS = os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_regular(entry: Entry, shared_lock: bool = False) -> bytes:
    """The bytes of a regular file, never through a symlink and never blocking on a FIFO or a
    device (opened non-blocking, then refused by its type before any read). With
    `shared_lock`, it waits out another run writing the file (file_locks.py) and reads what
    that run wrote."""
    try:
        fd = open_locked(entry, _READ_FLAGS, exclusive=False)[0] if shared_lock else entry.open(_READ_FLAGS)
    except Busy:
        raise SourceError(
            f"another amp-migrate run kept it locked for over {file_locks.WAIT_SECONDS:g} s, not read"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and _is_link(entry):
            raise SourceError("a symbolic link, not followed") from None
        raise SourceError(_os_reason(exc, "cannot read")) from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SourceError(f"not a regular file ({file_type(mode)}), not read")
        try:
            return handle.read()
        except OSError as exc:
            raise SourceError(_os_reason(exc, "cannot read")) from None


def _is_link(entry: Entry) -> bool:
    try:
        return stat.S_ISLNK(entry.lstat().st_mode)
    except OSError:
        return False


def read_stamped(path: Union[str, Path]) -> tuple[bytes, Stamp]:
    """The file's bytes and the Stamp that `write_atomic` checks before replacing it."""
    entry = _open_entry(path)
    try:
        data = _read_regular(entry, shared_lock=True)
        folder = entry.folder_stat()
    finally:
        entry.close()
    return data, Stamp((folder.st_dev, folder.st_ino), digest(data))


def digest(data: bytes) -> str:
    """What a Stamp and a group's journal record of a file's bytes."""
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Union[str, Path]) -> bytes:
    return read_stamped(path)[0]


def _os_reason(exc: OSError, what: str) -> str:
    return f"{what}: {exc.strerror or exc}"


def check_writable(path: Union[str, Path]) -> None:
    """Refuse files the user marked read-only, even where the folder (or root) would allow
    replacing them."""
    entry = _open_entry(path)
    try:
        _check_writable(entry)
    finally:
        entry.close()


def _check_writable(entry: Entry) -> None:
    """The file's own entry (never a symlink's target), refused unless a writable regular file."""
    try:
        info = entry.lstat()
    except OSError as exc:
        raise SourceError(_os_reason(exc, "cannot stat")) from None
    if stat.S_ISLNK(info.st_mode):
        raise SourceError("now a symbolic link (replaced during migration), not written")
    if not stat.S_ISREG(info.st_mode):
        raise SourceError(f"not a regular file ({file_type(info.st_mode)}), not written")
    if not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(
        entry.name, os.W_OK, **entry.at
    ):
        raise SourceError("not writable: the file is read-only")


#: How a failed step of the write reads in a SourceError.
_STEP_REASONS = {
    OPEN_FOLDER: "cannot open its folder",
    CREATE_TEMP: "cannot write to its folder",
    WRITE: "cannot write",
}


@contextmanager
def locked_for_write(path: Union[str, Path]) -> Iterator[None]:
    """Hold the file exclusively against other amp-migrate runs (file_locks.py) until the block
    ends: they neither read it nor write it meanwhile. A file that cannot be opened is not
    locked; the write that follows says why it cannot be written."""
    try:
        entry = open_entry(path)
    except OSError:
        yield
        return
    try:
        try:
            fd, held = open_locked(entry, _READ_FLAGS, exclusive=True)
        except Busy:
            raise SourceError(
                f"another amp-migrate run kept it locked for over {file_locks.WAIT_SECONDS:g} s, not written"
            ) from None
        except OSError:
            fd = None
    finally:
        entry.close()
    try:
        yield
    finally:
        if fd is not None:
            release(fd, held)


def write_atomic(path: Union[str, Path], data: bytes, expect: Optional[Stamp] = None) -> None:
    """Replace the existing file's own directory entry with `data` (through the one atomic
    writer, `atomic_write.replace_atomically`), refusing anything but a writable regular file.
    On any failure the old file is left as it was.

    A symlink is never followed: a file that is one now was swapped during the run, and its
    target may lie outside the tree. With `expect` (what the migration read), the file is
    re-read just before the rename and left alone unless it is still those bytes in that
    folder, so that an edit made while the run computed is never lost. The file is locked
    against other runs throughout (`locked_for_write`).
    """

    def check(entry: Entry) -> None:
        if expect is not None:
            _check_folder(entry, expect)
        _check_writable(entry)

    def before_rename(entry: Entry) -> None:
        if expect is not None:
            _check_unchanged(entry, expect)

    with locked_for_write(path):
        try:
            replace_atomically(
                path,
                data,
                may_create=False,
                check=check,
                before_rename=before_rename,
                written=file_locks.hold_new,
            )
        except WriteFailed as exc:
            raise SourceError(_os_reason(exc.error, _STEP_REASONS[exc.step])) from None


def _check_folder(entry: Entry, expect: Stamp) -> None:
    folder = entry.folder_stat()
    if (folder.st_dev, folder.st_ino) != expect.folder:
        raise SourceError("its folder was moved or replaced during migration, not written")


def check_unchanged(path: Union[str, Path], expect: Stamp) -> bytes:
    """What `write_atomic(path, ..., expect)` checks before it writes, without writing: the
    file's bytes, or SourceError saying why it would not be written. A group of files checks
    every member so before writing any."""
    entry = _open_entry(path)
    try:
        _check_folder(entry, expect)
        return _check_unchanged(entry, expect)
    finally:
        entry.close()


def _check_unchanged(entry: Entry, expect: Stamp) -> bytes:
    """The last look before the rename: the same bytes as were migrated, still a regular file."""
    _check_writable(entry)
    try:
        current = _read_regular(entry)
    except SourceError as exc:
        raise SourceError(f"changed during migration ({exc}), not written") from None
    if digest(current) != expect.digest:
        raise SourceError("changed during migration, not written")
    return current
