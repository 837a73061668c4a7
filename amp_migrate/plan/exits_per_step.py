"""How many times Apex updated a loss scale per optimizer step: the planner's check for the one
place where GradScaler's recipe is not Apex's step for step.

Without `delay_unscale`, every `scale_loss` exit unscaled the gradients, checked them for
overflow and updated that loss's scaler. GradScaler checks once, at `scaler.step`, and updates
once, at `scaler.update()`. The two agree exactly when each of Apex's loss scalers sees one
unscaling exit per step; with more (micro-batches of an accumulation window, several losses
before one step, a loop over losses) the scales part (docs/differences.md, entry U1), so the
rewrite is an unsafe fix. Read on the parse, so that every line is the file's own.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import libcst as cst

from ..analysis.control_flow import exclusive_branches
from ..diagnostics import Code, Severity, define

UPDATED_PER_STEP = define(
    "AMP215",
    "scale-updated-per-step",
    Severity.WARNING,
    "Apex updated the loss scale at every `scale_loss` exit of this accumulation window; the "
    "GradScaler is updated once, after the step.",
    "Without `delay_unscale`, each micro-batch's `scale_loss` exit unscaled, checked for "
    "overflow and updated Apex's scale. Natively the accumulated gradients stay scaled until "
    "the step, which checks once and updates once. Steps, skips and parameters are the same "
    "while at most one micro-batch of a window overflows; the scale grows after 2000 optimizer "
    "steps instead of 2000 micro-batches, and two overflows in one window back off once, not "
    "twice. `delay_unscale=True` on all but the last micro-batch, as Apex recommended, has "
    "neither difference. An unsafe fix (docs/differences.md, entry U1): without "
    "`--unsafe-fixes` the file keeps the shim.",
    before="with amp.scale_loss(loss, opt) as s:\n    s.backward()\nif (i + 1) % accum == 0:\n    opt.step()",
    after="scaler.scale(loss).backward()\nif (i + 1) % accum == 0:\n    scaler.step(opt)\n"
    "    scaler.update()",
    unsafe="U1",
    refusal="Apex updated the loss scale at each micro-batch, GradScaler once per step",
    fallback_title="gradient accumulation without `delay_unscale` (an unsafe fix)",
    shape=(
        "`with amp.scale_loss(loss, optimizer) as s: s.backward()` on every micro-batch and "
        "`optimizer.step()` under `if (i + 1) % accumulation_steps == 0:` (or in a helper that steps when "
        "asked), at a dynamic loss scale."
    ),
    by_hand=(
        "Run with `--unsafe-fixes` to take the native rewrite and its documented difference (entry U1), or "
        "pass `delay_unscale=True` to every `scale_loss` but the one before the step, as Apex recommended: "
        "then each step sees one exit and the rewrite is safe."
    ),
)

SEVERAL_EXITS_PER_STEP = define(
    "AMP216",
    "several-scale-loss-exits-per-step",
    Severity.WARNING,
    "Several `scale_loss` exits of one loss scaler come before one optimizer step; Apex updated "
    "the loss scale at each, the GradScaler is updated once, after the step.",
    "Without `delay_unscale`, each `scale_loss` exit unscaled, checked for overflow and updated "
    "Apex's scale: two losses scaled before one step (a main and an auxiliary loss, "
    "`retain_graph=True`), or one `scale_loss` in a loop that the step is not in, updated it "
    "twice or more per step. Natively the gradients stay scaled until `scaler.step`, which "
    "checks once, and `scaler.update()` updates once: the scale grows after 2000 steps instead "
    "of 2000 exits, two overflowing losses back off once instead of twice, and a scale logged "
    "between the losses differs. Per-loss scalers (`num_losses`, a `loss_id` per loss) each "
    "see one exit per step and have neither difference. An unsafe fix (docs/differences.md, "
    "entry U1): without `--unsafe-fixes` the file keeps the shim.",
    before="with amp.scale_loss(main_loss, opt) as s:\n    s.backward(retain_graph=True)\n"
    "with amp.scale_loss(aux_loss, opt) as s:\n    s.backward()\nopt.step()",
    after="scaler.scale(main_loss).backward(retain_graph=True)\nscaler.scale(aux_loss).backward()\n"
    "scaler.step(opt)\nscaler.update()",
    unsafe="U1",
    variants=("before one optimizer step", "in a loop"),
    refusal="Apex updated the loss scale at each of several losses, GradScaler once per step",
    fallback_title="several `scale_loss` exits before one step (an unsafe fix)",
    shape=(
        "A main and an auxiliary loss each under `with amp.scale_loss(..., optimizer)` (the first with "
        "`backward(retain_graph=True)`) and one `optimizer.step()` after both, or `for loss in losses:` around "
        "one `scale_loss`, at a dynamic loss scale."
    ),
    by_hand=(
        "Run with `--unsafe-fixes` to take the native rewrite and its documented difference (entry U1); or "
        "sum the losses and scale the sum once (`with amp.scale_loss(main + aux, optimizer)`), or give each "
        "loss its own `loss_id` under `num_losses`: either way Apex updated one scale once per step, and the "
        "rewrite is safe."
    ),
)

CODES = (UPDATED_PER_STEP, SEVERAL_EXITS_PER_STEP)

_LOOPS = (cst.For, cst.While)
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)
Ancestors = Callable[[cst.CSTNode], Iterable[cst.CSTNode]]
Report = Callable[[cst.CSTNode, Code, Optional[str]], None]


#: An unscaling `scale_loss`: its `with` statement, its literal `loss_id` (None: known at run
#: time) and the optimizers it scales (None: not known); a step: its call and its optimizer.
Exit = tuple[cst.CSTNode, Optional[int], Optional[frozenset[str]]]
Step = tuple[cst.CSTNode, str]


def check(
    exits: Sequence[Exit],
    steps: Sequence[Step],
    ancestors: Ancestors,
    position: Callable[[cst.CSTNode], tuple[int, int]],
    code_of: Callable[[cst.CSTNode], str],
    report: Report,
) -> None:
    """Report the first place, per function, where one of Apex's loss scalers updates more than
    once per step: a step of its optimizer that runs in fewer iterations (or calls) than the
    exit, a loop that holds the exit and none of its steps, or two exits before one step."""
    scopes: dict[int, tuple[list[Exit], list[Step]]] = {}
    for found in exits:
        scopes.setdefault(id(_scope(found[0], ancestors)), ([], []))[0].append(found)
    for step in steps:
        scopes.setdefault(id(_scope(step[0], ancestors)), ([], []))[1].append(step)
    for in_scope, stepped in scopes.values():
        in_scope.sort(key=lambda e: position(e[0]))
        stepped.sort(key=lambda s: position(s[0]))
        _check_scope(in_scope, stepped, ancestors, position, code_of, report)


def _steps_it(optimizers: Optional[frozenset[str]], optimizer: str) -> bool:
    return optimizers is None or optimizer in optimizers


def _check_scope(
    exits: list[Exit], steps: list[Step], ancestors: Ancestors, position, code_of, report: Report
) -> None:
    for node, _, optimizers in exits:
        own = [step for step, optimizer in steps if _steps_it(optimizers, optimizer)]
        loop = _loop(node, ancestors)
        if own and loop is not None and not any(_inside(step, loop, ancestors) for step in own):
            report(
                node,
                SEVERAL_EXITS_PER_STEP,
                "this `scale_loss` block runs in a loop that no step of its optimizer is in; Apex "
                "updated the loss scale at each of its exits, the GradScaler is updated once, after "
                "the step",
            )
            return
        apart = next((s for s in own if _guarded_apart(s, node, loop, ancestors, code_of)), None)
        if apart is not None:
            report(apart, UPDATED_PER_STEP, None)
            return
    for k, (node, loss, _) in enumerate(exits):
        for earlier, other, theirs in exits[:k]:
            same_scaler = loss is None or other is None or loss == other
            between = [
                s
                for s, optimizer in steps
                if _steps_it(theirs, optimizer) and position(earlier) < position(s) < position(node)
            ]
            if same_scaler and not between and not exclusive_branches(earlier, node, ancestors):
                report(
                    node,
                    SEVERAL_EXITS_PER_STEP,
                    "this `scale_loss` block and an earlier one come before one optimizer step; Apex "
                    "updated the loss scale at each exit, the GradScaler is updated once, after the step",
                )
                return


def _scope(node: cst.CSTNode, ancestors: Ancestors) -> Optional[cst.CSTNode]:
    return next((p for p in ancestors(node) if isinstance(p, _SCOPES)), None)


def _loop(node: cst.CSTNode, ancestors: Ancestors) -> Optional[cst.CSTNode]:
    """The innermost loop around `node` inside its function."""
    for parent in ancestors(node):
        if isinstance(parent, _SCOPES):
            return None
        if isinstance(parent, _LOOPS):
            return parent
    return None


def _inside(node: cst.CSTNode, outer: cst.CSTNode, ancestors: Ancestors) -> bool:
    return any(parent is outer for parent in ancestors(node))


def _guarded_apart(
    step: cst.CSTNode, exit: cst.CSTNode, loop: Optional[cst.CSTNode], ancestors: Ancestors, code_of
) -> bool:
    """`step` sits under an `if`, inside `exit`'s loop (or, with no loop, its function), that does
    not hold `exit` and does not test what an `if` around `exit` tests: the exit runs in
    iterations (or calls: a helper that steps when asked) where the step does not."""
    if loop is not None and not _inside(step, loop, ancestors) or exclusive_branches(step, exit, ancestors):
        return False
    held = {id(p) for p in ancestors(exit)}
    tests = {code_of(p.test) for p in ancestors(exit) if isinstance(p, cst.If)}
    for parent in ancestors(step):
        if parent is loop or isinstance(parent, _SCOPES) or isinstance(parent, _LOOPS) and loop is None:
            return False
        if isinstance(parent, cst.If) and id(parent) not in held and code_of(parent.test) not in tests:
            return True
    return False
