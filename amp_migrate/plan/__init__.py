"""The training planner: from a file's Apex calls as given, the plan for its GradScaler.

`types` holds what a plan is (`TrainingPlan`, `SharedScaler`, `InferenceRegion`,
`Fp16OptimizerPlan`, ...) and the readers of `initialize`'s and `scale_loss`'s arguments; the
other modules decide a plan: per block (`units`), across a trainer's methods (`methods`), for
inference-only models (`inference`), from `initialize`'s options (`options`), through functions
the scaler must be handed to (`threaded`), around run-time switches (`switch_flow`), and for
an `apex.fp16_utils.FP16_Optimizer` flow where the file has no amp plan (`fp16_optimizer`). Nothing here imports a
rule: the rules read the plan, the planner never reads the rules.

`plan_file` is the phase: it runs on the parse before the native rules, binds the file's Apex
names (the binding every rule reuses) and leaves the plan in the file's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ..diagnostics import Diagnostic
from ..file_state import FileState
from .fp16_optimizer import PlanFp16Optimizer, plan_fp16_optimizer
from .planner import Planner
from .training import PlanTraining
from .types import CastSource, Fp16OptimizerPlan, InferenceRegion, TrainingPlan


@dataclass(frozen=True)
class FilePlan:
    """What the planner decided for one file: the GradScaler plan (None: none, or refused),
    the inference-only regions, what each `initialize` cast, the plan of an `FP16_Optimizer`
    flow, and the diagnostics it reported (a refusal is a falling-back one, located at the
    call it could not plan)."""

    training: Optional[TrainingPlan] = None
    inference: Optional[tuple[InferenceRegion, ...]] = None
    casts: tuple[CastSource, ...] = ()
    fp16_optimizer: Optional[Fp16OptimizerPlan] = None
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def refused(self) -> bool:
        return any(d.falls_back for d in self.diagnostics)


def plan_file(module: cst.Module, state: FileState) -> FilePlan:
    """Bind the parse's Apex names and plan its GradScaler, before any rule runs.

    `state` is the file's (the parse's index, the options, its part in a project's shared
    scaler); the binding, the plans and the diagnostics are left on it for the rules, and the
    plans are returned. An `FP16_Optimizer` flow is planned only where amp left no plan."""
    before = len(state.diagnostics)
    if PlanTraining.applies(state):
        planner = PlanTraining(state)
        planner.read(module)
        planner.decide(module)
    else:
        Planner(state).read(module)  # binds only: nothing to plan
    if PlanFp16Optimizer.applies(state):
        state.fp16_optimizer = plan_fp16_optimizer(module, state)
    return FilePlan(
        state.training, state.inference, state.casts, state.fp16_optimizer, tuple(state.diagnostics[before:])
    )
