"""setup.cfg: the `install_requires`, `setup_requires` and `tests_require` values of
`[options]` and every value of `[options.extras_require]`, one requirement a line.

configparser reads the result to check the edit: each edited value must hold exactly the
requirements the rewrite asked for, in order, or nothing is edited.
"""

from __future__ import annotations

import configparser
import re
from typing import Optional

from .edits import Edited, Found, Rewrite
from .lines import edit_line

_KEYS = ("install_requires", "setup_requires", "tests_require")
_SECTION = re.compile(r"^\[(?P<name>[^\]]+)\]\s*$")
_KEY = re.compile(r"^(?P<key>[A-Za-z0-9_.-]+)(?P<eq>\s*[=:]\s*)")


def _values(text: str) -> Optional[dict[tuple[str, str], list[str]]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    values = {}
    for section in parser.sections():
        for key, value in parser.items(section):
            lines = (re.sub(r"\s+#.*$", "", v).strip() for v in value.splitlines())
            values[(section, key)] = [v for v in lines if v]
    return values


def edit(text: str, rewrite: Rewrite) -> Edited:
    out: list[str] = []
    found: list[Found] = []
    section, wanted = "", False
    asked: dict[str, list[str]] = {}

    def remembered(requirement: str) -> Optional[list[str]]:
        new = rewrite(requirement)
        asked[requirement] = new if new is not None else [requirement]
        return new

    for number, line in enumerate(text.split("\n"), 1):
        header = _SECTION.match(line)
        key = _KEY.match(line) if not line[:1].isspace() else None
        if header:
            section, wanted = header.group("name").strip(), False
            out.append(line)
        elif key:
            wanted = (
                section == "options" and key.group("key") in _KEYS
            ) or section == "options.extras_require"
            lead = line[: key.end()]
            out.extend(
                edit_line(line, number, lead, remembered, found, empty=lead.rstrip()) if wanted else [line]
            )
        elif wanted and line.strip() and not line.strip().startswith(("#", ";")) and line[:1].isspace():
            lead = line[: len(line) - len(line.lstrip())]
            out.extend(edit_line(line, number, lead, remembered, found))
        else:
            out.append(line)
    new_text = "\n".join(out)
    if new_text != text and not _agrees(text, new_text, asked):
        return Edited(
            text,
            tuple(
                Found(f.line, f.col, f.requirement, False, "an edit configparser reads otherwise")
                for f in found
            ),
        )
    return Edited(new_text, tuple(found))


def _agrees(old: str, new: str, asked: dict[str, list[str]]) -> bool:
    before, after = _values(old), _values(new)
    if before is None or after is None or before.keys() != after.keys():
        return False
    for where, values in before.items():
        expected = [entry for value in values for entry in asked.get(value, [value])]
        if after[where] != expected:
            return False
    return True
