"""Diagnostics about how a group's scaler was handed over, added once the group is settled.

share.py decides each member's part before any file is migrated; two of its decisions are worth
a located word in the files they concern (codes.py, AMP153-AMP154):

* an owner that only prepares models for inference, in a process of its own, stepped aside
  (inference_owners.py): AMP153 at its `initialize`;
* a call that passes the owner's guard into the user but cannot be relied on (entry_switch.py):
  AMP154 at the user's function, where the user's branch then fell back (AMP220).
"""

from __future__ import annotations

from typing import Mapping, Optional

from ..diagnostics import Code, Diagnostic
from . import codes
from .entry_switch import entry_refusals
from .groups import Group
from .index import ProjectIndex
from .share import owners_of

#: path -> [(diagnostic, the code the file's final result must carry for it to apply, or "")]
Notes = dict[str, list[tuple[Diagnostic, str]]]


def _diagnostic(code: Code, line: int, col: int, message: str) -> Diagnostic:
    return Diagnostic(code.code, code.severity, line, col, message, False)


def handover_notes(
    index: ProjectIndex,
    groups: list[Group],
    texts: Mapping[str, str],
    names: Optional[Mapping[str, str]] = None,
) -> Notes:
    """The notes for each grouped file; messages call files by `names` (default: their paths)."""
    names = names or {}
    call = lambda path: names.get(path, path)  # noqa: E731 - a one-line lookup reads best as a lambda
    found: Notes = {}
    for group in groups:
        for user in group.members:
            facts = index.facts(user)
            if not facts.uses or facts.initialize:
                continue
            tied = sorted({t.owner for t in group.ties if t.user == user})
            sharing, kept = owners_of(index, texts, tied, user)
            for owner in sorted(set(tied) - set(sharing)):
                site = index.facts(owner).initialize[0]
                message = (
                    f"prepares models for inference only, in a program of its own: {call(user)} gets "
                    f"the scaler {', '.join(call(k) for k in kept)} builds"
                )
                found.setdefault(owner, []).append(
                    (_diagnostic(codes.INFERENCE_OWNER_APART, site.line, site.col, message), "")
                )
            if len(kept) == 1:
                for line, why in entry_refusals(index, texts, kept[0], user, call):
                    found.setdefault(user, []).append(
                        (_diagnostic(codes.SWITCH_ARGUMENT_DOUBTED, line, 1, why), "AMP220")
                    )
    return found


def notes_for(notes: Notes, path: str, diagnostics) -> tuple[Diagnostic, ...]:
    """The notes of `path` that apply to a result with `diagnostics`, none already there."""
    present = {d.code for d in diagnostics}
    return tuple(
        d for d, needs in notes.get(path, ()) if (not needs or needs in present) and d not in diagnostics
    )
