"""Apex's `amp` module passed around as a value → the GradScaler passed in its place.

What it does
    Where `main()` imports Apex under `if level == "O1":` (with `amp = None` in the `else` or
    before the `if`) and hands the module on (`train(model, optimizer, amp)`), the value that
    carried the module carries the scaler: the `scaler` built where `initialize` ran (enabled
    under the same condition) is passed in the same slot, the parameter that received `amp`
    becomes `scaler`, `amp = None` goes, and every test of the value's truth (`if amp:`,
    `amp is not None`, `x if amp else None`, `amp is None`) reads `scaler.is_enabled()`. The
    calls on it (`scale_loss`, `master_params`, `state_dict`, `load_state_dict`) are rewritten by
    their own rules; checkpoint keys stay as the code wrote them. In a project, a function of
    another module that receives the value (`load_checkpoint(model, path, amp=amp)`) gets the
    scaler in that parameter the same way (project/carry.py decides it for the group).

Why
    Apex's module is one process-wide object, so code that wanted "amp or nothing" passed the
    module or None. The native scaler is an object of its own, and a disabled GradScaler is the
    identity for `scale`, `unscale_`, `step` and `update`, returns `{}` from `state_dict()` and
    ignores `load_state_dict`: one scaler, enabled or not, replaces both values, and what the
    code tested (is amp on?) is `scaler.is_enabled()`.

Soundness
    The flow is proven on the whole file (carriers.py): one function imports the module, in
    the block that calls `initialize` (the scaler's `enabled=` holds that block's condition),
    and binds the name otherwise only to None, in that `if`'s `else` or before it. Every read
    of the value there and in the functions it reaches is a handled Apex call, a truth test,
    or an argument in the one parameter slot of a module-level function (defined once,
    undecorated) whose every use in the file is a direct call passing the value in that slot;
    nothing reads it before Apex is set up, in a nested scope, or after rebinding it. So the
    value is Apex's module exactly when the scaler was built enabled, and None exactly when it
    was built disabled: `scaler.is_enabled()` is the test's answer, except at O0, where Apex's
    module was set up but scaled nothing and the scaler is built disabled (training is the
    same; the checkpoint's entry is None, or `{}`, where Apex saved a static scale of 1.0).
    Calls the file cannot see (another module calling `train`), a value stored (`args.amp =
    amp`), returned or passed to an unknown function refuse with the place (AMP155). A function
    of another module takes the scaler only where the project shows its every use of the value
    (the same proof, seeded with that parameter) and no module but the one that set Apex up
    names the function; otherwise the group stays on the shim (AMP155 in the script, AMP033 in
    the helper).

Fix safety
    Safe within the file; a caller in another module would pass Apex's module where a scaler
    is expected and fail loudly (AttributeError), never train differently.

Example
    def train(model, optimizer, amp):
        if amp is not None:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
    def main():
        if args.level == "O1":
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        else:
            amp = None
        train(model, optimizer, amp)
becomes
    def train(model, optimizer, scaler):
        scaler.scale(loss).backward()
    def main():
        scaler = torch.amp.GradScaler("cuda", enabled=args.level == "O1")
        train(model, optimizer, scaler)
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from ..analysis.carriers import Carriers, Slot
from ..diagnostics import Diagnostic, Severity, define
from ..plan.types import TrainingPlan
from .base import TrainingRule
from .facts import Fact

HANDED_ON = define(
    "AMP155",
    "apex-module-value-not-followed",
    Severity.WARNING,
    "Apex's `amp` module is handed around as a value in a way the scaler cannot follow.",
    "A scaler can stand for Apex's module only where every place the value goes is visible: "
    "a handled call on it (`scale_loss`, `master_params`, `state_dict`, `load_state_dict`), a "
    "test of its truth, or an argument to a function of this file that every call passes it "
    "to. Stored on an object (`args.amp = amp`), returned, passed to code in another module or "
    "read by a nested function, it may reach code that calls Apex directly; the file uses the "
    "shim, which keeps the module.",
    before="args.amp = amp\ntrainer.fit(args)",
    after="from amp_shim import amp  # the file uses the shim",
    falls_back=True,
    refusal="Apex's module is handed on where its uses cannot all be seen",
    fallback_title="Apex's module handed on where its uses cannot all be seen",
    shape=(
        "`from apex import amp` inside a function whose value then leaves what the file shows: stored on an "
        "options object (`args.amp = amp`, read back as `args.amp.scale_loss` in a trainer), returned by a "
        "provider (`def get_amp(fp16): ... return amp`), passed to a function of another module (`fit(model, "
        "optimizer, amp)`), imported under `try:` or in a loop, or used as anything besides "
        "`scale_loss`/`master_params`/`state_dict`/`load_state_dict`, a truth test or an argument to a "
        "function of the same file."
    ),
    fallback_why=(
        "Where every use is visible the value becomes the GradScaler (AMP156: `train(model, optimizer, amp)` "
        "→ `train(model, optimizer, scaler)`, `if amp:` → `if scaler.is_enabled():`; across modules, AMP157: "
        "a helper's `load_checkpoint(..., amp=None)` whose every caller in the tree passes the value). A "
        "value stored, returned or passed out of the file may reach code that calls Apex's other functions "
        "or tests it in ways no scaler answers alike, and a caller the file cannot see would keep passing "
        "the module."
    ),
    by_hand=(
        "Pass the scaler instead of the module (`scaler = torch.amp.GradScaler(enabled=use_amp)`, "
        "`args.scaler = scaler`, `with torch.autocast(...)`, `scaler.scale(loss).backward()`, "
        "`scaler.step(optimizer)`, `scaler.update()`)."
    ),
)
NOW_SCALER = define(
    "AMP156",
    "apex-module-value-now-scaler",
    Severity.INFO,
    "The value that held Apex's module (or None) now holds the GradScaler; tests of it read "
    "`scaler.is_enabled()`.",
    "A disabled GradScaler stands for the None branch (it scales, steps and saves as plain "
    "code does) and an enabled one for Apex's module, so the one scaler takes the value's "
    "place and `is_enabled()` answers what `if amp:` asked. "
    "Where a statement that set the value to None goes, the message says the value is the "
    "scaler, disabled where it was None.",
    before="if amp is not None:",
    after="if scaler.is_enabled():",
    variants=(
        ".is_enabled()`",
        "disabled where it was None",
    ),
)

IN_THE_SLOT = define(
    "AMP157",
    "scaler-in-module-parameter",
    Severity.INFO,
    "This function's parameter that received Apex's module from another module now receives the "
    "GradScaler, and the calls that passed the module pass the scaler.",
    "The project shows every call of the function (the script that set Apex up passes the value; "
    "no other module names the function), so the parameter can change what it holds; its uses "
    "(`state_dict`, `load_state_dict`, `scale_loss`, truth tests) read the scaler. A caller "
    "outside the tree that passes Apex's module would fail loudly (AttributeError).",
    before="def load_checkpoint(model, path, amp=None):",
    after="def load_checkpoint(model, path, scaler=None):",
)


def _plan(rule: TrainingRule) -> TrainingPlan:
    """The rule's plan, which it has wherever it acts (`TrainingRule.applies`)."""
    assert rule.plan is not None, "asked in a file without a plan"
    return rule.plan


class ApexModuleValueToScaler(TrainingRule):
    HANDLES = ()
    EMITS = (HANDED_ON, NOW_SCALER)
    READS = frozenset({Fact.APEX_ANALYSED, Fact.BINDING, Fact.PROJECT, Fact.TRAINING})
    WRITES = frozenset(
        {
            Fact.AMP_PLAN_CARRIED,
            Fact.APEX_CALLS_REWRITTEN,
            Fact.FALLBACK_REASONS,
            Fact.MODULE_VALUE_REWRITTEN,
            Fact.SCALER_CALLS_WRITTEN,
        }
    )

    MARKERS = ("apex",)

    @classmethod
    def applies(cls, state, context) -> bool:
        return state.binding is not None and state.binding.carriers is not None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        assert self.state.binding is not None  # applies() runs this rule only where it is
        carriers = self.state.binding.carriers
        assert carriers is not None
        if carriers.refusal is not None:
            (line, col), why = carriers.refusal
            diagnostic = Diagnostic(HANDED_ON.code, HANDED_ON.severity, line, col, why, False)
            if diagnostic not in self.state.diagnostics:
                self.state.diagnostics.append(diagnostic)
            return tree
        accepted = dict(self.state.project.carrier_calls if self.state.project is not None else ())
        for external in carriers.external.values():
            if external.local not in accepted:
                (line, col), module = external.at, "." * external.level + external.module
                diagnostic = Diagnostic(
                    HANDED_ON.code,
                    HANDED_ON.severity,
                    line,
                    col,
                    f"`{carriers.name or 'amp'}` is passed to `{external.local}` of `{module}`, "
                    "where the project does not show every use of it",
                    False,
                )
                if diagnostic not in self.state.diagnostics:
                    self.state.diagnostics.append(diagnostic)
                break
        if self.plan is None:
            return tree
        self.carriers = carriers
        return super().transform_module_impl(tree)

    def interest(self):
        return frozenset(self.carriers.names())

    def _enabled(self, node: cst.CSTNode) -> cst.BaseExpression:
        return cst.parse_expression(f"{_plan(self).at(self.position(node)[0]).scaler}.is_enabled()")

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if self.position(original_node) not in self.carriers.tests:
            return updated_node
        self.report(
            original_node,
            NOW_SCALER,
            f"`{original_node.value}` tested for truth is now `{_plan(self).scaler}.is_enabled()`",
        )
        return self._enabled(original_node)

    def leave_Comparison(
        self, original_node: cst.Comparison, updated_node: cst.Comparison
    ) -> cst.BaseExpression:
        on = self.carriers.compares.get(self.position(original_node.left))
        if on is None:
            return updated_node
        self.report(
            original_node,
            NOW_SCALER,
            f"`{self.code_of(original_node)}` is now `{'' if on else 'not '}{_plan(self).scaler}.is_enabled()`",
        )
        test = self._enabled(original_node)
        if not on:
            test = cst.UnaryOperation(cst.Not(), test)
        return test.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.RemovalSentinel]:
        kept = [
            s
            for o, s in zip(original_node.body, updated_node.body)
            if not (isinstance(o, cst.Assign) and self.position(o) in self.carriers.nones)
        ]
        if len(kept) == len(updated_node.body):
            return updated_node
        self.report(original_node, NOW_SCALER, "the value is the scaler, disabled where it was None")
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=kept)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if (
            self.position(original_node)[0] in self.carriers.bare_else
            and isinstance(updated_node.orelse, cst.Else)
            and not updated_node.orelse.body.body
        ):
            return updated_node.with_changes(orelse=None)
        return updated_node


class ScalerInTheModuleSlot(TrainingRule):
    """Across modules, the parameter that received Apex's module is renamed for the scaler, and
    the calls that passed the module pass the scaler (after the rules that rewrote the calls on
    it, which follow the old name)."""

    HANDLES = ()
    EMITS = (IN_THE_SLOT,)
    READS = frozenset({Fact.BINDING, Fact.FP16_PLAN, Fact.PROJECT, Fact.SCALER_CALLS_WRITTEN, Fact.TRAINING})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN})

    MARKERS = ()

    @classmethod
    def applies(cls, state, context) -> bool:
        binding = state.binding
        carriers = binding.carriers if binding is not None else None
        return (
            state.training is not None
            and carriers is not None
            and carriers.refusal is None
            and bool(carriers.seeded or carriers.external)
        )

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        binding = state.binding
        self.carriers: Optional[Carriers] = binding.carriers if binding is not None else None
        threaded = {t.name for t in self.plan.threaded} if self.plan is not None else set()
        carriers = self.carriers
        self.renamed: dict[str, Slot] = (
            {f: s for f, s in carriers.slots.items() if f in carriers.seeded and f not in threaded}
            if carriers is not None
            else {}
        )
        self.calls = dict(state.project.carrier_calls if state.project is not None else ())

    def _carriers(self) -> Carriers:
        assert self.carriers is not None, "the rule applies only where the binder has them"
        return self.carriers

    def interest(self):
        names = self.carriers.names() if self.carriers is not None else set()
        return frozenset(names) | frozenset(self.renamed) | frozenset(self.calls)

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        slot = self.renamed.get(original_node.name.value)
        if slot is None or not isinstance(self.parent(original_node), cst.Module):
            return updated_node
        self.report(
            original_node,
            IN_THE_SLOT,
            f"`{slot.function}` takes the scaler as `{_plan(self).scaler}` "
            f"where it took Apex's module as `{slot.param}`",
        )
        name = cst.Name(_plan(self).scaler)
        params = updated_node.params

        def rename(group):
            return [p.with_changes(name=name) if p.name.value == slot.param else p for p in group]

        return updated_node.with_changes(
            params=params.with_changes(
                posonly_params=rename(params.posonly_params),
                params=rename(params.params),
                kwonly_params=rename(params.kwonly_params),
            )
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not isinstance(original_node.func, cst.Name):
            return updated_node  # only a plain name is a function of this module or an imported one
        callee = original_node.func.value
        external = self._carriers().external.get(callee) if callee in self.calls else None
        slot = self.renamed.get(callee)
        if external is not None:
            index, old, new = external.index, external.keyword, self.calls[callee]
        elif slot is not None:
            index, old, new = slot.index, slot.param, _plan(self).scaler
        else:
            return updated_node
        name = cst.Name(_plan(self).scaler)
        return updated_node.with_changes(
            args=[
                a.with_changes(value=name, keyword=cst.Name(new))
                if a.keyword is not None and a.keyword.value == old
                else a.with_changes(value=name)
                if a.keyword is None and i == index
                else a
                for i, a in enumerate(updated_node.args)
            ]
        )
