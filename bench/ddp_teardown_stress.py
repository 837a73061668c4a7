"""Run the legacy Apex DDP script (tests/shim/ddp_teardown_program.py) many times and count the
runs that do not exit cleanly (issue 18, item 11).

    python bench/ddp_teardown_stress.py [--runs 30] [--parallel 4] [--modes apex-hook,apex,native]

Each run is a whole training script: two gloo ranks on 127.0.0.1, amp O1, a few steps and no
`destroy_process_group`. `--parallel` copies run at once, which loads the machine the way the
original report did (an abort at interpreter exit needs a gloo thread that is late, so it shows
only under load). A run counts as aborted when it exits non-zero or prints `terminate called`.
Mode `hook-exit` (not in the default list) runs the mechanism alone, where the window is wide:
the shim's comm hook on a 1-rank group, then an immediate exit (see the program's docstring).
Not a timing benchmark: nothing is written under bench/results/; the counts are printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from _common import ROOT, loadavg

PROGRAM = ROOT / "tests" / "shim" / "ddp_teardown_program.py"
MODES = {"apex-hook": ["--apex-hook"], "apex": [], "native": ["--native"], "hook-exit": ["--hook-exit"]}


def run_once(mode: str, late_gloo: bool = False, timeout: float = 600) -> tuple[int, str]:
    """One run of the program in `mode`; its exit code and stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    if mode == "native":
        env.pop("AMP_SHIM_ALIAS", None)
    else:
        env["AMP_SHIM_ALIAS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), *MODES[mode], *(["--late-gloo"] if late_gloo else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stderr


def aborted(returncode: int, stderr: str) -> bool:
    return returncode != 0 or "terminate called" in stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--modes", default="apex-hook,apex,native")
    parser.add_argument(
        "--late-gloo", action="store_true", help="run gloo's worker threads at nice 19 (widens the exit race)"
    )
    args = parser.parse_args(argv)
    failed = 0
    for mode in args.modes.split(","):
        start, load_before = time.time(), loadavg()
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda _, mode=mode: run_once(mode, args.late_gloo), range(args.runs)))
        bad = [(rc, err) for rc, err in results if aborted(rc, err)]
        failed += len(bad)
        print(
            f"{mode:10s} {len(bad)} of {args.runs} aborted "
            f"(exit codes {sorted({rc for rc, _ in results})}, "
            f"'terminate called' in {sum('terminate called' in e for _, e in results)}; "
            f"{args.parallel} at once, load {load_before} -> {loadavg()}, "
            f"{time.time() - start:.0f}s)",
            flush=True,
        )
        for rc, err in bad[:3]:
            print(f"  exit {rc}: ...{err[-600:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
