"""Fixtures for the kernel tests: the host-emulation library, built once per session and cached
by a hash of the sources (in pytest's temporary root, which outlives one session), and a
backend that makes `amp_shim.engine.cuda` launch through it."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import emulation  # noqa: E402


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory) -> Path:
    """Beside the sessions' temporary roots: a pytest-xdist worker's root is one level deeper."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root.parent / "amp_shim_kernel_cache"


@pytest.fixture(scope="session")
def emu(kernel_cache_dir) -> emulation.Library:
    if emulation.compiler() is None:
        pytest.skip("no C++ compiler (%s) to build the host emulation" % emulation.CXX)
    return emulation.Library(emulation.build_library(kernel_cache_dir))


@pytest.fixture
def emulated(emu, monkeypatch):
    """A context-manager factory: `with emulated(chunk_size=.., block_size=..) as backend:` makes
    ops.py / cuda.py run the emulated kernels on CPU tensors (AMP_SHIM_KERNELS=auto)."""
    from amp_shim.engine import cuda

    monkeypatch.setenv("AMP_SHIM_KERNELS", "auto")

    @contextlib.contextmanager
    def factory(**config):
        with cuda.use_backend(emulation.EmulatedBackend(emu, **config)) as backend:
            yield backend

    return factory
