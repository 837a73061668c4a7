"""Apex's `amp` module passed around as a value → the GradScaler passed in its place.

What it does
    Where `main()` imports Apex under `if level == "O1":` (with `amp = None` in the `else` or
    before the `if`) and hands the module on (`train(model, optimizer, amp)`), the value that
    carried the module carries the scaler: the `scaler` built where `initialize` ran (enabled
    under the same condition) is passed in the same slot, the parameter that received `amp`
    becomes `scaler`, `amp = None` goes, and every test of the value's truth (`if amp:`,
    `amp is not None`, `x if amp else None`, `amp is None`) reads `scaler.is_enabled()`. The
    calls on it (`scale_loss`, `master_params`, `state_dict`, `load_state_dict`) are rewritten by
    their own rules; checkpoint keys stay as the code wrote them.

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
    amp`), returned or passed to an unknown function refuse with the place (AMP155).

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

from typing import Union

import libcst as cst

from ..diagnostics import Diagnostic, Severity, define
from .plan import TrainingRule

HANDED_ON = define(
    "AMP155", "apex-module-value-not-followed", Severity.WARNING,
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
)
NOW_SCALER = define(
    "AMP156", "apex-module-value-now-scaler", Severity.INFO,
    "The value that held Apex's module (or None) now holds the GradScaler; tests of it read "
    "`scaler.is_enabled()`.",
    "A disabled GradScaler stands for the None branch (it scales, steps and saves as plain "
    "code does) and an enabled one for Apex's module, so the one scaler takes the value's "
    "place and `is_enabled()` answers what `if amp:` asked.",
    before="if amp is not None:",
    after="if scaler.is_enabled():",
)


class ApexModuleValueToScaler(TrainingRule):
    HANDLES = ()
    EMITS = (HANDED_ON, NOW_SCALER)

    MARKERS = ("apex",)

    @classmethod
    def applies(cls, state, context) -> bool:
        binding = state.scratch.get("binding")
        return binding is not None and binding.carriers is not None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        carriers = self.state.scratch["binding"].carriers
        if carriers.refusal is not None:
            (line, col), why = carriers.refusal
            diagnostic = Diagnostic(HANDED_ON.code, HANDED_ON.severity, line, col, why, False)
            if diagnostic not in self.state.diagnostics:
                self.state.diagnostics.append(diagnostic)
            return tree
        if self.plan is None:
            return tree
        self.carriers = carriers
        return super().transform_module_impl(tree)

    def interest(self):
        return frozenset(self.carriers.names())

    def _enabled(self, node: cst.CSTNode) -> cst.BaseExpression:
        return cst.parse_expression(f"{self.plan.at(self.position(node)[0]).scaler}.is_enabled()")

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if self.position(original_node) not in self.carriers.tests:
            return updated_node
        self.report(original_node, NOW_SCALER, f"`{original_node.value}` tested for truth is now "
                    f"`{self.plan.scaler}.is_enabled()`")
        return self._enabled(original_node)

    def leave_Comparison(self, original_node: cst.Comparison,
                         updated_node: cst.Comparison) -> cst.BaseExpression:
        on = self.carriers.compares.get(self.position(original_node.left))
        if on is None:
            return updated_node
        self.report(original_node, NOW_SCALER, f"`{self.code_of(original_node)}` is now "
                    f"`{'' if on else 'not '}{self.plan.scaler}.is_enabled()`")
        test = self._enabled(original_node)
        if not on:
            test = cst.UnaryOperation(cst.Not(), test)
        return test.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
                                  ) -> Union[cst.SimpleStatementLine, cst.RemovalSentinel]:
        kept = [s for o, s in zip(original_node.body, updated_node.body)
                if not (isinstance(o, cst.Assign) and self.position(o) in self.carriers.nones)]
        if len(kept) == len(updated_node.body):
            return updated_node
        self.report(original_node, NOW_SCALER, "the value is the scaler, disabled where it was None")
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=kept)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if self.position(original_node)[0] in self.carriers.bare_else and isinstance(updated_node.orelse, cst.Else) \
                and not updated_node.orelse.body.body:
            return updated_node.with_changes(orelse=None)
        return updated_node
