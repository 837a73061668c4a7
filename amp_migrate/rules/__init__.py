"""The rules. Each module is one Apex API or one step of the training loop.

`REGISTRY` lists every rule once, in no particular order, with the targets it runs under.
The running order is derived: each rule declares, on its class, the facts it reads and the
facts it writes (rules/facts.py), and `NATIVE_RULES` and `SHIM_RULES` run every writer of a
fact before its readers, ties going to the class name that sorts first (rules/order.py). An
order the declarations cannot satisfy (a cycle, a fact no rule writes) fails at import.
Everything else about a rule (the Apex names it handles, the codes it emits) is data on its
class too, and the tables here are derived from it.
"""

from __future__ import annotations

from typing import Union

from ..plan.fp16_optimizer import PlanFp16Optimizer
from ..plan.planner import Planner
from ..plan.training import PlanTraining
from .availability import ApexAvailabilityChecks
from .base import Rule
from .casts import CastRegistrationToAutocast
from .checkpoint import CheckpointToScaler
from .deprecated_amp import DeprecatedTorchAmp
from .dynamic_apex import DynamicApexUses
from .eval_casts import ForwardOutsideAutocast
from .fp16_optimizer import Fp16OptimizerToGradScaler
from .fp16_utils import Fp16UtilsToTorch
from .handle_api import WrapOptimizerToOptimizer
from .imports import RemainingApexUses, SettleImports, ShimImports
from .initialize import InitializeToGradScaler
from .master_params import MasterParamsUnscale
from .module_value import ApexModuleValueToScaler, ScalerInTheModuleSlot
from .normalization import FusedNormsToTorch
from .optimizer_alias import OptimizerClassAlias
from .optimizer_step import OptimizerStepThroughScaler
from .optimizers import FusedOptimizersToTorch
from .order import ordered
from .parallel import ApexParallelToTorch
from .rebinding import ReboundApexNames
from .scale_loss import ScaleLossToGradScaler
from .scaler_state import ScalerStateReads
from .thread_scaler import ThreadScalerThroughCalls

NATIVE = ("native",)
SHIM = ("shim",)
BOTH = NATIVE + SHIM

#: Every rule → the targets it runs under.
REGISTRY: dict[type[Rule], tuple[str, ...]] = {
    ApexAvailabilityChecks: NATIVE,
    ApexModuleValueToScaler: NATIVE,
    ApexParallelToTorch: NATIVE,
    CastRegistrationToAutocast: NATIVE,
    CheckpointToScaler: NATIVE,
    DeprecatedTorchAmp: BOTH,
    DynamicApexUses: BOTH,  # what it reports stays Apex whichever target is used
    ForwardOutsideAutocast: NATIVE,
    Fp16OptimizerToGradScaler: NATIVE,
    Fp16UtilsToTorch: NATIVE,
    FusedNormsToTorch: NATIVE,
    FusedOptimizersToTorch: NATIVE,
    InitializeToGradScaler: NATIVE,
    MasterParamsUnscale: NATIVE,
    OptimizerClassAlias: NATIVE,
    OptimizerStepThroughScaler: NATIVE,
    ReboundApexNames: NATIVE,
    RemainingApexUses: NATIVE,
    ScaleLossToGradScaler: NATIVE,
    ScalerInTheModuleSlot: NATIVE,
    ScalerStateReads: NATIVE,
    SettleImports: NATIVE,
    ShimImports: SHIM,
    ThreadScalerThroughCalls: NATIVE,
    WrapOptimizerToOptimizer: NATIVE,
}

NATIVE_RULES = ordered(rule for rule, targets in REGISTRY.items() if "native" in targets)
SHIM_RULES = ordered(rule for rule, targets in REGISTRY.items() if "shim" in targets)

#: Every rule once, native ones first, in running order.
ALL_RULES: list[type[Rule]] = list(dict.fromkeys(NATIVE_RULES + SHIM_RULES))
#: The planner phase (plan/): it runs on the parse before the native rules, handles Apex's
#: `initialize` (and an `FP16_Optimizer` flow) and reports with codes of its own, and is
#: documented with the rules.
PLANNERS: list[type[Planner]] = [PlanTraining, PlanFp16Optimizer]
#: Every pass that handles Apex names or reports a code: the planner, then the rules.
PASSES: list[type[Union[Planner, Rule]]] = [*PLANNERS, *ALL_RULES]


def emitters(code: str) -> list[type[Union[Planner, Rule]]]:
    """The passes that declare `code` (an "AMPnnn" string) in their EMITS, in running order."""
    return [rule for rule in PASSES if any(emitted.code == code for emitted in rule.EMITS)]


def owner(code: str) -> type[Union[Planner, Rule]] | None:
    """The rule whose documentation holds `code`: the first that emits it (None: the code is
    reported by the driver, the notebook reader or the project pass, not by a rule)."""
    found = emitters(code)
    return found[0] if found else None


def handled_names() -> dict[str, list[type[Union[Planner, Rule]]]]:
    """Each Apex (or deprecated torch) name some pass handles → those passes, in running order."""
    table: dict[str, list[type[Union[Planner, Rule]]]] = {}
    for rule in PASSES:
        for name in rule.HANDLES:
            table.setdefault(name, []).append(rule)
    return table
