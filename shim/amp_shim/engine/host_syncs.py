"""Count host syncs: the calls that make the host wait for a device value.

The engine promises at most one per iteration (the skip decision), and none when the optimizer's
step supports amp scaling and skips on the device (docs/differences.md row 42; the host copy
of the decision read there has landed without blocking, so it is no sync). `CountHostSyncs` observes
every such call made through torch's Python API (`.item()`, `bool(t)`, `.tolist()`, `float(t)`,
`int(t)`, indexing with a tensor), for tests and benchmarks of that promise, and for users who
want to check their own loop.

    with CountHostSyncs() as syncs:
        train_one_iteration()
    print(len(syncs.calls), syncs.calls)
"""

from __future__ import annotations

from torch.overrides import TorchFunctionMode

SYNC_METHODS = frozenset({"item", "__bool__", "tolist", "__float__", "__int__", "__index__"})


class CountHostSyncs(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in SYNC_METHODS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))
