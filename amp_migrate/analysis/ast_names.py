"""Names as Python's `ast` spells them, for the passes that read `ast` rather than libcst."""

from __future__ import annotations

import ast
from typing import Optional


def dotted_chain(node: ast.AST) -> Optional[str]:
    """`a.b.c` for a chain of attributes on a name (`self.amp` included), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _bound_names(node: ast.AST) -> list[str]:
    """The names `node` binds (or may bind, for `global`/`nonlocal` declarations), other than
    through an import."""
    if isinstance(node, ast.Name):
        return [] if isinstance(node.ctx, ast.Load) else [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.ExceptHandler):
        return [node.name] if node.name else []
    if type(node).__name__ in _CAPTURING_PATTERNS:  # `case x`, `case [*x]`, `case {**x}`
        name = getattr(node, "name", None) or getattr(node, "rest", None)
        return [name] if isinstance(name, str) else []
    return []


#: The match patterns that bind a name (by name: `ast` has them from Python 3.10 on).
_CAPTURING_PATTERNS = frozenset({"MatchAs", "MatchStar", "MatchMapping"})


def module_only_names(module: str, nodes: list[ast.AST]) -> frozenset[str]:
    """The names that can only ever hold `module` in this file: bound by `import module` or
    `import module as name`, and by nothing else anywhere (no other import, store, parameter,
    definition, handler or pattern binds them; no `*` import could). `nodes` are the file's nodes
    as `source_index.walk_ast` gives them."""
    imported: set[str] = set()
    other: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                (imported if alias.name == module else other).add(bound)
        elif isinstance(node, ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return frozenset()
            other.update(alias.asname or alias.name for alias in node.names)
        else:
            other.update(_bound_names(node))
    return frozenset(imported - other)
