"""What verify shows while it works: the phase, the step a run has reached, and with
`--show-output` the runs' own output, line by line with the run's prefix.

`Watch` shows nothing (JSON, a pipe, a test); `Live` draws a rich progress line on a terminal,
and prints the runs' lines above it; `Lines` prints the runs' lines only (`--show-output`
without a terminal).
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text


class Watch:
    """Told what happens; shows nothing."""

    #: Whether verify should read the runs' output while they go, for `output`.
    wants_output = False

    def phase(self, name: str, steps: Optional[int] = None) -> None:
        """A new phase; `steps`: the step records a run phase will stop at."""

    def step(self, done: int) -> None:
        """The running phase has completed `done` step records."""

    def output(self, prefix: str, line: str) -> None:
        """A line a run wrote."""

    def close(self) -> None:
        """verify is done."""


class Lines(Watch):
    """The runs' output, each line after its run's prefix."""

    wants_output = True

    def __init__(self, console: Console) -> None:
        self.console = console

    def output(self, prefix: str, line: str) -> None:
        self.console.print(Text(prefix + line), soft_wrap=True)


class Live(Watch):
    """A progress line on the terminal: `legacy run: step 3 of 20  0:00:04`."""

    def __init__(self, console: Console, show_output: bool = False) -> None:
        self.wants_output = show_output
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None)
        self._name = ""
        self._steps: Optional[int] = None
        self._progress.start()

    def phase(self, name: str, steps: Optional[int] = None) -> None:
        self._name, self._steps = name, steps
        self._progress.reset(self._task, description=self._describe(0))

    def step(self, done: int) -> None:
        self._progress.update(self._task, description=self._describe(done))

    def _describe(self, done: int) -> str:
        if self._steps is None:
            return self._name
        return f"{self._name}: step {min(done, self._steps)} of {self._steps}"

    def output(self, prefix: str, line: str) -> None:
        self._progress.console.print(Text(prefix + line), soft_wrap=True)

    def close(self) -> None:
        self._progress.stop()
