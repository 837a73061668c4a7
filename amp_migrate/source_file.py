"""Python files as bytes on disk and as text for the codemod, and writing them back safely.

The codemod works on `str` with `\\n` newlines (its rules build code with `\\n`), while users'
files carry a PEP 263 cookie or a BOM, CRLF newlines, no trailing newline, a mode. Everything
the codemod did not touch must come back byte for byte, so decoding refuses any file whose
bytes would not survive the round trip, and a write replaces the file in one rename so that
an interruption never leaves half a file.
"""
from __future__ import annotations

import io
import os
import signal
import stat
import tempfile
import threading
import tokenize
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union


class SourceError(Exception):
    """The file cannot be read, decoded or written; the message is the reason, for the user."""


@dataclass(frozen=True)
class SourceText:
    text: str  # newlines as "\n" when the file used one style throughout
    encoding: str  # a codec name; "utf-8-sig" when the file starts with a BOM
    newline: str  # the style `text` is turned back into: "\n" or "\r\n"

    def to_bytes(self, text: str) -> bytes:
        if self.newline != "\n":
            text = text.replace("\n", self.newline)
        try:
            return text.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise SourceError(f"the migrated text cannot be encoded as {self.encoding}: {exc.reason}") from None


def _newline_of(text: str) -> str:
    """CRLF when every line break is CRLF; otherwise the text is kept as it is (libcst keeps
    mixed line breaks, and new lines get "\\n")."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf == text.count("\n") else "\n"


def decode(data: bytes) -> SourceText:
    """The text of a Python file, or SourceError when it is not decodable by its own declared
    encoding or would not encode back to the same bytes."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding declaration" in exc.msg:
            raise SourceError("not valid UTF-8, and no PEP 263 coding cookie names another "
                              "encoding") from None
        raise SourceError(f"bad encoding declaration: {exc.msg}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        reason = exc.reason if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise SourceError(f"not decodable as {encoding} ({reason})") from None
    newline = _newline_of(text)
    source = SourceText(text.replace("\r\n", "\n") if newline == "\r\n" else text, encoding, newline)
    try:
        same = source.to_bytes(source.text) == data
    except SourceError:
        same = False
    if not same:
        raise SourceError(f"the bytes do not survive decoding and encoding as {encoding}")
    return source


def read_bytes(path: Union[str, Path]) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise SourceError(_os_reason(exc, "cannot read")) from None


def _os_reason(exc: OSError, what: str) -> str:
    return f"{what}: {exc.strerror or exc}"


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
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


def check_writable(path: Union[str, Path]) -> None:
    """Refuse files the user marked read-only, even where the folder (or root) would allow
    replacing them."""
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except OSError as exc:
        raise SourceError(_os_reason(exc, "cannot stat")) from None
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(target, os.W_OK):
        raise SourceError("not writable: the file is read-only")


def write_atomic(path: Union[str, Path], data: bytes) -> None:
    """Replace the file (a symlink's target) with `data` by rename, keeping its mode and,
    where allowed, its owner. On any failure the old file is left as it was."""
    target = os.path.realpath(path)
    check_writable(target)
    info = os.stat(target)
    folder, name = os.path.split(target)
    with _interrupts_deferred():
        try:
            fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".amp-migrate")
        except OSError as exc:
            raise SourceError(_os_reason(exc, "cannot write to its folder")) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(temp, stat.S_IMODE(info.st_mode))
            try:
                os.chown(temp, info.st_uid, info.st_gid)
            except OSError:
                pass
            os.replace(temp, target)
        except BaseException as exc:
            try:
                os.unlink(temp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise SourceError(_os_reason(exc, "cannot write")) from None
            raise
