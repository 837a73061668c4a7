"""Whether an `if` test is the very switch the GradScaler was built with.

`if args.fp16: <scaled backward> else: loss.backward()` collapses to one scaled backward only
where the test, when false, means the scaler is disabled: the test is one of the `and`-ed
parts of the scaler's `enabled=` (or the scaler is always disabled), and every name it reads
holds, where the `if` is, the value it held where the scaler was built. That is so in the
function that built it when nothing stores into the name after `initialize`; in a function
that reads it as a module global; and in a function the scaler was threaded through when the
name is a parameter that every caller passes on unchanged under the same name, from a
function for which the same holds. Attribute or item stores into the name (`args.fp16 =
False`) anywhere after `initialize` or in another function defeat the proof, as do `global`
and `nonlocal` declarations.

A `self.use_amp` that the method building the scaler sets in its body, before `initialize` and
nowhere else, from a path read unchanged until the scaler is built (`self.use_amp = use_amp`),
reads what that path read. Two more kinds of part hold. A flag that one module-level `try:` sets True beside Apex's imports
(`apex = False / try: from apex import amp; apex = True / except ImportError: ...`), stored
nowhere else after it, read in a function defined after it: the native file has no Apex import
left to fail, so the flag is True. And where the scaler is another module's (project mode), the
`if` test guarding that module's `initialize` in its function `builder(args)`, which the owner
hoists into `enabled=`: a path read here holds it where it reaches, passed down unchanged, this
module's one call of `builder` with the same path for that parameter, with no store into the
path in either module and no other call of `builder` in a process that loads this module
(project/share.py checks the owner's side). Or the owner calls a function of this module after
that guard, passing a part of it (or a prefix of its path) for a parameter, and nothing else may
call that function (project/entry_switch.py): the walk up this module's callers stops at that
parameter, where the function is defined once, never named here, and does not rebind it. This
module holds no rule; the scale_loss rule asks it.
"""

from __future__ import annotations

import ast
from typing import Optional, cast

import libcst as cst
import libcst.matchers as m

from .types import SharedScaler, TrainingPlan, literal

_DEPTH = 8


def conjuncts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The and-ed parts, each as tested for truth (`bool(x)` is false exactly when `x` is)."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And) and not expr.lpar:
        return conjuncts(expr.left) + conjuncts(expr.right)
    if (
        isinstance(expr, cst.Call)
        and m.matches(expr, m.Call(func=m.Name("bool"), args=[m.Arg(keyword=None, star="")]))
        and not expr.lpar
    ):
        return conjuncts(expr.args[0].value)
    return [expr]


def squeezed(code: str) -> str:
    return "".join(code.split())


def _same_key(code: str) -> str:
    """Spelling-blind: `x != 'O0'` and `x != "O0"` are one expression."""
    try:
        return ast.dump(ast.parse(code.strip(), mode="eval"))
    except SyntaxError:
        return squeezed(code)


_FLIPPED = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}


def negation(expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """An expression true exactly where `expr` is false, where one is plain to read: `not x` ->
    `x`, a single `==`/`is`/`in` comparison -> its opposite (`<` is not `>=` for NaN)."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not) and not expr.lpar:
        return expr.expression
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and not expr.lpar:
        target = expr.comparisons[0]
        flipped = _FLIPPED.get(type(target.operator))
        if flipped is not None:
            return expr.with_changes(comparisons=[target.with_changes(operator=flipped())])
    return None


def _read_paths(expr: cst.CSTNode) -> set[tuple[str, ...]]:
    """What an expression reads, as access paths: `args.fp16` -> ("args", "fp16"),
    `self.config["fp16"]` -> ("self", "config", "['fp16']")."""
    path = _cst_path(expr)
    if path is not None:
        return {path}
    out: set[tuple[str, ...]] = set()
    for child in expr.children:
        if isinstance(child, cst.BaseExpression) or isinstance(
            child, (cst.Arg, cst.ComparisonTarget, cst.Element, cst.SubscriptElement, cst.Index)
        ):
            out |= _read_paths(child)
    return out


def _cst_path(expr: cst.CSTNode) -> Optional[tuple[str, ...]]:
    if isinstance(expr, cst.Name):
        return None if expr.value in ("True", "False", "None") else (expr.value,)
    if isinstance(expr, cst.Attribute):
        inner = _cst_path(expr.value)
        return None if inner is None else inner + (expr.attr.value,)
    if (
        isinstance(expr, cst.Subscript)
        and len(expr.slice) == 1
        and isinstance(expr.slice[0].slice, cst.Index)
    ):
        inner = _cst_path(expr.value)
        key = expr.slice[0].slice.value
        if inner is None:
            return None
        return inner + (
            f"[{key.evaluated_value!r}]" if isinstance(key, (cst.SimpleString, cst.Integer)) else "[*]",
        )
    return None


def _ast_path(node: ast.AST) -> Optional[tuple[str, ...]]:
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        inner = _ast_path(node.value)
        return None if inner is None else inner + (node.attr,)
    if isinstance(node, ast.Subscript):
        inner = _ast_path(node.value)
        key = node.slice
        if inner is None:
            return None
        if isinstance(key, ast.Constant) and isinstance(key.value, (str, int)):
            return inner + (f"[{key.value!r}]",)
        return inner + ("[*]",)
    return None


def _conflict(store: tuple[str, ...], read: tuple[str, ...]) -> bool:
    """Storing into `store` may change what `read` reads: one is a prefix of the other."""
    return all(a == b or "[*]" in (a, b) for a, b in zip(store, read))


class _Stores(ast.NodeVisitor):
    """Every store of the file: (access path, line, line of the module-level def around it or
    0, line of the module-level class around it or 0); names declared global or nonlocal;
    objects handed to `setattr`."""

    def __init__(self) -> None:
        self.found: list[tuple[tuple[str, ...], int, int, int]] = []
        self.declared: set[str] = set()
        self.top = self.klass = 0

    def visit_ClassDef(self, node) -> None:
        outer = self.klass
        if outer == 0 and self.top == 0:
            self.klass = min([d.lineno for d in node.decorator_list] + [node.lineno])
        self.generic_visit(node)
        self.klass = outer

    def visit_FunctionDef(self, node) -> None:
        outer = self.top
        if outer == 0:
            self.top = min([d.lineno for d in node.decorator_list] + [node.lineno])
        self.generic_visit(node)
        self.top = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Global(self, node) -> None:
        self.declared.update(node.names)

    visit_Nonlocal = visit_Global

    def visit_Call(self, node) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr", "vars") and node.args:
            path = _ast_path(node.args[0])
            if path is not None:
                self.found.append((path + ("[*]",), node.lineno, self.top, self.klass))
        self.generic_visit(node)

    def _store(self, node) -> None:
        path = _ast_path(node)
        if path is not None:
            self.found.append((path, node.lineno, self.top, self.klass))

    def visit_Name(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._store(node)

    def visit_Attribute(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._store(node)
        self.generic_visit(node)

    visit_Subscript = visit_Attribute


def _apex_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name == "apex" or a.name.startswith("apex.") for a in node.names)
    return (
        isinstance(node, ast.ImportFrom)
        and not node.level
        and node.module is not None
        and (node.module == "apex" or node.module.startswith("apex."))
    )


_LOG_METHODS = ("debug", "info", "warning", "warn", "error", "critical", "exception")


def _constant_store(statement: ast.stmt) -> Optional[str]:
    """The name `statement` assigns a constant to (`APEX_OK = True`), else None."""
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.Constant)
    ):
        return statement.targets[0].id
    return None


def _log_call(statement: ast.stmt) -> bool:
    """`logger.info("apex found")`, `print("...")`: a message of constants, which raises nothing
    an import's `except` would catch (logging reports its own errors)."""
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return False
    call = statement.value
    func = call.func
    named = (
        isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr in _LOG_METHODS
    ) or (isinstance(func, ast.Name) and func.id == "print")
    return named and all(isinstance(a, ast.Constant) for a in call.args) and not call.keywords


def _inner_try(statement: ast.stmt, name: str) -> bool:
    """A nested `try:` of Apex imports (`from apex.parallel import ...`) beside other flags: once
    no Apex import is left it runs its constant stores and nothing else; none of them is `name`."""
    if not isinstance(statement, ast.Try) or statement.orelse or statement.finalbody:
        return False
    handled = [s for h in statement.handlers for s in h.body]
    return all(
        _apex_import(s) or _log_call(s) or _constant_store(s) not in (None, name) for s in statement.body
    ) and all(
        isinstance(s, ast.Pass) or _log_call(s) or _constant_store(s) not in (None, name) for s in handled
    )


def _sets_flag(node: ast.Try, name: str) -> bool:
    """`try:` whose body is Apex imports, constant assignments to names (the last of them to
    `name` being `name = True`), constant log messages and nested `try:` blocks of the same kind
    that never store `name`; no `else` or `finally` (its handlers never run natively)."""
    if node.orelse or node.finalbody or not any(_apex_import(s) for s in node.body):
        return False
    last = None
    for statement in node.body:
        if _apex_import(statement) or _log_call(statement) or _inner_try(statement, name):
            continue
        if _constant_store(statement) is None:
            return False
        if _constant_store(statement) == name:
            last = cast(ast.Constant, cast(ast.Assign, statement).value).value  # as _constant_store saw
    return last is True


def file_stores(rule) -> Optional[tuple[ast.Module, "_Stores"]]:
    """The file's `ast` (the index's where there is one) and every store in it; None where it
    does not parse. Read from the file as given, so found once per file for every rule."""
    state = rule.state
    if state.file_stores is None:
        state.file_stores = _file_stores(state) or ()
    return state.file_stores or None


def _file_stores(state) -> Optional[tuple[ast.Module, "_Stores"]]:
    index = state.index
    try:
        tree = index.tree if index is not None else ast.parse(state.original)
    except (SyntaxError, ValueError):
        return None
    stores = _Stores()
    stores.visit(tree)
    return tree, stores


def function_of(rule, node: cst.CSTNode):
    """The module-level def or method around `node` (None at module level, False when nested
    deeper)."""
    scopes = [p for p in rule.ancestors(node) if isinstance(p, (cst.FunctionDef, cst.Lambda, cst.ClassDef))]
    if not scopes:
        return None
    if (
        not isinstance(scopes[0], cst.FunctionDef)
        or len(scopes) > 2
        or (len(scopes) == 2 and not isinstance(scopes[1], cst.ClassDef))
    ):
        return False
    return scopes[0]


def _parameter(function: cst.FunctionDef, name: str) -> bool:
    params = function.params
    return any(p.name.value == name for p in [*params.posonly_params, *params.params, *params.kwonly_params])


def import_flag(rule, tree: ast.Module, stores: "_Stores", part: cst.BaseExpression, where) -> Optional[int]:
    """The line of the module-level `try:` that sets `part` True beside Apex's imports
    (`apex = False / try: from apex import amp; apex = True / except ImportError: ...`), where
    `part` is that flag read in the function `where`, defined after that `try`, that does not
    bind it; None otherwise. The native file has no Apex import left (or it falls back), so what
    remains of that `try` cannot fail and the flag is True wherever the function can run; stores
    of it elsewhere (in a function, after the `try`, `global`) defeat the proof."""
    if (
        not isinstance(part, cst.Name)
        or where is None
        or where is False
        or part.value in ("True", "False", "None")
    ):
        return None
    name = part.value
    if name in stores.declared or _parameter(where, name):
        return None
    found = [s for s in tree.body if isinstance(s, ast.Try) and _sets_flag(s, name)]
    if len(found) != 1:
        return None
    start, end = found[0].lineno, found[0].end_lineno
    assert end is not None, "a parsed statement has its end"
    if any(
        p[0] == name and not (top == 0 and klass == 0 and line <= end) for p, line, top, klass in stores.found
    ):
        return None
    outer = [p for p in rule.ancestors(where) if isinstance(p, cst.ClassDef)]
    return start if rule.position(outer[-1] if outer else where)[0] > end >= start else None


_REPORTS = m.Call(
    func=m.Attribute(attr=m.OneOf(*(m.Name(n) for n in _LOG_METHODS)))
    | m.Name("print")
    | m.Attribute(value=m.Name("warnings"), attr=m.Name("warn"))
)


def _only_reports(rule, orelse: cst.Else) -> bool:
    """The `else` only says Apex is missing: `pass`, `raise`, log or print calls, with no Apex
    name in it."""
    for statement in orelse.body.body:
        if not isinstance(statement, cst.SimpleStatementLine) or not all(
            isinstance(s, (cst.Pass, cst.Raise)) or (isinstance(s, cst.Expr) and m.matches(s.value, _REPORTS))
            for s in statement.body
        ):
            return False
        if any(rule.apex_name(n) is not None for n in m.findall(statement, m.Name() | m.Attribute())):
            return False
    return True


def flag_branch(rule, branch: cst.If, tree: ast.Module, stores: "_Stores") -> Optional[int]:
    """`if FLAG: ... else: <only reports that Apex is missing>` (or no `else`), FLAG a flag the
    Apex import's `try:` sets True (import_flag): natively the body always runs and the `else`
    never does, so the `if` is its body. The line of that `try`, else None."""
    if branch.orelse is not None and not (
        isinstance(branch.orelse, cst.Else) and _only_reports(rule, branch.orelse)
    ):
        return None
    where = function_of(rule, branch)
    return import_flag(rule, tree, stores, branch.test, where) if where else None


class SwitchProof:
    def __init__(self, rule, plan: TrainingPlan) -> None:
        self.rule, self.plan = rule, plan
        self._stores: Optional[_Stores] = None
        self._tree: Optional[ast.Module] = None
        self._init_method: Optional[tuple[Optional[int], int]] = None

    def holds(self, branch: cst.If, test: Optional[cst.BaseExpression] = None) -> bool:
        """Whether `test` (default: the branch's own) is false only where the scaler is disabled."""
        test = branch.test if test is None else test
        enabled = next(
            (
                a.value
                for a in self.plan.scaler_call.args
                if a.keyword is not None and a.keyword.value == "enabled"
            ),
            None,
        )
        if enabled is not None and literal(enabled) is False:
            return True  # always disabled: `scale(loss)` is `loss`
        if self._all_stores() is None:
            return False
        where = self._function_of(branch)
        if where is False:
            return False
        if enabled is None:
            return self._owner_switch(test, where)
        code = self.rule.code_of
        parts = {_same_key(code(c)) for c in conjuncts(enabled)}
        paths = {_cst_path(c) for c in conjuncts(enabled)} - {None}
        for part in conjuncts(test):
            if squeezed(code(part)) == f"{self.plan.scaler}.is_enabled()":
                continue  # false exactly when the scaler is disabled
            if self._available(part, where):
                continue  # `apex and args.fp16`: `apex` is True once torch.amp replaces Apex
            path = _cst_path(part)
            read = self._translated(where, path, 0) if path is not None else None
            if read is not None and (read in paths or self._self_alias(read) in paths):
                continue  # `fp16` passed down from `args.fp16`, `self.use_amp` set from `use_amp`
            if _same_key(code(part)) not in parts or not all(
                self._translated(where, p, 0) == p for p in _read_paths(part)
            ):
                return False
        return True

    def _all_stores(self) -> Optional[_Stores]:
        if self._stores is None:
            found = file_stores(self.rule)
            if found is None:
                return None
            self._tree, self._stores = found
        return self._stores

    # What `_all_stores()` found, asked for once it has found them.
    def _known_stores(self) -> _Stores:
        assert self._stores is not None, "asked before _all_stores() found them"
        return self._stores

    def _known_tree(self) -> ast.Module:
        assert self._tree is not None, "asked before _all_stores() found the stores"
        return self._tree

    def _shared(self) -> SharedScaler:
        """The other module's scaler, asked about where `_owner_switch` saw there is one."""
        assert self.plan.shared is not None, "the scaler is this module's"
        return self.plan.shared

    def instance_flag(self, test: cst.BaseExpression) -> Optional[str]:
        """Where the scaler is another module's and `test` reads an attribute of `self` (a
        Trainer's `self.use_amp`): why that flag cannot be tied to the scaler's switch, located
        at the store that sets it; None otherwise (the plain AMP220 applies). The owner's switch
        reaches this class only through the code that constructs it, and that code is not
        followed across modules."""
        shared = self.plan.shared
        if shared is None or not shared.user or self._all_stores() is None:
            return None
        for part in conjuncts(test):
            path = _cst_path(part)
            if path is None or len(path) < 2 or path[0] != "self":
                continue
            code = self.rule.code_of(part)
            sets = [(line, top) for p, line, top, _ in self._known_stores().found if p == path[:2]]
            where = "it is set nowhere in this file"
            if len(sets) == 1:
                where = f"it is set at line {sets[0][0]}{self._from_parameter(path[:2], sets[0][0])}"
            elif sets:
                where = "it is set at lines " + ", ".join(str(line) for line, _ in sets)
            return (
                f"`{code}` may be false while the GradScaler {shared.other} builds is enabled: {where}, "
                f"and nothing in this module ties it to the condition that scaler is built with (the "
                f"code that builds the optimizer and constructs this class would have to pass one "
                f"value to both, and calls are not followed across modules to prove it)"
            )
        return None

    def _from_parameter(self, path: tuple[str, ...], line: int) -> str:
        """`, from `__init__`'s parameter `use_amp`` where the store at `line` is `self.x = x` in
        a method of that parameter."""
        for function in ast.walk(self._known_tree()):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [
                a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)
            ]
            for node in function.body:
                if (
                    isinstance(node, ast.Assign)
                    and node.lineno == line
                    and len(node.targets) == 1
                    and _ast_path(node.targets[0]) == path
                    and isinstance(node.value, ast.Name)
                    and node.value.id in params
                ):
                    return f", from `{function.name}`'s parameter `{node.value.id}`"
        return ""

    # -- a scaler built in another module --------------------------------------------------------
    def _owner_switch(self, test: cst.BaseExpression, where) -> bool:
        """The scaler is another module's, built with `enabled=` the `if` test guarding its
        `initialize` in a function `builder(args, ...)` (project/share.py gives the test's
        paths from the builder's parameters). The branch's test holds what the guard held
        where each conjunct is one of those paths, passed down unchanged from the one call of
        `builder` in this module, or an availability flag."""
        shared = self.plan.shared
        if shared is None or not ((shared.switch_via and shared.switch_paths) or shared.switch_entries):
            return False
        for part in conjuncts(test):
            if self._available(part, where):
                continue
            path = _cst_path(part)
            if path is None or not self._reaches_builder(where, path, 0):
                return False
        return True

    def _reaches_builder(
        self, function: Optional[cst.FunctionDef], path: tuple[str, ...], depth: int
    ) -> bool:
        stores, shared = self._known_stores(), self._shared()
        if (
            path[0] in stores.declared
            or depth > _DEPTH
            or path[0] == "self"
            or any(len(p) > 1 and _conflict(p, path) for p, _, _, _ in stores.found)
        ):
            return False
        here = self._line(function)
        names = [
            line
            for p, line, top, klass in stores.found
            if p == path[:1] and top == here and (function is not None or klass == 0)
        ]
        module = self.rule.context.wrapper.module
        via = shared.switch_via
        calls = (
            [
                c
                for c in self.rule.findall(module, m.Call(), {via.rsplit(".", 1)[-1]})
                if self.rule.code_of(c.func) == via
            ]
            if via
            else []
        )
        if any(self._function_of(c) is function for c in calls):
            if len(calls) != 1:
                return False
            line = self.rule.position(calls[0])[0]
            return not any(at >= line for at in names) and any(
                _cst_path(value) is not None and _cst_path(value) + rest == path
                for value, rest in self._builder_arguments(calls[0])
            )
        if self._entered(function, path):
            return not names
        if names or function is None or not self._is_parameter(function, path[0]):
            return False
        return self._callers_pass(function, path, depth)

    def _entered(self, function: Optional[cst.FunctionDef], path: tuple[str, ...]) -> bool:
        """`path` read in `function` is what the owner passed it, after its guard, for a part of
        that guard (SharedScaler.switch_entries): `function` is a module-level def, defined
        once, whose name this module spells nowhere else (no call, no reference that could run
        it with another value)."""
        if function is None or not isinstance(self.rule.parent(function), cst.Module):
            return False
        name = function.name.value
        if not any(entry == (name, path[0], path[1:]) for entry in self._shared().switch_entries):
            return False
        tree = self._known_tree()
        defs = [
            s
            for s in tree.body
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and s.name == name
        ]
        return (
            len(defs) == 1
            and self._is_parameter(function, path[0])
            and not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree))
        )

    def _builder_arguments(self, call: cst.Call):
        """(what the call passes for a guard's parameter, the rest of the guard's path)."""
        for index, name, rest in self._shared().switch_paths:
            value = self._argument(call, name, index if index >= 0 else None)
            if value is not None:
                yield value, rest

    def _callers_pass(self, function: cst.FunctionDef, path: tuple[str, ...], depth: int) -> bool:
        """Every call of `function` in this module passes, for `path[0]`, a path that reaches
        the builder's call unchanged."""
        if not isinstance(self.rule.parent(function), cst.Module):
            return False
        name = path[0]
        params = function.params
        positional = [p.name.value for p in [*params.posonly_params, *params.params]]
        fname = function.name.value
        calls = self.rule.findall(self.rule.context.wrapper.module, m.Call(func=m.Name(fname)), {fname})
        for call in calls:
            value = self._argument(call, name, positional.index(name) if name in positional else None)
            passed = _cst_path(value) if value is not None else None
            caller = self._function_of(call)
            if (
                passed is None
                or caller is False
                or not self._reaches_builder(caller, passed + path[1:], depth + 1)
            ):
                return False
        return bool(calls)

    # -- flags that say Apex was importable ---------------------------------------------------
    def _available(self, part: cst.BaseExpression, where) -> bool:
        """`part` is a flag the Apex import's `try:` sets True (import_flag)."""
        return (
            where is not None
            and import_flag(self.rule, self._known_tree(), self._known_stores(), part, where) is not None
        )

    def _function_of(self, node: cst.CSTNode):
        return function_of(self.rule, node)

    def _line(self, function: Optional[cst.FunctionDef]) -> int:
        return self.rule.position(function)[0] if function is not None else 0

    def _translated(
        self, function: Optional[cst.FunctionDef], path: tuple[str, ...], depth: int
    ) -> Optional[tuple[str, ...]]:
        """What `path`, read in `function`, reads where the scaler was built (the same path,
        or the caller's argument it was passed as); None where that is not provable."""
        stores, plan = self._known_stores(), self.plan
        if path[0] in stores.declared:
            return None
        here = self._line(function)
        # a store into the object (attribute, item) counts wherever it is, unless it ran
        # before `initialize` in the function that calls it
        ctor, until = self._constructor() if path[0] == "self" else (None, 0)
        if any(
            len(p) > 1
            and _conflict(p, path)
            and (top != plan.init_scope or line > plan.init_line)
            and not (top == ctor and line < until)
            for p, line, top, _ in stores.found
        ):
            return None
        names = [(line, top) for p, line, top, _ in stores.found if p == path[:1]]
        if here == plan.init_scope:
            return None if any(top == here and line > plan.init_line for line, top in names) else path
        if function is None or depth > _DEPTH or any(top == here for _, top in names):
            return None
        if path[0] == "self" and self._method_of_planned_class(function):
            return path  # the instance the scaler lives on
        if not self._is_parameter(function, path[0]):  # a module global
            first = min(plan.init_scope or plan.init_line, here)
            unchanged = (
                all(top == 0 and line < first for line, top in names)
                if plan.init_scope
                else not any(top == 0 and line > plan.init_line for line, top in names)
            )
            return path if unchanged else None
        return self._passed_on(function, path, depth)

    def _self_alias(self, path: tuple[str, ...]) -> Optional[tuple[str, ...]]:
        """`self.use_amp` where the method building the scaler sets it, in its body before
        `initialize` and nowhere else, from a path (`self.use_amp = use_amp`) read unchanged
        until the scaler is built: that path, as read there."""
        plan, stores = self.plan, self._known_stores()
        if len(path) < 2 or path[0] != "self":
            return None
        sets = [(line, top) for p, line, top, _ in stores.found if p == path[:2]]
        if len(sets) != 1 or sets[0][1] != plan.init_scope or not sets[0][0] < plan.init_line:
            return None
        line = sets[0][0]
        value = next(
            (
                _ast_path(n.value)
                for f in ast.walk(self._known_tree())
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in f.body
                if isinstance(n, ast.Assign)
                and n.lineno == line
                and len(n.targets) == 1
                and _ast_path(n.targets[0]) == path[:2]
            ),
            None,
        )  # runs whenever the method does
        if value is None or value[0] == "self":
            return None
        alias = value + path[2:]
        if any(
            (p == alias[:1] and top == plan.init_scope and line < at <= plan.init_line)
            or (len(p) > 1 and _conflict(p, alias) and (top != plan.init_scope or at > plan.init_line))
            for p, at, top, _ in stores.found
        ):
            return None
        return alias

    def _constructor(self) -> tuple[Optional[int], int]:
        """The line of `__init__` of the class whose method builds the scaler, and the line
        before which its stores into `self` run before that method can (the first line of
        `__init__` naming it; its end when it names it nowhere)."""
        if self._init_method is None:
            self._init_method = (None, 0)
            klass = self._planned_class()
            if klass is not None:
                methods = [s for s in klass.body.body if isinstance(s, cst.FunctionDef)]
                builder = next((f for f in methods if self._line(f) == self.plan.init_scope), None)
                ctor = next((f for f in methods if f.name.value == "__init__"), None)
                if builder is not None and ctor is not None and ctor is not builder:
                    call = m.Attribute(value=m.Name("self"), attr=m.Name(builder.name.value))
                    until = next(
                        (self.rule.position(s)[0] for s in ctor.body.body if m.findall(s, call)), 10**9
                    )
                    self._init_method = (self._line(ctor), until)
        return self._init_method

    def _planned_class(self) -> Optional[cst.ClassDef]:
        """The module-level class one of whose methods builds the scaler."""
        module = self.rule.context.wrapper.module
        for statement in module.body:
            if isinstance(statement, cst.ClassDef) and any(
                isinstance(s, cst.FunctionDef) and self._line(s) == self.plan.init_scope
                for s in statement.body.body
            ):
                return statement
        return None

    def _method_of_planned_class(self, function: cst.FunctionDef) -> bool:
        owner = self.rule.parent(self.rule.parent(function))
        return self.plan.placement == "self" and owner is not None and owner is self._planned_class()

    @staticmethod
    def _is_parameter(function: cst.FunctionDef, name: str) -> bool:
        return _parameter(function, name)

    def _passed_on(
        self, function: cst.FunctionDef, path: tuple[str, ...], depth: int
    ) -> Optional[tuple[str, ...]]:
        """`path[0]` is a parameter of `function`; what every call passes for it, read where
        the scaler was built (None unless all calls agree)."""
        name = path[0]
        params = function.params
        positional = [p.name.value for p in [*params.posonly_params, *params.params]]
        if name not in positional and name not in [p.name.value for p in params.kwonly_params]:
            return None
        if not isinstance(self.rule.parent(function), cst.Module):
            return None
        fname = function.name.value
        module = self.rule.context.wrapper.module
        found: set = set()
        for call in self.rule.findall(module, m.Call(func=m.Name(fname)), {fname}):
            value = self._argument(call, name, positional.index(name) if name in positional else None)
            passed = _cst_path(value) if value is not None else None
            caller = self._function_of(call)
            if passed is None or caller is False:
                return None
            found.add(self._translated(caller, passed + path[1:], depth + 1))
        return found.pop() if len(found) == 1 else None

    @staticmethod
    def _argument(call: cst.Call, name: str, index: Optional[int]) -> Optional[cst.BaseExpression]:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == name:
                return arg.value
        if index is None:
            return None
        for i, arg in enumerate(call.args):
            if arg.star or arg.keyword is not None:
                return None
            if i == index:
                return arg.value
        return None
