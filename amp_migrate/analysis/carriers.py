"""Apex's `amp` module handed around as a value, and where that value is provably the scaler.

Real scripts import Apex inside `main()` under `if level == "O1":` (with `amp = None` in the
`else`, or before the `if`) and pass the module on: `train(model, optimizer, amp)`, where
`train` tests `if amp is not None:` and calls `amp.scale_loss`, `amp.master_params`,
`amp.state_dict()`. The value is Apex's module exactly when the branch that imported it ran,
None otherwise. The native form passes the GradScaler in the same slot: a scaler built
unconditionally, enabled where Apex was set up, and a disabled scaler (the identity for
`scale`, `step`, `unscale_`, `state_dict`) where the value was None. Tests of the value's truth
become `scaler.is_enabled()`.

This module proves that flow on the file's `ast` (no rule lives here): one function (the
origin) imports the module and binds the same name only to None otherwise; every read of the
value, there and in the functions it is passed to, is a call of an Apex function the rules
rewrite, a test of its truth, or an argument passed on to a module-level function of the file
whose every call passes the value in that same slot. Anything else (stored on an object,
returned, passed to code the file cannot see, read by a nested function) is a refusal with its
line and column, and the value is left to the shim.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union, cast

from ..io.lines import split_lines

#: The calls on the module value that rules rewrite (`initialize` only where it was imported).
HANDLED = ("scale_loss", "master_params", "state_dict", "load_state_dict")

Place = tuple[int, int]  # line, column (1-based, as diagnostics give them)
_Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]


@dataclass(frozen=True)
class Slot:
    """The parameter of `function` that receives the value."""

    function: str
    param: str
    index: Optional[int]  # its position; None: keyword-only


@dataclass(frozen=True)
class External:
    """Calls of a function another module defines (`from M import f`), passing the value."""

    local: str  # the name this module calls it by
    module: str  # as imported: `M` of `from M import f`
    level: int  # dots of a relative import
    function: str  # its name in M
    index: Optional[int]  # the argument's position in every call (None: by keyword)
    keyword: Optional[str]
    at: Place  # the first call


@dataclass
class Carriers:
    origin: str  # the function that imports Apex's module and hands it on
    name: str  # what it calls the module
    at: Place  # the import
    slots: dict[str, Slot] = field(default_factory=dict)
    tests: set[Place] = field(default_factory=set)  # bare reads tested for truth
    compares: dict[Place, bool] = field(default_factory=dict)  # `x is not None` (True) / `is None`
    nones: set[Place] = field(default_factory=set)  # the `amp = None` statements
    bare_else: set[int] = field(default_factory=set)  # lines of `if`s whose else only holds those
    refusal: Optional[tuple[Place, str]] = None
    #: Functions of other modules the value is passed to; a project accepts them (share.py) or
    #: the rule refuses with their place.
    external: dict[str, External] = field(default_factory=dict)
    #: Slots of this module's functions that other modules fill (the project's `seeds`).
    seeded: frozenset[str] = frozenset()

    def names(self) -> set[str]:
        return ({self.name} | {s.param for s in self.slots.values()}) - {""}

    def carrier(self, function: str) -> Optional[str]:
        """The name that holds the value in `function` (None: it holds none)."""
        if function == self.origin and self.origin:
            return self.name
        slot = self.slots.get(function)
        return slot.param if slot is not None else None


class _Refused(Exception):
    def __init__(self, node: ast.AST, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


def _imported_module(node: ast.AST) -> Optional[str]:
    """The name an `import` binds to Apex's `amp` module (None: it binds none)."""
    if isinstance(node, ast.ImportFrom) and node.module == "apex" and not node.level:
        return next((a.asname or a.name for a in node.names if a.name == "amp"), None)
    if isinstance(node, ast.Import):
        return next((a.asname for a in node.names if a.name == "apex.amp" and a.asname), None)
    return None


def _own_nodes(function: ast.AST) -> Iterator[tuple[ast.AST, ast.AST, bool]]:
    """(node, parent, nested) for everything under `function`; nested: inside a def, lambda,
    class or comprehension of its own."""
    stack = [(child, function, False) for child in ast.iter_child_nodes(function)]
    while stack:
        node, parent, nested = stack.pop()
        yield node, parent, nested
        inner = nested or isinstance(
            node,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.Lambda,
                ast.ClassDef,
                ast.ListComp,
                ast.SetComp,
                ast.DictComp,
                ast.GeneratorExp,
            ),
        )
        stack.extend((child, node, inner) for child in ast.iter_child_nodes(node))


def find_carriers(
    tree: ast.Module, source: str, seeds: Optional[dict[str, str]] = None
) -> Optional[Carriers]:
    """The value flow of Apex's module in this file (None: no function hands it on). `seeds`:
    function -> parameter of this module that other modules of the project pass it to."""
    lines = split_lines(source)
    functions: dict[str, list[_Function]] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(statement.name, []).append(statement)
    found = None
    for name, defs in functions.items():
        for function in defs:
            origin = _origin(function)
            if origin is None:
                continue
            if found is not None:
                found.refusal = (
                    place_of(lines, origin[1]),
                    "Apex's module is handed on from more than one function",
                )
                return found
            found = Carriers(name, origin[0], place_of(lines, origin[1]))
    if found is None and seeds:
        found = Carriers("", "", (1, 1), seeded=frozenset(seeds))
    if found is None:
        return None
    try:
        flow = _Flow(tree, functions, found, lines)
        for seeded, param in (seeds or {}).items():
            defs = functions.get(seeded, [])
            if len(defs) != 1 or not isinstance(defs[0], ast.FunctionDef) or defs[0].decorator_list:
                raise _Refused(tree, f"`{seeded}` is not a function defined once, undecorated, here")
            names = [a.arg for a in (*defs[0].args.posonlyargs, *defs[0].args.args)]
            index = names.index(param) if param in names else None
            found.slots[seeded] = Slot(seeded, param, index)
        flow.run()
    except _Refused as refused:
        found.refusal = (place_of(lines, refused.node), refused.why)
    return found


def _origin(function: ast.AST) -> Optional[tuple[str, ast.AST]]:
    """(name, import) where `function` imports Apex's module and reads it as a value."""
    imports = [(n, _imported_module(n)) for n, _, nested in _own_nodes(function) if not nested]
    imports = [(n, name) for n, name in imports if name is not None]
    for node, name in imports:
        for read, parent, _ in _own_nodes(function):
            if (
                isinstance(read, ast.Name)
                and read.id == name
                and isinstance(read.ctx, ast.Load)
                and not (isinstance(parent, ast.Attribute) and parent.value is read)
            ):
                return name, node
    return None


class _Flow:
    def __init__(
        self, tree: ast.Module, functions: dict[str, list[_Function]], found: Carriers, lines: list[str]
    ) -> None:
        self.tree, self.functions, self.found, self.lines = tree, functions, found, lines
        #: local name -> (module, level, name) of the module's `from M import f` statements
        self.imported: dict[str, tuple[str, int, str]] = {
            (a.asname or a.name): (node.module or "", node.level, a.name)
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for a in node.names
        }
        self.parents: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node

    def run(self) -> None:
        origin = self.functions[self.found.origin][0] if self.found.origin else None
        after = self._origin_bindings(origin) if origin is not None else 0
        pending = [(self.found.origin, self.found.name)] if origin is not None else []
        pending += [(s.function, s.param) for s in self.found.slots.values()]
        done: set[str] = set()
        while pending:
            function, name = pending.pop()
            if function in done:
                continue
            done.add(function)
            node = self.functions[function][0]
            if function != self.found.origin:
                self._parameter_bindings(node, name)
            for read in self._reads(node, name):
                if (
                    function == self.found.origin
                    and read.lineno <= after
                    and not self._in_setup(read, origin)
                ):
                    raise _Refused(read, f"`{name}` is read before Apex is set up")
                slot = self._classify(read, name, function == self.found.origin)
                if slot is not None:
                    pending.append((slot.function, slot.param))
        initialized, imported = getattr(self, "_initialized", (True, None))
        if not initialized:
            assert imported is not None, "_origin_bindings sets both"
            raise _Refused(
                imported,
                f"`{self.found.name}.initialize` does not run in the block that imports "
                "Apex, so whether the value is set and whether the scaler is enabled may differ",
            )
        for slot in self.found.slots.values():
            self._calls_pass_it(slot.function, slot.param, slot.index)
        for external in self.found.external.values():
            self._calls_pass_it(external.local, external.keyword, external.index)

    def _reads(self, function: ast.AST, name: str) -> Iterator[ast.Name]:
        for node, _, nested in _own_nodes(function):
            if isinstance(node, ast.Name) and node.id == name:
                if nested:
                    raise _Refused(node, f"`{name}` is read inside a nested function, class or comprehension")
                if isinstance(node.ctx, ast.Load):
                    yield node
            elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                raise _Refused(node, f"`{name}` is declared global or nonlocal")

    def _in_setup(self, read: ast.Name, origin: Optional[ast.AST]) -> bool:
        """A read inside the `if` block that imports Apex, after the import (`initialize`)."""
        block = self._setup_block
        # By position, not line: a project's provider call becomes the import on the line of
        # the `initialize` it guards (project/provide.py), `from apex import amp; m, o = ...`.
        return (
            block is not None
            and any(read.lineno >= s.lineno and read.lineno <= s.end_lineno for s in block[1:])
            and (read.lineno, read.col_offset) > (block[0].end_lineno, block[0].end_col_offset)
        )

    _setup_block: Optional[list] = None

    def place(self, node: ast.AST) -> Place:
        return place_of(self.lines, node)

    def _origin_bindings(self, origin: _Function) -> int:
        """Checks that the origin binds the name only to the import and to None (before the
        `if` that imports, or in its `else`); the last line of that setup."""
        name = self.found.name
        imported = cast(  # what `_imported_module` names a module for
            Union[ast.Import, ast.ImportFrom],
            next(
                n
                for n, _, nested in _own_nodes(origin)
                if not nested and _imported_module(n) == name and self.place(n) == self.found.at
            ),
        )
        holder = self.parents[id(imported)]
        setup: ast.stmt
        if isinstance(holder, ast.If) and imported in holder.body and self.parents[id(holder)] is origin:
            self._setup_block = holder.body[holder.body.index(imported) :]
            assert holder.end_lineno is not None, "a parsed statement has its end"
            setup, after = holder, holder.end_lineno
        elif holder is origin:
            setup, after = imported, imported.lineno
        else:
            raise _Refused(
                imported,
                "Apex's module is imported inside a loop, `try`, `with` or a nested block and handed on",
            )
        block = holder.body if isinstance(holder, ast.If) else origin.body
        self._initialized = any(_initializes(s, name) for s in block[block.index(imported) + 1 :]), imported
        for node, parent, nested in _own_nodes(origin):
            if nested or node is imported:
                continue
            if (
                _imported_module(node) == name
                or isinstance(node, (ast.Import, ast.ImportFrom))
                and any((a.asname or a.name.split(".")[0]) == name for a in node.names)
            ):
                raise _Refused(node, f"`{name}` is imported more than once")
            if (
                isinstance(node, ast.Name)
                and node.id == name
                and not isinstance(node.ctx, ast.Load)
                or isinstance(node, ast.ExceptHandler)
                and node.name == name
            ):
                self._none_binding(node, parent, origin, setup)
        return after

    def _none_binding(self, node: ast.AST, statement: ast.AST, origin: _Function, setup: ast.stmt) -> None:
        name = self.found.name
        if not isinstance(statement, ast.Assign) or not (
            statement.targets == [node]
            and isinstance(statement.value, ast.Constant)
            and statement.value.value is None
        ):
            raise _Refused(node, f"`{name}` is bound to something other than Apex's module or None")
        holder = self.parents[id(statement)]
        if holder is origin and origin.body.index(statement) < origin.body.index(setup):
            self.found.nones.add(self.place(statement))
            return
        if (
            isinstance(setup, ast.If)
            and holder is setup
            and statement in setup.orelse
            and all(
                isinstance(s, ast.Assign)
                and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == name
                and isinstance(s.value, ast.Constant)
                and s.value.value is None
                for s in setup.orelse
            )
        ):
            self.found.nones.add(self.place(statement))
            self.found.bare_else.add(setup.lineno)
            return
        raise _Refused(
            statement, f"`{name} = None` is not in the `else` of the `if` that imports Apex, nor before it"
        )

    def _parameter_bindings(self, function: _Function, name: str) -> None:
        for node, _, nested in _own_nodes(function):
            if nested:
                continue
            if (
                isinstance(node, ast.Name)
                and node.id == name
                and not isinstance(node.ctx, ast.Load)
                or isinstance(node, (ast.Import, ast.ImportFrom))
                and any((a.asname or a.name.split(".")[0]) == name for a in node.names)
                or isinstance(node, ast.ExceptHandler)
                and node.name == name
            ):
                raise _Refused(node, f"the parameter `{name}` of `{function.name}` is bound again")

    def _classify(self, read: ast.Name, name: str, in_origin: bool) -> Optional[Slot]:
        parent = self.parents[id(read)]
        if isinstance(parent, ast.Attribute) and parent.value is read:
            call = self.parents.get(id(parent))
            if (
                isinstance(call, ast.Call)
                and call.func is parent
                and (parent.attr in HANDLED or in_origin and parent.attr == "initialize")
            ):
                return None
            raise _Refused(read, f"`{name}.{parent.attr}` is used, which no GradScaler stands for")
        if self._truth_context(read):
            self.found.tests.add(self.place(read))
            return None
        if (
            isinstance(parent, ast.Compare)
            and parent.left is read
            and len(parent.ops) == 1
            and isinstance(parent.ops[0], (ast.Is, ast.IsNot))
            and isinstance(parent.comparators[0], ast.Constant)
            and parent.comparators[0].value is None
            and self._truth_context(parent)
        ):
            self.found.compares[self.place(read)] = isinstance(parent.ops[0], ast.IsNot)
            return None
        if isinstance(parent, ast.keyword) and parent.arg is not None:
            # A call's keyword: a class's are nested, and `_reads` refuses nested reads.
            return self._slot(cast(ast.Call, self.parents[id(parent)]), read, name, parent.arg)
        if isinstance(parent, ast.Call) and read in parent.args:
            return self._slot(parent, read, name, parent.args.index(read))
        raise _Refused(
            read, f"`{name}` is used in `{_short(parent)}`, where a GradScaler cannot stand for Apex's module"
        )

    def _truth_context(self, node: ast.AST) -> bool:
        parent = self.parents.get(id(node))
        if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is node:
            return True
        if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
            return True
        return isinstance(parent, ast.BoolOp) and self._truth_context(parent)

    def _slot(self, call: ast.Call, read: ast.Name, name: str, at: Union[int, str]) -> Optional[Slot]:
        callee = call.func.id if isinstance(call.func, ast.Name) else None
        if callee in self.imported and callee not in self.functions:
            self._external(call, read, name, callee, at)
            return None
        defs = self.functions.get(callee or "", [])
        if (
            callee is None  # no def is called ""
            or len(defs) != 1
            or not isinstance(defs[0], ast.FunctionDef)
            or defs[0].decorator_list
            or callee == self.found.origin
        ):
            raise _Refused(
                read,
                f"`{name}` is passed to `{_short(call.func)}`, which is not a function "
                "defined once, undecorated, in this file",
            )
        params = [*defs[0].args.posonlyargs, *defs[0].args.args]
        index: Optional[int]
        if isinstance(at, int):
            if any(isinstance(a, ast.Starred) for a in call.args[: at + 1]) or at >= len(params):
                raise _Refused(read, f"`{name}` is passed to `{callee}` where no named parameter takes it")
            param, index = params[at].arg, at
        else:
            names = [p.arg for p in params[len(defs[0].args.posonlyargs) :]]
            if at not in names and at not in [p.arg for p in defs[0].args.kwonlyargs]:
                raise _Refused(read, f"`{name}` is passed to `{callee}` as `{at}=`, which no parameter takes")
            param, index = at, (params.index(next(p for p in params if p.arg == at)) if at in names else None)
        known = self.found.slots.get(callee)
        if known is not None and known.param != param:
            raise _Refused(read, f"`{callee}` receives Apex's module in two parameters")
        self.found.slots[callee] = Slot(callee, param, index)
        return self.found.slots[callee]

    def _external(self, call: ast.Call, read: ast.Name, name: str, callee: str, at: Union[int, str]) -> None:
        module, level, function = self.imported[callee]
        if isinstance(at, int) and any(isinstance(a, ast.Starred) for a in call.args[: at + 1]):
            raise _Refused(read, f"`{name}` is passed to `{callee}` after `*args`")
        index, keyword = (at, None) if isinstance(at, int) else (None, at)
        known = self.found.external.get(callee)
        if known is not None and (known.index, known.keyword) != (index, keyword):
            raise _Refused(read, f"`{name}` is passed to `{callee}` in two ways")
        if known is None:
            self.found.external[callee] = External(
                callee, module, level, function, index, keyword, self.place(call)
            )
        return None

    def _calls_pass_it(self, function: str, param: Optional[str], index: Optional[int]) -> None:
        """Every use of the function is a direct call that passes the value in the slot."""
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Name) and node.id == function):
                continue
            call = self.parents.get(id(node))
            if isinstance(call, (ast.alias, ast.ImportFrom)):
                continue
            if not (isinstance(call, ast.Call) and call.func is node):
                raise _Refused(
                    node, f"`{function}` receives Apex's module and is used other than by a direct call"
                )
            if any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords
            ):
                raise _Refused(call, f"`{function}` is called with `*args`/`**kwargs`")
            value = next((k.value for k in call.keywords if k.arg == param), None) if param else None
            if value is None and index is not None and index < len(call.args):
                value = call.args[index]
            holder = self._function_around(call)
            held = self.found.carrier(holder) if holder is not None else None
            if not (isinstance(value, ast.Name) and held is not None and value.id == held):
                raise _Refused(call, f"`{function}` is called without Apex's module as `{param or index}`")

    def _function_around(self, node: ast.AST) -> Optional[str]:
        while True:
            parent = self.parents.get(id(node))
            if parent is None:
                return None
            if isinstance(parent, ast.Module):
                return node.name if isinstance(node, ast.FunctionDef) else None
            node = parent


def _initializes(statement: ast.AST, name: str) -> bool:
    """`model, optimizer = amp.initialize(...)` (or the bare call) as a statement of its own."""
    value = statement.value if isinstance(statement, (ast.Assign, ast.Expr)) else None
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "initialize"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name
    )


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def place_of(lines: list[str], node: ast.AST) -> Place:
    """Line and 1-based column in characters (`ast` counts UTF-8 bytes)."""
    lineno, offset = getattr(node, "lineno", 1), getattr(node, "col_offset", 0)
    line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    return lineno, len(line.encode("utf-8")[:offset].decode("utf-8", "replace")) + 1
