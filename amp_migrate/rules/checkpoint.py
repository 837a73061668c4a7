"""`amp.state_dict()` / `amp.load_state_dict(sd)` → the GradScaler's own.

What it does
    Saves and restores the scaler's state instead of Apex's global loss scalers.

Why
    GradScaler's state (`scale`, `_growth_tracker`, and its constants) is what the native loop
    needs to resume exactly. The formats differ: Apex wrote
    `{"loss_scaler0": {"loss_scale": ..., "unskipped": ...}}`, so a checkpoint saved by the old
    code must be converted once with `amp-migrate convert-checkpoint` (lossless) before the
    migrated code loads it; each load site gets a warning that says so.

Soundness
    The GradScaler's `state_dict()` holds everything its future depends on (scale, growth
    tracker and constants), as Apex's held each loss scaler's scale and clean-step count, so
    saving one and loading it back resumes the native loop exactly (tests/equivalence
    `checkpoint-resume` runs save, then resume in a new process, bit for bit). Old checkpoints
    hold Apex's format, which `convert-checkpoint` translates losslessly; every load site says
    so.

Fix safety
    Safe for new checkpoints; old checkpoints need the one-time conversion.

Example
    checkpoint = {"model": model.state_dict(), "amp": amp.state_dict()}
    amp.load_state_dict(checkpoint["amp"])
becomes
    checkpoint = {"model": model.state_dict(), "amp": scaler.state_dict()}
    scaler.load_state_dict(checkpoint["amp"])
"""

from __future__ import annotations

import libcst as cst

from ..diagnostics import Severity, define
from ..plan.types import LOAD_STATE_DICT, STATE_DICT
from .base import TrainingRule
from .facts import Fact

OLD_CHECKPOINTS = define(
    "AMP310",
    "convert-old-checkpoints",
    Severity.WARNING,
    "This load now expects GradScaler state; checkpoints saved by the Apex code need "
    "`amp-migrate convert-checkpoint` first.",
    '`amp.state_dict()` saved `{"loss_scaler0": {"loss_scale", "unskipped"}}`; '
    '`GradScaler.load_state_dict` expects `{"scale", "growth_factor", "backoff_factor", '
    '"growth_interval", "_growth_tracker"}`. `amp-migrate convert-checkpoint OLD.pt NEW.pt` '
    "rewrites the entry losslessly and leaves the rest of the file alone.",
    before='amp.load_state_dict(checkpoint["amp"])',
    after='scaler.load_state_dict(checkpoint["amp"])  # after: amp-migrate convert-checkpoint',
)


class CheckpointToScaler(TrainingRule):
    HANDLES = (STATE_DICT, LOAD_STATE_DICT)
    EMITS = (OLD_CHECKPOINTS,)
    READS = frozenset(
        {
            Fact.APEX_ANALYSED,
            Fact.FP16_PLAN,
            Fact.MODULE_VALUE_REWRITTEN,
            Fact.SCALER_STATE_REWRITTEN,
            Fact.TRAINING,
        }
    )
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.SCALER_CALLS_WRITTEN})

    MARKERS = ("state_dict",)
    APEX_ON_THE_LINE = True

    def interest(self):
        return self.words_for(STATE_DICT, LOAD_STATE_DICT)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.plan is None:
            return updated_node
        name = self.apex_name(original_node.func)
        if name == STATE_DICT:
            method = "state_dict"
        elif name == LOAD_STATE_DICT:
            method = "load_state_dict"
            self.report(original_node, OLD_CHECKPOINTS)
        else:
            return updated_node
        return updated_node.with_changes(func=cst.parse_expression(f"{self.plan.scaler}.{method}"))
