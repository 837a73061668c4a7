"""availability: "is Apex installed?" checks → their native answer; "is amp initialized?" probes reported.

What it does
    Tests of whether an Apex import succeeded (`amp is None`, `amp is not None`, `not amp`,
    `if amp:` after `try: from apex import amp / except ImportError: amp = None`) get the
    answer they have once the file is native: mixed precision is available, so `amp is None`
    is False and `amp is not None` is True. The tests are simplified (`use_amp and amp is
    None` → False), and `if`/`assert` statements whose test became constant keep only the
    branch that runs: `if use_amp and amp is None: raise RuntimeError("install apex")`
    disappears. Probes of whether Apex's amp was initialized in this process
    (`hasattr(amp._amp_state, "loss_scalers")`) are reported with their own reason.

Why
    `torch.amp` ships with torch: a native file needs nothing installed, so the branches that
    handle a missing Apex are dead, and keeping them would keep the only read of `amp` (and
    with it the Apex import) alive.

Soundness
    Only reads of a name bound to an Apex module or object are answered, and only where their
    value is tested for `None` or for truth, which for a module (or the class or function
    imported from it) is "the import succeeded". In the native file every other use of that
    name was rewritten by another rule, or the file falls back, so the import no longer runs
    and the check's only native meaning is "available". A literal on the left folds
    exactly (`True and x` is x, `False and x` never evaluates x); one on the right folds only
    in a test, where only truth counts (`use_amp and True` → `use_amp`), and drops only a
    side-effect-free operand; a branch (of an `if` or a conditional expression) is dropped
    only when its test became a literal. An initialization probe asks about Apex's
    process-global state, which native code does not have: whether autocast and a GradScaler
    are on is decided where they are built, so such a file uses the shim (AMP906).

Fix safety
    Safe. The file no longer raises or warns that Apex is missing; it needs no Apex.

Example
    try:                                   def train(use_amp):
        from apex import amp                   ...
    except ImportError:
        amp = None

    def train(use_amp):
        if use_amp and amp is None:
            raise RuntimeError("install apex")
        ...
"""

from __future__ import annotations

import enum
import re
from typing import Final, Union, cast

import libcst as cst
import libcst.matchers as m

from ..diagnostics import Severity, define
from ..plan.types import pure
from .base import Rule
from .facts import Fact

FOLDED = define(
    "AMP905",
    "apex-availability-check-answered",
    Severity.INFO,
    "A check of whether Apex is installed got its native answer (available) and was simplified.",
    "`amp is None` after `try: from apex import amp / except ImportError: amp = None` asked "
    "whether Apex could be imported. The migrated file uses `torch.amp`, which needs no "
    "install, so the check is False (`amp is not None`: True); an `if` or `assert` whose test "
    "became constant keeps only the branch that runs, and the Apex import then has no reader "
    "left.",
    before='if use_amp and amp is None:\n    raise RuntimeError("Please install apex")',
    after="# removed",
)
INIT_PROBE = define(
    "AMP906",
    "amp-initialized-probe",
    Severity.WARNING,
    "This code asks whether Apex's amp was initialized in this process; native code has no "
    "such global state, so the file uses the shim.",
    '`hasattr(amp._amp_state, "loss_scalers")` (or a read of `amp._amp_state.opt_properties`) '
    "is true once `amp.initialize` ran anywhere in the process. Natively, autocast and the "
    "GradScaler are objects built where training is set up, and nothing records globally that "
    "they were: the probe has no native counterpart that is right in every caller. Pass a flag "
    "(or the scaler) to the code that needs to know, then run amp-migrate again.",
    before='def is_amp_training():\n    return hasattr(amp._amp_state, "loss_scalers")',
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="native code has no is-amp-initialized state",
    fallback_title='"is amp initialized?"',
    shape=(
        '`hasattr(amp._amp_state, "loss_scalers")` in a helper (`is_amp_training()`) that decides whether '
        "to wrap functions with `amp.float_function`."
    ),
    fallback_why=(
        "The test asks whether Apex's global state exists in the process. Native code has no such state: "
        "autocast is a region (`torch.is_autocast_enabled()` is true only inside it) and a GradScaler is an "
        "object someone holds. No expression means the same thing in every place the helper may be called "
        "from."
    ),
    by_hand=(
        "Decide from your own flag (`args.fp16`); a function that must run in fp32 under autocast runs in "
        '`with torch.autocast("cuda", enabled=False):` on `.float()` inputs (for a custom autograd '
        'function, `torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)`, which does '
        "nothing outside autocast)."
    ),
)

_CODE = cst.Module([]).code_for_node


class _Undecided(enum.Enum):
    MISSING = "missing"


_MISSING: Final = _Undecided.MISSING  # a test not decided by availability alone


def _constant(node: cst.BaseExpression) -> Union[bool, _Undecided]:
    if m.matches(node, m.Name("True")):
        return True
    if m.matches(node, m.Name("False")):
        return False
    return _MISSING


def _statements(suite: cst.BaseSuite, leading_lines) -> list[cst.BaseStatement]:
    """A branch's statements, to stand where its `if` stood."""
    body: list[cst.BaseStatement]
    if isinstance(suite, cst.SimpleStatementSuite):
        body = [cst.SimpleStatementLine(list(suite.body))]
    else:
        body = list(cast(cst.IndentedBlock, suite).body)  # the other kind of suite
    body[0] = body[0].with_changes(leading_lines=leading_lines)
    return body


def _bool(value: bool) -> cst.Name:
    return cst.Name("True" if value else "False")


class ApexAvailabilityChecks(Rule):
    """Answer "is Apex installed?" natively; report "is amp initialized?" probes."""

    HANDLES = ("apex", "apex.amp._amp_state")
    EMITS = (FOLDED, INIT_PROBE)
    READS = frozenset({Fact.APEX_ANALYSED, Fact.APEX_CALLS_REWRITTEN})
    WRITES = frozenset({Fact.AVAILABILITY_SETTLED, Fact.FALLBACK_REASONS})

    MARKERS = ("apex",)

    @classmethod
    def applies(cls, state, context) -> bool:
        """Only files that test an Apex name for None or truth, or probe `_amp_state`."""
        if not super().applies(state, context):
            return False
        words = state.apex_words
        if words is None or "_amp_state" in state.original:
            return True
        names = "|".join(sorted(re.escape(w) for w in words))
        return (
            re.search(
                rf"\b(?:{names})\s+is\b|\b(?:not|if|elif|assert|and|or|while)\s+(?:{names})\b", state.original
            )
            is not None
        )

    def _apex_read(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, (cst.Name, cst.Attribute)) and self.apex_name(node) is not None

    # -- probes ---------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if (
            m.matches(node.func, m.Name("hasattr"))
            and node.args
            and (self.apex_name(node.args[0].value) or "").endswith("_amp_state")
        ):
            self.report(
                node,
                INIT_PROBE,
                f"`{self.code_of(node)}` asks whether Apex's amp was initialized "
                "in this process; native code keeps no such global state",
            )

    # -- answering ------------------------------------------------------------------------------
    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison):
        if len(original_node.comparisons) != 1 or not self._apex_read(original_node.left):
            return updated_node
        target = original_node.comparisons[0]
        if not m.matches(target.comparator, m.Name("None")):
            return updated_node
        if not isinstance(target.operator, (cst.Is, cst.IsNot)):
            return updated_node
        answer = isinstance(target.operator, cst.IsNot)
        if not self._tested(original_node):  # a test reports its own answer
            self.report(
                original_node,
                FOLDED,
                f"`{self.code_of(original_node)}` is `{answer}` natively (torch.amp needs no install)",
            )
        return _bool(answer)

    def leave_UnaryOperation(self, original_node: cst.UnaryOperation, updated_node: cst.UnaryOperation):
        if not isinstance(updated_node.operator, cst.Not):
            return updated_node
        if self._apex_read(original_node.expression) and self._tested(original_node):
            return _bool(False)
        value = _constant(updated_node.expression)
        return updated_node if value is _MISSING else _bool(not value)

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation, updated_node: cst.BooleanOperation):
        left, right = updated_node.left, updated_node.right
        tested = self._tested(original_node)
        if self._apex_read(original_node.left) and tested:
            left = _bool(True)
        if self._apex_read(original_node.right) and tested:
            right = _bool(True)
        is_and = isinstance(updated_node.operator, cst.And)
        known = _constant(left)
        if known is not _MISSING:  # `True and x` is x, `False and x` is False: exact values
            return right if known == is_and else _bool(known)
        known = _constant(right)
        if known is not _MISSING and tested:  # only the truth of `x and True` is x's
            if known == is_and:
                return left
            if pure(left):  # `x and False`: x is evaluated for nothing
                return _bool(known)
        return updated_node.with_changes(left=left, right=right)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        known = (
            _constant(updated_node.test)
            if _CODE(updated_node.test) != _CODE(original_node.test)
            else _MISSING
        )
        if known is _MISSING:
            return updated_node
        self.report(
            original_node,
            FOLDED,
            f"`{self.code_of(original_node.test)}` is `{known}` natively (torch.amp needs no install)",
        )
        kept = updated_node.body if known else updated_node.orelse
        return (
            kept.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar) if updated_node.lpar else kept
        )

    def _tested(self, node: cst.CSTNode) -> bool:
        """`node` is (part of) the test of an `if`, `elif`, `while`, `assert` or conditional
        expression, through `not`/`and`/`or` only: its truth is all that is used."""
        current = node
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.UnaryOperation, cst.BooleanOperation)):
                current = parent
                continue
            if isinstance(parent, (cst.If, cst.While, cst.IfExp)):
                return parent.test is current
            return isinstance(parent, cst.Assert) and parent.test is current
        return False

    def _decided(
        self, original: cst.CSTNode, test: cst.BaseExpression, old_test: cst.BaseExpression
    ) -> Union[bool, _Undecided]:
        if _CODE(test) == _CODE(old_test):
            return _MISSING
        self.report(
            original,
            FOLDED,
            f"`{self.code_of(old_test)}` is `{self.code_of(test)}` natively (torch.amp needs no install)",
        )
        return _constant(test)

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        value = self._decided(original_node, updated_node.test, original_node.test)
        parent = self.parent(original_node)
        if value is _MISSING or (isinstance(parent, cst.If) and parent.orelse is original_node):
            return updated_node  # an `elif` keeps its place; its test is answered all the same
        if value:
            return cst.FlattenSentinel(_statements(updated_node.body, updated_node.leading_lines))
        orelse = updated_node.orelse
        if orelse is None:
            return cst.RemoveFromParent()
        if isinstance(orelse, cst.If):
            return orelse.with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(_statements(orelse.body, updated_node.leading_lines))

    def leave_Assert(self, original_node: cst.Assert, updated_node: cst.Assert):
        value = self._decided(original_node, updated_node.test, original_node.test)
        return updated_node if value is not True else cst.RemoveFromParent()

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not updated_node.body:
            return cst.RemoveFromParent()
        return updated_node

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        if not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node
