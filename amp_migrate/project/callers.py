"""How one module of a tree names a module-level function of another.

The project pass asks it in three places: which way a user calls its owner's builder
(share.py), which calls carry the scaler's switch into a user's function (entry_switch.py), and
whether a program that only prepares models for inference calls a function that uses Apex
(inference_owners.py). Read on Python's `ast`, as the index is.
"""

from __future__ import annotations

import ast

from ..analysis.ast_names import dotted_chain
from .index import Import, ProjectIndex

STAR = "*"  # `from target import *`: every public name, the function's included


def callee_names(index: ProjectIndex, importer: str, tree: ast.Module, target: str, name: str) -> set[str]:
    """Each way `importer` spells the function `name` of `target`: `name` (or its alias)
    imported from it, `module.name` through an import of the module, or `*` for a star import
    of it. Empty where it names it no way the imports show."""
    resolver = index.resolver
    found: set[str] = set()
    if resolver is None:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imp = Import(node.module or "", tuple(a.name for a in node.names), node.level)
            module = resolver.relative_module(importer, imp) if node.level else None
            from_target = (
                module is not None and resolver.by_name.get(module) == target
                if node.level
                else target in resolver.lookup(importer, node.module or "")
            )
            for alias in node.names:
                if from_target and alias.name in (name, STAR):
                    found.add(alias.asname or alias.name)
                elif (
                    target in resolver.targets(importer, Import(imp.module, (alias.name,), node.level))
                    and not from_target
                ):
                    found.add(f"{alias.asname or alias.name}.{name}")
        elif isinstance(node, ast.Import):
            found.update(
                f"{a.asname or a.name}.{name}"
                for a in node.names
                if target in resolver.lookup(importer, a.name)
            )
    return found


def dotted(node: ast.AST) -> str:
    """`a.b.c` for a chain of attributes on a name, else ""."""
    return dotted_chain(node) or ""


def mentions(tree: ast.Module, names: set[str]) -> list[ast.AST]:
    """The names or attribute chains of `tree` spelled as one of `names` (a star import counts
    as naming everything)."""
    if STAR in names:
        return [tree]
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in names]
