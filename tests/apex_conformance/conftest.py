"""Apex's L0 tests run in background processes while the rest of the suite runs.

The project's suite is single-threaded and the conformance run is minutes of CPU work of its
own, so once collection has selected any conformance test, the L0 directories start at once
(one at a time beside the suite, or two at a time when nothing else was selected) and the
conformance tests, moved to the end of the session, only wait for their results. Under
pytest-xdist each directory still runs once: the workers share the runs (`_obtain`).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import l0_runner as runner
import pytest

_HERE = Path(__file__).resolve().parent
_futures: dict[str, Future] = {}
_state: dict = {}


def _is_conformance(item) -> bool:
    return _HERE in Path(str(item.path)).resolve().parents


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    ours = [item for item in items if _is_conformance(item)]
    items[:] = [item for item in items if not _is_conformance(item)] + ours
    _state["alone"] = len(ours) == len(items)


def pytest_collection_finish(session) -> None:
    if runner.L0 is None or config_only(session) or not any(_is_conformance(i) for i in session.items):
        return
    junit_dir = Path(tempfile.mkdtemp(prefix="apex-l0-"))
    pool = ThreadPoolExecutor(max_workers=2 if _state.get("alone") else 1)
    _state.update(pool=pool, junit_dir=junit_dir, processes=[], shared=_shared_folder(session))

    for directory in runner.DIRECTORIES:
        _futures[directory] = pool.submit(_obtain, directory, False)


def _shared_folder(session) -> Path | None:
    """Under pytest-xdist, the folder all workers of the session see (their temporary root),
    where each L0 directory's run is left by the worker that made it; otherwise None."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    shared = session.config._tmp_path_factory.getbasetemp().parent / "apex-l0-runs"
    shared.mkdir(exist_ok=True)
    return shared


def _run(directory: str) -> runner.DirectoryRun:
    junit = _state["junit_dir"] / f"{directory}.xml"
    process = runner.start(directory, junit)
    _state["processes"].append(process)
    return runner.finish(directory, process, junit)


def _obtain(directory: str, wait: bool) -> runner.DirectoryRun | None:
    """The directory's run: made here, or under pytest-xdist read from the worker that made it;
    None if another worker is making it and `wait` is false."""
    shared = _state["shared"]
    if shared is None:
        return _run(directory)
    result = shared / f"{directory}.pickle"
    with open(shared / f"{directory}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        if result.exists():
            return pickle.loads(result.read_bytes())
        run = _run(directory)
        partial = result.with_name(f"{result.name}.{os.getpid()}")
        partial.write_bytes(pickle.dumps(run))
        os.replace(partial, result)
        return run


def config_only(session) -> bool:
    return bool(session.config.option.collectonly)


def pytest_unconfigure(config) -> None:
    for process in _state.get("processes", []):
        if process.poll() is None:
            process.kill()
    if "pool" in _state:
        _state["pool"].shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(_state["junit_dir"], ignore_errors=True)


@pytest.fixture(scope="session")
def apex_l0_run():
    """directory -> its DirectoryRun, waiting for the background process to finish."""

    def get(directory: str) -> runner.DirectoryRun:
        if directory not in _futures:
            pytest.fail("the L0 run of %s was not started (collection did not select it)" % directory)
        run = _futures[directory].result()
        return run if run is not None else _obtain(directory, True)

    return get
