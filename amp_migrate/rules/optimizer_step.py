"""`optimizer.step()` → `scaler.step(optimizer)`, then `scaler.update()` after each group of steps.

What it does
    Every `step()` of an optimizer that a `scale_loss` block names goes through the scaler of
    that optimizer's loss, and `scaler.update()` follows each group of steps: the step lines of
    one block that no backward separates (`optD.step()` after the critic's backward and
    `optG.step()` after the generator's are two groups; `opt1.step(); opt2.step()` after one
    backward is one). A group under `if (i + 1) % accum == 0:` gets its update inside the `if`.

Why
    Apex unscaled, checked for overflow and updated the scale at the end of every `scale_loss`
    (not delayed), and patched `step` to skip after an overflow. GradScaler checks in
    `scaler.step` (which skips the step when gradients are not finite) and changes the scale in
    `update()`.

Soundness
    GradScaler allows one `step` per optimizer between `update()`s, and `update()` only after a
    step recorded its check. An update right after each group keeps both on every path, whatever
    branches surround the group: a critic that steps every iteration and a generator that steps
    every `n_critic`-th each get their own update, as each `scale_loss` exit updated Apex's
    scale. Steps that a backward separates never share an update, and steps that one backward
    feeds never have an update between them (which would unscale the later ones by a changed
    scale). A group that a finiteness test decides (`if torch.isfinite(loss): opt.step()`, or an
    earlier `if ...isnan(...): continue`) falls back: on those iterations Apex had already
    backed off and armed a skip that also dropped the next iteration's step. A step in the
    function that builds the scaler, after `initialize`, before any backward of that function
    and outside any loop (`if global_step == 0: optimizer.step()` before the training loop)
    stays the optimizer's own: no scaled gradient has reached it, Apex's patched step ran the
    optimizer's, and `scaler.step` would find no overflow check to read.

Fix safety
    Safe where it applies. Closures (`optimizer.step(closure)`) are not supported by an enabled
    GradScaler, an optimizer whose `step()` this file never calls cannot be routed through the
    scaler, and an early exit between the steps of one group would skip the update; all fall
    back to the shim. Unsafe (docs/differences.md entry U1) where k > 1 `scale_loss` exits
    share one step (an accumulation window without `delay_unscale`, AMP215; several losses
    scaled before one step, AMP216): the step and the scale update are the ones a careful
    engineer writes, one `scaler.step` and one `scaler.update()` per optimizer step, but Apex
    updated its scale at every exit, so the scales differ from the first overflow on (or after
    2000 / k steps). Applied only with `--unsafe-fixes`; by default the file keeps the shim.

Example
    optimizer.step()
becomes
    scaler.step(optimizer)
    scaler.update()
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst
import libcst.matchers as m

from ..analysis.control_flow import STEP, exits_early, guarded_exits, runs_backward, tests_finiteness
from ..diagnostics import Severity, define
from ..plan.types import TrainingPlan, words_of
from .base import TrainingRule
from .facts import Fact

NO_STEP = define(
    "AMP210",
    "optimizer-step-not-found",
    Severity.WARNING,
    "An optimizer passed to `scale_loss` is never stepped in this file.",
    "Natively, the step must go through `scaler.step(optimizer)`, or the optimizer would apply "
    "scaled gradients. When the `step()` call lives elsewhere (another module, a helper that "
    "receives the optimizer, a loop over a list of optimizers) the file keeps Apex's semantics "
    "through the shim.",
    falls_back=True,
    refusal="the scaled optimizer is never stepped here",
    fallback_title="the step is not in this file",
    shape=(
        "`scale_loss` (and often `master_params`) in a file whose optimizer steps through an object the file "
        "does not step directly (`optimizer_g._optim` stepped by a wrapper class in another module), or a "
        "framework plugin whose loop and `optimizer.step()` live in the framework."
    ),
    fallback_why=(
        "Natively the step must become `scaler.step(optimizer)` followed by `scaler.update()`, which is "
        "where a GradScaler skips an overflowing step and adjusts its scale; Apex did both inside "
        "`scale_loss`'s exit and its patched `step`. With no step to rewrite, the native code would apply "
        "still-scaled gradients and never back off the scale."
    ),
    by_hand=(
        "Replace the wrapper's `optimizer.step()` with `scaler.step(optimizer); scaler.update()` and pass "
        "the scaler to it, or migrate the file that steps along with this one."
    ),
)
CLOSURE = define(
    "AMP211",
    "step-with-closure",
    Severity.WARNING,
    "`optimizer.step(closure)` cannot go through an enabled GradScaler.",
    "GradScaler raises on closures (LBFGS-style optimizers re-evaluate the loss, which a loss "
    "scale would corrupt); Apex refused them under O2 as well. The file uses the shim.",
    falls_back=True,
    refusal="GradScaler cannot step with a closure",
    fallback_title="`optimizer.step(closure)`",
    shape=(
        "`optimizer.step(closure)` of an optimizer whose loss Apex scaled (LBFGS and other closure "
        "optimizers)."
    ),
    by_hand=(
        "Train that optimizer in fp32 (no scaler: `GradScaler(enabled=False)` steps it as it is), or keep "
        "the shim."
    ),
)

FINITE_GUARD = define(
    "AMP212",
    "step-decided-by-finiteness",
    Severity.WARNING,
    "Whether the optimizer steps is decided by a finiteness test (`isfinite`, `isnan`, `isinf`) "
    "after the backward.",
    "On an overflow Apex backed off the scale at the end of `scale_loss` and armed a skip that "
    "stayed armed until the next `step()` call: when the test then kept `step()` from running, "
    "the next iteration's step was skipped too. GradScaler has no armed skip, and a native "
    "`update()` inside the test's branch would never back off. No native form behaves like "
    "Apex here, so the file uses the shim.",
    before="with amp.scale_loss(loss, opt) as s:\n    s.backward()\nif torch.isfinite(loss):\n    opt.step()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="Apex's armed skip has no GradScaler counterpart",
    fallback_title="a step decided by a finiteness test",
    shape=(
        "`if torch.isfinite(grad_norm): optimizer.step()` (or `isnan`/`isinf` of the loss or a gradient "
        "norm) after a scaled backward."
    ),
    by_hand=(
        "Drop the test and let `scaler.step(optimizer)` skip steps with inf/NaN gradients (it checks them "
        "itself), with `scaler.update()` after it on every iteration."
    ),
)
EXIT_IN_GROUP = define(
    "AMP213",
    "early-exit-between-steps",
    Severity.WARNING,
    "A `continue`, `break`, `return` or `raise` can run between optimizer steps that one backward feeds.",
    "The steps after one backward share one `scaler.update()`, placed after the last of them. "
    "An early exit between them would skip that update, and the next iteration's "
    "`scaler.step` would raise; the file uses the shim.",
    falls_back=True,
    refusal="an exit between the steps one backward feeds",
    fallback_title="an early exit between the steps one backward feeds",
    shape=(
        "`generator_opt.step()`, then `if skip: continue`, then `critic_opt.step()` after one scaled "
        "backward: a `continue`, `break`, `return` or `raise` between optimizer steps that one backward "
        "feeds."
    ),
    by_hand=(
        "Move the exit before the first step or after the last, so that the steps, and the `scaler.update()` "
        "after them, run together."
    ),
)

STEPS_APART = define(
    "AMP214",
    "steps-of-one-backward-apart",
    Severity.WARNING,
    "Optimizers that one backward feeds are stepped in different blocks (one of them under an "
    "`if` or in another branch).",
    "Their steps must share one `scaler.update()` after the last of them: an update between "
    "them may change the scale, and the later optimizer's gradients would then be unscaled by "
    "the wrong factor. No single place after both steps runs exactly when they do, so the file "
    "uses the shim.",
    before="with amp.scale_loss(loss, [opt_a, opt_b]) as s:\n    s.backward()\nopt_a.step()\n"
    "if train_b:\n    opt_b.step()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="one backward's optimizers stepped in different blocks",
    fallback_title="the steps one backward feeds in different blocks",
    shape=(
        "One scaled backward feeding two optimizers, `opt_a.step()` always and `opt_b.step()` under `if step "
        "% k == 0:` (or in another branch)."
    ),
    by_hand=(
        "Step the optimizers that one backward feeds in one block, under one condition, so that one "
        "`scaler.update()` follows the last of them; then re-run."
    ),
)

_LINES = (cst.SimpleStatementLine, cst.SimpleStatementSuite)
_ITERATION = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)
#: Where step lines sit: a block, or a suite on the line of its `if`/`for` (then the line itself).
_Block = Union[cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite]


def _receiver(call: cst.Call) -> cst.BaseExpression:
    """`optimizer` of `optimizer.step()`, a call STEP matched."""
    return cst.ensure_type(call.func, cst.Attribute).value


class OptimizerStepThroughScaler(TrainingRule):
    HANDLES = ()
    EMITS = (
        NO_STEP,
        CLOSURE,
        FINITE_GUARD,
        EXIT_IN_GROUP,
        STEPS_APART,
    )
    READS = frozenset(
        {
            Fact.APEX_ANALYSED,
            Fact.FP16_PLAN,
            Fact.MODULE_VALUE_REWRITTEN,
            Fact.SCALER_STATE_REWRITTEN,
            Fact.TRAINING,
        }
    )
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.SCALER_CALLS_WRITTEN})

    MARKERS = ()

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.steps: set[int] = set()
        self.updates_after: dict[int, list[str]] = {}  # step line -> scalers to update after it
        self.group_end: dict[int, cst.CSTNode] = {}  # step line -> last line of its group

    def interest(self):
        if self.plan is None or self.state.apex_words is None:
            return super().interest()
        return words_of(self.plan.optimizers)

    def also_spells(self):
        return ("step",) if self.plan is not None else None

    @property
    def _plan(self) -> TrainingPlan:
        """The plan, for what runs only in a file that has one (`visit_Module` stops without)."""
        assert self.plan is not None
        return self.plan

    def _step_calls(self, module: cst.Module) -> list[cst.Call]:
        return [
            c
            for c in self.findall(module, STEP)
            if isinstance(c, cst.Call)  # what STEP matches
            and self.code_of(_receiver(c)) in self._plan.optimizers
            and self.position(c)[0] in self._plan.step_lines
        ]

    def visit_Module(self, node: cst.Module) -> None:
        if self.plan is None:
            return
        calls = self._step_calls(node)
        stepped = {self.code_of(_receiver(c)) for c in calls}
        for missing in sorted(self.plan.optimizers - stepped):
            self.report(node, NO_STEP, f"`{missing}.step()` is not called in this file")
        by_block: dict[int, tuple[_Block, dict[int, list[cst.Call]]]] = {}
        first_backward = self._first_backwards(node)
        for call in calls:
            if self._before_any_backward(call, first_backward):
                continue
            if call.args:
                self.report(call, CLOSURE)
                continue
            self.steps.add(id(call))
            line = next(p for p in self.ancestors(call) if isinstance(p, _LINES))
            block = line if isinstance(line, cst.SimpleStatementSuite) else self.parent(line)
            assert isinstance(
                block, (cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite)
            )  # a line's block
            lines = by_block.setdefault(id(block), (block, {}))[1]
            lines.setdefault(id(line), []).append(call)
        for block, lines in by_block.values():
            self._place_updates(block, lines)
        self._check_windows(node, [c for c in calls if id(c) in self.steps])

    def _first_backwards(self, module: cst.Module) -> dict[int, int]:
        """id of each function (0: the module) -> the line of its first backward in the text."""
        found: dict[int, int] = {}
        backward = m.Call(func=m.Attribute(attr=m.Name("backward")))
        for call in self.findall(module, backward, ("backward",)):
            function = self._function_of(call)
            found.setdefault(id(function) if function is not None else 0, self.position(call)[0])
        return found

    def _before_any_backward(self, call: cst.Call, first_backward: dict[int, int]) -> bool:
        """A step in the function that builds the scaler, after `initialize` and before any
        backward of that function, outside any loop (`if global_step == 0: optimizer.step()`
        before the training loop): no gradient Apex scaled has reached it, so Apex's patched
        step ran the optimizer's own, and `scaler.step` would find no inf check to read."""
        function = self._function_of(call)
        line = self.position(call)[0]
        here = self.position(function)[0] if function is not None else 0
        if (
            isinstance(function, cst.Lambda)
            or here != self._plan.init_scope
            or line <= self._plan.init_line
            or self._plan.shared is not None
            and self._plan.shared.user
            or self._plan.parts
        ):
            return False
        if any(isinstance(p, (cst.For, cst.While)) for p in self.ancestors(call)):
            return False
        first = first_backward.get(id(function) if function is not None else 0)
        return first is not None and line < first

    def _check_windows(self, module: cst.Module, calls: list[cst.Call]) -> None:
        """The steps between two backwards of one function (in the order of the text) must be
        one group: in one block, with one update after them."""
        steps = {id(call) for call in calls}
        either = m.Call(func=m.Attribute(attr=m.Name("step") | m.Name("backward")))
        events: dict[int, list[tuple[str, cst.CSTNode]]] = {}
        for call in self.findall(module, either, ("step", "backward")):  # in the order of the text
            if id(call) in steps:
                line = next(p for p in self.ancestors(call) if isinstance(p, _LINES))
                events.setdefault(id(self._function_of(call)), []).append(("step", line))
            elif (  # `either` matched: a method call
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "backward"
            ):
                events.setdefault(id(self._function_of(call)), []).append(("backward", call))
        for found in events.values():
            window: list[cst.CSTNode] = []
            for kind, node in found + [("backward", None)]:
                if kind == "step":
                    assert node is not None  # only the closing ("backward", None) has none
                    window.append(node)
                    continue
                groups = {id(self._group_of(line)) for line in window}
                if len(groups) > 1:
                    self.report(window[-1], STEPS_APART)
                window = []

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return next((p for p in self.ancestors(node) if isinstance(p, (cst.FunctionDef, cst.Lambda))), None)

    def _group_of(self, line: cst.CSTNode) -> cst.CSTNode:
        """The last line of the group `line` belongs to (where its update goes)."""
        return self.group_end.get(id(line), line)

    # -- where the updates go -----------------------------------------------------------------
    def _place_updates(self, block: _Block, lines: dict[int, list[cst.Call]]) -> None:
        """Split the step lines of one block into groups at every backward between them; one
        update per scaler after each group's last line."""
        body: list[cst.CSTNode] = [block] if isinstance(block, cst.SimpleStatementSuite) else list(block.body)
        group: list[cst.CSTNode] = []
        between: list[cst.CSTNode] = []
        for statement in body:
            if id(statement) in lines:
                if group and any(exits_early(s) for s in between):
                    self.report(next(s for s in between if exits_early(s)), EXIT_IN_GROUP)
                group.append(statement)
                between = []
            elif group and runs_backward(statement):
                self._close(group, lines)
                group, between = [], []
            elif group:
                between.append(statement)
        if group:
            self._close(group, lines)

    def _close(self, group: list[cst.CSTNode], lines: dict[int, list[cst.Call]]) -> None:
        guard = self._finiteness_guard(group[0])
        if guard is not None:
            self.report(
                guard,
                FINITE_GUARD,
                "whether `{}` runs is decided by the finiteness test at line {}".format(
                    self.code_of(lines[id(group[0])][0]), self.position(guard)[0]
                ),
            )
        scalers: list[str] = []
        for line in group:
            for call in lines[id(line)]:
                scaler = self._plan.scaler_for_optimizer(self.code_of(_receiver(call)))
                if scaler not in scalers:
                    scalers.append(scaler)
        self.updates_after[id(group[-1])] = scalers
        for line in group:
            self.group_end[id(line)] = group[-1]

    def _finiteness_guard(self, line: cst.CSTNode) -> Optional[cst.CSTNode]:
        """A test of finiteness that decides whether `line` runs in its iteration: an `if`
        around it, or an earlier `if` after the last backward whose body leaves the iteration."""
        current: cst.CSTNode = line
        while not isinstance(current, _ITERATION):
            parent = self.parent(current)
            if parent is None:
                return None
            if isinstance(parent, cst.If) and current is not parent.test and tests_finiteness(parent.test):
                return parent
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                body: list[cst.CSTNode] = list(parent.body)
                for earlier in reversed(body[: body.index(current)]):
                    for exit_guard in guarded_exits(earlier):
                        if tests_finiteness(exit_guard.test):
                            return exit_guard
                    if runs_backward(earlier):
                        return None
            current = parent
        return None

    # -- rewriting ----------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.steps:
            return updated_node
        scaler = self._plan.scaler_for_optimizer(self.code_of(_receiver(original_node)))
        return cst.Call(cst.parse_expression(f"{scaler}.step"), [cst.Arg(_receiver(updated_node))])

    @staticmethod
    def _update(scaler: str) -> cst.Expr:
        return cst.Expr(cst.parse_expression(f"{scaler}.update()"))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        scalers = self.updates_after.get(id(original_node))
        if not scalers:
            return updated_node
        return cst.FlattenSentinel(
            [updated_node] + [cst.SimpleStatementLine([self._update(scaler)]) for scaler in scalers]
        )

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        scalers = self.updates_after.get(id(original_node))
        if not scalers:
            return updated_node
        body = list(updated_node.body)
        body[-1] = body[-1].with_changes(
            semicolon=cst.Semicolon(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")
            )
        )
        updates = [self._update(scaler) for scaler in scalers]
        for i in range(len(updates) - 1):
            updates[i] = updates[i].with_changes(
                semicolon=cst.Semicolon(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")
                )
            )
        return updated_node.with_changes(body=body + updates)
