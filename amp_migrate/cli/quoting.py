"""File names as the text output prints them: one that a terminal would not show as it is
written is printed in double quotes with C escapes, as git does (core.quotePath) and
`ls --quoting-style=c`; every other name as it is, non-ASCII letters included.

A name is the user's data: printed raw, a newline in it would start a line of its own that
reads like a diagnostic, and an escape sequence would drive the terminal. The JSON report
keeps the real names (JSON escapes them itself).
"""

from __future__ import annotations

_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
    "\\": "\\\\",
    '"': '\\"',
}


def _octal(char: str) -> str:
    """Octal escapes of the bytes the name has on disk, as git writes them."""
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\{code - 0xDC00:03o}"
    return "".join(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogatepass"))


def _escaped(char: str) -> str:
    return _ESCAPES.get(char) or _octal(char)


def quote_path(path: str) -> str:
    """`path` as the text output prints it: unchanged unless it holds a character a terminal
    would not print as itself (a control, a format or separator character, a byte that is not
    UTF-8), a backslash or a double quote; then quoted, with C escapes."""
    if path.isprintable() and "\\" not in path and '"' not in path:
        return path
    return '"' + "".join(c if c.isprintable() and c not in '\\"' else _escaped(c) for c in path) + '"'


def printable(text: str) -> str:
    """`text` (a message, which may name files) with every character a terminal would not print
    as itself escaped, so that it stays on its line; backslashes and quotes stay as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)
