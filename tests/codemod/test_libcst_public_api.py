"""The codemod uses libcst's public API only, so a libcst release within the pinned range
cannot break it through a renamed internal.

What counts as private is computed from libcst itself: every non-dunder `_` name in `dir()`
of the classes and modules that `libcst`, `libcst.codemod`, `libcst.metadata`,
`libcst.matchers` and `libcst.codemod.visitors` export, plus the `self._x` attributes that the
source files of those classes (and of their libcst bases) use, which `dir()` of a class
cannot see (`RemoveImportsVisitor._unused_imports`).

Some of those names are also the project's own private names (`_index`, `_name`,
`_imports`: libcst's scope analysis objects and `ImportAlias` have them too). Counting every
one everywhere would forbid ordinary project attributes, so a name counts where it can reach
libcst:

- in a class, a method definition or a `self._x` use counts when `_x` is private to a libcst
  class that the class, or any project class derived from it (a mixin's `self` is an
  instance of its subclass), derives from;
- any other `x._x` counts when `_x` is libcst-private and the project defines no member or
  attribute of that name on a class of its own; one it does define is taken to be the
  project's (which object `x` is, `ast` cannot tell);
- importing a `libcst._x` module or name counts, and so does `inspect` in a module that
  imports libcst: the modules that use `inspect` without importing libcst (`docs.py`,
  `shim_surface.py`) read docstrings and the shim, which hold no libcst object.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

import libcst
import libcst.codemod
import libcst.codemod.visitors
import libcst.matchers
import libcst.metadata

PACKAGE = Path(__file__).resolve().parents[2] / "amp_migrate"
EXPORTERS = (libcst, libcst.codemod, libcst.metadata, libcst.matchers, libcst.codemod.visitors)


def _private(names) -> set[str]:
    return {n for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))}


_SELF_ATTRIBUTE = re.compile(r"\bself\.(_\w+)")


@lru_cache(maxsize=None)
def _self_stores(path: str) -> frozenset[str]:
    return frozenset(_private(_SELF_ATTRIBUTE.findall(Path(path).read_text(encoding="utf-8"))))


def _assigned_on_self(cls: type) -> frozenset[str]:
    """The `self._x` attributes that the source files of `cls` and of its libcst bases use (a
    file's, not only the class's own: coarser, so it can only count more)."""
    found: frozenset[str] = frozenset()
    for base in cls.__mro__:
        path = getattr(sys.modules.get(base.__module__), "__file__", None)
        if base.__module__.startswith("libcst") and path and path.endswith(".py"):
            found |= _self_stores(path)
    return found


@lru_cache(maxsize=None)
def private_to(cls: type) -> frozenset[str]:
    """The names private to a libcst class: its `dir()` and what its instances are given."""
    return frozenset(_private(dir(cls))) | _assigned_on_self(cls)


def libcst_classes() -> set[type]:
    return {
        value
        for module in EXPORTERS
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__.startswith("libcst")
    }


@lru_cache(maxsize=None)
def libcst_private() -> frozenset[str]:
    names = {n for module in EXPORTERS for n in _private(dir(module))}
    for module in EXPORTERS:
        for value in vars(module).values():
            if isinstance(value, types.ModuleType) and value.__name__.startswith("libcst"):
                names |= _private(dir(value))
    for cls in libcst_classes():
        names |= private_to(cls)
    return frozenset(names)


def _libcst_object(dotted: str) -> Optional[object]:
    parts = dotted.split(".")
    if parts[0] != "libcst":
        return None
    obj: object = libcst
    for i, part in enumerate(parts[1:], 2):
        nxt = getattr(obj, part, None)
        if nxt is None:
            nxt = sys.modules.get(".".join(parts[:i]))
        if nxt is None:
            return None
        obj = nxt
    return obj


class Module:
    """One module of the package: what its names stand for, and its classes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.imported: dict[str, str] = {}  # local name -> dotted name it was imported as
        self.aliases: dict[str, list[ast.expr]] = {}  # `Name = <expr>` at module level
        self.imports_libcst = False
        self.imports_inspect: list[int] = []
        self.classes: list[ast.ClassDef] = []
        self.attributes: list[ast.Attribute] = []
        self.imports: list[tuple[int, str]] = []  # every module and name imported absolutely
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                self.attributes.append(node)
            elif isinstance(node, ast.ClassDef):
                self.classes.append(node)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    self.imported[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0]
                    )
                    self._note(a.name, node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.imported[a.asname or a.name] = f"{node.module}.{a.name}"
                    self.imports.append((node.lineno, f"{node.module}.{a.name}"))
                self._note(node.module, node.lineno)
        for node in self.tree.body:
            for stmt in [node, *(ast.walk(node) if isinstance(node, ast.If) else ())]:
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                ):
                    self.aliases.setdefault(stmt.targets[0].id, []).append(stmt.value)

    def _note(self, module: str, line: int) -> None:
        self.imports.append((line, module))
        top = module.split(".")[0]
        self.imports_libcst = self.imports_libcst or top == "libcst"
        if top == "inspect":
            self.imports_inspect.append(line)

    def dotted(self, expr: ast.expr) -> Optional[str]:
        if isinstance(expr, ast.Name):
            return self.imported.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute):
            head = self.dotted(expr.value)
            return None if head is None else f"{head}.{expr.attr}"
        return None


class Package:
    """The package's classes, each with the libcst classes it may be an instance of."""

    def __init__(self, root: Path) -> None:
        self.modules = [Module(p) for p in sorted(root.rglob("*.py"))]
        self.classes: dict[str, list[tuple[Module, ast.ClassDef]]] = {}
        for module in self.modules:
            for cls in module.classes:
                self.classes.setdefault(cls.name, []).append((module, cls))
        self.subclasses: dict[str, list[tuple[Module, ast.ClassDef]]] = {}
        for module in self.modules:
            for cls in module.classes:
                for base in cls.bases:
                    dotted = module.dotted(base)
                    if dotted is not None:
                        self.subclasses.setdefault(dotted.rsplit(".", 1)[-1], []).append((module, cls))

    def _expr_bases(self, module: Module, expr: ast.expr, seen: set) -> set[type]:
        dotted = module.dotted(expr)
        if dotted is None:
            return set()
        found = _libcst_object(dotted)
        if isinstance(found, type):
            return {found}
        name = dotted.rsplit(".", 1)[-1]
        out: set[type] = set()
        for value in module.aliases.get(name, ()) if isinstance(expr, ast.Name) else ():
            out |= self._expr_bases(module, value, seen)
        for owner, cls in self.classes.get(name, ()):
            out |= self.ancestors(owner, cls, seen)
        return out

    def ancestors(self, module: Module, cls: ast.ClassDef, seen: Optional[set] = None) -> set[type]:
        """The libcst classes `cls` derives from (through project classes and aliases)."""
        seen = set() if seen is None else seen
        if id(cls) in seen:
            return set()
        seen.add(id(cls))
        out: set[type] = set()
        for base in cls.bases:
            out |= self._expr_bases(module, base, seen)
        return out

    def reach(self, module: Module, cls: ast.ClassDef) -> frozenset[str]:
        """What is private to a libcst class that `self` in `cls` may be an instance of."""
        names: set[str] = set()
        family, todo = {id(cls)}, [(module, cls)]
        while todo:
            owner, current = todo.pop()
            for lib in self.ancestors(owner, current):
                names |= private_to(lib)
            for m, sub in self.subclasses.get(current.name, ()):
                if id(sub) not in family:
                    family.add(id(sub))
                    todo.append((m, sub))
        return frozenset(names)


def _self_uses(cls: ast.ClassDef) -> Iterator[ast.AST]:
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
            yield node


def _member(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "name", "")


def _in_classes(package: Package) -> tuple[list[str], set[str], set[int]]:
    """Libcst-private names a class defines or uses on `self`; the project's own names; the
    nodes already judged."""
    found, own, judged = [], set(), set()
    private = libcst_private()
    for module in package.modules:
        for cls in module.classes:
            reach = package.reach(module, cls)
            for node in _self_uses(cls):
                name = _member(node)
                judged.add(id(node))
                if name in reach:
                    found.append(f"{module.path.name}:{node.lineno}: {cls.name} uses libcst's {name}")
                elif name in private:
                    own.add(name)
            for stmt in cls.body:
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                        if isinstance(target, ast.Name) and target.id in private and target.id not in reach:
                            own.add(target.id)
    return found, own, judged


def private_uses(root: Path = PACKAGE) -> list[str]:
    """Every place in the package that reaches into libcst's internals."""
    package = Package(root)
    found, own, judged = _in_classes(package)
    private = libcst_private()
    for module in package.modules:
        where = module.path.name
        for node in module.attributes:
            if id(node) not in judged and node.attr in private and node.attr not in own:
                found.append(f"{where}:{node.lineno}: .{node.attr} is libcst's")
        for line, name in module.imports:
            parts = name.split(".")
            if parts[0] == "libcst" and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{where}:{line}: imports {name}")
        if module.imports_libcst:
            found.extend(
                f"{where}:{line}: inspect in a module that imports libcst" for line in module.imports_inspect
            )
    return found


def test_the_private_set_holds_the_internals_a_codemod_is_tempted_by():
    private = libcst_private()
    for name in ("_visit_and_replace_children", "_handle_metadata_reference", "_matchers", "_unused_imports"):
        assert name in private
    assert "visit" not in private and "__init__" not in private


def test_no_module_of_the_codemod_reaches_into_libcst_internals():
    assert private_uses() == []


def test_each_kind_of_reach_into_libcst_is_caught(tmp_path):
    (tmp_path / "a.py").write_text(
        "import inspect\n"
        "import libcst as cst\n"
        "from libcst._nodes import base\n"
        "from libcst.codemod import Codemod\n"
        "from libcst.codemod.visitors import RemoveImportsVisitor\n"
        "Host = object\n"
        "if False:\n"
        "    Host = RemoveImportsVisitor\n"
        "class Mixin(Host):\n"
        "    def visit_Module(self, node):\n"
        "        self._unused_imports = {}\n"
        "class Own:\n"
        "    def _name(self):\n"
        "        return self._index\n"
        "class Rule(Codemod):\n"
        "    def _handle_metadata_reference(self, module):\n"
        "        return inspect.getsource(cst.Name._visit_and_replace_children)\n"
        "    def _name(self):\n"
        "        return Own()._name()\n"
        "class Late(Own):\n"
        "    pass\n"
        "class Sub(Late, cst.CSTTransformer):\n"
        "    pass\n"
    )
    (tmp_path / "b.py").write_text(
        "from .a import Mixin\nclass Both(Mixin):\n    def leave(self):\n        self._matchers = {}\n"
    )
    (tmp_path / "c.py").write_text(
        "from .a import Mixin\nfrom libcst.codemod import ContextAwareTransformer\nclass Both(Mixin, ContextAwareTransformer):\n    pass\n"
    )
    found = private_uses(tmp_path)
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted(
        [
            "inspect in a module that imports libcst",
            "imports libcst._nodes",
            "imports libcst._nodes.base",
            "Mixin uses libcst's _unused_imports",
            "Rule uses libcst's _handle_metadata_reference",
            "._visit_and_replace_children is libcst's",
            "Both uses libcst's _matchers",
        ]
    ), found
