"""What the user reads: diffs, diagnostics grouped per file, a summary table, or one JSON
document for tools.

Diagnostics are printed as `path:line:col: CODE message` so that editors and terminals make
them clickable; colour only where a terminal will show it.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import __version__
from ..diagnostics import CODES, Severity
from ..io.lines import split_lines
from ..options import Options
from .file_result import FileResult
from .quoting import printable, quote_path

JSON_SCHEMA_VERSION = 2
#: Apex reached where no rule can rewrite it (project/codes.py, rules/dynamic_apex.py): the
#: file keeps needing Apex.
KEPT_APEX_CODES = frozenset({"AMP031", "AMP032", "AMP035"})
_SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def unified_diff(old: str, new: str, name: str) -> str:
    """A patch of one file; its `---`/`+++` headers quote the name as git's do (quoting.py)."""
    lines = []
    name = quote_path(name)
    for line in difflib.unified_diff(
        split_lines(old, keepends=True), split_lines(new, keepends=True), fromfile=name, tofile=name
    ):
        lines.append(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


@dataclass(frozen=True)
class Summary:
    files: int
    mention_apex: int
    changed: int
    written: int
    native: int
    shim: int
    failed: int
    severities: dict[str, int]
    elapsed: float
    kept_apex: int = 0  # files whose Apex uses no rule rewrites (KEPT_APEX_CODES): --check counts them
    dependencies: int = 0  # changed install files (amp_migrate/install/), in `changed` too

    @classmethod
    def of(cls, results: Sequence[FileResult], elapsed: float) -> "Summary":
        changed = [r for r in results if r.changed and r.error is None]
        severities = Counter(str(f.severity) for r in results for f in r.findings)
        return cls(
            files=len(results),
            mention_apex=sum(r.scanned for r in results),
            changed=len(changed),
            written=sum(r.written for r in results),
            native=sum(r.target_used == "native" for r in changed),
            shim=sum(r.target_used == "shim" for r in changed),
            failed=sum(r.failed for r in results),
            severities={str(s): severities.get(str(s), 0) for s in Severity},
            elapsed=elapsed,
            kept_apex=sum(any(f.diagnostic.code in KEPT_APEX_CODES for f in r.findings) for r in results),
            dependencies=sum(r.kind not in ("python", "notebook") for r in changed),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "mention_apex": self.mention_apex,
            "changed": self.changed,
            "written": self.written,
            "native": self.native,
            "shim": self.shim,
            "errors": self.failed,
            "kept_apex": self.kept_apex,
            "dependency_files": self.dependencies,
            "diagnostics": dict(self.severities),
            "elapsed_s": round(self.elapsed, 3),
        }


def _status(result: FileResult, mode: str) -> Optional[Text]:
    if result.error is not None:
        return Text.assemble(
            (quote_path(result.path), "bold"),
            ": ",
            ("error", "bold red"),
            f": {printable(result.error)} (left untouched)",
        )
    if not result.changed:
        return None
    target = result.target_used or result.kind  # an install file: its kind
    if target == "shim" and result.fallback_codes:
        target += " fallback: " + ", ".join(result.fallback_codes)
    elif target == "native" and result.unsafe_codes:
        target += ", unsafe fixes: " + ", ".join(result.unsafe_codes)
    if result.written:
        verb = "Migrated"
    elif mode == "interactive":
        verb = "Skipped"
    else:
        verb = "Would migrate"
    return Text.assemble(
        (verb, "bold green" if result.written else "bold"),
        " ",
        (quote_path(result.path), "bold"),
        f" ({target})",
    )


def _hint(result: FileResult) -> Optional[str]:
    codes = sorted({f.diagnostic.code for f in result.findings})
    if not codes:
        return None
    first, rest = codes[0], codes[1:]
    also = f" (also {', '.join(rest)})" if rest else ""
    if result.failed:
        return f"hint: the file was left untouched; `amp-migrate explain {first}` says why{also}"
    if result.changed and result.target_used == "shim" and result.fallback_codes:
        why = result.fallback_codes[0]
        return f"hint: fell back to the shim because of {why}; `amp-migrate explain {why}` says why"
    return f"hint: `amp-migrate explain {first}` says why and shows an example{also}"


def print_diff(console: Console, diff: str) -> None:
    if not diff:
        return
    if console.is_terminal and not console.no_color:
        from rich.syntax import Syntax  # pygments: only for a diff shown in colour

        console.print(Syntax(diff, "diff", theme="ansi_dark", background_color="default", word_wrap=False))
    else:
        console.file.write(diff)
        console.file.flush()


def print_file(console: Console, result: FileResult, mode: str, show_diff: bool) -> None:
    """One file's group: status line, diff, diagnostics, notes and one hint."""
    status = _status(result, mode)
    if status is None and not result.findings and not result.notes:
        return
    if status is not None:
        console.print(status)
    if show_diff:
        print_diff(console, result.diff)
    for finding in result.findings:
        shown = quote_path(result.path)
        line = Text(printable(finding.format(shown)))
        code = finding.diagnostic.code
        start = line.plain.find(f": {code} ", len(shown)) + 2
        line.stylize(_SEVERITY_STYLE[finding.severity], start, start + len(code))
        console.print(line)
    for note in result.notes:
        console.print(Text(f"note: {quote_path(result.path)}: {printable(note)}", style="dim"))
    hint = _hint(result)
    if hint:
        console.print(Text(f"  {hint}", style="dim"))
    console.print()


def summary_table(summary: Summary, mode: str) -> Table:
    table = Table(
        title="Summary", title_justify="left", title_style="bold", box=None, show_header=False, pad_edge=False
    )
    table.add_column("what")
    table.add_column("count", justify="right")
    changed = "Changed" if mode in ("fix", "interactive") else "Would change"
    table.add_row("Files scanned", str(summary.files))
    table.add_row("Mention Apex", str(summary.mention_apex))
    table.add_row(changed, str(summary.written if mode in ("fix", "interactive") else summary.changed))
    table.add_row("  native torch.amp", str(summary.native))
    table.add_row("  shim fallback", str(summary.shim))
    if summary.dependencies:
        table.add_row("  dependency files", str(summary.dependencies))
    table.add_row("Errors (left untouched)", str(summary.failed))
    if summary.kept_apex:
        table.add_row("Apex left in place", str(summary.kept_apex))
    table.add_row("Diagnostics", ", ".join(f"{n} {s}" for s, n in summary.severities.items()))
    table.add_row("Time", f"{summary.elapsed:.2f} s")
    return table


def print_report(
    console: Console,
    results: Sequence[FileResult],
    summary: Summary,
    *,
    mode: str,
    show_diff: bool,
    quiet: bool,
    notes: Sequence[str] = (),
) -> None:
    from .run_notes import positions_note

    for result in results:
        print_file(console, result, mode, show_diff)
    positions = positions_note(results)
    run_notes = [*notes, *([positions] if positions else [])]
    for note in run_notes:
        console.print(Text(f"note: {printable(note)}", style="dim"))
    if run_notes:
        console.print()
    if not quiet:
        console.print(summary_table(summary, mode))


def json_document(
    results: Sequence[FileResult],
    summary: Summary,
    *,
    mode: str,
    options: Options,
    include_diff: bool,
    exit_code: int,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The `--format json` document; its schema is documented in docs/cli.md."""
    files = []
    for r in results:
        if not (r.scanned or r.error is not None or r.notes):
            continue
        entry: dict[str, Any] = {
            "path": r.path,
            "kind": r.kind,
            "changed": r.changed and r.error is None,
            "written": r.written,
            "target_used": r.target_used,
            "error": r.reason,
            "diagnostics": [{**f.to_dict(), "output_line": r.output_line(f)} for f in r.findings],
            "unsafe_fixes": r.unsafe_codes,
            "notes": list(r.notes),
        }
        if include_diff:
            entry["diff"] = r.diff
        files.append(entry)
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": f"amp-migrate {__version__}",
        "mode": mode,
        "options": {
            "target": options.target,
            "device": options.device,
            "dtype": options.dtype,
            "unsafe_fixes": options.unsafe_fixes,
        },
        "files": files,
        "notes": list(notes),
        "summary": summary.to_dict(),
        "exit_code": exit_code,
    }


def explain(console: Console, code: str) -> None:
    from ..docs import render_code

    entry = CODES[code]
    text = render_code(entry)
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(text, code_theme="ansi_dark"))
    else:
        console.file.write(text)


def code_table() -> Table:
    table = Table(box=box.SIMPLE, pad_edge=False)
    for column in ("code", "name", "severity", "falls back", "summary"):
        table.add_column(column)
    for code in sorted(CODES):
        entry = CODES[code]
        table.add_row(code, entry.name, str(entry.severity), "yes" if entry.falls_back else "", entry.summary)
    return table
