"""Reads of Apex's loss scale → `scaler.get_scale()`; the rest of Apex's scaler state falls back.

What it does
    Rewrites the reads of the current loss scale that real code logs or saves as checkpoint
    metadata, `amp.state_dict()["loss_scaler0"]["loss_scale"]`,
    `amp._amp_state.loss_scalers[0].loss_scale()` and `amp._amp_state.loss_scalers[0]._loss_scale`,
    to `scaler.get_scale()` (with one GradScaler per loss id, loss id i reads its own).
    `amp.state_dict()` as a whole is left to the checkpoint rule (`scaler.state_dict()`). Every
    other use of Apex's scaler state is reported at its line and the file uses the shim: other
    keys (`"unskipped"`), Apex's per-scaler entry, a loss scaler chosen at run time or one no
    GradScaler stands for, iterating over or taking the keys of `amp.state_dict()`, writes such
    as `loss_scalers[0]._loss_scale = 2**20` anywhere but right after `initialize` (there the
    value becomes the GradScaler's `init_scale` and the statement goes, AMP140), and keys of
    Apex's checkpoint format (`"loss_scaler0"`) read from a dict elsewhere.

Why
    Rewriting `amp.state_dict()` alone turns `amp.state_dict()["loss_scaler0"]["loss_scale"]`
    into `scaler.state_dict()["loss_scaler0"]...`, a `KeyError` at run time: GradScaler's state
    dict has other keys (`scale`, `_growth_tracker`, ...). The scale itself is public
    (`get_scale()`); Apex's clean-step counter and its scaler objects have no public counterpart.

Soundness
    Apex's `loss_scale` entry, `loss_scale()` and `_loss_scale` are the scale that loss id's next
    backward is multiplied by, which is what `get_scale()` returns for the GradScaler that scales
    that loss id (1.0 for a disabled one, as Apex's static 1.0 was). The two change at different
    points: Apex at the `scale_loss` exit, GradScaler in `update()` right after the step. A read
    is rewritten only where both have changed or neither has: the last scaling event before it
    in its iteration, on every path, is a step whose update has run (not a step still waiting for
    the rest of its group), or no event comes before it in the iteration and the previous
    iteration cannot end between a `scale_loss` exit and its step (no `continue`/`break` in a loop
    whose `scale_loss` updates at exit); reads outside the training loop's function are taken to
    run between iterations. Reads between a `scale_loss` exit and the update fall back (AMP312).
    Events of other loss ids' scalers do not count; a `scale_loss` whose `delay_unscale` is
    computed at run time is taken to update exactly when its step follows, as the accumulation
    idiom has it; with a disabled scaler (O0, a static scale of 1.0) neither scale ever changes.

Fix safety
    Safe where it applies. `get_scale()` reads the scale from the device (one host sync per read
    on CUDA), where Apex's was a Python float.

Example
    logger.info("loss scale %s", amp.state_dict()["loss_scaler0"]["loss_scale"])
    scale = amp._amp_state.loss_scalers[0].loss_scale()
becomes
    logger.info("loss scale %s", scaler.get_scale())
    scale = scaler.get_scale()
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence, Union, cast

import libcst as cst
import libcst.matchers as m

from ..analysis.binding import children
from ..analysis.control_flow import runs_backward
from ..diagnostics import Severity, define
from ..io.lines import count_line_breaks
from ..plan.options import start_scale_write
from ..plan.types import (
    INITIALIZE,
    LOSS_SCALERS,
    SCALE_LOSS,
    SCALE_LOSS_ARGS,
    STATE_DICT,
    TrainingPlan,
    bind_arguments,
    literal,
)
from .base import TrainingRule
from .facts import Fact

NOT_NATIVE = define(
    "AMP311",
    "apex-scaler-state-not-native",
    Severity.WARNING,
    "This use of Apex's loss-scaler state has no GradScaler counterpart; the file uses the shim.",
    'Reads of the current scale (`amp.state_dict()["loss_scaler0"]["loss_scale"]`, '
    "`amp._amp_state.loss_scalers[0].loss_scale()` or `._loss_scale`) become "
    "`scaler.get_scale()`, and `amp.state_dict()` as a whole becomes `scaler.state_dict()`. The "
    "rest of Apex's state has no public native form: the clean-step count `unskipped`, a "
    "scaler's whole entry or object, a loss scaler chosen at run time or one that no GradScaler "
    "stands for, the keys of `amp.state_dict()` (iterated, counted, `.items()`: GradScaler's "
    "state dict has other keys), and keys of Apex's checkpoint format read from some other "
    'dict (`checkpoint["amp"]["loss_scaler0"]`). '
    "The message names the use: code that hands Apex's scaler object on, or uses "
    "`_amp_state.loss_scalers` as a list of Apex's scaler objects; `amp.state_dict()` that reads "
    "Apex's dict by its keys, is iterated over or unpacked key by key, is searched for a key, is "
    "subscripted by a key known only at run time or by one that is not a loss scaler's key, is "
    "read for `['loss_scaler0']` (a whole entry) or a key of it other than `loss_scale`, or is "
    "called with a `destination` (which fills a dict in Apex's format); a key of Apex's "
    "checkpoint format read from another dict; code that picks "
    "its loss scaler at run time, or reads loss scaler N where one GradScaler serves every loss "
    "or no loss id uses it; and a field that has no GradScaler counterpart.",
    before='print(amp.state_dict()["loss_scaler0"]["unskipped"])',
    after='print(amp.state_dict()["loss_scaler0"]["unskipped"])  # imports point at amp_shim',
    falls_back=True,
    refusal="Apex scaler state with no GradScaler counterpart",
    variants=(
        "hands Apex's scaler object on",
        "list of Apex's scaler objects",
        "reads Apex's dict by its keys",
        "key by key",
        "searched for a key",
        "key known only at run time",
        "not a loss scaler's key",
        "is read for `[",
        "with a `destination`",
        "key of Apex's checkpoint format",
        "picks its loss scaler at run time",
        "reads loss scaler",
        "has no GradScaler counterpart",
    ),
    fallback_title="Apex's scaler state with no GradScaler counterpart",
    shape=(
        "`amp._amp_state.loss_scalers[0]._unskipped`, `for k, v in amp.state_dict().items()`, "
        '`checkpoint["amp"]["loss_scaler0"]`, `amp._amp_state.loss_scalers[i]` with a run-time index, '
        "Apex's scaler object handed to a logger."
    ),
    by_hand=(
        "Read the scale with `scaler.get_scale()` and save `scaler.state_dict()` whole; drop reads of Apex's "
        "other fields, and convert old checkpoints' `amp` entries once (`amp-migrate convert-checkpoint`)."
    ),
)
READ_MID_STEP = define(
    "AMP312",
    "scaler-state-read-before-update",
    Severity.WARNING,
    "This reads the loss scale between a `scale_loss` exit and the step whose `update()` would "
    "change it natively.",
    "Apex updated its loss scale at the end of `scale_loss`; GradScaler updates it in "
    "`scaler.update()`, right after the optimizer step. A read in between (a log line after the "
    "backward, a checkpoint saved before `optimizer.step()`) would see the scale after an "
    "overflow's back-off in Apex and before it natively. Reads after the step, before the "
    "iteration's `scale_loss`, or outside the training loop see the same value in both and are "
    "rewritten; this one makes the file use the shim. Moving the read after the step makes it "
    "native.",
    before="with amp.scale_loss(loss, opt) as scaled:\n    scaled.backward()\n"
    "log(amp._amp_state.loss_scalers[0].loss_scale())\nopt.step()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="the scale is read before update() would change it",
    fallback_title="the loss scale read before the step's update",
    shape=(
        "`print(amp._amp_state.loss_scalers[0].loss_scale())` right after the backward, or a checkpoint "
        "saved with `amp.state_dict()` between `scale_loss` and `optimizer.step()`."
    ),
    by_hand="Move the read after the optimizer step, then re-run.",
)
SCALE_WRITTEN = define(
    "AMP313",
    "apex-loss-scale-written",
    Severity.WARNING,
    "This sets Apex's loss scaler state directly; the file uses the shim.",
    "`amp._amp_state.loss_scalers[0]._loss_scale = 2**20` (common in BERT and ViT scripts, to "
    "start from another scale) changes a live Apex object. Right after `initialize` it only sets "
    "the first scale, which becomes `init_scale=` (AMP140). Anywhere else (inside the training "
    "loop, in another function, after a loss was scaled) it resets a scale that has been "
    "moving, and GradScaler changes its scale only in `update()` (`update(new_scale)` after a "
    "step, which runs at another point than Apex's write), and other fields (`_unskipped`, "
    "`_has_overflow`) have no counterpart. Move the write right after `initialize`, or keep the "
    "shim. "
    "The message says whether the write is not the statement right after `initialize`, or sets a "
    "field that has no counterpart.",
    before="amp._amp_state.loss_scalers[0]._loss_scale = 2**20",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="Apex's scaler state is written directly",
    variants=(
        "not the statement right after `initialize`",
        "no counterpart",
    ),
    fallback_title="Apex's scaler state written",
    shape=(
        "`amp._amp_state.loss_scalers[0]._loss_scale = value` anywhere but right after `initialize` (in the "
        "training loop, per epoch, in another function), or any write of `_unskipped`, `_has_overflow`."
    ),
    fallback_why=(
        "Right after `initialize` the write only chooses the first scale, which is `init_scale` (AMP140, "
        "native). Elsewhere it resets a scale that has been moving, at a point where GradScaler has no "
        "public setter with the same timing (`update(new_scale)` only after a step), and the other fields "
        "have no counterpart. A start value known only at run time (`= args.init_loss_scale`) falls back "
        "with AMP103: the GradScaler may be built at module level, where that value is not known."
    ),
    by_hand=(
        "Move the write right after `initialize` if a start value is what it means, or pass the value as "
        "`init_scale=` where you build the GradScaler."
    ),
)

START_SCALE = define(
    "AMP140",
    "apex-start-scale-to-init-scale",
    Severity.INFO,
    "Apex's loss scale, set right after `initialize`, became the GradScaler's `init_scale`.",
    "`amp._amp_state.loss_scalers[0]._loss_scale = 2**20` right after `initialize` (the ViT/BERT "
    "fine-tuning scripts' way to start from another scale) changes only the value Apex's scaler "
    "starts from: it stays dynamic (or static) as `initialize` made it, and no loss has been "
    "scaled yet. `GradScaler(init_scale=2**20)` starts there the same way; the statement goes. "
    "Elsewhere, or with a value or options this cannot follow (AMP103 says which), the write "
    "falls back (AMP313).",
    before='model, opt = amp.initialize(model, opt, opt_level="O1")\n'
    "amp._amp_state.loss_scalers[0]._loss_scale = 2**20",
    after='scaler = torch.amp.GradScaler("cuda", init_scale=2**20)',
)

_APEX_KEY = re.compile(r"loss_scaler(\d+)")
_APEX_WORD = re.compile(r"\bloss_scaler\d+\b|\bunskipped\b")
#: Builtins that read a dict by its keys (`dict(...)` copies it whole, as saving it does).
_BY_KEYS = frozenset(
    {
        "len",
        "list",
        "tuple",
        "set",
        "sorted",
        "iter",
        "next",
        "enumerate",
        "zip",
        "map",
        "filter",
        "any",
        "all",
        "reversed",
        "sum",
        "min",
        "max",
    }
)

NONE, STEP, APEX = "none", "step", "apex"  # the last scaling event on the paths through code


def _combine(verdicts: Sequence[str]) -> str:
    """The last event over several paths: Apex's exit on one of them wins, a step must end all."""
    if APEX in verdicts:
        return APEX
    return STEP if verdicts and all(v == STEP for v in verdicts) else NONE


class ScalerStateReads(TrainingRule):
    HANDLES = (STATE_DICT, *LOSS_SCALERS)
    EMITS = (NOT_NATIVE, READ_MID_STEP, SCALE_WRITTEN, START_SCALE)
    READS = frozenset({Fact.APEX_ANALYSED, Fact.MODULE_VALUE_REWRITTEN, Fact.TRAINING})
    WRITES = frozenset(
        {
            Fact.AMP_PLAN_CARRIED,
            Fact.APEX_CALLS_REWRITTEN,
            Fact.FALLBACK_REASONS,
            Fact.SCALER_CALLS_WRITTEN,
            Fact.SCALER_STATE_REWRITTEN,
        }
    )

    MARKERS = ("state_dict", "loss_scaler", "unskipped")

    def interest(self):
        words = self.words_for(STATE_DICT, *LOSS_SCALERS)
        if words is None:
            return None
        return words | set(_APEX_WORD.findall(self.state.original))

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.rewritten: dict[int, str] = {}  # node -> the scaler whose get_scale() it becomes
        self.consumed: set[int] = set()  # string keys the rewritten reads spell
        self.absorbed: set[int] = set()  # start-scale writes the GradScaler's init_scale took over

    #: While one read is checked: the scaler it stands for, and the verdicts of `_last` (by node
    #: id) and the lines of `_apex_line` (by ("apex", node id)).
    _scaler: str
    _memo: dict[object, Any]

    def _plan(self) -> TrainingPlan:
        """The plan, which the visitors made sure there is before asking."""
        assert self.plan is not None, "asked in a file without a plan"
        return self.plan

    # -- what a use is ------------------------------------------------------------------------
    def _parent_on_path(self, depth: int) -> Optional[cst.CSTNode]:
        return self._path[-1 - depth] if len(self._path) > depth else None

    def _scaler_of(self, loss_id: object) -> Optional[str]:
        if not isinstance(loss_id, int) or isinstance(loss_id, bool):
            return None
        plan = self._plan()
        if plan.loss_scalers:
            return plan.loss_scalers.get(loss_id)
        return plan.scaler if loss_id == 0 else None

    def _no_scaler(self, node: cst.CSTNode, loss_id: object, what: str) -> None:
        if not isinstance(loss_id, int) or isinstance(loss_id, bool):
            self.report(node, NOT_NATIVE, f"{what} picks its loss scaler at run time")
        elif self._plan().loss_scalers:
            self.report(
                node,
                NOT_NATIVE,
                f"{what} reads loss scaler {loss_id}, which no loss id of "
                "this file's `scale_loss` calls uses",
            )
        else:
            self.report(
                node,
                NOT_NATIVE,
                f"{what} reads loss scaler {loss_id}; one GradScaler "
                "serves every loss here, and Apex's scaler 0 is the only one it stands for",
            )

    def visit_Call(self, node: cst.Call) -> None:
        if self.plan is None or self.apex_name(node.func) != STATE_DICT:
            return
        shown = "`amp.state_dict()`"
        if node.args:
            self.report(node, NOT_NATIVE, f"{shown} with a `destination` fills a dict in Apex's format")
            return
        parent, grand = self._parent_on_path(1), self._parent_on_path(2)
        if isinstance(parent, cst.Subscript) and parent.value is node:
            self._subscripted_state(parent, grand, shown)
        else:
            self._whole_state_use(node, parent, grand, shown)

    def _subscripted_state(self, parent: cst.Subscript, grand: Optional[cst.CSTNode], shown: str) -> None:
        """`amp.state_dict()[key]`, `parent` (and `[key][inner]`, `grand`)."""
        keys = [parent] + ([grand] if isinstance(grand, cst.Subscript) and grand.value is parent else [])
        self.consumed.update(
            id(e.slice.value) for k in keys for e in k.slice if isinstance(e.slice, cst.Index)
        )
        key = self._key(parent)
        found = _APEX_KEY.fullmatch(key) if isinstance(key, str) else None
        if found is None:
            why = "by a key known only at run time" if key is None else f"by {key!r}, not a loss scaler's key"
            self.report(parent, NOT_NATIVE, f"{shown} is subscripted {why}")
            return
        inner = self._key(grand) if len(keys) == 2 else None
        if inner != "loss_scale":
            if len(keys) == 1:
                what = f"`[{key!r}]`, Apex's whole entry for one scaler"
            elif inner is None:
                what = f"`[{key!r}]` and a key known only at run time"
            else:
                what = f"`[{key!r}][{inner!r}]`"
                if inner == "unskipped":
                    what += ", Apex's count of clean steps, which GradScaler keeps privately"
            self.report(parent, NOT_NATIVE, f"{shown} is read for {what}")
            return
        read = keys[-1]  # `grand`: `inner` is its key
        loss_id = int(found.group(1))
        scaler = self._scaler_of(loss_id)
        if scaler is None:
            self._no_scaler(read, loss_id, f"`amp.state_dict()[{key!r}]`")
            return
        self._rewrite_if_settled(read, scaler)

    def _whole_state_use(
        self, node: cst.Call, parent: Optional[cst.CSTNode], grand: Optional[cst.CSTNode], shown: str
    ) -> None:
        """`amp.state_dict()` read otherwise than by a key: what reads Apex's dict key by key."""
        if isinstance(parent, cst.Attribute) and parent.value is node:
            self.report(
                node, NOT_NATIVE, f"`amp.state_dict().{parent.attr.value}` reads Apex's dict by its keys"
            )
        elif isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
            self.report(node, NOT_NATIVE, f"{shown} is iterated over, key by key")
        elif isinstance(parent, (cst.StarredElement, cst.StarredDictElement)) or (
            isinstance(parent, cst.Arg) and parent.star
        ):
            self.report(node, NOT_NATIVE, f"{shown} is unpacked, key by key")
        elif (
            isinstance(parent, cst.Arg)
            and isinstance(grand, cst.Call)
            and isinstance(grand.func, cst.Name)
            and grand.func.value in _BY_KEYS
        ):
            self.report(
                node, NOT_NATIVE, f"`{grand.func.value}({self.code_of(node)})` reads Apex's dict by its keys"
            )
        elif (
            isinstance(parent, cst.ComparisonTarget)
            and parent.comparator is node
            and isinstance(parent.operator, (cst.In, cst.NotIn))
        ):
            self.report(node, NOT_NATIVE, f"{shown} is searched for a key")

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self.plan is None or node.attr.value != "loss_scalers" or self.apex_name(node) not in LOSS_SCALERS:
            return
        shown = "`_amp_state.loss_scalers`"
        parent = self._parent_on_path(1)
        if not (isinstance(parent, cst.Subscript) and parent.value is node):
            self.report(node, NOT_NATIVE, f"{shown} is used as a list of Apex's scaler objects")
            return
        loss_id = self._key(parent, int)
        shown = f"`_amp_state.loss_scalers[{loss_id}]`" if loss_id is not None else shown
        member, above = self._parent_on_path(2), self._parent_on_path(3)
        if not (isinstance(member, cst.Attribute) and member.value is parent):
            self.report(parent, NOT_NATIVE, f"{shown} hands Apex's scaler object on")
            return
        attr = member.attr.value
        read: cst.BaseExpression
        if attr == "loss_scale" and isinstance(above, cst.Call) and above.func is member and not above.args:
            read = above
        elif attr == "_loss_scale" and not self._is_target(member, above):
            read = member
        elif attr in ("_loss_scale", "_unskipped", "_has_overflow", "_overflow_buf") and self._is_target(
            member, above
        ):
            if attr == "_loss_scale" and self._absorb_start_scale(member):
                return
            self.report(
                member,
                SCALE_WRITTEN,
                f"{shown[:-1]}.{attr}` is assigned"
                + (
                    " where it is not the statement right after `initialize` (only there is it "
                    "a first scale, GradScaler's `init_scale`); GradScaler changes its scale "
                    "only in `update()`"
                    if attr == "_loss_scale"
                    else "; GradScaler has no counterpart of this field"
                ),
            )
            return
        else:
            self.report(member, NOT_NATIVE, f"{shown[:-1]}.{attr}` has no GradScaler counterpart")
            return
        scaler = self._scaler_of(loss_id)
        if scaler is None:
            self._no_scaler(read, loss_id, f"{shown[:-1]}.{attr}`")
            return
        self._rewrite_if_settled(read, scaler)

    def _absorb_start_scale(self, target: cst.Attribute) -> bool:
        """`target` is the scale written right after the plan's `initialize`, which the planner
        made the GradScaler's `init_scale` (start_scale_write): its statement goes."""
        line, block = self._parent_on_path(5), self._parent_on_path(6)
        if not isinstance(line, cst.SimpleStatementLine) or block is None:
            return False
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        at = next((i for i, statement in enumerate(body) if statement is line), 0)
        if at == 0:
            return False
        before = body[at - 1]
        found = start_scale_write(before, block, lambda node: self.apex_name(node) in LOSS_SCALERS)
        if found is None or found[0] is not line:
            return False
        inits = m.findall(before, m.Call())
        if not any(self.apex_name(cast(cst.Call, call).func) == INITIALIZE for call in inits):  # m.Call()'s
            return False
        first = self._first_line(before)
        last = first + count_line_breaks(self.code_of(before.with_changes(leading_lines=())))
        if self._plan().at(first).init_line not in range(first, last + 1):
            return False
        self.absorbed.add(id(line))
        self.report(line, START_SCALE, f"`{self.code_of(found[1])}` is the GradScaler's `init_scale`")
        return True

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if self.plan is None or id(node) in self.consumed:
            return
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - bytes or odd prefixes: not a key of Apex's format
            return
        if isinstance(value, str) and (_APEX_KEY.fullmatch(value) or value == "unskipped"):
            self.report(
                node,
                NOT_NATIVE,
                f"{node.value} is a key of Apex's checkpoint format; the "
                "dict it is read from holds GradScaler state after the migration",
            )

    @staticmethod
    def _key(subscript: Optional[cst.CSTNode], kind: type = str) -> Optional[object]:
        """The one literal key of `x[key]` (of type `kind`), else None."""
        if (
            not isinstance(subscript, cst.Subscript)
            or len(subscript.slice) != 1
            or not isinstance(subscript.slice[0].slice, cst.Index)
        ):
            return None
        value = literal(subscript.slice[0].slice.value)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    @staticmethod
    def _is_target(node: cst.CSTNode, parent: Optional[cst.CSTNode]) -> bool:
        return (
            isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node
        ) or (isinstance(parent, cst.Del) and parent.target is node)

    def _rewrite_if_settled(self, read: cst.CSTNode, scaler: str) -> None:
        if self._check_settled(read, scaler):
            self.rewritten[id(read)] = scaler

    def leave_node(self, original_node, updated_node):
        if id(original_node) in self.absorbed:
            return cst.RemoveFromParent()
        scaler = self.rewritten.get(id(original_node))
        if scaler is not None:
            return cst.parse_expression(f"{scaler}.get_scale()").with_changes(
                lpar=updated_node.lpar, rpar=updated_node.rpar
            )
        return super().leave_node(original_node, updated_node)

    # -- when a read happens ------------------------------------------------------------------
    def _check_settled(self, read: cst.CSTNode, scaler: str) -> bool:
        """Whether Apex's scale and the GradScaler's agree where `read` runs; reports if not."""
        if self._disabled():
            return True  # Apex's static 1.0 (or amp off) and a disabled scaler never change
        self._scaler, self._memo = scaler, {}
        why = self._unsettled(list(self._path))
        if why is None:
            return True
        self.report(read, READ_MID_STEP, why)
        return False

    def _unsettled(self, path: list[cst.CSTNode], stop: Optional[cst.CSTNode] = None) -> Optional[str]:
        """Why Apex's scale may have changed and the GradScaler's not yet when the node at the end
        of `path` (the nodes from the module down to it) runs, or None when they agree. The
        search does not go above `stop`, nor above the function it is in."""
        child = path[-1]
        for parent in reversed(path[:-1]):
            if parent is stop or isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                body: list[cst.CSTNode] = list(parent.body)
                at = body.index(child)
                for earlier in reversed(body[:at]):
                    verdict = self._last(earlier)
                    if verdict == APEX:
                        return self._exit_first(self._apex_line(earlier))
                    if verdict == STEP:
                        return self._group_open(earlier, body[at:])
            elif isinstance(parent, (cst.For, cst.While)):
                if child is parent.body or (isinstance(parent, cst.While) and child is parent.test):
                    why = self._ends_at_exit(parent)  # the end of the previous iteration
                    if why is not None:
                        return why
                elif child is parent.orelse:
                    verdict = self._block(parent.body)
                    if verdict == APEX:
                        return self._exit_first(self._apex_line(parent.body))
                    if verdict == STEP:
                        return None
            elif isinstance(parent, cst.Try):
                if child is parent.orelse:
                    verdict = self._block(parent.body)
                    if verdict == APEX:
                        return self._exit_first(self._apex_line(parent.body))
                    if verdict == STEP:
                        return None
                elif child is not parent.body and self._apex_line(parent) is not None:
                    return self._exit_first(self._apex_line(parent))  # a handler or `finally`
            child = parent
        return None

    def _ends_at_exit(self, loop: Union[cst.For, cst.While]) -> Optional[str]:
        """Why an iteration of `loop` can end with a `scale_loss` exit as its last scaling event
        (at the end of its body, or before a `continue` or `break`), or None."""
        if self._apex_line(loop.body) is None:
            return None
        if self._block(loop.body) == APEX:
            return self._exit_first(self._apex_line(loop.body))
        for path in self._exits(loop):
            why = self._unsettled(path, stop=loop)
            if why is not None:
                return why
        return None

    @staticmethod
    def _exit_first(line: Optional[int]) -> str:
        return (
            f"Apex's scale may already have changed at the `scale_loss` exit at line {line}; "
            "GradScaler's changes only at the `update()` after the step"
        )

    @staticmethod
    def _exits(loop: Union[cst.For, cst.While]):
        """Paths from `loop` to each `continue`/`break` of its own."""
        stack: list[list[cst.CSTNode]] = [[loop, loop.body]]
        while stack:
            path = stack.pop()
            node = path[-1]
            if isinstance(node, (cst.Continue, cst.Break)):
                yield path
                continue
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) or (
                isinstance(node, (cst.For, cst.While)) and node is not loop
            ):
                continue
            stack.extend(path + [child] for child in children(node))

    def _group_open(self, step_line: cst.CSTNode, rest: list[cst.CSTNode]) -> Optional[str]:
        """After `step_line` a step of the same group (no backward between) follows the read, so
        the group's update comes after the read: why that matters."""
        if not isinstance(step_line, cst.SimpleStatementLine):
            return None  # the update is inside the statement that holds the step
        for statement in rest:
            if runs_backward(statement):
                return None
            if (
                statement is not rest[0]
                and isinstance(statement, cst.SimpleStatementLine)
                and self._steps(statement, any_scaler=True)
            ):
                return (
                    f"the steps at lines {self._first_line(step_line)}-{self._first_line(statement)} "
                    "share one `update()` after the last of them, and this read comes before it; "
                    "Apex's scale changed at the `scale_loss` exit"
                )
        return None

    def _last(self, node: cst.CSTNode) -> str:
        """The last scaling event on the paths through statement `node`: a step of the read's
        scaler (whose update follows it), a `scale_loss` exit that updates Apex's scale, or none."""
        key = id(node)
        if key not in self._memo:
            self._memo[key] = self._last_uncached(node)
        return self._memo[key]

    def _last_uncached(self, node: cst.CSTNode) -> str:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return NONE
        if isinstance(node, cst.SimpleStatementLine):
            return STEP if self._steps(node) else NONE
        if isinstance(node, cst.With):
            return APEX if self._updates_at_exit(node) else self._block(node.body)
        if isinstance(node, cst.If):
            other = (
                NONE
                if node.orelse is None
                else (
                    self._last(node.orelse)
                    if isinstance(node.orelse, cst.If)
                    else self._block(node.orelse.body)
                )
            )
            return _combine([self._block(node.body), other])
        if isinstance(node, (cst.For, cst.While)):
            ends = self._ends_at_exit(node) is not None
            return (
                APEX
                if ends or (node.orelse is not None and self._apex_line(node.orelse) is not None)
                else NONE
            )
        if isinstance(node, cst.Try):
            if node.finalbody is not None and self._block(node.finalbody.body) != NONE:
                return self._block(node.finalbody.body)
            if node.handlers and self._apex_line(node.body) is not None:
                return APEX  # a handler may run after an exit and before the step
            main = self._block(node.orelse.body) if node.orelse is not None else NONE
            if main == NONE:
                main = self._block(node.body)
            return _combine([main] + [self._block(h.body) for h in node.handlers])
        return APEX if self._apex_line(node) is not None else NONE  # `match`: conservative

    def _block(self, suite: cst.BaseSuite) -> str:
        if isinstance(suite, cst.SimpleStatementSuite):
            return STEP if self._steps(suite) else NONE
        for statement in reversed(suite.body):
            verdict = self._last(statement)
            if verdict != NONE:
                return verdict
        return NONE

    def _disabled(self) -> bool:
        return all(
            any(
                a.keyword is not None and a.keyword.value == "enabled" and literal(a.value) is False
                for a in call.args
            )
            for call in self._plan().scaler_calls
        )

    # -- the events ---------------------------------------------------------------------------
    def _steps(self, line: cst.CSTNode, any_scaler: bool = False) -> bool:
        """`line` (a simple statement line or suite) steps an optimizer the plan routes through
        the read's scaler (any of the plan's, with `any_scaler`)."""
        plan = self._plan()
        for call in m.findall(line, m.Call(func=m.Attribute(attr=m.Name("step")), args=[])):
            optimizer = self.code_of(cast(cst.Attribute, cast(cst.Call, call).func).value)  # as matched
            if optimizer in plan.optimizers and (
                any_scaler or plan.scaler_for_optimizer(optimizer) == self._scaler
            ):
                break
        else:
            return False
        if not isinstance(line, cst.SimpleStatementLine):
            return True  # `if last: opt.step()`: its line is the owner's
        first = self._first_line(line)
        span = count_line_breaks(self.code_of(line.with_changes(leading_lines=())))
        return any(n in plan.step_lines for n in range(first, first + max(1, span)))

    def _updates_at_exit(self, node: cst.With) -> bool:
        """`node` is a `scale_loss` block whose exit updates the Apex scaler the read stands for."""
        calls = [
            item.item
            for item in node.items
            if isinstance(item.item, cst.Call) and self.apex_name(item.item.func) in SCALE_LOSS
        ]
        plan = self._plan()
        if not calls or self._first_line(node) not in plan.eager_unscale_lines:
            return False
        bound = bind_arguments(calls[0], SCALE_LOSS_ARGS)
        loss_id = literal(bound.get("loss_id")) if bound is not None and "loss_id" in bound else 0
        return not isinstance(loss_id, int) or plan.scaler_for_loss(loss_id) == self._scaler

    def _apex_line(self, node: cst.CSTNode) -> Optional[int]:
        """The first line of a `scale_loss` in `node` whose exit updates Apex's scale."""
        key = ("apex", id(node))
        if key not in self._memo:
            self._memo[key] = next(
                (
                    self._first_line(w)
                    for w in m.findall(node, m.With())
                    if self._updates_at_exit(cast(cst.With, w))  # what m.With() found
                ),
                None,
            )
        return self._memo[key]

    def _first_line(self, statement: cst.CSTNode) -> int:
        index = self.state.index
        place = index.place_of(statement) if index is not None else None
        if place is not None:
            return place[0]
        return self.position(statement)[0]
