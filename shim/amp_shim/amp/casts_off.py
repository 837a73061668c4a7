"""`disable_casts`: O1's casts off for a block, shared by `scale_loss`'s handle and the
patched optimizer step (amp/_process_optimizer.py), which runs with casts off under O1."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

from ._amp_state import _amp_state

if TYPE_CHECKING:
    from .handle import AmpHandle


def active_handle() -> AmpHandle | None:
    """The O1 handle while its casts are on, else None."""
    handle = getattr(_amp_state, "handle", None)
    return handle if handle is not None and handle.is_active() else None


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """Run the block in fp32 under O1; a no-op context when O1 is not active."""
    if not hasattr(_amp_state, "handle"):
        raise AttributeError("'AmpState' object has no attribute 'handle'")
    handle = active_handle()
    if handle is None:
        yield
        return
    handle._is_active = False
    try:
        with handle._disable_casts():
            yield
    finally:
        handle._is_active = True
