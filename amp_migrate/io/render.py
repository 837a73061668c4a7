"""A rewritten module as text, laying out only the top-level statements the rules replaced.

libcst renders a module by laying out every node, which costs about as much as parsing it. A
top-level statement no rule touched is the very node the parse made, and its text is the text
it was parsed from. SourceIndex pairs each top-level statement with Python's line span of it;
with the lines libcst puts before a statement's first line (its `leading_lines`, one line each)
those spans tile the file: a statement's text runs from its first leading line to the line
before the next statement's. So the output is the original lines of every statement kept and
the layout of every other, which is what `Module.code` gives: tests/codemod/test_render.py
compares the two on every fixture input and real corpus file, with every statement, every second
one, the first or the last replaced by a copy.

Where the tiling does not add up (a header, footer or gap the arithmetic does not account for,
layout settings the rules changed, a character some reader takes for a line break and another
does not), the output is `Module.code`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from ..analysis.source_index import SourceIndex
from .lines import split_lines

#: Characters `str.splitlines` or libcst may take for line breaks where Python does not.
_ODD_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\ufeff")


def render(result: cst.Module, parsed: cst.Module, original: str, index: Optional[SourceIndex]) -> str:
    """The text of `result`, the rules' output for `parsed`, the parse of `original`."""
    if result is parsed:
        return original
    texts = _statement_texts(parsed, original, index)
    if texts is None or not _same_layout(result, parsed):
        return result.code
    pieces = [_part(result.header, parsed.header, texts.header, result)]
    for statement in result.body:
        kept = texts.statements.get(id(statement))
        pieces.append(
            kept[1] if kept is not None and kept[0] is statement else result.code_for_node(statement)
        )
    pieces.append(_part(result.footer, parsed.footer, texts.footer, result))
    code = "".join(pieces)
    if not code:
        return result.code  # libcst's own rule for an empty module
    if not result.has_trailing_newline:
        code = code[: -len(result.default_newline)] if code.endswith(result.default_newline) else code
    return code


class _Texts:
    def __init__(self, header: str, statements: dict[int, tuple[cst.CSTNode, str]], footer: str) -> None:
        self.header, self.statements, self.footer = header, statements, footer


def _statement_texts(parsed: cst.Module, original: str, index: Optional[SourceIndex]) -> Optional[_Texts]:
    """The original text of the parse's header, of each top-level statement (by id) and of its
    footer, each ending in a line break; None where the lines do not tile."""
    if index is None or index.statements is None or index.module is not parsed:
        return None
    if any(c in original for c in _ODD_BREAKS) or not parsed.body:
        return None
    entries = index.statements
    if len(entries) != len(parsed.body) or any(e.node is not n for e, n in zip(entries, parsed.body)):
        return None
    lines = split_lines(original, keepends=True)
    if not parsed.has_trailing_newline:
        if not lines or lines[-1].endswith("\n"):
            return None
        lines[-1] += parsed.default_newline
    elif not original.endswith("\n"):
        return None
    firsts = [e.start - len(_leading(e.node)) for e in entries]
    if firsts[0] - 1 != len(parsed.header):
        return None
    ends = [f - 1 for f in firsts[1:]] + [len(lines) - len(parsed.footer)]
    for entry, first, end in zip(entries, firsts, ends):
        simple = isinstance(entry.node, cst.SimpleStatementLine)
        if first > entry.start or end < entry.end or (simple and end != entry.end):
            return None
    statements = {
        id(e.node): (e.node, "".join(lines[first - 1 : end])) for e, first, end in zip(entries, firsts, ends)
    }
    return _Texts("".join(lines[: firsts[0] - 1]), statements, "".join(lines[ends[-1] :]))


def _leading(node: cst.CSTNode) -> Sequence[cst.EmptyLine]:
    return getattr(node, "leading_lines", ())


def _same_layout(result: cst.Module, parsed: cst.Module) -> bool:
    return (
        result.default_indent == parsed.default_indent
        and result.default_newline == parsed.default_newline
        and result.encoding == parsed.encoding
    )


def _part(now: Sequence[cst.EmptyLine], then: Sequence[cst.EmptyLine], text: str, module: cst.Module) -> str:
    """A header or footer: its original text where its lines are the parse's own."""
    if len(now) == len(then) and all(a is b for a, b in zip(now, then)):
        return text
    return "".join(module.code_for_node(line) for line in now)
