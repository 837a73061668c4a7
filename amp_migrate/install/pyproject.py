"""pyproject.toml: the strings of `[project]` `dependencies` and of every array of
`[project.optional-dependencies]`.

The file is edited as text, string by string, so that its layout, comments and quoting stay
as they were; tomllib reads the result to check it: every array must hold exactly what the
rewrite asked for, every other value must be unchanged, or nothing is edited. An Apex entry in
a Poetry table (`[tool.poetry.dependencies]`) is reported, not edited.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Optional

from .edits import Edited, Found, Rewrite
from .requirement import is_apex, normalised

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project runs on 3.11+ in CI; tomli is tomllib's backport
    import tomli as tomllib

_HEADER = re.compile(r"^\s*\[(?P<name>[^\[\]]+)\]\s*(?:#.*)?$")
_ARRAY_KEY = re.compile(r"^\s*(?P<key>[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')\s*=\s*\[")


@dataclass(frozen=True)
class _String:
    start: int  # offsets in the text
    end: int
    value: str
    quote: str


def _strings(text: str, start: int) -> tuple[list[_String], int]:
    """The strings of the array whose `[` is at `start`, and the offset after its `]`."""
    strings: list[_String] = []
    depth, i = 0, start
    while i < len(text):
        char = text[i]
        if char == "#":
            i = text.find("\n", i)
            if i < 0:
                break
        elif char in "\"'":
            triple = text.startswith(char * 3, i)
            close = char * 3 if triple else char
            j = i + len(close)
            while j < len(text) and not text.startswith(close, j):
                j += 2 if char == '"' and text[j] == "\\" else 1
            end = j + len(close)
            value = tomllib.loads("v = " + text[i:end])["v"]
            if depth == 1:
                strings.append(_String(i, end, value, close))
            i = end
            continue
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return strings, i + 1
        i += 1
    return strings, len(text)


def _arrays(text: str) -> list[tuple[tuple[str, ...], list[_String]]]:
    """(TOML path, strings) of each array to edit, in text order."""
    found = []
    table = ""
    offset = 0
    for line in text.split("\n"):
        header = _HEADER.match(line)
        if header:
            table = header.group("name").strip()
        else:
            key = _ARRAY_KEY.match(line)
            if key:
                name = key.group("key").strip("\"'")
                if table == "project" and name == "dependencies":
                    path: Optional[tuple[str, ...]] = ("project", "dependencies")
                elif table == "project.optional-dependencies":
                    path = ("project", "optional-dependencies", name)
                else:
                    path = None
                if path is not None:
                    strings, _ = _strings(text, offset + key.end() - 1)
                    found.append((path, strings))
        offset += len(line) + 1
    return found


def _spelled(new: str, quote: str) -> str:
    if quote == "'" and "'" not in new and "\n" not in new:
        return f"'{new}'"
    return json.dumps(new, ensure_ascii=False)


def _line_span(text: str, item: _String) -> Optional[tuple[int, int]]:
    """The whole line of an entry alone on its line (`    "apex",  # note`), else None."""
    line_start = text.rfind("\n", 0, item.start) + 1
    line_end = text.find("\n", item.end)
    line_end = len(text) if line_end < 0 else line_end
    before, after = text[line_start : item.start], text[item.end : line_end]
    if before.strip() or not re.fullmatch(r"\s*,?\s*(?:#.*)?", after):
        return None
    return line_start, min(line_end + 1, len(text))


def _edit(text: str, item: _String, new: list[str]) -> tuple[int, int, str]:
    """The span to replace and its replacement: a whole line for an entry alone on its line
    (one line per new entry), else the string itself with its comma."""
    spelled = [
        text[item.start : item.end] if entry == item.value else _spelled(entry, item.quote) for entry in new
    ]
    whole = _line_span(text, item)
    if whole is not None:
        lead = text[whole[0] : item.start]
        rest = re.match(r"([ \t]*,?)([ \t]*#[^\n]*)?(\n?)", text[item.end : whole[1]])
        assert rest is not None  # every group may be empty
        comma, comment, newline = rest.group(1), rest.group(2) or "", rest.group(3)
        lines = [
            lead
            + entry
            + ("," if k + 1 < len(spelled) else comma)
            + (comment if k == 0 else "")
            + (newline if k + 1 == len(spelled) else "\n")
            for k, entry in enumerate(spelled)
        ]
        return whole[0], whole[1], "".join(lines)
    if new:
        return item.start, item.end, ", ".join(spelled)
    after = re.match(r"\s*,\s*", text[item.end :])
    if after:
        return item.start, item.end + after.end(), ""
    before = re.search(r",\s*$", text[: item.start])
    return (before.start() if before else item.start), item.end, ""


def _expected(data: dict[str, Any], rewrite_of: dict[str, Optional[list[str]]]) -> dict[str, Any]:
    project = dict(data.get("project", {}))

    def edited(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        for value in values:
            new = rewrite_of.get(value) if isinstance(value, str) else None
            out.extend([value] if new is None else new)
        return out

    if isinstance(project.get("dependencies"), list):
        project["dependencies"] = edited(project["dependencies"])
    optional = project.get("optional-dependencies")
    if isinstance(optional, dict):
        project["optional-dependencies"] = {
            k: edited(v) if isinstance(v, list) else v for k, v in optional.items()
        }
    return {**data, "project": project} if "project" in data else data


def _unseen(text: str, data: dict[str, Any], asked: dict[str, Optional[list[str]]]) -> list[Found]:
    """Apex entries tomllib reads in `[project]` that the text scan did not reach (an inline
    table, a dotted key): reported, never skipped in silence."""
    project = data.get("project", {})
    values = list(project.get("dependencies", []) or [])
    optional = project.get("optional-dependencies", {})
    if isinstance(optional, dict):
        values += [v for group in optional.values() if isinstance(group, list) for v in group]
    found = []
    for value in values:
        if isinstance(value, str) and value not in asked and is_apex(value):
            at = max(text.find(json.dumps(value)), text.find(f"'{value}'"))
            line, col = (text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)) if at >= 0 else (1, 1)
            found.append(Found(line, col, value, False, "an array the editor does not reach"))
    return found


def _poetry(text: str, data: dict[str, Any]) -> list[Found]:
    found = []
    tool = data.get("tool", {})
    poetry = tool.get("poetry", {}) if isinstance(tool, dict) else {}
    tables = [poetry.get("dependencies", {})] + [
        g.get("dependencies", {}) for g in (poetry.get("group", {}) or {}).values() if isinstance(g, dict)
    ]
    if any(isinstance(t, dict) and any(normalised(k) == "apex" for k in t) for t in tables):
        for number, line in enumerate(text.split("\n"), 1):
            if re.match(r"^\s*[\"']?apex[\"']?\s*=", line, re.I):
                found.append(Found(number, 1, line.strip(), False, "a Poetry dependency table"))
    return found


def edit(text: str, rewrite: Rewrite) -> Edited:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return Edited(text, ())
    found: list[Found] = []
    spans: list[tuple[int, int, str]] = []
    asked: dict[str, Optional[list[str]]] = {}
    for _, strings in _arrays(text):
        for item in strings:
            new = rewrite(item.value)
            asked[item.value] = new
            if new is None:
                continue
            line = text.count("\n", 0, item.start) + 1
            col = item.start - text.rfind("\n", 0, item.start)
            found.append(Found(line, col, item.value, new=tuple(new)))
            if new != [item.value]:
                spans.append(_edit(text, item, new))
    found += _unseen(text, data, asked)
    found += _poetry(text, data)
    new_text = text
    for start, end, replacement in sorted(spans, reverse=True):
        new_text = new_text[:start] + replacement + new_text[end:]
    if new_text != text:
        try:
            agrees = tomllib.loads(new_text) == _expected(data, asked)
        except tomllib.TOMLDecodeError:
            agrees = False
        if not agrees:
            unsure = "an edit tomllib reads otherwise"
            return Edited(text, tuple(Found(f.line, f.col, f.requirement, False, unsure) for f in found))
    return Edited(new_text, tuple(found))
