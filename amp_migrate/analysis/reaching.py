"""Which bindings of a name can reach each read of it: the flow-sensitive half of Apex binding.

`from apex import amp` followed, later in the file, by `amp = Helper()` gives the name two
meanings. libcst's scope analysis answers per scope (every earlier binding in the scope, every
binding at all for a read inside a function), which is right for "could this be Apex?" but not
for "is this surely Apex?", and the second question is the one a native rewrite must answer:
rewriting `amp.state_dict()` into `scaler.state_dict()` is right only where Apex's `amp` is the
one object the name can hold there.

So the bindings of the names that Apex imports bind are followed through the statements the way
Python runs them (reaching definitions): an assignment replaces what the name held, branches
and loops join what their paths hold, a `try` handler sees every state its body passed
through, `del` and an `except ... as` name unbind. Each read gets the set of bindings that can
reach it. Code that runs later than it is written is read as a whole: a read inside a function
of a name it does not bind sees every binding of that name in the scope that owns it (the
function may be called at any time), and a module-level read also sees the rebindings
functions make through `global`. Where the analysis cannot follow control (an exception, a
`return` or `break`), it keeps more bindings, never fewer: a set can only be too large, which
costs a fallback and never a wrong rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Iterable, Optional, Union

import libcst as cst

from .apex_names import APEX, is_apex_name
from .cst_nodes import children

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_TRIES = (cst.Try, cst.TryStar) if hasattr(cst, "TryStar") else (cst.Try,)
_GUARD_VALUES = ("None", "False", "True")


@dataclass(eq=False)
class Binding:
    """One place that binds (or unbinds) a tracked name."""

    node: cst.CSTNode  # where it is reported: the target, the import alias, the statement
    name: str
    #: The binding as written: text, or the node whose first line, shortened, is `what`.
    written: Union[str, cst.CSTNode]
    apex: Optional[str] = None  # the Apex object an Apex import binds
    harmless: bool = False  # `amp = None` (an import guard): no other object, nothing to rewrite

    @property
    def what(self) -> str:
        """The binding as the reader wrote it, shortened (`amp = Helper()`, `del amp`): laid
        out only for the few a message names, not for every binding a file makes."""
        return self.written if isinstance(self.written, str) else _snippet(self.written)


State = dict  # name -> frozenset of Bindings and _Free tokens


@dataclass(frozen=True)
class _Free:
    """Every binding of `name` in `scope`, known once the whole file has been read."""

    scope: "_Scope"
    name: str


@dataclass(eq=False)
class _Scope:
    kind: str  # "module", "function", "class", "comprehension"
    parent: Optional["_Scope"]
    local: set[str] = field(default_factory=set)
    globals: set[str] = field(default_factory=set)
    nonlocals: set[str] = field(default_factory=set)
    bindings: dict[str, set[Binding]] = field(default_factory=dict)  # every binding, anywhere
    from_inside: dict[str, set[Binding]] = field(default_factory=dict)  # by nested `global`s

    def __hash__(self) -> int:
        return id(self)

    def owner(self, name: str) -> "_Scope":
        """The scope whose variable `name` is, for code running in this one."""
        if name in self.local:
            return self
        if name in self.globals:
            return self.module()
        scope = self.parent
        while scope is not None:
            if scope.kind == "module":
                return scope
            if scope.kind != "class" and name in scope.local:
                return scope
            scope = scope.parent
        return self.module()

    def target(self, name: str) -> "_Scope":
        """The scope a binding of `name` made in this one binds."""
        if name in self.globals:
            return self.module()
        if name in self.nonlocals:
            scope = self.parent
            while scope is not None and not (scope.kind == "function" and name in scope.local):
                scope = scope.parent
            return scope or self.module()
        return self

    def module(self) -> "_Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope


def _snippet(node: cst.CSTNode) -> str:
    text = cst.Module([]).code_for_node(node).strip().split("\n", 1)[0]
    return text if len(text) <= 48 else text[:45].rstrip() + "..."


def _target_names(target: cst.CSTNode) -> Iterable[cst.Name]:
    """The names an assignment target binds (not `x.attr`, `x[i]`)."""
    if isinstance(target, cst.Name):
        yield target
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_names(target.value)


def _pattern_names(pattern: cst.CSTNode) -> Iterable[cst.Name]:
    if isinstance(pattern, (cst.MatchAs, cst.MatchStar)) and pattern.name is not None:
        yield pattern.name
    if isinstance(pattern, cst.MatchMapping) and pattern.rest is not None:
        yield pattern.rest
    for child in children(pattern):
        if isinstance(
            child,
            (
                cst.MatchPattern,
                cst.MatchSequenceElement,
                cst.MatchMappingElement,
                cst.MatchKeywordElement,
                cst.MatchOrElement,
            ),
        ):
            yield from _pattern_names(child)


def _imports_apex_only(statement: cst.CSTNode) -> bool:
    """A statement line of Apex imports, and nothing else."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Import):
            if not all(is_apex_name(alias.evaluated_name) for alias in small.names):
                return False
        elif isinstance(small, cst.ImportFrom):
            if (
                small.relative
                or small.module is None
                or not is_apex_name(cst.Module([]).code_for_node(small.module))
            ):
                return False
        else:
            return False
    return True


class _Scopes:
    """First pass: the scopes, and which tracked names each one binds (Python decides a
    name's scope from every binding in the block, wherever it is)."""

    def __init__(
        self, module: cst.Module, names: frozenset[str], skip: AbstractSet[int] = frozenset()
    ) -> None:
        self.names = names
        self.skip = skip  # statements that spell none of `names`: the scopes in them bind none
        self.of: dict[cst.CSTNode, _Scope] = {}
        self.root = _Scope("module", None)
        self.of[module] = self.root
        self._walk(module.body, self.root)

    def _add(self, scope: _Scope, name: cst.Name) -> None:
        if name.value in self.names:
            scope.local.add(name.value)

    def _walrus_scope(self, scope: _Scope) -> _Scope:
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        return scope

    def _walk(self, node, scope: _Scope) -> None:
        stack: list[tuple[Union[cst.CSTNode, list, tuple], _Scope]] = [(node, scope)]
        skip = self.skip
        while stack:
            item, scope = stack.pop()
            if id(item) in skip:
                continue
            if isinstance(item, (list, tuple)):
                stack.extend((n, scope) for n in item)
            elif isinstance(item, (cst.FunctionDef, cst.Lambda)):
                self._function(item, scope, stack)
            elif isinstance(item, cst.ClassDef):
                self._add(scope, item.name)
                stack.extend((n, scope) for n in (*item.decorators, *item.bases, *item.keywords))
                stack.append((item.body, self.of.setdefault(item, _Scope("class", scope))))
            elif isinstance(item, _COMPREHENSIONS):
                self._comprehension(item, scope, stack)
            elif isinstance(item, cst.Global):
                scope.globals.update(n.name.value for n in item.names)
            elif isinstance(item, cst.Nonlocal):
                scope.nonlocals.update(n.name.value for n in item.names)
            elif isinstance(item, (cst.Import, cst.ImportFrom)):
                if not isinstance(item.names, cst.ImportStar):
                    for alias in item.names:
                        bound = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
                        if bound in self.names:
                            scope.local.add(bound)
            else:
                for name in self._bound_by(item, scope):
                    self._add(scope, name)
                stack.extend((child, scope) for child in children(item))
        # `global x` / `nonlocal x` make x another scope's, whatever the block binds.
        for scope in self.of.values():
            scope.local -= scope.globals | scope.nonlocals
        self.root.local |= self.names

    def _function(self, node, scope: _Scope, stack: list) -> None:
        """A function or lambda: its name, decorators, return annotation, defaults and
        parameter annotations belong to `scope`; its parameters and body to a scope of its own."""
        inner = self.of[node] = _Scope("function", scope)
        if isinstance(node, cst.FunctionDef):
            self._add(scope, node.name)
            stack.extend((d, scope) for d in node.decorators)
            if node.returns is not None:
                stack.append((node.returns, scope))
        params = node.params
        for param in (
            *params.posonly_params,
            *params.params,
            *params.kwonly_params,
            params.star_arg,
            params.star_kwarg,
        ):
            if isinstance(param, cst.Param):
                self._add(inner, param.name)
                if param.default is not None:
                    stack.append((param.default, scope))
                if param.annotation is not None:
                    stack.append((param.annotation, scope))
        stack.append((node.body, inner))

    def _comprehension(self, node, scope: _Scope, stack: list) -> None:
        """A comprehension: its first iterable runs in `scope`, the rest in a scope of its own
        that its targets bind."""
        inner = self.of[node] = _Scope("comprehension", scope)
        stack.append((node.for_in.iter, scope))
        rest = [n for n in children(node) if n is not node.for_in]
        for_in: Optional[cst.CompFor] = node.for_in
        first = True
        while for_in is not None:
            for name in _target_names(for_in.target):
                self._add(inner, name)
            rest.append(for_in.target)
            if not first:
                rest.append(for_in.iter)
            rest.extend(for_in.ifs)
            first, for_in = False, for_in.inner_for_in
        stack.extend((n, inner) for n in rest)

    def _bound_by(self, node, scope: _Scope):
        """The names a statement or expression binds in `scope` itself (a walrus binds in the
        scope around its comprehensions, here and now)."""
        if isinstance(node, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.Del)):
            return _target_names(node.target)
        if isinstance(node, cst.WithItem):
            return _target_names(node.asname.name) if node.asname is not None else ()
        if isinstance(node, cst.ExceptHandler):
            return [node.name.name] if node.name is not None and isinstance(node.name.name, cst.Name) else ()
        if isinstance(node, cst.NamedExpr):
            for name in _target_names(node.target):
                self._add(self._walrus_scope(scope), name)
            return ()
        if isinstance(node, cst.MatchCase):
            return _pattern_names(node.pattern)
        return ()


@dataclass
class _Frame:
    """A block of code running now: a module or function body, or a class body or
    comprehension running inline inside one."""

    scope: _Scope
    state: State
    loops: list[tuple[list[State], list[State]]] = field(default_factory=list)  # breaks, continues
    catchers: list[list[State]] = field(default_factory=list)  # what a `try` body passed through
    finals: list[list[State]] = field(default_factory=list)  # exits that a `finally` runs on


def _join(states: Iterable[State]) -> State:
    out: dict = {}
    for state in states:
        for name, values in state.items():
            out[name] = out.get(name, frozenset()) | values
    return out


class Reaching:
    """The bindings that can reach each read of the tracked names in `module`."""

    def __init__(
        self, module: cst.Module, names: Iterable[str], skip: AbstractSet[int] = frozenset()
    ) -> None:
        """`skip`: statements that spell none of `names` (their scopes are made as they are
        met: nothing in them binds a tracked name)."""
        self.names = frozenset(names)
        scopes = _Scopes(module, self.names, skip)
        self._of = scopes.of
        self._frames: list[_Frame] = []
        self._pending: list[tuple[Union[cst.FunctionDef, cst.Lambda], _Scope, dict[str, frozenset]]] = []
        self._raw: dict[cst.Name, tuple[frozenset, _Scope, bool]] = {}
        self._without_apex = 0  # inside handlers that run only when an Apex import failed
        #: Every binding seen, by the node it is reported at (import aliases included).
        self.bindings: dict[cst.CSTNode, Binding] = {}
        root = scopes.root
        self._frames.append(_Frame(root, {n: frozenset() for n in self.names}))
        self._block(module.body)
        self._frames.pop()
        while self._pending:
            node, scope, entry = self._pending.pop()
            self._frames.append(_Frame(scope, dict(entry)))
            if isinstance(node, cst.Lambda):
                self._expr(node.body)
            else:
                self._suite(node.body)
            self._frames.pop()
        #: read -> the bindings that can reach it (an empty set: none, the read fails)
        self.reads: dict[cst.Name, frozenset[Binding]] = {}
        for read, (values, scope, own) in self._raw.items():
            out: set[Binding] = set()
            for value in values:
                if isinstance(value, _Free):
                    out |= value.scope.bindings.get(value.name, set())
                else:
                    out.add(value)
            if own:
                out |= scope.from_inside.get(read.value, set())
            self.reads[read] = frozenset(out)

    # -- state ------------------------------------------------------------------------------
    @property
    def _frame(self) -> _Frame:
        return self._frames[-1]

    def _snapshot(self) -> State:
        return dict(self._frame.state)

    def _set(self, state: State) -> None:
        self._frame.state = state

    def _lookup(self, name: str) -> tuple[frozenset, _Scope, bool]:
        """What a read of `name` sees here: the values, the scope that owns the variable, and
        whether they come from the flow of that scope's own code."""
        last = len(self._frames) - 1
        for i in range(last, -1, -1):
            frame = self._frames[i]
            if frame.scope.kind == "class" and i != last:
                continue  # code nested in a class body does not see the class's names
            if name in frame.state:
                return frame.state[name], frame.scope, True
            if frame.scope.kind in ("function", "module"):
                break
        owner = self._frame.scope.owner(name)
        return frozenset({_Free(owner, name)}), owner, False

    def _read(self, name: cst.Name) -> None:
        if name.value not in self.names:
            return
        values, scope, own = self._lookup(name.value)
        old = self._raw.get(name)
        if old is not None:
            values = values | old[0]
        self._raw[name] = (values, scope, own)

    def _bind(
        self,
        name: str,
        what,
        at: cst.CSTNode,
        *,
        apex: Optional[str] = None,
        harmless: bool = False,
        weak: bool = False,
        walrus: bool = False,
    ) -> None:
        """`what`: the binding as written (a node, or text); `at`: where it is reported."""
        if name not in self.names:
            return
        binding = self.bindings.get(at)
        if binding is None:
            binding = self.bindings[at] = Binding(at, name, what, apex, harmless or self._without_apex > 0)
        frame = self._frame
        if walrus:  # binds in the function (or module) the comprehensions run in
            frame = next(f for f in reversed(self._frames) if f.scope.kind != "comprehension")
        target = frame.scope.target(name)
        target.bindings.setdefault(name, set()).add(binding)
        for frame in reversed(self._frames):
            if frame.scope is target and name in frame.state:
                before = frame.state[name]
                frame.state[name] = before | {binding} if weak else frozenset({binding})
                for catcher in frame.catchers:
                    catcher.append(dict(frame.state))
                return
        # Bound in a scope whose code is not running here (`global amp` in a function).
        target.from_inside.setdefault(name, set()).add(binding)

    # -- statements -------------------------------------------------------------------------
    def _suite(self, suite: cst.BaseSuite) -> None:
        if isinstance(suite, cst.SimpleStatementSuite):
            for small in suite.body:
                self._small(small)
        else:
            self._block(suite.body)

    def _block(self, statements) -> None:
        for statement in statements:
            self._statement(statement)

    def _statement(self, node: cst.CSTNode) -> None:
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            for small in node.body:
                self._small(small)
        elif isinstance(node, cst.If):
            self._expr(node.test)
            before = self._snapshot()
            self._suite(node.body)
            after = self._snapshot()
            self._set(before)
            if isinstance(node.orelse, cst.If):
                self._statement(node.orelse)
            elif node.orelse is not None:
                self._suite(node.orelse.body)
            self._set(_join([after, self._snapshot()]))
        elif isinstance(node, (cst.For, cst.While)):
            self._loop(node)
        elif isinstance(node, _TRIES):
            self._try(node)
        elif isinstance(node, cst.With):
            self._with(node)
        elif isinstance(node, cst.FunctionDef):
            for decorator in node.decorators:
                self._expr(decorator.decorator)
            self._parameters(node.params)
            if node.returns is not None:
                self._expr(node.returns.annotation)
            self._defer(node)
            self._bind(node.name.value, f"def {node.name.value}(...)", node.name)
        elif isinstance(node, cst.ClassDef):
            for part in (*node.decorators, *node.bases, *node.keywords):
                self._expr(part)
            self._class(node)
            self._bind(node.name.value, f"class {node.name.value}", node.name)
        elif isinstance(node, cst.Match):
            self._match(node)
        else:
            for child in children(node):
                self._expr(child)

    def _small(self, node: cst.BaseSmallStatement) -> None:
        if isinstance(node, cst.Assign):
            self._expr(node.value)
            harmless = isinstance(node.value, cst.Name) and node.value.value in _GUARD_VALUES
            for target in node.targets:
                self._target(target.target, node, harmless=harmless)
        elif isinstance(node, cst.AnnAssign):
            self._expr(node.annotation.annotation)
            if node.value is not None:
                self._expr(node.value)
                harmless = isinstance(node.value, cst.Name) and node.value.value in _GUARD_VALUES
                self._target(node.target, node, harmless=harmless)
            elif not isinstance(node.target, cst.Name):
                self._target(node.target, node)
        elif isinstance(node, cst.AugAssign):
            self._expr(node.target)
            self._expr(node.value)
            self._target(node.target, node)
        elif isinstance(node, cst.Del):
            self._delete(node.target, node)
        elif isinstance(node, cst.Import):
            for alias in node.names:
                full = alias.evaluated_name
                bound = alias.evaluated_alias or full.split(".")[0]
                apex = (full if alias.asname else APEX) if is_apex_name(full) else None
                self._bind(bound, node, alias, apex=apex)
        elif isinstance(node, cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar):
                return
            module = "" if node.relative or node.module is None else cst.Module([]).code_for_node(node.module)
            for alias in node.names:
                bound = alias.evaluated_alias or alias.evaluated_name
                apex = f"{module}.{alias.evaluated_name}" if is_apex_name(module) else None
                self._bind(bound, node, alias, apex=apex)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            return
        elif isinstance(node, (cst.Break, cst.Continue)):
            if self._frame.loops:
                breaks, continues = self._frame.loops[-1]
                (breaks if isinstance(node, cst.Break) else continues).append(self._snapshot())
        else:
            for child in children(node):
                self._expr(child)

    def _target(
        self, target: cst.CSTNode, statement: Union[cst.CSTNode, str], *, harmless: bool = False
    ) -> None:
        """`statement`: the binding as written (a node, or text), as `_bind` takes it."""
        if isinstance(target, cst.Name):
            self._bind(target.value, statement, target, harmless=harmless)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._target(element.value, statement)
        elif isinstance(target, cst.StarredElement):
            self._target(target.value, statement)
        else:  # `x.attr = ...`, `x[i] = ...`: reads x
            self._expr(target)

    def _delete(self, target: cst.CSTNode, statement: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self._read(target)  # `del amp` needs a binding: it uses the one it removes
            self._bind(target.value, statement, target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._delete(element.value, statement)
        else:
            self._expr(target)

    def _loop(self, node) -> None:
        if isinstance(node, cst.For):
            self._expr(node.iter)
        before = self._snapshot()
        head = before
        breaks: list[State] = []
        while True:
            continues: list[State] = []
            self._frame.loops.append((breaks, continues))
            self._set(dict(head))
            if isinstance(node, cst.For):
                self._target(node.target, f"for {_snippet(node.target)} in ...")
            else:
                self._expr(node.test)
            self._suite(node.body)
            self._frame.loops.pop()
            new_head = _join([before, self._snapshot(), *continues])
            if new_head == head:
                break
            head = new_head
        self._set(dict(head))
        if node.orelse is not None:
            self._suite(node.orelse.body)
        self._set(_join([self._snapshot(), *breaks]))

    def _try(self, node) -> None:
        before = self._snapshot()
        caught = [before]
        frame = self._frame
        frame.catchers.append(caught)
        loops_before = [(len(b), len(c)) for b, c in frame.loops]
        self._suite(node.body)
        frame.catchers.pop()
        entry = _join(caught)
        ends: list[State] = []
        raised = [entry]
        frame.catchers.append(raised)
        if node.orelse is not None:
            self._suite(node.orelse.body)
        ends.append(self._snapshot())
        # `try: from apex import amp / except ImportError: amp = FallbackAmp()`: the handler
        # runs only where Apex is not installed, which is not the program being migrated.
        without_apex = bool(node.body.body) and all(_imports_apex_only(s) for s in node.body.body)
        self._without_apex += without_apex
        for handler in node.handlers:
            self._set(dict(entry))
            if handler.type is not None:
                self._expr(handler.type)
            name = handler.name.name if handler.name is not None else None
            if isinstance(name, cst.Name):
                self._bind(name.value, f"except ... as {name.value}", name)
            self._suite(handler.body)
            if isinstance(name, cst.Name):  # Python deletes the name when the handler ends
                self._bind(name.value, f"end of `except ... as {name.value}`", handler)
            ends.append(self._snapshot())
        self._without_apex -= without_apex
        frame.catchers.pop()
        if node.finalbody is None:
            self._set(_join(ends))
            return
        # `finally` also runs on the exits that leave the statement early and on exceptions.
        self._set(_join([*ends, *raised]))
        self._suite(node.finalbody.body)
        final = self._snapshot()
        for (breaks, continues), (nb, nc) in zip(frame.loops, loops_before):
            for exits, start in ((breaks, nb), (continues, nc)):
                exits[start:] = [_join([s, final]) for s in exits[start:]]
        self._set(final)

    def _with(self, node: cst.With) -> None:
        caught = [self._snapshot()]
        self._frame.catchers.append(caught)
        for item in node.items:
            self._expr(item.item)
            if item.asname is not None:
                self._target(item.asname.name, f"with ... as {_snippet(item.asname.name)}")
        caught.append(self._snapshot())
        self._suite(node.body)
        self._frame.catchers.pop()
        # A context manager may swallow an exception raised anywhere in the body.
        self._set(_join([self._snapshot(), *caught[1:]]))

    def _match(self, node: cst.Match) -> None:
        self._expr(node.subject)
        before = self._snapshot()
        ends = [before]
        for case in node.cases:
            self._set(dict(before))
            self._pattern(case.pattern, case)
            ends.append(self._snapshot())  # a pattern may bind, then fail
            if case.guard is not None:
                self._expr(case.guard)
            self._suite(case.body)
            ends.append(self._snapshot())
        self._set(_join(ends))

    def _pattern(self, pattern: cst.CSTNode, case: cst.MatchCase) -> None:
        if isinstance(pattern, cst.MatchValue):
            self._expr(pattern.value)
            return
        if isinstance(pattern, cst.MatchClass):
            self._expr(pattern.cls)
        for child in children(pattern):
            if isinstance(
                child,
                (
                    cst.MatchPattern,
                    cst.MatchSequenceElement,
                    cst.MatchMappingElement,
                    cst.MatchKeywordElement,
                    cst.MatchOrElement,
                ),
            ):
                self._pattern(child, case)
            elif isinstance(pattern, cst.MatchMappingElement) and child is pattern.key:
                self._expr(child)
        for name in ([pattern.name] if isinstance(pattern, (cst.MatchAs, cst.MatchStar)) else []) + (
            [pattern.rest] if isinstance(pattern, cst.MatchMapping) else []
        ):
            if name is not None:
                self._bind(name.value, f"case ... {name.value}", name, weak=True)

    # -- scopes -----------------------------------------------------------------------------
    def _parameters(self, params: cst.Parameters) -> None:
        for param in (
            *params.posonly_params,
            *params.params,
            *params.kwonly_params,
            params.star_arg,
            params.star_kwarg,
        ):
            if isinstance(param, cst.Param):
                if param.default is not None:
                    self._expr(param.default)
                if param.annotation is not None:
                    self._expr(param.annotation.annotation)

    def _scope(self, node: cst.CSTNode, kind: str) -> _Scope:
        scope = self._of.get(node)
        if scope is None:  # in a statement the first pass skipped
            scope = self._of[node] = _Scope(kind, self._frames[-1].scope)
        return scope

    def _defer(self, node) -> None:
        scope = self._scope(node, "function")
        entry: dict[str, frozenset] = {name: frozenset() for name in scope.local}
        params = node.params
        for param in (
            *params.posonly_params,
            *params.params,
            *params.kwonly_params,
            params.star_arg,
            params.star_kwarg,
        ):
            if isinstance(param, cst.Param) and param.name.value in scope.local:
                binding = self.bindings.setdefault(
                    param, Binding(param, param.name.value, f"parameter {param.name.value}")
                )
                scope.bindings.setdefault(param.name.value, set()).add(binding)
                entry[param.name.value] = frozenset({binding})
        self._pending.append((node, scope, entry))

    def _class(self, node: cst.ClassDef) -> None:
        scope = self._scope(node, "class")
        entry: State = {}
        for name in scope.local:
            values, _, _ = self._lookup(name)
            if self._frames[0].scope.kind != "module":  # a class body reads globals, not locals
                values = values | {_Free(scope.module(), name)}
            entry[name] = values
        self._frames.append(_Frame(scope, entry))
        self._suite(node.body)
        self._frames.pop()

    def _comprehension(self, node) -> None:
        self._expr(node.for_in.iter)
        scope = self._scope(node, "comprehension")
        self._frames.append(_Frame(scope, {name: frozenset() for name in scope.local}))
        for_in: Optional[cst.CompFor] = node.for_in
        first = True
        while for_in is not None:
            if not first:
                self._expr(for_in.iter)
            self._target(for_in.target, f"for {_snippet(for_in.target)} in ...")
            for condition in for_in.ifs:
                self._expr(condition.test)
            first, for_in = False, for_in.inner_for_in
        for part in children(node):
            if part is not node.for_in:
                self._expr(part)
        self._frames.pop()

    # -- expressions ------------------------------------------------------------------------
    def _expr(self, node: Optional[cst.CSTNode]) -> None:
        if node is None:
            return
        stack = [node]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Name):
                self._read(node)
            elif isinstance(node, cst.Attribute):
                stack.append(node.value)
            elif isinstance(node, cst.Arg):
                stack.append(node.value)
            elif isinstance(node, cst.Lambda):
                self._parameters(node.params)
                self._defer(node)
            elif isinstance(node, _COMPREHENSIONS):
                self._comprehension(node)
            elif isinstance(node, cst.NamedExpr):
                self._expr(node.value)
                for name in _target_names(node.target):
                    self._bind(name.value, node, name, weak=True, walrus=True)
            else:
                stack.extend(reversed(children(node)))
