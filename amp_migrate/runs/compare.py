"""The verdict on two recorded training runs: the legacy program through the shim and its
migration run natively, step by step (the recorder's `step_records`).

Pure functions over what the recorder wrote, so that the verdict can be tested on records made
by hand. Nothing here passes a run that failed, that never stepped, or that stepped a different
number of times from the other: a migration is only proven by runs that did the same work.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

#: The recorded numbers a tolerance may cover; everything else in a record must match exactly.
QUANTITIES = ("losses", "scales", "grad_norm", "param_sum", "param_abs_sum")

IDENTICAL = "identical"
WITHIN_TOLERANCE = "within tolerance"
DIVERGED = "diverged"
STEP_COUNTS = "different number of steps"
NO_STEPS = "no steps"
FAILED = "run failed"
PASSING = (IDENTICAL, WITHIN_TOLERANCE)

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Run:
    """One run as the verdict needs it: how the process ended and what the recorder wrote."""

    mode: str  # "shim" (the original program) or "native" (the migrated copy)
    exit_code: int
    records: Sequence[Record] = ()
    stderr: str = ""
    # Per record, [call, file, line] of the amp calls made for it (the recorder's "step_calls").
    calls: Sequence[Sequence[Any]] = ()


@dataclass(frozen=True)
class Divergence:
    step: int  # 1-based: the first step the program asked for is step 1
    quantity: str
    shim: Any
    native: Any


@dataclass(frozen=True)
class Verdict:
    kind: str
    message: str
    divergence: Optional[Divergence] = None
    # Largest relative difference per quantity over the steps compared (0.0: equal everywhere).
    max_relative: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.kind in PASSING


def as_float(value: Any) -> float:
    """The recorder writes non-finite losses as "inf"/"-inf"/"nan" strings (JSON has no such numbers)."""
    return float(value)


def same_bits(a: float, b: float) -> bool:
    """Bit-for-bit equality of two float64 values; two NaNs count as the same (JSON keeps no payload)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack("<d", a) == struct.pack("<d", b)


def relative_difference(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude; inf when only one is non-finite or they differ in kind."""
    if same_bits(a, b) or a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def _structure(step: int, shim: Record, native: Record) -> Optional[Divergence]:
    """The parts of a step that no tolerance covers: which optimizer, skipped or not, how many
    backwards and scales, and whether a grad norm was taken."""
    for key in ("optimizer", "skipped"):
        if shim.get(key) != native.get(key):
            return Divergence(step, key, shim.get(key), native.get(key))
    for key in ("losses", "scales"):
        a, b = list(shim.get(key) or ()), list(native.get(key) or ())
        if len(a) != len(b):
            return Divergence(step, f"number of {key}", len(a), len(b))
    if (shim.get("grad_norm") is None) != (native.get("grad_norm") is None):
        return Divergence(step, "grad_norm", shim.get("grad_norm"), native.get("grad_norm"))
    return None


def _values(record: Record, quantity: str) -> list[float]:
    value = record.get(quantity)
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [as_float(v) for v in value]
    return [as_float(value)]


def step_differences(shim: Record, native: Record) -> dict[str, float]:
    """Each quantity's largest relative difference within one step (records of the same shape)."""
    return {
        q: max((relative_difference(a, b) for a, b in zip(_values(shim, q), _values(native, q))), default=0.0)
        for q in QUANTITIES
    }


def _step_identical(shim: Record, native: Record) -> bool:
    return all(same_bits(a, b) for q in QUANTITIES for a, b in zip(_values(shim, q), _values(native, q)))


def _failure(shim: Run, native: Run) -> Optional[Verdict]:
    failed = [run for run in (shim, native) if run.exit_code != 0]
    if failed:
        message = "; ".join(f"the {run.mode} run failed (exit {run.exit_code})" for run in failed)
        return Verdict(FAILED, message)
    empty = [run.mode for run in (shim, native) if not run.records]
    if len(empty) == 2:
        return Verdict(NO_STEPS, "neither run recorded an optimizer step")
    if empty:
        return Verdict(NO_STEPS, f"the {empty[0]} run recorded no optimizer step")
    return None


@dataclass(frozen=True)
class _Steps:
    """The steps both runs recorded, compared: the first divergence, if any, and up to it the
    largest relative difference per quantity and whether every value was bit-equal."""

    divergence: Optional[Divergence]
    largest: dict[str, float]
    identical: bool


def _compare_steps(shim: Sequence[Record], native: Sequence[Record], rtol: float) -> _Steps:
    largest = dict.fromkeys(QUANTITIES, 0.0)
    identical = True
    for index, (a, b) in enumerate(zip(shim, native)):
        step = index + 1
        structural = _structure(step, a, b)
        if structural is not None:
            return _Steps(structural, largest, False)
        for quantity, difference in step_differences(a, b).items():
            largest[quantity] = max(largest[quantity], difference)
            if difference > rtol:
                return _Steps(Divergence(step, quantity, a.get(quantity), b.get(quantity)), largest, False)
        identical = identical and _step_identical(a, b)
    return _Steps(None, largest, identical)


def judge(shim: Run, native: Run, rtol: float = 0.0) -> Verdict:
    """The verdict on a shim run and a native run of the same program.

    A step diverges when its structure differs (optimizer, skipped flag, number of losses or
    scales, a grad norm in one run only) or when a quantity differs by more than `rtol`
    relative; the first such step is reported. Steps agree bit for bit: identical; within
    `rtol`: within tolerance, with the largest difference per quantity. A failed run is
    reported as failed, with the divergence its steps show before it failed, if any."""
    steps = _compare_steps(shim.records, native.records, rtol)
    failure = _failure(shim, native)
    if failure is not None:
        if failure.kind == FAILED and steps.divergence is not None:
            message = f"{failure.message}; the runs had already {_diverged_message(steps.divergence)}"
            return Verdict(FAILED, message, steps.divergence, steps.largest)
        return Verdict(failure.kind, failure.message, None, steps.largest)
    if steps.divergence is not None:
        return Verdict(DIVERGED, _diverged_message(steps.divergence), steps.divergence, steps.largest)
    counts = len(shim.records), len(native.records)
    if counts[0] != counts[1]:
        message = (
            f"the runs recorded a different number of steps (shim {counts[0]}, native {counts[1]}); "
            f"the first {min(counts)} agree"
        )
        return Verdict(STEP_COUNTS, message, None, steps.largest)
    if steps.identical:
        return Verdict(IDENTICAL, f"identical: {counts[0]} steps equal bit for bit", None, steps.largest)
    worst = ", ".join(f"{q} {d:.3g}" for q, d in steps.largest.items() if d > 0)
    message = (
        f"within tolerance (rtol {rtol:g}) over {counts[0]} steps; largest relative differences: {worst}"
    )
    return Verdict(WITHIN_TOLERANCE, message, None, steps.largest)


def _diverged_message(divergence: Divergence) -> str:
    return (
        f"diverged at step {divergence.step}: {divergence.quantity} "
        f"shim {divergence.shim!r}, native {divergence.native!r}"
    )


def stderr_tail(text: str, lines: int = 20) -> str:
    """The end of a failed run's stderr: where Python prints the traceback."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
