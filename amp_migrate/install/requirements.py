"""requirements*.txt (pip's requirements file format): one requirement a line.

A line is edited as a whole: its requirement (with its marker) replaced, its trailing comment
kept; a removed requirement's line goes. Per-requirement options after it (`--hash`,
`--global-option="--cuda_ext"`) belong to Apex's build and go with it. A requirement
continued over lines with a backslash is reported, not edited.
"""

from __future__ import annotations

import re

from .edits import Edited, Found, Rewrite
from .lines import edit_line
from .requirement import is_apex

_EDITABLE = re.compile(r"^(?:-e|--editable)(?:\s+|=)")
_OPTIONS = re.compile(r"\s--?[A-Za-z]")  # `--hash=`, `--global-option` after the requirement


def requirement_of(body: str) -> str:
    """The requirement (editable flag and marker included) without per-requirement options."""
    editable = _EDITABLE.match(body)
    found = _OPTIONS.search(body, editable.end() if editable else 0)
    return body[: found.start()] if found else body


def edit(text: str, rewrite: Rewrite) -> Edited:
    out: list[str] = []
    found: list[Found] = []
    continued = False
    for number, line in enumerate(text.split("\n"), 1):
        was_continued, continued = continued, line.endswith("\\")
        body = line.strip()
        lead = line[: len(line) - len(line.lstrip())]
        if was_continued or continued:
            if is_apex(requirement_of(body.rstrip("\\ \t")).strip()):
                why = "a requirement continued over lines"
                found.append(Found(number, len(lead) + 1, body.rstrip("\\ \t"), False, why))
            out.append(line)
        elif not body or body.startswith("#") or (body.startswith("-") and not _EDITABLE.match(body)):
            out.append(line)  # a comment, or an option line (`-r base.txt`, `--index-url`)
        else:
            out.extend(edit_line(line, number, lead, rewrite, found, requirement_of))
    return Edited("\n".join(out), tuple(found))
