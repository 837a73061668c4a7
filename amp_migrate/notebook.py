"""Jupyter notebooks: the code cells are one program, so they are migrated together.

A notebook imports Apex in one cell, calls `amp.initialize` in another and trains in a third;
migrating cells one by one would lose which names mean Apex. So the code cells are joined
into one module with a marker statement between cells, IPython syntax (`%magic`, `!shell`,
`obj?`) is swapped for placeholder statements, and the migrated module is cut back at the
markers. When the rewrite moved code across a marker (or lost a placeholder), the cells
cannot be cut back faithfully: `auto` then takes the shim's import-only rewrite, which never
does.

The JSON is written back the way it was read (indentation, key order, escaping, trailing
newline), so that only the changed cells' `source` differs from the original bytes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Optional

from .diagnostics import Diagnostic
from .file_result import FileResult, Finding
from .migrate import MigrationError, migrate_source
from .options import Options
from .report import unified_diff
from .source_file import SourceError

_CELL = "__amp_migrate_cell_{}__"
_CELL_LINE = re.compile(r"^__amp_migrate_cell_(\d+)__\n", re.M)
_MAGIC_PLACEHOLDER = "import __amp_migrate_magic_{}__"
_MAGIC_LINE = re.compile(r"^([ \t]*)import __amp_migrate_magic_(\d+)__[ \t]*$")
_IPYTHON_LINE = re.compile(
    r"^[ \t]*(?:[%!]|\?{1,2}[\w.]|[\w.]+[ \t]*\?{1,2}[ \t]*$|[\w.]+[ \t]*=[ \t]*[%!])")
# Cell magics whose body is Python; any other `%%magic` cell (bash, html, ...) is left alone.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


@dataclass
class _Cell:
    index: int  # position among all cells
    source: str
    added_newline: bool
    magics: list[list[str]]


def _protect(source: str, magics: list[list[str]]) -> str:
    """`source` with each IPython line (and its backslash continuations) as a placeholder."""
    out: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if _IPYTHON_LINE.match(line):
            block = [line]
            while block[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                block.append(lines[i])
            indent = line[: len(line) - len(line.lstrip())]
            out.append(indent + _MAGIC_PLACEHOLDER.format(len(magics)))
            magics.append(block)
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def _restore(code: str, magics: list[list[str]], seen: set[int]) -> str:
    out = []
    for line in code.split("\n"):
        match = _MAGIC_LINE.match(line)
        if match:
            number = int(match.group(2))
            seen.add(number)
            block = magics[number]
            out.append(match.group(1) + block[0].lstrip())
            out.extend(block[1:])
        else:
            out.append(line)
    return "\n".join(out)


def _source_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    raise SourceError("not a notebook: a cell's source is neither text nor a list of lines")


def _is_python(nb: dict) -> bool:
    metadata = nb.get("metadata") or {}
    language = (metadata.get("kernelspec") or {}).get("language") or (
        metadata.get("language_info") or {}).get("name") or "python"
    return str(language).lower() == "python"


def _load(data: bytes) -> tuple[dict, str, bool]:
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        text = data[3 if bom else 0:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"not a notebook: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"not a notebook: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        major = nb.get("nbformat") if isinstance(nb, dict) else None
        if isinstance(major, int) and major < 4:
            raise SourceError(f"nbformat {major} notebooks are not supported; "
                              "upgrade with `jupyter nbconvert --to notebook`")
        raise SourceError("not a notebook: no list of cells")
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or "cell_type" not in cell:
            raise SourceError("not a notebook: a cell has no cell_type")
    return nb, text, bom


@dataclass(frozen=True)
class _Style:
    indent: Optional[int]
    separators: tuple[str, str]
    ensure_ascii: bool
    newline: str
    trailing: str
    exact: bool  # dumping the unchanged notebook gives back the original text

    def dumps(self, nb: dict) -> str:
        text = json.dumps(nb, indent=self.indent, separators=self.separators,
                          ensure_ascii=self.ensure_ascii) + self.trailing
        return text.replace("\n", self.newline) if self.newline != "\n" else text


def _style_of(text: str, nb: dict) -> _Style:
    newline = "\r\n" if "\r\n" in text else "\n"
    plain = text.replace("\r\n", "\n")
    body = plain.rstrip()
    trailing = plain[len(body):]
    match = re.match(r"\{\n( +)\"", body)
    indents: list[Optional[int]] = [len(match.group(1))] if match else [None]
    separators = [(",", ": ")] if indents[0] is not None else [(", ", ": "), (",", ":")]
    for indent in indents:
        for sep in separators:
            for ensure_ascii in (False, True):
                if json.dumps(nb, indent=indent, separators=sep, ensure_ascii=ensure_ascii) == body:
                    return _Style(indent, sep, ensure_ascii, newline, trailing, True)
    return _Style(indents[0] if indents[0] is not None else 1, (",", ": "), False, newline,
                  trailing or "\n", False)


def _cells_to_migrate(nb: dict) -> list[_Cell]:
    cells = []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        source = _source_text(cell.get("source", ""))
        if not source.strip():
            continue
        first = source.lstrip().split("\n", 1)[0]
        if first.startswith("%%") and first[2:].split(" ", 1)[0].strip() not in _PYTHON_CELL_MAGICS:
            continue
        magics: list[list[str]] = []
        protected = _protect(source, magics)
        added = not protected.endswith("\n")
        cells.append(_Cell(index, protected + ("\n" if added else ""), added, magics))
    return cells


def _join(cells: list[_Cell]) -> tuple[str, list[tuple[int, int, int]]]:
    """The module, and for each cell (its index, its first line in the module, its length)."""
    parts, spans, line = [], [], 1
    for n, cell in enumerate(cells):
        if n:
            parts.append(_CELL.format(cell.index) + "\n")
            line += 1
        length = cell.source.count("\n")
        spans.append((cell.index, line, length))
        parts.append(cell.source)
        line += length
    return "".join(parts), spans


def _locate(diagnostic: Diagnostic, spans: list[tuple[int, int, int]]) -> Finding:
    for index, first, length in spans:
        if diagnostic.line < first + length or (index, first, length) == spans[-1]:
            line = min(max(diagnostic.line - first + 1, 1), max(length, 1))
            return Finding(replace(diagnostic, line=line), index + 1)
    return Finding(diagnostic, None)


def _split(code: str, cells: list[_Cell]) -> Optional[list[str]]:
    """The migrated module cut back into the cells' sources, or None when it cannot be."""
    pieces = _CELL_LINE.split(code)
    numbers = [int(n) for n in pieces[1::2]]
    if numbers != [cell.index for cell in cells[1:]]:
        return None
    out = []
    for cell, piece in zip(cells, pieces[0::2]):
        seen: set[int] = set()
        text = _restore(piece, cell.magics, seen)
        if seen != set(range(len(cell.magics))):
            return None
        if cell.added_newline and text.endswith("\n"):
            text = text[:-1]
        out.append(text)
    return out


def _ended(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


def migrate(path: str, data: bytes, options: Options, want_diff: bool) -> FileResult:
    """Migrate a notebook's code cells; a broken notebook raises SourceError."""
    nb, text, bom = _load(data)
    result = FileResult(path, "notebook", scanned=True)
    if not _is_python(nb):
        return replace(result, notes=("not a Python notebook; left as it is",))
    cells = _cells_to_migrate(nb)
    if not cells:
        return result
    module, spans = _join(cells)
    notes: list[str] = []
    try:
        migrated = migrate_source(module, target=options.target, device=options.device,
                                  dtype=options.dtype)
        sources = _split(migrated.code, cells) if migrated.changed else None
        if migrated.changed and sources is None:
            if options.target == "native":
                return replace(result, error="the native rewrite moves code across cells or "
                                             "IPython lines; left untouched (`--target auto` "
                                             "would use the shim)")
            notes.append("the native rewrite moves code across cells or IPython lines; "
                         "migrated to the shim instead")
            migrated = migrate_source(module, target="shim", device=options.device, dtype=options.dtype)
            sources = _split(migrated.code, cells) if migrated.changed else None
            if migrated.changed and sources is None:
                return replace(result, error="the migrated code cannot be cut back into cells; left untouched")
    except MigrationError as exc:
        return replace(result, findings=(_locate(exc.as_diagnostic(), spans),))
    findings = tuple(_locate(d, spans) for d in migrated.diagnostics)
    result = replace(result, findings=findings, notes=tuple(notes))
    if sources is None:
        return result
    style = _style_of(text, nb)
    diffs = []
    for cell, new_source in zip(cells, sources):
        entry = nb["cells"][cell.index]
        old_source = _source_text(entry.get("source", ""))
        if new_source == old_source:
            continue
        if want_diff:
            # A cell's last line has no newline by convention; saying so in every hunk is noise.
            name = f"{path}:cell {cell.index + 1}"
            diffs.append(unified_diff(_ended(old_source), _ended(new_source), name))
        entry["source"] = (new_source.splitlines(keepends=True)
                           if isinstance(entry.get("source"), list) else new_source)
    new_text = style.dumps(nb)
    if not style.exact:
        notes.append("the notebook's JSON layout is not one json.dumps writes; "
                     "unchanged cells may be re-indented")
    new_bytes = (b"\xef\xbb\xbf" if bom else b"") + new_text.encode("utf-8")
    return replace(result, changed=True, target_used=migrated.target_used, new_bytes=new_bytes,
                   diff="".join(diffs), notes=tuple(notes))
