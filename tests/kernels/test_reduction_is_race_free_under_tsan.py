"""ThreadSanitizer finds no data race in the emulated reduction (kernels/norm.cu's block sums and
final reduction) nor in the other multi-tensor kernels, with one std::thread per CUDA thread
and __syncthreads as a std::barrier; and, as a control, it does report the race in a block sum
whose __syncthreads were removed (so a clean run means something)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import emulation
import pytest

DRIVER = Path(__file__).resolve().parent / "tsan_driver.cpp"


@pytest.fixture(scope="module")
def tsan_driver(kernel_cache_dir) -> Path:
    if emulation.compiler() is None:
        pytest.skip("no C++ compiler (%s)" % emulation.CXX)
    flags = [f for f in emulation.BASE_FLAGS if f not in ("-fPIC", "-Werror")] + [
        "-O1",
        "-g",
        "-fsanitize=thread",
    ]
    try:
        return emulation.build(kernel_cache_dir, "tsan_driver", flags, [DRIVER], extra_key=DRIVER.read_text())
    except RuntimeError as exc:
        if "tsan" in str(exc).lower() and ("cannot find" in str(exc) or "not found" in str(exc)):
            pytest.skip("this compiler has no ThreadSanitizer runtime: %s" % str(exc)[-300:])
        raise


def _run(driver: Path, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
    return subprocess.run([str(driver), mode], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_norm_reduction_and_multi_tensor_kernels_have_no_race_reports(tsan_driver):
    proc = _run(tsan_driver, "kernels")
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    norms = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("norm ")]
    assert len(norms) == 4


@pytest.mark.slow
def test_tsan_reports_a_block_sum_without_syncthreads(tsan_driver):
    proc = _run(tsan_driver, "racy")
    assert "WARNING: ThreadSanitizer: data race" in proc.stderr, proc.stderr[-2000:]
