"""No module of amp_migrate or amp_shim imports one that imports it back.

An import inside a function counts: a lazy import that closes a cycle still ties the two modules
together (neither can be read, changed or tested without the other), it only hides the tie from
the import-time error. Imports under `if TYPE_CHECKING:` do not count: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"amp_migrate": ROOT / "amp_migrate", "amp_shim": ROOT / "shim" / "amp_shim"}


def _module_names(package: Path) -> dict[str, Path]:
    names = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                walk(other)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level:
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        named = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
    out = set()
    for name in named:
        parts = name.split(".")
        # importing a.b.c runs a and a.b first
        for n in range(1, len(parts) + 1):
            candidate = ".".join(parts[:n])
            if candidate in known and not module.startswith(candidate + ".") and candidate != module:
                out.add(candidate)
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    modules = _module_names(package)
    known = set(modules)
    return {
        name: set().union(
            *(
                _targets(name, path.name == "__init__.py", node, known)
                for node in _imports(ast.parse(path.read_text()))
            )
        )
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_no_module_imports_one_that_imports_it_back(name):
    graph = import_graph(PACKAGES[name])
    described = [" <-> ".join(component) for component in cycles(graph)]
    assert described == [], "import cycles:\n" + "\n".join(described)


def test_a_cycle_closed_by_an_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b"]]
