"""What programs read of the loss scale, and static loss scales, after native migration.

The harness compares what the recorder sees (losses, steps, the scalers' scales, parameters);
these tests also compare what the programs themselves log and save, and check the one documented
difference of a static loss scale (AMP111) instead of waiving it.
"""

import re

import pytest
from equivalence_cases import BY_ID
from equivalence_harness import compare_static_overflow, skipped

LOGGED = re.compile(
    r"^(?:epoch \d+ iter \d+ loss \S+ scale \S+|epoch \d+ iter \d+: amp loss scale \S+"
    r"|saved checkpoint_\d+\.pt .*)$",
    re.M,
)

pytestmark = pytest.mark.slow  # every test runs programs (equivalence_runner)


def _logged(record: dict) -> list[str]:
    return LOGGED.findall(record["stdout"] + record["stderr"])


@pytest.mark.parametrize("case", [BY_ID["log-loss-scale-and-checkpoint"]], ids=lambda c: c.id)
def test_logged_and_saved_loss_scales_are_apexs_after_native_migration(equivalence_runner, case):
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    logged = _logged(shim)
    saved = [line for line in logged if line.startswith("saved")]
    assert len(saved) == 3 and len(logged) > 3 * 8
    # the overflows change the scale the program logs and saves (65536 -> 32768 -> ...)
    assert {"65536.0", "32768.0", "16384.0"} <= {line.rsplit(" ", 1)[-1].rstrip(")") for line in logged}
    assert _logged(native) == logged


@pytest.mark.parametrize("case", [BY_ID["static-loss-scale-128-overflow"]], ids=lambda c: c.id)
def test_static_loss_scale_differs_only_as_documented_at_the_overflow(equivalence_runner, case):
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    assert skipped(native) == [(20, 0)] and skipped(shim) == []
    assert compare_static_overflow(shim, native) == []


@pytest.mark.parametrize("case", [BY_ID["static-loss-scale-128-overflow"]], ids=lambda c: c.id)
def test_the_static_overflow_check_rejects_runs_that_do_not_part_at_an_overflow(equivalence_runner, case):
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    assert compare_static_overflow(shim, shim)  # Apex's behaviour on both sides: no skip at all
    grown = dict(native, scales=[[s[0] * 4] for s in native["scales"]])
    assert compare_static_overflow(shim, grown)
