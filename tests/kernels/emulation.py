"""Build kernels/*.cu for the host (g++ against kernels/emulate/) and launch them from Python.

`build_library` compiles kernels/emulate/host_launch.cpp (which includes every kernel source)
into a shared library, cached by a hash of the sources, the flags and the compiler's version.
`EmulatedBackend` is an `amp_shim.engine.cuda` backend that launches through that library on
CPU tensors, so `engine/cuda.py` (tables, argument passing) and `engine/ops.py` (dispatch) run
exactly as on a GPU, with the emulated kernels in place of CuPy's.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy
import torch

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"
EMULATE = KERNELS / "emulate"

CXX = os.environ.get("CXX", "g++")
# No fast math, no FMA contraction: host float ops round exactly as the kernels' __fmul_rn etc.
BASE_FLAGS = [
    "-std=c++20",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-Wall",
    "-Wextra",
    "-Werror",
]


def compiler() -> Optional[str]:
    return shutil.which(CXX)


def source_files() -> list[Path]:
    files = sorted(KERNELS.glob("*.cu")) + sorted(KERNELS.glob("*.cuh"))
    return files + sorted(p for p in EMULATE.iterdir() if p.suffix in (".h", ".cpp"))


def _key(flags: Sequence[str], extra: str = "") -> str:
    digest = hashlib.sha256()
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    digest.update(version.encode())
    digest.update("\0".join(flags).encode())
    digest.update(extra.encode())
    for path in source_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def build(
    cache_dir: Path, output_name: str, flags: Sequence[str], sources: Sequence[Path], extra_key: str = ""
) -> Path:
    """Compile `sources` with `flags` into cache_dir/<output_name with the hash>, unless built.

    One build at a time per target (a lock beside it), so that pytest-xdist workers wanting the
    same library wait for the first one's build instead of compiling it too."""
    key = _key(list(flags) + [str(s) for s in sources], extra_key)
    stem, dot, suffix = output_name.partition(".")
    target = cache_dir / ("%s-%s%s%s" % (stem, key, dot, suffix))
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        tmp = target.with_name(target.name + ".tmp%d" % os.getpid())
        proc = subprocess.run(
            [CXX, *flags, *map(str, sources), "-o", str(tmp)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError("building the host emulation failed:\n%s\n%s" % (proc.stdout, proc.stderr))
        os.replace(tmp, target)
    return target


def build_library(cache_dir: Path, *, optimize: str = "-O2") -> Path:
    return build(
        cache_dir, "libamp_emu.so", BASE_FLAGS + [optimize, "-shared"], [EMULATE / "host_launch.cpp"]
    )


class Library:
    """The built shared library, with typed entry points."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.amp_emu_launch.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        self.lib.amp_emu_launch.restype = ctypes.c_int
        self.lib.amp_emu_kernels.restype = ctypes.c_char_p
        self.lib.amp_emu_kernel_arg_sizes.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
        ]
        self.lib.amp_emu_kernel_arg_sizes.restype = ctypes.c_int
        for name in (
            "amp_emu_half_to_float",
            "amp_emu_bf16_to_float",
            "amp_emu_half_from_float",
            "amp_emu_bf16_from_float",
        ):
            getattr(self.lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
            getattr(self.lib, name).restype = None

    def kernel_names(self) -> list[str]:
        return self.lib.amp_emu_kernels().decode().split(",")

    def arg_sizes(self, name: str) -> list[int]:
        out = (ctypes.c_int * 32)()
        count = self.lib.amp_emu_kernel_arg_sizes(name.encode(), out, 32)
        if count < 0:
            raise KeyError("no kernel %r in the emulation" % name)
        return list(out[:count])

    def launch(self, name: str, grid: int, block: int, args: Sequence[Any]) -> None:
        values = [_ctype(a) for a in args]
        passed = [ctypes.sizeof(v) for v in values]
        expected = self.arg_sizes(name)
        if passed != expected:  # on a GPU this would be a silently corrupt launch
            raise TypeError("%s takes arguments of %s bytes, was passed %s" % (name, expected, passed))
        array = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        rc = self.lib.amp_emu_launch(name.encode(), grid, block, array)
        if rc != 0:
            raise RuntimeError("amp_emu_launch(%r, grid=%d, block=%d) returned %d" % (name, grid, block, rc))

    # conversions (uint16 bit patterns <-> float32), through the emulation's __half / __nv_bfloat16
    def to_float(self, bits: torch.Tensor, kind: str) -> torch.Tensor:
        bits = bits.contiguous()
        out = torch.empty(bits.numel(), dtype=torch.float32)
        getattr(self.lib, "amp_emu_%s_to_float" % kind)(bits.data_ptr(), out.data_ptr(), bits.numel())
        return out

    def from_float(self, values: torch.Tensor, kind: str) -> torch.Tensor:
        values = values.contiguous()
        out = torch.empty(values.numel(), dtype=torch.int16)
        getattr(self.lib, "amp_emu_%s_from_float" % kind)(values.data_ptr(), out.data_ptr(), values.numel())
        return out


_CTYPES = {
    numpy.dtype(numpy.uint64): ctypes.c_uint64,
    numpy.dtype(numpy.int64): ctypes.c_int64,
    numpy.dtype(numpy.int32): ctypes.c_int32,
    numpy.dtype(numpy.float32): ctypes.c_float,
    numpy.dtype(numpy.float64): ctypes.c_double,
}


def _ctype(value: Any) -> Any:
    if not isinstance(value, numpy.generic) or value.dtype not in _CTYPES:
        raise TypeError("kernel arguments must be numpy scalars of a CUDA-sized type, got %r" % (value,))
    return _CTYPES[value.dtype](value.item())


class EmulatedBackend:
    """An `engine.cuda` backend that runs the emulated kernels on CPU tensors."""

    def __init__(
        self,
        library: Library,
        *,
        chunk_size: int = 64,
        block_size: int = 32,
        final_block_size: int = 32,
        max_grid: int = 65535,
    ) -> None:
        self.library = library
        self.chunk_size = chunk_size
        self.block_size = block_size
        self.final_block_size = final_block_size
        self.max_grid = max_grid
        self.launches: list[tuple[str, int, int]] = []

    def unavailable_reason(self, device: torch.device) -> Optional[str]:
        return None if device.type == "cpu" else "the emulation runs on CPU tensors only"

    def accepts(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def launch(self, device: torch.device, name: str, grid: int, block: int, args: Sequence[Any]) -> None:
        assert device.type == "cpu", device
        self.launches.append((name, grid, block))
        self.library.launch(name, grid, block, args)

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        assert device.type == "cpu", device
        return host
