"""The verdict on two recorded runs (amp_migrate/runs/compare.py), on records made by hand."""

from __future__ import annotations

import math

import pytest

from amp_migrate.runs.compare import (
    AMP_NEVER_RAN,
    AS_DOCUMENTED,
    DIVERGED,
    FAILED,
    IDENTICAL,
    NO_STEPS,
    PRECISION_RTOL,
    STEP_COUNTS,
    WITHIN_TOLERANCE,
    Run,
    failed_before_first_step,
    judge,
    relative_difference,
    same_bits,
)


def record(loss=1.5, scale=65536.0, skipped=False, grad_norm=0.75, param_sum=3.25, optimizer=0, losses=None):
    return {
        "optimizer": optimizer,
        "skipped": skipped,
        "losses": [loss] if losses is None else losses,
        "scales": [scale],
        "grad_norm": None if skipped else grad_norm,
        "param_sum": param_sum,
        "param_abs_sum": abs(param_sum) + 1.0,
    }


def steps(n=3, **changes_at):
    """n records; changes_at={"2": {...}} changes step 2 (1-based)."""
    return [record(**{"param_sum": 3.25 + i, **changes_at.get(str(i + 1), {})}) for i in range(n)]


def runs(shim_records, native_records, shim_exit=0, native_exit=0, native_stderr=""):
    return Run("shim", shim_exit, shim_records), Run("native", native_exit, native_records, native_stderr)


def test_equal_records_are_identical_and_pass():
    verdict = judge(*runs(steps(), steps()))
    assert verdict.kind == IDENTICAL and verdict.passed
    assert verdict.divergence is None
    assert set(verdict.max_relative.values()) == {0.0}


def test_non_finite_losses_recorded_alike_are_identical():
    shim = steps(2, **{"1": {"loss": "inf", "skipped": True}, "2": {"loss": "nan", "skipped": True}})
    native = steps(2, **{"1": {"loss": "inf", "skipped": True}, "2": {"loss": "nan", "skipped": True}})
    assert judge(*runs(shim, native)).kind == IDENTICAL


def test_a_last_bit_difference_diverges_without_tolerance():
    loss = 1.5
    nudged = math.nextafter(loss, 2.0)
    verdict = judge(*runs(steps(3), steps(3, **{"2": {"loss": nudged}})))
    assert verdict.kind == DIVERGED and not verdict.passed
    assert (verdict.divergence.step, verdict.divergence.quantity) == (2, "losses")
    assert verdict.divergence.shim == [loss] and verdict.divergence.native == [nudged]
    assert verdict.message.startswith("diverged at step 2: losses")


def test_differences_within_rtol_pass_and_report_the_largest_per_quantity():
    native = steps(
        3, **{"1": {"loss": 1.5 * (1 + 1e-4)}, "3": {"loss": 1.5 * (1 - 3e-4), "grad_norm": 0.7501}}
    )
    verdict = judge(*runs(steps(3), native), rtol=1e-3)
    assert verdict.kind == WITHIN_TOLERANCE and verdict.passed
    assert verdict.max_relative["losses"] == pytest.approx(3e-4, rel=1e-3)
    assert verdict.max_relative["grad_norm"] == pytest.approx(1e-4 / 0.7501, rel=1e-3)
    assert verdict.max_relative["param_sum"] == 0.0
    assert "losses 0.0003" in verdict.message


def test_a_difference_over_rtol_names_the_step_quantity_and_values():
    native = steps(4, **{"3": {"param_sum": 5.25 * 1.01}})  # step 3's param_sum is 3.25 + 2
    verdict = judge(*runs(steps(4), native), rtol=1e-3)
    assert verdict.kind == DIVERGED
    d = verdict.divergence
    assert (d.step, d.quantity, d.shim, d.native) == (3, "param_sum", 5.25, 5.25 * 1.01)


def test_a_skipped_flag_mismatch_diverges_even_when_every_value_matches():
    shim = [record(), record(skipped=True, grad_norm=None)]
    native = [record(), {**record(skipped=True), "skipped": False}]
    verdict = judge(*runs(shim, native), rtol=1.0)
    assert verdict.kind == DIVERGED
    assert (verdict.divergence.step, verdict.divergence.quantity) == (2, "skipped")
    assert (verdict.divergence.shim, verdict.divergence.native) == (True, False)


def test_a_different_number_of_losses_diverges_even_with_a_large_tolerance():
    native = steps(2, **{"2": {"losses": [1.5, 1.5]}})
    verdict = judge(*runs(steps(2), native), rtol=10.0)
    assert verdict.kind == DIVERGED
    assert (verdict.divergence.step, verdict.divergence.quantity) == (2, "number of losses")


def test_a_different_optimizer_diverges():
    verdict = judge(*runs(steps(2), steps(2, **{"1": {"optimizer": 1}})), rtol=1.0)
    assert (verdict.kind, verdict.divergence.quantity, verdict.divergence.step) == (DIVERGED, "optimizer", 1)


def test_a_grad_norm_in_one_run_only_diverges():
    native = [record(), {**record(), "grad_norm": None}]
    verdict = judge(*runs([record(), record()], native), rtol=1.0)
    assert (verdict.kind, verdict.divergence.quantity) == (DIVERGED, "grad_norm")


def test_runs_of_different_lengths_never_pass():
    verdict = judge(*runs(steps(3), steps(5)))
    assert verdict.kind == STEP_COUNTS and not verdict.passed
    assert "shim 3, native 5" in verdict.message


def test_a_divergence_inside_the_common_steps_is_reported_before_the_length():
    verdict = judge(*runs(steps(3), steps(5, **{"2": {"loss": 2.0}})))
    assert (verdict.kind, verdict.divergence.step) == (DIVERGED, 2)


@pytest.mark.parametrize(
    "shim_records, native_records, expected",
    [
        ([], [], "neither run recorded an optimizer step"),
        ([record()], [], "the native run recorded no optimizer step"),
        ([], [record()], "the shim run recorded no optimizer step"),
    ],
)
def test_a_run_without_steps_never_passes(shim_records, native_records, expected):
    verdict = judge(*runs(shim_records, native_records))
    assert (verdict.kind, verdict.message, verdict.passed) == (NO_STEPS, expected, False)


def test_a_failed_run_never_passes_even_with_matching_records():
    verdict = judge(*runs(steps(2), steps(2), native_exit=1, native_stderr="Traceback ...\nKeyError: 'x'"))
    assert (verdict.kind, verdict.message, verdict.passed) == (
        FAILED,
        "the native run failed (exit 1)",
        False,
    )


def test_a_failed_run_still_points_at_the_step_where_the_runs_first_differed():
    native = steps(1, **{"1": {"scale": 65536.0}})
    verdict = judge(*runs(steps(2, **{"1": {"scale": 32768.0}}), native, native_exit=1))
    assert verdict.kind == FAILED and not verdict.passed
    assert (verdict.divergence.step, verdict.divergence.quantity) == (1, "scales")
    assert verdict.message == (
        "the native run failed (exit 1); the runs had already diverged at step 1: "
        "scales shim [32768.0], native [65536.0]"
    )


def test_both_runs_failing_names_both():
    verdict = judge(*runs([], [], shim_exit=2, native_exit=1))
    assert verdict.message == "the shim run failed (exit 2); the native run failed (exit 1)"


def test_bit_equality_tells_signed_zeros_apart_and_nans_alike():
    assert same_bits(float("nan"), float("nan"))
    assert not same_bits(0.0, -0.0)
    assert not same_bits(1.0, math.nextafter(1.0, 2.0))


def test_relative_difference_of_a_finite_and_a_non_finite_value_is_infinite():
    assert relative_difference(1.0, math.inf) == math.inf
    assert relative_difference(float("nan"), 1.0) == math.inf
    assert relative_difference(2.0, 1.0) == 0.5
    assert relative_difference(0.0, 0.0) == 0.0


def with_scales(records, *scales_per_step):
    return [dict(r, scales=list(s)) for r, s in zip(records, scales_per_step)]


def test_loss_scales_of_runs_with_as_many_scalers_are_compared():
    shim = with_scales(steps(2), [65536.0], [65536.0])
    native = with_scales(steps(2), [65536.0], [32768.0])
    verdict = judge(*runs(shim, native))
    assert (
        verdict.kind == DIVERGED and verdict.divergence.step == 2 and verdict.divergence.quantity == "scales"
    )


@pytest.mark.parametrize(
    "shim_scales, native_scales",
    [
        ([65536.0, 65536.0, 65536.0], [65536.0]),  # Apex's one scaler per loss, one GradScaler
        ([1.0], []),  # Apex O0's constant scale, a disabled GradScaler
        ([65536.0], [65536.0, 65536.0]),  # only the newest `initialize`'s, one GradScaler each
    ],
)
def test_loss_scales_of_runs_keeping_different_numbers_of_scalers_are_noted_not_compared(
    shim_scales, native_scales
):
    shim = with_scales(steps(3), [65536.0], shim_scales, shim_scales)
    native = with_scales(steps(3), [65536.0], native_scales, native_scales)
    verdict = judge(*runs(shim, native))
    assert verdict.kind == IDENTICAL and verdict.passed
    assert len(verdict.notes) == 1 and verdict.notes[0].startswith("loss scales not compared from step 2")


def test_different_numbers_of_scalers_do_not_hide_a_difference_in_what_training_does():
    shim = with_scales(steps(2), [65536.0, 65536.0], [65536.0, 65536.0])
    native = with_scales(steps(2, **{"2": {"grad_norm": 0.5}}), [65536.0], [65536.0])
    verdict = judge(*runs(shim, native))
    assert verdict.kind == DIVERGED and verdict.divergence.quantity == "grad_norm"


def test_a_static_scale_applying_an_overflowed_step_is_the_documented_difference():
    shim = steps(4, **{"3": {"grad_norm": "inf"}, "4": {"loss": "nan"}})
    native = steps(4, **{"3": {"skipped": True}})
    verdict = judge(*runs(shim, native))
    assert verdict.kind == AS_DOCUMENTED and verdict.passed
    assert verdict.divergence.step == 3
    assert "AMP111" in verdict.message and "2 steps before it are equal bit for bit" in verdict.message


def test_a_skip_in_the_migration_where_the_legacy_gradients_were_finite_diverges():
    verdict = judge(*runs(steps(3), steps(3, **{"2": {"skipped": True}})))
    assert verdict.kind == DIVERGED and verdict.divergence.quantity == "skipped"


def test_a_legacy_run_in_another_precision_is_judged_within_the_precision_tolerance_by_default():
    nudged = 1.5 * (1 + PRECISION_RTOL / 2)
    shim = Run("shim", 0, steps(3), precision=("O3 steps float16 weights",))
    verdict = judge(shim, Run("native", 0, steps(3, **{"2": {"loss": nudged}})))
    assert verdict.kind == WITHIN_TOLERANCE and "expected: O3 steps float16 weights" in verdict.message
    assert any("another precision" in note for note in verdict.notes)


def test_a_given_rtol_overrides_the_precision_tolerance():
    nudged = 1.5 * (1 + PRECISION_RTOL / 2)
    shim = Run("shim", 0, steps(3), precision=("O3 steps float16 weights",))
    verdict = judge(shim, Run("native", 0, steps(3, **{"2": {"loss": nudged}})), rtol=0.0)
    assert verdict.kind == DIVERGED


def test_without_another_precision_the_default_is_bit_for_bit():
    nudged = math.nextafter(1.5, 2.0)
    assert judge(*runs(steps(3), steps(3, **{"2": {"loss": nudged}}))).kind == DIVERGED


def test_a_legacy_run_with_no_amp_call_never_passes():
    shim = Run("shim", 0, steps(3), amp_calls={"amp.state_dict": 1})
    verdict = judge(shim, Run("native", 0, steps(3)))
    assert verdict.kind == AMP_NEVER_RAN and not verdict.passed
    assert verdict.message.startswith("amp never ran in the legacy run")
    assert "the migration was not exercised" in verdict.message
    assert "identical: 3 steps equal bit for bit" in verdict.message


def test_allow_no_amp_passes_a_run_with_no_amp_call_and_says_so():
    shim = Run("shim", 0, steps(3), amp_calls={})
    verdict = judge(shim, Run("native", 0, steps(3)), allow_no_amp=True)
    assert verdict.kind == IDENTICAL and verdict.passed
    assert any("amp never ran" in note and "--allow-no-amp" in note for note in verdict.notes)


@pytest.mark.parametrize(
    "call",
    ["amp.initialize", "amp.scale_loss", "amp optimizer.step", "FP16_Optimizer.step", "OptimWrapper.step"],
)
def test_any_amp_call_in_the_legacy_run_lets_it_pass(call):
    shim = Run("shim", 0, steps(3), amp_calls={call: 1})
    assert judge(shim, Run("native", 0, steps(3))).kind == IDENTICAL


def test_only_the_legacy_run_counts_for_amp_having_run():
    # A copy kept on the shim makes amp calls of its own: they do not make up for the original's.
    shim = Run("shim", 0, steps(3), amp_calls={})
    native = Run("native", 0, steps(3), amp_calls={"amp.initialize": 1, "amp.scale_loss": 3})
    assert judge(shim, native).kind == AMP_NEVER_RAN


def test_a_divergence_without_amp_stays_a_divergence_with_a_note():
    shim = Run("shim", 0, steps(3), amp_calls={})
    verdict = judge(shim, Run("native", 0, steps(3, **{"2": {"param_sum": 9.0}})))
    assert verdict.kind == DIVERGED
    assert any("amp never ran" in note for note in verdict.notes)


def test_a_legacy_run_that_failed_before_its_first_step_reports_the_migrated_run_not_started():
    shim = Run("shim", 1, (), "RuntimeError: no data", amp_calls={})
    verdict = judge(shim, Run("native", 0, started=False))
    assert verdict.kind == FAILED
    assert verdict.message == (
        "the legacy run (shim) failed (exit 1) before its first step; the migrated run was not started"
    )
    assert verdict.notes == ()
    assert failed_before_first_step(shim)
    assert not failed_before_first_step(Run("shim", 1, steps(1)))
    assert not failed_before_first_step(Run("shim", 0, ()))


# -- documented differences of unsafe fixes (docs/differences.md, "Unsafe fixes") ----------------

from amp_migrate.differences import SCALE_UPDATED_PER_STEP  # noqa: E402

SCALES_APART = {"3": {"scale": 32768.0}, "4": {"scale": 32768.0}}


def test_scales_apart_as_entry_u1_allows_differ_as_documented_naming_the_entry_and_size():
    shim, native = steps(5), steps(5, **SCALES_APART)
    verdict = judge(*runs(shim, native), documented=(SCALE_UPDATED_PER_STEP,))
    assert verdict.kind == AS_DOCUMENTED and verdict.passed
    assert "entry U1" in verdict.message and "at 2 of 5 steps (from step 3)" in verdict.message
    assert verdict.max_relative["scales"] == 0.5
    assert "every other quantity is equal bit for bit" in verdict.message


def test_the_same_scales_apart_without_the_entry_are_a_divergence():
    verdict = judge(*runs(steps(5), steps(5, **SCALES_APART)))
    assert (
        verdict.kind == DIVERGED and verdict.divergence.step == 3 and verdict.divergence.quantity == "scales"
    )


def test_an_entry_covers_only_its_quantities_a_skip_or_a_weight_apart_still_diverges():
    skip = steps(5, **{**SCALES_APART, "4": {"scale": 32768.0, "skipped": True}})
    verdict = judge(*runs(steps(5), skip), documented=(SCALE_UPDATED_PER_STEP,))
    assert (
        verdict.kind == DIVERGED and verdict.divergence.step == 4 and verdict.divergence.quantity == "skipped"
    )
    weights = steps(5, **{**SCALES_APART, "5": {"param_sum": 9.0}})
    verdict = judge(*runs(steps(5), weights), documented=(SCALE_UPDATED_PER_STEP,))
    assert verdict.kind == DIVERGED and verdict.divergence.quantity == "param_sum"


def test_with_the_entry_and_nothing_apart_the_runs_are_identical():
    verdict = judge(*runs(steps(4), steps(4)), documented=(SCALE_UPDATED_PER_STEP,))
    assert verdict.kind == IDENTICAL


# -- an entry measured from an event of the legacy run (U2: a clipping that acted mid-window) ----

from amp_migrate.differences import CLIPPED_ONCE_PER_STEP  # noqa: E402


def _partial_clip_at(step: int, n: int = 5) -> list:
    legacy = steps(n)
    legacy[step - 1]["events"] = ["partial_clip"]
    return legacy


def test_weights_apart_from_the_legacy_runs_partial_clipping_on_differ_as_documented_from_there():
    native = steps(5, **{"3": {"param_sum": 9.0}, "5": {"param_sum": 7.0, "grad_norm": 0.5}})
    verdict = judge(*runs(_partial_clip_at(3), native), documented=(CLIPPED_ONCE_PER_STEP,))
    assert verdict.kind == AS_DOCUMENTED, verdict.message
    assert "entry U2" in verdict.message and "from step 3, where the legacy run's clipping" in verdict.message
    assert "param_sum differ at 2 of 5 steps (from step 3)" in verdict.message


def test_weights_apart_before_the_event_still_diverge_and_an_entry_never_covers_a_skip():
    native = steps(5, **{"2": {"param_sum": 9.0}})
    verdict = judge(*runs(_partial_clip_at(3), native), documented=(CLIPPED_ONCE_PER_STEP,))
    assert verdict.kind == DIVERGED and verdict.divergence.step == 2, verdict.message
    skipped = steps(5, **{"4": {"skipped": True}})
    verdict = judge(*runs(_partial_clip_at(3), skipped), documented=(CLIPPED_ONCE_PER_STEP,))
    assert verdict.kind == DIVERGED and verdict.divergence.quantity == "skipped", verdict.message


def test_without_the_event_the_entry_measured_from_it_waives_nothing():
    native = steps(5, **{"4": {"param_sum": 9.0}})
    verdict = judge(*runs(steps(5), native), documented=(CLIPPED_ONCE_PER_STEP,))
    assert verdict.kind == DIVERGED and verdict.divergence.step == 4, verdict.message
