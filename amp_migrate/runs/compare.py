"""The verdict on two recorded training runs: the legacy program through the shim and its
migration run natively, step by step (the recorder's `step_records`).

Pure functions over what the recorder wrote, so that the verdict can be tested on records made
by hand. Nothing here passes a run that failed, that never stepped, or that stepped a different
number of times from the other: a migration is only proven by runs that did the same work.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ..differences import Difference

#: The recorded numbers a tolerance may cover; everything else in a record must match exactly.
QUANTITIES = ("losses", "scales", "grad_norm", "param_sum", "param_abs_sum")

IDENTICAL = "identical"
WITHIN_TOLERANCE = "within tolerance"
AS_DOCUMENTED = "differs as documented"
#: The events of a legacy run's step records (runs/recorder.py) an entry can be measured from.
EVENTS = {"partial_clip": "the legacy run's clipping first acted before the last micro-batch of a window"}
DIVERGED = "diverged"
STEP_COUNTS = "different number of steps"
NO_STEPS = "no steps"
FAILED = "run failed"
AMP_NEVER_RAN = "amp never ran"
#: The runs changed files of the user's tree, which verify must leave as it was.
TREE_CHANGED = "changed your files"
PASSING = (IDENTICAL, WITHIN_TOLERANCE, AS_DOCUMENTED)

#: The tolerance when the legacy run computes in another precision than its migration (its
#: model weights in float16: O3, FP16_Optimizer) and none is given: the project's fixtures at O3
#: and with FP16_Optimizer stay well inside it over their runs (docs/differences.md).
PRECISION_RTOL = 5e-2

#: The recorder's counts ("amp_calls") that show Apex's amp at work in the legacy run: its
#: initialize and scale_loss, the step amp.initialize patches onto an optimizer, the old API's
#: handle and OptimWrapper, FP16_Optimizer's backward and step. amp.state_dict and the like alone
#: exercise none of what a migration rewrites.
AMP_RAN = (
    "amp.initialize",
    "amp.scale_loss",
    "amp.init",
    "amp optimizer.step",
    "OptimWrapper.scale_loss",
    "OptimWrapper.step",
    "FP16_Optimizer.backward",
    "FP16_Optimizer.step",
)

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Run:
    """One run as the verdict needs it: how the process ended and what the recorder wrote."""

    mode: str  # "shim" (the original program) or "native" (the migrated copy)
    exit_code: int
    records: Sequence[Record] = ()
    stderr: str = ""
    # Why the legacy run computes in another precision than native autocast (the recorder's
    # `precision`, shim runs only): O3's float16 weights, FP16_Optimizer.
    precision: tuple[str, ...] = ()
    # Per record, [call, file, line] of the amp calls made for it (the recorder's "step_calls").
    calls: Sequence[Sequence[Any]] = ()
    # How often each amp call ran over the whole run (the recorder's "amp_calls", shim mode);
    # None where nothing counted them (records made by hand).
    amp_calls: Optional[Mapping[str, int]] = None
    # False: verify never started this run (the legacy run had failed before its first step).
    started: bool = True
    # The watched lines that executed, per file (the recorder's "executed_lines": verify's
    # migrated run, for the coverage of the migration's statements); None: not watched.
    executed: Optional[Mapping[str, Sequence[int]]] = None


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
    # What the verdict did not compare, and why (loss scales where the runs keep different
    # numbers of scalers).
    notes: tuple[str, ...] = ()

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
    backwards, and whether a grad norm was taken."""
    for key in ("optimizer", "skipped"):
        if shim.get(key) != native.get(key):
            return Divergence(step, key, shim.get(key), native.get(key))
    a, b = list(shim.get("losses") or ()), list(native.get("losses") or ())
    if len(a) != len(b):
        return Divergence(step, "number of losses", len(a), len(b))
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


def scales_comparable(shim: Record, native: Record) -> bool:
    """Loss scales are compared where both runs keep as many scalers. Apex keeps one per loss
    (`num_losses`) and only the newest `initialize`'s, at O0 a constant 1; a migration may keep
    one GradScaler for all losses, one per `initialize`, or a disabled one (no loss scale at
    all): the scale is a means, and what it does shows in the skips, losses, grads and weights."""
    return len(shim.get("scales") or ()) == len(native.get("scales") or ())


def _compared(shim: Record, native: Record) -> tuple[str, ...]:
    return QUANTITIES if scales_comparable(shim, native) else tuple(q for q in QUANTITIES if q != "scales")


def step_differences(shim: Record, native: Record) -> dict[str, float]:
    """Each compared quantity's largest relative difference within one step (records of the same
    shape; 0.0 for the scales where they are not comparable)."""
    compared = _compared(shim, native)
    return {
        q: max((relative_difference(a, b) for a, b in zip(_values(shim, q), _values(native, q))), default=0.0)
        if q in compared
        else 0.0
        for q in QUANTITIES
    }


def _step_identical(shim: Record, native: Record, besides: frozenset = frozenset()) -> bool:
    """Every compared quantity but `besides` bit-equal in one step."""
    return all(
        same_bits(a, b)
        for q in _compared(shim, native)
        if q not in besides
        for a, b in zip(_values(shim, q), _values(native, q))
    )


def overflow_applied(shim: Record, native: Record) -> bool:
    """The one documented difference a migration makes on purpose (AMP111): on a step whose
    gradients are not finite, a static Apex loss scale applies the step, GradScaler skips it."""
    norm = shim.get("grad_norm")
    return (
        shim.get("skipped") is False
        and native.get("skipped") is True
        and norm is not None
        and not math.isfinite(as_float(norm))
    )


def amp_ran(run: Run) -> Optional[bool]:
    """Whether any of Apex's amp calls ran in `run` (None: not counted)."""
    if run.amp_calls is None:
        return None
    return any(run.amp_calls.get(name, 0) > 0 for name in AMP_RAN)


def with_tree_changes(verdict: Verdict, changed: Sequence[str]) -> Verdict:
    """The verdict on runs that changed the user's files (each named with how): an error,
    whatever the runs compared like, which the message still says."""
    return dataclasses.replace(
        verdict,
        kind=TREE_CHANGED,
        message=f"the runs changed {len(changed)} file(s) of your tree, which verify must leave as it "
        f"was (nothing was restored): {', '.join(changed)}; the runs themselves: {verdict.message}",
    )


def failed_before_first_step(run: Run) -> bool:
    """A run that failed without recording a step: there is nothing to compare a second run
    with, so verify does not start one."""
    return run.exit_code != 0 and not run.records


def _not_started(shim: Run) -> str:
    return (
        f"the legacy run ({shim.mode}) failed (exit {shim.exit_code}) before its first step; "
        "the migrated run was not started"
    )


def _failure(shim: Run, native: Run) -> Optional[Verdict]:
    if not native.started:
        return Verdict(FAILED, _not_started(shim))
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


@dataclass
class _Steps:
    """The steps both runs recorded, compared: the first divergence, if any, and up to it the
    largest relative difference per quantity and whether every value was bit-equal; the step
    where a static scale's overflow made the documented difference, after which nothing is
    compared; the first step whose loss scales were not comparable."""

    divergence: Optional[Divergence] = None
    largest: dict[str, float] = field(default_factory=lambda: dict.fromkeys(QUANTITIES, 0.0))
    identical: bool = True
    documented: Optional[Divergence] = None
    scales_apart: Optional[Divergence] = None
    #: Quantity -> the steps where it differed beyond the tolerance, as a documented difference
    #: of the migration's unsafe fixes allows (docs/differences.md).
    waived: dict[str, list[int]] = field(default_factory=dict)
    #: Entry id -> the step from which an entry measured from an event of the legacy run applies.
    since: dict[str, int] = field(default_factory=dict)


def _compare_steps(
    shim: Sequence[Record], native: Sequence[Record], rtol: float, documented: Sequence[Difference] = ()
) -> _Steps:
    steps = _Steps()
    allowed = frozenset(q for entry in documented if not entry.from_event for q in entry.quantities)
    for index, (a, b) in enumerate(zip(shim, native)):
        step = index + 1
        for entry in documented:  # an entry that shows from an event of the legacy run on
            if (
                entry.from_event
                and entry.from_event in (a.get("events") or ())
                and entry.id not in steps.since
            ):
                steps.since[entry.id] = step
                allowed |= frozenset(entry.quantities)
        if overflow_applied(a, b):
            steps.documented = Divergence(step, "skipped", False, True)
            return steps
        structural = _structure(step, a, b)
        if structural is not None:
            steps.divergence, steps.identical = structural, False
            return steps
        if steps.scales_apart is None and not scales_comparable(a, b):
            steps.scales_apart = Divergence(step, "number of scales", len(a["scales"]), len(b["scales"]))
        for quantity, difference in step_differences(a, b).items():
            steps.largest[quantity] = max(steps.largest[quantity], difference)
            if difference > rtol and quantity in allowed:
                steps.waived.setdefault(quantity, []).append(step)
            elif difference > 0 and quantity in allowed:
                steps.identical = False
            elif difference > rtol:
                steps.divergence = Divergence(step, quantity, a.get(quantity), b.get(quantity))
                steps.identical = False
                return steps
        steps.identical = steps.identical and _step_identical(a, b, allowed)
    return steps


def judge(
    shim: Run,
    native: Run,
    rtol: Optional[float] = None,
    allow_no_amp: bool = False,
    documented: Sequence[Difference] = (),
) -> Verdict:
    """The verdict of `compare_runs`, unless no amp call ran in the legacy run (`shim`): then
    the runs prove nothing about the migration, whose statements replace those calls, and a
    passing comparison is the "amp never ran" verdict; with `allow_no_amp` it stays a pass,
    with a note saying so. A verdict that does not pass keeps its kind, with the note."""
    verdict = compare_runs(shim, native, rtol, documented)
    if amp_ran(shim) is not False or not native.started:
        return verdict
    never = (
        "amp never ran in the legacy run (no amp.initialize, amp.scale_loss, amp or FP16_Optimizer "
        "step), so the migration was not exercised"
    )
    if verdict.passed and not allow_no_amp:
        message = f"{never}; the runs agree ({verdict.message}), which proves nothing about the migration"
        return dataclasses.replace(verdict, kind=AMP_NEVER_RAN, message=message)
    note = f"{never} (accepted by --allow-no-amp)" if verdict.passed else never
    return dataclasses.replace(verdict, notes=(*verdict.notes, note))


def compare_runs(
    shim: Run, native: Run, rtol: Optional[float] = None, documented: Sequence[Difference] = ()
) -> Verdict:
    """The verdict on a shim run and a native run of the same program.

    A step diverges when its structure differs (optimizer, skipped flag, number of losses, a
    grad norm in one run only) or when a quantity differs by more than the tolerance relative;
    the first such step is reported. Steps agree bit for bit: identical; within the tolerance:
    within tolerance, with the largest difference per quantity and why a difference was expected.
    The tolerance is `rtol`, or where none is given 0 (bit for bit) unless the legacy run
    computes in another precision (`PRECISION_RTOL`). A static scale's overflowed step is the
    documented difference, not a divergence; so are the quantities that the docs/differences.md
    entries of the migration's unsafe fixes (`documented`) say may differ, and only those. A
    failed run is reported as failed, with the divergence its steps show before it failed, if
    any."""
    tolerance = rtol if rtol is not None else PRECISION_RTOL if shim.precision else 0.0
    steps = _compare_steps(shim.records, native.records, tolerance, documented)
    notes = _notes(steps, shim)
    failure = _failure(shim, native)
    if failure is not None:
        if failure.kind == FAILED and steps.divergence is not None:
            message = f"{failure.message}; the runs had already {_diverged_message(steps.divergence)}"
            return Verdict(FAILED, message, steps.divergence, steps.largest, notes)
        return Verdict(failure.kind, failure.message, None, steps.largest, notes)
    if steps.divergence is not None:
        return Verdict(DIVERGED, _diverged_message(steps.divergence), steps.divergence, steps.largest, notes)
    counts = len(shim.records), len(native.records)
    if steps.documented is not None:
        return Verdict(AS_DOCUMENTED, _documented_message(steps), steps.documented, steps.largest, notes)
    if counts[0] != counts[1]:
        message = (
            f"the runs recorded a different number of steps (shim {counts[0]}, native {counts[1]}); "
            f"the first {min(counts)} agree"
        )
        return Verdict(STEP_COUNTS, message, None, steps.largest, notes)
    if steps.waived:
        message = _waived_message(steps, documented, counts[0], tolerance)
        return Verdict(AS_DOCUMENTED, message, None, steps.largest, notes)
    if steps.identical:
        message = f"identical: {counts[0]} steps equal bit for bit"
        return Verdict(IDENTICAL, message, None, steps.largest, notes)
    worst = ", ".join(f"{q} {d:.3g}" for q, d in steps.largest.items() if d > 0)
    message = (
        f"within tolerance (rtol {tolerance:g}) over {counts[0]} steps; largest relative differences: {worst}"
    )
    if shim.precision:
        message += "; expected: " + "; ".join(shim.precision)
    return Verdict(WITHIN_TOLERANCE, message, None, steps.largest, notes)


def _notes(steps: _Steps, shim: Run) -> tuple[str, ...]:
    notes = []
    apart = steps.scales_apart
    if apart is not None:
        notes.append(
            f"loss scales not compared from step {apart.step}, where the legacy run keeps {apart.shim} "
            f"loss scaler(s) and the migration {apart.native} (Apex keeps one per loss and only the newest "
            "`initialize`'s, at O0 a constant 1; a disabled GradScaler keeps none): the skips, losses, "
            "grads and weights are compared"
        )
    if shim.precision:
        notes.append("the legacy run computes in another precision: " + "; ".join(shim.precision))
    return tuple(notes)


def _documented_message(steps: _Steps) -> str:
    assert steps.documented is not None
    step = steps.documented.step
    before = "equal bit for bit" if steps.identical else "within tolerance"
    return (
        f"differs as documented from step {step}: its gradients were not finite; the legacy program's "
        "static loss scale applies such a step (Apex), the migration's GradScaler skips it and lowers "
        f"its scale (AMP111); the {step - 1} steps before it are {before}, the runs are not compared after it"
    )


def _waived_message(steps: _Steps, documented: Sequence[Difference], count: int, tolerance: float) -> str:
    """Which entry, which quantities, how large, on which steps; and that nothing else differed."""
    parts = []
    for quantity, at in steps.waived.items():
        entries = ", ".join(e.id for e in documented if quantity in e.quantities)
        parts.append(
            f"{quantity} differ at {len(at)} of {count} steps (from step {at[0]}), largest relative "
            f"difference {steps.largest[quantity]:.3g} (docs/differences.md entry {entries})"
        )
    titles = "; ".join(
        f"{e.id}: {e.title}"
        + (f", from step {steps.since[e.id]}, where {EVENTS[e.from_event]}" if e.from_event else "")
        for e in documented
        if set(e.quantities) & set(steps.waived)
    )
    rest = "equal bit for bit" if steps.identical else f"within tolerance (rtol {tolerance:g})"
    return f"differs as documented ({titles}): {'; '.join(parts)}; every other quantity is {rest}"


def _diverged_message(divergence: Divergence) -> str:
    return (
        f"diverged at step {divergence.step}: {divergence.quantity} "
        f"shim {divergence.shim!r}, native {divergence.native!r}"
    )


def stderr_tail(text: str, lines: int = 20) -> str:
    """The end of a failed run's stderr: where Python prints the traceback."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
