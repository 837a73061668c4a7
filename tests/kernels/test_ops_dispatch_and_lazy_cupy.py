"""How engine/ops.py picks a path, and that CuPy is never imported eagerly:
* `import amp_shim, amp_shim.amp` (and a whole CPU training step) leaves CuPy unimported;
* AMP_SHIM_KERNELS=auto runs torch ops on CPU tensors (never touching CuPy), =torch always
  torch ops, =cupy raises a clear error without a GPU, and a bad value a ValueError;
* with a backend that accepts the tensors, auto runs the kernels, but falls back to torch for
  tensors they do not take (float64, non-contiguous), which =cupy refuses with the reason;
* the table cache re-uses a table for the same tensors and never mixes up different ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import kernels_env
from reference import assert_same_bits

from amp_shim.engine import cuda, ops


def _in_subprocess(code: str, env=None) -> dict:
    import os

    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_importing_the_shim_does_not_import_cupy():
    report = _in_subprocess(
        "import sys, json, amp_shim, amp_shim.amp, amp_shim.engine.ops, amp_shim.engine.cuda\n"
        "print(json.dumps({'cupy': sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends'))}))"
    )
    assert report["cupy"] == []


@pytest.mark.slow
def test_a_cpu_training_step_under_auto_does_not_import_cupy():
    code = """
import sys, json, torch
from amp_shim import amp
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
with amp.scale_loss(model(torch.ones(3, 4).half()).float().sum(), opt) as scaled:
    scaled.backward()
opt.step()
print(json.dumps({'cupy': sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends'))}))
"""
    assert _in_subprocess(code, {"AMP_SHIM_KERNELS": "auto"})["cupy"] == []


def test_bad_mode_is_a_value_error(monkeypatch):
    monkeypatch.setenv("AMP_SHIM_KERNELS", "gpu")
    with pytest.raises(ValueError, match="AMP_SHIM_KERNELS='gpu': expected one of auto, torch, cupy"):
        ops.unscale_([torch.ones(2)], torch.zeros(1), torch.tensor(1.0))


def test_forced_cupy_without_a_gpu_raises_a_clear_error(monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setenv("AMP_SHIM_KERNELS", "cupy")
    with cuda.use_backend(cuda.CupyBackend()):
        with pytest.raises(
            cuda.KernelsUnavailableError,
            match=r"AMP_SHIM_KERNELS=cupy, but the CUDA kernels cannot run: "
            r"CuPy is installed but finds no usable CUDA device \(cupy.is_available\(\) is False\)",
        ):
            ops.unscale_([torch.ones(2)], torch.zeros(1), torch.tensor(1.0))


def test_forced_cupy_without_cupy_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv("AMP_SHIM_KERNELS", "cupy")
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with cuda.use_backend(cuda.CupyBackend()):
        with pytest.raises(
            cuda.KernelsUnavailableError, match=r"CuPy is not importable .*pip install 'amp-migrate\[cuda\]'"
        ):
            ops.copy_([torch.ones(2)], [torch.zeros(2)])


def test_auto_on_cpu_tensors_takes_the_torch_path_without_asking_cupy(monkeypatch):
    monkeypatch.setenv("AMP_SHIM_KERNELS", "auto")

    class Refusing(cuda.CupyBackend):
        def _probe(self):
            raise AssertionError("CuPy probed for CPU tensors")

    with cuda.use_backend(Refusing()):
        grads = [torch.tensor([2.0, float("inf")])]
        found = torch.zeros(1)
        ops.unscale_(grads, found, torch.tensor(0.5))
    assert grads[0].tolist() == [1.0, float("inf")] and found.item() == 1.0


def test_auto_falls_back_to_torch_for_tensors_the_kernels_do_not_take(emulated):
    with emulated() as backend:
        doubles = [torch.ones(5, dtype=torch.float64) * 4]
        ops.unscale_(doubles, torch.zeros(1), torch.tensor(0.5))
        strided = [(torch.ones(6, 4) * 4)[:, 1]]
        ops.unscale_(strided, torch.zeros(1), torch.tensor(0.5))
        assert backend.launches == []
        assert doubles[0].tolist() == [2.0] * 5 and strided[0].tolist() == [2.0] * 6
        ops.unscale_([torch.ones(3) * 4], torch.zeros(1), torch.tensor(0.5))
        assert len(backend.launches) == 1


def test_forced_cupy_refuses_tensors_the_kernels_do_not_take_with_the_reason(emulated):
    with emulated(), kernels_env("cupy"):
        with pytest.raises(ValueError, match="do not handle a torch.float64 tensor"):
            ops.unscale_([torch.ones(5, dtype=torch.float64)], torch.zeros(1), torch.tensor(0.5))
        with pytest.raises(ValueError, match="do not handle a non-contiguous tensor"):
            ops.copy_([torch.ones(6, 4)[:, 1]], [torch.ones(6)])


def test_torch_mode_never_launches(emulated):
    with emulated() as backend, kernels_env("torch"):
        ops.unscale_([torch.ones(3)], torch.zeros(1), torch.tensor(0.5))
        ops.copy_([torch.ones(3).half()], [torch.ones(3)])
    assert backend.launches == []


def test_table_cache_reuses_tables_and_tells_different_tensors_apart(emulated):
    with emulated():
        a = [torch.full((70,), 8.0), torch.full((3,), 8.0, dtype=torch.float16)]
        ops.unscale_(a, torch.zeros(1), torch.tensor(0.5))
        n_tables = len(cuda._tables)
        ops.unscale_(a, torch.zeros(1), torch.tensor(0.5))
        assert len(cuda._tables) == n_tables  # same tensors: the cached table
        b = [torch.full((70,), 8.0, dtype=torch.bfloat16), torch.full((3,), 8.0, dtype=torch.float16)]
        ops.unscale_(b, torch.zeros(1), torch.tensor(0.5))
        assert len(cuda._tables) == n_tables + 1
    assert_same_bits(a[0], torch.full((70,), 2.0))
    assert_same_bits(a[1], torch.full((3,), 2.0, dtype=torch.float16))
    assert_same_bits(b[0], torch.full((70,), 4.0, dtype=torch.bfloat16))


def test_a_launch_with_arguments_of_the_wrong_size_is_refused(emu):
    import numpy

    # amp_mt_copy(const long long* table, int n, long long nchunks, long long chunk_size)
    assert emu.arg_sizes("amp_mt_copy") == [8, 4, 8, 8]
    with pytest.raises(
        TypeError, match=r"amp_mt_copy takes arguments of \[8, 4, 8, 8\] bytes, was passed \[8, 4, 8, 4\]"
    ):
        emu.launch("amp_mt_copy", 1, 1, [numpy.uint64(0), numpy.int32(0), numpy.int64(0), numpy.int32(64)])
