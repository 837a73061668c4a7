"""`optimizer.step()` → `scaler.step(optimizer)`, then one `scaler.update()` per iteration.

What it does
    Every `step()` of an optimizer that a `scale_loss` block names goes through the scaler,
    and `scaler.update()` follows the last such step of each loop iteration (inside
    `if (i + 1) % accum == 0:` when the step is there).

Why
    Apex unscaled, checked for overflow and updated the scale at the end of `scale_loss`, and
    patched `step` to skip after an overflow. GradScaler does the check in `scaler.step`
    (which skips the step when gradients are not finite) and changes the scale in `update()`,
    which must run once per iteration, after every optimizer has stepped.

Fix safety
    Safe. Closures (`optimizer.step(closure)`) are not supported by an enabled GradScaler, and
    an optimizer whose `step()` this file never calls cannot be routed through the scaler; both
    fall back to the shim.

Example
    optimizer.step()
becomes
    scaler.step(optimizer)
    scaler.update()
"""
from __future__ import annotations


import libcst as cst
import libcst.matchers as m

from ..diagnostics import Severity, define
from .training_plan import TrainingRule, words_of

NO_STEP = define(
    "AMP210", "optimizer-step-not-found", Severity.WARNING,
    "An optimizer passed to `scale_loss` is never stepped in this file.",
    "Natively, the step must go through `scaler.step(optimizer)`, or the optimizer would apply "
    "scaled gradients. When the `step()` call lives elsewhere (another module, a helper that "
    "receives the optimizer, a loop over a list of optimizers) the file keeps Apex's semantics "
    "through the shim.",
    falls_back=True,
)
CLOSURE = define(
    "AMP211", "step-with-closure", Severity.WARNING,
    "`optimizer.step(closure)` cannot go through an enabled GradScaler.",
    "GradScaler raises on closures (LBFGS-style optimizers re-evaluate the loss, which a loss "
    "scale would corrupt); Apex refused them under O2 as well. The file uses the shim.",
    falls_back=True,
)

LOOPS = (cst.For, cst.While, cst.FunctionDef, cst.Module)


class OptimizerStepThroughScaler(TrainingRule):
    MARKERS = ()

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.steps: set[int] = set()
        self.anchors: set[int] = set()

    def interest(self):
        if self.plan is None or self.state.apex_words is None:
            return super().interest()
        return words_of(self.plan.optimizers)

    def also_spells(self):
        return ("step",) if self.plan is not None else None

    def _step_calls(self, module: cst.Module) -> list[cst.Call]:
        return [c for c in self.findall(module, m.Call(func=m.Attribute(attr=m.Name("step"))))
                if self.code_of(c.func.value) in self.plan.optimizers
                and self.position(c)[0] in self.plan.step_lines]

    def visit_Module(self, node: cst.Module) -> None:
        if self.plan is None:
            return
        calls = self._step_calls(node)
        stepped = {self.code_of(c.func.value) for c in calls}
        for missing in sorted(self.plan.optimizers - stepped):
            self.report(node, NO_STEP, f"`{missing}.step()` is not called in this file")
        last_in_loop: dict[int, tuple[tuple[int, int], cst.CSTNode]] = {}
        for call in calls:
            if call.args:
                self.report(call, CLOSURE)
                continue
            self.steps.add(id(call))
            line = next(p for p in self.ancestors(call)
                        if isinstance(p, (cst.SimpleStatementLine, cst.SimpleStatementSuite)))
            loop = next(p for p in self.ancestors(call) if isinstance(p, LOOPS))
            where = self.position(call)
            if id(loop) not in last_in_loop or last_in_loop[id(loop)][0] < where:
                last_in_loop[id(loop)] = (where, line)
        self.anchors = {id(line) for _, line in last_in_loop.values()}

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.steps:
            return updated_node
        return cst.Call(cst.parse_expression(f"{self.plan.scaler}.step"),
                        [cst.Arg(updated_node.func.value)])

    def _update(self) -> cst.Expr:
        return cst.Expr(cst.parse_expression(f"{self.plan.scaler}.update()"))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if id(original_node) not in self.anchors:
            return updated_node
        return cst.FlattenSentinel([updated_node, cst.SimpleStatementLine([self._update()])])

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        if id(original_node) not in self.anchors:
            return updated_node
        body = list(updated_node.body)
        body[-1] = body[-1].with_changes(semicolon=cst.Semicolon(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")))
        return updated_node.with_changes(body=body + [self._update()])
