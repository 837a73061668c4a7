"""Run Apex's L0 tests on the shim and write the figure into docs/results/apex-conformance.md.

    OMP_NUM_THREADS=1 python tests/apex_conformance/report.py [--page PATH] [--print]

Runs the three L0 directories as the test suite does (l0_runner.py: unmodified tests, the
`apex` alias, the CPU adapter where there is no CUDA, the expected outcomes), two at a time,
and replaces the text between `<!-- apex-conformance:start -->` and
`<!-- apex-conformance:end -->` in that page.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import l0_runner as runner  # noqa: E402
from expected_outcomes import EXPECTED, UPSTREAM_SKIPS  # noqa: E402

START, END = "<!-- apex-conformance:start -->", "<!-- apex-conformance:end -->"
COMMAND = "OMP_NUM_THREADS=1 python tests/apex_conformance/report.py"


def run_all() -> tuple[list[runner.DirectoryRun], float]:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="apex-l0-") as tmp, ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda d: runner.run_directory(d, Path(tmp) / f"{d}.xml"), runner.DIRECTORIES))
    return runs, time.perf_counter() - began


def _why_skipped(outcome: runner.Outcome) -> str:
    if outcome.message in UPSTREAM_SKIPS:
        return UPSTREAM_SKIPS[outcome.message]
    expected = EXPECTED.get(outcome.nodeid)
    return (
        "upstream defect" if expected and expected.reason.startswith("upstream defect") else outcome.message
    )


def body(runs: list[runner.DirectoryRun], seconds: float) -> str:
    import torch

    outcomes = [o for run in runs for o in run.outcomes]
    counts = Counter(o.outcome for o in outcomes)
    where = "CUDA, no adapter" if torch.cuda.is_available() else "CPU, through the CUDA-to-CPU adapter"
    lines = [
        f"**{counts['passed']} pass, {counts['xfailed']} expected failures, {counts['skipped']} skip, "
        f"{counts['failed'] + counts['error']} fail, of {len(outcomes)}** "
        f"(torch {torch.__version__}, Python {platform.python_version()}, {where}; "
        f"{seconds / 60:.1f} min on 2 cores). Regenerate with `{COMMAND}`.",
        "",
        "| L0 directory | tests | pass | expected failure | skip | fail |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| `{run.directory}` | {len(run.outcomes)} | {run.count('passed')} | "
            f"{run.count('xfailed')} | {run.count('skipped')} | "
            f"{run.count('failed') + run.count('error')} |"
        )
    skips = Counter(_why_skipped(o) for o in outcomes if o.outcome == "skipped")
    if skips:
        lines += ["", "Skipped: " + ", ".join(f"{n} {why}" for why, n in skips.most_common()) + "."]
    xfails = [o for o in outcomes if o.outcome == "xfailed"]
    for o in xfails:
        lines.append(f"- expected failure `{o.nodeid}`: {EXPECTED[o.nodeid].reason}")
    return "\n".join(lines)


def rewrite(page: Path, text: str) -> None:
    content = page.read_text(encoding="utf-8")
    head, sep, rest = content.partition(START)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"{page} lacks the markers {START} ... {END}")
    page.write_text(f"{head}{START}\n{text}\n{END}{tail}", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--page", "--readme", type=Path, default=runner.ROOT / "docs" / "results" / "apex-conformance.md"
    )
    parser.add_argument("--print", action="store_true", help="print the figure, do not write the page")
    args = parser.parse_args(argv)
    if runner.L0 is None:
        raise SystemExit(
            "Apex's L0 tests are not here (looked in " + " and ".join(str(c) for c in runner.CANDIDATES) + ")"
        )
    runs, seconds = run_all()
    text = body(runs, seconds)
    print(text)
    if not args.print:
        rewrite(args.page, text)
        print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
