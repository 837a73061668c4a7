"""The rules, in the order they run. Each module is one Apex concern (DESIGN.md §2)."""
from .availability import ApexAvailabilityChecks
from .casts import CastRegistrationToAutocast
from .checkpoint import CheckpointToScaler
from .deprecated_amp import DeprecatedTorchAmp
from .fp16_optimizer import Fp16OptimizerToGradScaler
from .fp16_utils import Fp16UtilsToTorch
from .handle_api import WrapOptimizerToOptimizer
from .imports import RemainingApexUses, SettleImports, ShimImports
from .initialize import InitializeToGradScaler
from .master_params import MasterParamsUnscale
from .normalization import FusedNormsToTorch
from .optimizer_step import OptimizerStepThroughScaler
from .optimizer_alias import OptimizerClassAlias
from .optimizers import FusedOptimizersToTorch
from .parallel import ApexParallelToTorch
from .rebinding import ReboundApexNames
from .scale_loss import ScaleLossToGradScaler
from .scaler_state import ScalerStateReads
from .thread_scaler import ThreadScalerThroughCalls
from .training_plan import PlanTraining

NATIVE_RULES = [
    PlanTraining,
    ReboundApexNames,
    ScalerStateReads,
    InitializeToGradScaler,
    WrapOptimizerToOptimizer,
    ScaleLossToGradScaler,
    MasterParamsUnscale,
    Fp16OptimizerToGradScaler,
    OptimizerStepThroughScaler,
    CheckpointToScaler,
    ThreadScalerThroughCalls,
    DeprecatedTorchAmp,
    CastRegistrationToAutocast,
    Fp16UtilsToTorch,
    OptimizerClassAlias,
    FusedOptimizersToTorch,
    ApexParallelToTorch,
    FusedNormsToTorch,
    ApexAvailabilityChecks,
    SettleImports,
    RemainingApexUses,
]

SHIM_RULES = [DeprecatedTorchAmp, ShimImports]
