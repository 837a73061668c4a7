"""What the benchmarks share: the machine's description, load, peak RSS of a process tree,
results files and plain-text tables."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    info = {
        "cpu": cpu,
        "cores": cores,
        "memory_gib": mem_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **source_state(),
    }
    for mod in ("torch", "libcst"):
        try:
            from importlib.metadata import version

            info[mod] = version(mod)
        except Exception:  # noqa: BLE001 - a missing package is just not described
            pass
    return info


def source_state() -> dict:
    """The commit measured, and whether the code under test had uncommitted changes."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD") or None,
        "uncommitted_changes": bool(git("status", "--porcelain", "--", "amp_migrate", "shim")),
    }


def describe(info: dict) -> str:
    return (
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB RAM, {info['os']}, "
        f"Python {info['python']}, torch {info.get('torch', '-')}, libcst {info.get('libcst', '-')}, "
        f"OMP_NUM_THREADS={info['omp_num_threads']}; code at {info.get('commit')}"
        + (" with uncommitted changes" if info.get("uncommitted_changes") else "")
    )


def require_single_thread() -> None:
    """OMP_NUM_THREADS=1 must be set before torch loads; re-exec once if it was not."""
    if os.environ.get("OMP_NUM_THREADS") != "1":
        os.environ["OMP_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeRss:
    """Samples the summed RSS of a process and all its descendants (every `interval` s).

    Summing counts pages that forked workers share with their parent once per process, so
    the figure is an upper bound of what the tree really holds."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kib = 0
        self.peak_single_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            kids = _children()
            pids, todo = [], [self.pid]
            while todo:
                p = todo.pop()
                pids.append(p)
                todo.extend(kids.get(p, []))
            sizes = [_rss_kib(p) for p in pids]
            self.peak_kib = max(self.peak_kib, sum(sizes))
            self.peak_single_kib = max(self.peak_single_kib, max(sizes, default=0))
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_timed(cmd: Sequence[str], *, env: Optional[dict] = None, stdout=None, cwd=None) -> dict:
    """Run a command; wall time, exit code, and peak RSS of its process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), env=env, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd
    )
    with TreeRss(proc.pid) as rss:
        _, err = proc.communicate()
    wall = time.perf_counter() - start
    return {
        "cmd": " ".join(str(c) for c in cmd),
        "wall_s": round(wall, 3),
        "rc": proc.returncode,
        "peak_rss_tree_mb": round(rss.peak_kib / 1024, 1),
        "peak_rss_single_mb": round(rss.peak_single_kib / 1024, 1),
        "stderr_tail": err.decode(errors="replace")[-2000:],
    }


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = dict(data)
    data["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence], markdown: bool = False) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    if markdown:
        out = [
            "| " + " | ".join(cells[0]) + " |",
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|",
        ]
        out += ["| " + " | ".join(r) + " |" for r in cells[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"
