import os
import signal

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from shim_state import reset_amp_state

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def journals_in_a_temporary_folder(tmp_path_factory):
    """Group writes keep their journal in the user's state folder; tests keep theirs apart."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AMP_MIGRATE_STATE_DIR", str(tmp_path_factory.mktemp("amp-migrate-state")))
        yield


@pytest.fixture(autouse=True)
def fresh_amp_state():
    """Apex keeps process-global state; every test starts and ends without it."""
    reset_amp_state()
    yield
    reset_amp_state()


def pytest_collection_modifyitems(config, items):
    """The tests of a minute or more first, the rest in collection order (so that each module's
    tests stay together for its fixtures): under pytest-xdist the last tests to start are then
    short ones, and no worker sits idle while another finishes a test of minutes."""
    items.sort(key=lambda item: item.get_closest_marker("minutes") is None)


@pytest.fixture
def ctrl_c_as_from_a_terminal():
    """SIGINT raises KeyboardInterrupt here and in the processes started from here, as it does
    in a shell, whatever disposition an earlier test in this worker left behind (an ignored
    SIGINT is inherited by every child process)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
