"""Inputs with the characters `str.splitlines()` takes for line breaks and Python does not.

`mutate` inserts each of `\\f \\v \\x1c \\x1d \\x1e \\x85 U+2028 U+2029` where Python reads it as
part of a comment, a docstring or a printed string (a form feed also at the start of a line,
where the tokenizer ignores it), at places drawn from a seeded generator, so that a migration
of the result can be compared with the migration of the input (test_corpus_invariants.py).
"""

from __future__ import annotations

import ast
import io
import random
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from amp_migrate.io.lines import split_lines
from amp_migrate.migrate import MigrationError, MigrationResult
from fixture_files import ROOT

CLASSES = {
    "form-feed": "\x0c",  # also whitespace to Python, so it goes at line starts too
    "ascii-controls": "\x0b\x1c\x1d\x1e",
    "unicode-breaks": "\x85\u2028\u2029",
}
#: Every character of every class: one mutated input per fixture holds them all.
EVERY_CHARACTER = "".join(CLASSES.values())
PER_CHARACTER = 3  # places drawn for each character
_PRINTED = {"print", "info", "warning", "debug", "error", "write", "log", "set_description"}
_PREFIX = re.compile(r"[rRbBuUfF]*('''|\"\"\"|'|\")")
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=]")


def _offsets(text: str) -> list[int]:
    """Where each line (as the parser counts them) starts in `text`."""
    out, at = [], 0
    for line in split_lines(text, keepends=True):
        out.append(at)
        at += len(line)
    return out


def _string_sites(text: str, tree: ast.Module, starts: list[int]) -> list[int]:
    """Just inside the opening quote of docstrings and of strings that are only printed or
    logged: text no rule reads (and, in an f-string, literal text)."""
    strings: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            strings.append(node.value)
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name in _PRINTED:
                strings.extend(a for a in node.args if isinstance(a, (ast.Constant, ast.JoinedStr)))
    sites = []
    for node in strings:
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            continue
        line_start = starts[node.lineno - 1]
        line = text[line_start : starts[node.lineno] if node.lineno < len(starts) else len(text)]
        col = len(line.encode("utf-8")[: node.col_offset].decode("utf-8"))
        quote = _PREFIX.match(line, col)
        if quote is not None:
            sites.append(line_start + quote.end())
    return sites


@dataclass
class Sites:
    inside: list[int]  # in comments, docstrings and printed strings
    line_starts: list[int]  # lines that do not start inside a string
    statements: list[tuple[int, str]]  # where a statement's line starts, and its indentation


def find_sites(text: str) -> Optional[Sites]:
    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text, newline=None).readline))
    except (SyntaxError, ValueError, tokenize.TokenError):
        return None
    starts = _offsets(text)
    sites = Sites([], [], [])
    in_strings: set[int] = set()
    new_statement = True
    for token in tokens:
        (row, col), (end_row, _) = token.start, token.end
        if token.type == tokenize.COMMENT and not (row <= 2 and _COOKIE.match(token.string)):
            sites.inside.extend(starts[row - 1] + col + k for k in range(1, len(token.string) + 1))
        elif token.type == tokenize.STRING and end_row > row:
            in_strings.update(range(row + 1, end_row + 1))
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            new_statement = True
        elif new_statement and token.type not in (
            tokenize.NL,
            tokenize.COMMENT,
            tokenize.INDENT,
            tokenize.DEDENT,
        ):
            new_statement = False
            sites.statements.append((starts[row - 1], token.line[:col]))
    sites.inside.extend(_string_sites(text, tree, starts))
    sites.line_starts = [at for row, at in enumerate(starts, 1) if row not in in_strings]
    return sites


def base(path: Path, text: str) -> str:
    """`text`, or where it has no comment, docstring or printed string, `text` with a comment
    line before a statement drawn at random (the characters go into that comment)."""
    sites = find_sites(text)
    if sites is None or sites.inside or not sites.statements:
        return text
    at, indent = random.Random(path.relative_to(ROOT).as_posix()).choice(sites.statements)
    return _insert(text, {at: f"{indent}# a comment for the characters\n"})


def _insert(text: str, places: dict[int, str]) -> str:
    out, last = [], 0
    for at in sorted(places):
        out.append(text[last:at])
        out.append(places[at])
        last = at
    out.append(text[last:])
    return "".join(out)


def mutate(path: Path, text: str, characters: str) -> Optional[str]:
    sites = find_sites(text)
    if sites is None:
        return None
    inside, line_starts = sites.inside, sites.line_starts
    rng = random.Random(f"{path.relative_to(ROOT).as_posix()}:{characters!r}")
    places: dict[int, str] = {}
    for char in characters:
        pool = inside + line_starts if char == "\x0c" else inside
        chosen = rng.sample(pool, min(PER_CHARACTER, len(pool)))
        if char == "\x0c" and line_starts and not set(chosen) & set(line_starts):
            chosen[-1:] = [rng.choice(line_starts)]
        for at in chosen:
            places[at] = places.get(at, "") + char
    return _insert(text, places) if places else None


def outcome(result: MigrationResult | MigrationError) -> tuple:
    """What must not change when the characters are inserted: the code, the target, whether it
    changed, the diagnostics' codes, lines and severities (or the error's line)."""
    if isinstance(result, MigrationError):
        return ("error", result.line)
    return (
        result.code,
        result.target_used,
        result.changed,
        sorted((d.code, d.line, d.severity) for d in result.diagnostics),
    )


def without(migration: tuple, characters: str) -> tuple:
    """The migration with `characters` taken out of its code."""
    if migration[0] == "error":
        return migration
    return (migration[0].translate({ord(c): None for c in characters}), *migration[1:])


def program(text: str, characters: str) -> str:
    """What Python makes of `text`, with `characters` taken out of its strings."""
    tree = ast.parse(text)
    strip = {ord(c): None for c in characters}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = node.value.translate(strip)
    return ast.dump(tree)
