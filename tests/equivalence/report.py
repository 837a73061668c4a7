"""Run the equivalence harness and write its table into docs/results/equivalence.md.

    OMP_NUM_THREADS=1 python tests/equivalence/report.py [--page PATH] [--print]

Runs every case of equivalence_cases.py three ways (the unchanged program through the shim,
the codemod's native output, the codemod's shim output), compares them exactly as the tests do
(tests/equivalence/test_migration_preserves_training.py), and replaces the text between
`<!-- equivalence-table:start -->` and `<!-- equivalence-table:end -->` in that page.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # forked_runs, shared with tests/runs
os.environ.setdefault("OMP_NUM_THREADS", "1")

from equivalence_cases import CASES  # noqa: E402
from equivalence_harness import (  # noqa: E402
    ROOT,
    MigrationFellBack,
    Runner,
    compare_exact,
    compare_static_overflow,
    compare_tolerance,
    relative_gaps,
    skipped,
)

START, END = "<!-- equivalence-table:start -->", "<!-- equivalence-table:end -->"


def _shim_cell(record) -> str:
    final = record["scales"][-1] if record["scales"] else []
    text = f"trains: {len(record['losses'])} iterations, final scale {', '.join(f'{s:g}' for s in final)}"
    count = record["stdout"].count("Gradient overflow")
    if count:
        text += f", {count} overflow skip{'s' if count > 1 else ''}"
    return text


def _row(runner, case):
    def get(mode):
        try:
            return runner.get(case, mode), None
        except MigrationFellBack as exc:
            return None, "falls back to the shim: " + ", ".join(sorted({d.code for d in exc.diagnostics}))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            return None, f"FAILED ({type(exc).__name__})"

    shim, shim_err = get("shim")
    native, native_err = get("native")
    target, target_err = get("shim-target")
    if shim is None:
        return [shim_err, "-", "-"]
    shim_cell = _shim_cell(shim)
    if native is None:
        native_cell = native_err
    elif case.expect == "exact":
        problems = compare_exact(case, shim, native, case.scales)
        native_cell = "bit-identical" if not problems else "DIFFERS: " + problems[0]
        if not problems and case.scales == "per_loss":
            native_cell += " (one GradScaler = smallest per-loss scale)"
        if not problems and case.scales == "native_disabled":
            native_cell += " (GradScaler disabled)"
    elif case.expect == "static-overflow":
        problems = compare_static_overflow(shim, native)
        at = skipped(native)[0][0] if skipped(native) else "?"
        native_cell = (
            f"bit-identical until the forced overflow at iteration {at}, then the documented "
            "AMP111 difference: Apex applies the step, GradScaler skips it and halves its scale"
            if not problems
            else "DIFFERS: " + problems[0]
        )
    elif case.expect == "documented" and any(e.from_event for e in case.entries):
        events = {e.from_event for e in case.entries if e.from_event}
        records = shim["step_records"], native["step_records"]
        first = next((i for i, r in enumerate(records[0]) if events & set(r.get("events") or ())), None)
        same = first is not None and records[1][:first] == records[0][:first]
        problems = [] if same else ["the runs differ before the documented event"]
        native_cell = (
            f"`--unsafe-fixes`: bit-identical for the {first} steps before the legacy run's first "
            f"{'/'.join(sorted(events))}, then different as docs/differences.md entries {case.unsafe} document"
            if same
            else "DIFFERS: " + problems[0]
        )
    elif case.expect == "documented":
        problems = compare_exact(case, shim, native, "own")
        native_cell = (
            f"`--unsafe-fixes`: bit-identical but for the loss scales, as docs/differences.md entry {case.unsafe} "
            "documents"
            if not problems
            else "DIFFERS: " + problems[0]
        )
    else:
        problems = compare_tolerance(case, shim, native)
        loss_gap, param_gap = relative_gaps(shim, native)
        tol = case.tolerance
        verdict = "within tolerance" if not problems else "OUT OF TOLERANCE"
        native_cell = (
            f"{verdict}: loss gap {loss_gap:.1e} (≤ {tol.loss_rel:g}), "
            f"parameters {param_gap:.1e} (≤ {tol.param_rel:g}); both converge"
        )
    if target is None:
        target_cell = target_err
    else:
        problems = compare_exact(case, shim, target)
        target_cell = "bit-identical" if not problems else "DIFFERS: " + problems[0]
    return [shim_cell, native_cell, target_cell]


def table(runner) -> str:
    import torch

    started = time.time()
    for case in CASES:
        runner.submit(case)
    rows = [(case, _row(runner, case)) for case in CASES]
    elapsed = time.time() - started
    lines = [
        "| program | case | covers | (a) unchanged, `python -m amp_shim` | (b) `--target native` vs (a) | (c) `--target shim` vs (a) |",
        "|---|---|---|---|---|---|",
    ]
    for case, cells in rows:
        args = " ".join(case.args) if not case.phases else " / ".join(" ".join(p) for p in case.phases)
        args = args.replace("{dir}/", "")
        lines.append(
            f"| `{case.program}{'/' if case.is_project else ''}` | `{case.id}`{' `' + args + '`' if args else ''} | {case.covers} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append("")
    lines.append(
        f"Generated by `python tests/equivalence/report.py` (torch {torch.__version__}, "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}): {len(CASES)} cases x 3 runs "
        f"in {elapsed:.0f} s. Compared: per-iteration losses, skipped steps, loss scales, "
        "final parameters. Tolerances and every gap: [docs/differences.md](../differences.md#shim-vs-migrated-native-code-the-equivalence-harness)."
    )
    return "\n".join(lines)


def rewrite(page: Path, body: str) -> None:
    text = page.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{page}: markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + START + "\n" + body + "\n" + END + tail)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", "--readme", type=Path, default=ROOT / "docs" / "results" / "equivalence.md")
    parser.add_argument("--print", action="store_true", help="print the table, do not write the page")
    args = parser.parse_args(argv)
    runner = Runner()
    try:
        body = table(runner)
    finally:
        runner.close()
    if args.print:
        print(body)
    else:
        rewrite(args.page, body)
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
