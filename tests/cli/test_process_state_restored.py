"""A run through the API leaves the calling process as it found it: the collector's thresholds
and frozen set, and the SIGINT handler, so a long-running process can call it again and again."""

from __future__ import annotations

import gc
import signal

import pytest

from .conftest import NATIVE_INPUT, run_cli


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_run_restores_the_collector_and_the_interrupt_handler(tmp_path, jobs):
    (tmp_path / "train.py").write_text(NATIVE_INPUT)
    before = (gc.get_threshold(), gc.get_freeze_count(), signal.getsignal(signal.SIGINT))
    result = run_cli(["--diff", "--jobs", jobs, "train.py"], tmp_path)
    assert result.exit_code in (0, 1), result.output
    assert (gc.get_threshold(), gc.get_freeze_count(), signal.getsignal(signal.SIGINT)) == before


@pytest.mark.slow
def test_what_the_caller_froze_stays_frozen(tmp_path):
    (tmp_path / "train.py").write_text(NATIVE_INPUT)
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        run_cli(["--diff", "train.py"], tmp_path)
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
