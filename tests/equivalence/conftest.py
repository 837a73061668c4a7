import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from equivalence_cases import BY_ID  # noqa: E402
from equivalence_harness import Runner  # noqa: E402


@pytest.fixture(scope="session")
def equivalence_runner(request, tmp_path_factory):
    """One pool for the session; every case the session collected is queued up front, so the
    subprocesses (3 per case) keep the cores busy while the tests compare finished ones. Under
    pytest-xdist the workers share the records (the session's temporary root is common to them),
    so each program still runs once per mode."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    shared = root / "equivalence-records"
    shared.mkdir(exist_ok=True)
    runner = Runner(tmp_path_factory.mktemp("equivalence"), shared=shared)
    for item in request.session.items:
        case_id = getattr(getattr(item, "callspec", None), "params", {}).get("case")
        case = BY_ID.get(getattr(case_id, "id", case_id))
        if case is not None:
            runner.submit(case)
    yield runner
    runner.close()
