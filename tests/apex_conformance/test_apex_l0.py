"""Apex's own L0 unit tests (amp, optimizers, fp16_utils), unmodified, against the shim.

Each L0 directory runs in its own process (runner.py) through the `apex` alias, on the CPU via
the adapter (cuda_on_cpu.py). Every test must pass, fail as a strict expected failure with a
documented reason, or skip for a reason upstream gives (hardware this machine lacks, a test
disabled upstream) or for an upstream defect (expected_outcomes.py).
"""

from __future__ import annotations

import re

import l0_runner as runner
import pytest
from expected_outcomes import EXPECTED, UPSTREAM_SKIPS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        runner.L0 is None,
        reason="Apex's L0 tests are not here (looked in "
        + " and ".join(str(c) for c in runner.CANDIDATES)
        + "); they are not part of the repository",
    ),
]

DIFFERENCES = runner.ROOT / "docs" / "differences.md"
#: At least this many of the 92 tests pass on a CPU machine with the shim's own amp_C.
PASSING_FLOOR = 70


def _problems(run: runner.DirectoryRun) -> list[str]:
    problems = []
    for o in run.outcomes:
        expected = EXPECTED.get(o.nodeid)
        if o.outcome in ("failed", "error"):
            problems.append(f"{o.nodeid}: {o.outcome}\n{o.message[-1500:]}")
        elif (
            o.outcome == "skipped"
            and o.message not in UPSTREAM_SKIPS
            and not (expected and expected.outcome == "skip" and o.message == expected.reason)
        ):
            problems.append(
                f"{o.nodeid}: skipped for a reason that is neither hardware nor upstream's: {o.message!r}"
            )
        elif o.outcome == "xfailed" and not (expected and expected.outcome == "xfail"):
            problems.append(f"{o.nodeid}: xfailed without an expectation: {o.message!r}")
        elif o.outcome == "xfailed" and not _cites_a_difference(expected.reason):
            problems.append(
                f"{o.nodeid}: its expected failure cites no docs/differences.md row "
                f"that exists, and is not an adapter artefact: {expected.reason!r}"
            )
    return problems


def _cites_a_difference(reason: str) -> bool:
    rows = set(re.findall(r"^\| (\d+) \|", DIFFERENCES.read_text(encoding="utf-8"), flags=re.M))
    cited = re.findall(r"docs/differences\.md row (\d+)", reason)
    return (bool(cited) or "adapter artefact" in reason) and set(cited) <= rows


@pytest.mark.parametrize("directory", runner.DIRECTORIES)
def test_apex_l0_directory_passes_or_fails_only_as_documented(directory, apex_l0_run):
    run = apex_l0_run(directory)
    assert run.outcomes, f"no test ran in {directory} (exit code {run.returncode}):\n{run.output[-3000:]}"
    problems = _problems(run)
    assert not problems, "\n\n".join(problems)
    assert run.returncode == 0, run.output[-3000:]


def test_every_expectation_names_an_upstream_test(apex_l0_run):
    ran = {o.nodeid for d in runner.DIRECTORIES for o in apex_l0_run(d).outcomes}
    assert sorted(set(EXPECTED) - ran) == []


def test_at_least_70_of_the_92_tests_pass_on_cpu(apex_l0_run):
    outcomes = [o for d in runner.DIRECTORIES for o in apex_l0_run(d).outcomes]
    passed = sum(o.outcome == "passed" for o in outcomes)
    assert len(outcomes) == 92
    assert passed >= PASSING_FLOOR, f"{passed} of {len(outcomes)} pass"
