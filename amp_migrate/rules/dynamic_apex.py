"""Apex reached dynamically (`importlib.import_module("apex.amp")`, `exec("from apex import
amp")`, `getattr(amp, name)`) → reported; the file keeps its Apex names (the shim).

What it does
    Reports each call that reaches Apex by a name the code spells only as a string or computes
    at run time: `importlib.import_module` and `__import__` of an Apex module (a literal name,
    an f-string or concatenation that starts with `apex.`, or a relative name under an Apex
    `package=`), `exec`/`eval`/`compile` of source text that names `apex` or a name the file's
    Apex imports bind, and `getattr`/`setattr`/`delattr` on an Apex import with an attribute
    name that is not a literal. Nothing is rewritten; `--check` counts the file.

Why
    Every rule acts on what an import statement binds and on the attributes the code spells.
    A string is neither: the codemod cannot see which Apex API such a call reaches, so it can
    neither rewrite it nor prove that a native rewrite of the rest of the file leaves it
    working (`exec("amp.initialize(model)")` needs the `amp` a native rewrite removes).
    Rewriting the string would only move the problem. So the file keeps every Apex name it
    binds, which the shim provides, and the call itself is left for a person to replace with
    an import statement and plain attribute reads.

    `importlib.util.find_spec("apex")` (and other "is Apex installed?" questions) is not
    reported: it runs none of Apex, and the availability rule answers such checks. Neither is
    a call whose string is computed entirely at run time (`import_module(name)`): nothing in
    the file says that it is Apex.

Soundness
    Report only: the rule changes no code. Its code falls back, so `--target auto` gives the
    file the shim (every Apex name stays bound, with Apex's behaviour) rather than a native
    rewrite that the dynamic use might not survive, and `--target native` refuses the file.

Fix safety
    No fix. Replace the dynamic use by an import statement and attribute reads the
    codemod can see, then run amp-migrate again; or run the script with `amp-migrate run`, which
    makes `apex` import the shim.

Example
    amp = importlib.import_module("apex.amp")
    exec("from apex import amp")
    scale = getattr(amp, name)
are reported and left as they are.
"""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.helpers import get_full_name_for_node

from ..analysis.binding import APEX, is_apex_name
from ..analysis.dynamic_apex import CALL_TEXT, CALL_WORDS, dynamic_apex_use, importer_aliases
from ..diagnostics import Severity, define
from .base import FileState, Rule
from .facts import Fact

DYNAMIC_USE = define(
    "AMP035",
    "dynamic-apex-use",
    Severity.WARNING,
    'Apex is reached by a name known only at run time (`importlib.import_module("apex.amp")`, '
    '`exec("from apex import amp")`, `getattr(amp, name)`): dynamic Apex use; not migrated.',
    "The codemod rewrites what import statements bind and the attributes the code spells; a "
    "module name in a string, source text run by `exec`/`eval`, or an attribute name computed "
    "at run time hides which Apex API is reached, so the call cannot be rewritten and a native "
    'rewrite of the rest of the file could break it (`exec("amp.initialize(model)")` needs '
    "the `amp` that a native rewrite removes). The call is left as it is and the file keeps its "
    "Apex names through the shim; `--check` counts it. Replace the call by an import statement "
    "and plain attribute reads, then run amp-migrate again (or run the script unchanged with "
    '`amp-migrate run`). `importlib.util.find_spec("apex")` only asks whether Apex is '
    "installed and is not reported.",
    before='amp = importlib.import_module("apex.amp")\nexec("from apex import amp")\n'
    "scale = getattr(amp, name)",
    after="# unchanged: each line is reported",
    falls_back=True,
    refusal="the code reaches Apex by a name known only at run time",
    variants=("dynamic Apex use",),
    fallback_title="Apex reached by a name known only at run time",
    shape=(
        '`importlib.import_module("apex.amp")`, `exec("from apex import amp")`, '
        '`eval("amp.initialize(model)")`, `getattr(amp, name)` with a computed name.'
    ),
    by_hand=(
        "Replace the call by an import statement and plain attribute reads (`from apex import amp`, "
        "`amp.scale_loss(...)`), then re-run; or run the script unchanged with `amp-migrate run`."
    ),
)

#: Builtins that read or change an attribute named by their second argument.
_ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "delattr"})
_SHOWN = 60  # characters of a call quoted in a message


def _literal_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        return True
    if isinstance(node, cst.ConcatenatedString):
        return _literal_string(node.left) and _literal_string(node.right)
    return False


class DynamicApexUses(Rule):
    """Report Apex reached through strings and run-time attribute names."""

    # Nothing is rewritten, so no Apex name is handled; what is reported is a call shape.
    HANDLES = ()
    EMITS = (DYNAMIC_USE,)
    READS = frozenset[Fact]()
    WRITES = frozenset({Fact.FALLBACK_REASONS})

    @classmethod
    def applies(cls, state, context) -> bool:
        text = state.original
        return super().applies(state, context) and (
            CALL_TEXT.search(text) is not None or any(word in text for word in _ATTRIBUTE_BUILTINS)
        )

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        super().__init__(context, state)
        #: Local names of `importlib.import_module` (`from importlib import import_module as load`).
        self._importers = importer_aliases(state.index.imports()) if state.index is not None else frozenset()

    def interest(self) -> frozenset[str]:
        return CALL_WORDS | _ATTRIBUTE_BUILTINS | self._importers

    def _apex_words(self) -> frozenset[str]:
        """`apex` and the local names the file's Apex imports bind (not torch's deprecated
        `amp`): the words that name Apex in source text run by `exec`/`eval`."""
        assert self.apex is not None
        table = self.apex.table
        names = {n for n in self.apex.imported if table is None or is_apex_name(table.get(n, ""))}
        return frozenset(names | {APEX})

    def visit_Call(self, node: cst.Call) -> None:
        name = get_full_name_for_node(node.func)
        if name is None:
            return
        found = (
            self._attribute_use(node, name) if name in _ATTRIBUTE_BUILTINS else self._string_use(node, name)
        )
        if found is not None:
            shown = " ".join(self.code_of(node).split())
            shown = shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."
            self.report(
                node,
                DYNAMIC_USE,
                f"`{shown}` {found}: dynamic Apex use; not migrated "
                "(the codemod cannot see which Apex API it reaches)",
            )

    def _attribute_use(self, node: cst.Call, name: str) -> Optional[str]:
        """`getattr(amp, name)`: an Apex import's attribute, named at run time."""
        if len(node.args) < 2 or any(a.star or a.keyword is not None for a in node.args[:2]):
            return None
        target, attribute = node.args[0].value, node.args[1].value
        if _literal_string(attribute):
            return None
        assert self.apex is not None
        reached = self.apex.imported_name(target)
        if reached is None or not is_apex_name(reached):
            return None
        return f"{'reads' if name == 'getattr' else 'changes'} an attribute of `{reached}` named at run time"

    def _string_use(self, node: cst.Call, name: str) -> Optional[str]:
        last = name.rsplit(".", 1)[-1]
        if last not in CALL_WORDS and name not in self._importers:
            return None
        try:
            call = ast.parse(f"(\n{self.code_of(node)}\n)", mode="eval").body
        except (SyntaxError, ValueError):
            return None
        if not isinstance(call, ast.Call):
            return None
        return dynamic_apex_use(call, self._apex_words(), self._importers)
