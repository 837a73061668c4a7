"""What the tree's Python files and notebooks need once migrated: Apex, the shim, or neither.

The answer is read from each file's text after the migration (the written bytes, or in
`--check`/`--diff` the bytes that would be written), not from what the codemod meant to do:
a file left untouched (an Apex module the shim lacks, AMP470; an error) still imports Apex,
and a file migrated earlier imports `amp_shim` without spelling `apex`.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ..cli.file_result import FileResult
from ..cli.quoting import quote_path
from ..cli.report import KEPT_APEX_CODES
from ..io.source_file import SourceError, decode, read_bytes
from ..migrate import python_ast

#: Codes that say why a file the codemod left alone still needs Apex.
_WHY_CODES = KEPT_APEX_CODES | {"AMP001", "AMP002", "AMP003", "AMP004", "AMP470", "AMP471"}
_MAGIC = re.compile(r"^\s*[%!]|\?\s*$")
_IMPORT_TEXT = re.compile(r"^\s*(?:from\s+(apex|amp_shim)\b|import\s+.*\b(apex|amp_shim)\b)", re.M)


@dataclass(frozen=True)
class Use:
    """A file that needs Apex or the shim, and where."""

    path: str
    line: int
    what: str  # "`apex.contrib` (AMP470)"
    cell: Optional[int] = None  # a notebook's cell, 1-based

    def __str__(self) -> str:
        cell = f":cell {self.cell}" if self.cell else ""
        return f"{quote_path(self.path)}{cell}:{self.line} imports {self.what}"


@dataclass(frozen=True)
class Needs:
    apex: tuple[Use, ...]  # files that still import Apex
    shim: tuple[Use, ...]  # files that import amp_shim
    files: int = 0  # Python files and notebooks looked at: with none, nothing is known

    @property
    def decision(self) -> str:
        """What an Apex entry becomes: "keep", "replace" (by amp-migrate) or "remove"."""
        return "keep" if self.apex or not self.files else "replace" if self.shim else "remove"

    @property
    def why_kept(self) -> str:
        if self.apex:
            return f"{self.apex[0]} after the migration"
        return "no Python file or notebook under the given paths says whether it is still needed"


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _imports(tree: ast.AST, line_offset: int = 0) -> Iterable[tuple[str, int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if _top(name) in ("apex", "amp_shim"):
                yield _top(name), node.lineno + line_offset, name


def _text_imports(text: str, line_offset: int = 0) -> Iterable[tuple[str, int, str]]:
    """Imports read from text where Python cannot parse it: erring towards "needs Apex"."""
    for match in _IMPORT_TEXT.finditer(text):
        top = match.group(1) or match.group(2)
        yield top, text.count("\n", 0, match.start()) + 1 + line_offset, top


def _python_imports(text: str) -> Iterable[tuple[str, int, str]]:
    tree = python_ast(text)
    return _text_imports(text) if tree is None else _imports(tree)


def _notebook_imports(data: bytes) -> Iterable[tuple[str, int, str, int]]:
    """Imports of a notebook's code cells, each with its cell (1-based over all cells)."""
    try:
        nb = json.loads(data.decode("utf-8-sig"))
        cells = [c for c in nb.get("cells", []) if isinstance(c, dict)]
    except (UnicodeDecodeError, ValueError, AttributeError):
        yield from ((top, line, name, 0) for top, line, name in _text_imports(data.decode("latin-1")))
        return
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        code = "\n".join("" if _MAGIC.search(line) else line for line in text.split("\n"))
        tree = python_ast(code)
        for top, line, name in _text_imports(code) if tree is None else _imports(tree):
            yield top, line, name, number


def _final_bytes(result: FileResult, mode: str) -> Optional[bytes]:
    """The file's bytes after this run: what was (or, writing nothing, would be) written."""
    new = result.changed and result.error is None and result.new_bytes is not None
    if new and (result.written or mode in ("check", "diff")):
        return result.new_bytes
    try:
        return read_bytes(result.path)
    except (OSError, SourceError):
        return None


def tree_needs(results: Sequence[FileResult], mode: str) -> Needs:
    """What the migrated Python files and notebooks among `results` import."""
    apex: list[Use] = []
    shim: list[Use] = []
    files = 0
    for result in results:
        if result.kind not in ("python", "notebook"):
            continue
        files += 1
        data = _final_bytes(result, mode)
        if data is None:
            if result.scanned or result.error is not None:
                apex.append(Use(result.path, 1, "what could not be read again (it mentioned Apex)"))
            continue
        if b"apex" not in data and b"amp_shim" not in data:
            continue
        found: list[tuple[str, int, str, Optional[int]]]
        if result.kind == "notebook":
            found = list(_notebook_imports(data))
        else:
            try:
                text = decode(data).text
            except SourceError:
                text = data.decode("latin-1")
            found = [(top, line, name, None) for top, line, name in _python_imports(text)]
        why = sorted({f.diagnostic.code for f in result.findings if f.diagnostic.code in _WHY_CODES})
        suffix = f" ({', '.join(why)})" if why else ""
        for top, line, name, cell in found:
            (apex if top == "apex" else shim).append(Use(result.path, line, f"`{name}`{suffix}", cell))
        kept = [f for f in result.findings if f.diagnostic.code in KEPT_APEX_CODES]
        if kept and not any(top == "apex" for top, *_ in found):
            first = kept[0]
            what = f"Apex by a run-time name ({first.diagnostic.code})"
            apex.append(Use(result.path, first.diagnostic.line, what, first.cell))
    return Needs(tuple(sorted(apex, key=_order)), tuple(sorted(shim, key=_order)), files)


def unseen_sources(folder: str, results: Sequence[FileResult]) -> list[FileResult]:
    """The Python files and notebooks under `folder` (a dependency file's project) that this
    run did not see, as they are on disk: a run given part of a project must not judge the
    project's dependencies by that part alone (a requirements file beside a `train.py` it was
    given, and a `finetune.py` it was not, that still uses the shim)."""
    seen = {os.path.realpath(r.path) for r in results if r.kind in ("python", "notebook")}
    found: list[FileResult] = []
    for directory, folders, names in os.walk(folder or "."):
        folders[:] = sorted(
            f
            for f in folders
            if not f.startswith(".")
            and f not in ("__pycache__", "node_modules", "site-packages")
            and not os.path.isfile(os.path.join(directory, f, "pyvenv.cfg"))
        )
        for name in sorted(names):
            kind = "python" if name.endswith(".py") else "notebook" if name.endswith(".ipynb") else None
            path = os.path.join(directory, name)
            if kind and os.path.realpath(path) not in seen and os.path.isfile(path):
                found.append(FileResult(path, kind))
    return found


def _order(use: Use) -> tuple[str, int]:
    return (f"{use.path}:cell {use.cell}" if use.cell else use.path), use.line
