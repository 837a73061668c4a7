"""The GradScaler built in `main()` becomes a `scaler` parameter of the functions that use it.

What it does
    Where the plan threads the scaler (`initialize` under `if args.fp16:` in one function,
    `scale_loss`, the step or `amp.state_dict()` in functions it calls), each of those
    functions gets a last parameter `scaler` (keyword-only where it has defaults, `*args` or
    keyword-only parameters), and every call of them passes it on.

Why
    Apex's loss scaler was process-global, so `train()` reached it without a parameter. The
    native scaler is built with `enabled=args.fp16` where `initialize` was; a module-level
    global cannot be, because whether amp is on is only known inside that function.

Soundness
    The plan threads only module-level functions, defined once, undecorated, whose every use
    in the file is a direct call (no `**kwargs` that could already hold a `scaler`) from the
    function that builds the scaler, after it is built, or from another threaded function; so
    every call passes the one scaler, which is the object Apex's global state stood for. A
    function referenced any other way (a callback, `mp.spawn(train, ...)`), called at module
    level, or a method falls back with its name (AMP101). Calls from other modules cannot be
    seen here: the plan records the threaded functions with their lines for a project-level
    check.

Fix safety
    Safe within the file. A caller in another module that the file cannot see would miss the
    new argument and fail loudly (a TypeError), never train differently.

Example
    def train(args, model, optimizer):
        with amp.scale_loss(loss, optimizer) as s:
            s.backward()
    def main():
        if args.fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train(args, model, optimizer)
becomes
    def train(args, model, optimizer, scaler):
        scaler.scale(loss).backward()
    def main():
        scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)
        train(args, model, optimizer, scaler)
"""

from __future__ import annotations

import libcst as cst

from ..diagnostics import Severity, define
from .base import TrainingRule
from .facts import Fact

THREADED = define(
    "AMP122",
    "scaler-parameter-added",
    Severity.INFO,
    "This function now takes the GradScaler as a `scaler` parameter, and every call of it in "
    "this file passes it.",
    "Apex's loss scaler was process-global; the native one is built where `initialize` ran "
    "(with that function's `enabled=` condition) and passed down to the functions that scale, "
    "step or save with it. Calls from other modules of a project cannot be seen here and would "
    "fail with a TypeError until they pass a scaler too. "
    "A function that took Apex's module as a parameter takes the scaler in that parameter's "
    "place: the message says it takes the scaler as that parameter where it took Apex's module.",
    before="def train(args, model, optimizer):",
    after="def train(args, model, optimizer, scaler):",
    variants=(
        "now takes",
        "where it took Apex's module",
    ),
)


class ThreadScalerThroughCalls(TrainingRule):
    HANDLES = ()
    EMITS = (THREADED,)
    READS = frozenset({Fact.FP16_PLAN, Fact.SCALER_CALLS_WRITTEN, Fact.TRAINING})
    WRITES = frozenset({Fact.SCALER_CALLS_WRITTEN})

    MARKERS = ()

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        threaded = self.plan.threaded if self.plan is not None else ()
        self.threaded = {t.name: t for t in threaded}

    @classmethod
    def applies(cls, state, context) -> bool:
        plan = state.training
        return plan is not None and bool(getattr(plan, "threaded", ()))

    def interest(self):
        return frozenset(self.threaded)

    def _name(self) -> cst.Name:
        assert self.plan is not None  # applies() runs this rule only where a plan threads the scaler
        return cst.Name(self.plan.scaler)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef):
        threaded = self.threaded.get(original_node.name.value)
        if threaded is None or not isinstance(self.parent(original_node), cst.Module):
            return updated_node
        params = updated_node.params
        if threaded.replaces is not None:
            self.report(
                original_node,
                THREADED,
                f"`{threaded.name}` (line {threaded.line}) takes the "
                f"scaler as `{self._name().value}` where it took Apex's module as `{threaded.replaces}`",
            )
            return updated_node.with_changes(params=_renamed(params, threaded.replaces, self._name()))
        self.report(original_node, THREADED, f"`{threaded.name}` (line {threaded.line}) now takes `scaler`")
        new = cst.Param(self._name())
        if not threaded.keyword_only:
            return updated_node.with_changes(params=params.with_changes(params=[*params.params, new]))
        star = params.star_arg if not isinstance(params.star_arg, cst.MaybeSentinel) else cst.ParamStar()
        return updated_node.with_changes(
            params=params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, new])
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not isinstance(original_node.func, cst.Name):
            return updated_node
        threaded = self.threaded.get(original_node.func.value)
        if threaded is None:
            return updated_node
        args = list(updated_node.args)
        if threaded.replaces is not None:
            return updated_node.with_changes(
                args=[
                    a.with_changes(value=self._name(), keyword=self._name())
                    if a.keyword is not None and a.keyword.value == threaded.replaces
                    else a.with_changes(value=self._name())
                    if a.keyword is None and i == threaded.index
                    else a
                    for i, a in enumerate(args)
                ]
            )
        positional = not threaded.keyword_only and all(a.keyword is None and not a.star for a in args)
        if args:
            args[-1] = (
                args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                if isinstance(args[-1].comma, cst.MaybeSentinel)
                else args[-1]
            )
        if positional:
            args.append(cst.Arg(self._name()))
        else:
            args.append(
                cst.Arg(
                    self._name(),
                    keyword=self._name(),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                )
            )
        return updated_node.with_changes(args=args)


def _renamed(params: cst.Parameters, old: str, new: cst.Name) -> cst.Parameters:
    """The parameter `old` (positional or keyword-only) renamed `new`, its default kept."""

    def rename(group):
        return [p.with_changes(name=new) if p.name.value == old else p for p in group]

    return params.with_changes(
        posonly_params=rename(params.posonly_params),
        params=rename(params.params),
        kwonly_params=rename(params.kwonly_params),
    )
