"""FP16_Optimizer flows migrated to the native recipe keep Apex's loss-scale schedule.

The recorder reads loss scales from Apex's amp state, which FP16_Optimizer's own scaler is not
part of, so the cases compare scales as "own"; the programs print their final scale instead,
and these tests compare that line and the skipped steps between the shim and native runs.
"""

import pytest
from equivalence_cases import BY_ID
from equivalence_harness import skipped

pytestmark = pytest.mark.slow  # every test runs programs (equivalence_runner)


def _final_scale(record: dict) -> str:
    return next(line for line in record["stdout"].splitlines() if line.startswith("final loss scale"))


@pytest.mark.parametrize("case_id", ["fp16-optimizer-static", "fp16-optimizer-dynamic-overflow"])
def test_fp16_optimizer_flow_ends_at_apex_loss_scale(equivalence_runner, case_id):
    case = BY_ID[case_id]
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    assert _final_scale(native) == _final_scale(shim)
    assert skipped(native) == skipped(shim)


def test_dynamic_fp16_optimizer_skips_the_overflowing_step_in_both_runs(equivalence_runner):
    case = BY_ID["fp16-optimizer-dynamic-overflow"]
    shim, native = equivalence_runner.get(case, "shim"), equivalence_runner.get(case, "native")
    assert skipped(shim) == skipped(native) == [(9, 0)]
    assert "Gradient overflow.  Skipping step, reducing loss scale to" in shim["stdout"]
    assert [s[0] for s in native["scales"][8:11]] == [2048.0, 1024.0, 1024.0]
