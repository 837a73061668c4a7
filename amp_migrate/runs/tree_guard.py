"""verify must leave the user's tree as it found it: the files it can see changed after the
runs, and the absolute paths into the tree that a run could write through where the tree's
path cannot be mapped to a copy.

A snapshot holds each file's size and, where hashing is cheap (files up to `HASHED` bytes), a
digest of its content; a larger file is judged by its size and its modification and change
times, which a write moves and a program cannot set back (the change time). The folders verify
does not copy (version control, caches, virtual environments, verify's own) are not looked at:
they are no part of the program, and a run writes its bytecode caches there.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

#: Files up to this size are compared by content, larger ones by size and times.
HASHED = 16 * 1024 * 1024
#: The copy's ignore function (shutil.copytree's): the names in a directory that are not copied.
Ignored = Callable[[str, list[str]], list[str]]


@dataclass(frozen=True)
class Entry:
    size: int
    digest: Optional[str]  # of the content (a link's target); None: too large, or unreadable
    times: Optional[tuple[int, int]]  # (mtime_ns, ctime_ns) where there is no digest


@dataclass(frozen=True)
class Change:
    path: str  # relative to the tree
    how: str  # "changed", "created" or "deleted"


def _files(root: Path, ignored: Ignored) -> Iterator[str]:
    for directory, folders, names in os.walk(root):
        skipped = set(ignored(directory, folders + names))
        folders[:] = sorted(name for name in folders if name not in skipped)
        for name in sorted(names):
            if name not in skipped:
                yield os.path.relpath(os.path.join(directory, name), root)
        for name in list(folders):
            if os.path.islink(os.path.join(directory, name)):
                folders.remove(name)  # a link, copied as a link: its target is not the tree's
                yield os.path.relpath(os.path.join(directory, name), root)


def _digest(path: str) -> Optional[str]:
    hasher = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                hasher.update(block)
    except OSError:
        return None
    return hasher.hexdigest()


def _entry(path: str) -> Optional[Entry]:
    try:
        stat = os.lstat(path)
        if os.path.islink(path):
            target = os.readlink(path)
            return Entry(len(target), hashlib.blake2b(target.encode(), digest_size=16).hexdigest(), None)
    except OSError:
        return None
    if not os.path.isfile(path):
        return None  # a socket, a fifo: no content to change
    digest = _digest(path) if stat.st_size <= HASHED else None
    return Entry(stat.st_size, digest, None if digest else (stat.st_mtime_ns, stat.st_ctime_ns))


def snapshot(root: Path, ignored: Ignored) -> dict[str, Entry]:
    """Every file of the tree that the copy holds, as it is now."""
    entries = {}
    for relative in _files(root, ignored):
        entry = _entry(os.path.join(root, relative))
        if entry is not None:
            entries[Path(relative).as_posix()] = entry
    return entries


def changes(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[Change]:
    """The files created, deleted or whose content changed between two snapshots."""
    found = [Change(path, "deleted") for path in before if path not in after]
    found += [Change(path, "created") for path in after if path not in before]
    found += [Change(path, "changed") for path in before if path in after and before[path] != after[path]]
    return sorted(found, key=lambda change: change.path)


def _in_copied_part(path: str, root: str, ignored: Ignored) -> bool:
    """Whether `path` (normalized) is the tree or inside it, but not inside what is not copied."""
    if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
        return False
    directory = root
    for part in Path(os.path.relpath(path, root)).parts if path != root else ():
        if ignored(directory, [part]):
            return False
        directory = os.path.join(directory, part)
    return True


def into_tree(value: str, root: Path, ignored: Ignored) -> Optional[str]:
    """The absolute path into the tree that `value` holds (whole, after `=`, or one of a
    path list's entries); None where it holds none."""
    roots = {os.path.normpath(root), os.path.realpath(root)}
    candidates = [value, value.partition("=")[2], *value.split(os.pathsep)]
    for candidate in candidates:
        if not os.path.isabs(candidate):
            continue
        for path in {os.path.normpath(candidate), os.path.realpath(candidate)}:
            if any(_in_copied_part(path, tree, ignored) for tree in roots):
                return candidate
    return None


def paths_into_tree(
    args: Sequence[str], environment: Mapping[str, str], root: Path, ignored: Ignored
) -> list[str]:
    """Each argument and environment variable holding an absolute path into the tree, named as
    a refusal names it."""
    found = [f"argument {arg}" for arg in args if into_tree(arg, root, ignored)]
    found += [
        f"environment variable {name}={value}"
        for name, value in sorted(environment.items())
        if into_tree(value, root, ignored)
    ]
    return found
