"""Conda environment files (environment*.yml): the entries of the `pip:` list under
`dependencies:`.

A conda package that is Apex (conda-forge's `nvidia-apex`) is reported, not edited: its
replacement is a pip entry, which needs a `pip:` list the file may not have.
"""

from __future__ import annotations

import re

from .edits import Edited, Found, Rewrite
from .lines import edit_line
from .requirement import is_apex

_ITEM = re.compile(r"^(?P<lead>(?P<indent>\s*)-\s+)(?P<value>.*)$")
_QUOTED = re.compile(r"^(['\"])(.*)\1$")


def _unquoted(body: str) -> str:
    match = _QUOTED.match(body.strip())
    return match.group(2) if match else body


def _spelled(old: str, new: str) -> str:
    quoted = _QUOTED.match(old.strip())
    if quoted and quoted.group(1) not in new:
        return quoted.group(1) + new + quoted.group(1)
    if quoted or re.search(r": |#|^[\[{&*!|>%@`'\"]", new):
        return "'" + new.replace("'", "''") + "'"
    return new


def edit(text: str, rewrite: Rewrite) -> Edited:
    out: list[str] = []
    found: list[Found] = []
    in_dependencies = False
    pip_indent = -1  # the indentation of the `- pip:` item, while inside its list
    for number, line in enumerate(text.split("\n"), 1):
        if line and not line[0].isspace() and not line.startswith("-"):
            in_dependencies = line.split("#")[0].strip() == "dependencies:"
            pip_indent = -1
            out.append(line)
            continue
        item = _ITEM.match(line)
        if not in_dependencies or item is None:
            out.append(line)
            continue
        indent = len(item.group("indent"))
        if pip_indent >= 0 and indent <= pip_indent:
            pip_indent = -1
        value = item.group("value").split(" #")[0].strip()
        if pip_indent < 0:
            if _unquoted(value) == "pip:" or value == "pip:":
                pip_indent = indent
            elif is_apex(_unquoted(value), conda=True):
                found.append(Found(number, indent + 1, _unquoted(value), False, "a conda package"))
            out.append(line)
            continue
        out.extend(edit_line(line, number, item.group("lead"), rewrite, found, _unquoted, _spelled))
    return Edited("\n".join(out), tuple(found))
