"""The statements of a tree, read through statement bodies only (no expression holds one)."""

from __future__ import annotations

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
