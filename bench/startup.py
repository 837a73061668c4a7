"""Start-up of the command, as pre-commit and editors pay it on every call.

    OMP_NUM_THREADS=1 python bench/startup.py [--runs 15] [--baseline COMMIT]

Whole-process wall time (and CPU time, user + system) of three commands, each run `--runs`
times, interleaved round by round so that all three see the same load, after one warm-up run
each (which also writes the bytecode caches, as an installed package has them):

* bare `python -c pass`, the floor no Python command goes under;
* `amp-migrate --version`;
* `amp-migrate --check DIR` on a one-file tree whose file does not use Apex.

`amp-migrate` is the console script beside this interpreter (`python -m amp_migrate` where
there is none), running this checkout's code (`PYTHONPATH`). `--baseline COMMIT` measures that
commit's code too (extracted with `git archive` into a temporary folder), in the same rounds.
Prints a table and writes `bench/results/startup.json`; `bench/write_performance.py` puts it into
docs/results/performance.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, describe, fmt, loadavg, machine, save, table  # noqa: E402

TARGETS = {"version_s": 0.15, "check_no_apex_s": 0.4}
NO_APEX = "import torch\n\n\ndef train(model, x):\n    return model(x).sum()\n"
HEADERS = ["command", "code", "median wall s", "min wall s", "median CPU s", "over bare Python s"]


def amp_migrate_command() -> list[str]:
    script = Path(sys.executable).parent / "amp-migrate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "amp_migrate"]


def environment(code: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(code), str(code / "shim")])
    return env


def run_once(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds (the child's user + system) of one run, and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.decode()[-2000:]}")
    return wall, cpu, proc.returncode


def extract(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(runs: int, baseline: Optional[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="amp-startup-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        (tree / "train.py").write_text(NO_APEX)
        codes = {"this checkout": ROOT}
        if baseline is not None:
            (Path(tmp) / "baseline").mkdir()
            codes[f"baseline {baseline}"] = extract(baseline, Path(tmp) / "baseline")
        tool = amp_migrate_command()
        cases: list[tuple[str, Optional[str], list[str]]] = [
            ("python -c pass", None, [sys.executable, "-c", "pass"])
        ]
        for label in codes:
            cases.append(("amp-migrate --version", label, [*tool, "--version"]))
            cases.append(("amp-migrate --check DIR", label, [*tool, "--check", str(tree)]))
        envs = {label: environment(code) for label, code in codes.items()}
        bare_env = environment(ROOT)
        timings: dict[tuple[str, Optional[str]], dict[str, list[float]]] = {}
        for name, label, cmd in cases:  # warm-up: bytecode caches, page cache
            run_once(cmd, envs[label] if label else bare_env, tree)
            timings[(name, label)] = {"wall": [], "cpu": []}
        for _ in range(runs):
            for name, label, cmd in cases:
                wall, cpu, rc = run_once(cmd, envs[label] if label else bare_env, tree)
                if name.startswith("amp-migrate --check") and rc != 0:
                    raise SystemExit(f"--check on a tree without Apex exited {rc}")
                timings[(name, label)]["wall"].append(round(wall, 4))
                timings[(name, label)]["cpu"].append(round(cpu, 4))
        return {
            "command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(tool)),
            "cases": [
                {
                    "name": name,
                    "code": label,
                    "cmd": " ".join(cmd),
                    "wall_s": timings[(name, label)]["wall"],
                    "cpu_s": timings[(name, label)]["cpu"],
                    "median_wall_s": round(statistics.median(timings[(name, label)]["wall"]), 4),
                    "min_wall_s": round(min(timings[(name, label)]["wall"]), 4),
                    "median_cpu_s": round(statistics.median(timings[(name, label)]["cpu"]), 4),
                }
                for name, label, cmd in cases
            ],
        }


def rows(res: dict) -> list[list[str]]:
    bare = res["cases"][0]["median_wall_s"]
    return [
        [
            f"`{c['name']}`" + (" (DIR: one file, no Apex)" if c["name"].endswith("DIR") else ""),
            c["code"] or "-",
            fmt(c["median_wall_s"], 3),
            fmt(c["min_wall_s"], 3),
            fmt(c["median_cpu_s"], 3),
            "-" if c["code"] is None else fmt(c["median_wall_s"] - bare, 3),
        ]
        for c in res["cases"]
    ]


def case(res: dict, name: str, code: str = "this checkout") -> dict:
    return next(c for c in res["cases"] if c["name"].startswith(name) and c["code"] == code)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", metavar="COMMIT", help="also measure this commit's code")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    info = machine()
    load_before = loadavg()
    print(f"machine: {describe(info)}\nload average before: {load_before}", flush=True)
    res = measure(args.runs, args.baseline)
    res.update(
        machine=info,
        runs=args.runs,
        baseline=args.baseline,
        load_before=load_before,
        load_after=loadavg(),
        total_s=round(time.perf_counter() - started, 1),
    )
    version, check = case(res, "amp-migrate --version"), case(res, "amp-migrate --check")
    res["targets"] = [
        {
            "target": f"`amp-migrate --version` < {TARGETS['version_s']:g} s (median wall, whole process)",
            "measured": f"{version['median_wall_s']:.3f} s (CPU {version['median_cpu_s']:.3f} s)",
            "met": version["median_wall_s"] < TARGETS["version_s"],
        },
        {
            "target": f"`amp-migrate --check` on a one-file tree without Apex < {TARGETS['check_no_apex_s']:g} s "
            "(median wall, whole process)",
            "measured": f"{check['median_wall_s']:.3f} s (CPU {check['median_cpu_s']:.3f} s)",
            "met": check["median_wall_s"] < TARGETS["check_no_apex_s"],
        },
    ]
    print(table(HEADERS, rows(res)))
    print(f"load average after: {res['load_after']}")
    path = save("startup", res)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
