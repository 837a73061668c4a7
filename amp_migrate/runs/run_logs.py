"""Each verify run's stdout and stderr, kept where the user can read them after verify ends.

The runs write their output to files, never to pipes (a process a run leaves behind would
hold a pipe open), in a folder of the system's temporary directory named for this verify run,
outside the user's tree and outside the migrated copy, which verify deletes. `Tail` reads what
a file gained since it last looked, whole lines only, so that verify can stream the output of
a run while it goes (`--show-output`) from the same files.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: How the runs are named in the logs and in the output prefixes.
LEGACY, MIGRATED = "legacy", "migrated"


@dataclass(frozen=True)
class RunLog:
    """One process's output: a run's, or under torchrun one rank's."""

    run: str  # LEGACY or MIGRATED
    rank: Optional[int]  # under torchrun
    stdout: Path
    stderr: Path

    @property
    def prefix(self) -> str:
        return f"[{self.run}] " if self.rank is None else f"[{self.run} rank {self.rank}] "


def new_folder() -> Path:
    """A folder of its own for this verify run, under the system's temporary directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"amp-migrate-verify-{stamp}-"))


def rank_logs(run: str, log_dir: Path, nproc: int) -> list[RunLog]:
    """The per-rank files torchrun writes under `--log-dir` with `--redirects 3`
    (RUN_ID/attempt_N/RANK/stdout.log); the newest attempt's, where torchrun made several."""
    logs = []
    for rank in range(nproc):
        stdouts = sorted(log_dir.glob(f"*/attempt_*/{rank}/stdout.log"))
        if stdouts:
            logs.append(RunLog(run, rank, stdouts[-1], stdouts[-1].with_name("stderr.log")))
    return logs


class Tail:
    """The whole lines a growing file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = b""

    def lines(self, final: bool = False) -> list[str]:
        """New complete lines; with `final`, the unterminated rest too (the process is gone)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            data = b""
        self._offset += len(data)
        *complete, self._pending = (self._pending + data).split(b"\n")
        if final and self._pending:
            complete.append(self._pending)
            self._pending = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in complete]


def steps_done(progress: Path, ranks: int) -> int:
    """The step records every rank has completed, from the recorder's progress file (one
    `RANK COUNT` line per record)."""
    done: dict[int, int] = {}
    try:
        text = progress.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        rank, _, count = line.partition(" ")
        if rank.isdigit() and count.isdigit():
            done[int(rank)] = max(done.get(int(rank), 0), int(count))
    return min(done.get(rank, 0) for rank in range(max(ranks, 1)))
