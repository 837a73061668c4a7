"""`try:` statements around an Apex import, and what is left of one once the import goes.

A native file imports `torch.amp`, which ships with torch, so the handler of a `try:` whose
body held only Apex imports (and flag assignments) can never run again: what it did, report
that Apex is missing, is dead. These helpers say when the whole statement can go and what
must stand in its place; the rule that removes the imports decides when to ask.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union, cast

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from ..analysis.binding import is_apex_name

_CONSTANT = m.OneOf(
    m.Name("True"),
    m.Name("False"),
    m.Name("None"),
    m.Integer(),
    m.Float(),
    m.SimpleString(),
    m.UnaryOperation(operator=m.Minus(), expression=m.Integer() | m.Float()),
)
#: A method of a logger (`logger.warning`, `self.log.info`, `logging.getLogger(...).error`).
_LOG_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"}
)
#: Calls that only tell the user something (print, a warning), or stop the program, as a
#: `raise` does, because Apex is missing.
_REPORTERS = frozenset(
    {"print", "warn", "warnings.warn", "sys.stderr.write", "sys.stdout.write", "sys.exit", "exit", "quit"}
)

Statement = Union[cst.BaseStatement, cst.BaseSmallStatement]


def apex_import(stmt: cst.CSTNode) -> bool:
    """A line (or a small statement) that only imports Apex modules or names from them."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(apex_import(s) for s in stmt.body)
    if isinstance(stmt, cst.Import):
        return all(is_apex_name(get_full_name_for_node(a.name) or "") for a in stmt.names)
    if isinstance(stmt, cst.ImportFrom):
        return (
            not stmt.relative
            and stmt.module is not None
            and is_apex_name(get_full_name_for_node(stmt.module) or "")
        )
    return False


def _smalls(stmt: Statement) -> Optional[Sequence[cst.BaseSmallStatement]]:
    """The small statements of a line (or the one given); None for a compound statement."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt.body
    if isinstance(stmt, cst.BaseSmallStatement):
        return [stmt]
    return None


def flag(small: cst.CSTNode) -> bool:
    """`NAME = <constant>` (or `A = B = <constant>`): it cannot raise and does nothing else."""
    return (
        isinstance(small, cst.Assign)
        and all(isinstance(t.target, cst.Name) for t in small.targets)
        and m.matches(small.value, _CONSTANT)
    )


def _reports(call: cst.Call) -> bool:
    name = get_full_name_for_node(call.func)
    if name is None:
        return False
    parts = name.split(".")
    if name in _REPORTERS or (parts[0] == "logging" and len(parts) == 2):
        return True
    return len(parts) >= 2 and parts[-1] in _LOG_METHODS and "log" in parts[-2].lower()


def _only_reporting(small: cst.BaseSmallStatement) -> bool:
    """What a handler does that only says Apex is missing: pass, print, warn, log, raise or
    exit, or set a flag. Anything else (an import of a fallback, a definition, a call of the
    program's own) is the author's, to read and remove by hand: it keeps the handler."""
    if isinstance(small, (cst.Pass, cst.Raise)) or flag(small):
        return True
    if isinstance(small, cst.Expr):
        value = small.value
        return isinstance(value, (cst.SimpleString, cst.Ellipsis)) or (
            isinstance(value, cst.Call) and _reports(value)
        )
    return False


def statements(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    """A block's statements, as lines where the block is on its header's line."""
    if isinstance(suite, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(list(suite.body))] if suite.body else []
    return list(cast(cst.IndentedBlock, suite).body)


def reports_only(suite: cst.BaseSuite) -> bool:
    """Every statement of the block only reports (see `_only_reporting`)."""
    for stmt in suite.body:
        smalls = _smalls(stmt)
        if smalls is None or not all(_only_reporting(s) for s in smalls):
            return False
    return True


def settled_try(
    original: cst.Try, updated: cst.Try, unused: Callable[[cst.CSTNode], bool]
) -> Union[cst.Try, cst.FlattenSentinel, cst.RemovalSentinel, None]:
    """What stands in place of `try: <Apex imports, flags, pass> except ...: <reports>` once the
    imports go (None: the statement stays as it is). `original` is the statement before the
    imports are removed, `updated` after; `unused(line)`: no read of that import is left.

    Sound because what remains of the body (`pass`, `NAME = <constant>`) cannot raise: no
    handler can run, so the handlers go, and the `else:` arm, which ran whenever the body
    did not raise, now always runs, in the try's place. Exceptions the `else:` arm raises were
    never caught by the handlers, so moving it out changes nothing. A `finally:` arm keeps its
    `try:` around the `else:` statements (it must still run when they raise); with no `else:`
    it follows the flags, which cannot raise. Flags the body set stay as plain statements:
    the value the handler gave them can no longer be assigned, and every read still finds
    them bound."""
    body = cast(Sequence[Statement], original.body.body)
    imports = [s for s in body if apex_import(s)]
    if not imports or not all(unused(s) for s in imports) or not original.handlers:
        return None
    flags: list[cst.BaseStatement] = []
    for stmt in body:
        if any(stmt is i for i in imports):
            continue
        smalls = _smalls(stmt)
        if smalls is None or not all(isinstance(s, cst.Pass) or flag(s) for s in smalls):
            return None
        kept = [s for s in smalls if not isinstance(s, cst.Pass)]
        if kept:
            line = stmt if isinstance(stmt, cst.SimpleStatementLine) else cst.SimpleStatementLine(())
            flags.append(line.with_changes(body=kept))
    if not all(reports_only(h.body) for h in original.handlers):
        return None
    after = statements(updated.orelse.body) if updated.orelse is not None else []
    if updated.finalbody is not None and after:
        block = cst.IndentedBlock(body=flags + after)
        return updated.with_changes(body=block, handlers=(), orelse=None)
    if updated.finalbody is not None:
        after = statements(updated.finalbody.body)
    return _in_place(updated, flags + after)


def _in_place(
    node: cst.Try, kept: list[cst.BaseStatement]
) -> Union[cst.FlattenSentinel, cst.RemovalSentinel]:
    if not kept:
        return cst.RemoveFromParent()
    first = kept[0]
    if isinstance(first, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):  # every statement is
        kept[0] = first.with_changes(leading_lines=(*node.leading_lines, *first.leading_lines))
    return cst.FlattenSentinel(kept)
