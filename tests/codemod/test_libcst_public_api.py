"""The codemod uses libcst's public API only, so a libcst release within the pinned major
cannot break it through a renamed internal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "amp_migrate"


def _private_libcst_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("cst", "libcst")
        ):
            names = [f"libcst.{node.attr}"]
        for name in names:
            parts = name.split(".")
            if parts[0] == "libcst" and any(p.startswith("_") for p in parts[1:]):
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.slow
def test_no_module_of_the_codemod_reaches_into_libcst_internals():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = _private_libcst_imports(ast.parse(path.read_text(encoding="utf-8")))
        if found:
            offenders[str(path.relative_to(PACKAGE.parent))] = found
    assert offenders == {}
