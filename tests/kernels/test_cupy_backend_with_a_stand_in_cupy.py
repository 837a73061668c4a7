"""`engine.cuda.CupyBackend`, the only code that touches CuPy, driven by a stand-in `cupy`
module (no GPU here): it compiles every source once per device with the assembled text and the
tested NVRTC options, before any launch; a compile failure makes `auto` warn and use torch ops
and `cupy` raise with the compiler's message; a launch selects the device, runs on torch's
current stream and passes the arguments as given (the stand-in kernel runs the host emulation,
so the numbers are checked too)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import amp_shim.kernels as kernels
from amp_shim.engine import cuda


class FakeCupy(types.ModuleType):
    def __init__(self, emu, fail_compile=False):
        super().__init__("cupy")
        self.emu, self.fail_compile = emu, fail_compile
        self.modules, self.events, self.current = [], [], {"device": None, "stream": None}
        fake = self

        class Device:
            def __init__(self, index):
                self.index = index

            def __enter__(self):
                fake.events.append(("device", self.index))
                self.prev, fake.current["device"] = fake.current["device"], self.index

            def __exit__(self, *exc):
                fake.current["device"] = self.prev

        class ExternalStream:
            def __init__(self, ptr, device_id):
                self.ptr, self.device_id = ptr, device_id

            def __enter__(self):
                self.prev, fake.current["stream"] = fake.current["stream"], self.ptr

            def __exit__(self, *exc):
                fake.current["stream"] = self.prev

        class RawModule:
            def __init__(self, code, options, backend):
                fake.modules.append((code, options, backend, fake.current["device"]))

            def get_function(self, name):
                if fake.fail_compile:
                    raise RuntimeError('nvrtc: error: identifier "boom" is undefined')

                def kernel(grid, block, args):
                    fake.events.append(
                        ("launch", name, grid, block, fake.current["device"], fake.current["stream"])
                    )
                    fake.emu.launch(name, grid[0], block[0], args)

                return kernel

        self.cuda = types.SimpleNamespace(Device=Device, ExternalStream=ExternalStream)
        self.RawModule = RawModule

    def is_available(self):
        return True


@pytest.fixture
def fake_cupy(emu, monkeypatch):
    def install(**kw):
        fake = FakeCupy(emu, **kw)
        monkeypatch.setitem(sys.modules, "cupy", fake)
        return fake

    return install


def test_compiles_every_source_once_per_device_with_the_tested_text_and_options(fake_cupy):
    fake = fake_cupy()
    backend = cuda.CupyBackend()
    assert backend.accepts(torch.device("cuda", 1))
    assert backend.accepts(torch.device("cuda", 1))  # cached: no second compile
    assert backend.accepts(torch.device("cuda", 0))
    assert not backend.accepts(torch.device("cpu"))
    per_device = {}
    for code, options, backend_name, device in fake.modules:
        per_device.setdefault(device, []).append(code)
        assert options == cuda.compile_options() and backend_name == "nvrtc"
    assert sorted(per_device) == [0, 1]
    expected = [kernels.assemble_source(s) for s in kernels.KERNEL_SOURCES]
    assert per_device[0] == expected and per_device[1] == expected


def test_a_compile_failure_falls_back_in_auto_and_raises_in_cupy_mode(fake_cupy, monkeypatch):
    fake_cupy(fail_compile=True)
    backend = cuda.CupyBackend()
    with pytest.warns(RuntimeWarning, match=r'compiling amp_shim\'s CUDA kernels for cuda:0 failed .*"boom"'):
        assert not backend.accepts(torch.device("cuda", 0))
    with cuda.use_backend(backend):
        monkeypatch.setenv("AMP_SHIM_KERNELS", "cupy")
        with pytest.raises(cuda.KernelsUnavailableError, match='identifier "boom" is undefined'):
            cuda.require(torch.device("cuda", 0))


def test_launch_uses_the_device_and_torchs_current_stream_and_passes_the_arguments(fake_cupy, monkeypatch):
    fake = fake_cupy()
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0xABC)
    )
    backend = cuda.CupyBackend()
    device = torch.device("cuda", 3)
    assert backend.accepts(device)
    # Host tensors stand in for device memory: the stand-in kernel runs the emulation on them.
    grads = [torch.tensor([4.0, -8.0, float("inf")]), torch.tensor([2.0], dtype=torch.float16)]
    found, inv = torch.zeros(1), torch.tensor(0.25)
    backend.to_device = lambda host, dev: host
    with cuda.use_backend(backend):
        table, n, nchunks = cuda._table(device, [grads], [cuda._meta(g) for g in grads])
        backend.launch(
            device,
            "amp_mt_unscale",
            1,
            32,
            [
                cuda._ptr(table),
                cuda._i32(n),
                cuda._i64(nchunks),
                cuda._i64(backend.chunk_size),
                cuda._ptr(inv),
                cuda._ptr(found),
            ],
        )
    assert ("launch", "amp_mt_unscale", (1,), (32,), 3, 0xABC) in fake.events
    assert grads[0].tolist() == [1.0, -2.0, float("inf")] and grads[1].tolist() == [0.5]
    assert found.item() == 1.0
