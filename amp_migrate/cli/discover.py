"""Which files a run looks at: paths in, a sorted list of Python files, notebooks and install
files (requirements, setup.cfg, pyproject.toml, conda environments, Dockerfiles, shell
scripts, Markdown: amp_migrate/install/kinds.py) out.

Inside a git work tree git itself says which files are ignored (`git ls-files --others
--exclude-standard`), so nested `.gitignore`s, `.git/info/exclude` and the global excludes
file mean exactly what they mean to git. Outside one, or with `--no-gitignore`, folders are
walked. Either way virtualenvs, site-packages, caches and build output are skipped unless a
file there is named on the command line, as ruff and black do.

Nothing found is dropped without a word. Symlinks met on the way (to files or folders) are
noted and not followed unless `--follow-symlinks` (a path named on the command line is
followed: the user named it); a followed file link is resolved here, once, so that the run
reads and writes the real file and the write never has to follow a link. Anything that is
not a regular file (a FIFO, a device, a socket) and every folder that cannot be read is
reported as an error: the run cannot vouch for input it could not read.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Iterable, Iterator, Optional, Sequence

from ..install.kinds import install_kind
from ..io.source_file import file_type

SUFFIXES = {".py": "python", ".ipynb": "notebook"}
SKIPPED_FOLDERS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        "__pycache__",
        "site-packages",
        "dist-packages",
        "build",
        "dist",
        "_build",
        "buck-out",
        ".eggs",
        ".tox",
        ".nox",
        ".venv",
        "venv",
        ".direnv",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
    }
)


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
        return any(fnmatch.fnmatchcase("/".join(parts[: i + 1]), self.pattern) for i in range(len(parts)))


@dataclass(frozen=True)
class Filters:
    exclude: tuple[Glob, ...] = ()
    include: tuple[Glob, ...] = ()
    gitignore: bool = True
    force_exclude: bool = False  # apply excludes to files named on the command line too
    follow_symlinks: bool = False  # follow symlinks met while walking folders


@dataclass(frozen=True)
class Candidate:
    """A file to migrate, or (with `error` or `note`) a path the run reports and does not read."""

    path: str
    kind: str  # "python", "notebook", an install kind, or "folder" for a folder that could not be read
    error: Optional[str] = None  # could not be taken: reported, and the run exits 2
    note: Optional[str] = None  # deliberately not taken (a symlink): reported only

    @property
    def taken(self) -> bool:
        return self.error is None and self.note is None


LINK_NOTE = "a symbolic link, not followed (--follow-symlinks follows it)"
_GIT_UNREADABLE = re.compile(r"could not open directory '(.*)': (.*)$")


def kind_of(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    return SUFFIXES[suffix] if suffix in SUFFIXES else install_kind(path) or "python"


def _git_listing(folder: str) -> Optional[tuple[list[str], list[tuple[str, str]]]]:
    """Files under `folder` that git does not ignore, relative to it, and the folders git could
    not read (relative path, reason), which it only warns about; None outside a work tree."""
    try:
        proc = subprocess.run(
            ["git", "-C", folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    unreadable = [
        (m.group(1), m.group(2))
        for line in os.fsdecode(proc.stderr).splitlines()
        if (m := _GIT_UNREADABLE.search(line))
    ]
    return [name for name in os.fsdecode(proc.stdout).split("\0") if name], unreadable


def _not_regular(mode: int) -> Optional[str]:
    if stat.S_ISREG(mode):
        return None
    return f"not a regular file ({file_type(mode)}), not read"


def _shown(path: str) -> str:
    """A resolved path as the user would write it: relative when under the current folder."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


@dataclass
class _Walker:
    filters: Filters
    _venv_cache: dict[str, bool] = field(default_factory=dict)
    problems: list[Candidate] = field(default_factory=list)
    _visited: set[str] = field(default_factory=set)  # real folders walked: no loop twice

    def unreadable(self, path: str, reason: str) -> None:
        self.problems.append(
            Candidate(os.path.normpath(path), "folder", error=f"cannot read folder: {reason}")
        )

    def _on_walk_error(self, exc: OSError) -> None:
        self.unreadable(exc.filename or "?", exc.strerror or str(exc))

    def take(self, path: str, follow: bool) -> Iterator[str]:
        """`path` (a file found, or named) if it is a regular file: a symlink resolved when
        `follow`, noted otherwise; anything else reported."""
        kind = kind_of(path)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return  # gone since it was listed
        except OSError as exc:
            self.problems.append(Candidate(path, kind, error=f"cannot stat: {exc.strerror or exc}"))
            return
        if stat.S_ISLNK(info.st_mode):
            if not follow:
                self.problems.append(Candidate(path, kind, note=LINK_NOTE))
                return
            real = os.path.realpath(path)
            try:
                info = os.stat(real)
            except OSError as exc:
                self.problems.append(
                    Candidate(
                        path, kind, error=f"a symbolic link that cannot be followed: {exc.strerror or exc}"
                    )
                )
                return
            if stat.S_ISDIR(info.st_mode):  # became a folder link since it was listed
                if self.linked_folder(path):
                    yield from self.walk(path)
                return
            path = _shown(real)
        problem = _not_regular(info.st_mode)
        if problem is not None:
            self.problems.append(Candidate(path, kind, error=problem))
            return
        yield path

    def linked_folder(self, path: str) -> bool:
        """Whether to walk into a folder reached through a symlink (noted when not)."""
        if not self.filters.follow_symlinks:
            self.problems.append(Candidate(path, "folder", note=LINK_NOTE))
            return False
        return os.path.realpath(path) not in self._visited

    def _is_venv(self, folder: str) -> bool:
        if folder not in self._venv_cache:
            self._venv_cache[folder] = os.path.isfile(os.path.join(folder, "pyvenv.cfg"))
        return self._venv_cache[folder]

    def skipped_folder(self, folder: str) -> bool:
        name = os.path.basename(folder)
        return (
            name in SKIPPED_FOLDERS
            or name.endswith(".egg-info")
            or self._is_venv(folder)
            or any(glob.matches(folder) for glob in self.filters.exclude)
        )

    def wanted(self, path: str) -> bool:
        if os.path.splitext(path)[1].lower() not in SUFFIXES and install_kind(path) is None:
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
        return any(name in SKIPPED_FOLDERS or name.endswith(".egg-info") for name in folders) or any(
            glob.matches(path) for glob in self.filters.exclude
        )

    def walk(self, root: str) -> Iterator[str]:
        self._visited.add(os.path.realpath(root))
        listing = _git_listing(root) if self.filters.gitignore else None
        if listing is not None:
            files, unreadable = listing
            for rel, reason in unreadable:
                if not self.in_skipped_folder(root, rel.rstrip("/") + "/"):  # the folder itself too
                    self.unreadable(os.path.join(root, rel), reason)
            for rel in files:
                path = os.path.normpath(os.path.join(root, rel))
                if self.in_skipped_folder(root, rel):
                    continue
                if os.path.islink(path) and os.path.isdir(path):
                    if not self.skipped_folder(path) and self.linked_folder(path):
                        yield from self.walk(path)
                elif not os.path.isdir(path) and self.wanted(path):
                    yield from self.take(path, self.filters.follow_symlinks)
            return
        for folder, subfolders, names in os.walk(
            root, onerror=self._on_walk_error, followlinks=self.filters.follow_symlinks
        ):
            self._visited.add(os.path.realpath(folder))
            kept = []
            for name in subfolders:
                path = os.path.join(folder, name)
                if self.skipped_folder(path):
                    continue
                if os.path.islink(path) and not self.linked_folder(os.path.normpath(path)):
                    continue
                kept.append(name)
            subfolders[:] = kept
            for name in names:
                path = os.path.normpath(os.path.join(folder, name))
                if self.wanted(path):
                    yield from self.take(path, self.filters.follow_symlinks)


def discover(paths: Sequence[str], filters: Filters = Filters()) -> list[Candidate]:
    """Every file to look at, sorted by path, each once (a file reached by two paths, through a
    followed symlink, once), then what the run reports without reading it."""
    walker = _Walker(filters)
    found: dict[str, str] = {}

    def add(paths: Iterable[str]) -> None:
        for path in paths:
            real = os.path.realpath(path)
            # Reached twice (through a followed folder link), a file goes by its own path.
            if real not in found or real == os.path.abspath(path):
                found[real] = path

    for given in paths:
        path = os.path.normpath(given)
        if os.path.isdir(path):
            add(walker.walk(path))
        elif not (filters.force_exclude and walker.excluded_file(path)):
            add(walker.take(path, follow=True))
    problems = {(p.path, p.kind): p for p in walker.problems}
    return [Candidate(path, kind_of(path)) for path in sorted(found.values())] + sorted(
        problems.values(), key=lambda p: p.path
    )
