"""Which files a run looks at: paths in, a sorted list of Python files and notebooks out.

Inside a git work tree git itself says which files are ignored (`git ls-files --others
--exclude-standard`), so nested `.gitignore`s, `.git/info/exclude` and the global excludes
file mean exactly what they mean to git. Outside one, or with `--no-gitignore`, folders are
walked. Either way virtualenvs, site-packages, caches and build output are skipped unless a
file there is named on the command line, as ruff and black do.
"""
from __future__ import annotations

import fnmatch
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Iterator, Optional, Sequence

SUFFIXES = {".py": "python", ".ipynb": "notebook"}
SKIPPED_FOLDERS = frozenset({
    ".git", ".hg", ".svn", ".bzr", "__pycache__", "site-packages", "dist-packages", "build",
    "dist", "_build", "buck-out", ".eggs", ".tox", ".nox", ".venv", "venv", ".direnv",
    "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints",
})


@dataclass(frozen=True)
class Glob:
    """A pattern matched against every folder name and every leading part of a path, taken
    relative to `base` (the current folder for flags, the pyproject.toml's folder for its
    settings): `build`, `tests/legacy`, `*_pb2.py`, `src/*/vendored`."""

    pattern: str
    base: str = "."

    def matches(self, path: str) -> bool:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.base))
        parts = [p for p in PurePosixPath(rel.replace(os.sep, "/")).parts if p not in (".", "..")]
        if any(fnmatch.fnmatchcase(part, self.pattern) for part in parts):
            return True
        return any(fnmatch.fnmatchcase("/".join(parts[: i + 1]), self.pattern)
                   for i in range(len(parts)))


@dataclass(frozen=True)
class Filters:
    exclude: tuple[Glob, ...] = ()
    include: tuple[Glob, ...] = ()
    gitignore: bool = True
    force_exclude: bool = False  # apply excludes to files named on the command line too


@dataclass(frozen=True)
class Candidate:
    path: str
    kind: str


def kind_of(path: str) -> str:
    return SUFFIXES.get(os.path.splitext(path)[1].lower(), "python")


def _git_listing(folder: str) -> Optional[list[str]]:
    """Files under `folder` that git does not ignore, relative to it; None outside a work tree."""
    try:
        proc = subprocess.run(
            ["git", "-C", folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return [name for name in os.fsdecode(proc.stdout).split("\0") if name]


@dataclass
class _Walker:
    filters: Filters
    _venv_cache: dict[str, bool] = field(default_factory=dict)

    def _is_venv(self, folder: str) -> bool:
        if folder not in self._venv_cache:
            self._venv_cache[folder] = os.path.isfile(os.path.join(folder, "pyvenv.cfg"))
        return self._venv_cache[folder]

    def skipped_folder(self, folder: str) -> bool:
        name = os.path.basename(folder)
        return (name in SKIPPED_FOLDERS or name.endswith(".egg-info") or self._is_venv(folder)
                or any(glob.matches(folder) for glob in self.filters.exclude))

    def wanted(self, path: str) -> bool:
        if os.path.splitext(path)[1].lower() not in SUFFIXES:
            return False
        if any(glob.matches(path) for glob in self.filters.exclude):
            return False
        return not self.filters.include or any(glob.matches(path) for glob in self.filters.include)

    def in_skipped_folder(self, root: str, rel: str) -> bool:
        folder = root
        for part in rel.split("/")[:-1]:
            folder = os.path.join(folder, part)
            if self.skipped_folder(folder):
                return True
        return False

    def excluded_file(self, path: str) -> bool:
        folders = os.path.dirname(os.path.relpath(path)).split(os.sep)
        return (any(name in SKIPPED_FOLDERS or name.endswith(".egg-info") for name in folders)
                or any(glob.matches(path) for glob in self.filters.exclude))

    def walk(self, root: str) -> Iterator[str]:
        listing = _git_listing(root) if self.filters.gitignore else None
        if listing is not None:
            for rel in listing:
                path = os.path.normpath(os.path.join(root, rel))
                if os.path.lexists(path) and not os.path.isdir(path) \
                        and not self.in_skipped_folder(root, rel) and self.wanted(path):
                    yield path
            return
        for folder, subfolders, names in os.walk(root, followlinks=False):
            subfolders[:] = [d for d in subfolders if not self.skipped_folder(os.path.join(folder, d))]
            for name in names:
                path = os.path.normpath(os.path.join(folder, name))
                if self.wanted(path):
                    yield path


def discover(paths: Sequence[str], filters: Filters = Filters()) -> list[Candidate]:
    """Every file to look at, sorted by path, each once."""
    walker = _Walker(filters)
    found: dict[str, str] = {}

    def add(paths: Iterable[str]) -> None:
        for path in paths:
            found.setdefault(os.path.abspath(path), path)

    for given in paths:
        path = os.path.normpath(given)
        if os.path.isdir(path):
            add(walker.walk(path))
        elif not (filters.force_exclude and walker.excluded_file(path)):
            add([path])
    return [Candidate(path, kind_of(path)) for path in sorted(found.values())]
