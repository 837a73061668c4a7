"""The one reset of the shim's process-global state, for the suite's fixture and for tests that
run several programs in one test."""

from __future__ import annotations

import torch

#: What `amp.initialize` and friends leave on `_amp_state` besides the handle.
TOUCHED = ("loss_scalers", "opt_properties", "min_loss_scale", "max_loss_scale")


def reset_amp_state() -> None:
    """No handle, no scalers, Apex's default flags, autocast off and its cache empty."""
    from amp_shim.amp._amp_state import _amp_state

    handle = getattr(_amp_state, "handle", None)
    if handle is not None:
        handle._deactivate()
    for name in ("handle", *TOUCHED):
        if hasattr(_amp_state, name):
            delattr(_amp_state, name)
    _amp_state.hard_override = False
    _amp_state.allow_incoming_model_not_fp32 = False
    _amp_state.verbosity = 1
    for device_type in ("cpu", "cuda"):
        torch.set_autocast_enabled(device_type, False)
    torch.clear_autocast_cache()
