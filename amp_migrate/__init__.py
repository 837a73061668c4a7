"""amp-migrate: move PyTorch code off NVIDIA Apex's mixed-precision API."""

from .diagnostics import Diagnostic, Severity
from .migrate import MigrationError, MigrationResult, migrate_source

__version__ = "0.1.0"

__all__ = ["migrate_source", "MigrationResult", "MigrationError", "Diagnostic", "Severity"]
