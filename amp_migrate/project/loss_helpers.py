"""A function that scales the loss it is given, named by another module of the tree.

Per file, `scale_loss` on a loss parameter is native only where every call of the function in
the file passes a loss the caller computed right before it: autocast then goes around each
caller's forward (plan/loss_callers.py, AMP207 at the function). A module that imports the
function and calls it is not seen there; its forward would run in fp32 where Apex's O1 cast it.
So in a tree, a file whose native result has an AMP207 function that another module spells (a
word match, as project/carry.py matches receivers: a call, an import or a coincidence alike, one
native file fewer rather than a forward out of autocast) uses the shim instead (AMP206, at the
function), or stays untouched under `--target native`.

The module the message names is the nearest that spells the function (most leading folders in
common with the file, then the first by path), shown as the run was given it: a sibling in the
file's own package is the likeliest caller, and which other folders a run also covers then does
not change what a file's report says.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional, Sequence

from ..diagnostics import Diagnostic

_DEF = re.compile(r"\s*def\s+(\w+)")


def named_elsewhere(
    path: str,
    text: str,
    diagnostics: Iterable[Diagnostic],
    texts: Mapping[str, str],
    names: Optional[Mapping[str, str]] = None,
) -> Optional[Diagnostic]:
    """AMP206 for the first function this file's result puts autocast in the callers of
    (AMP207) whose name another module of the tree spells; None when there is none."""
    diagnostics = list(diagnostics)
    if not diagnostics:
        return None
    # Diagnostics come from the codemod, which has imported the rules by then.
    from ..plan.loss_callers import CALLED_OTHERWISE, CALLERS_CAST

    lines = text.splitlines()
    for found in diagnostics:
        if found.code != CALLERS_CAST.code or not 0 < found.line <= len(lines):
            continue
        match = _DEF.match(lines[found.line - 1])
        if match is None:
            continue
        pattern = re.compile(rf"\b{re.escape(match.group(1))}\b")
        others = [p for p, t in texts.items() if p != path and pattern.search(t)]
        if others:
            other = min(others, key=lambda p: (-_shared_folders(path, p), p))
            shown = (names or {}).get(other, other)
            return Diagnostic(
                CALLED_OTHERWISE.code,
                CALLED_OTHERWISE.severity,
                found.line,
                found.col,
                f"`{match.group(1)}` is also named in {shown}, whose calls of it would "
                "run their forward outside autocast",
                False,
            )
    return None


def _shared_folders(path: str, other: str) -> int:
    """How many leading folders the two index keys have in common."""
    here: Sequence[str] = path.split("/")[:-1]
    there: Sequence[str] = other.split("/")[:-1]
    common = 0
    for a, b in zip(here, there):
        if a != b:
            break
        common += 1
    return common
