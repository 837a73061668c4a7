"""`amp-migrate verify`'s verdict (amp_migrate/runs/compare.py) on every equivalence program:
the legacy program through the shim and its native migration, recorded step by step by the
recorder `verify` runs in the user's process, judged as `verify` judges them with its default
tolerance. O0/O1 (and O2, whose shim run agrees bit for bit here) must be identical, O3 and
FP16_Optimizer within the precision tolerance with the reason named, and a static loss scale's
overflowed step the documented difference (AMP111), nothing else.

The runs are the harness's own (shared with the other equivalence tests), so this costs no
extra run; tests/runs/test_verify_fixture_programs.py runs a sample through the command itself.
"""

import pytest
from equivalence_cases import CASES, case_param
from equivalence_harness import migrate

from amp_migrate.runs.compare import AS_DOCUMENTED, DIVERGED, IDENTICAL, WITHIN_TOLERANCE, Run, judge

EXPECTED = {
    "exact": IDENTICAL,
    "static-overflow": AS_DOCUMENTED,
    "tolerance": WITHIN_TOLERANCE,
    "documented": AS_DOCUMENTED,
}
NATIVE = [c for c in CASES if not c.native_xfail]


def verdict_of(runner, case):
    shim, native = runner.get(case, "shim"), runner.get(case, "native")
    return judge(
        Run("shim", 0, shim["step_records"], precision=tuple(shim["precision"])),
        Run("native", 0, native["step_records"]),
        documented=case.entries,
    )


@pytest.mark.parametrize("case", [case_param(c) for c in NATIVE])
def test_verify_judges_the_native_migration_of_every_program_as_the_harness_expects(equivalence_runner, case):
    migrate(case, "native")
    verdict = verdict_of(equivalence_runner, case)
    assert verdict.kind == EXPECTED[case.expect], verdict.message
    if case.expect == "tolerance":
        assert "expected: " in verdict.message  # why: O3's float16 weights, FP16_Optimizer


def test_every_kind_of_expected_verdict_is_among_the_programs():
    assert {c.expect for c in NATIVE} == set(EXPECTED)


@pytest.mark.parametrize("case", [case_param(c) for c in NATIVE if c.expect == "documented"])
def test_an_unsafe_programs_difference_is_documented_only_with_its_entry_and_a_broken_run_diverges(
    equivalence_runner, case
):
    """verify knows the entry: the same runs judged without it diverge where the entry's
    quantity differs; a native run broken elsewhere (a step's weights) diverges with it."""
    migrate(case, "native")
    verdict = verdict_of(equivalence_runner, case)
    shown = [e for e in case.entries if f"entry {e.id}" in verdict.message]
    assert shown, verdict.message
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    legacy = Run("shim", 0, shim["step_records"])
    without = judge(legacy, Run("native", 0, native["step_records"]))
    assert without.kind == DIVERGED and without.divergence.quantity in shown[0].quantities, without.message
    # Broken where no entry lets it differ: the last step's weights, or with an entry measured
    # from an event of the legacy run, a step before that event.
    events = [
        i
        for i, r in enumerate(shim["step_records"])
        if set(r.get("events") or ()) & {e.from_event for e in shown}
    ]
    at = events[0] - 1 if events else -1
    assert at != -1 or not events, "the event came at the first step: nothing before it to break"
    broken = [dict(r) for r in native["step_records"]]
    broken[at]["param_sum"] = float(broken[at]["param_sum"]) * 1.001 + 1e-3
    verdict = judge(legacy, Run("native", 0, broken), documented=case.entries)
    assert verdict.kind == DIVERGED and verdict.divergence.quantity == "param_sum", verdict.message
    assert verdict.divergence.step == (at % len(broken)) + 1, verdict.message
