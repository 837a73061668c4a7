"""The statements of a tree, read through statement bodies only (no expression holds one)."""

from __future__ import annotations

from typing import Callable, Optional

import libcst as cst

BLOCKS = (
    cst.Module,
    cst.BaseCompoundStatement,
    cst.IndentedBlock,
    cst.Else,
    cst.ExceptHandler,
    cst.Finally,
    cst.MatchCase,
) + ((cst.ExceptStarHandler,) if hasattr(cst, "ExceptStarHandler") else ())


STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
_SUITES = ("body", "handlers", "orelse", "finalbody", "cases")  # in libcst's visiting order


def find_statements(tree: cst.CSTNode, kind: type) -> list:
    """`m.findall(tree, m.<Kind>())` for a statement type (`cst.With`, `cst.ImportFrom`, ...),
    in the same order, reading statement bodies only: no expression holds a statement."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            found.append(node)
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            found.extend(small for small in node.body if isinstance(small, kind))
            continue
        if not isinstance(node, BLOCKS + (cst.BaseSuite,)):
            continue
        inner: list[cst.CSTNode] = []
        for name in _SUITES:
            value = getattr(node, name, None)
            if isinstance(value, (list, tuple)):
                inner.extend(value)
            elif isinstance(value, cst.CSTNode):
                inner.append(value)
        stack.extend(reversed(inner))
    return found


def is_elif(node: cst.CSTNode, parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]]) -> bool:
    """Whether `node` is the `elif` of an `if` chain: the chain is one statement, so an `elif`
    is no statement of a block; nothing can stand before or after it alone, and its body runs
    only where the tests above it failed too."""
    return isinstance(node, cst.If) and isinstance(parent(node), cst.If)
