"""The documented differences of the unsafe tier: native rewrites a careful engineer makes by
hand whose behaviour differs from Apex's in one stated way.

ruff separates safe fixes from unsafe ones; so does the codemod. A safe rewrite is the Apex
program bit for bit (at O0/O1), so the default output never changes behaviour. An unsafe one
is applied only with `--unsafe-fixes`; its diagnostic names an entry here, docs/differences.md
lists each entry (generated from this module by `python -m amp_migrate.docs`), and
`amp-migrate verify` accepts, in a migration that applied it, exactly the quantities the entry
says may differ ("differs as documented", with the size it measured) and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    id: str
    title: str
    rule: str  # the rule class whose rewrite differs
    codes: tuple[str, ...]  # the diagnostics that report the rewrite
    what: str  # what changes
    when: str  # when it shows
    size: str  # how large it can be
    #: The recorded quantities (runs/compare.py) a verify run may find different; a difference
    #: in any other (skips, losses, parameters) stays a divergence.
    quantities: tuple[str, ...]
    #: Where set, the quantities may differ only from the first step whose legacy record has
    #: this event (the recorder notes it); before it the runs must agree.
    from_event: str = ""


DIFFERENCES: dict[str, Difference] = {}


def document(difference: Difference) -> Difference:
    if difference.id in DIFFERENCES:
        raise ValueError(f"documented difference {difference.id} defined twice")
    DIFFERENCES[difference.id] = difference
    return difference


SCALE_UPDATED_PER_STEP = document(
    Difference(
        id="U1",
        title="the loss scale is updated once per optimizer step, not at every `scale_loss` exit",
        rule="PlanTraining",
        codes=("AMP215", "AMP216"),
        what=(
            "Apex's dynamic loss scaler checked the gradients for overflow and updated its scale at "
            "every `scale_loss` exit (without `delay_unscale`). The native rewrite keeps the "
            "gradients scaled until the step: `scaler.step` checks them once and `scaler.update()` "
            "updates the scale once per optimizer step."
        ),
        when=(
            "With k > 1 `scale_loss` exits per optimizer step: micro-batches of an accumulation "
            "window without `delay_unscale` (AMP215), or several losses scaled before one step "
            "(AMP216). Apex's scale doubled after 2000 exits without overflow (2000/k steps), the "
            "GradScaler's doubles after 2000 steps; two overflowing exits in one step halved Apex's "
            "scale twice, the GradScaler's once; after an overflowing exit, the scale read before "
            "the step (a log line) is Apex's halved one and the GradScaler's unchanged one."
        ),
        size=(
            "The loss scales differ by a power of two (the losses, the steps taken and skipped, "
            "and the parameters are the same while they do). A step whose scaled gradients "
            "overflow under one run's scale and not the other's is skipped in one run only; from "
            "then on the parameters differ by that step's update, and verify reports the runs as "
            "diverged at that step."
        ),
        quantities=("scales",),
    )
)


CLIPPED_ONCE_PER_STEP = document(
    Difference(
        id="U2",
        title="`amp.master_params` is clipped once per optimizer step, not after every micro-batch",
        rule="MasterParamsUnscale",
        codes=("AMP302",),
        what=(
            "Apex unscaled the gradients at every `scale_loss` exit, and the loop clipped "
            "`amp.master_params(opt)` after every micro-batch of an accumulation window: the partially "
            "accumulated gradients, each partial sum scaled down to the threshold where its norm exceeded "
            "it, the later micro-batches added at full size. The native rewrite moves the clipping under "
            "the step's condition, after `scaler.unscale_(opt)`, right before `scaler.step(opt)`: the "
            "window's whole accumulated gradient is clipped once."
        ),
        when=(
            "In a window where the norm of a partial sum exceeded the threshold before the window's last "
            "micro-batch. Never with accumulation 1 (the step runs every iteration), nor in windows whose "
            "partial sums all stayed under the threshold: clipping then multiplies by exactly 1, and the "
            "last micro-batch's clipping is the native one. With `delay_unscale=True` before the last "
            "micro-batch, Apex clipped still-scaled partial sums, which almost always exceed it."
        ),
        size=(
            "From the first such window on, the gradients the step uses differ (the clipped partial sums "
            "against one clipping of the whole sum), so the parameters, the later losses and gradient "
            "norms differ; their size depends on how far the partial norms exceeded the threshold. "
            "Skipped steps and loss scales are not changed by it."
        ),
        quantities=("losses", "grad_norm", "param_sum", "param_abs_sum"),
        from_event="partial_clip",
    )
)


def for_codes(codes) -> tuple[Difference, ...]:
    """The entries that applied unsafe fixes of these codes name, in id order."""
    wanted = set(codes)
    return tuple(d for d in sorted(DIFFERENCES.values(), key=lambda d: d.id) if wanted & set(d.codes))
