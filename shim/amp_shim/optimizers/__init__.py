"""`apex.optimizers` without Apex's compiled extensions.

FusedAdam, FusedSGD and FusedAdagrad run torch's fused kernels (bit for bit the torch.optim
optimizer with `fused=True` that the codemod migrates them to); FusedLAMB, FusedNovoGrad and
FusedMixedPrecisionLamb, which torch lacks, are Apex's update rules in tensor ops. Constructor
arguments, defaults, `zero_grad()` behaviour and state-dict formats are Apex's.
"""

from .fused_adagrad import FusedAdagrad
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB
from .fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from .fused_novograd import FusedNovoGrad
from .fused_sgd import FusedSGD

__all__ = ["FusedSGD", "FusedAdam", "FusedNovoGrad", "FusedLAMB", "FusedAdagrad", "FusedMixedPrecisionLamb"]
