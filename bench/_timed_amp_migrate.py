"""`amp-migrate ARGS...`, exactly as the console script runs it, with the time of each file's
job (read, pre-filter, migrate) recorded into the JSON file named by $AMP_BENCH_TIMINGS.

Only for `--jobs 1`: with a pool the jobs run in workers and their times stay there. The
codemod is imported before the run, so that the first Apex file's time is its own and not
libcst's import (the CLI imports it on first use).
"""

import atexit
import json
import os
import sys
import time

from amp_migrate.cli import runner  # noqa: F401 (the codemod, imported up front)
from amp_migrate.cli.main import main

_timings: dict = {}
_process = runner.process


def _timed(job):
    start = time.perf_counter()
    try:
        return _process(job)
    finally:
        _timings[job.path] = time.perf_counter() - start


runner.process = _timed


@atexit.register
def _dump() -> None:
    with open(os.environ["AMP_BENCH_TIMINGS"], "w") as f:
        json.dump(_timings, f)


if __name__ == "__main__":
    sys.argv[0] = "amp-migrate"
    sys.exit(main())
