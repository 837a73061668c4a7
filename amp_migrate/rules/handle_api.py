"""The 2018 handle API: `optimizer = amp_handle.wrap_optimizer(optimizer)` → the optimizer itself.

What it does
    Drops the wrapper: the name keeps meaning the optimizer, whose `step`, `zero_grad` and
    `state_dict` the wrapper only forwarded. `amp.init()` becomes the GradScaler (see
    `initialize`) and `with optimizer.scale_loss(loss) as s:` a `scale_loss` block (see
    `scale_loss`); because `amp.init()` cast every op from then on, the autocast region covers
    the whole iteration up to the loss, not just a model's forward.

Why
    `OptimWrapper` kept one dynamic loss scaler per loss (`num_loss`) and skipped the step when
    any overflowed; one GradScaler does the same for all losses together.

Soundness
    `OptimWrapper` only forwarded `step`, `zero_grad` and `state_dict` to the optimizer it
    wrapped, so the bare optimizer behaves the same in everything but loss scaling, which the
    GradScaler takes over exactly as for `amp.initialize` (its steps and updates are placed by
    the same rules). `amp.init()` cast every op from then on, so the autocast region covers
    the whole iteration up to the loss instead of starting at a model's forward.

Fix safety
    Safe. `wrap_optimizer` with other arguments than the optimizer and a literal `num_loss`
    falls back to the shim.

Example
    amp_handle = amp.init()
    optimizer = amp_handle.wrap_optimizer(optimizer)
becomes
    scaler = torch.amp.GradScaler("cuda")
"""

from __future__ import annotations

import libcst as cst

from ..analysis.binding import HANDLE
from ..diagnostics import Severity, define
from ..plan.types import ONE_SCALER, bind_arguments, literal
from .base import TrainingRule
from .facts import Fact

WRAP_ARGS = define(
    "AMP710",
    "wrap-optimizer-arguments",
    Severity.WARNING,
    "`wrap_optimizer` is called with arguments amp-migrate cannot map.",
    "The native form keeps the optimizer and routes every loss through one GradScaler. That is "
    "provable for `wrap_optimizer(optimizer)` and `wrap_optimizer(optimizer, num_loss=N)` with "
    "a literal N, assigned to a name; other shapes keep Apex's semantics through the shim.",
    falls_back=True,
    refusal="wrap_optimizer arguments with no provable mapping",
    fallback_title="`wrap_optimizer` with arguments that cannot be mapped",
    shape=(
        "The 2018 handle API's `amp_handle.wrap_optimizer(optimizer, num_loss=n_losses)` with a run-time "
        "`num_loss`, other arguments, or a result that is not assigned to a name."
    ),
    by_hand=(
        "Pass `num_loss` as a literal and assign the result to a name (`optimizer = "
        "amp_handle.wrap_optimizer(optimizer, num_loss=2)`), then re-run; or drop the wrapper and scale "
        "every loss with one `torch.amp.GradScaler`."
    ),
)


class WrapOptimizerToOptimizer(TrainingRule):
    HANDLES = (HANDLE + ".wrap_optimizer",)
    EMITS = (WRAP_ARGS, ONE_SCALER)
    READS = frozenset({Fact.APEX_ANALYSED, Fact.MODULE_VALUE_REWRITTEN, Fact.TRAINING})
    WRITES = frozenset(
        {Fact.AMP_PLAN_CARRIED, Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.SCALER_CALLS_WRITTEN}
    )

    MARKERS = ("wrap_optimizer",)

    def interest(self):
        return self.words_for(HANDLE + ".wrap_optimizer")

    def _wrap_call(self, node: cst.CSTNode):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "wrap_optimizer"
            and self.apex_name(node.func.value) == HANDLE
        ):
            return node
        return None

    def leave_SimpleStatementLine(self, original_node, updated_node):
        small = original_node.body[0] if len(original_node.body) == 1 else None
        call = self._wrap_call(getattr(small, "value", None))
        if call is None:
            return updated_node
        args = bind_arguments(call, ("optimizer", "num_loss"))
        losses = literal(args.get("num_loss")) if args else None
        if (
            args is None
            or "optimizer" not in args
            or set(args) - {"optimizer", "num_loss"}
            or not isinstance(small, cst.Assign)
            or len(small.targets) != 1
            or ("num_loss" in args and not isinstance(losses, int))
        ):
            self.report(call, WRAP_ARGS)
            return updated_node
        if isinstance(losses, int) and losses > 1:
            self.report(args["num_loss"], ONE_SCALER)
        target, optimizer = small.targets[0].target, args["optimizer"]
        if self.code_of(target) == self.code_of(optimizer):
            return cst.RemoveFromParent()
        return updated_node.with_changes(body=[updated_node.body[0].with_changes(value=optimizer)])
