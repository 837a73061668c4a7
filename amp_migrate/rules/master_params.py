"""`amp.master_params(opt)` → `scaler.unscale_(opt)` first, then the optimizer's own params.

What it does
    Where master params are read between backward and the optimizer's step (gradient
    clipping, almost always), inserts `scaler.unscale_(opt)` before the first such statement
    of the step and replaces `amp.master_params(opt)` with the parameters the optimizer steps,
    `(p for group in opt.param_groups for p in group["params"])`.

Why
    Apex unscaled gradients at the end of `scale_loss`, so clipping saw true gradients.
    GradScaler keeps them scaled until `unscale_` or `step`; clipping scaled gradients would
    clip at a threshold `scale` times too small. Native weights are the optimizer's params, so
    they stand in for the fp32 masters.

Soundness
    `unscale_` is inserted only where `opt.step()` follows on every path to the end of the
    iteration: a later statement of the same block or of an enclosing one (not across a loop
    or function) that steps unconditionally, with no `continue`/`break`/`return`/`raise` in
    between. Then each `unscale_` is followed by its `scaler.step(opt)` and `update()` before
    the next one, which is GradScaler's rule, and the gradients clipping reads are the unscaled
    ones Apex's clipping read. Further reads before the same step get no second `unscale_`
    when the first one precedes them on every path.

Fix safety
    Safe where it applies. A step that may not follow (under `if last:` in an accumulation
    window while clipping runs on every micro-batch; under `if torch.isfinite(norm):`; after an
    early exit; in another function) falls back to the shim: `unscale_` would run twice
    before a step (GradScaler raises), and on an overflow Apex's skip stayed armed into the next
    iteration's step, which no native form reproduces. Unsafe (docs/differences.md entry U2,
    AMP302) for the accumulation loop that clips after every micro-batch and steps under
    `if cond:` in the same block: the clipping moves under the condition, after
    `scaler.unscale_(opt)` and right before the step, as the loop's authors later wrote it;
    Apex had clipped each partial sum, so the updates differ from the first window whose
    partial sum exceeded the threshold. Only where nothing between touches gradients, amp or
    what the clipping reads, and its result is read only after the step; applied only with
    `--unsafe-fixes`.

Example
    clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
becomes
    scaler.unscale_(optimizer)
    clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), 1.0)
    scaler.step(optimizer)
    scaler.update()
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

from ..analysis.binding import find
from ..analysis.control_flow import STEP, exits_early
from ..analysis.statements import changed_names, is_elif
from ..diagnostics import Severity, define
from ..plan.types import MASTER_PARAMS, pure
from .base import TrainingRule
from .facts import Fact

UNPROVEN = define(
    "AMP301",
    "master-params-outside-step",
    Severity.WARNING,
    "`amp.master_params(opt)` is read where `opt.step()` does not follow on every path, so "
    "`scaler.unscale_(opt)` cannot be placed soundly.",
    "Natively, gradients stay scaled until `scaler.unscale_(opt)` or `scaler.step(opt)`, and "
    "`unscale_` may run once per step. amp-migrate inserts it only before a use that the same "
    "iteration's step follows unconditionally. Other uses keep Apex's semantics through the "
    "shim: clipping on every micro-batch of an accumulation window while the step runs under "
    "`if last:` (`unscale_` would run twice), a step guarded by `if torch.isfinite(norm):` or "
    "skipped by an early `continue` (on an overflow Apex's skip stayed armed and also skipped "
    "the next iteration's step), a helper method, or a read after the step. "
    "The message says which case this is: `amp.master_params(opt)` is read where the step does "
    "not follow (with the reason), or on paths that no single `unscale_` before the step "
    "precedes; or it is given other than one optimizer (`amp.master_params` takes one optimizer "
    "here).",
    before="with amp.scale_loss(loss, opt, delay_unscale=not last) as s:\n    s.backward()\n"
    "clip_grad_norm_(amp.master_params(opt), 1.0)\nif last:\n    opt.step()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="no step follows master_params on every path",
    variants=(
        "is read where",
        "no single `unscale_`",
        "takes one optimizer",
    ),
    fallback_title="`master_params` where the step does not follow",
    shape=(
        "The pre-2020 Hugging Face example loop: `with amp.scale_loss(...)`, then "
        "`clip_grad_norm_(amp.master_params(optimizer), max_norm)` on every micro-batch, while "
        "`optimizer.step()` runs under `if (step + 1) % accumulation == 0:`; `master_params` of an optimizer "
        "whose step goes through a wrapper object (`optimizer_g._optim`) the file never steps directly; a "
        "utility `def master_params(optimizer): yield from apex.amp.master_params(optimizer)` whose callers "
        "(clipping, in another module) the file does not show."
    ),
    fallback_why=(
        "Apex unscaled at every `scale_loss` exit, so each micro-batch clipped the accumulated, unscaled "
        "gradients. Natively gradients stay scaled until `scaler.unscale_`, which may run once per step: "
        "unscaling on every micro-batch raises, and unscaling only before the step clips once per window "
        "instead of once per micro-batch, which changes the update whenever accumulation is above 1. A step "
        "through a wrapper cannot be matched with its unscale."
    ),
    by_hand=(
        "Move the clipping under the step's condition, right before the step (the fix Hugging Face made; the "
        "same training when accumulation is 1), then re-run; or step the inner optimizer where the file can "
        "see it; a utility yields the optimizer's own parameters natively, and each caller calls "
        "`scaler.unscale_(optimizer)` before reading gradients."
    ),
)


CLIPPED_PER_STEP = define(
    "AMP302",
    "clipping-moved-to-step",
    Severity.WARNING,
    "`amp.master_params(opt)` is clipped after every micro-batch while `opt.step()` runs under a "
    "condition; the native rewrite clips once per step, right before it.",
    "Apex unscaled the gradients at every `scale_loss` exit, so clipping "
    "`amp.master_params(opt)` after each micro-batch of an accumulation window clipped the "
    "partially accumulated gradients. GradScaler's gradients stay scaled until "
    "`scaler.unscale_(opt)`, which may run once per step, so the native rewrite moves the "
    "clipping under the step's condition, after `scaler.unscale_(opt)` and right before "
    "`scaler.step(opt)`: the window's accumulated gradients are clipped once, the fix Hugging "
    "Face made to this loop. The training is the same wherever no partial sum of a window "
    "exceeded the clipping threshold before its last micro-batch (always, with accumulation "
    "1); from the first window where one did, the updates differ. An unsafe fix "
    "(docs/differences.md, entry U2): without `--unsafe-fixes` the file keeps the shim.",
    before="with amp.scale_loss(loss, opt) as s:\n    s.backward()\n"
    "clip_grad_norm_(amp.master_params(opt), 1.0)\nif (i + 1) % accum == 0:\n    opt.step()",
    after="scaler.scale(loss).backward()\nif (i + 1) % accum == 0:\n    scaler.unscale_(opt)\n"
    '    clip_grad_norm_((p for group in opt.param_groups for p in group["params"]), 1.0)\n'
    "    scaler.step(opt)\n    scaler.update()",
    unsafe="U2",
    refusal="Apex clipped the partial gradients of every micro-batch, the native loop clips once per step",
    fallback_title="clipping every micro-batch of an accumulation window (an unsafe fix)",
    shape=(
        "The pre-2020 Hugging Face example loop: `clip_grad_norm_(amp.master_params(optimizer), max_norm)` "
        "right after `scale_loss` on every micro-batch, and `optimizer.step()` under "
        "`if (step + 1) % accumulation_steps == 0:`."
    ),
    by_hand=(
        "Run with `--unsafe-fixes` to take the rewrite and its documented difference (entry U2), or move "
        "the clipping under the step's condition yourself (the same training when accumulation is 1)."
    ),
)
#: What a statement between the clipping and the step must not do: touch gradients or amp.
_GRADIENT_WORDS = ("grad", "backward", "scale_loss", "master_params", "unscale", "clip")


def _one_clipping(statement: cst.CSTNode, call: cst.Call) -> Optional[cst.BaseSmallStatement]:
    """The statement's one small statement where it is a call whose first argument is `call`
    (`clip_grad_norm_(amp.master_params(opt), ...)`, or its value bound to plain names)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, (cst.Expr, cst.Assign)) or not isinstance(small.value, cst.Call):
        return None
    if not small.value.args or small.value.args[0].value is not call:
        return None
    if isinstance(small, cst.Assign) and not all(isinstance(t.target, cst.Name) for t in small.targets):
        return None
    return small


def params_of(optimizer: cst.BaseExpression) -> cst.GeneratorExp:
    return cst.ensure_type(
        cst.parse_expression(
            f'(p for group in {cst.Module([]).code_for_node(optimizer)}.param_groups for p in group["params"])'
        ),
        cst.GeneratorExp,
    )


class MasterParamsUnscale(TrainingRule):
    HANDLES = (MASTER_PARAMS,)
    EMITS = (UNPROVEN, CLIPPED_PER_STEP)
    READS = frozenset({Fact.APEX_ANALYSED, Fact.MODULE_VALUE_REWRITTEN, Fact.TRAINING})
    WRITES = frozenset(
        {Fact.AMP_PLAN_CARRIED, Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.SCALER_CALLS_WRITTEN}
    )

    MARKERS = ("master_params",)
    APEX_ON_THE_LINE = True
    ACTS_ON = (cst.BaseCompoundStatement,)  # leave_node puts the unscale before a compound statement

    def interest(self):
        return self.words_for(MASTER_PARAMS)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.calls: set[int] = set()
        self.unscale_before: dict[int, list[str]] = {}  # statement -> optimizers to unscale
        #: clipping statement -> (the step's statement, optimizer, the test of the arm it stood in)
        self.moves: dict[int, tuple[int, str, Optional[cst.BaseExpression]]] = {}
        self.moved: dict[int, tuple[str, list, Optional[cst.BaseExpression]]] = {}  # step's statement -> ...

    def _steps(self, statement: cst.CSTNode, optimizer: str) -> list[cst.Call]:
        return [
            c
            for c in find(statement, STEP)
            if isinstance(c, cst.Call)  # what STEP matches: `<optimizer>.step(...)`
            and isinstance(c.func, cst.Attribute)
            and self.code_of(c.func.value) == optimizer
        ]

    def _steps_on_every_path(self, statement: cst.CSTNode, optimizer: str) -> bool:
        """`statement` steps `optimizer` whenever it runs to its end: a line that calls
        `optimizer.step()`, or a `with` whose body does so before anything can leave early."""
        if isinstance(statement, cst.SimpleStatementLine):
            return bool(self._steps(statement, optimizer))
        if isinstance(statement, cst.With) and isinstance(statement.body, cst.IndentedBlock):
            for inner in statement.body.body:
                if self._steps_on_every_path(inner, optimizer):
                    return True
                if exits_early(inner) or self._steps(inner, optimizer):
                    return False
        return False

    def _step_after(self, statement: cst.CSTNode, optimizer: str) -> tuple[Optional[cst.CSTNode], str]:
        """The statement that steps `optimizer` on every path from `statement` to the end of
        the iteration, or None and why there is none."""
        current = statement
        while True:
            block = self.parent(current)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return None, f"no `{optimizer}.step()` follows it in this iteration"
            body = list(block.body)
            at = next(i for i, s in enumerate(body) if s is current)
            for later in body[at + 1 :]:
                if self._steps_on_every_path(later, optimizer):
                    return later, ""
                if self._steps(later, optimizer):
                    return None, (
                        f"the `{optimizer}.step()` that follows (in the statement at line "
                        f"{self.position(later)[0]}) "
                        "runs only under a condition, so `unscale_` would run in iterations "
                        "that do not step (GradScaler refuses a second `unscale_`, and "
                        "Apex kept an overflow's skip armed into the next step)"
                    )
                if exits_early(later):
                    return None, (
                        f"line {self.position(later)[0]} can leave the iteration between "
                        f"this read and `{optimizer}.step()`"
                    )
            owner = self.statement_around(block)
            if owner is None:
                return None, f"no `{optimizer}.step()` follows it in this iteration"
            current = owner

    def _chain(self, statement: cst.CSTNode) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """(block, the statement of that block that holds `statement`), innermost first, up
        to the iteration's boundary."""
        chain: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        current: Optional[cst.CSTNode] = statement
        while current is not None:
            block = self.parent(current)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                break
            chain.append((block, current))
            current = self.statement_around(block)
        return chain

    def _unscale_point(self, statements: list[cst.CSTNode]) -> Optional[cst.CSTNode]:
        """The statement before which one `unscale_` precedes every read: the first read's
        own statement, or the one that holds it in the innermost block that holds them all."""
        first = self._chain(statements[0])
        blocks = [block for block, _ in first]
        level = 0
        for statement in statements[1:]:
            held = next((blocks.index(block) for block, _ in self._chain(statement) if block in blocks), None)
            if held is None:
                return None
            level = max(level, held)
        return first[level][1]

    def visit_Module(self, node: cst.Module) -> None:
        if self.plan is None:
            return
        reads: dict[tuple[int, str], list[tuple[cst.Call, cst.CSTNode]]] = {}
        moving: list[
            tuple[cst.Call, cst.CSTNode, tuple[cst.If, cst.CSTNode, Optional[cst.BaseExpression]], str]
        ] = []
        for call in self.findall(node, m.Call()):
            if not isinstance(call, cst.Call) or self.apex_name(call.func) != MASTER_PARAMS:  # all are calls
                continue
            if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
                self.report(call, UNPROVEN, "`amp.master_params` takes one optimizer")
                continue
            optimizer = self.code_of(call.args[0].value)
            statement = next(
                p
                for p in self.ancestors(call)
                if isinstance(p, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
            )
            step, why = self._step_after(statement, optimizer)
            if step is None:
                move = self._clipping_to_move(call, statement, optimizer)
                if move is None:
                    self.report(call, UNPROVEN, f"`amp.master_params({optimizer})` is read where {why}")
                    continue
                moving.append((call, statement, move, optimizer))
                continue
            reads.setdefault((id(step), optimizer), []).append((call, statement))
        for call, moved, (later, target, guard), optimizer in moving:
            others = sum(1 for _, o in reads if o == optimizer) + sum(1 for *_, o in moving if o == optimizer)
            if others > 1:
                self.report(
                    call,
                    UNPROVEN,
                    f"`amp.master_params({optimizer})` is read where its step runs only under a "
                    "condition, beside another read of it (one clipping moves before such a step, "
                    "not two)",
                )
                continue
            self.calls.add(id(call))
            self.moves[id(moved)] = (id(target), optimizer, guard)
            self.enter_also(later, target)
            self.report(call, CLIPPED_PER_STEP)
        for (_, optimizer), found in reads.items():
            at = self._unscale_point([statement for _, statement in found])
            if at is None or exits_early(at):
                for call, _ in found:
                    self.report(
                        call,
                        UNPROVEN,
                        f"`amp.master_params({optimizer})` is read on paths "
                        "that no single `unscale_` before the step precedes",
                    )
                continue
            self.calls.update(id(call) for call, _ in found)
            wanted = self.unscale_before.setdefault(id(at), [])
            if optimizer not in wanted:
                wanted.append(optimizer)

    def _clipping_to_move(
        self, call: cst.Call, statement: cst.CSTNode, optimizer: str
    ) -> Optional[tuple[cst.If, cst.CSTNode, Optional[cst.BaseExpression]]]:
        """Where clipping `call` can run instead (U2): the `if cond: ... optimizer.step()`, its
        statement to put the clipping before, and the test of the `if fp16:` arm the clipping
        stood in (None: none). `statement` clips it as one call (its value read, if at all,
        only in the step's `if`), in the block that holds that `if` (no `else`, a pure test) or
        in the first arm of an `if` (a pure test) in that block; nothing after it, or before
        the step in the `if`, touches gradients, amp or what the clipping reads, or leaves
        early; None where it cannot move."""
        small = _one_clipping(statement, call)
        block = self.parent(statement)
        if small is None or not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None
        targets = changed_names(small)
        reads = self._names_in(statement)
        body: list[cst.CSTNode] = list(block.body)
        after = body[body.index(statement) + 1 :]
        guard: Optional[cst.BaseExpression] = None
        arm = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(arm, cst.If)
            and arm.body is block
            and not is_elif(arm, self.parent)
            and pure(arm.test, ("len",))
            and not any(self._steps(s, optimizer) for s in after)
        ):
            guard = arm.test  # the `if fp16:` arm: the clipping moves under the same test
            reads |= self._names_in(arm.test)
            outer = self.parent(arm)
            if not self._untouched(after, reads, targets) or not isinstance(
                outer, (cst.IndentedBlock, cst.Module)
            ):
                return None
            body = list(outer.body)
            after = body[body.index(arm) + 1 :]
        later = next((s for s in after if self._steps(s, optimizer)), None)
        if (
            not isinstance(later, cst.If)
            or later.orelse is not None
            or not isinstance(later.body, cst.IndentedBlock)
            or not pure(later.test, ("len",))
            or not self._untouched(after[: after.index(later)], reads, targets)
        ):
            return None
        inner = list(later.body.body)
        target = next((s for s in inner if self._steps(s, optimizer)), None)
        if target is None or not self._steps_on_every_path(target, optimizer):
            return None
        if not self._untouched(inner[: inner.index(target)], reads, targets):
            return None
        if targets and not self._read_only_within(targets, statement, later.body):
            return None
        return later, target, guard

    def _names_in(self, node: cst.CSTNode) -> set[str]:
        return {n.value for n in self.findall(node, m.Name()) if isinstance(n, cst.Name)}

    def _untouched(self, statements: list, reads: set[str], targets: set[str]) -> bool:
        """None of `statements` touches gradients or amp, leaves early, changes what the
        clipping reads or assigns, or reads what it assigns."""
        return all(
            not exits_early(s)
            and not any(word in self.code_of(s) for word in _GRADIENT_WORDS)
            and not changed_names(s) & (reads | targets)
            and not targets & self._names_in(s)
            for s in statements
        )

    def _read_only_within(self, names: set[str], statement: cst.CSTNode, block: cst.CSTNode) -> bool:
        """Every other mention of `names` in the scope of `statement` lies in `block`."""
        scope = next(
            (p for p in self.ancestors(statement) if isinstance(p, (cst.FunctionDef, cst.Module))),
            self.current_module(),
        )
        inside = {id(n) for n in [*self.findall(block, m.Name()), *self.findall(statement, m.Name())]}
        return all(
            id(name) in inside
            for name in self.findall(scope, m.Name())
            if isinstance(name, cst.Name) and name.value in names
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.calls:
            return params_of(updated_node.args[0].value)
        return updated_node

    def _with_unscale(self, original_node, updated_node):
        if id(original_node) in self.moves:
            target, optimizer, guard = self.moves[id(original_node)]
            self.moved.setdefault(target, (optimizer, [], guard))[1].append(updated_node)
            return cst.RemoveFromParent()
        if id(original_node) in self.moved:
            optimizer, clipping, guard = self.moved.pop(id(original_node))
            scaler = self.plan.scaler_for_optimizer(optimizer)
            unscale = cst.SimpleStatementLine(
                [cst.Expr(cst.parse_expression(f"{scaler}.unscale_({optimizer})"))]
            )
            lines: list[cst.BaseStatement] = [unscale, *clipping]
            if guard is not None:
                lines = [cst.If(test=guard, body=cst.IndentedBlock(lines))]
            lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
            return cst.FlattenSentinel([*lines, updated_node.with_changes(leading_lines=())])
        optimizers = self.unscale_before.get(id(original_node))
        if not optimizers:
            return updated_node
        lines = [
            cst.SimpleStatementLine(
                [cst.Expr(cst.parse_expression(f"{self.plan.scaler_for_optimizer(opt)}.unscale_({opt})"))]
            )
            for opt in optimizers
        ]
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(lines + [updated_node.with_changes(leading_lines=())])

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return self._with_unscale(original_node, updated_node)

    def leave_node(self, original_node, updated_node):
        result = super().leave_node(original_node, updated_node)
        if isinstance(original_node, cst.BaseCompoundStatement) and result is updated_node:
            return self._with_unscale(original_node, updated_node)
        return result
