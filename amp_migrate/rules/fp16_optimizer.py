"""fp16_optimizer: an `apex.fp16_utils.FP16_Optimizer` training flow → fp32 weights, autocast, GradScaler.

What it does
    Where a file builds one `FP16_Optimizer` and its whole use is visible, the legacy recipe
    (an fp16 model from `network_to_half` / `.half()` / `FP16Model`, fp32 master weights and a
    loss scaler inside the optimizer wrapper) becomes the native one:

    * `optimizer = FP16_Optimizer(opt, static_loss_scale=S | dynamic_loss_scale=True, ...)` →
      `scaler = torch.amp.GradScaler(...)` (and `optimizer = opt` when the names differ);
    * `model = network_to_half(model)`, `model.half()`, `BN_convert_float(...)`,
      `FP16Model(model)` → removed: the weights stay fp32;
    * `optimizer.backward(loss)` → `scaler.scale(loss).backward()`, with the forward from the
      first use of a converted model to the loss under `torch.autocast`;
    * `optimizer.clip_master_grads(m)` → `scaler.unscale_(optimizer)` then
      `torch.nn.utils.clip_grad_norm_(<the optimizer's params>, m)` (its value kept);
    * `optimizer.step()` → `scaler.step(optimizer); scaler.update()` (the training plan's step
      rule places the update);
    * `optimizer.zero_grad()` → `optimizer.zero_grad(set_to_none=False)`, `optimizer.optimizer`
      → `optimizer`, `optimizer.loss_scale` → `scaler.get_scale()`.

    NVIDIA's `--fp16` examples build the wrapper under `if args.fp16:`; then the GradScaler is
    built before that `if` with `enabled=args.fp16`, autocast gets the same `enabled=`,
    conversions under the same flag go, `if args.fp16: optimizer.backward(loss) else:
    loss.backward()` becomes one `scaler.scale(loss).backward()`, and `zero_grad()` sets
    gradients to None exactly when the plain optimizer did (`set_to_none=not args.fp16`).

Why
    NVIDIA deprecated `FP16_Optimizer` ("deprecated and dangerous") in favour of amp, which
    torch.amp replaced. The native recipe keeps fp32 weights, so no master copies are needed,
    and it is what current PyTorch documents.

Soundness
    The rewrite carries out `PlanFp16Optimizer`'s plan and nothing else (plan/fp16_optimizer.py
    argues why that flow is the native recipe): it edits only the statements, calls and
    attribute reads the plan names, and only in the ways listed above. The plan names them by
    their nodes in the tree the planner read, which is the tree this rule transforms; where a
    rule before this one rewrote part of the file, this rule's tree is no longer the parse, so it
    withdraws the parse's plan and its diagnostics and has the planner follow the flow again on
    the tree it got, which is what it would have seen had it planned itself.

Fix safety
    Safe where it applies; evaluation forwards outside the autocast region run in fp32, and
    state-dict keys lose the `1.` (`network_to_half`) or `network.` (`FP16Model`) prefix, so
    checkpoints of the converted model saved by the old code need their keys renamed.

Example
    model = network_to_half(model)                     optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = torch.optim.SGD(model.parameters(),    scaler = torch.amp.GradScaler("cuda")
                                lr=0.1)                for x, y in loader:
    optimizer = FP16_Optimizer(optimizer,                  optimizer.zero_grad(set_to_none=False)
                               dynamic_loss_scale=True)    with torch.autocast("cuda", dtype=torch.float16):
    for x, y in loader:                                        loss = crit(model(x), y)
        optimizer.zero_grad()                              scaler.scale(loss).backward()
        loss = crit(model(x), y)                           scaler.step(optimizer)
        optimizer.backward(loss)                           scaler.update()
        optimizer.step()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from ..analysis.autocast_region import wrap_spans
from ..plan.fp16_flow import BACKWARD_ARGS, CODE, CONVERTERS, FP16_OPTIMIZER, FP16_OPTIMIZER_ARGS, keyword
from ..plan.fp16_optimizer import PlanFp16Optimizer, plan_fp16_optimizer
from ..plan.types import Fp16OptimizerPlan, bind_arguments
from .base import Rule
from .facts import Fact

#: What a block holds: `IndentedBlock.body` is typed `BaseStatement`, whose only kinds these are.
_Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


class Fp16OptimizerToGradScaler(Rule):
    """Rewrite a file's `FP16_Optimizer` flow as `PlanFp16Optimizer` planned it; the step rule
    places the updates."""

    HANDLES = (FP16_OPTIMIZER, *CONVERTERS)
    #: What the planner reports, which it reports again when it plans this rule's tree.
    EMITS = PlanFp16Optimizer.EMITS
    READS = frozenset({Fact.AMP_PLAN_CARRIED, Fact.APEX_ANALYSED, Fact.FP16_OPTIMIZER, Fact.TRAINING})
    WRITES = frozenset(
        {
            Fact.APEX_CALLS_REWRITTEN,
            Fact.FALLBACK_REASONS,
            Fact.FP16_OPTIMIZER_REFUSED,
            Fact.FP16_PLAN,
            Fact.IMPORT_REQUESTS,
            Fact.SCALER_CALLS_WRITTEN,
        }
    )

    MARKERS = PlanFp16Optimizer.MARKERS

    def interest(self):
        return None

    @classmethod
    def applies(cls, state, context) -> bool:
        return state.training is None and super().applies(state, context)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.flow: Optional[Fp16OptimizerPlan] = None

    # -- the plan ------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> Optional[bool]:
        flow = self.state.fp16_optimizer
        if node is not self.state.parsed:
            flow = self._plan_again(node)
        if flow is None:
            return False  # no flow: the leave handlers have nothing to do
        self.flow = flow
        self.state.training = flow.training  # for the rules after this one (the step, checkpoints)
        AddImportsVisitor.add_needed_import(self.context, "torch")
        return None

    def _plan_again(self, module: cst.Module) -> Optional[Fp16OptimizerPlan]:
        """A rule before this one rewrote the file, so the plan's nodes are not this tree's
        (a block holding a rewritten line is a new node): the parse's verdict and what it
        reported are withdrawn, and the planner follows the flow on this tree. Its reports then
        come where this rule's always came, after those of the rules before it."""
        own = {code.code for code in PlanFp16Optimizer.EMITS}
        self.state.diagnostics[:] = [d for d in self.state.diagnostics if d.code not in own]
        self.state.fp16_optimizer_refused = False
        return plan_fp16_optimizer(module, self.state)

    # -- rewriting --------------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.flow is None or id(original_node) not in self.flow.calls:
            return updated_node
        func = cst.ensure_type(updated_node.func, cst.Attribute)  # `optimizer.<method>`
        receiver = func.value
        if func.attr.value == "zero_grad":
            bound = bind_arguments(updated_node, ("set_grads_to_None",)) or {}
            plain = cst.Name("False") if self.flow.guard is None else _not(self.flow.guard.test)
            value = bound.get("set_grads_to_None", plain)
            return updated_node.with_changes(args=[keyword("set_to_none", value)])
        clip = bind_arguments(updated_node, ("max_norm", "norm_type"))
        assert clip is not None  # `_method` took only clip calls whose arguments bind
        params = cst.parse_expression(
            f'(p for group in {CODE(receiver)}.param_groups for p in group["params"])'
        )
        args = [cst.Arg(params), cst.Arg(clip["max_norm"])] + (
            [cst.Arg(clip["norm_type"])] if "norm_type" in clip else []
        )
        for i in range(len(args) - 1):
            args[i] = args[i].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return cst.Call(cst.parse_expression("torch.nn.utils.clip_grad_norm_"), args)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if self.flow is None:
            return updated_node
        if id(original_node) in self.flow.unwraps:
            return updated_node.value
        if id(original_node) in self.flow.scale_reads:
            return cst.parse_expression(f"{self.flow.training.scaler}.get_scale()")
        return updated_node

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if self.flow is None or len(original_node.body) != len(updated_node.body):
            return updated_node
        body = self._rebuild(original_node.body, updated_node.body, id(original_node))
        return updated_node.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.flow is None or len(original_node.body) != len(updated_node.body):
            return updated_node
        return updated_node.with_changes(
            body=self._rebuild(original_node.body, updated_node.body, id(original_node))
        )

    def _rebuild(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement], block_id: int
    ) -> list[cst.BaseStatement]:
        flow = self.flow
        assert flow is not None  # blocks are rebuilt only for a flow
        autocast = flow.training.autocast_call
        return wrap_spans(
            len(updated),
            flow.regions.get(block_id, []),
            lambda i: autocast,
            lambda k: self._replace(original[k], updated[k]),
            lambda k: self._replace(original[k], updated[k]),
        )

    def _replace(self, original: cst.BaseStatement, updated: cst.BaseStatement) -> list[_Statement]:
        flow = self.flow
        assert flow is not None  # blocks are rebuilt only for a flow
        scaler = flow.training
        assert isinstance(updated, (cst.SimpleStatementLine, cst.BaseCompoundStatement))  # every statement is
        key = id(original)
        creation = cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(scaler.scaler))], scaler.scaler_call.deep_clone())],
            leading_lines=updated.leading_lines,
        )
        if original is flow.guard:
            kept: list[_Statement] = (
                [] if key in flow.dropped_ifs else [updated.with_changes(leading_lines=())]
            )
            return [creation, *kept]
        if key in flow.dropped_ifs:
            return []
        if original is flow.statement:
            made: list[_Statement] = [creation] if flow.guard is None else []
            if CODE(flow.inner) != flow.target:
                inner = _init_optimizer(cst.ensure_type(updated, cst.SimpleStatementLine))
                made.append(
                    cst.SimpleStatementLine(
                        [cst.Assign([cst.AssignTarget(cst.Name(flow.target))], inner)],
                        leading_lines=updated.leading_lines if flow.guard else (),
                    )
                )
            return made
        if key in flow.backwards and isinstance(original, cst.If):
            line = cst.SimpleStatementLine(
                [cst.Expr(flow.backwards[key].deep_clone())], leading_lines=updated.leading_lines
            )
            return self._replace_backward(line)
        if key in flow.conversions:
            value = flow.conversions[key]
            line = cst.ensure_type(updated, cst.SimpleStatementLine)  # `_conversion` checked the shape
            return [] if value is None else [line.with_changes(body=[line.body[0].with_changes(value=value)])]
        if key in flow.backwards:
            return self._replace_backward(cst.ensure_type(updated, cst.SimpleStatementLine))
        if key in flow.clips:
            receiver = CODE(cst.ensure_type(flow.clips[key].func, cst.Attribute).value)
            unscale = cst.SimpleStatementLine(
                [cst.Expr(cst.parse_expression(f"{flow.training.scaler}.unscale_({receiver})"))],
                leading_lines=updated.leading_lines,
            )
            return [unscale, updated.with_changes(leading_lines=())]
        return [updated]

    def _replace_backward(self, updated: cst.SimpleStatementLine) -> list[_Statement]:
        call = cst.ensure_type(cst.ensure_type(updated.body[0], cst.Expr).value, cst.Call)
        bound = bind_arguments(call, BACKWARD_ARGS)
        assert (
            self.flow is not None and bound is not None
        )  # `_method` took only backwards whose arguments bind
        scaled = cst.Call(
            cst.parse_expression(f"{self.flow.training.scaler}.scale"), [cst.Arg(bound["loss"])]
        )
        kept = [keyword("retain_graph", bound["retain_graph"])] if "retain_graph" in bound else []
        new = cst.Call(cst.Attribute(scaled, cst.Name("backward")), kept)
        return [updated.with_changes(body=[updated.body[0].with_changes(value=new)])]


def _init_optimizer(statement: cst.SimpleStatementLine) -> cst.BaseExpression:
    """The optimizer `optimizer = FP16_Optimizer(opt, ...)` wraps (`_flow_of` checked the shape)."""
    call = cst.ensure_type(cst.ensure_type(statement.body[0], cst.Assign).value, cst.Call)
    args = bind_arguments(call, FP16_OPTIMIZER_ARGS)
    assert args is not None
    return args["init_optimizer"]


def _not(test: cst.BaseExpression) -> cst.UnaryOperation:
    """`not <test>`: without the guard the optimizer was a plain one, whose `zero_grad()` sets
    gradients to None; FP16_Optimizer's zeroed them."""
    operand = test.deep_clone()
    if not isinstance(operand, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        operand = operand.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(cst.Not(), operand)
