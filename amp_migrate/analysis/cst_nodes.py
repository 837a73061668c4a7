"""Reading a libcst tree's children from its fields, for read-only passes that need no visitor."""

from __future__ import annotations

import dataclasses
import re

import libcst as cst

_FIELDS: dict[type, tuple[str, ...]] = {}
# Fields that hold only whitespace, comments and punctuation: nothing a read-only pass asks about.
_LAYOUT_FIELD = re.compile(
    r"^(whitespace|lpar|rpar|comma|semicolon|leading_lines|trailing_whitespace"
    r"|lines_after_decorators|header|footer|equal|colon|dot|operator|asynchronous"
    r"|first_line|empty_lines|last_line|newline|lbracket|rbracket|lbrace|rbrace)"
)


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """A node's children that can hold code, read from its fields. (`CSTNode.children` and
    `CSTNode.visit` rebuild every node they pass; a read-only walk has no need to.) Field
    order, which is source order but for a few nodes (a function's decorators come after its
    body)."""
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(
            f.name for f in dataclasses.fields(node) if not _LAYOUT_FIELD.match(f.name)
        )
    out: list[cst.CSTNode] = []
    for name in names:
        value = getattr(node, name)
        kind = type(value)
        if kind is tuple or kind is list:
            out.extend(v for v in value if is_node(v))
        elif is_node(value):
            out.append(value)
    return out


_NODE_TYPES: dict[type, bool] = {}


def is_node(value: object) -> bool:
    """`isinstance(value, cst.CSTNode)`, without the ABC machinery's cost on every call."""
    kind = type(value)
    known = _NODE_TYPES.get(kind)
    if known is None:
        known = _NODE_TYPES[kind] = isinstance(value, cst.CSTNode)
    return known
