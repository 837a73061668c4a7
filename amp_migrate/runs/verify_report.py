"""What `amp-migrate verify` prints: the two runs side by side and the verdict, or one JSON
document for CI (docs/cli.md, "verify")."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import coverage
from .compare import Record, Run, stderr_tail
from .locate import Location, describe
from .verify_run import Outcome


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.8g}"


def _cell(values: Sequence[Any]) -> str:
    return ", ".join(_number(v) for v in values)


def _both(shim: Any, native: Any) -> str:
    """One value where the runs agree, both (exactly, as recorded) where they do not."""
    if shim == native:
        return _number(shim)
    if isinstance(shim, str) and isinstance(native, str):
        return f"{shim} | {native}"
    return f"{shim!r} | {native!r}"


def _yes_no(flag: Any) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def _row(step: int, shim: Optional[Record], native: Optional[Record]) -> list[str]:
    a, b = shim or {}, native or {}
    skipped = _both(_yes_no(a.get("skipped")), _yes_no(b.get("skipped")))
    return [
        str(step),
        _both(a.get("optimizer"), b.get("optimizer")),
        _cell(a.get("losses", ())),
        _cell(b.get("losses", ())),
        _cell(a.get("scales", ())),
        _cell(b.get("scales", ())),
        skipped,
        _both(a.get("grad_norm"), b.get("grad_norm")),
        _both(a.get("param_sum"), b.get("param_sum")),
    ]


def table(outcome: Outcome) -> Table:
    """Every step either run recorded; the step where they diverged is marked."""
    columns = ["step", "optimizer", "loss shim", "loss native", "scale shim", "scale native"]
    columns += ["skipped", "grad norm", "param sum"]
    grid = Table(*columns)
    shim, native = outcome.shim.records, outcome.native.records
    diverged = outcome.verdict.divergence.step if outcome.verdict.divergence else None
    for index in range(max(len(shim), len(native))):
        row = _row(
            index + 1,
            shim[index] if index < len(shim) else None,
            native[index] if index < len(native) else None,
        )
        grid.add_row(*row, style="bold red" if index + 1 == diverged else None)
    return grid


def _runs(outcome: Outcome) -> list[tuple[str, Run]]:
    """Every run, with the rank it ran as under torchrun ("rank 1 ")."""
    if not outcome.ranks:
        return [("", outcome.shim), ("", outcome.native)]
    return [(f"rank {r.rank} ", run) for r in outcome.ranks for run in (r.shim, r.native)]


def print_text(console: Console, outcome: Outcome) -> None:
    migration = outcome.migration
    console.print(
        f"migrated {len(migration.changed)} file(s) in the copy: {', '.join(migration.changed) or '-'}"
    )
    if migration.shim_files:
        console.print(f"kept on the shim (the copy runs with amp_shim): {', '.join(migration.shim_files)}")
    for rank in outcome.ranks:
        console.print(f"rank {rank.rank}: {rank.verdict.message}")
    if outcome.ranks and (outcome.shim.records or outcome.native.records):
        console.print(f"rank {outcome.rank}, step by step:")
    if outcome.shim.records or outcome.native.records:
        console.print(table(outcome))
    for where, run in _runs(outcome):
        if run.exit_code != 0 and run.stderr.strip():
            console.print(Text(f"{where}{run.mode} run, end of stderr:", style="bold"))
            console.print(Text(stderr_tail(run.stderr)))
    for note in outcome.verdict.notes:
        console.print(Text(f"note: {note}"))
    style = "bold green" if outcome.verdict.passed else "bold red"
    console.print(Text(outcome.verdict.message, style=style))
    for line in describe(outcome.location):
        console.print(Text(line), soft_wrap=True)  # long source lines stay whole, for grep and copy
    for line in coverage.describe(outcome.coverage):
        console.print(Text(line), soft_wrap=True)


def _plain(value: Any) -> Any:
    """JSON has no inf or NaN: non-finite numbers are written as the recorder writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def json_document(outcome: Outcome, exit_code: int) -> dict:
    verdict = outcome.verdict
    divergence = verdict.divergence
    document = {
        "verdict": verdict.kind,
        "passed": verdict.passed,
        "message": verdict.message,
        "first_divergence": None
        if divergence is None
        else {
            "step": divergence.step,
            "quantity": divergence.quantity,
            "shim": divergence.shim,
            "native": divergence.native,
        },
        "max_relative_difference": verdict.max_relative,
        "notes": list(verdict.notes),
        "exit_codes": {"shim": outcome.shim.exit_code, "native": _exit_code(outcome.native)},
        "started": {"shim": outcome.shim.started, "native": outcome.native.started},
        "amp_calls": outcome.shim.amp_calls,
        "stderr_tail": {run.mode: stderr_tail(run.stderr) for run in (outcome.shim, outcome.native)},
        "migrated": list(outcome.migration.changed),
        "kept_shim": list(outcome.migration.shim_files),
        "records": {"shim": list(outcome.shim.records), "native": list(outcome.native.records)},
        "location": _location(outcome.location),
        "coverage": coverage.as_json(outcome.coverage),
        "exit_code": exit_code,
        "rank": outcome.rank,
        "ranks": [
            {
                "rank": rank.rank,
                "verdict": rank.verdict.kind,
                "passed": rank.verdict.passed,
                "message": rank.verdict.message,
                "exit_codes": {"shim": rank.shim.exit_code, "native": _exit_code(rank.native)},
                "amp_calls": rank.shim.amp_calls,
                "stderr_tail": {run.mode: stderr_tail(run.stderr) for run in (rank.shim, rank.native)},
            }
            for rank in outcome.ranks
        ],
    }
    return _plain(document)


def _exit_code(run: Run) -> Optional[int]:
    """None for a run verify never started."""
    return run.exit_code if run.started else None


def _location(location: Optional[Location]) -> Optional[dict]:
    if location is None:
        return None
    return {
        "step": location.step,
        "ran": [
            {
                "call": site.call,
                "file": site.file,
                "line": site.line,
                "text": site.text,
                "changed": site.changed,
                "note": site.note or None,
                "times": site.times,
            }
            for site in location.ran
        ],
        "missing": [
            {
                "call": missing.call,
                "expected": list(missing.expected),
                "file": missing.file,
                "original_line": missing.original_line,
                "original_text": missing.original_text,
                "migrated_lines": list(missing.migrated_lines),
                "migrated_text": list(missing.migrated_text),
            }
            for missing in location.missing
        ],
    }
