"""O1's casts: `torch.autocast` switched on from `initialize` onward, as Apex's patches were.

Apex patched torch functions process-wide, so casts applied in every thread from the moment
`initialize` returned. Autocast state is thread-local, so the shim turns it on in the thread
that called `initialize` and, through forward hooks on the models, in any other thread that
runs a model's forward (DataParallel replicas, worker threads). Casts are off inside
`disable_casts()`, inside a `scale_loss` body (it runs backward, which Apex never cast) and
inside `optimizer.step`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

import torch

_tls = threading.local()


def shim_dtype(device_type: str) -> torch.dtype:
    """float16 unless `AMP_SHIM_DTYPE=bfloat16` asks for bfloat16 (CPU float16 is slow)."""
    name = os.environ.get("AMP_SHIM_DTYPE", "float16").strip().lower()
    dtypes = {
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if name not in dtypes:
        raise ValueError(f"AMP_SHIM_DTYPE must be float16 or bfloat16, not {name!r}")
    return dtypes[name]


def _disabled_depth() -> int:
    return getattr(_tls, "disabled", 0)


class AutocastCasts:
    """The autocast state of one O1 activation (Apex's AmpHandle keeps one of these)."""

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type = device_type
        self.dtype = dtype
        self.active = False
        self._owner_thread: int | None = None
        self._previous: tuple[bool, torch.dtype] | None = None
        self._hooks: list = []

    def activate(self) -> None:
        if self.active:
            return
        self._previous = (
            torch.is_autocast_enabled(self.device_type),
            torch.get_autocast_dtype(self.device_type),
        )
        torch.set_autocast_enabled(self.device_type, True)
        torch.set_autocast_dtype(self.device_type, self.dtype)
        torch.autocast_increment_nesting()
        self._owner_thread = threading.get_ident()
        self.active = True

    def deactivate(self) -> None:
        if not self.active:
            return
        self.active = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if threading.get_ident() == self._owner_thread and self._previous is not None:
            enabled, dtype = self._previous
            torch.set_autocast_enabled(self.device_type, enabled)
            torch.set_autocast_dtype(self.device_type, dtype)
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()

    def clear_cache(self) -> None:
        torch.clear_autocast_cache()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Casts off in this thread for the duration; exception-safe (Apex's was not)."""
        previous = torch.is_autocast_enabled(self.device_type)
        torch.set_autocast_enabled(self.device_type, False)
        _tls.disabled = _disabled_depth() + 1
        try:
            yield
        finally:
            _tls.disabled = _disabled_depth() - 1
            torch.set_autocast_enabled(self.device_type, previous)

    def cover_forward(self, model: torch.nn.Module) -> None:
        """Make `model`'s forward autocast in threads where O1 is not already on."""
        self._hooks.append(model.register_forward_pre_hook(EnterForwardAutocast(self, self.device_type)))
        self._hooks.append(model.register_forward_hook(exit_forward_autocast, always_call=True))


def _live_casts(device_type: str) -> AutocastCasts | None:
    """The casts of the process's current O1 activation for `device_type`, if any."""
    from ._amp_state import _amp_state

    casts = getattr(getattr(_amp_state, "handle", None), "_casts", None)
    if isinstance(casts, AutocastCasts) and casts.device_type == device_type:
        return casts
    return None


class EnterForwardAutocast:
    """Forward pre-hook: enter autocast for this forward if O1 is on but not in this thread.

    A class rather than a closure so that a covered model can be pickled, saved whole and
    deep-copied. A copy does not carry the activation it was made under (that is per process
    and per thread); it follows the process's current O1 activation for the device, as Apex's
    process-wide patches did for any model, and is inert when O1 is off.
    """

    def __init__(self, casts: AutocastCasts | None, device_type: str) -> None:
        self.casts = casts
        self.device_type = device_type

    def __reduce__(self) -> tuple[type, tuple[None, str]]:
        return (type(self), (None, self.device_type))

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        stack = getattr(_tls, "entered", None)
        if stack is None:
            stack = _tls.entered = []
        casts = self.casts if self.casts is not None else _live_casts(self.device_type)
        ctx = None
        if (
            casts is not None
            and casts.active
            and _disabled_depth() == 0
            and not torch.is_autocast_enabled(casts.device_type)
        ):
            ctx = torch.autocast(casts.device_type, dtype=casts.dtype)
            ctx.__enter__()
        stack.append(ctx)


def exit_forward_autocast(module: torch.nn.Module, args: Any, output: Any) -> None:
    """Forward hook: leave what `EnterForwardAutocast` entered for this forward, if anything."""
    stack = getattr(_tls, "entered", None)
    ctx = stack.pop() if stack else None
    if ctx is not None:
        ctx.__exit__(None, None, None)
