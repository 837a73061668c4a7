"""Which libcst node types can hold which: read from the node classes' field annotations.

A rule visit enters only the nodes whose subtree can hold a node the rule has a handler for;
what it cannot reach, it leaves as it is (libcst rebuilds every node a transformer enters, so
not entering a subtree is most of what a visit costs)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Iterable

import libcst as cst

#: Every concrete node class of libcst's public namespace.
NODE_TYPES: frozenset[type] = frozenset(
    c
    for c in vars(cst).values()
    if isinstance(c, type)
    and issubclass(c, cst.CSTNode)
    and dataclasses.is_dataclass(c)
    and not getattr(c, "__abstractmethods__", None)  # abstract bases are never in a tree
)


def concrete(types: Iterable[type]) -> frozenset[type]:
    """The concrete node classes that are one of `types` or derive from one."""
    wanted = tuple(types)
    return frozenset(c for c in NODE_TYPES if issubclass(c, wanted)) if wanted else frozenset()


def _annotated(annotation: object, out: set[type]) -> None:
    if typing.get_origin(annotation) is None:
        if isinstance(annotation, type) and issubclass(annotation, cst.CSTNode):
            out |= concrete([annotation])
        return
    for argument in typing.get_args(annotation):
        _annotated(argument, out)


@functools.lru_cache(maxsize=None)
def child_types(node_type: type) -> frozenset[type]:
    """The node types the fields of `node_type` can hold directly."""
    hints = typing.get_type_hints(node_type, vars(cst))
    out: set[type] = set()
    for f in dataclasses.fields(node_type):
        _annotated(hints.get(f.name), out)
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def holders_of(types: frozenset[type]) -> frozenset[type]:
    """The node types that are one of `types` or whose subtree can hold one: the least set
    closed under "has a field that can hold a member"."""
    holders = set(types)
    grew = True
    while grew:
        grew = False
        for node_type in NODE_TYPES - holders:
            if not child_types(node_type).isdisjoint(holders):
                holders.add(node_type)
                grew = True
    return frozenset(holders)
