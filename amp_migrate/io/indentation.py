"""Indentation that mixes tabs and spaces the way Python accepts and libcst cannot read.

Python measures indentation in columns (a tab advancing to the next multiple of 8, with a
second count taking a tab as one column that must order the lines the same way), so `    `
followed by a deeper `\\t    ` is one block inside another. libcst keeps each block's
indentation as the text it adds to the enclosing block's: a deeper line whose whitespace does
not start with the enclosing block's fails to parse ("no matching outer block for dedent",
placed at 1:1), and a line at the same depth spelled differently (` \\t\\t` and `\\t \\t`)
parses but renders as its block's first line.

The codemod therefore works on the same program with every such statement's indentation
written as spaces to the same column, and `TabIndents.restore` puts the file's own
indentation back: on every line it kept, and on new lines the spelling of their block. Each
step is checked with Python's parser: the spaced text must have the file's syntax tree, and
the restored code the migrated code's; where either check fails the file is not migrated and
the message names the line.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Optional

from .lines import split_lines

_TAB_INDENT = re.compile(r"^[ \f]*\t", re.MULTILINE)
_SPACE_INDENT = re.compile(r"^[\t\f]* ", re.MULTILINE)
_SKIPPED = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def indent_column(whitespace: str) -> int:
    """The column Python's tokenizer gives a statement indented by `whitespace`."""
    col = 0
    for char in whitespace:
        if char == "\t":
            col = (col // 8 + 1) * 8
        elif char == "\f":
            col = 0
        else:
            col += 1
    return col


def _statement_indents(text: str) -> Iterator[tuple[int, str, Optional[str]]]:
    """(line, indentation, INDENT or DEDENT or None) for each line that starts a statement.

    Raises tokenize.TokenError or SyntaxError where the text does not tokenize."""
    starts, change = True, None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            starts, change = True, None
        elif token.type == tokenize.INDENT:
            change = "indent"
        elif token.type == tokenize.DEDENT:
            change = "dedent"
        elif starts and token.type not in _SKIPPED:
            starts = False
            yield token.start[0], token.line[: token.start[1]], change
            change = None


def unreadable_line(text: str) -> Optional[int]:
    """The first line whose indentation libcst cannot read as Python does, or None (also
    when the text does not tokenize: the parser's own error then says where)."""
    if not (_TAB_INDENT.search(text) and _SPACE_INDENT.search(text)):
        return None  # tabs only or spaces only: deeper is always longer, same depth the same
    stack = [""]
    try:
        for line, indent, change in _statement_indents(text):
            if change == "indent":
                if not indent.startswith(stack[-1]):
                    return line
                stack.append(indent)
                continue
            if change == "dedent":
                while len(stack) > 1 and indent_column(stack[-1]) > indent_column(indent):
                    stack.pop()
            if indent != stack[-1]:
                return line
    except (SyntaxError, tokenize.TokenError):
        return None
    return None


def message(line: int) -> str:
    return (
        f"the parser cannot read the tab-mixed indentation at line {line}; Python accepts "
        "it. Reindent the file with spaces (e.g. `expand -i -t 8 FILE`, which expands "
        "leading tabs only) and run again"
    )


def _same_program(a: str, b: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except (SyntaxError, ValueError):
        return False


@dataclass(frozen=True)
class TabIndents:
    """A text libcst cannot read, and the same program indented with spaces."""

    original: str
    text: str  # every statement line indented with spaces to its column
    indents: dict[int, str]  # line (1-based) -> its own indentation, where `text` differs
    line: int  # the first line libcst could not read, for messages
    spaced: dict[int, int] = field(default_factory=dict)  # line -> the spaces put instead

    def restore(self, code: str) -> Optional[str]:
        """`code` (a migration of `text`) indented as the file was: its own indentation on
        every line it kept, and on a new statement line that of the file's lines at the same
        depth (those of its block, else those it replaced), else its enclosing statement's
        plus spaces. None when that is not provably the same program as `code`."""
        if code == self.text:
            return self.original
        before, after = split_lines(self.text, keepends=True), split_lines(code, keepends=True)
        try:
            starts = {line - 1: len(indent) for line, indent, _ in _statement_indents(code)}
        except (SyntaxError, tokenize.TokenError):
            return None
        out = list(after)
        kept = [False] * len(after)
        replaced: dict[int, dict[int, str]] = {}  # new line -> column -> an indentation it replaced
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    kept[j1 + k] = True
                    own = self.indents.get(i1 + k + 1)
                    if own is not None:
                        out[j1 + k] = own + after[j1 + k][self.spaced[i1 + k + 1] :]
            elif tag == "replace":
                spellings: dict[int, str] = {}
                for i in range(i1 + 1, i2 + 1):
                    if i in self.indents:
                        spellings.setdefault(self.spaced[i], self.indents[i])
                replaced.update({j: spellings for j in range(j1, j2)})
        rows = sorted(starts)
        for like_replaced in (True, False):
            new = list(out)
            for at, j in enumerate(rows):
                if not kept[j] and starts[j]:
                    spelling = replaced.get(j, {}).get(starts[j]) if like_replaced else None
                    indent = self._indent_like(at, rows, starts, new, kept, spelling)
                    new[j] = indent + after[j][starts[j] :]
            restored = "".join(new)
            if _same_program(restored, code):
                return restored
        return None

    @staticmethod
    def _indent_like(
        at: int,
        rows: list[int],
        starts: dict[int, int],
        out: list[str],
        kept: list[bool],
        spelling: Optional[str],
    ) -> str:
        """The indentation for new statement line rows[at] at its column: that of a kept line
        of its block (no shallower line between them; above first), else `spelling`, else
        that of the nearest shallower line above plus spaces."""
        col = starts[rows[at]]
        for side in (reversed(rows[:at]), rows[at + 1 :]):
            for other in side:
                if starts[other] < col:
                    break
                if starts[other] == col and kept[other]:
                    return _leading(out[other])
        if spelling is not None:
            return spelling
        for other in reversed(rows[:at]):
            if starts[other] < col:
                whitespace = _leading(out[other])
                return whitespace + " " * (col - indent_column(whitespace))
        return " " * col

    def column(self, line: int, col: int) -> int:
        """A column (1-based) of `text` as a column of the original."""
        spaced = self.spaced.get(line)
        if spaced is None or col <= spaced:
            return col
        return col - spaced + len(self.indents[line])


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def tab_indents(text: str) -> Optional[TabIndents]:
    """`text` indented with spaces where libcst cannot read its indentation; None where it
    can. A TabIndents whose `text` is the original means the spaced text was not provably
    the same program (the caller reports `line`)."""
    line = unreadable_line(text)
    if line is None:
        return None
    lines = split_lines(text, keepends=True)
    indents: dict[int, str] = {}
    spaced: dict[int, int] = {}
    for row, indent, _ in _statement_indents(text):
        if indent.strip(" "):  # a tab or a form feed
            indents[row], spaced[row] = indent, indent_column(indent)
    new = [
        " " * spaced[n] + line_[len(indents[n]) :] if n in indents else line_
        for n, line_ in enumerate(lines, 1)
    ]
    spaced_text = "".join(new)
    if not _same_program(spaced_text, text):
        return TabIndents(text, text, {}, line)
    return TabIndents(text, spaced_text, indents, line, spaced)
