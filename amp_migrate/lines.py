"""The lines of a source text, counted the way Python's tokenizer (and libcst) count them.

`str.splitlines()` also breaks at `\\v`, `\\f`, `\\x1c`-`\\x1e`, `\\x85`, U+2028 and U+2029;
the parser takes those as ordinary characters (in a comment, a string, or `\\f` as
indentation), so a line number derived from `splitlines()` drifts from the parser's after the
first one, and whatever is keyed to line numbers (pruning, step lines, diagnostics, cell
spans) lands on the wrong statement. Every line number the codemod derives from text comes
from here. The splits run at C speed (`str.split`, `re.findall`), as `splitlines()` did.
"""
from __future__ import annotations

import re

#: The line breaks Python's tokenizer counts, longest first.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_WITH_END = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


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


def count_line_breaks(text: str) -> int:
    """How many line breaks the parser sees in `text`."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")
