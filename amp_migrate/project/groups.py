"""Which files of a tree must share a target.

Apex's amp state is process-wide, so a module that reads it (scales, steps, saves through it)
is tied to every module that may set it up in the same process. Two modules run in the same
process when some module of the tree reaches both by imports (it may be one of them): a
script importing the trainer, a trainer importing the optimizer factory, a launcher importing
both. Each use is tied to every such owner; the groups are what those ties connect.

A module that imports Apex and reads amp state, but that no owner shares an importer with
(its importer is outside the tree as given, or loads it by name from a registry), is tied to
every owner in its folder, the folders above it and those below: better one group too many
on the shim than a native module beside a helper whose `amp.state_dict()` reads an
uninitialized shim. Owners that run as programs (`if __name__ == "__main__":`) are left out
of that guess: a script that does not import the helper does not run it. A folder of
independent scripts stays a folder of independent files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Optional

from .index import ModuleFacts, ProjectIndex, Site


@dataclass(frozen=True)
class Tie:
    """`user` reads Apex state (or an Apex object) that `owner` sets up."""

    user: str
    owner: str
    use: Site
    own: Site
    how: str  # how the two meet, for messages


@dataclass(frozen=True)
class Group:
    members: tuple[str, ...]  # sorted paths
    ties: tuple[Tie, ...]


def _ancestors(index: ProjectIndex) -> dict[str, set[str]]:
    """For each module that touches Apex: every module that reaches it by imports, itself
    included."""
    importers: dict[str, set[str]] = {}
    for importer, targets in index.edges.items():
        for target in targets:
            importers.setdefault(target, set()).add(importer)
    found = {}
    for path, facts in index.modules.items():
        if not facts.touches:
            continue
        seen, todo = {path}, [path]
        while todo:
            for parent in importers.get(todo.pop(), ()):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        found[path] = seen
    return found


def first_use(facts: ModuleFacts) -> Optional[Site]:
    sites = facts.uses + facts.foreign + facts.provided
    return min(sites, key=lambda s: (s.line, s.col)) if sites else None


def _how(index: ProjectIndex, user: str, owner: str, common: set[str]) -> str:
    if owner in index.edges.get(user, ()):
        return f"{user} imports {owner}"
    if user in index.edges.get(owner, ()):
        return f"{owner} imports {user}"
    return f"{min(common)} reaches both by imports"


def _nested(a: str, b: str) -> bool:
    """Whether one file's folder holds the other's (or they share one)."""
    folder_a, folder_b = posixpath.dirname(a), posixpath.dirname(b)
    common = posixpath.commonpath([folder_a, folder_b]) if folder_a and folder_b else ""
    return common in (folder_a, folder_b)


def ties(index: ProjectIndex) -> list[Tie]:
    ancestors = _ancestors(index)
    owners = {p: f.owns for p, f in index.modules.items() if f.owns}
    found = []
    for path, facts in index.modules.items():
        use = first_use(facts)
        if use is None:
            continue
        tied = []
        for owner, sites in owners.items():
            common = ancestors[path] & ancestors[owner] if owner != path else set()
            if common:
                tied.append(Tie(path, owner, use, sites[0], _how(index, path, owner, common)))
        if not tied and facts.uses and not facts.initialize and not facts.fp16_optimizers:
            tied = [
                Tie(
                    path,
                    owner,
                    facts.uses[0],
                    sites[0],
                    f"no module of the tree both imports {path} and sets Apex up",
                )
                for owner, sites in owners.items()
                if owner != path and not index.modules[owner].script and _nested(path, owner)
            ]
        found += tied
    return found


def find_groups(index: ProjectIndex) -> list[Group]:
    """The groups of two or more files, each with the ties that made it."""
    parent: dict[str, str] = {}

    def root(path: str) -> str:
        while parent.setdefault(path, path) != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    all_ties = ties(index)
    for tie in all_ties:
        parent[root(tie.user)] = root(tie.owner)
    members: dict[str, list[str]] = {}
    for path in list(parent):
        members.setdefault(root(path), []).append(path)
    groups = []
    for paths in members.values():
        if len(paths) > 1:
            inside = set(paths)
            groups.append(Group(tuple(sorted(paths)), tuple(t for t in all_ties if t.user in inside)))
    return sorted(groups, key=lambda g: g.members)
