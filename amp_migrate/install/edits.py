"""What every dependency-file editor takes and gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

#: Given a requirement as written, the requirements that replace it ([] removes it), or None
#: to leave it exactly as it is.
Rewrite = Callable[[str], Optional[list[str]]]


@dataclass(frozen=True)
class Found:
    """A requirement the rewrite was asked about (`editable`), or an Apex requirement the
    editor cannot edit, with why (`why`)."""

    line: int
    col: int
    requirement: str
    editable: bool = True
    why: str = ""
    new: tuple[str, ...] = ()  # what the rewrite replaced it with


@dataclass(frozen=True)
class Edited:
    text: str
    found: tuple[Found, ...]
