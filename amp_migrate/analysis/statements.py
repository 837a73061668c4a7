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


def _base_name(target: cst.CSTNode) -> set[str]:
    """The variables an assignment target binds or mutates: `a`, `a, b`, and the `x` of
    `x.attr = ...` and `x[i] = ...`."""
    while isinstance(target, (cst.Attribute, cst.Subscript)):
        target = target.value
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_base_name(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _base_name(target.value)
    return set()


def changed_names(tree: cst.CSTNode) -> set[str]:
    """Every variable that running `tree` may bind, rebind or mutate by assignment (nested
    functions and classes included, for safety): the targets of assignments, augmented and
    annotated assignments, `for`, `with ... as`, `:=`, `del`, imports, and `def`/`class` names."""
    found: set[str] = set()
    for node in [tree, *_descendants(tree)]:
        if isinstance(node, cst.AssignTarget):
            found |= _base_name(node.target)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr)):
            found |= _base_name(node.target)
        elif isinstance(node, (cst.For, cst.CompFor)):
            found |= _base_name(node.target)
        elif isinstance(node, cst.AsName):
            found |= _base_name(node.name)
        elif isinstance(node, cst.Del):
            found |= _base_name(node.target)
        elif isinstance(node, cst.ImportAlias):
            found.add(
                cst.ensure_type(node.asname.name, cst.Name).value
                if node.asname
                else node.evaluated_name.split(".")[0]
            )
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            found.add(node.name.value)
    return found


def _descendants(tree: cst.CSTNode) -> list[cst.CSTNode]:
    out, stack = [], list(tree.children)
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children)
    return out


def if_without_else_around(
    block: Optional[cst.CSTNode], parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]]
) -> Optional[cst.If]:
    """The `if cond:` with no `elif`/`else` whose body is `block`, where that `if` is itself a
    statement of a block (not an `elif`); None otherwise."""
    owner = parent(block) if isinstance(block, cst.IndentedBlock) else None
    if (
        isinstance(owner, cst.If)
        and owner.body is block
        and owner.orelse is None
        and not is_elif(owner, parent)
    ):
        return owner
    return None
