"""Run one directory of Apex's L0 tests against the shim, in a process of its own.

The tests are read where they lie (`../shared/apex-tests/L0`, never copied, never written to:
no bytecode, no pytest cache) and imported as `apex` through the shim's alias, forced so a real
Apex cannot answer instead. Each directory gets a fresh interpreter, as upstream's runner gave
each its own suite: the adapter patches torch for the whole process, and the tests leave
process-wide state behind (default tensor type, cudnn flags, amp handles).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CANDIDATES = (ROOT.parent / "shared" / "apex-tests" / "L0", Path("/work/shared/apex-tests/L0"))
L0 = next((c for c in CANDIDATES if (c / "run_test.py").is_file()), None)
DIRECTORIES = ("run_amp", "run_optimizers", "run_fp16util")
#: Imported across directories: run_optimizers/test_fused_novograd.py imports test_fused_optimizer.
SHARED_IMPORTS = ("run_optimizers",)
PLUGINS = ("cuda_on_cpu", "expected_outcomes", "seeded_tests")


@dataclass(frozen=True)
class Outcome:
    nodeid: str
    outcome: str  # passed, failed, error, skipped, xfailed
    message: str = ""


@dataclass
class DirectoryRun:
    directory: str
    returncode: int
    outcomes: list[Outcome] = field(default_factory=list)
    output: str = ""

    def count(self, outcome: str) -> int:
        return sum(o.outcome == outcome for o in self.outcomes)


def command(directory: str, junit: Path) -> list[str]:
    plugins = [arg for name in PLUGINS for arg in ("-p", name)]
    return [
        sys.executable,
        "-m",
        "pytest",
        *plugins,
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(L0),
        "-c",
        os.devnull,
        "-q",
        "-rfEsx",
        "--junitxml",
        str(junit),
        directory,
    ]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(HERE)] + [str(L0 / d) for d in (*DIRECTORIES, *SHARED_IMPORTS)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["AMP_SHIM_ALIAS"] = "force"
    env["AMP_SHIM_ALIAS_ANNOUNCED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start(directory: str, junit: Path) -> subprocess.Popen:
    if L0 is None:
        raise FileNotFoundError(
            "Apex's L0 tests are not here (looked in " + " and ".join(str(c) for c in CANDIDATES) + ")"
        )
    return subprocess.Popen(
        command(directory, junit),
        cwd=L0,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(directory: str, process: subprocess.Popen, junit: Path) -> DirectoryRun:
    output, _ = process.communicate()
    run = DirectoryRun(directory, process.returncode, output=output)
    if junit.is_file():
        run.outcomes = parse_junit(junit)
    return run


def run_directory(directory: str, junit: Path) -> DirectoryRun:
    return finish(directory, start(directory, junit), junit)


def _nodeid(case: ElementTree.Element) -> str:
    module, _, cls = case.get("classname", "").rpartition(".")
    return f"{module.replace('.', '/')}.py::{cls}::{case.get('name')}"


def parse_junit(path: Path) -> list[Outcome]:
    outcomes = []
    for case in ElementTree.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), child.get("message", "")
                message = message + "\n" + (child.text or "")
            elif child.tag == "skipped":
                kind = child.get("type", "")
                outcome = "xfailed" if kind == "pytest.xfail" else "skipped"
                message = child.get("message", "")
                if outcome == "skipped":
                    message = _skip_reason(message)
        outcomes.append(Outcome(_nodeid(case), outcome, message.strip()))
    return outcomes


def _skip_reason(message: str) -> str:
    # pytest writes unittest skips as "<reason>" and mark skips as "<file>[:<line>]: <reason>".
    return re.sub(r"^\S+\.py(:\d+)?: ", "", message)
