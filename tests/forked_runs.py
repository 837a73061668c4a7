"""Programs run as `python [-m amp_shim] SCRIPT ...` would run them, forked from a fork server
(tests/equivalence/forkserver.py: an interpreter that already imported torch) instead of each
starting an interpreter of its own: a fresh interpreter costs ~3 s of CPU before the program's
first line, the programs the tests run take well under a second.

tests/equivalence/test_migration_preserves_training.py::test_fork_server_records_what_a_fresh_interpreter_records
shows that a forked run records what a fresh interpreter records; `fresh=True` (or
AMP_EQUIVALENCE_FRESH=1 in the environment, for every run) starts a fresh interpreter instead.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORKSERVER = ROOT / "tests" / "equivalence" / "forkserver.py"
RUN_TIMEOUT = 120


class RunFailed(Exception):
    pass


def base_env(extra=()) -> dict:
    """The environment of a run: one thread, no warnings, the alias off, the shim importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for name in ("AMP_SHIM_ALIAS", "AMP_SHIM_ALIAS_ANNOUNCED", "AMP_SHIM_DTYPE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), str(ROOT), env.get("PYTHONPATH")]))
    env.update(dict(extra))
    return env


_zygotes = threading.local()
_all_zygotes: list = []


def _zygote() -> subprocess.Popen:
    """This thread's fork server (tests/equivalence/forkserver.py), started on first use."""
    proc = getattr(_zygotes, "proc", None)
    if proc is None or proc.poll() is not None:
        proc = subprocess.Popen(
            [sys.executable, str(FORKSERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=base_env(),
            text=True,
            bufsize=1,
        )
        _zygotes.proc = proc
        _all_zygotes.append(proc)
    return proc


def stop_zygotes() -> None:
    while _all_zygotes:
        proc = _all_zygotes.pop()
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=RUN_TIMEOUT)


atexit.register(stop_zygotes)


def launch(
    argv, *, shim: bool, env: dict, cwd: Path, fresh: bool = False, timeout: int = RUN_TIMEOUT
) -> tuple[int, str, str]:
    """Run `python [-m amp_shim] argv...` in `cwd`; (exit status, stdout, stderr).

    By default through a fork server (a child of an interpreter that already imported torch);
    `fresh=True`, or AMP_EQUIVALENCE_FRESH=1 in the environment, starts a new interpreter.
    """
    if fresh or os.environ.get("AMP_EQUIVALENCE_FRESH") == "1":
        cmd = [sys.executable, *(["-m", "amp_shim"] if shim else []), *map(str, argv)]
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr
    out, err = Path(cwd) / "stdout.txt", Path(cwd) / "stderr.txt"
    job = {
        "argv": [str(a) for a in argv],
        "shim": shim,
        "env": env,
        "cwd": str(cwd),
        "stdout": str(out),
        "stderr": str(err),
        "timeout": timeout,
    }
    zygote = _zygote()
    zygote.stdin.write(json.dumps(job) + "\n")
    zygote.stdin.flush()
    reply = zygote.stdout.readline()
    if not reply:
        raise RunFailed(f"the fork server died (exit {zygote.wait()})")
    return json.loads(reply)["rc"], out.read_text(), err.read_text()
