"""Process-wide Amp state, as Apex keeps it (one object per process).

Real code reaches into this object (`_amp_state.loss_scalers[0]._loss_scale = 2**20`,
`_amp_state.opt_properties.master_weights`), so it stays a plain attribute bag with Apex's
names rather than a typed config object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:
    from .frontend import Properties
    from .handle import AmpHandle
    from .scaler import LossScaler


class AmpState:
    # Set by amp.initialize / amp.init; declared here (not assigned) so that code probing them
    # with hasattr sees what it saw under Apex.
    opt_properties: Properties
    loss_scalers: list[LossScaler]
    min_loss_scale: float | None
    max_loss_scale: float
    handle: AmpHandle

    def __init__(self) -> None:
        self.hard_override = False
        self.allow_incoming_model_not_fp32 = False
        self.verbosity = 1


_amp_state = AmpState()


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def warn_or_err(msg: str) -> None:
    if _amp_state.hard_override:
        print("Warning:  " + msg)
    else:
        raise RuntimeError(msg)


def maybe_print(msg: str, rank0: bool = False) -> None:
    """Print unless verbosity is 0; with `rank0`, only rank 0 of a distributed job prints."""
    if _amp_state.verbosity <= 0:
        return
    if rank0 and _rank() != 0:
        return
    print(msg)


def master_params(optimizer: Any) -> Iterator[torch.Tensor]:
    """The params the optimizer steps: fp32 masters under O2 (once lazily created)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield p
