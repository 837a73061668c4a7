"""The engine's CUDA kernels (`amp_shim.kernels`, `kernels/*.cu`), launched through CuPy on torch
tensors.

`ops.py` decides when these run (CuPy importable, `cupy.is_available()`, tensors on CUDA, or
`AMP_SHIM_KERNELS=cupy`); this module only builds the launches. Nothing here imports CuPy until
a kernel is launched or availability is asked, so `import amp_shim` never loads it.

How a launch works:

* Sources: one CuPy `RawModule` per `.cu` file (`amp_shim.kernels.KERNEL_SOURCES`), compiled
  by NVRTC from `amp_shim.kernels.assemble_source` (local headers inlined) with
  `compile_options()`, the same text and options the tests compile for sm_80/sm_90/compute_80.
  All are built once per process and device, at the first op on that device, before anything
  is launched (CuPy compiles for the device's architecture and keeps the binary in its kernel
  cache, so further devices of the same architecture and later processes load it). If that
  fails, `auto` warns once and keeps to torch ops; `cupy` raises with the compiler's log.
* Tensors: every kernel takes a device-side table of tensor addresses, sizes, chunk offsets and
  element types (layout in kernels/multi_tensor.cuh), so one launch covers a whole list of
  tensors of mixed fp32/fp16/bf16 types. Scalars that live on the device (inv_scale, the
  overflow flag, the loss scale) are passed by address too, so the host never reads them. All
  addresses are torch's own (`Tensor.data_ptr()`): no copy, no DLPack wrapper per tensor. The
  table is built on the host from sizes and addresses only (no device read), copied from pinned
  memory without blocking, and cached by its contents, so a steady training loop re-uses it.
* Stream: the launch goes to torch's current stream on the tensors' device (wrapped with
  `cupy.cuda.ExternalStream`), so it is ordered with the torch ops around it and torch's caching
  allocator's stream semantics keep the tensors' memory valid.

The launcher is a "backend" object (`CupyBackend` here); the tests swap in one that runs the
same kernels, compiled for the host against `kernels/emulate/`, on CPU tensors (see
tests/kernels/), so that this module's table building and argument passing are exercised
without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import warnings
from collections import OrderedDict
from typing import Any, Iterator, Optional, Sequence

import torch

from .. import kernels as _kernels

__all__ = [
    "BLOCK_SIZE",
    "CHUNK_SIZE",
    "FINAL_BLOCK_SIZE",
    "KernelsUnavailableError",
    "compile_options",
    "cuda_include_dirs",
]

Tensors = Sequence[torch.Tensor]

# Element-type codes written into the table (kernels/amp_types.cuh) and the per-tensor flag.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
META_ACCUMULATE = 0x100

# Launch configuration. The norm's summation order depends on CHUNK_SIZE, BLOCK_SIZE and
# FINAL_BLOCK_SIZE (kernels/norm.cu), so they are constants, not tuned per call.
CHUNK_SIZE = 65536  # elements per chunk, as Apex's multi_tensor_apply (2048 * 32)
BLOCK_SIZE = 512
FINAL_BLOCK_SIZE = 512
MAX_GRID = 65535  # more chunks than this are covered grid-stride
MAX_BLOCK = 1024

# NVRTC options: C++17, no fused multiply-add (the kernels also use __fmul_rn/__fadd_rn), and no
# fast math (no -use_fast_math / -ftz=true / -prec-div=false: IEEE division, square root and
# subnormals, which the bit-exact comparisons depend on).
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")

_TABLE_CACHE_SIZE = 64


class KernelsUnavailableError(RuntimeError):
    """`AMP_SHIM_KERNELS=cupy` asked for the CUDA kernels where they cannot run."""


def cuda_include_dirs() -> list[str]:
    """Where `<cuda_fp16.h>` and `<cuda_bf16.h>` are: the `nvidia-cuda-runtime-cu12` wheel's
    include folder when it is installed (found without importing anything), else nothing (CuPy
    then adds its CUDA toolkit's include folder itself)."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for location in spec.submodule_search_locations:
        include = os.path.join(location, "include")
        if os.path.isfile(os.path.join(include, "cuda_fp16.h")):
            dirs.append(include)
    return dirs[:1]


def compile_options() -> tuple[str, ...]:
    """The NVRTC options every kernel source is compiled with (here and in the tests)."""
    return NVRTC_OPTIONS + tuple("-I" + path for path in cuda_include_dirs())


# -- backends --------------------------------------------------------------------------------


class CupyBackend:
    """Launches the kernels on a GPU through CuPy."""

    chunk_size = CHUNK_SIZE
    block_size = BLOCK_SIZE
    final_block_size = FINAL_BLOCK_SIZE
    max_grid = MAX_GRID

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._functions: dict[tuple[int, str], Any] = {}
        self._compiled: dict[int, Optional[str]] = {}  # device index -> None, or why compiling failed
        self._available: Optional[bool] = None
        self._why: Optional[str] = None

    # availability ------------------------------------------------------------------------
    def _probe(self) -> None:
        if self._available is not None:
            return
        try:
            import cupy
        except Exception as exc:  # ImportError, or a broken CUDA install raising at import
            self._available, self._why = (
                False,
                (
                    "CuPy is not importable (%s: %s); install it with `pip install 'amp-migrate[cuda]'`"
                    % (type(exc).__name__, exc)
                ),
            )
            return
        try:
            available = bool(cupy.is_available())
        except Exception as exc:
            available = False
            self._why = "cupy.is_available() raised %s: %s" % (type(exc).__name__, exc)
        else:
            if not available:
                self._why = "CuPy is installed but finds no usable CUDA device (cupy.is_available() is False)"
        self._available = available

    def unavailable_reason(self, device: torch.device) -> Optional[str]:
        """None if kernels can run on `device`, else why not (in words). The first call for a
        device compiles every kernel for it, so a compile failure (e.g. no cuda_fp16.h) shows
        here, before anything is launched, and `auto` falls back to torch ops with a warning."""
        self._probe()
        if not self._available:
            return self._why
        if device.type != "cuda":
            return "the tensors are on %s, and the CUDA kernels need CUDA tensors" % device
        return self._compile(_device_index(device))

    def accepts(self, device: torch.device) -> bool:
        return device.type == "cuda" and self.unavailable_reason(device) is None

    # compiling ---------------------------------------------------------------------------
    def _compile(self, index: int) -> Optional[str]:
        """Build one RawModule per source for device `index`, once; None, or why it failed."""
        if index in self._compiled:
            return self._compiled[index]
        import cupy

        with self._lock:
            if index in self._compiled:
                return self._compiled[index]
            reason = None
            try:
                with cupy.cuda.Device(index):
                    for source, names in _kernels.KERNEL_SOURCES.items():
                        module = cupy.RawModule(
                            code=_kernels.assemble_source(source), options=compile_options(), backend="nvrtc"
                        )
                        for name in names:  # the first get_function compiles (for this device's arch)
                            self._functions[(index, name)] = module.get_function(name)
            except Exception as exc:
                reason = "compiling amp_shim's CUDA kernels for cuda:%d failed (%s: %s)" % (
                    index,
                    type(exc).__name__,
                    exc,
                )
                warnings.warn(
                    "amp_shim: %s; the engine uses torch ops instead" % reason, RuntimeWarning, stacklevel=2
                )
            self._compiled[index] = reason
            return reason

    def _function(self, device: torch.device, name: str) -> Any:
        index = _device_index(device)
        function = self._functions.get((index, name))
        if function is None:
            reason = self._compile(index) or "no kernel %r" % name
            if (index, name) not in self._functions:
                raise KernelsUnavailableError(reason)
            function = self._functions[(index, name)]
        return function

    # launching ---------------------------------------------------------------------------
    def launch(self, device: torch.device, name: str, grid: int, block: int, args: Sequence[Any]) -> None:
        import cupy

        function = self._function(device, name)
        index = _device_index(device)
        stream_ptr = torch.cuda.current_stream(device).cuda_stream
        with cupy.cuda.Device(index), _external_stream(cupy, stream_ptr, index):
            function((grid,), (block,), tuple(args))

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A host int64 table on the device, without waiting for the device (pinned memory)."""
        return host.pin_memory().to(device, non_blocking=True)


def _external_stream(cupy: Any, ptr: int, index: int) -> Any:
    """torch's stream `ptr` as a CuPy stream (a context manager that makes it current)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in CuPy 14 (for Stream.from_external), still there
        return cupy.cuda.ExternalStream(ptr, index)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_backend: Any = CupyBackend()
_tables: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
_tables_lock = threading.Lock()


def backend() -> Any:
    return _backend


@contextlib.contextmanager
def use_backend(new: Any) -> Iterator[Any]:
    """Launch through `new` inside the block (the tests' host emulation); the table cache is
    cleared on the way in and out, as tables belong to one backend's memory."""
    global _backend
    old = _backend
    _backend = new
    _clear_tables()
    try:
        yield new
    finally:
        _backend = old
        _clear_tables()


def _clear_tables() -> None:
    with _tables_lock:
        _tables.clear()


def accepts(device: torch.device) -> bool:
    """Whether the current backend runs kernels for tensors on `device`."""
    return _backend.accepts(device)


def require(device: torch.device) -> None:
    """Raise KernelsUnavailableError, saying why, unless kernels can run on `device`."""
    reason = _backend.unavailable_reason(device)
    if reason is not None:
        raise KernelsUnavailableError("AMP_SHIM_KERNELS=cupy, but the CUDA kernels cannot run: " + reason)


# -- eligibility -----------------------------------------------------------------------------


def why_ineligible(
    device: torch.device, lists: Sequence[Tensors], scalars: Sequence[Optional[torch.Tensor]] = ()
) -> Optional[str]:
    """None if the kernels handle these tensors, else why not. `lists` are the per-tensor
    operands (same lengths, same sizes pairwise), `scalars` the one-element float32 device
    tensors (inv_scale, found_inf, a norm; None entries are skipped)."""
    length = len(lists[0]) if lists else 0
    for operands in lists:
        if len(operands) != length:
            return "operand lists of different lengths"
    for i in range(length):
        numel = lists[0][i].numel()
        for operands in lists:
            t = operands[i]
            if t.device != device:
                return "tensors on more than one device (%s and %s)" % (device, t.device)
            if t.dtype not in DTYPE_CODES:
                return "a %s tensor (the kernels take float32, float16 and bfloat16)" % t.dtype
            if not t.is_contiguous():
                return "a non-contiguous tensor"
            if t.numel() != numel:
                return "operands of different sizes"
    for s in scalars:
        if s is None:
            continue
        if s.device != device or s.dtype != torch.float32 or s.numel() < 1 or not s.is_contiguous():
            return "a scalar that is not a float32 tensor on %s (%s on %s)" % (device, s.dtype, s.device)
    return None


# -- the table -------------------------------------------------------------------------------


def _table(
    device: torch.device, lists: Sequence[Tensors], metas: Sequence[int]
) -> tuple[torch.Tensor, int, int]:
    """The launch's tensor table on `device`: (table, n, nchunks). Layout: multi_tensor.cuh."""
    chunk = _backend.chunk_size
    n = len(lists[0])
    ptrs = [t.data_ptr() for operands in lists for t in operands]
    numels = [t.numel() for t in lists[0]]
    offsets = [0]
    for numel in numels:
        offsets.append(offsets[-1] + (numel + chunk - 1) // chunk)
    key = (device, chunk, len(lists), tuple(ptrs), tuple(numels), tuple(metas))
    with _tables_lock:
        table = _tables.get(key)
        if table is not None:
            _tables.move_to_end(key)
            return table, n, offsets[-1]
    host = torch.tensor(ptrs + numels + offsets + list(metas), dtype=torch.int64)
    table = _backend.to_device(host, device)
    with _tables_lock:
        _tables[key] = table
        while len(_tables) > _TABLE_CACHE_SIZE:
            _tables.popitem(last=False)
    return table, n, offsets[-1]


def _meta(*tensors: torch.Tensor, flag: int = 0) -> int:
    meta = flag
    for k, t in enumerate(tensors):
        meta |= DTYPE_CODES[t.dtype] << (4 * k)
    return meta


def _ptr(t: Optional[torch.Tensor]) -> Any:
    import numpy

    return numpy.uint64(0 if t is None else t.data_ptr())


def _i32(v: int) -> Any:
    import numpy

    return numpy.int32(v)


def _i64(v: int) -> Any:
    import numpy

    return numpy.int64(v)


def _f32(v: float) -> Any:
    import numpy

    return numpy.float32(v)


def _f64(v: float) -> Any:
    import numpy

    return numpy.float64(v)


def _launch_mt(
    name: str, device: torch.device, lists: Sequence[Tensors], metas: Sequence[int], *extra: Any
) -> int:
    """Launch a multi-tensor kernel `name(table, n, nchunks, chunk_size, *extra)`; returns
    nchunks (0: nothing launched)."""
    table, n, nchunks = _table(device, lists, metas)
    if nchunks == 0:
        return 0
    grid = min(nchunks, _backend.max_grid)
    args = [_ptr(table), _i32(n), _i64(nchunks), _i64(_backend.chunk_size)] + list(extra)
    _backend.launch(device, name, grid, _backend.block_size, args)
    return nchunks


# -- the ops (ops.py calls these after checking eligibility) ---------------------------------


def unscale_(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    device = grads[0].device
    _launch_mt("amp_mt_unscale", device, [grads], [_meta(g) for g in grads], _ptr(inv_scale), _ptr(found_inf))


def unscale_add_(
    grads: Tensors, stashed: Tensors, found_inf: Optional[torch.Tensor], inv_scale: Optional[torch.Tensor]
) -> None:
    device = grads[0].device
    metas = [_meta(g, s) for g, s in zip(grads, stashed)]
    _launch_mt("amp_mt_unscale_add", device, [grads, stashed], metas, _ptr(inv_scale), _ptr(found_inf))


def unscale_to_fp32_(
    model_grads: Tensors,
    master_grads: Sequence[Optional[torch.Tensor]],
    found_inf: torch.Tensor,
    inv_scale: torch.Tensor,
) -> list[torch.Tensor]:
    device = model_grads[0].device
    out = [
        old if old is not None else torch.empty(g.shape, dtype=torch.float32, device=device)
        for g, old in zip(model_grads, master_grads)
    ]
    metas = [
        _meta(g, m, flag=META_ACCUMULATE if old is not None else 0)
        for g, m, old in zip(model_grads, out, master_grads)
    ]
    _launch_mt("amp_mt_unscale_to_fp32", device, [model_grads, out], metas, _ptr(inv_scale), _ptr(found_inf))
    return out


def copy_(dst: Tensors, src: Tensors) -> None:
    device = dst[0].device
    _launch_mt("amp_mt_copy", device, [dst, src], [_meta(d, s) for d, s in zip(dst, src)])


def _finalize_norm(device: torch.device, partial: torch.Tensor, nchunks: int) -> torch.Tensor:
    norm = torch.empty((), dtype=torch.float32, device=device)
    _backend.launch(
        device, "amp_norm_finalize", 1, _backend.final_block_size, [_ptr(partial), _i64(nchunks), _ptr(norm)]
    )
    return norm


def _norm(name: str, grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    device = grads[0].device if grads else found_inf.device
    chunk = _backend.chunk_size
    nchunks = sum((g.numel() + chunk - 1) // chunk for g in grads)
    partial = torch.empty(max(nchunks, 1), dtype=torch.float32, device=device)
    if grads:
        _launch_mt(
            name, device, [grads], [_meta(g) for g in grads], _ptr(inv_scale), _ptr(found_inf), _ptr(partial)
        )
    return _finalize_norm(device, partial, nchunks)


def unscale_and_norm_(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    return _norm("amp_mt_unscale_norm", grads, found_inf, inv_scale)


def scaled_norm(grads: Tensors, found_inf: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    return _norm("amp_mt_scaled_norm", grads, found_inf, inv_scale)


def clip_scale_(
    grads: Tensors, norm: torch.Tensor, max_norm: float, eps: float, inv_scale: Optional[torch.Tensor]
) -> None:
    device = grads[0].device
    _launch_mt(
        "amp_mt_clip_scale",
        device,
        [grads],
        [_meta(g) for g in grads],
        _ptr(norm),
        _f32(max_norm),
        _f32(eps),
        _ptr(inv_scale),
    )


def update_scale_(
    scale: torch.Tensor,
    unskipped: torch.Tensor,
    found_inf: torch.Tensor,
    *,
    dynamic: bool,
    min_loss_scale: float,
    max_loss_scale: float,
    scale_window: int,
) -> torch.Tensor:
    device = scale.device
    skip = torch.empty((), dtype=torch.bool, device=device)
    _backend.launch(
        device,
        "amp_update_scale",
        1,
        1,
        [
            _ptr(scale),
            _ptr(unskipped),
            _ptr(found_inf),
            _ptr(skip),
            _i32(1 if dynamic else 0),
            _f64(min_loss_scale),
            _f64(max_loss_scale),
            _i64(scale_window),
        ],
    )
    return skip
