"""The rules, in the order they run. Each module is one Apex concern (DESIGN.md §2)."""
from .checkpoint import CheckpointToScaler
from .imports import RemainingApexUses, SettleImports, ShimImports
from .initialize import InitializeToGradScaler
from .master_params import MasterParamsUnscale
from .optimizer_step import OptimizerStepThroughScaler
from .scale_loss import ScaleLossToGradScaler
from .training_plan import PlanTraining

NATIVE_RULES = [
    PlanTraining,
    InitializeToGradScaler,
    ScaleLossToGradScaler,
    MasterParamsUnscale,
    OptimizerStepThroughScaler,
    CheckpointToScaler,
    SettleImports,
    RemainingApexUses,
]

SHIM_RULES = [ShimImports]
