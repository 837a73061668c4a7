"""What migrating one source text gives: the new text, its diagnostics and the target used.

A module of its own so that the passes `migrate_source` calls (provider parts) can build one
without importing the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .diagnostics import Diagnostic


@dataclass(frozen=True)
class MigrationResult:
    code: str
    diagnostics: tuple[Diagnostic, ...]
    target_used: Optional[str]  # "native" or "shim" when the code changed, else None
    changed: bool = False
