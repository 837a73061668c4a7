"""Jupyter notebooks: the code cells are one program, so they are migrated together.

A notebook imports Apex in one cell, calls `amp.initialize` in another and trains in a third;
migrating cells one by one would lose which names mean Apex. So the code cells are joined
into one module with a marker statement between cells, IPython syntax (`%magic`, `!shell`,
`obj?`) is swapped for placeholder statements, and the migrated module is cut back at the
markers. When the rewrite moved code across a marker (or lost a placeholder), the cells
cannot be cut back faithfully: `auto` then takes the shim's import-only rewrite, which never
does.

IPython lines are code the migration cannot see, so what they reference must survive it.
`%time STMT` and `%timeit STMT` run one Python statement; where it spells an Apex word it is
migrated as code (`%time` as the statement itself, `%timeit` as the body of a loop, since it
runs many times) and put back behind its magic, or the notebook cannot be cut back. Any other
IPython line (shell commands' `{expr}`/`$name`, `obj?`, magics whose arguments name objects)
that names something the migration removes (an Apex import's name under the native target, or
any binding the output no longer makes) is reported (AMP021) at its cell and line, and `auto`
takes the shim for the notebook.

The JSON is written back the way it was read (indentation, key order, escaping, trailing
newline), so that only the changed cells' `source` differs from the original bytes.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from ..analysis.binding import apex_import_words, imports_apex
from ..analysis.source_index import SourceIndex
from ..cli.file_result import FileResult, Finding
from ..cli.output_lines import line_map
from ..cli.report import unified_diff
from ..diagnostics import MAGIC_USES_MIGRATED_NAME, NATIVE_IMPOSSIBLE, NATIVE_SPANS_CELLS, Diagnostic
from ..migrate import MigrationError, MigrationResult, migrate_source, python_ast
from ..options import Options, Target
from .lines import count_line_breaks, split_lines
from .source_file import SourceError

_CELL = "__amp_migrate_cell_{}__"
_CELL_LINE = re.compile(r"^__amp_migrate_cell_(\d+)__\n", re.M)
_MAGIC_PLACEHOLDER = "import __amp_migrate_magic_{}__"
_MAGIC_LINE = re.compile(r"^([ \t]*)import __amp_migrate_magic_(\d+)__[ \t]*$")
# `%time STMT` as the statement, marked by a comment; `%timeit STMT` as a loop's body.
_TIME_PLACEHOLDER = "{1}  # __amp_migrate_time_{0}__"
_TIME_LINE = re.compile(r"^([ \t]*)(?P<code>.*?)[ \t]*# __amp_migrate_time_(\d+)__[ \t]*$")
_TIMEIT_PLACEHOLDER = "for __amp_migrate_timeit_{0}__ in __amp_migrate_repeat__: {1}"
_TIMEIT_LINE = re.compile(
    r"^([ \t]*)for __amp_migrate_timeit_(\d+)__ in __amp_migrate_repeat__:"
    r"[ \t]*(?P<code>.*?)[ \t]*$"
)
_CODE_MAGIC = re.compile(r"^[ \t]*(%time[ \t]+|%timeit((?:[ \t]+-(?:[nrp][ \t]*\d+|[tcqo]))*)[ \t]+)(\S.*)$")
_IPYTHON_LINE = re.compile(r"^[ \t]*(?:[%!]|\?{1,2}[\w.]|[\w.]+[ \t]*\?{1,2}[ \t]*$|[\w.]+[ \t]*=[ \t]*[%!])")
#: Line magics and shell aliases IPython runs without their `%` (automagic, on by default) when
#: a cell's top-level line is no Python: `ls ./logs/`, `pip install apex`, `cd ..`.
_AUTOMAGIC = frozenset(
    {
        "alias", "bookmark", "cat", "cd", "clear", "conda", "cp", "dhist", "env", "history",
        "less", "ll", "load_ext", "ls", "mamba", "man", "matplotlib", "mkdir", "more", "mv",
        "pip", "popd", "pushd", "pwd", "reload_ext", "rm", "rmdir", "who", "whos",
    }
)  # fmt: skip
_AUTOMAGIC_LINE = re.compile(r"(\w+)(?:[ \t].*)?$")
# Cell magics whose body is Python run once in the user namespace; any other `%%magic` cell
# (bash, html, ...) is left alone. A `%%timeit` body runs many times in a namespace of its own
# (its assignments do not persist), so it is not part of the module: it is checked like an
# IPython line instead.
_PYTHON_CELL_MAGICS = {"time", "capture", "prun", "debug"}


@dataclass
class _Masked:
    """An IPython line set aside: `lines` as written (continuations included), its line in
    the cell (1-based); `prefix` ("%time ", "%timeit -n 3 ") when its statement is migrated
    as code, which `code` holds."""

    lines: list[str]
    line: int
    prefix: str = ""
    code: str = ""
    body: bool = False  # a `%%timeit` cell: the lines after the first are Python

    @property
    def timeit(self) -> bool:
        return self.prefix.startswith("%timeit")


@dataclass
class _Cell:
    index: int  # position among all cells
    source: str
    added_newline: bool
    magics: list[_Masked] = field(default_factory=list)


def _one_simple_statement(code: str, expression: bool = False) -> bool:
    """`code` is one simple statement (an expression, if asked: what `%timeit` runs keeps
    no assignment, so its statement may bind nothing)."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past Python's limits
        return False
    if expression:
        return len(body) == 1 and isinstance(body[0], ast.Expr)
    return len(body) == 1 and not isinstance(
        body[0],
        (
            ast.If,
            ast.For,
            ast.AsyncFor,
            ast.While,
            ast.With,
            ast.AsyncWith,
            ast.Try,
            ast.FunctionDef,
            ast.ClassDef,
            ast.AsyncFunctionDef,
            getattr(ast, "Match", ast.If),
        ),
    )


def _automagic(line: str) -> bool:
    """A line IPython runs as a magic without its `%`: an automagic word first, at the top
    level of the cell, and not a Python statement by itself."""
    word = _AUTOMAGIC_LINE.match(line)
    if word is None or word.group(1) not in _AUTOMAGIC:
        return False
    try:
        compile(line.rstrip("\\"), "<line>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return True
    return False


def _identifiers(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def _protect(source: str, magics: list[_Masked], words: Optional[frozenset[str]] = None) -> str:
    """`source` with each IPython line (and its backslash continuations) as a placeholder;
    `%time`/`%timeit` lines whose statement spells one of `words` (None: any) as code."""
    out: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if _IPYTHON_LINE.match(line) or _automagic(line):
            start = i
            block = [line]
            while block[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                block.append(lines[i])
            indent = line[: len(line) - len(line.lstrip())]
            code = _CODE_MAGIC.match(line) if len(block) == 1 else None
            if (
                code is not None
                and _one_simple_statement(code.group(3), code.group(2) is not None)
                and (words is None or _identifiers(code.group(3)) & words)
            ):
                masked = _Masked(block, start + 1, code.group(1).rstrip() + " ", code.group(3))
                template = _TIMEIT_PLACEHOLDER if masked.timeit else _TIME_PLACEHOLDER
                out.append(indent + template.format(len(magics), masked.code))
            else:
                masked = _Masked(block, start + 1)
                out.append(indent + _MAGIC_PLACEHOLDER.format(len(magics)))
            magics.append(masked)
        else:
            out.append(line)
        i += 1
    return "\n".join(out)


def _whole_lines(code: str) -> Optional[set[int]]:
    """Lines that hold one simple statement from their first character to their end (None:
    the code does not parse)."""
    tree = python_ast(code)
    if tree is None:
        return None
    lines = split_lines(code)
    whole = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno == node.end_lineno and not hasattr(node, "body"):
            line = lines[node.lineno - 1]
            if node.col_offset == len(line) - len(line.lstrip()):
                whole.add(node.lineno)
    return whole


def _restore(code: str, magics: list[_Masked], seen: set[int]) -> Optional[str]:
    """The cell with its IPython lines back; None when a migrated `%time`/`%timeit`
    statement is no longer one whole statement on one line (a `%timeit` loop's only one)."""
    out = []
    whole = _whole_lines(code) if "__amp_migrate_time" in code else set()
    for number, line in enumerate(code.split("\n"), 1):
        match = _MAGIC_LINE.match(line)
        timed = _TIMEIT_LINE.match(line) or _TIME_LINE.match(line)
        if match:
            number = int(match.group(2))
            if number >= len(magics) or magics[number].prefix:
                return None
            seen.add(number)
            block = magics[number].lines
            out.append(match.group(1) + block[0].lstrip())
            out.extend(block[1:])
        elif timed:
            loop = timed.re is _TIMEIT_LINE
            which = int(timed.group(2 if loop else 3))
            if (
                which >= len(magics)
                or not magics[which].prefix
                or magics[which].timeit != loop
                or not _one_simple_statement(timed.group("code"), loop)
                or not loop
                and (whole is None or number not in whole)
            ):
                return None
            seen.add(which)
            out.append(timed.group(1) + magics[which].prefix + timed.group("code"))
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
    language = (
        (metadata.get("kernelspec") or {}).get("language")
        or (metadata.get("language_info") or {}).get("name")
        or "python"
    )
    return str(language).lower() == "python"


def _load(data: bytes) -> tuple[dict, str, bool]:
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        text = data[3 if bom else 0 :].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"not a notebook: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"not a notebook: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        major = nb.get("nbformat") if isinstance(nb, dict) else None
        if isinstance(major, int) and major < 4:
            raise SourceError(
                f"nbformat {major} notebooks are not supported; "
                "upgrade with `jupyter nbconvert --to notebook`"
            )
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
        text = (
            json.dumps(nb, indent=self.indent, separators=self.separators, ensure_ascii=self.ensure_ascii)
            + self.trailing
        )
        return text.replace("\n", self.newline) if self.newline != "\n" else text


def _style_of(text: str, nb: dict) -> _Style:
    newline = "\r\n" if "\r\n" in text else "\n"
    plain = text.replace("\r\n", "\n")
    body = plain.rstrip()
    trailing = plain[len(body) :]
    match = re.match(r"\{\n( +)\"", body)
    indents: list[Optional[int]] = [len(match.group(1))] if match else [None]
    separators = [(",", ": ")] if indents[0] is not None else [(", ", ": "), (",", ":")]
    for indent in indents:
        for sep in separators:
            for ensure_ascii in (False, True):
                if json.dumps(nb, indent=indent, separators=sep, ensure_ascii=ensure_ascii) == body:
                    return _Style(indent, sep, ensure_ascii, newline, trailing, True)
    return _Style(
        indents[0] if indents[0] is not None else 1, (",", ": "), False, newline, trailing or "\n", False
    )


def _timeit_cells(nb: dict) -> list[_Cell]:
    """`%%timeit` cells, each as one IPython block to check (not migrated)."""
    out = []
    for index, cell in enumerate(nb["cells"]):
        source = _source_text(cell.get("source", "")) if cell.get("cell_type") == "code" else ""
        lines = source.split("\n")
        start = next((n for n, line in enumerate(lines) if line.strip()), None)
        if start is not None and re.match(r"[ \t]*%%timeit\b", lines[start]):
            out.append(_Cell(index, "", False, [_Masked(lines[start:], start + 1, body=True)]))
    return out


def _cells_to_migrate(nb: dict, words: Optional[frozenset[str]] = None) -> list[_Cell]:
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
        magics: list[_Masked] = []
        protected = _protect(source, magics, words)
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
        length = count_line_breaks(cell.source)
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
        if text is None or seen != set(range(len(cell.magics))):
            return None
        if cell.added_newline and text.endswith("\n"):
            text = text[:-1]
        out.append(text)
    return out


def _bound_names(tree: Optional[ast.Module]) -> Optional[set[str]]:
    """Every name the code binds anywhere (None: it does not parse)."""
    if tree is None:
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name.split(".")[0]) for a in node.names if a.name != "*")
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _apex_bound(tree: ast.Module) -> set[str]:
    """The names Apex (or torch's deprecated amp) imports bind."""
    names: set[str] = set()
    for node in SourceIndex.imports_of(tree):
        for alias in node.names:
            one = (
                ast.Import([alias])
                if isinstance(node, ast.Import)
                else ast.ImportFrom(node.module, [alias], node.level)
            )
            if alias.name != "*" and imports_apex(one):
                names.add(alias.asname or alias.name.split(".")[0])
    return names


_INTERPOLATED = re.compile(r"\{([^{}]*)\}|(?<!\$)\$(\w+)")
# Magics whose arguments are text (paths, packages, options), not Python names; IPython still
# expands `{expr}` and `$name` in them.
_TEXT_MAGICS = {
    "pip",
    "conda",
    "mamba",
    "matplotlib",
    "load_ext",
    "reload_ext",
    "unload_ext",
    "cd",
    "env",
    "config",
    "run",
    "autoreload",
    "aimport",
    "pylab",
    "gui",
    "xmode",
    "precision",
    "sx",
    "system",
    "sh",
    "bash",
    "writefile",
    "load",
    "save",
    "pycat",
    "mkdir",
    "ls",
    "pwd",
    "rm",
    "cp",
    "mv",
    "cat",
    "history",
    "alias",
    "lsmagic",
    "magic",
    "pushd",
    "popd",
    "bookmark",
    "dhist",
    "autosave",
    "time",
    "timeit",
    "capture",
    "prun",
    "debug",
}
_CODE_MAGICS = {"time", "timeit", "prun", "debug"}  # the arguments (after options) are code


def _python_names(code: str) -> set[str]:
    try:
        tree = ast.parse(code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past Python's limits
        return _identifiers(code)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _referenced(masked: _Masked) -> set[str]:
    """The Python names an IPython line can read (or bind, `x = !cmd`), as IPython runs it."""
    if masked.body:
        return _python_names("\n".join(masked.lines[1:])) | _referenced(_Masked(masked.lines[:1], 1))
    text = " ".join(line.rstrip("\\") for line in masked.lines).strip()
    names: set[str] = set()
    assigned = re.match(r"([\w.]+)[ \t]*=[ \t]*(?=[%!])", text)
    if assigned:
        names.add(assigned.group(1).split(".")[0])
        text = text[assigned.end() :]
    for expr, plain in _INTERPOLATED.findall(text):
        names |= _python_names(expr) if expr else {plain}
    if text.startswith("!"):
        return names
    magic = re.match(r"%%?(\w+)(.*)$", text) or (re.match(r"(\w+)(.*)$", text) if _automagic(text) else None)
    if magic is None:  # `obj?`, `??obj`: the object
        return names | set(re.findall(r"[A-Za-z_]\w*", text.strip("? \t"))[:1])
    name, args = magic.group(1), magic.group(2)
    if name in _CODE_MAGICS:
        args = re.sub(r"^(?:[ \t]+-(?:[nrp][ \t]*\d+|[tcqoDTsl](?:[ \t]+\S+)?|\w))*", "", args)
        return names | _python_names(args)
    if name in _TEXT_MAGICS:
        return names
    return names | _identifiers(args)  # `%store amp`, `%pinfo amp`, `%xdel amp`, ...


def _broken_magics(
    module: str, code: str, cells: list[_Cell], native: bool, timeit_cells: Sequence[_Cell] = ()
) -> list[Finding]:
    """IPython lines that name something the migrated code no longer binds (under the native
    target, the names Apex imports bind too: those objects are gone even where a name stays)."""
    before = python_ast(module)
    after = _bound_names(python_ast(code))
    bound = _bound_names(before)
    if before is None or after is None or bound is None:
        return []  # not parsed: the migration itself reports it
    gone = (bound - after) | (_apex_bound(before) if native else set())
    findings = []
    for cell in [*cells, *timeit_cells]:
        for masked in cell.magics:
            if masked.prefix:
                continue  # migrated as code
            for name in sorted(_referenced(masked) & gone):
                word = re.compile(rf"\b{re.escape(name)}\b")
                at, col = next(
                    ((i, found) for i, line in enumerate(masked.lines) if (found := word.search(line))),
                    (max(len(masked.lines) - 1, 0), None),
                )
                what = masked.lines[0].strip() + (
                    " cell" if masked.body else " \\ ..." if len(masked.lines) > 1 else ""
                )
                findings.append(
                    Finding(
                        Diagnostic(
                            MAGIC_USES_MIGRATED_NAME.code,
                            MAGIC_USES_MIGRATED_NAME.severity,
                            masked.line + (at if col else 0),
                            col.start() + 1 if col else 1,
                            f"`{what}` names `{name}`, which the {'native ' if native else ''}migration "
                            "no longer binds; IPython lines are not rewritten",
                            False,
                        ),
                        cell.index + 1,
                    )
                )
    return findings


def _ended(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


def _migrated_cells(
    module: str, cells: list[_Cell], nb: dict, options: Options, target: Target
) -> tuple[MigrationResult, Optional[list[str]], list[Finding]]:
    """The cells' joined code (`module`) migrated to `target`, its code cut back into the cells
    (None: it cannot be), and the IPython lines that name what the migration no longer binds."""
    migrated = migrate_source(
        module, target=target, device=options.device, dtype=options.dtype, unsafe_fixes=options.unsafe_fixes
    )
    if not migrated.changed:
        return migrated, None, []
    sources = _split(migrated.code, cells)
    lost = (
        _broken_magics(module, migrated.code, cells, migrated.target_used == "native", _timeit_cells(nb))
        if sources is not None
        else []
    )
    return migrated, sources, lost


def _spanning_cells(module: str, code: str, cells: list[_Cell]) -> Finding:
    """NATIVE_SPANS_CELLS at the first line of `module` that the migration to `code` changed,
    naming the first cell whose boundary the rewrite moved or put inside a block."""
    before, after = split_lines(module, keepends=True), split_lines(code, keepends=True)
    opcodes = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    first = next((i1 for tag, i1, _, _, _ in opcodes if tag != "equal"), 0)
    kept = {int(n) for n in _CELL_LINE.findall(code)}
    moved = next((cell.index for cell in cells[1:] if cell.index not in kept), None)
    where = f"cell {moved + 1}" if moved is not None else "the next cells"
    message = f"the native rewrite of this code reaches into {where} (a block cannot span cells)"
    _, spans = _join(cells)
    diagnostic = Diagnostic(
        NATIVE_SPANS_CELLS.code, NATIVE_SPANS_CELLS.severity, first + 1, 1, message, False
    )
    return _locate(diagnostic, spans)


def _native_refused(cells: list[_Cell]) -> Finding:
    """NATIVE_IMPOSSIBLE (`--target native` refused), reported at the first migrated cell."""
    return Finding(
        Diagnostic(
            NATIVE_IMPOSSIBLE.code,
            NATIVE_IMPOSSIBLE.severity,
            1,
            1,
            NATIVE_IMPOSSIBLE.summary,
            False,
        ),
        cells[0].index + 1,
    )


def migrate(path: str, data: bytes, options: Options, want_diff: bool) -> FileResult:
    """Migrate a notebook's code cells; a broken notebook raises SourceError."""
    nb, text, bom = _load(data)
    result = FileResult(path, "notebook", scanned=True)
    if not _is_python(nb):
        return replace(result, notes=("not a Python notebook; left as it is",))
    cells = _cells_to_migrate(nb)
    if not cells:
        return result
    tree = python_ast(_join(cells)[0])
    if tree is not None:  # `%time` statements that spell an Apex word are migrated as code
        words = apex_import_words(SourceIndex.imports_of(tree))
        cells = _cells_to_migrate(nb, words)
    module, spans = _join(cells)
    notes: list[str] = []
    broken: list[Finding] = []
    try:
        migrated, sources, broken = _migrated_cells(module, cells, nb, options, options.target)
        if migrated.changed and (sources is None or broken):
            if sources is None and migrated.target_used == "native":
                broken = [_spanning_cells(module, migrated.code, cells), *broken]
            if options.target == "native":
                return replace(result, findings=(*broken, _native_refused(cells)))
            lost = broken
            if migrated.target_used == "native":  # auto: the shim rewrites imports only
                migrated, sources, lost = _migrated_cells(module, cells, nb, options, "shim")
                broken = broken + lost
            if migrated.changed and (sources is None or lost):
                return replace(
                    result,
                    findings=tuple(broken),
                    error="the migrated code cannot be cut back into cells; left untouched",
                )
    except MigrationError as exc:
        return replace(result, findings=(_locate(exc.as_diagnostic(), spans),))
    findings = tuple(broken) + tuple(_locate(d, spans) for d in migrated.diagnostics)
    result = replace(result, findings=findings, notes=tuple(notes))
    if sources is None:
        return result
    return _with_cells(result, nb, text, bom, zip(cells, sources), migrated.target_used, want_diff, notes)


def _with_cells(
    result: FileResult,
    nb: dict,
    text: str,
    bom: bool,
    rewritten,
    target_used: Optional[str],
    want_diff: bool,
    notes: list[str],
) -> FileResult:
    """`result` carrying the notebook with each (cell, new source) put back, in the JSON
    layout the file had, and the per-cell diffs when asked for."""
    style = _style_of(text, nb)
    diffs, line_maps = [], []
    for cell, new_source in rewritten:
        entry = nb["cells"][cell.index]
        old_source = _source_text(entry.get("source", ""))
        if new_source == old_source:
            continue
        line_maps.append((cell.index + 1, line_map(old_source, new_source)))
        if want_diff:
            # A cell's last line has no newline by convention; saying so in every hunk is noise.
            name = f"{result.path}:cell {cell.index + 1}"
            diffs.append(unified_diff(_ended(old_source), _ended(new_source), name))
        entry["source"] = (
            new_source.splitlines(keepends=True) if isinstance(entry.get("source"), list) else new_source
        )
    new_text = style.dumps(nb)
    if not style.exact:
        notes.append(
            "the notebook's JSON layout is not one json.dumps writes; unchanged cells may be re-indented"
        )
    new_bytes = (b"\xef\xbb\xbf" if bom else b"") + new_text.encode("utf-8")
    return replace(
        result,
        changed=True,
        target_used=target_used,
        new_bytes=new_bytes,
        diff="".join(diffs),
        notes=tuple(notes),
        line_maps=tuple(line_maps),
    )
