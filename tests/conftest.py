import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_amp_state():
    """Apex keeps process-global state; every test starts and ends without it."""
    yield
    from amp_shim.amp._amp_state import _amp_state

    handle = getattr(_amp_state, "handle", None)
    if handle is not None:
        handle._deactivate()
    for name in ("handle", "loss_scalers", "opt_properties", "min_loss_scale", "max_loss_scale"):
        if hasattr(_amp_state, name):
            delattr(_amp_state, name)
    _amp_state.hard_override = False
    _amp_state.allow_incoming_model_not_fp32 = False
    _amp_state.verbosity = 1
    for device_type in ("cpu", "cuda"):
        torch.set_autocast_enabled(device_type, False)
    torch.clear_autocast_cache()
