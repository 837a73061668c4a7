"""`amp.initialize(...)` → one `torch.amp.GradScaler`, built where the plan puts it.

What it does
    Removes `amp.initialize` (or the old `amp.init()`), keeps what its assignment meant
    (`initialize` returns the models and optimizers it was given, in the shape it was given),
    and creates the scaler: `scaler = torch.amp.GradScaler("cuda")` as a local, a
    `self.scaler` attribute, or a module-level global (see plan/training.py, which makes the plan).

Why
    Native mixed precision has no global state to initialise: models and optimizers stay as
    they are, and loss scaling is an object. O0 and `enabled=False` become
    `enabled=False`; a run-time `opt_level` becomes `enabled=opt_level != "O0"`.

Soundness
    `initialize` returned the very models and optimizers it was given at O0/O1 (at O2/O3 the
    models cast to fp16, which the native recipe replaces by fp32 weights under autocast, as
    AMP110 says), so keeping the assignment keeps every name bound to the same objects. The
    scaler (one per loss id where the plan keeps Apex's per-loss scalers) is created where
    every use the plan found can reach it: at the `initialize` call, before the `if` that
    guarded it (with that condition as `enabled=`, so a disabled scaler passes everything
    through exactly when Apex was never initialised), or at module level after the imports.

Fix safety
    Safe: the plan refuses options it cannot express. An `initialize` guarded by `if cond:`
    becomes a scaler built with `enabled=cond` before the `if`, so code after the branch can
    always reach it.

Example
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
becomes
    scaler = torch.amp.GradScaler("cuda")
"""

from __future__ import annotations

from typing import Optional, Sequence, Union, cast

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from ..plan.types import INIT, INITIALIZE, bind_arguments, pure
from .base import TrainingRule
from .facts import Fact

Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


def _code(node: cst.CSTNode) -> str:
    return "".join(cst.Module([]).code_for_node(node).split())


def returned_value(call: cst.Call) -> Optional[cst.BaseExpression]:
    """What `initialize` returns: its models, or `(models, optimizers)`; None for `amp.init()`."""
    args = bind_arguments(call) or {}
    models, optimizers = args.get("models"), args.get("optimizers")
    if models is None:
        return None
    models = models.with_changes(lpar=[], rpar=[]) if hasattr(models, "lpar") else models
    if optimizers is None:
        return models
    return cst.Tuple(
        [
            cst.Element(models, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Element(optimizers),
        ],
        lpar=[],
        rpar=[],
    )


def _pass_only(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(x, cst.Pass) for x in statement.body
    )


def _empty(body: cst.BaseSuite) -> bool:
    return not body.body or all(_pass_only(s) for s in body.body)


def _target(code: str) -> cst.BaseAssignTargetExpression:
    """What the plan spells a scaler (or a switch) as, `scaler`, `self.scaler`, to assign to."""
    return cast(cst.BaseAssignTargetExpression, cst.parse_expression(code))


class InitializeToGradScaler(TrainingRule):
    HANDLES = (INITIALIZE, INIT)
    EMITS = ()
    READS = frozenset(
        {
            Fact.APEX_ANALYSED,
            Fact.INFERENCE,
            Fact.MODULE_VALUE_REWRITTEN,
            Fact.SCALER_STATE_REWRITTEN,
            Fact.TRAINING,
        }
    )
    WRITES = frozenset(
        {Fact.AMP_PLAN_CARRIED, Fact.APEX_CALLS_REWRITTEN, Fact.IMPORT_REQUESTS, Fact.SCALER_CALLS_WRITTEN}
    )

    MARKERS = ()

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.created = False
        self.regions = self.plan.inference if self.plan is not None else (state.inference or ())
        self.dropped = {r.line for r in self.regions} | (
            self.plan.absorbed if self.plan is not None else set()
        )

    @classmethod
    def applies(cls, state, context) -> bool:
        # Rule's test, not TrainingRule's: a file with inference regions only has no plan.
        return (state.training is not None or state.inference is not None) and super(
            TrainingRule, cls
        ).applies(state, context)

    APEX_ON_THE_LINE = True

    def interest(self):
        return self.words_for(INITIALIZE, INIT)

    def _creation(
        self, plan, leading_lines=(), where: Optional[cst.CSTNode] = None
    ) -> list[cst.SimpleStatementLine]:
        """One GradScaler per loss id when the plan keeps Apex's per-loss scalers apart; where
        other modules share it, declared global (in a function) and handed to them."""
        AddImportsVisitor.add_needed_import(self.context, "torch")
        self.created = True
        made = [
            cst.SimpleStatementLine(
                [cst.Assign([cst.AssignTarget(_target(scaler))], plan.scaler_call.deep_clone())]
            )
            for scaler in plan.scalers
        ]
        shared = plan.shared
        if shared is not None and shared.global_:
            names = [shared.name, *(t for t in shared.amp_publish if "." not in t)]  # amp's own switch too
            declared = (
                [cst.SimpleStatementLine([cst.Global([cst.NameItem(cst.Name(n)) for n in names])])]
                if where is not None and any(isinstance(p, cst.FunctionDef) for p in self.ancestors(where))
                else []
            )
            if plan.scaler == shared.name:
                made[:0] = declared
            else:  # kept on `self`: the module's global names the same object
                made += declared + [
                    cst.SimpleStatementLine(
                        [
                            cst.Assign(
                                [cst.AssignTarget(cst.Name(shared.name))], cst.parse_expression(plan.scaler)
                            )
                        ]
                    )
                ]
        for target in shared.publish if shared is not None else ():
            made.append(
                cst.SimpleStatementLine(
                    [
                        cst.Assign(
                            [cst.AssignTarget(_target(target))],
                            cst.parse_expression(plan.scaler),
                        )
                    ]
                )
            )
        amp_on = next(
            (
                a.value
                for a in plan.autocast_call.args
                if a.keyword is not None and a.keyword.value == "enabled"
            ),
            cst.Name("True"),
        )
        for target in shared.amp_publish if shared is not None else ():  # autocast's switch, apart
            made.append(
                cst.SimpleStatementLine(
                    [cst.Assign([cst.AssignTarget(_target(target))], amp_on.deep_clone())]
                )
            )
        made[0] = made[0].with_changes(leading_lines=leading_lines)
        return made

    def _is_init(self, node: Optional[cst.CSTNode]) -> bool:
        return isinstance(node, cst.Call) and self.apex_name(node.func) in (INITIALIZE, INIT)

    def _creates_here(self, statement: cst.CSTNode) -> bool:
        """Module placement builds the scaler after the imports unless initialize is at top level."""
        assert self.plan is not None, "asked only where there is a plan"
        if self.plan.placement != "module":
            return True
        return not any(isinstance(p, cst.FunctionDef) for p in self.ancestors(statement))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self.plan is None and not self.dropped or len(original_node.body) != 1:
            return updated_node
        small = original_node.body[0]
        value = getattr(small, "value", None)
        if not self._is_init(value):
            return updated_node
        rest = self._rest(small, updated_node.body[0], value)
        if self.position(original_node)[0] in self.dropped:
            return cst.RemoveFromParent() if rest is None else updated_node.with_changes(body=[rest])
        if self.plan is None:
            return updated_node
        plan = self.plan.at(self.position(original_node)[0])
        if (
            plan.hoisted
            or not self._creates_here(original_node)
            or self._loop_of(original_node, plan) is not None
        ):
            if rest is None:
                return cst.RemoveFromParent()
            return updated_node.with_changes(body=[rest])
        creation = self._creation(plan, original_node.leading_lines, original_node)
        if rest is None:
            return cst.FlattenSentinel(creation)
        return cst.FlattenSentinel([*creation, updated_node.with_changes(body=[rest], leading_lines=())])

    def _rest(self, original_small, updated_small, call: cst.Call):
        """The statement without initialize, or None when nothing of it is left."""
        value = returned_value(call)
        if isinstance(original_small, cst.Expr):
            return None
        if isinstance(original_small, cst.Assign):
            if value is None:
                return None
            targets = [t.target for t in original_small.targets]
            if len(targets) == 1 and _code(targets[0]) == _code(value):
                return None
            return updated_small.with_changes(value=value)
        if isinstance(original_small, (cst.Return, cst.AnnAssign)) and value is not None:
            return updated_small.with_changes(value=value)
        return updated_small.with_changes(value=value) if value is not None else None

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if self.plan is not None and self.position(original_node)[0] in self.plan.flag_branches:
            return self._flag_body(updated_node)
        if self.plan is None and not self.dropped or original_node.orelse is not None:
            return updated_node
        guarded = [
            s
            for s in original_node.body.body
            if self._holds_init(s) or isinstance(s, cst.For) and any(self._holds_init(x) for x in s.body.body)
        ]
        if not guarded:
            return updated_node
        if all(self.position(s)[0] in self.dropped for s in guarded):
            return cst.RemoveFromParent() if _empty(updated_node.body) else updated_node
        if self.plan is None:
            return updated_node
        plan = self.plan.at(self.position(original_node)[0])
        if not plan.hoisted:
            return updated_node
        if not self._creates_here(original_node):
            creation = None
        else:
            creation = self._creation(plan, original_node.leading_lines, original_node)
        if _empty(updated_node.body):
            return cst.FlattenSentinel(creation) if creation is not None else cst.RemoveFromParent()
        if creation is None:
            return updated_node
        return cst.FlattenSentinel([*creation, updated_node.with_changes(leading_lines=())])

    @staticmethod
    def _flag_body(updated_node: cst.If):
        """An `if FLAG:` that always runs natively (AMP158): its body in its place, its `else` gone."""
        body = [s for s in updated_node.body.body if not _pass_only(s)]
        if not body:
            return cst.RemoveFromParent()
        body[0] = body[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(body)

    def _holds_init(self, statement: cst.CSTNode) -> bool:
        if (
            isinstance(statement, cst.If)
            and self.plan is not None
            and self.position(statement)[0] in self.plan.flag_branches
        ):
            return any(self._holds_init(s) for s in statement.body.body)
        return (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and self._is_init(getattr(statement.body[0], "value", None))
        )

    def _loop_of(self, statement: cst.CSTNode, plan) -> Optional[cst.For]:
        """The loop that only runs this `initialize` on each element, where the plan builds one
        scaler for the state the whole loop leaves (it governs up to the loop's last line)."""
        block = self.parent(statement)
        loop = self.parent(block) if block is not None else None
        if not isinstance(loop, cst.For) or loop.body is not block:
            return None
        index = self.state.index
        tree = index.ast_of(loop) if index is not None else None
        return loop if getattr(tree, "end_lineno", None) == plan.init_line else None

    def leave_For(self, original_node: cst.For, updated_node: cst.For):
        """A loop that only ran `initialize` on each element: the scaler is built before it
        (unless hoisted before the `if` guarding it), and a loop left with nothing to do goes
        where its iterable is only read."""
        if self.plan is None:
            return updated_node
        inits = [s for s in original_node.body.body if self._holds_init(s)]
        if not inits:
            return updated_node
        plan = self.plan.at(self.position(inits[0])[0])
        if self._loop_of(inits[0], plan) is None:
            return updated_node
        creation = (
            []
            if plan.hoisted or not self._creates_here(original_node)
            else self._creation(plan, original_node.leading_lines, original_node)
        )
        if not updated_node.body.body and pure(original_node.iter, ("range", "len", "enumerate", "zip")):
            return cst.FlattenSentinel(creation) if creation else cst.RemoveFromParent()
        if not updated_node.body.body:
            updated_node = updated_node.with_changes(
                body=updated_node.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            )
        if not creation:
            return updated_node
        return cst.FlattenSentinel([*creation, updated_node.with_changes(leading_lines=())])

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        body = self._covered(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def _covered(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> Optional[list[cst.BaseStatement]]:
        """The block with the statements after an inference `initialize` (or the `if` guarding
        it) under its autocast; None where no region starts in it."""
        for region in self.regions:
            if region.autocast_call is None:
                continue
            at = next((i for i, s in enumerate(original) if self.position(s)[0] == region.anchor), None)
            after = len(original) - at - 1 if at is not None else 0
            if after <= 0 or after > len(updated):
                continue
            AddImportsVisitor.add_needed_import(self.context, "torch")
            inner = list(updated[len(updated) - after :])
            lead = cast(Union[cst.SimpleStatementLine, cst.BaseCompoundStatement], inner[0]).leading_lines
            inner[0] = inner[0].with_changes(leading_lines=())
            region_with = cst.With(
                items=[cst.WithItem(region.autocast_call.deep_clone())],
                body=cst.IndentedBlock(inner),
                leading_lines=lead,
            )
            return [*updated[: len(updated) - after], region_with]
        return None

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._covered(original_node.body, updated_node.body)
        if body is not None:
            updated_node = updated_node.with_changes(body=body)
        if self.plan is None:
            return updated_node
        shared = self.plan.shared
        if shared is not None:
            if shared.user and self.plan.optimizers:  # its autocast around a scaled forward
                AddImportsVisitor.add_needed_import(self.context, "torch")
            for module, obj, asname, relative in shared.imports:
                AddImportsVisitor.add_needed_import(self.context, module, obj, asname, relative)
            if shared.declare and (self.created or self.plan.placement == "shared"):
                switch = [(shared.amp_switch, "False")] if shared.amp_switch else []
                return self._at_top(
                    updated_node,
                    [
                        cst.SimpleStatementLine(
                            [cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Name(value))]
                        )
                        for name, value in [(shared.name, "None"), *switch]
                    ],
                )
        if self.created or self.plan.placement == "shared":
            return updated_node
        return self._at_top(updated_node, self._creation(self.plan))

    def _at_top(self, updated_node: cst.Module, creation: list[cst.SimpleStatementLine]) -> cst.Module:
        """The statements after the module's docstring and leading imports."""
        body = list(updated_node.body)
        at = 0
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom))
                or (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
                for s in stmt.body
            ):
                at = i + 1
            elif isinstance(stmt, (cst.Try, cst.If)) and i == at:
                at = i + 1  # import guards at the top (try: import apex ...)
            else:
                break
        if at > 0:
            creation[0] = creation[0].with_changes(leading_lines=[cst.EmptyLine()])
        body[at:at] = creation
        return updated_node.with_changes(body=body)
