"""The adapter that runs Apex's CUDA-only L0 tests on a machine without CUDA (a pytest plugin).

Apex's tests spell their device as CUDA everywhere: `.cuda()`, `device="cuda"`,
`torch.cuda.FloatTensor`, `torch.cuda.synchronize()`, and they compare type strings such as
`"torch.cuda.HalfTensor"`. The tests are read unmodified, so the spellings are mapped instead:
the CPU stands in for the one CUDA device.

* every CUDA device (`"cuda"`, `"cuda:0"`, `torch.device("cuda")`) given to a factory, `.to()`
  or `.cuda()` becomes the CPU; `torch.cuda.<T>Tensor` is the CPU `torch.<T>Tensor`;
* `Tensor.type()` reports a CPU tensor under its CUDA name, and accepts CUDA names; only what
  `.cpu()` returns, the one tensor the test moved to the host, keeps its CPU name;
* `torch.cuda.synchronize`, streams and events are no-ops; `torch.cuda.manual_seed` seeds the
  CPU generator, which now makes the tensors it was meant for;
* `torch.amp.autocast("cuda")` is CPU autocast in float16 (CUDA autocast's type) and
  `GradScaler("cuda")` is `GradScaler("cpu")`.

What is not mapped stays honest: `torch.cuda.is_available()` is still False (so the shim picks
its CPU engine by itself) and `torch.cuda.device_count()` is still 0, so tests that need two
GPUs or a large GPU skip with upstream's own reason. With CUDA present the plugin does nothing.
"""

from __future__ import annotations

import contextlib
import functools

import torch

_TYPE_NAMES = (
    "FloatTensor",
    "HalfTensor",
    "DoubleTensor",
    "BFloat16Tensor",
    "IntTensor",
    "LongTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
)
_FACTORIES = (
    "tensor",
    "as_tensor",
    "empty",
    "empty_strided",
    "zeros",
    "ones",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "linspace",
    "eye",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
)


def _cpu(device):
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return "cpu"
    return device


def _with_cpu_device(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


def _to_on_cpu(to):
    @functools.wraps(to)
    def wrapper(self, *args, **kwargs):
        args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return to(self, *args, **kwargs)

    return wrapper


_ON_HOST = "_amp_conformance_on_host"


def _cpu_marks_host(cpu):
    @functools.wraps(cpu)
    def wrapper(self, *args, **kwargs):
        moved = cpu(self, *args, **kwargs)
        if moved is self:  # already "moved": a distinct (differentiable) tensor to mark
            moved = self.view_as(self)
        setattr(moved, _ON_HOST, True)
        return moved

    return wrapper


def _type_under_cuda_names(type_):
    @functools.wraps(type_)
    def wrapper(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None:
            name = type_(self)
            return name if getattr(self, _ON_HOST, False) else name.replace("torch.", "torch.cuda.", 1)
        if isinstance(dtype, str):
            dtype = dtype.replace("torch.cuda.", "torch.", 1)
        return type_(self, dtype, non_blocking, **kwargs)

    return wrapper


class _Event:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Stream(_Event):
    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def record_event(self, *args, **kwargs) -> _Event:
        return _Event()


def _seed_cpu(seed) -> None:
    # Not torch.manual_seed: it seeds CUDA too, through these very functions.
    torch.default_generator.manual_seed(int(seed))


class _CpuAutocast(torch.amp.autocast):
    def __init__(self, device_type: str = "cuda", dtype=None, *args, **kwargs) -> None:
        if device_type == "cuda":
            device_type, dtype = "cpu", dtype or torch.float16
        super().__init__(device_type, dtype, *args, **kwargs)


class _CpuGradScaler(torch.amp.GradScaler):
    def __init__(self, device: str = "cuda", *args, **kwargs) -> None:
        super().__init__(_cpu(device), *args, **kwargs)


def install() -> None:
    """Map CUDA spellings to the CPU for the rest of this process (a test process only)."""
    for name in _FACTORIES:
        setattr(torch, name, _with_cpu_device(getattr(torch, name)))
    for name in _TYPE_NAMES:
        setattr(torch.cuda, name, getattr(torch, name))
    torch.Tensor.to = _to_on_cpu(torch.Tensor.to)
    torch.nn.Module.to = _to_on_cpu(torch.nn.Module.to)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.type = _type_under_cuda_names(torch.Tensor.type)
    torch.Tensor.cpu = _cpu_marks_host(torch.Tensor.cpu)

    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda *args, **kwargs: None
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda *args, **kwargs: _Stream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    torch.cuda.manual_seed = torch.cuda.manual_seed_all = _seed_cpu

    torch.amp.autocast = torch.autocast = _CpuAutocast
    torch.amp.GradScaler = torch.cuda.amp.GradScaler = _CpuGradScaler


def pytest_configure(config) -> None:
    if not torch.cuda.is_available():
        install()
