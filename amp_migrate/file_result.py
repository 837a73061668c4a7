"""What one file's job hands back to the command line: plain data, so that it crosses process
boundaries and so that reporting and writing never need to look at the file again."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from .diagnostics import Diagnostic, Severity
from .source_file import Stamp


@dataclass(frozen=True)
class Finding:
    """A diagnostic where the user will look for it: a notebook's cell (1-based, counting every
    cell) and the line within that cell, or a line of a Python file (`cell` is None)."""

    diagnostic: Diagnostic
    cell: Optional[int] = None

    @property
    def severity(self) -> Severity:
        return self.diagnostic.severity

    def format(self, path: str) -> str:
        d = self.diagnostic
        where = f"{path}:cell {self.cell}" if self.cell is not None else path
        return f"{where}:{d.line}:{d.col}: {d.code} {d.message}"

    def to_dict(self) -> dict[str, Any]:
        data = self.diagnostic.to_dict()
        data["cell"] = self.cell
        return data


@dataclass(frozen=True)
class FileResult:
    path: str
    kind: str  # "python" or "notebook"
    scanned: bool = False  # passed the text prefilter and was parsed
    changed: bool = False
    target_used: Optional[str] = None
    findings: tuple[Finding, ...] = ()
    error: Optional[str] = None  # the file could not be handled; it was left untouched
    notes: tuple[str, ...] = ()
    diff: str = ""
    new_bytes: Optional[bytes] = None
    written: bool = False
    stamp: Optional[Stamp] = None  # what was read: the write checks the file is still that

    @property
    def failed(self) -> bool:
        return self.error is not None or any(f.severity == Severity.ERROR for f in self.findings)

    @property
    def fallback_codes(self) -> list[str]:
        codes = [f.diagnostic.code for f in self.findings if f.diagnostic.falls_back]
        return sorted(set(codes))

    def with_error(self, error: str) -> "FileResult":
        return replace(self, error=error, new_bytes=None, written=False)
