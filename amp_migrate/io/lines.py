"""The lines of a source text, counted the way Python's tokenizer (and libcst) count them.

`str.splitlines()` also breaks at `\\v`, `\\f`, `\\x1c`-`\\x1e`, `\\x85`, U+2028 and U+2029;
the parser takes those as ordinary characters (in a comment, a string, or `\\f` as
indentation), so a line number derived from `splitlines()` drifts from the parser's after the
first one, and whatever is keyed to line numbers (pruning, step lines, diagnostics, cell
spans) lands on the wrong statement. Every line number the codemod derives from text comes
from here. The splits run at C speed (`str.split`, `re.findall`), as `splitlines()` did.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass
from typing import Optional

#: The line breaks Python's tokenizer counts, longest first.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_WITH_END = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_FORM_FEED_INDENT = re.compile(r"[ \t\f]*\f")
_FORM_FEED_BEFORE_CODE = re.compile(r"[ \t\f]*\f[ \t\f]*[^\s#]")  # not a blank or comment line


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """`text.splitlines(keepends)`, breaking only where Python's parser starts a new line:
    line N of the result is line N of every parser position."""
    if keepends:
        return _LINE_WITH_END.findall(text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # a final break ends the last line; it does not start another
    return lines


@dataclass(frozen=True)
class LineBreaks:
    """The line breaks a text had before `normalise_line_breaks` made them all `\\n`.

    The rules build code with `\\n`, and libcst drops a final bare `\\r` when it renders a
    module, so the codemod reads every file with `\\n` breaks. Python reads `\\r\\n`, `\\r`
    and `\\n` alike, inside strings too, so the program is the same; `restore` gives each
    line the codemod kept its own break back, and new lines the file's."""

    style: str  # the file's break, or its most common one; the break of new lines
    each: tuple[str, ...] = ()  # every line's break in order, only where the file mixes them

    def restore(self, before: str, code: str) -> str:
        """`code` (a migration of `before`, both with `\\n` breaks) with the file's breaks."""
        if not self.each:
            return code if self.style == "\n" else code.replace("\n", self.style)
        old, new = split_lines(before, keepends=True), split_lines(code, keepends=True)
        ends = [self.style] * len(new)
        if code == before:
            ends[: len(self.each)] = self.each
        else:
            matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes():
                if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):  # line for line
                    for k in range(min(j2 - j1, len(self.each) - i1)):
                        ends[j1 + k] = self.each[i1 + k]
        return "".join(line[:-1] + end if line.endswith("\n") else line for line, end in zip(new, ends))


def normalise_line_breaks(text: str) -> tuple[str, LineBreaks]:
    """`text` with every line break as `\\n`, and what it had instead."""
    if "\r" not in text:
        return text, LineBreaks("\n")
    breaks = LINE_BREAK.findall(text)
    kinds = Counter(breaks)
    style = kinds.most_common(1)[0][0]
    return LINE_BREAK.sub("\n", text), LineBreaks(style, tuple(breaks) if len(kinds) > 1 else ())


def count_line_breaks(text: str) -> int:
    """How many line breaks the parser sees in `text`."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


@dataclass(frozen=True)
class FormFeedIndents:
    """A text whose statements start after a form feed, and the same program without them.

    The tokenizer resets the indentation column at a form feed, so `\\f    x = 1` is indented
    by four; libcst's tokenizer counts the form feed as indentation (a block whose first
    statement has one fails to parse, and a rendered module drops or repeats them). The
    codemod therefore works on `text`, each such line's whitespace up to its last form feed
    taken out (the same program), and `restore` puts them back on the lines it left as they
    were."""

    original: str
    text: str
    removed: dict[int, str]  # line (1-based) -> the whitespace taken out of its start

    def restore(self, code: str) -> str:
        """`code` (a migration of `text`) with the form feeds back on every unchanged line;
        `code` itself if that would not be the same program."""
        if code == self.text:
            return self.original
        before, after = split_lines(self.text, keepends=True), split_lines(code, keepends=True)
        out = list(after)
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for tag, i1, i2, j1, _ in matcher.get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    out[j1 + k] = self.removed.get(i1 + k + 1, "") + after[j1 + k]
        restored = "".join(out)
        try:
            same = ast.dump(ast.parse(restored)) == ast.dump(ast.parse(code))
        except (SyntaxError, ValueError):
            same = False
        return restored if same else code

    def column(self, line: int, col: int) -> int:
        """A column of `text` as a column of the original."""
        return col + len(self.removed.get(line, ""))


def form_feed_indents(text: str) -> Optional[FormFeedIndents]:
    """The statements of `text` that start after a form feed, or None when there are none
    (or the text does not tokenize)."""
    if "\f" not in text:
        return None
    lines = split_lines(text, keepends=True)
    candidates = {n for n, line in enumerate(lines, 1) if _FORM_FEED_BEFORE_CODE.match(line)}
    if not candidates:
        return None
    removed: dict[int, str] = {}
    try:
        starts = True
        for token in tokenize.generate_tokens(io.StringIO(text, newline=None).readline):
            if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                starts = True
            elif starts and token.type not in (
                tokenize.NL,
                tokenize.COMMENT,
                tokenize.INDENT,
                tokenize.DEDENT,
            ):
                starts = False
                row = token.start[0]
                if row in candidates:
                    indent = _FORM_FEED_INDENT.match(lines[row - 1])
                    assert indent is not None  # a candidate matches _FORM_FEED_BEFORE_CODE
                    removed[row] = indent.group(0)
    except (SyntaxError, tokenize.TokenError):
        return None
    if not removed:
        return None
    new = [line[len(removed[n]) :] if n in removed else line for n, line in enumerate(lines, 1)]
    return FormFeedIndents(text, "".join(new), removed)
