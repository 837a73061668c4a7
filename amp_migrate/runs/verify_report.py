"""What `amp-migrate verify` prints: the two runs side by side and the verdict, or one JSON
document for CI (docs/cli.md, "verify").

The runs are named for what ran: "legacy" (the original program, through the shim's `apex`
alias) and "migrated (native)" or, where the migration kept a file on the shim, "migrated
(shim)". The step table has one column per quantity where the console is wide enough for every
value in full, else one row per quantity, the two runs side by side, so that no value is cut.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..cli.quoting import printable, quote_path
from . import coverage, tree_migration
from .compare import Record, Run, stderr_tail
from .locate import Location, describe
from .run_logs import LEGACY
from .tree_migration import Choice
from .verify_run import Outcome

#: Wider than any console: the width a table would take with nothing wrapped.
_UNBOUNDED = 10_000


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


def labels(outcome: Outcome) -> tuple[str, str]:
    """What each run is: the original through the shim, and the copy as migrated."""
    return LEGACY, "migrated (shim)" if outcome.migration.shim_files else "migrated (native)"


def _steps(outcome: Outcome) -> list[tuple[int, Optional[Record], Optional[Record]]]:
    shim, native = outcome.shim.records, outcome.native.records
    return [
        (
            index + 1,
            shim[index] if index < len(shim) else None,
            native[index] if index < len(native) else None,
        )
        for index in range(max(len(shim), len(native)))
    ]


def _diverged(outcome: Outcome) -> Optional[int]:
    return outcome.verdict.divergence.step if outcome.verdict.divergence else None


def table(outcome: Outcome) -> Table:
    """Every step either run recorded, one row each; the step where they diverged is marked."""
    legacy, migrated = labels(outcome)
    columns = ["step", "optimizer", f"loss {legacy}", f"loss {migrated}", f"scale {legacy}"]
    columns += [f"scale {migrated}", "skipped", "grad norm", "param sum"]
    grid = Table(*columns)
    diverged = _diverged(outcome)
    for step, shim, native in _steps(outcome):
        grid.add_row(*_row(step, shim, native), style="bold red" if step == diverged else None)
    return grid


def _pair(shim: Any, native: Any) -> tuple[str, str]:
    """Each run's value, rounded where they agree and exactly, as recorded, where they do not."""
    if shim == native or isinstance(shim, str) or isinstance(native, str) or None in (shim, native):
        return _number(shim), _number(native)
    return repr(shim), repr(native)


def narrow_table(outcome: Outcome) -> Table:
    """Every step either run recorded, one row per quantity with the runs side by side: narrow
    enough for an 80-column terminal with every value whole."""
    legacy, migrated = labels(outcome)
    grid = Table("step", "", legacy, migrated)
    diverged = _diverged(outcome)
    steps = _steps(outcome)
    several = any((r or {}).get("optimizer") not in (None, 0) for _, *both in steps for r in both)
    for step, shim, native in steps:
        a, b = shim or {}, native or {}
        rows = [("loss", _cell(a.get("losses", ())), _cell(b.get("losses", ())))]
        rows.append(("scale", _cell(a.get("scales", ())), _cell(b.get("scales", ()))))
        if several or a.get("optimizer") != b.get("optimizer"):
            rows.insert(0, ("optimizer", *_pair(a.get("optimizer"), b.get("optimizer"))))
        rows.append(("skipped", _yes_no(a.get("skipped")), _yes_no(b.get("skipped"))))
        rows.append(("grad norm", *_pair(a.get("grad_norm"), b.get("grad_norm"))))
        rows.append(("param sum", *_pair(a.get("param_sum"), b.get("param_sum"))))
        style = "bold red" if step == diverged else None
        for index, (what, first, second) in enumerate(rows):
            last = index == len(rows) - 1
            grid.add_row(str(step) if index == 0 else "", what, first, second, style=style, end_section=last)
    return grid


def fitting_table(console: Console, outcome: Outcome) -> Table:
    """The one-row-per-step table where it fits the console unwrapped, else the narrow one."""
    wide = table(outcome)
    natural = Measurement.get(console, console.options.update_width(_UNBOUNDED), wide).maximum
    return wide if natural <= console.width else narrow_table(outcome)


def _runs(outcome: Outcome) -> list[tuple[str, Run, str]]:
    """Every run, with the rank it ran as under torchrun ("rank 1 "), and its label."""
    legacy, migrated = labels(outcome)
    named = {"shim": legacy, "native": migrated}
    if not outcome.ranks:
        return [("", run, named[run.mode]) for run in (outcome.shim, outcome.native)]
    return [(f"rank {r.rank} ", run, named[run.mode]) for r in outcome.ranks for run in (r.shim, r.native)]


def print_text(console: Console, outcome: Outcome) -> None:
    migration = outcome.migration
    for line in tree_migration.comparison_lines(migration.beyond_arguments, migration.same_as_tree):
        console.print(Text(line), soft_wrap=line.startswith("  "))  # a line of code stays whole
    changed = ", ".join(map(quote_path, migration.changed)) or "-"
    console.print(Text(f"migrated {len(migration.changed)} file(s) in the copy: {changed}"))
    if migration.shim_files:
        shim = ", ".join(map(quote_path, migration.shim_files))
        console.print(Text(f"kept on the shim (the copy runs with amp_shim): {shim}"))
    for entry in migration.documented:
        codes = ", ".join(c for c in migration.unsafe_codes if c in entry.codes)
        console.print(
            Text(
                f"unsafe fixes applied ({codes}): differ from Apex as docs/differences.md entry {entry.id} says"
            )
        )
    legacy, migrated = labels(outcome)
    console.print(
        Text(f"{legacy}: the original program on the shim's apex alias (the verdict's \"shim\" run)")
    )
    console.print(Text(f'{migrated}: the migrated copy (the verdict\'s "native" run)'))
    for rank in outcome.ranks:
        console.print(f"rank {rank.rank}: {rank.verdict.message}")
    if outcome.ranks and (outcome.shim.records or outcome.native.records):
        console.print(f"rank {outcome.rank}, step by step:")
    if outcome.shim.records or outcome.native.records:
        console.print(fitting_table(console, outcome))
    for where, run, label in _runs(outcome):
        if run.exit_code != 0 and run.stderr.strip():
            console.print(Text(f"{where}{label} run, end of stderr:", style="bold"))
            console.print(Text(stderr_tail(run.stderr)))
    for note in outcome.verdict.notes:
        console.print(Text(f"note: {note}"))
    for change in outcome.tree_changes:
        console.print(Text(f"error: the runs {change.how} {change.path} in your tree", style="bold red"))
    style = "bold green" if outcome.verdict.passed else "bold red"
    console.print(Text(outcome.verdict.message, style=style))
    # These name the user's files and show their lines: whatever they hold stays on its line.
    for line in describe(outcome.location):
        console.print(Text(printable(line)), soft_wrap=True)  # long source lines stay whole, for grep
    for line in coverage.describe(outcome.coverage):
        console.print(Text(printable(line)), soft_wrap=True)
    if outcome.logs and outcome.log_folder is not None:
        console.print(Text("the runs' stdout and stderr are kept in"))
        console.print(Text(f"  {outcome.log_folder}/"), soft_wrap=True)  # whole, to copy
        for log in outcome.logs:
            files = [_relative(path, outcome.log_folder) for path in (log.stdout, log.stderr)]
            console.print(Text(f"  {log.prefix}{'  '.join(files)}"), soft_wrap=True)


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def _plain(value: Any) -> Any:
    """JSON has no inf or NaN: non-finite numbers are written as the recorder writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _migration(outcome: Outcome, choice: Optional[Choice]) -> Optional[dict]:
    if choice is None:
        return None
    beyond = outcome.migration.beyond_arguments
    return {
        "target": choice.target,
        "unsafe_fixes": choice.unsafe_fixes,
        "device": choice.device,
        "dtype": choice.dtype,
        "tree_device": choice.tree_device,
        "tree_dtype": choice.tree_dtype,
        "config": choice.config_path,
        "differs_from_tree": choice.differs,
        "beyond_arguments": None if beyond is None else list(beyond),
        "same_code": None if beyond is None else outcome.migration.same_as_tree,
    }


def json_document(outcome: Outcome, exit_code: int, choice: Optional[Choice] = None) -> dict:
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
        "unsafe_fixes": list(outcome.migration.unsafe_codes),
        "documented": [entry.id for entry in outcome.migration.documented],
        "records": {"shim": list(outcome.shim.records), "native": list(outcome.native.records)},
        "location": _location(outcome.location),
        "coverage": coverage.as_json(outcome.coverage),
        "migration": _migration(outcome, choice),
        "labels": dict(zip(("shim", "native"), labels(outcome))),
        "logs": {
            "folder": None if outcome.log_folder is None else str(outcome.log_folder),
            "runs": [
                {"run": log.run, "rank": log.rank, "stdout": str(log.stdout), "stderr": str(log.stderr)}
                for log in outcome.logs
            ],
        },
        "tree_changes": [{"path": change.path, "change": change.how} for change in outcome.tree_changes],
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
