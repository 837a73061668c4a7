"""What one file's job hands back to the command line: plain data, so that it crosses process
boundaries and so that reporting and writing never need to look at the file again."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from ..diagnostics import Diagnostic, Severity
from ..io.source_file import Stamp


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
    #: Where the lines went: for the file (cell None) or each changed cell, every original
    #: line's line in the new text (None: no counterpart); see output_lines.py.
    line_maps: tuple[tuple[Optional[int], tuple[Optional[int], ...]], ...] = ()

    @property
    def failed(self) -> bool:
        return self.error is not None or any(f.severity == Severity.ERROR for f in self.findings)

    @property
    def fallback_codes(self) -> list[str]:
        codes = [f.diagnostic.code for f in self.findings if f.diagnostic.falls_back]
        return sorted(set(codes))

    @property
    def unsafe_codes(self) -> list[str]:
        """The unsafe fixes applied to the file (`--unsafe-fixes`), by code."""
        return sorted({f.diagnostic.code for f in self.findings if f.diagnostic.unsafe})

    @property
    def reason(self) -> Optional[str]:
        """Why a failed file was left untouched: its error, or else its first error diagnostic
        (code, position, message), so that every file counted as an error says why in one field."""
        if self.error is not None:
            return self.error
        for finding in self.findings:
            if finding.severity == Severity.ERROR:
                d = finding.diagnostic
                where = f"cell {finding.cell} line {d.line}" if finding.cell is not None else f"line {d.line}"
                return f"{d.code} at {where}: {d.message}"
        return None

    def output_line(self, finding: Finding) -> Optional[int]:
        """`finding`'s line in the file as this run leaves it (written, or as `--check` and
        `--diff` would write it); None where the migration removed or rewrote that line."""
        line = finding.diagnostic.line
        if not self.changed or self.new_bytes is None or self.error is not None or line < 1:
            return line
        for cell, lines in self.line_maps:
            if cell == finding.cell:
                return lines[line - 1] if line <= len(lines) else None
        return line  # a notebook cell the migration left as it was

    def with_error(self, error: str) -> "FileResult":
        return replace(self, error=error, new_bytes=None, written=False)
