"""What `amp_shim` exports, and the check that code pointed at it uses nothing else.

The shim target only renames modules (`apex.X` → `amp_shim.X`), so it is right exactly when
every module, name and keyword argument the file takes from Apex exists in `amp_shim` too. Old
Apex releases had names the last one (which the shim follows) lost or never had
(`apex.optimizers.FP16_Optimizer`, `apex.reparameterization`, `apex.contrib`, FusedAdam's
`max_grad_norm=`); pointed at the shim they would fail at import or at the call. The check finds
them in a syntax tree, scope-aware (a name counts as the shim's only where every binding that
could reach the read is its import, or an import guard's `None`).

The exports come from `_shim_surface_table.py`, generated from the real package by
`python -m amp_migrate.analysis.shim_surface` and compared with it by a test: importing `amp_shim`
imports torch, which costs more than a whole run of the codemod on a small project
(bench/shim_surface_cost.py; docs/decisions.md).
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union, cast

from ..io.lines import split_lines
from ._shim_surface_table import MODULES, SIGNATURES

SHIM = "amp_shim"
TABLE_PATH = Path(__file__).with_name("_shim_surface_table.py")

#: Attributes every module has; the table leaves them out.
MODULE_ATTRIBUTES = frozenset(
    {
        "__name__",
        "__doc__",
        "__file__",
        "__loader__",
        "__package__",
        "__spec__",
        "__builtins__",
        "__cached__",
        "__path__",
        "__dict__",
        # set on a module once a warning is issued from it: run-time state, not an export
        "__warningregistry__",
    }
)

#: What every module object answers to (`amp.__class__`, `amp.__dict__`, ...).
_ON_EVERY_MODULE = MODULE_ATTRIBUTES | frozenset(dir(types.ModuleType))


@dataclass(frozen=True)
class Missing:
    """A use of a module, name or keyword that `amp_shim` does not have."""

    line: int  # 1-based, in the file checked
    col: int  # 1-based, in characters
    kind: str  # "module" | "name" | "argument"
    shim_name: str  # what the shim would have to provide, e.g. `amp_shim.optimizers.FP16_Optimizer`
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.shim_name)


def is_module(path: str) -> bool:
    return path in MODULES


def resolves(module: str, name: str) -> bool:
    """`from <module> import <name>` (or `<module>.<name>`) finds something."""
    return member(module, name) is not None


#: What a name means: a shim path, and whether it is a module (else some other object).
Ref = tuple[str, bool]


def member(module: str, name: str) -> Optional[Ref]:
    """`<module>.<name>`, as attribute lookup and `from <module> import <name>` find it: a
    bound name first (`amp_shim.amp._amp_state` is the state object, not the submodule of
    that name), then a submodule."""
    path = f"{module}.{name}"
    if name in MODULES.get(module, ()) or name in _ON_EVERY_MODULE:
        return (path, False)
    if path in MODULES:
        return (path, True)
    return None


def missing_names(tree: ast.Module, text: str, roots: Sequence[str] = (SHIM,)) -> list[Missing]:
    """Every import from, read of, or call into a module under `roots` that the shim lacks,
    in source order. A root other than `amp_shim` (`apex`) stands for the shim module the
    shim target would put in its place."""
    checker = _Checker(text, tuple(roots))
    checker.scope(tree, [])
    return sorted(checker.found, key=lambda m: (m.line, m.col, m.kind, m.shim_name))


# -- scopes -----------------------------------------------------------------------------------

_OTHER = "other"  # bound to something that is not (known to be) the shim's
Kind = Union[Ref, str]  # what one binding means: a `Ref`, or `_OTHER`
_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_SCOPES = _FUNCTION_SCOPES + (ast.ClassDef,) + _COMPREHENSIONS


@dataclass
class _Scope:
    node: ast.AST
    bindings: dict[str, set]  # name → what its bindings mean: `Ref`s, or `_OTHER`
    declared_global: set[str]

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)

    def meaning(self, name: str) -> Optional[Ref]:
        kinds = self.bindings[name]
        if len(kinds) == 1 and _OTHER not in kinds:
            return next(iter(kinds))
        return None


def _is_guard_value(value: Optional[ast.expr]) -> bool:
    return isinstance(value, ast.Constant) and value.value in (None, False, True)


class _Checker:
    def __init__(self, text: str, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self.lines = split_lines(text)
        self.found: list[Missing] = []
        self.module_scope: Optional[_Scope] = None
        self.shim_names: set[str] = set()  # names some import binds to the shim's

    # -- names ------------------------------------------------------------------------------
    def root_of(self, dotted: str) -> Optional[str]:
        for root in self.roots:
            if dotted == root or dotted.startswith(root + "."):
                return root
        return None

    def shim(self, dotted: str) -> str:
        root = self.root_of(dotted)
        assert root is not None
        return SHIM + dotted[len(root) :]

    def spelled(self, shim_path: str, root: str) -> str:
        return root + shim_path[len(SHIM) :]

    def col(self, line: int, byte_offset: int) -> int:
        """1-based character column of a UTF-8 byte offset on a line (ast counts bytes)."""
        if 1 <= line <= len(self.lines):
            text = self.lines[line - 1].encode("utf-8", "surrogatepass")[:byte_offset]
            return len(text.decode("utf-8", "replace")) + 1
        return byte_offset + 1

    def report(self, line: int, byte_col: int, kind: str, shim_name: str, message: str) -> None:
        self.found.append(Missing(line, self.col(line, byte_col), kind, shim_name, message))

    # -- scope tables ---------------------------------------------------------------------
    def scope(self, node: ast.AST, chain: list[_Scope]) -> None:
        scope = _Scope(node, {}, set())
        if not chain:
            self.module_scope = scope
        chain = chain + [scope]
        candidates, nested = self._collect(node, scope)
        for candidate in candidates:
            self.check(candidate, chain)
        for inner in nested:
            self.scope(inner, chain)

    def _own_nodes(self, node: ast.AST) -> Iterator[ast.AST]:
        """The nodes of `node`'s own scope, parents before children (nested scopes' headers
        included, their bodies not): decorators, defaults and the first iterable of a
        comprehension run outside it."""
        stack: list[ast.AST] = []
        if isinstance(node, ast.Lambda):
            stack.append(node.body)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(node.body)
        elif isinstance(node, _COMPREHENSIONS):
            for i, generator in enumerate(node.generators):
                stack.extend([generator.target, *generator.ifs] + ([generator.iter] if i else []))
            stack.extend([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])
        else:
            stack.extend(ast.iter_child_nodes(node))
        AST = ast.AST
        while stack:
            current = stack.pop()
            yield current
            if isinstance(current, _SCOPES):
                stack.extend(_outer_parts(current))
                continue
            for field in current._fields:
                value = getattr(current, field, None)
                if isinstance(value, AST):
                    stack.append(value)
                elif type(value) is list:
                    stack.extend(v for v in value if isinstance(v, AST))

    def _collect(self, node: ast.AST, scope: _Scope) -> tuple[list[ast.AST], list[ast.AST]]:
        """Fill `scope`'s bindings; return the nodes to check and the scopes nested in it."""

        def bind(name: str, kind: Kind) -> None:
            scope.bindings.setdefault(name, set()).add(kind)
            if kind is not _OTHER:
                self.shim_names.add(name)

        if isinstance(node, _FUNCTION_SCOPES):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None:
                    bind(arg.arg, _OTHER)
        candidates: list[ast.AST] = []
        nested: list[ast.AST] = []
        guards: set[int] = set()  # `amp = None`, an import guard's fallback: no second meaning
        # One `type()` per node, compared by identity (a hot loop); each branch casts `current`
        # to the type its test proved.
        for current in self._own_nodes(node):  # an assignment comes before its targets
            kind_of = type(current)
            if kind_of is ast.Name:
                name = cast(ast.Name, current)
                if type(name.ctx) is ast.Store and id(current) not in guards:
                    bind(name.id, _OTHER)
            elif kind_of is ast.Attribute or kind_of is ast.Call:
                candidates.append(current)
            elif kind_of is ast.Assign:
                assign = cast(ast.Assign, current)
                if _is_guard_value(assign.value):
                    guards.update(id(t) for t in assign.targets if type(t) is ast.Name)
            elif isinstance(current, _SCOPES):
                nested.append(current)
                if not isinstance(current, (ast.Lambda, *_COMPREHENSIONS)):
                    bind(current.name, _OTHER)
            elif kind_of is ast.Global or kind_of is ast.Nonlocal:
                scope.declared_global.update(cast(Union[ast.Global, ast.Nonlocal], current).names)
            elif kind_of is ast.Import:
                candidates.append(current)
                self._bind_import(cast(ast.Import, current), bind)
            elif kind_of is ast.ImportFrom:
                candidates.append(current)
                self._bind_import_from(cast(ast.ImportFrom, current), bind)
            elif kind_of is ast.ExceptHandler or kind_of is ast.MatchAs or kind_of is ast.MatchStar:
                bound = cast(Union[ast.ExceptHandler, ast.MatchAs, ast.MatchStar], current).name
                if bound:
                    bind(bound, _OTHER)
            elif kind_of is ast.MatchMapping:
                rest = cast(ast.MatchMapping, current).rest
                if rest:
                    bind(rest, _OTHER)
        return candidates, nested

    def _bind_import(self, node: ast.Import, bind: Callable[[str, Kind], None]) -> None:
        for alias in node.names:
            if alias.asname is not None:
                ours = self.root_of(alias.name) is not None
                bind(alias.asname, (self.shim(alias.name), True) if ours else _OTHER)
            else:
                first = alias.name.split(".")[0]
                bind(first, (self.shim(first), True) if self.root_of(first) else _OTHER)

    def _bind_import_from(self, node: ast.ImportFrom, bind: Callable[[str, Kind], None]) -> None:
        module = node.module or ""
        ours = node.level == 0 and self.root_of(module) is not None
        for alias in node.names:
            if alias.name == "*":
                continue
            kind: Kind = _OTHER
            if ours:
                shim_module = self.shim(module)
                kind = member(shim_module, alias.name) or (f"{shim_module}.{alias.name}", False)
            bind(alias.asname or alias.name, kind)

    def meaning(self, name: str, chain: list[_Scope]) -> Optional[Ref]:
        """What `name` means in the shim where `chain` is the scopes around the read, or None
        (not the shim's, or not only)."""
        innermost = True
        for scope in reversed(chain):
            if scope.is_class and not innermost:
                continue
            innermost = False
            if name in scope.declared_global:
                module = self.module_scope
                assert module is not None  # set by the first scope(), which holds every chain
                return module.meaning(name) if name in module.bindings else None
            if name in scope.bindings:
                return scope.meaning(name)
        return None

    def resolve(self, expr: ast.expr, chain: list[_Scope]) -> Optional[Ref]:
        if isinstance(expr, ast.Name):
            return self.meaning(expr.id, chain) if expr.id in self.shim_names else None
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value, chain)
            if base is not None and base[1]:
                return member(base[0], expr.attr)
        return None

    # -- the checks -----------------------------------------------------------------------
    def check(self, node: ast.AST, chain: list[_Scope]) -> None:
        if isinstance(node, ast.Import):
            self.check_import(node)
        elif isinstance(node, ast.ImportFrom):
            self.check_import_from(node)
        elif isinstance(node, ast.Attribute):
            self.check_attribute(node, chain)
        elif isinstance(node, ast.Call):
            self.check_call(node, chain)

    def check_import(self, node: ast.Import) -> None:
        for alias in node.names:
            root = self.root_of(alias.name)
            if root is None:
                continue
            missing = self.first_missing_module(self.shim(alias.name))
            if missing is not None:
                self.report(
                    alias.lineno,
                    alias.col_offset,
                    "module",
                    missing,
                    f"`import {alias.name}`: {self.no_module(missing, root)}",
                )

    def check_import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        root = self.root_of(module) if node.level == 0 else None
        if root is None:
            return
        shim_module = self.shim(module)
        missing = self.first_missing_module(shim_module)
        if missing is not None:
            line = node.lineno  # where the module's name starts, when it is on that line
            raw = self.lines[line - 1].encode("utf-8", "surrogatepass") if line <= len(self.lines) else b""
            at = raw.find(root.encode("utf-8"), node.col_offset)
            self.report(
                line,
                at if at >= 0 else node.col_offset,
                "module",
                missing,
                f"`from {module} import ...`: {self.no_module(missing, root)}",
            )
            return
        for alias in node.names:
            if alias.name != "*" and not resolves(shim_module, alias.name):
                full = f"{shim_module}.{alias.name}"
                self.report(
                    alias.lineno,
                    alias.col_offset,
                    "name",
                    full,
                    f"`{module}.{alias.name}` has no counterpart in the shim: "
                    f"`{shim_module}` has no `{alias.name}`{self.consequence()}",
                )

    def check_attribute(self, node: ast.Attribute, chain: list[_Scope]) -> None:
        if not isinstance(node.ctx, ast.Load):
            return  # setting a module attribute creates it
        ref = self.resolve(node.value, chain)
        if ref is None or not ref[1] or resolves(ref[0], node.attr):
            return
        base = ref[0]
        line = node.end_lineno or node.lineno
        col = (node.end_col_offset or 0) - len(node.attr.encode("utf-8"))
        spelled = ast.unparse(node)
        self.report(
            line,
            max(col, 0),
            "name",
            f"{base}.{node.attr}",
            f"`{spelled}` has no counterpart in the shim: `{base}` has no "
            f"`{node.attr}`{self.consequence(read=True)}",
        )

    def check_call(self, node: ast.Call, chain: list[_Scope]) -> None:
        ref = self.resolve(node.func, chain)
        if ref is None:
            return
        callee = ref[0]
        signature = SIGNATURES.get(callee)
        if signature is None:
            return
        positional, keywords, var_positional, var_keyword = signature
        short = callee.rsplit(".", 1)[1]
        for kw in node.keywords:
            if kw.arg is None:
                return  # `**kwargs`: which keywords it holds is not known here
        for kw in node.keywords:
            if not var_keyword and kw.arg not in keywords:
                self.report(
                    kw.lineno,
                    kw.col_offset,
                    "argument",
                    f"{callee}({kw.arg}=)",
                    f"`{short}(..., {kw.arg}=...)`: the shim's `{callee}` takes no "
                    f"`{kw.arg}` argument (it follows Apex's last release; an older "
                    "one may have taken it), so the call would raise TypeError under "
                    "the shim. Migrate this call by hand.",
                )
        if (
            not var_positional
            and not any(isinstance(a, ast.Starred) for a in node.args)
            and len(node.args) > len(positional)
        ):
            extra = node.args[len(positional)]
            self.report(
                extra.lineno,
                extra.col_offset,
                "argument",
                f"{callee}(#{len(node.args)})",
                f"`{short}(...)` is given {len(node.args)} positional arguments; the "
                f"shim's `{callee}` takes at most {len(positional)}, so the call would "
                "raise TypeError under the shim. Migrate this call by hand.",
            )

    def first_missing_module(self, shim_module: str) -> Optional[str]:
        parts = shim_module.split(".")
        for n in range(1, len(parts) + 1):
            if ".".join(parts[:n]) not in MODULES:
                return ".".join(parts[:n])
        return None

    def no_module(self, missing: str, root: str) -> str:
        return (
            f"`{self.spelled(missing, root)}` has no counterpart in the shim: there is no "
            f"module `{missing}`{self.consequence()}"
        )

    def consequence(self, read: bool = False) -> str:
        when = "this read would raise AttributeError" if read else "the import would fail"
        return (
            f", so {when} under the shim. Migrate this use by hand: the shim provides "
            "`apex.amp`, `fp16_utils`, `optimizers`, `parallel` and `normalization` as of "
            "Apex's last release, and nothing else."
        )


def _outer_parts(node: ast.AST) -> list[ast.AST]:
    """The parts of a nested scope that run in the enclosing one."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        return [
            *node.decorator_list,
            *args.defaults,
            *(d for d in args.kw_defaults if d),
            *(
                a.annotation
                for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                if a is not None and a.annotation
            ),
            *([node.returns] if node.returns else []),
        ]
    if isinstance(node, ast.Lambda):
        return [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    if isinstance(node, _COMPREHENSIONS):
        return [node.generators[0].iter]
    return []


# -- the table, from the real package -----------------------------------------------------------

Signature = tuple[tuple[str, ...], tuple[str, ...], bool, bool]


def real_table() -> tuple[dict[str, frozenset[str]], dict[str, Signature]]:
    """Every module of the installed `amp_shim` (but `__main__`, which runs the launcher) with
    the names it binds (modules aside: a submodule is a module of the table, a foreign module
    is nothing Apex exported), and the parameters of every public class and function
    `amp_shim` defines, under each name it is exported as. Imports amp_shim, and so torch."""
    import importlib
    import inspect
    import pkgutil
    import types

    import amp_shim

    modules: dict[str, frozenset[str]] = {}
    signatures: dict[str, Signature] = {}
    names = [SHIM] + [
        info.name
        for info in pkgutil.walk_packages(amp_shim.__path__, SHIM + ".")
        if not info.name.endswith(".__main__")
    ]
    for name in sorted(names):
        module = importlib.import_module(name)
        attributes = {
            key: value
            for key, value in vars(module).items()
            if key not in MODULE_ATTRIBUTES and not isinstance(value, types.ModuleType)
        }
        modules[name] = frozenset(attributes)
        for key, value in attributes.items():
            if key.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if not getattr(value, "__module__", "").startswith(SHIM):
                continue
            try:
                parameters = inspect.signature(value).parameters.values()
            except (TypeError, ValueError):
                continue
            kinds = inspect.Parameter
            signatures[f"{name}.{key}"] = (
                tuple(
                    p.name
                    for p in parameters
                    if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
                ),
                tuple(
                    p.name for p in parameters if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
                ),
                any(p.kind == kinds.VAR_POSITIONAL for p in parameters),
                any(p.kind == kinds.VAR_KEYWORD for p in parameters),
            )
    return modules, signatures


def render_table(modules: Mapping[str, Iterable[str]], signatures: dict[str, Signature]) -> str:
    out = [
        '"""What `amp_shim` exports: generated by `python -m amp_migrate.analysis.shim_surface` from the',
        'installed package; do not edit (a test compares it with the package)."""',
        "# fmt: off",
        "",
        "#: module → the names it binds (its submodules are modules of this table)",
        "MODULES: dict[str, frozenset[str]] = {",
    ]
    for name in sorted(modules):
        out.append(f"    {name!r}: frozenset({{")
        out.extend(_wrapped(sorted(modules[name]), "        "))
        out.append("    }),")
    out += [
        "}",
        "",
        "#: class or function → (positional parameters, keyword parameters, *args, **kwargs)",
        "SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool, bool]] = {",
    ]
    for name in sorted(signatures):
        out.append(f"    {name!r}: {signatures[name]!r},")
    out += ["}", ""]
    return "\n".join(out)


def _wrapped(items: Sequence[str], indent: str, width: int = 96) -> list[str]:
    lines: list[str] = []
    current = indent
    for item in items:
        piece = f"{item!r}, "
        if len(current) + len(piece) > width and current.strip():
            lines.append(current.rstrip())
            current = indent
        current += piece
    if current.strip():
        lines.append(current.rstrip())
    return lines


def main() -> None:
    TABLE_PATH.write_text(render_table(*real_table()), encoding="utf-8")
    print(f"wrote {TABLE_PATH}")


if __name__ == "__main__":
    main()
