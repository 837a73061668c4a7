import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from shim_state import reset_amp_state

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_amp_state():
    """Apex keeps process-global state; every test starts and ends without it."""
    reset_amp_state()
    yield
    reset_amp_state()
