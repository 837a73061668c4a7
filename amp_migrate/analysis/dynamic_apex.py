"""Apex reached by a name spelled in a string: `importlib.import_module("apex.amp")`,
`__import__("apex")`, `exec("from apex import amp")`, `eval("apex.amp")`.

No import statement binds what such a call reaches, so the rules cannot see it; yet a file
whose only Apex is one of these still needs Apex. Both the cheap test of whether a file is
worth parsing (migrate.touches_apex) and the rule that reports the calls
(rules/dynamic_apex.py) read calls through this one module, so that the two cannot disagree
about which calls count.

Not counted: `importlib.util.find_spec("apex")` and the like, which ask whether Apex is
installed without running any of it (the availability rule answers those natively), and
calls whose string is computed entirely at run time (`import_module(name)`): nothing in the
file says it is Apex.
"""

from __future__ import annotations

import ast
import re
from typing import AbstractSet, Iterable, Optional

from .ast_names import dotted_chain
from .binding import APEX

#: Builtins that run source text: `exec(text)`, `eval(text)`, `compile(text, ...)`.
CODE_RUNNERS = frozenset({"exec", "eval", "compile"})
#: Functions that import a module named by a string (`importlib.import_module`, `__import__`).
IMPORTERS = frozenset({"import_module", "__import__"})
#: Words a statement must spell to hold one of these calls (aliases of `import_module` aside).
CALL_WORDS = CODE_RUNNERS | IMPORTERS

#: A cheap text test: the file spells a call that may run or import Apex by name.
CALL_TEXT = re.compile(r"\b(?:exec|eval|compile|import_module|__import__)\b")


def importer_aliases(imports: Iterable[ast.Import | ast.ImportFrom]) -> frozenset[str]:
    """Local names bound to `importlib.import_module` (`from importlib import import_module
    as load`), which a call spells instead of `import_module`."""
    found: set[str] = set()
    for node in imports:
        if isinstance(node, ast.ImportFrom) and node.module == "importlib" and not node.level:
            found.update(a.asname for a in node.names if a.name == "import_module" and a.asname)
    return frozenset(found)


def _literal_parts(node: Optional[ast.AST]) -> tuple[str, bool]:
    """The text a string expression spells literally, and whether that is all of it:
    `"apex.amp"` → ("apex.amp", True), `f"apex.{x}"` and `"apex." + x` → ("apex.", False).
    Parts after a computed one are joined with a space, so no word spans the gap."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        value = node.value
        return (value.decode("latin-1") if isinstance(value, bytes) else value), True
    if isinstance(node, ast.JoinedStr):
        texts = [
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else " " for v in node.values
        ]
        return "".join(texts), all(isinstance(v, ast.Constant) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, left_whole = _literal_parts(node.left)
        right, right_whole = _literal_parts(node.right)
        return left + (right if left_whole else " " + right), left_whole and right_whole
    return " ", False


def _argument(call: ast.Call, position: int, keyword: str) -> Optional[ast.AST]:
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _names_apex_module(node: Optional[ast.AST]) -> Optional[str]:
    """The Apex module (or its literal start) a module-name argument spells, else None."""
    text, whole = _literal_parts(node)
    if text == APEX or text.startswith(APEX + "."):
        return text if whole else text.split(" ", 1)[0] + "<run-time part>"
    return None


def _imported(call: ast.Call) -> Optional[str]:
    """The Apex module an importer call names: its name, or a relative name under an Apex
    `package=` (`import_module(".amp", "apex")`)."""
    name = _argument(call, 0, "name")
    found = _names_apex_module(name)
    if found is not None:
        return found
    text, _ = _literal_parts(name)
    if text.startswith("."):
        package = _names_apex_module(_argument(call, 1, "package"))
        if package is not None:
            return package + text
    return None


def _words(names: AbstractSet[str]) -> re.Pattern:
    return re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, names))) + r")\b")


def dynamic_apex_use(
    call: ast.Call, names: AbstractSet[str] = frozenset({APEX}), importers: AbstractSet[str] = frozenset()
) -> Optional[str]:
    """What `call` does with Apex by a name in a string, in words for a diagnostic (None: it
    does nothing of the kind). `names`: the words that name Apex in source text run by
    `exec`/`eval`/`compile` (`apex`, and the local names the file's Apex imports bind);
    `importers`: local aliases of `importlib.import_module`."""
    callee = dotted_chain(call.func)
    if callee is None:
        return None
    last = callee.rsplit(".", 1)[-1]
    if last in CODE_RUNNERS and (callee == last or callee == f"builtins.{last}"):
        text, _ = _literal_parts(_argument(call, 0, "source"))
        found = _words(names or {APEX}).search(text)
        if found is not None:
            return f"runs source text that names `{found.group(0)}`"
        return None
    if last in IMPORTERS or callee in importers:
        module = _imported(call)
        if module is not None:
            return f"imports `{module}` by name at run time"
    return None
