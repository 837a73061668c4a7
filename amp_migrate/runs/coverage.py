"""Which of the statements the migration wrote ran in the migrated run, and which never did.

Equal runs prove only what ran: a `scaler.state_dict()` in a checkpoint save that the recorded
steps never reach is not proven by them. The statements are those holding a line that the
migration wrote (a line diff of each migrated file against its original, blind to indentation,
so that a body moved under a new `with torch.autocast(...)` is not counted as written) and that
Python compiles to code; the recorder of the migrated run is given those lines and says which
of them executed (`recorder.py`, "executed_lines").
"""

from __future__ import annotations

import ast
import difflib
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from .locate import Source

#: Never-ran statements the text report lists before it points at the JSON for the rest.
SHOWN = 20


@dataclass(frozen=True)
class Statement:
    """A statement the migration wrote, in the migrated file."""

    file: str  # relative to the tree
    line: int  # its first line that the migration wrote
    original_line: Optional[int]  # where that line stands in the original (None: inserted)
    text: str  # that line, stripped
    context: str  # the enclosing function or class ("save_checkpoint", "Trainer.fit"); "" at module level
    lines: tuple[int, ...]  # its lines that the migration wrote and that hold code


@dataclass(frozen=True)
class Coverage:
    ran: tuple[Statement, ...]
    not_run: tuple[Statement, ...]


def _written(source: Source) -> dict[int, Optional[int]]:
    """Each 1-based migrated line the migration wrote, with the original line it stands for:
    in a rewritten block the one original line that reads most like it, else the block's first;
    None for an inserted line."""
    original = [line.strip() for line in source.original]
    migrated = [line.strip() for line in source.migrated]
    written: dict[int, Optional[int]] = {}
    matcher = difflib.SequenceMatcher(None, original, migrated, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag not in ("replace", "insert"):
            continue
        for j in range(j1, j2):
            if not migrated[j]:
                continue
            if tag == "insert":
                written[j + 1] = None
                continue
            score, index = max((_likeness(migrated[j], original[i]), i) for i in range(i1, i2))
            written[j + 1] = (index if score > (0.0, 0.6) else i1) + 1
    return written


def _likeness(a: str, b: str) -> tuple[float, float]:
    """How much two lines share: their names first (`scaler.step(optimizer)` stands for
    `optimizer.step()`, not for the `with amp.scale_loss(...)` that reads more alike), then
    their characters."""
    names_a, names_b = set(re.findall(r"\w+", a)), set(re.findall(r"\w+", b))
    shared = len(names_a & names_b) / len(names_a | names_b) if names_a | names_b else 0.0
    return shared, difflib.SequenceMatcher(None, a, b).ratio()


def _code_lines(code: types.CodeType, context: dict[int, str]) -> None:
    """Every line holding code, mapped to its innermost function or class (by qualified name)."""
    qualified = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
    name = "" if code.co_name == "<module>" else qualified.replace(".<locals>", "")
    for _, _, line in code.co_lines():
        if line is not None:
            context[line] = name
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _code_lines(constant, context)


def _innermost(tree: ast.Module, line: int) -> Optional[ast.stmt]:
    """The smallest statement spanning `line`: for a compound statement's header, that statement."""
    best: Optional[ast.stmt] = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or (node.end_lineno or 0) - node.lineno < (best.end_lineno or 0) - best.lineno:
                best = node
    return best


def written_statements(sources: Mapping[str, Source]) -> list[Statement]:
    """The statements holding code that the migration wrote, file by file, in line order."""
    statements = []
    for path in sorted(sources):
        source = sources[path]
        text = "\n".join(source.migrated) + "\n"
        try:
            tree = ast.parse(text)
            code = compile(tree, path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            continue  # not code this run could execute
        context: dict[int, str] = {}
        _code_lines(code, context)
        written = _written(source)
        groups: dict[tuple[int, int], list[int]] = {}
        for line in sorted(written):
            if line not in context:
                continue  # a comment, a bracket, an `else:`: nothing runs there
            node = _innermost(tree, line)
            key = (node.lineno, node.col_offset) if node is not None else (line, 0)
            groups.setdefault(key, []).append(line)
        for lines in groups.values():
            first = lines[0]
            statements.append(
                Statement(
                    path,
                    first,
                    written[first],
                    source.migrated[first - 1].strip(),
                    context[first],
                    tuple(lines),
                )
            )
    return sorted(statements, key=lambda s: (s.file, s.line))


def watch_list(statements: Iterable[Statement], root: Path) -> dict[str, list[int]]:
    """The recorder's `--watch-lines`: absolute path of each file in the copy, its lines."""
    watched: dict[str, set[int]] = {}
    for statement in statements:
        watched.setdefault(str(root / statement.file), set()).update(statement.lines)
    return {path: sorted(lines) for path, lines in watched.items()}


def covered(
    statements: Sequence[Statement], root: Path, executed: Iterable[Mapping[str, Sequence[int]]]
) -> Coverage:
    """The statements split by whether any of their written lines executed in any of the runs
    (the ranks of a torchrun: a statement ran when it ran in one of them)."""
    seen: set[tuple[str, int]] = set()
    for lines_by_path in executed:
        for path, lines in lines_by_path.items():
            try:
                relative = Path(path).relative_to(root).as_posix()
            except ValueError:
                continue
            seen.update((relative, int(line)) for line in lines)
    ran = tuple(s for s in statements if any((s.file, line) in seen for line in s.lines))
    return Coverage(ran, tuple(s for s in statements if s not in ran))


def _where(statement: Statement) -> str:
    inside = f"in {statement.context}" if statement.context else "at module level"
    moved = ""
    if statement.original_line is not None and statement.original_line != statement.line:
        moved = f" (line {statement.original_line} of the original)"
    return f"`{statement.text}` {inside} at {statement.file}:{statement.line}{moved}"


def describe(coverage: Optional[Coverage]) -> list[str]:
    """The text report's block: the counts, then each statement that never ran."""
    if coverage is None or not (coverage.ran or coverage.not_run):
        return []
    lines = [
        f"the migration's statements in the migrated run: {len(coverage.ran)} ran, "
        f"{len(coverage.not_run)} never ran"
    ]
    lines += [f"  {_where(statement)} never ran" for statement in coverage.not_run[:SHOWN]]
    if len(coverage.not_run) > SHOWN:
        lines.append(f"  ... and {len(coverage.not_run) - SHOWN} more (--format json lists every one)")
    return lines


def as_json(coverage: Optional[Coverage]) -> Optional[dict]:
    if coverage is None:
        return None

    def entry(statement: Statement) -> dict:
        return {
            "file": statement.file,
            "line": statement.line,
            "original_line": statement.original_line,
            "text": statement.text,
            "context": statement.context or None,
        }

    return {"ran": [entry(s) for s in coverage.ran], "not_run": [entry(s) for s in coverage.not_run]}
