"""`amp-migrate explain CODE` describes every message the code can carry.

A code whose messages differ (AMP102: "called more than once", "no `scale_loss` ... goes with
the `amp.initialize` here", "used but `amp.initialize` is not called") declares each variant as
a phrase (`define(..., variants=...)`). The message texts are read from the source: every call
that emits a registered code (`self.report(node, CODE, message)`, `Diagnostic(CODE.code, ...)`,
the project pass's helpers, the refusals that carry a code) with its message as a literal, an
f-string (its holes read as `{}`), a conditional or `+` of those, `.format` of a literal, or a
local name (its closest assignment before the call). Each text must contain one of its code's
phrases and each phrase must be on the code's page, so a new message without its explanation
fails here. A message made elsewhere (a refusal's reason handed on) is not read; its code's
fixed text around it still is (test_corpus_invariants.py holds every message the golden cases
emit to its code's phrases).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from amp_migrate import docs
from amp_migrate.diagnostics import CODES

PACKAGE = Path(docs.__file__).resolve().parent


@dataclass(frozen=True)
class Site:
    path: str
    line: int
    code: str
    templates: tuple  # texts with "{}" for holes; None in the tuple: unknown text; "" : summary


def _code_constants(trees):
    found = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "define"
            ):
                found[node.targets[0].id] = node.value.args[0].value
    return found


def _code_of(arg, constants):
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    if isinstance(arg, ast.Attribute):
        if arg.attr in constants:
            return constants[arg.attr]
        if arg.attr == "code":
            return _code_of(arg.value, constants)
    return None


def _message_arg(call, index):
    """The message argument of an emit call whose code is argument `index`."""
    name = ast.unparse(call.func).rsplit(".", 1)[-1]
    rest = call.args[index + 1 :]
    if name == "Diagnostic":
        return call.args[4] if len(call.args) > 4 else "?"
    if name == "_diagnostic":
        return call.args[-1]
    if name == "_Refused":
        return call.args[2]
    if name in ("report", "fixed", "Refused"):
        for kw in call.keywords:
            if kw.arg in ("message", "why", "reason"):
                return kw.value
        return rest[0] if rest else None
    return "?"


def _arms(function) -> dict[int, set[tuple[int, str]]]:
    """For each node, the `if` arms it sits in: (id of the `if`, "body" or "orelse")."""
    out: dict[int, set[tuple[int, str]]] = {}
    stack = [(function, frozenset())]
    while stack:
        node, arms = stack.pop()
        out[id(node)] = set(arms)
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            inner = arms | {(id(node), field)} if isinstance(node, ast.If) and field != "test" else arms
            stack.extend((c, inner) for c in children if isinstance(c, ast.AST))
    return out


class _Templates:
    """The texts a message expression can have, read as far as the function around it shows."""

    def __init__(self, function, call):
        found: dict[str, list[ast.Assign]] = {}
        for node in ast.walk(function) if function is not None else ():
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                found.setdefault(node.targets[0].id, []).append(node)
        # A name's texts are its assignments that can reach the call: before it, and not in
        # the other arm of an `if` the call is in.
        arms = _arms(function) if function is not None else {}
        here = arms.get(id(call), set())
        self.assigned = {}
        for name, nodes in found.items():
            reach = [
                n
                for n in nodes
                if not any(
                    (i, a) not in here and any(i == j for j, _ in here) for i, a in arms.get(id(n), ())
                )
            ]
            before = [n for n in reach if n.lineno < call.lineno]
            self.assigned[name] = [n.value for n in (before or reach or nodes)]

    def of(self, expr, depth=0):
        if expr is None:
            return [""]
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.Constant) and expr.value is None:
            return [""]
        if isinstance(expr, ast.JoinedStr):
            parts = []
            for value in expr.values:
                if isinstance(value, ast.Constant):
                    parts.append([value.value])
                else:
                    inner = self.of(value.value, depth + 1) if depth < 3 else [None]
                    parts.append(["{}" if t is None else t for t in inner])
            return ["".join(p) for p in itertools.product(*parts)]
        if isinstance(expr, ast.IfExp):
            return self.of(expr.body, depth) + self.of(expr.orelse, depth)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = self.of(expr.left, depth), self.of(expr.right, depth)
            return [("{}" if a is None else a) + ("{}" if b is None else b) for a in left for b in right]
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format":
            return self.of(expr.func.value, depth)
        if isinstance(expr, ast.Attribute) and expr.attr == "summary":
            return [""]
        if isinstance(expr, ast.Name) and expr.id in self.assigned and depth < 3:
            return [t for value in self.assigned[expr.id] for t in self.of(value, depth + 1)]
        return [None]


def sites() -> list[Site]:
    """Every call in amp_migrate/ that passes a registered code, with its message's texts."""
    trees = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    constants = _code_constants(trees)
    out = []
    for path, tree in trees.items():
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or ast.unparse(node.func) == "define":
                continue
            for index, arg in enumerate(node.args):
                code = _code_of(arg, constants)
                if code is None:
                    continue
                message = _message_arg(node, index)
                if message == "?":
                    break
                owner = min(
                    (f for f in functions if f.lineno <= node.lineno <= f.end_lineno),
                    key=lambda f: f.end_lineno - f.lineno,
                    default=None,
                )
                out.append(
                    Site(
                        str(path.relative_to(PACKAGE.parent)),
                        node.lineno,
                        code,
                        tuple(_Templates(owner, node).of(message)),
                    )
                )
                break
    return out


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


SITES = sites()
TEMPLATES: dict[str, set[str]] = defaultdict(set)
UNREAD: dict[str, list[str]] = defaultdict(list)
for _site in SITES:
    for _text in _site.templates:
        if _text is None or not re.search("[a-z]", _text.replace("{}", ""), re.I):  # no words of its own
            UNREAD[_site.code].append(f"{_site.path}:{_site.line}")
        elif _text:
            TEMPLATES[_site.code].add(_text)
for _code, _texts in TEMPLATES.items():
    # `kept: {}`, `..., but ` + a reason made elsewhere: the general form of its specific ones.
    for _text in list(_texts):
        _head = _text.removesuffix("{}")
        if any(t != _text and t.startswith(_head) for t in _texts):
            _texts.discard(_text)
            UNREAD[_code].append(_text)
docs.register_all_codes()


def test_the_scan_finds_the_emitting_calls():
    """Not vacuous: most codes are found with their message texts, AMP102's four among them."""
    assert len({s.code for s in SITES}) > 100
    assert len([c for c, t in TEMPLATES.items() if len(t) > 1]) > 20
    found = " | ".join(sorted(TEMPLATES["AMP102"]))
    for words in (
        "called more than once",
        "goes with the `amp.initialize` here",
        "is not called in this file",
    ):
        assert words in found


@pytest.mark.parametrize("code", sorted(c for c, t in TEMPLATES.items() if len(t) > 1 or CODES[c].variants))
def test_every_message_variant_is_described_by_its_explain_page(code: str):
    entry = CODES[code]
    texts = sorted(TEMPLATES[code])
    assert entry.variants, (
        f"{code} emits {len(texts)} different messages; declare what tells them apart "
        f"(define(..., variants=(...))) and describe each in its why: {texts}"
    )
    page = _norm(docs.render_code(entry))
    phrases = [_norm(v) for v in entry.variants]
    missing = [v for v, p in zip(entry.variants, phrases) if p not in page]
    assert not missing, f"{code}: `amp-migrate explain {code}` does not describe {missing}"
    unmatched = [t for t in texts if not any(p in _norm(t) for p in phrases)]
    assert not unmatched, f"{code}: these messages match none of its variants {entry.variants}: {unmatched}"
    if code not in UNREAD:
        stale = [v for v, p in zip(entry.variants, phrases) if not any(p in _norm(t) for t in texts)]
        assert not stale, f"{code}: no message carries {stale}"
