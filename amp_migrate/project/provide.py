"""Apex's module obtained from a provider function, `amp = get_amp(fp16)`, for the whole group.

The index knows the functions that return Apex's module (`ModuleFacts.providers`) and the
calls that bind what they return (`provided`). A group made of one provider and its callers
goes native where both sides are proven, and each file gets its `ProvidedPart`
(amp_migrate/analysis/provided.py applies it):

* the provider is only `if <cond>: from apex import amp` (a `try` whose `except ImportError`
  only raises allowed; none where unconditional), `amp = None` otherwise (in the `else` or
  before the `if`; or `return None` after it), and `return amp`; `<cond>` a pure test of its
  parameters. Its module uses Apex nowhere else and names it nowhere else: it is removed.
* each call `name = get_amp(<args>)` is a statement of a module-level function, the name a
  plain local; the provider's condition in the call's arguments (`<args>` pure: names,
  attributes, constants, tests) reads parameters of that function that it never rebinds or
  stores into, nor hands to a call between the call and the `if`; the `initialize` on the value runs in an `if` after the call whose test is
  that condition (each conjunct a test of the value, `name is not None`, or a conjunct of the
  condition). Then the call means `name = None; if <cond>: from apex import amp as name`, and
  the module-value rules (carriers.py) prove the rest of the flow in that spelling.
* no other module of the tree names the provider, and the group holds nothing else.

Otherwise every member gets the reason (AMP162 at the provider's line, AMP163 at the call) and
the group is judged as before (the shim).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Mapping, NoReturn, Optional, TypeGuard, Union, cast

from ..analysis.provided import Edit, ProvidedPart
from ..diagnostics import Code, Diagnostic
from ..plan.types import SharedScaler
from . import codes
from .groups import Group
from .guard import end_line
from .index import Import, Located, ProjectIndex, column

Node = Union[ast.AST, tuple[int, int]]
#: raises _Refused at the node (None: where the caller's refusal puts it) with the reason
Refuse = Callable[[Optional[ast.AST], str], NoReturn]


def _position(node: ast.AST) -> Located:
    """A refused node's position: every node refused is a statement, an expression or an
    `except` handler, which all carry one (`ast.AST` itself declares none)."""
    return cast(Located, node)


class _Refused(Exception):
    def __init__(self, path: str, where: Node, why: str, code: Code) -> None:
        super().__init__(why)
        self.path, self.where, self.why, self.code = path, where, why, code


@dataclass(frozen=True)
class Provider:
    path: str
    function: ast.FunctionDef
    condition: Optional[ast.expr]  # None: it always returns Apex's module


def _apex_amp(node: ast.AST) -> TypeGuard[ast.ImportFrom]:
    return (
        isinstance(node, ast.ImportFrom)
        and node.module == "apex"
        and not node.level
        and len(node.names) == 1
        and node.names[0].name == "amp"
    )


def _import_part(body: list[ast.stmt], refuse: Refuse) -> str:
    """The name `from apex import amp` binds in `body` (alone, or in a `try` whose only
    handler catches ImportError and raises), else refuses at what stands in the way."""
    node = body[0] if body else None
    if isinstance(node, ast.Try):
        if node.orelse or node.finalbody:
            refuse(node, "its `try` has an `else` or `finally`")
        for handler in node.handlers:
            names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            if not all(
                isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names
            ) or not all(isinstance(s, ast.Raise) for s in handler.body):
                refuse(
                    handler,
                    "its `except` does more than raise when Apex is missing (the value "
                    "could be None where the condition held)",
                )
        inner = node.body
    else:
        inner = body
    extra = [s for s in inner if not _apex_amp(s)] + (body[1:] if inner is not body else [])
    if not inner or extra or len(inner) != 1:
        odd = extra[0] if extra else inner[1] if len(inner) > 1 else None
        assert odd is not None  # `inner` is empty only for an empty body: a provider has its `return`
        refuse(odd, f"it also runs `{_short(odd)}`, which no GradScaler stands for")
    imported = inner[0]
    assert _apex_amp(imported)  # nothing else is in `inner` (`extra` is empty)
    return imported.names[0].asname or "amp"


def _returns(node: ast.AST, name: Optional[str]) -> bool:
    """`return name` (name None: `return None` or a bare `return`)."""
    if not isinstance(node, ast.Return):
        return False
    if name is None:
        return node.value is None or isinstance(node.value, ast.Constant) and node.value.value is None
    return isinstance(node.value, ast.Name) and node.value.id == name


def _none(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == name
        and isinstance(node.value, ast.Constant)
        and node.value.value is None
    )


_PURE = (
    ast.Name,
    ast.Attribute,
    ast.Constant,
    ast.Compare,
    ast.BoolOp,
    ast.UnaryOp,
    ast.Subscript,
    ast.Load,
    ast.And,
    ast.Or,
    ast.Not,
    ast.Eq,
    ast.NotEq,
    ast.Is,
    ast.IsNot,
    ast.In,
    ast.NotIn,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Tuple,
)


def _pure(node: ast.expr) -> bool:
    """Side-effect free: reads, constants, tests, `bool(x)`."""
    for part in ast.walk(node):
        if isinstance(part, ast.Call):
            if not (
                isinstance(part.func, ast.Name)
                and part.func.id == "bool"
                and len(part.args) == 1
                and not part.keywords
            ):
                return False
        elif not isinstance(part, _PURE) and part is not getattr(getattr(part, "func", None), "id", None):
            return False
    return True


def provider_shape(path: str, tree: ast.Module, name: str) -> Provider:
    """The provider `name` of `tree`, proven to only import and return Apex's module (or None)."""
    defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name]

    def refuse(node: Optional[ast.AST], why: str) -> NoReturn:
        raise _Refused(
            path, node if node is not None else defs[0], f"`{name}`: {why}", codes.PROVIDER_NOT_FOLLOWED
        )

    if len(defs) != 1 or not isinstance(defs[0], ast.FunctionDef) or defs[0].decorator_list:
        raise _Refused(
            path,
            defs[0] if defs else (1, 1),
            f"`{name}` is not a module-level function defined once, undecorated",
            codes.PROVIDER_NOT_FOLLOWED,
        )
    function = defs[0]
    body = list(function.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    condition, first = None, body[0] if body else function
    if (
        isinstance(first, ast.If)
        or len(body) > 1
        and _none(body[0], _bound_name(body))
        and isinstance(body[1], ast.If)
    ):
        condition = _conditional_shape(function, body, refuse)
    else:
        value = _import_part(body[:1], refuse)
        if len(body) != 2 or not _returns(body[1], value):
            refuse(
                body[1] if len(body) > 1 else function, "it does more than import and return Apex's module"
            )
    return Provider(path, function, condition)


def _conditional_shape(function: ast.FunctionDef, body: list[ast.stmt], refuse: Refuse) -> ast.expr:
    """The condition of a provider whose `body` (its docstring aside) starts with the `if`, or
    with `amp = None` and then the `if`; refuses where it is not shaped as the module says."""
    first = body[0]
    before = not isinstance(first, ast.If)  # `amp = None` before the `if`
    guard, rest = (body[1], body[2:]) if before else (first, body[1:])
    assert isinstance(guard, ast.If)  # provider_shape saw the `if` there
    condition = guard.test
    inside = len(guard.body) > 1 and _returns(guard.body[-1], _bound_name(guard.body))
    value = _import_part(guard.body[:-1] if inside else guard.body, refuse)
    if inside:  # `if c: import; return amp` then `return None` (or nothing)
        shaped = not before and not guard.orelse and (not rest or len(rest) == 1 and _returns(rest[0], None))
    else:
        shaped = (
            (not guard.orelse if before else len(guard.orelse) == 1 and _none(guard.orelse[0], value))
            and len(rest) == 1
            and _returns(rest[0], value)
        )
    if not shaped:
        odd = (
            next((s for s in guard.orelse if not _none(s, value)), None)
            or next((s for s in rest if not _returns(s, value) and not _returns(s, None)), None)
            or guard
        )
        refuse(odd, "it is not `if <cond>: <import>`, None otherwise, and a `return` of the value")
    if not _pure(condition) or any(
        isinstance(n, ast.Name) and n.id not in _parameters(function) and n.id != "bool"
        for n in ast.walk(condition)
    ):
        refuse(condition, f"its condition `{_short(condition)}` is not a pure test of its parameters")
    return condition


def _bound_name(body: list) -> str:
    """The name the provider's import binds (for the `amp = None` test before the `if`)."""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if _apex_amp(node):
            return node.names[0].asname or "amp"
    return "amp"


def _parameters(function: ast.FunctionDef) -> list[str]:
    args = function.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _short(node: ast.AST) -> str:
    text = ast.unparse(node).split("\n")[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in _conjuncts(value)]
    return [test]


def _tests_value(node: ast.expr, name: str) -> bool:
    """`name` or `name is not None`: true exactly when the provider returned Apex's module."""
    if isinstance(node, ast.Name):
        return node.id == name
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Name)
        and node.left.id == name
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.IsNot)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]) -> None:
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.values.get(node.id, node)


def _arguments(provider: Provider, call: ast.Call, refuse: Refuse) -> dict[str, ast.expr]:
    """The provider's parameters as the call passes them (defaults where it does not)."""
    args = provider.function.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    if (
        any(isinstance(a, ast.Starred) for a in call.args)
        or any(k.arg is None for k in call.keywords)
        or len(call.args) > len(positional)
    ):
        refuse(call, "the call passes `*args`/`**kwargs` or more arguments than the provider names")
    values = dict(zip(positional, call.args))
    values.update((k.arg, k.value) for k in call.keywords if k.arg is not None)  # `**` refused above
    defaults = dict(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    defaults.update((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    for name in _parameters(provider.function):
        if name not in values and name in defaults:
            values[name] = defaults[name]
    for value in values.values():
        if not _pure(value) or value in defaults.values() and not isinstance(value, ast.Constant):
            refuse(
                value,
                f"`{_short(value)}` is not a pure expression (the call would run it once, "
                "the test that replaces it again)",
            )
    return values


def _stable(function: ast.FunctionDef, condition: ast.expr, refuse: Refuse) -> None:
    """The names the condition reads are parameters of `function` that it never rebinds or
    stores into, so the test after the call reads what the call was given."""
    params = set(_parameters(function))
    read = [n.id for n in ast.walk(condition) if isinstance(n, ast.Name) and n.id != "bool"]
    roots = set(read)
    for name in (n for n in read if n not in params):  # the condition's order, not a set's
        refuse(condition, f"`{name}` in `{_short(condition)}` is not a parameter of `{function.name}`")
    for node in ast.walk(function):
        target = node
        while isinstance(target, (ast.Attribute, ast.Subscript)) and isinstance(
            getattr(target, "ctx", None), (ast.Store, ast.Del)
        ):
            target = target.value
            while isinstance(target, (ast.Attribute, ast.Subscript)):
                target = target.value
            if isinstance(target, ast.Name) and target.id in roots:
                refuse(node, f"`{target.id}` is stored into in `{function.name}`")
        if (
            isinstance(node, ast.Name)
            and node.id in roots
            and isinstance(node.ctx, (ast.Store, ast.Del))
            or isinstance(node, (ast.Global, ast.Nonlocal))
            and roots & set(node.names)
        ):
            refuse(node, f"`{_short(node)}` rebinds what the provider's condition reads")


def _path(node: ast.AST) -> Optional[tuple[str, ...]]:
    """`args.model.fp16` -> ("args", "model", "fp16"); an item reads its container's path."""
    parts: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        else:
            parts.clear()
        node = node.value
    return (node.id, *reversed(parts)) if isinstance(node, ast.Name) else None


def _untouched(between: list[ast.stmt], condition: ast.expr, refuse: Refuse) -> None:
    """No call between the provider's call and the `if` is handed an object the condition reads
    through, or is a method of one (`setup(args)`, `args.update(...)` could change `args.fp16`;
    `args.lr` is no such object)."""
    read = {
        p
        for n in ast.walk(condition)
        if isinstance(n, (ast.Name, ast.Attribute))
        for p in [_path(n)]
        if p is not None and p[0] != "bool"
    }

    def reached(node: ast.AST) -> bool:
        path = _path(node)
        return path is not None and any(r[: len(path)] == path for r in read)

    for statement in between:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and (
                isinstance(node.func, ast.Attribute)
                and reached(node.func.value)
                or any(reached(a) for a in (*node.args, *(k.value for k in node.keywords)))
            ):
                refuse(
                    node,
                    f"`{_short(node)}` runs between the call and the `if` that runs `initialize`, "
                    "and may change what the provider's condition read",
                )


def _guard(function: ast.FunctionDef, after: ast.stmt, name: str) -> Optional[ast.If]:
    """The first `if` after the call, in the function's own body, that runs `name.initialize`."""
    for statement in function.body[function.body.index(after) + 1 :]:
        if isinstance(statement, ast.If) and any(
            isinstance(s, (ast.Assign, ast.Expr))
            and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Attribute)
            and s.value.func.attr == "initialize"
            and isinstance(s.value.func.value, ast.Name)
            and s.value.func.value.id == name
            for s in statement.body
        ):
            return statement
    return None


def _import_text(name: str) -> str:
    return "from apex import amp" + (f" as {name}" if name != "amp" else "")


def _spanning(text: str, node: ast.stmt | ast.expr) -> str:
    """`text` spread over the lines `node` spans (wrapped in parentheses there), so that the
    file keeps its line numbers."""
    extra = end_line(node) - node.lineno
    return text if not extra else f"({text}" + "\n" * extra + ")"


class _Caller:
    """One caller's edits, found on its `ast`."""

    def __init__(self, path: str, text: str, provider: Provider, local: set[str], label: str) -> None:
        self.path, self.text, self.provider, self.local, self.label = path, text, provider, local, label
        self.lines = text.split("\n")
        self.tree = ast.parse(text)
        self.parents = {id(c): n for n in ast.walk(self.tree) for c in ast.iter_child_nodes(n)}
        self.edits: list[Edit] = []
        self.inserts: list[tuple[int, ast.stmt]] = []  # (line inserted before, the call)
        self.notes: list[Diagnostic] = []
        self.nones: list[tuple[str, str]] = []

    def refuse(self, node: Optional[ast.AST], why: str) -> NoReturn:
        raise _Refused(self.path, node if node is not None else (1, 1), why, codes.PROVIDED_NOT_FOLLOWED)

    def run(self) -> None:
        calls: list[ast.Call] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id in self.local:
                call = self.parents.get(id(node))
                if not (isinstance(call, ast.Call) and call.func is node):
                    self.refuse(node, f"`{node.id}` is used other than by a call")
                calls.append(call)
        for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            self._call(call)

    def _site(self, call: ast.Call) -> tuple[ast.Assign, str, ast.FunctionDef]:
        """(`name = <call>`, the name, the module-level function that holds it), else refuses."""
        statement = self.parents.get(id(call))
        if not isinstance(statement, ast.Assign) or statement.value is not call:
            self.refuse(call, f"`{_short(call)}` is not assigned to a name")
        target = statement.targets[0]
        if len(statement.targets) != 1 or not isinstance(target, ast.Name):
            self.refuse(
                statement,
                f"the value is stored on `{_short(target)}`, where the tree does not show every use of it",
            )
        name, function = target.id, self.parents.get(id(statement))
        if not isinstance(function, ast.FunctionDef) or not isinstance(
            self.parents.get(id(function)), ast.Module
        ):
            self.refuse(statement, f"`{_short(statement)}` is not a statement of a module-level function")
        return statement, name, function

    def _call(self, call: ast.Call) -> None:
        statement, name, function = self._site(call)
        values = _arguments(self.provider, call, self.refuse)
        where = f"`{self.provider.function.name}` ({self.label}:{self.provider.function.lineno})"
        if self.provider.condition is None:
            alias = _import_text(name)[len("from apex import ") :]
            self.edits.append(self._edit(statement, "from apex import " + _spanning(alias, statement)))
            self._note(
                statement,
                f"`{name} = {_short(call)}` goes: {where} always returned Apex's module; "
                "the GradScaler built where `initialize` runs takes the value's place",
            )
            return
        condition = _Substitute(values).visit(
            ast.parse(ast.unparse(self.provider.condition), mode="eval").body
        )
        _stable(function, condition, self.refuse)
        guard = _guard(function, statement, name)
        if guard is None:
            self.refuse(statement, f"no `if` after it in `{function.name}` runs `{name}.initialize`")
        _untouched(
            function.body[function.body.index(statement) + 1 : function.body.index(guard)],
            condition,
            self.refuse,
        )
        wanted = {ast.dump(c) for c in _conjuncts(condition)}
        parts = _conjuncts(guard.test)
        if any(not _tests_value(p, name) and ast.dump(p) not in wanted for p in parts) or not (
            any(_tests_value(p, name) for p in parts) or wanted <= {ast.dump(p) for p in parts}
        ):
            self.refuse(
                guard.test,
                f"`{_short(guard.test)}` is not the provider's condition "
                f"`{ast.unparse(condition)}` nor a test of `{name}`",
            )
        if guard.body[0].lineno <= end_line(guard.test):
            self.refuse(guard, "the `if` that runs `initialize` holds it on its own line")
        self.edits += [
            self._edit(statement, f"{name} = " + _spanning("None", statement)),
            self._edit(guard.test, _spanning(ast.unparse(condition), guard.test)),
        ]
        line = guard.body[0].lineno
        indent = self.lines[line - 1][: len(self.lines[line - 1]) - len(self.lines[line - 1].lstrip())]
        self.edits.append((line, 0, line, 0, f"{indent}{_import_text(name)}\n"))
        self.inserts.append((line, statement))
        self.nones.append((function.name, name))
        self._note(
            statement,
            f"`{name} = {_short(call)}` goes: {where} returned Apex's module exactly when "
            f"`{ast.unparse(condition)}`, None otherwise; the GradScaler built where `initialize` runs, "
            "enabled under that test, takes the value's place",
        )

    def _edit(self, node: ast.stmt | ast.expr, new: str) -> Edit:
        assert node.end_col_offset is not None  # `ast.parse` sets every position
        return (node.lineno, node.col_offset, end_line(node), node.end_col_offset, new)

    def _note(self, node: Located, message: str) -> None:
        code = codes.PROVIDED_NOW_SCALER
        self.notes.append(
            Diagnostic(code.code, code.severity, node.lineno, column(self.lines, node), message, True)
        )

    def part(self) -> ProvidedPart:
        inserted: list[tuple[int, int, int]] = []
        done = 0
        for line, statement in sorted(self.inserts, key=lambda i: i[0]):
            inserted.append((line + done, statement.lineno, column(self.lines, statement)))
            done += 1
        code = codes.PROVIDED_NOT_FOLLOWED
        fallback = Diagnostic(
            code.code,
            code.severity,
            1,
            1,
            f"`{self.provider.function.name}`'s value cannot become the GradScaler here",
            False,
        )
        return ProvidedPart(
            edits=tuple(sorted(self.edits)),
            inserted=tuple(inserted),
            drop=(self.provider.function.name,),
            notes=tuple(self.notes),
            fallback=fallback,
            nones=tuple(self.nones),
        )


def _diagnostic(code: Code, lines: list[str], where: Node, message: str) -> Diagnostic:
    line, col = (
        where if isinstance(where, tuple) else (_position(where).lineno, column(lines, _position(where)))
    )
    return Diagnostic(code.code, code.severity, line, col, message, False)


def _local_names(
    index: ProjectIndex, path: str, tree: ast.Module, provider: str, name: str, refuse: Refuse
) -> set[str]:
    """The names `path` imports the provider by (`from M import get_amp [as g]`); any other
    import of that name, or of the provider's module, is a use the value flow cannot follow."""
    resolver = index.resolver
    assert resolver is not None  # build_index always gives one
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                hits = provider in resolver.targets(
                    path, Import(node.module or "", (alias.name,), node.level)
                )
                if alias.name == name and hits:
                    found.add(alias.asname or name)
                elif (
                    alias.name == name
                    or hits
                    and alias.name != name
                    and provider
                    in resolver.targets(
                        path, Import(f"{node.module or ''}.{alias.name}".strip("."), (), node.level)
                    )
                ):
                    refuse(node, f"`{_short(node)}` imports the provider's name or module otherwise")
        elif isinstance(node, ast.Import) and any(
            provider in resolver.lookup(path, a.name) for a in node.names
        ):
            refuse(node, f"`{_short(node)}` imports the provider's module")
    return found


def _group(
    index: ProjectIndex,
    group: Group,
    texts: Mapping[str, str],
    names: Mapping[str, str],
    path: str,
    name: str,
) -> dict[str, ProvidedPart]:
    """Each member's part where the group goes native (raises _Refused otherwise)."""
    label = names.get(path, path)
    provider = provider_shape(path, ast.parse(texts[path]), name)
    callers = _callers(index, group, texts, names, provider, name)
    parts = {}
    for caller in callers:
        if caller == path or index.facts(caller).apex_imports:
            raise _Refused(
                caller,
                (index.facts(caller).provided[0].line, 1),
                "the caller also imports Apex itself",
                codes.PROVIDED_NOT_FOLLOWED,
            )
        tree = ast.parse(texts[caller])
        found = _Caller(caller, texts[caller], provider, set(), label)
        found.local = _local_names(index, caller, tree, path, name, found.refuse)
        found.run()
        parts[caller] = found.part()
    removed = Diagnostic(
        codes.PROVIDER_REMOVED.code,
        codes.PROVIDER_REMOVED.severity,
        provider.function.lineno,
        provider.function.col_offset + 1,
        f"`{name}` is removed: every call of it in the tree "
        f"({', '.join(names.get(c, c) for c in callers)}) now builds the GradScaler where "
        "`initialize` runs",
        True,
    )
    parts[path] = ProvidedPart(drop=(name,), removes=True, notes=(removed,))
    return parts


def _callers(
    index: ProjectIndex,
    group: Group,
    texts: Mapping[str, str],
    names: Mapping[str, str],
    provider: Provider,
    name: str,
) -> list[str]:
    """The group's modules that call the provider `name` (raises _Refused where its module,
    or another module of the tree, uses Apex or the provider otherwise)."""
    path = provider.path
    facts = index.facts(path)
    span = range(provider.function.lineno, end_line(provider.function) + 1)

    def refuse(where: Node, why: str) -> NoReturn:
        raise _Refused(path, where, f"`{name}`: {why}", codes.PROVIDER_NOT_FOLLOWED)

    if (
        facts.initialize
        or facts.uses
        or facts.foreign
        or facts.provided
        or facts.dynamic
        or facts.fp16_optimizers
        or any(s.line not in span for s in facts.apex_imports)
        or len(facts.providers) != 1
    ):
        refuse(provider.function, "its module uses Apex beside it")
    word = re.compile(rf"\b{re.escape(name)}\b")
    if len(word.findall(texts[path])) != 1:
        refuse(provider.function, f"its module names `{name}` beside its `def`")
    callers = sorted(p for p in group.members if index.facts(p).provided)
    for other in sorted(set(group.members) - set(callers) - {path}):
        refuse(provider.function, f"{names.get(other, other)} shares Apex objects with its callers")
    for other, text in sorted(texts.items()):
        if other not in callers and other != path and word.search(text):
            refuse(provider.function, f"{names.get(other, other)} names it, where its calls are not followed")
    return callers


def _refusals(
    index: ProjectIndex,
    group: Group,
    texts: Mapping[str, str],
    names: Mapping[str, str],
    provider: str,
    refused: _Refused,
) -> dict[str, ProvidedPart]:
    """The reason, where it arises and at each call (a caller's own reason only in its file);
    every member is migrated as written (the command line applies parts only where every member
    of the group has one)."""
    where = refused.where if isinstance(refused.where, tuple) else (_position(refused.where).lineno, 1)
    parts = {}
    for path in group.members:
        lines = texts[path].split("\n")
        found: tuple[Diagnostic, ...] = ()
        if path == refused.path:
            found = (_diagnostic(refused.code, lines, refused.where, refused.why),)
        elif refused.code is codes.PROVIDER_NOT_FOLLOWED and index.facts(path).provided:
            site = index.facts(path).provided[0]
            found = (
                _diagnostic(
                    refused.code,
                    lines,
                    (site.line, site.col),
                    f"the provider cannot be followed "
                    f"({names.get(refused.path, refused.path)}:{where[0]}): {refused.why}",
                ),
            )
        parts[path] = ProvidedPart(refused=found, as_written=True)
    return parts


def provider_roles(
    index: ProjectIndex,
    groups: list[Group],
    texts: Mapping[str, str],
    names: Optional[Mapping[str, str]] = None,
) -> dict[str, SharedScaler]:
    """Each member's part in a group tied by one provider of Apex's module (path -> role)."""
    roles: dict[str, SharedScaler] = {}
    for group in groups:
        providers = {(p, s.what) for p in group.members for s in index.facts(p).providers}
        if len(providers) != 1 or any(p not in texts for p in group.members):
            continue
        ((path, name),) = providers
        try:
            parts = _group(index, group, texts, names or {}, path, name)
        except _Refused as refused:
            parts = _refusals(index, group, texts, names or {}, path, refused)
        except (SyntaxError, ValueError):
            continue
        roles.update((p, SharedScaler(provided=part)) for p, part in parts.items())
    return roles
