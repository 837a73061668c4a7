"""amp-migrate: move PyTorch code off NVIDIA Apex's mixed-precision API.

The API's names are imported on first use: `amp-migrate --version`, and a run over files that
never spell Apex, must not pay for libcst and the rules (pre-commit and editors start the
command on every save).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["migrate_source", "MigrationResult", "MigrationError", "Diagnostic", "Severity"]

_HOMES = {
    "migrate_source": ".migrate",
    "MigrationResult": ".migration_result",
    "MigrationError": ".migrate",
    "Diagnostic": ".diagnostics",
    "Severity": ".diagnostics",
}

if TYPE_CHECKING:
    from .diagnostics import Diagnostic, Severity
    from .migrate import MigrationError, migrate_source
    from .migration_result import MigrationResult


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
