"""Forward calls that Apex cast and the native output leaves outside every autocast region.

What it does
    Names, at their line, each call of a model `amp.initialize` returned (and, at O1, of any
    module the file binds: an EMA copy, a teacher, an instance of a file's `nn.Module` class)
    that lies outside every `with ... autocast(...)` of the migrated file: an evaluation loop
    after training, an evaluation function, an EMA model's forward. It changes nothing.

Why
    Apex O1 patched torch's functions for the whole process from `initialize` on, so
    evaluation ran in float16 too; O2/O3 cast the model itself to float16, so every call of it
    did. The native rewrite puts only the training forward under `torch.autocast` (with fp32
    weights at every level), so these calls now run in float32: slightly different numbers
    (a test loss 13.4751 under Apex, 13.4710 migrated, on a real repository), more memory and
    time on GPU. Whether evaluation should follow Apex (`with torch.autocast(...)` around it)
    or stay in float32 is the user's choice; the message says how to get Apex's behaviour.

Fix safety
    No fix: the diagnostic is information, and it never makes a file fall back.

Example
    for x, y in loader:
        with amp.scale_loss(loss_fn(model(x), y), opt) as s:
            s.backward()
    model.eval()
    test_loss = loss_fn(model(x_test), y_test)  # AMP170: float16 under Apex O1, float32 now

Soundness
    The check reads the output, so "outside autocast" is what the migrated file does, and
    reports only where that is certain: a call is skipped when it lies inside any `with` whose
    context manager is an `autocast` call (written by the migration or the user's own) or a
    function decorated with one, inside
    a function that a name inside such a region calls (transitively: autocast is dynamically
    scoped, so the function may run under it), inside an `nn.Module` subclass or a `forward`
    method (a module's internals run under whatever calls the module), or in the function that
    calls `initialize`, before it (Apex had not patched anything yet). Models are followed by
    name, as the file spells them (`model`, `self.model`): `initialize`'s models and the names
    it binds, names assigned from them (`ema = deepcopy(model)`, `AveragedModel(model)`, a
    DataParallel wrapper, any call whose name says EMA), and at O1 names assigned from a call
    of a `nn.Module` class the file defines. Those names, the file's module classes and which
    function calls which come from Python's parse of the whole file, and a region's calls from
    the region itself, so the statements the visit skips (those that name no model) still
    count. O0 and `enabled=False` cast nothing and report
    nothing; a level only known at run time is reported with the levels at which Apex cast.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from ..diagnostics import Severity, define
from ..plan.types import CastSource
from .base import TrainingRule
from .facts import Fact

OUTSIDE_AUTOCAST = define(
    "AMP170",
    "forward-outside-autocast",
    Severity.INFO,
    "This forward call ran in float16 under Apex and runs in float32 natively: it is outside "
    "every autocast region of the migrated file.",
    "Apex O1 patched torch's functions for the whole process from `amp.initialize` on, so an "
    "evaluation loop, an evaluation function or an EMA model's forward ran in float16 like the "
    "training forward; O2 and O3 cast the model itself to float16, so every call of it did. "
    "The native rewrite puts only the training forward under `torch.autocast` (fp32 weights at "
    "every level), so these calls now compute in float32: metrics and losses move in their "
    "last digits (a real repository's test loss went from 13.4751 to 13.4710), and on a GPU "
    "evaluation takes more memory and time. The code is left as it is; to run it as Apex did, "
    "wrap it in the `torch.autocast(...)` the message names (under `torch.inference_mode()` "
    "too, if you like): the training region's own, less its `enabled=` switch where the call "
    "is in another function than `initialize` (which that function may not be able to read; "
    "the message quotes it). Where `opt_level` is only known at run time the message says at "
    "which levels Apex cast the call. Found by name: calls of the models `initialize` returned, of names "
    "assigned from them (an EMA copy, a DataParallel wrapper) and, at O1, of instances of the "
    "file's own `nn.Module` classes; calls inside an autocast region, in a function called from "
    "one, or inside a module's own methods are never reported.",
    before='model, opt = amp.initialize(model, opt, opt_level="O1")\n'
    "...  # training loop\n"
    "model.eval()\n"
    "test_loss = F.cross_entropy(model(x_test), y_test)",
    after='scaler = torch.amp.GradScaler("cuda")\n'
    "...  # training loop, its forward under torch.autocast\n"
    "model.eval()\n"
    'with torch.autocast("cuda", dtype=torch.float16):  # as Apex ran it; float32 without\n'
    "    test_loss = F.cross_entropy(model(x_test), y_test)",
)

#: Callees whose result is the model they are given, or a copy of it (cast as it was).
_WRAPPERS = frozenset(
    {"deepcopy", "AveragedModel", "DataParallel", "DistributedDataParallel", "DDP", "to", "cuda", "half"}
)
#: Attributes through which a wrapper's forward is called (`ddp.module(x)`, `ema.ema(x)`).
_FORWARDS = ("forward", "module", "ema")
_MODULE_OWNERS = ("forward", "__call__")


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _spelling(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _spelling(node.value)
        return f"{base}.{node.attr.value}" if base is not None else None
    return None


def _spelled(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _spelled(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _called(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _last(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


@dataclass
class _Facts:
    """What the file as given says about its models, read from Python's parse of it (which
    holds every statement, where the rule's own visit skips those that name no model)."""

    classes: set[str] = field(default_factory=set)  # the file's `nn.Module` subclasses
    bindings: list[tuple[str, ast.expr]] = field(default_factory=list)  # (target, value)
    callees: dict[str, set[str]] = field(default_factory=dict)  # function -> the names it calls
    aliases: set[str] = field(default_factory=set)  # `from torch... import autocast as <name>`

    @classmethod
    def of(cls, tree: ast.Module) -> "_Facts":
        """One walk: a call anywhere inside a `def` (its decorators and defaults included, and
        the functions nested in it) counts for every `def` around it."""
        facts = cls()
        stack: list[tuple[ast.AST, tuple[set[str], ...]]] = [(tree, ())]
        while stack:
            node, around = stack.pop()
            if isinstance(node, ast.ClassDef) and any(_called(b) == "Module" for b in node.bases):
                facts.classes.add(node.name)
            elif isinstance(node, ast.Assign):
                spelled = [_spelled(t) for t in node.targets]
                facts.bindings += [(t, node.value) for t in spelled if t is not None]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                around = (*around, facts.callees.setdefault(node.name, set()))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                facts.aliases.update(a.asname or a.name for a in node.names if a.name == "autocast")
            elif isinstance(node, ast.Call) and around:
                called = _called(node.func)
                if called:
                    for calls in around:
                        calls.add(called)
            stack.extend((child, around) for child in ast.iter_child_nodes(node))
        return facts

    def derived(self, names: set[str]) -> set[str]:
        """`names` and every name the file assigns from one of them, a copy or a wrapper of it."""
        found = set(names)
        changed = True
        while changed:
            changed = False
            for target, value in self.bindings:
                if target not in found and self._from(value, found):
                    found.add(target)
                    changed = True
        return found

    def _from(self, value: ast.expr, names: set[str]) -> bool:
        if _spelled(value) in names:
            return True
        if not isinstance(value, ast.Call):
            return False
        called = _called(value.func) or ""
        if (
            isinstance(value.func, ast.Attribute)
            and called in _WRAPPERS
            and self._from(value.func.value, names)
        ):
            return True  # `model.to(device)`, `model.cuda()`
        wraps = called in _WRAPPERS or "ema" in called.lower()
        return wraps and any(_spelled(arg) in names for arg in value.args)

    def instances(self) -> set[str]:
        """Names assigned an instance of one of the file's `nn.Module` classes (`Net().to(d)`)."""
        found = set()
        for target, value in self.bindings:
            root = value
            while isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute):
                root = root.func.value
            if isinstance(root, ast.Call) and _called(root.func) in self.classes:
                found.add(target)
        return found

    def covered(self, called_in_regions: set[str]) -> set[str]:
        """Functions that may run under autocast: called in a region, or by such a function."""
        covered = set(called_in_regions)
        pending = list(covered)
        while pending:
            for name in self.callees.get(pending.pop(), ()):
                if name not in covered:
                    covered.add(name)
                    pending.append(name)
        return covered


@dataclass
class _Call:
    node: cst.Call
    callee: str
    functions: tuple  # names of the `def`s around it, outermost first
    scope: Optional[cst.FunctionDef]  # the innermost `def` around it


class ForwardOutsideAutocast(TrainingRule):
    """Name the forward calls Apex cast that the native file runs outside autocast."""

    HANDLES = ()
    EMITS = (OUTSIDE_AUTOCAST,)
    READS = frozenset({Fact.CASTS, Fact.FALLBACK_REASONS, Fact.TRAINING})
    WRITES = frozenset[Fact]()

    MARKERS = ("initialize", "init(")

    @classmethod
    def applies(cls, state, context) -> bool:
        return bool(state.casts) and not state.falls_back and super().applies(state, context)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.sources: tuple[CastSource, ...] = tuple(
            s for s in state.casts if s.enabled and s.opt_level != "O0"
        )
        index = state.index
        self.facts = _Facts.of(index.tree) if index is not None else None
        self.cast: set[str] = set()  # what `initialize` cast, and its copies and wrappers
        self.instances: set[str] = set()  # at O1: the file's other modules
        if self.facts is not None and self.sources:
            self.cast = self.facts.derived(set().union(*(s.models for s in self.sources)))
            if any(s.opt_level in ("O1", None) for s in self.sources):
                self.instances = self.facts.derived(self.facts.instances()) - self.cast
        self.regions = 0  # autocast `with` blocks (or decorated functions) around the node visited
        self.functions: list[cst.FunctionDef] = []
        self.module_classes = 0  # `nn.Module` subclasses around it
        self.calls: list[_Call] = []
        self.in_regions: set[str] = set()  # names called inside autocast regions

    def interest(self):
        """Statements that name a model (a call of one names it) or an autocast; a region's
        own calls are read from the region itself, whatever its statements spell. Without the
        file's parse (syntax newer than this interpreter) nothing is known to be a model."""
        names = self.cast | self.instances
        words = {name.rsplit(".", 1)[-1] for name in names}  # `self.model(x)` spells `model`
        return frozenset(words | {"autocast"} | (self.facts.aliases if self.facts else set()))

    def _autocast(self, func: cst.BaseExpression) -> bool:
        aliases = self.facts.aliases if self.facts is not None else set()
        return _last(func) == "autocast" or _code(func) in aliases

    def _region(self, node: cst.With) -> bool:
        return any(isinstance(item.item, cst.Call) and self._autocast(item.item.func) for item in node.items)

    def visit_With(self, node: cst.With) -> None:
        if self._region(node):
            self.regions += 1
            self.in_regions.update(_calls_in(node))

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        self.regions -= self._region(original_node)
        return updated_node

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.module_classes += any(_last(base.value) == "Module" for base in node.bases)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.module_classes -= any(_last(base.value) == "Module" for base in original_node.bases)
        return updated_node

    def _decorated(self, node: cst.FunctionDef) -> bool:
        """`@torch.autocast(...)` (or `@autocast()`): the whole body runs under autocast."""
        return any(
            isinstance(d.decorator, cst.Call) and self._autocast(d.decorator.func) for d in node.decorators
        )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)
        if self._decorated(node):
            self.regions += 1
            self.in_regions.add(node.name.value)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self.functions.pop()
        self.regions -= self._decorated(original_node)
        return updated_node

    def visit_Call(self, node: cst.Call) -> None:
        callee = _spelling(node.func)
        owned = self.module_classes or any(f.name.value in _MODULE_OWNERS for f in self.functions)
        if callee is not None and not self.regions and not owned:
            names = tuple(f.name.value for f in self.functions)
            self.calls.append(_Call(node, callee, names, self.functions[-1] if self.functions else None))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.sources and self.facts is not None and self.plan is not None:
            if not _disabled(self.plan.autocast_call):
                self._report_outside(self.facts.covered(self.in_regions))
        return updated_node

    def _report_outside(self, covered: set[str]) -> None:
        for call in self.calls:
            model = self._model_of(call.callee, self.cast | self.instances)
            if model is None or covered.intersection(call.functions) or self._before_initialize(call):
                continue
            level = self._level(model in self.cast)
            if level is not None:
                self.report(
                    call.node, OUTSIDE_AUTOCAST, self._message(call, model, level, model in self.cast)
                )

    @staticmethod
    def _model_of(callee: str, models: set[str]) -> Optional[str]:
        if callee in models:
            return callee
        base, _, attr = callee.rpartition(".")
        return base if attr in _FORWARDS and base in models else None

    def _scope_line(self, call: _Call) -> int:
        return self.position(call.scope)[0] if call.scope is not None else 0

    def _before_initialize(self, call: _Call) -> bool:
        line, scope = self.position(call.node)[0], self._scope_line(call)
        return all(s.scope == scope and line < s.line for s in self.sources)

    def _level(self, of_initialize: bool) -> Optional[str]:
        """What Apex ran the call at: "O1", "O2"/"O3", or "run time"; None: it did not cast it."""
        levels = {s.opt_level for s in self.sources}
        if None in levels:
            return "run time"
        if "O1" in levels:
            return "O1"
        return min(str(level) for level in levels) if of_initialize else None

    def _suggestion(self, call: _Call) -> str:
        """The autocast the file's training region opens; its `enabled=` switch only where it
        reads the names of the function it was built in (the one that called `initialize`)."""
        assert self.plan is not None
        autocast = self.plan.at(self.position(call.node)[0]).autocast_call
        switch = next(
            (a for a in autocast.args if a.keyword is not None and a.keyword.value == "enabled"), None
        )
        if switch is None or any(s.scope == self._scope_line(call) for s in self.state.casts):
            return f"`with {_code(autocast)}:`"
        kept = [a for a in autocast.args if a is not switch]
        bare = autocast.with_changes(
            args=[*kept[:-1], kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
        )
        return f"`with {_code(bare)}:` (where amp is on: the training region has `enabled={_code(switch.value)}`)"

    def _message(self, call: _Call, model: str, level: str, of_initialize: bool) -> str:
        if level == "O1":
            apex = "Apex O1 ran it in float16 (its casts held for the whole process from `amp.initialize` on)"
        elif level == "run time":
            apex = "Apex ran it in float16 when `opt_level` was O1 (casts for the whole process)" + (
                ", O2 or O3 (the model itself cast)" if of_initialize else ""
            )
        else:
            apex = f"Apex {level} cast `{model}` to float16, so it ran in float16"
        return (
            f"`{call.callee}(...)` is outside every autocast region: {apex}; natively it runs in "
            f"float32. To run it as Apex did, wrap it in {self._suggestion(call)}"
        )


def _calls_in(node: cst.CSTNode) -> set[str]:
    """The names every call under `node` calls (`f(x)`: f; `self.step(x)`: step)."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call):
            called = _last(current.func)
            if called is not None:
                found.add(called)
        stack.extend(current.children)
    return found


def _disabled(autocast: cst.Call) -> bool:
    return any(
        arg.keyword is not None and arg.keyword.value == "enabled" and _code(arg.value) == "False"
        for arg in autocast.args
    )
