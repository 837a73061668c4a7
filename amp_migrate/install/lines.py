"""Editing one line that holds one requirement, for the line-based formats (requirements
files, setup.cfg values, conda environment files)."""

from __future__ import annotations

import re
from typing import Callable, Optional

from .edits import Found, Rewrite

_TAIL = re.compile(r"[ \t]+#.*$")


def edit_line(
    line: str,
    number: int,
    lead: str,
    rewrite: Rewrite,
    found: list[Found],
    requirement_of: Callable[[str], str] = lambda body: body,
    spelled: Callable[[str, str], str] = lambda old, new: new,
    empty: Optional[str] = None,
) -> list[str]:
    """The lines that replace `line`, whose requirement starts after `lead`: the requirement
    (as `requirement_of` reads it from the rest, a comment left out) asked of `rewrite`, the
    comment kept on the first line. A removal leaves `empty` (a key with nothing after it)
    where given, else no line. `spelled` writes a new requirement as the format quotes it."""
    rest = line[len(lead) :]
    tail = _TAIL.search(rest)
    body = rest[: tail.start()] if tail else rest
    comment = tail.group(0) if tail else ""
    requirement = requirement_of(body).strip()
    if not requirement:
        return [line]
    new = rewrite(requirement)
    if new is None:
        return [line]
    found.append(Found(number, len(lead) + 1, requirement, new=tuple(new)))
    if new == [requirement]:
        return [line]
    if not new:
        return [empty] if empty is not None else []
    indent = lead if empty is None else re.sub(r"\S", " ", lead)
    out = []
    for index, entry in enumerate(new):
        if entry == requirement:
            out.append(line)
            continue
        out.append((lead if index == 0 else indent) + spelled(body, entry) + (comment if index == 0 else ""))
    return out
