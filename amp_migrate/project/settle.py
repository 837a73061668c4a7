"""Settling a group once each of its files has been migrated alone: all native, or all shim.

A group stays native only when every member that touches Apex went native on its own. One
member on the shim, left untouched with an error, or whose Apex use no rule can see (a
module returned by a function, a run-time import, an object handed in from another file)
keeps the whole group on the shim; under `--target native` the others are left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ..diagnostics import Code, Diagnostic
from . import codes
from .groups import Group, first_use
from .index import ModuleFacts, ProjectIndex, Site


@dataclass(frozen=True)
class Outcome:
    """What migrating one file alone gave: its status, and the diagnostic that says why it
    is not native (its first fallback or error), if any."""

    status: str  # "native", "shim", "unchanged" or "error"
    reasons: tuple[Diagnostic, ...] = ()  # its fallback diagnostics, or its first error


def _reason(facts: ModuleFacts, outcome: Outcome) -> Optional[Diagnostic]:
    """The diagnostic to quote: one at an Apex use the index knows, else the first (the
    import a use keeps alive says less than the use)."""
    lines = {s.line for s in facts.owns + facts.uses + facts.foreign}
    return next(
        (d for d in outcome.reasons if d.line in lines), outcome.reasons[0] if outcome.reasons else None
    )


@dataclass(frozen=True)
class Verdict:
    """What to do with one file after settling: keep its own result, redo it as `target`
    ("shim"), or leave it untouched ("untouched"); and diagnostics to add."""

    redo: Optional[str] = None
    diagnostics: tuple[Diagnostic, ...] = ()


def _diagnostic(code: Code, site: Site, message: str) -> Diagnostic:
    return Diagnostic(code.code, code.severity, site.line, site.col, message, False)


def anchor(facts: ModuleFacts) -> Site:
    """Where a file's own part in its group is: its first Apex set-up, else its first use."""
    sites = facts.owns + facts.uses + facts.foreign + facts.provided
    return min(sites, key=lambda s: (s.line, s.col)) if sites else Site(1, 1, "")


def blocker(facts: ModuleFacts, outcome: Outcome, provided: bool = False) -> Optional[tuple[int, str]]:
    """Why this member keeps its group off native code: (line, reason), or None. `provided`:
    its provider calls went native (project/provide.py)."""
    if facts.provided and not provided:
        site = facts.provided[0]
        return site.line, f"it gets Apex's module from a function call (`{site.what}`)"
    if facts.dynamic_state:
        site = facts.dynamic_state[0]
        return site.line, f"it imports {site.what!r} at run time"
    if outcome.status in ("shim", "error"):
        reason = _reason(facts, outcome)
        if reason is None:
            return anchor(
                facts
            ).line, f"it uses the {outcome.status}" if outcome.status == "shim" else "it was left untouched"
        return reason.line, f"{reason.code} {reason.message}"
    if outcome.status == "unchanged":
        use = first_use(facts) or anchor(facts)
        return use.line, f"it calls `{use.what}` on an Apex object it does not import, and stays as it is"
    return None


def settle(
    index: ProjectIndex,
    group: Group,
    outcomes: dict[str, Outcome],
    target: str,
    names: Optional[Mapping[str, str]] = None,
    provided: frozenset = frozenset(),
) -> dict[str, Verdict]:
    """The verdict for each member of `group` whose result must change; messages call files
    by `names` (default: their paths in the index); `provided`: the members whose provider
    calls went native."""
    blocking = {}
    for path in group.members:
        found = blocker(index.facts(path), outcomes[path], path in provided)
        if found is not None:
            blocking[path] = found
    if not blocking or target == "shim":
        return {}
    verdicts = {}
    for path in group.members:
        if outcomes[path].status != "native":
            continue
        other = ([p for p in sorted(blocking) if p != path] or [path])[0]
        line, reason = blocking[other]
        other = (names or {}).get(other, other)
        site = anchor(index.facts(path))
        if target == "native":
            message = f"left untouched because {other}:{line} cannot go native: {reason}"
            verdicts[path] = Verdict("untouched", (_diagnostic(codes.GROUP_NOT_NATIVE, site, message),))
        else:
            message = f"uses the shim because {other}:{line} does: {reason}"
            verdicts[path] = Verdict("shim", (_diagnostic(codes.GROUP_USES_SHIM, site, message),))
    return verdicts


def _provider(site: Site, names: Mapping[str, str]) -> tuple[str, str]:
    """A provided site's call, and where its provider returns Apex's module."""
    call, _, where = site.what.partition(", from ")
    path, _, line = where.rpartition(":")
    return call, f"{names.get(path, path)}:{line}"


def own_warnings(
    index: ProjectIndex,
    path: str,
    outcome: Outcome,
    grouped: bool,
    names: Optional[Mapping[str, str]] = None,
    provided: bool = False,
) -> tuple[Diagnostic, ...]:
    """Apex uses in this file that no rule rewrites: a module returned by a function, a
    run-time import, an Apex object from another file (the last only where the file is tied
    to the file that makes it and was left as it is)."""
    facts = index.facts(path)
    found = []
    for site in facts.provided if not provided else ():
        call, where = _provider(site, names or {})
        found.append(
            _diagnostic(
                codes.MODULE_FROM_CALL,
                site,
                f"`{call}` gets Apex's module from {where}; left as it is, "
                "the provider's group uses the shim",
            )
        )
    found += [
        _diagnostic(
            codes.IMPORTED_DYNAMICALLY,
            site,
            f"{site.what!r} is imported at run time; the import stays as it is "
            "(run with `amp-migrate run`, or use an import statement)",
        )
        for site in facts.dynamic
    ]
    if grouped and outcome.status == "unchanged" and not facts.provided:
        found += [
            _diagnostic(
                codes.OBJECT_FROM_ANOTHER_FILE,
                site,
                f"`{site.what}` runs on an Apex object made in another file; "
                "left as it is, the files sharing it use the shim",
            )
            for site in facts.foreign[:1]
        ]
    return tuple(found)
