"""`amp.master_params(opt)` → `scaler.unscale_(opt)` first, then the optimizer's own params.

What it does
    Where master params are read between backward and the optimizer's step (gradient
    clipping, almost always), inserts `scaler.unscale_(opt)` before the statement (once per
    block) and replaces `amp.master_params(opt)` with the parameters the optimizer steps,
    `(p for group in opt.param_groups for p in group["params"])`.

Why
    Apex unscaled gradients at the end of `scale_loss`, so clipping saw true gradients.
    GradScaler keeps them scaled until `unscale_` or `step`; clipping scaled gradients would
    clip at a threshold `scale` times too small. Native weights are the optimizer's params, so
    they stand in for the fp32 masters.

Fix safety
    Safe where a `step()` of the same optimizer follows in the same block or an enclosing one.
    Elsewhere (a helper function, after the step) whether gradients are scaled there cannot be
    proven, and the file falls back to the shim.

Example
    clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
becomes
    scaler.unscale_(optimizer)
    clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""
from __future__ import annotations


import libcst as cst
import libcst.matchers as m

from ..diagnostics import Severity, define
from .training_plan import MASTER_PARAMS, TrainingRule

UNPROVEN = define(
    "AMP301", "master-params-outside-step", Severity.WARNING,
    "`amp.master_params(opt)` is read where no `opt.step()` follows in the same block, so "
    "whether its gradients are scaled there cannot be proven.",
    "Natively, gradients stay scaled until `scaler.unscale_(opt)` or `scaler.step(opt)`. "
    "amp-migrate inserts `unscale_` only before a use that the same iteration's step follows; "
    "other uses (in a helper method, after the step) keep Apex's semantics through the shim.",
    falls_back=True,
)


def params_of(optimizer: cst.BaseExpression) -> cst.GeneratorExp:
    return cst.parse_expression(
        f'(p for group in {cst.Module([]).code_for_node(optimizer)}.param_groups for p in group["params"])')


class MasterParamsUnscale(TrainingRule):
    MARKERS = ("master_params",)
    APEX_ON_THE_LINE = True

    def interest(self):
        return self.words_for(MASTER_PARAMS)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.calls: set[int] = set()
        self.unscale_before: dict[int, list[str]] = {}  # statement -> optimizers to unscale

    def _steps_after(self, statement: cst.CSTNode, optimizer: str) -> bool:
        step = m.Call(func=m.Attribute(value=m.DoNotCare(), attr=m.Name("step")))
        current = statement
        while True:
            block = self.parent(current)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return False
            body = list(block.body)
            at = next(i for i, s in enumerate(body) if s is current)
            for later in body[at + 1:]:
                if any(self.code_of(c.func.value) == optimizer for c in m.findall(later, step)):
                    return True
            owner = self.statement_around(block)
            if owner is None:
                return False
            current = owner

    def visit_Call(self, node: cst.Call) -> None:
        if self.plan is None or self.apex_name(node.func) != MASTER_PARAMS:
            return
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            self.report(node, UNPROVEN, "`amp.master_params` takes one optimizer")
            return
        optimizer = self.code_of(node.args[0].value)
        statement = next(p for p in self.ancestors(node)
                         if isinstance(p, (cst.SimpleStatementLine, cst.BaseCompoundStatement)))
        if not self._steps_after(statement, optimizer):
            self.report(node, UNPROVEN)
            return
        self.calls.add(id(node))
        wanted = self.unscale_before.setdefault(id(statement), [])
        if optimizer not in wanted:
            wanted.append(optimizer)


    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.calls:
            return params_of(updated_node.args[0].value)
        return updated_node

    def _with_unscale(self, original_node, updated_node):
        optimizers = self.unscale_before.get(id(original_node))
        if not optimizers:
            return updated_node
        lines = [cst.SimpleStatementLine([cst.Expr(cst.parse_expression(
            f"{self.plan.scaler}.unscale_({opt})"))]) for opt in optimizers]
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(lines + [updated_node.with_changes(leading_lines=())])

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return self._with_unscale(original_node, updated_node)

    def leave_node(self, original_node, updated_node):
        result = super().leave_node(original_node, updated_node)
        if isinstance(original_node, cst.BaseCompoundStatement) and result is updated_node:
            return self._with_unscale(original_node, updated_node)
        return result
