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

from typing import Optional, Sequence, cast

import libcst as cst

from ..analysis.source_index import SourceIndex, Statement
from .lines import split_lines

#: Characters `str.splitlines` or libcst may take for line breaks where Python does not.
#: The name of a placeholder statement (`_layout`), never in a file it lays out.
_MARK = "__amp_migrate_kept_statement_"
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
            kept[1] if kept is not None and kept[0] is statement else _layout(result, statement, texts)
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
        #: Statements in the bodies of classes and functions, by id: the node, the indentation
        #: it was written at, its original text.
        self.nested: dict[int, tuple[cst.CSTNode, str, str]] = {}
        self.newline = "\n"


_Body = (cst.ClassDef, cst.FunctionDef)  # one indented block, the statement's last part


def _layout(module: cst.Module, statement: cst.CSTNode, texts: _Texts) -> str:
    """A statement the rules replaced, laid out by libcst but for the statements of its class
    and function bodies that are the parse's own at the indentation they were written at:
    those are their original text (each laid out as a placeholder line first, then swapped)."""
    swaps: dict[str, str] = {}
    marked = _marked(statement, "", module.default_indent, texts, swaps)
    code = module.code_for_node(marked)
    for line, text in swaps.items():
        if code.count(line) != 1:
            return module.code_for_node(statement)
        code = code.replace(line, text)
    return code


def _marked(
    node: cst.CSTNode, indent: str, default: str, texts: _Texts, swaps: dict[str, str]
) -> cst.CSTNode:
    if not isinstance(node, _Body) or not isinstance(node.body, cst.IndentedBlock) or not texts.nested:
        return node
    inner = indent + (node.body.indent if node.body.indent is not None else default)
    body: list[cst.BaseStatement] = []
    for child in node.body.body:
        kept = texts.nested.get(id(child))
        if kept is not None and kept[0] is child and kept[1] == inner:
            mark = f"{_MARK}{len(swaps)}"
            swaps[f"{inner}{mark}{texts.newline}"] = kept[2]
            body.append(cst.SimpleStatementLine([cst.Expr(cst.Name(mark))]))
        else:
            body.append(cast(cst.BaseStatement, _marked(child, inner, default, texts, swaps)))
    if all(a is b for a, b in zip(body, node.body.body)):
        return node
    return node.with_changes(body=node.body.with_changes(body=body))


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
    texts = _Texts("".join(lines[: firsts[0] - 1]), statements, "".join(lines[ends[-1] :]))
    texts.newline = parsed.default_newline
    if _MARK not in original:
        for entry, end in zip(entries, ends):
            _nested(entry, end, "", parsed.default_indent, lines, texts.nested)
    return texts


def _nested(
    entry: Statement, end: int, indent: str, default: str, lines: list[str], out: dict[int, tuple]
) -> None:
    """The statements of a class or function body with their original text, at every depth
    (the body is the statement's last part: its last statement ends where the statement does,
    less the block's own footer lines)."""
    node = entry.node
    if not isinstance(node, _Body) or not isinstance(node.body, cst.IndentedBlock):
        return
    block = node.body
    kids = entry.children
    if len(kids) != len(block.body) or any(k.node is not c for k, c in zip(kids, block.body)):
        return
    inner = indent + (block.indent if block.indent is not None else default)
    firsts = [k.start - len(_leading(k.node)) for k in kids]
    ends = [f - 1 for f in firsts[1:]] + [end - len(block.footer)]
    if firsts[0] <= entry.start - 1 or any(
        e < k.end or (isinstance(k.node, cst.SimpleStatementLine) and e != k.end) for k, e in zip(kids, ends)
    ):
        return
    for kid, first, last in zip(kids, firsts, ends):
        out[id(kid.node)] = (kid.node, inner, "".join(lines[first - 1 : last]))
        _nested(kid, last, inner, default, lines, out)


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
