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

from amp_migrate.runs.compare import AS_DOCUMENTED, IDENTICAL, WITHIN_TOLERANCE, Run, judge

EXPECTED = {"exact": IDENTICAL, "static-overflow": AS_DOCUMENTED, "tolerance": WITHIN_TOLERANCE}
NATIVE = [c for c in CASES if not c.native_xfail]


def verdict_of(runner, case):
    shim, native = runner.get(case, "shim"), runner.get(case, "native")
    return judge(
        Run("shim", 0, shim["step_records"], precision=tuple(shim["precision"])),
        Run("native", 0, native["step_records"]),
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
