"""Migrating a tree as a whole: index it, migrate each file alone, then settle each group.

`migrate_project` does it in memory (tests, the equivalence harness, the corpus bench);
`Tree` does it for the command line, fed by the process pool as results arrive, so that files
outside any group are final (and written) at once and a group's files as soon as the last of
them is in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

from ..cli.file_result import FileResult, Finding
from ..diagnostics import Diagnostic, Severity
from ..io.source_file import SourceError, read_bytes
from ..options import Options, Target
from . import codes
from .groups import Group, find_groups
from .index import ProjectIndex, build_index
from .loss_helpers import named_elsewhere
from .settle import Outcome, Verdict, blocker, own_warnings, settle

# The codemod (libcst, the rules) and the group passes that read its plans are imported where
# a file or a group needs them: a run whose files never spell Apex imports neither.
if TYPE_CHECKING:
    from ..migrate import MigrationResult
    from ..plan.types import SharedScaler
    from .notes import Notes


def _by_line(diagnostics: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=lambda d: (d.line, d.col, d.code)))


def _restated(kept: Iterable[Diagnostic], added: Iterable[Diagnostic]) -> set[Diagnostic]:
    """The per-file reports of a run-time import (AMP035) that the project pass's own
    report of the same call (AMP032, which says what the group does about it) restates."""
    imports = {(d.line, d.col) for d in added if d.code == codes.IMPORTED_DYNAMICALLY.code}
    if not imports:
        return set()
    from ..rules.dynamic_apex import DYNAMIC_USE

    return {d for d in kept if d.code == DYNAMIC_USE.code and (d.line, d.col) in imports}


def _outcome(result: MigrationResult) -> Outcome:
    return _outcome_of(result.diagnostics, result.changed, result.target_used)


def _outcome_of(diagnostics: Sequence[Diagnostic], changed: bool, target_used: Optional[str]) -> Outcome:
    errors = [d for d in diagnostics if d.severity == Severity.ERROR]
    if errors:
        return Outcome("error", tuple(errors[:1]))
    if not changed:
        return Outcome("unchanged")
    return Outcome(target_used or "error", tuple(d for d in diagnostics if d.falls_back))


def _migrate_one(
    text: str,
    target: Target,
    device: str,
    dtype: str,
    project: Optional[SharedScaler] = None,
    unsafe_fixes: bool = False,
) -> MigrationResult:
    from ..migrate import MigrationError, MigrationResult, migrate_source

    try:
        return migrate_source(
            text, target=target, device=device, dtype=dtype, unsafe_fixes=unsafe_fixes, project=project
        )
    except MigrationError as exc:
        return MigrationResult(text, (exc.as_diagnostic(),), None)


def migrate_project(
    files: Mapping[str, str],
    *,
    target: Target = "auto",
    device: str = "cuda",
    dtype: str = "float16",
    unsafe_fixes: bool = False,
) -> dict[str, MigrationResult]:
    """Migrate a tree given as relative path -> text: files that share Apex objects end on one
    target (docs/cli.md, "Projects"). Files not ending in `.py` are migrated alone."""
    from ..migrate import MigrationResult
    from .notes import notes_for

    python = {p: t for p, t in files.items() if p.endswith(".py")}
    index = build_index(python)
    groups = find_groups(index)
    roles, notes = _group_parts(index, groups, python) if target != "shim" else ({}, {})
    results = {
        p: _migrate_one(t, target, device, dtype, roles.get(p), unsafe_fixes) for p, t in files.items()
    }
    for path in python:
        results[path] = _callers_elsewhere(path, results[path], python, target, device, dtype)
    outcomes = {p: _outcome(r) for p, r in results.items()}
    grouped = {p for g in groups for p in g.members}
    provided = _provided(roles, outcomes)
    for group in groups:
        for path, verdict in settle(index, group, outcomes, target, provided=provided).items():
            result = results[path]
            if verdict.redo == "shim":
                result = _migrate_one(files[path], "shim", device, dtype)
            elif verdict.redo == "untouched":
                result = MigrationResult(files[path], result.diagnostics, None)
            results[path] = replace(result, diagnostics=_by_line(result.diagnostics + verdict.diagnostics))
    for path in index.modules:
        extra = own_warnings(index, path, outcomes[path], path in grouped, provided=path in provided)
        extra += notes_for(notes, path, results[path].diagnostics)
        if extra:
            restated = _restated(results[path].diagnostics, extra)
            kept = tuple(d for d in results[path].diagnostics if d not in restated)
            results[path] = replace(results[path], diagnostics=_by_line(kept + extra))
    return results


def _group_parts(
    index: ProjectIndex,
    groups: list[Group],
    texts: Mapping[str, str],
    names: Optional[Mapping[str, str]] = None,
) -> tuple[dict[str, SharedScaler], Notes]:
    """Each grouped module's part in its group (a shared GradScaler, a provider's) and the
    notes on what it hands over; read on a deeper stack where a member's nesting needs one,
    and none (each group then keeps the shim) where even that is not enough."""
    from .. import deep_stack
    from .notes import handover_notes
    from .provide import provider_roles
    from .share import shared_scalers

    def parts() -> tuple[dict[str, SharedScaler], Notes]:
        roles = shared_scalers(index, groups, texts, names)
        notes = handover_notes(index, groups, texts, names)
        roles.update(provider_roles(index, groups, texts, names))
        return roles, notes

    try:
        return deep_stack.call(parts)
    except deep_stack.TooDeep:
        return {}, {}


def _provided(roles: Mapping[str, SharedScaler], outcomes: Mapping[str, Outcome]) -> frozenset[str]:
    """The callers whose provider calls went native with their part (project/provide.py)."""
    from ..analysis.provided import ProvidedPart

    return frozenset(
        p
        for p, r in roles.items()
        if isinstance(r.provided, ProvidedPart)
        and r.provided.edits
        and p in outcomes
        and outcomes[p].status == "native"
    )


def _callers_elsewhere(
    path: str, result: MigrationResult, texts: Mapping[str, str], target: str, device: str, dtype: str
) -> MigrationResult:
    """The shim (or, under `--target native`, the file untouched) where another module names a
    function whose callers' forwards this file put under autocast (project/loss_helpers.py)."""
    found = named_elsewhere(path, texts[path], result.diagnostics, texts)
    if found is None:
        return result
    if target == "auto":
        result = _migrate_one(texts[path], "shim", device, dtype)
    else:
        from ..migrate import MigrationResult

        result = MigrationResult(texts[path], result.diagnostics, None)
    return replace(result, diagnostics=_by_line(result.diagnostics + (found,)))


def _file_outcome(result: FileResult) -> Outcome:
    if result.error is not None:
        return Outcome("error", (Diagnostic("AMP001", Severity.ERROR, 1, 1, result.error, False),))
    return _outcome_of([f.diagnostic for f in result.findings], result.changed, result.target_used)


def _with(result: FileResult, diagnostics: Sequence[Diagnostic]) -> FileResult:
    if not diagnostics:
        return result
    restated = _restated([f.diagnostic for f in result.findings], diagnostics)
    kept = [f for f in result.findings if f.diagnostic not in restated]
    findings = sorted(
        [*kept, *(Finding(d) for d in diagnostics)],
        key=lambda f: (f.diagnostic.line, f.diagnostic.col, f.diagnostic.code),
    )
    return replace(result, findings=tuple(findings), scanned=True)


def _read_text(path: str) -> Optional[str]:
    try:
        data = read_bytes(path)
    except SourceError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def index_key(path: str) -> str:
    """A file's key in the index: its whole absolute path, so that module names keep every
    folder and `from utils_nlp.common import x` resolves whichever folder the run was given."""
    return os.path.abspath(path).replace(os.sep, "/").lstrip("/")


@dataclass
class _Pending:
    group: Group
    results: dict[str, FileResult]


class Tree:
    """The command line's project pass over the Python files of a run."""

    def __init__(self, paths: Sequence[str], options: Options, want_diff: bool) -> None:
        started = time.perf_counter()
        self.rel = {p: index_key(p) for p in paths}
        self.names = {rel: p for p, rel in self.rel.items()}
        texts = {}
        for path, rel in self.rel.items():
            text = _read_text(path)
            if text is not None:
                texts[rel] = text
        self.texts = texts
        self.index: ProjectIndex = build_index(texts)
        # Under --target shim every file already uses the shim: nothing to settle or wait for.
        groups = find_groups(self.index) if options.target != "shim" else []
        self.roles: dict[str, SharedScaler] = {}
        self.notes: Notes = {}
        if groups:
            self.roles, self.notes = _group_parts(self.index, groups, texts, self.names)
        self.pending: dict[str, _Pending] = {}
        for group in groups:
            shared = _Pending(group, {})
            self.pending.update((rel, shared) for rel in group.members)
        self.options = options
        self.want_diff = want_diff
        self.index_seconds = time.perf_counter() - started

    @property
    def groups(self) -> list[Group]:
        return list({id(p.group): p.group for p in self.pending.values()}.values())

    def feed(self, result: FileResult) -> list[FileResult]:
        """The results that are final now that `result` is in."""
        rel = self.rel.get(result.path)
        if rel is None or rel not in self.index.modules:
            return [result]
        result = self._callers_elsewhere(rel, result)
        pending = self.pending.get(rel)
        if pending is None:
            return [_with(result, own_warnings(self.index, rel, _file_outcome(result), False, self.names))]
        pending.results[rel] = result
        if len(pending.results) < len(pending.group.members):
            return []
        return self._settle(pending)

    def _settle(self, pending: _Pending) -> list[FileResult]:
        from ..cli.runner import Job, process
        from .notes import notes_for

        outcomes = {rel: _file_outcome(r) for rel, r in pending.results.items()}
        if self._share(pending, outcomes):
            pending.results = {rel: self._callers_elsewhere(rel, r) for rel, r in pending.results.items()}
            outcomes = {rel: _file_outcome(r) for rel, r in pending.results.items()}
        provided = _provided(self.roles, outcomes)
        verdicts = settle(self.index, pending.group, outcomes, self.options.target, self.names, provided)
        final = []
        for rel, result in sorted(pending.results.items()):
            verdict = verdicts.get(rel, Verdict())
            if verdict.redo == "shim":
                result = process(
                    Job(result.path, result.kind, replace(self.options, target="shim"), self.want_diff)
                )
            elif verdict.redo == "untouched":
                result = replace(result, changed=False, target_used=None, new_bytes=None, diff="")
            extra = verdict.diagnostics + own_warnings(
                self.index, rel, outcomes[rel], True, self.names, rel in provided
            )
            extra += notes_for(self.notes, rel, [f.diagnostic for f in result.findings] + list(extra))
            final.append(_with(result, extra))
        return final

    def _share(self, pending: _Pending, outcomes: dict[str, Outcome]) -> bool:
        """Migrate again, with their part in the group's shared GradScaler, the members that
        have one (each was first migrated alone, before the index was read); not where a
        member without one keeps the group on the shim anyway."""
        from ..cli.runner import Job, process

        roles = {rel: self.roles[rel] for rel in pending.results if rel in self.roles}
        if not any(r.owner or r.user or r.provided is not None for r in roles.values()) or any(
            blocker(self.index.facts(rel), outcomes[rel]) is not None
            for rel in pending.results
            if rel not in roles
        ):
            return False
        for rel, role in roles.items():
            old = pending.results[rel]
            pending.results[rel] = process(Job(old.path, old.kind, self.options, self.want_diff, role))
        return True

    def _callers_elsewhere(self, rel: str, result: FileResult) -> FileResult:
        """As `_callers_elsewhere` above, for the command line's results."""
        from ..cli.runner import Job, process

        found = named_elsewhere(
            rel, self.texts.get(rel, ""), [f.diagnostic for f in result.findings], self.texts, self.names
        )
        if found is None:
            return result
        if self.options.target == "auto":
            result = process(
                Job(result.path, result.kind, replace(self.options, target="shim"), self.want_diff)
            )
        else:
            result = replace(result, changed=False, target_used=None, new_bytes=None, diff="")
        return _with(result, [found])

    def leftover(self) -> list[FileResult]:
        """Members of groups some of whose files never came back (unreadable): each as it is."""
        seen, out = set(), []
        for pending in self.pending.values():
            if id(pending) not in seen and len(pending.results) < len(pending.group.members):
                seen.add(id(pending))
                out += list(pending.results.values())
        return out
