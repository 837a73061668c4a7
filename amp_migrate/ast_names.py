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
