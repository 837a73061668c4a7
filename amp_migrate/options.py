"""What the user asked for: the target, the device and dtype native code runs with, and whether
native rewrites that differ from Apex as docs/differences.md documents are allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Target = Literal["auto", "native", "shim"]
TARGETS = ("auto", "native", "shim")
DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class Options:
    target: Target = "auto"
    device: str = "cuda"
    dtype: str = "float16"
    #: ruff's `--unsafe-fixes`: also apply the native rewrites whose behaviour differs from Apex's
    #: only as a docs/differences.md entry says (each one's diagnostic names its entry).
    unsafe_fixes: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {self.target!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if not self.device or not self.device.replace("_", "").isalnum():
            raise ValueError(f"device must be a device type such as 'cuda' or 'cpu', not {self.device!r}")

    @property
    def needs_loss_scaling(self) -> bool:
        """bfloat16 has float32's range: gradients do not underflow, so no scaler is needed."""
        return self.dtype == "float16"
