"""`apex.amp` on torch.amp: Apex's mixed-precision API, unchanged for its callers."""

from ._amp_state import _amp_state, master_params
from .amp import (
    float_function,
    half_function,
    init,
    promote_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from .frontend import initialize, load_state_dict, state_dict
from .handle import disable_casts, scale_loss

__version__ = "0.1.0"
VERSION = (0, 1, 0)

__all__ = [
    "init",
    "half_function",
    "float_function",
    "promote_function",
    "register_half_function",
    "register_float_function",
    "register_promote_function",
    "initialize",
    "scale_loss",
    "disable_casts",
    "master_params",
    "state_dict",
    "load_state_dict",
    "_amp_state",
]
