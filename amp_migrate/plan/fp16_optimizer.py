"""The plan for a file's `apex.fp16_utils.FP16_Optimizer` flow: what its native rewrite does.

Where a file builds one `FP16_Optimizer` and its whole use is visible, the legacy recipe (an
fp16 model, fp32 master weights and a loss scaler inside the optimizer wrapper) has a native
form: fp32 weights, the forward under `torch.autocast`, a `torch.amp.GradScaler`. This planner
follows the flow on the file as given (the wrapper's uses, each `backward` and its `step`, the
conversions of the model to fp16, the parameters the optimizer holds, where each loss's forward
runs) and records it in an `Fp16OptimizerPlan`, with the `TrainingPlan` it implies; or refuses,
located, and the file uses the shim. It rewrites nothing: rules/fp16_optimizer.py carries the
plan out, and the rules after that one (the step, checkpoints) read the `TrainingPlan` as they
read amp's. It plans only files the training planner left without a plan.

Fix safety
    No fix: nothing is rewritten here. The plan is in the safe tier by the O2 rule: like O2's
    native form, fp32 weights under autocast instead of fp16 weights with fp32 masters, within
    the tolerance the equivalence harness asserts (docs/differences.md row E9: losses within
    0.005, parameters within 0.01 relative, the same skipped steps and final scale).

Soundness
    The flow is rewritten only when everything that touches the wrapper is visible in the file
    and has a native counterpart: one `FP16_Optimizer`, bound to a plain name that nothing else
    reads (no passing it on, no `state_dict`, no other attribute); every `backward` followed in
    its own block by the same optimizer's `step`, with only `clip_master_grads` in between (no
    early exit, second backward or read of gradients: Apex updated its scale at `backward` and
    stepped masters the fp16 gradients no longer fed, GradScaler updates at `update()` and
    steps the model's own gradients); every parameter the
    wrapped optimizer holds comes from a model whose conversion to fp16 the rewrite removes; and
    no other fp16 value (`x.half()`, `torch.float16`) that fp32 weights would meet outside
    autocast. Under `if flag:` every use must sit in the function that reads the flag, and
    conversions must run under that flag or none; with the flag off, the disabled scaler and
    autocast pass everything through, which is the plain fp32 program Apex ran then.

    Loss scaling then matches Apex's: FP16_Optimizer's dynamic scaler is Apex's amp
    `LossScaler` (start 2**16 capped at `max_loss_scale` 2**24, halve on overflow and skip the
    step, double after `scale_window` 2000 clean steps), which GradScaler's
    `init_scale`/`backoff_factor`/`growth_factor`/`growth_interval` express exactly but for the
    cap; a static scale S becomes `init_scale=S, growth_interval=2**31 - 1`, equal while
    gradients are finite (AMP467). What changes is the arithmetic of the weights: fp32 weights
    under autocast instead of fp16 weights with fp32 masters (AMP465), which the equivalence
    harness bounds (docs/differences.md). Anything else falls back to the shim, located (AMP466).
"""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from ..analysis.autocast_region import housekeeping_only, loss_block, region_start
from ..analysis.control_flow import exits_early, runs_backward
from ..analysis.fp16_names import star_only_names
from ..analysis.statements import if_without_else_around, is_elif
from ..diagnostics import Severity, define
from ..file_state import FileState
from .fp16_flow import (
    BACKWARD_ARGS,
    CODE,
    CONVERTERS,
    FP16_OPTIMIZER,
    FP16_OPTIMIZER_ARGS,
    METHODS,
    PROXIED,
    Flow,
    Refused,
    assigned,
    keyword,
    reads,
)
from .fp16_model import CONVERSION, Fp16Model
from .fp16_scale import DYNAMIC, STATIC, scaler_call
from .types import Fp16OptimizerPlan, TrainingPlan, bind_arguments, binds_in_ast, literal, pure, scaler_name

FLOW = define(
    "AMP465",
    "fp16-optimizer-to-grad-scaler",
    Severity.INFO,
    "The `FP16_Optimizer` flow became the native recipe: fp32 weights, the forward under "
    "`torch.autocast`, and a `torch.amp.GradScaler`.",
    "Apex kept the model's weights in fp16 and fp32 master copies inside the optimizer "
    "wrapper. Natively the weights stay fp32 and autocast runs each op of the forward in fp16 "
    "where that is safe, so no masters are needed; the loss scaling is the same (AMP467, "
    "AMP468). Trained weights differ from Apex's in the last bits of fp16 rounding, within the "
    "bound docs/differences.md gives; forwards outside the autocast region (evaluation) now run "
    "in fp32, and the model's state-dict keys lose the wrapper's prefix (AMP469).",
    before="model = network_to_half(model)\noptimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n"
    "loss = crit(model(x), y)\noptimizer.backward(loss)\noptimizer.step()",
    after='scaler = torch.amp.GradScaler("cuda")\nwith torch.autocast("cuda", dtype=torch.float16):\n'
    "    loss = crit(model(x), y)\nscaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()",
)
REFUSED = define(
    "AMP466",
    "fp16-optimizer-flow-not-provable",
    Severity.WARNING,
    "This `FP16_Optimizer` flow has no native form amp-migrate can prove right; the file uses the shim.",
    "The native recipe replaces the model's dtype, the optimizer wrapper and its loss scaler "
    "together, so every use of them must be visible and have a native counterpart. The message "
    "names the one that does not: the wrapper passed to code the file does not show, its "
    "`state_dict()` (which holds Apex's loss scaler object and the fp32 masters, unreadable "
    "natively), a `backward` not followed by its `step` in the same block, parameters from a "
    "model whose fp16 conversion is not visible, or fp16 data fp32 weights would meet outside "
    "autocast.",
    before="optimizer = FP16_Optimizer(optimizer)\ntorch.save(optimizer.state_dict(), path)",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="an FP16_Optimizer flow not provably the native recipe",
    fallback_title="an `FP16_Optimizer` whose flow cannot be followed",
    shape=(
        "`type(obj) == FP16_Optimizer` in a helper that unwraps optimizers; a factory function that returns "
        "`FP16_Optimizer(optimizer, dynamic_loss_args=...)` to callers elsewhere."
    ),
    fallback_why=(
        "The native recipe replaces the wrapper by the bare optimizer plus a GradScaler, and "
        "`optimizer.backward(loss)` / `optimizer.step()` / `clip_master_grads` by scaler calls at each use. "
        "A type test would become false for every object, and a returned wrapper's uses are in code this "
        "file does not show, so the rewrite could not reach them."
    ),
    by_hand=(
        "Migrate the callers together with the factory (one project run over the tree), or drop the wrapper: "
        "build a GradScaler where the optimizer is built and pass it with it."
    ),
)
CLIP_NORM = define(
    "AMP480",
    "clip-master-grads-norm-on-overflow",
    Severity.INFO,
    "`clip_master_grads` returned -1 on an overflow; `clip_grad_norm_` returns the non-finite norm there.",
    "Apex skipped the clipping when the step would be skipped and returned -1. After "
    "`scaler.unscale_`, `torch.nn.utils.clip_grad_norm_` computes the norm of the unscaled "
    "gradients, which is inf or NaN on such a step (the step is skipped all the same). Code "
    "that tests the value for -1 must test `torch.isfinite(norm)` instead.",
    before="norm = optimizer.clip_master_grads(1.0)",
    after="scaler.unscale_(optimizer)\nnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)",
)


class PlanFp16Optimizer(Fp16Model):
    """Follow a file's `FP16_Optimizer` flow and plan its native form, or refuse it."""

    MARKERS = ("FP16_Optimizer",)
    HANDLES = (FP16_OPTIMIZER, *CONVERTERS)
    EMITS = (FLOW, REFUSED, STATIC, DYNAMIC, CONVERSION, CLIP_NORM)
    LEAVES = ("fp16_optimizer", "fp16_optimizer_refused")

    def interest(self) -> Optional[frozenset[str]]:
        return None  # every statement: the wrapper's uses and the model's reads may be anywhere

    @classmethod
    def applies(cls, state: FileState) -> bool:
        return state.training is None and super().applies(state)

    def on_visit(self, node: cst.CSTNode) -> bool:
        super().on_visit(node)  # the module: its parent recorded, as a rule's visit records it
        return False  # nothing to collect on the way down: `decide` asks the tree itself

    # -- deciding ------------------------------------------------------------------------------
    def decide(self, module: cst.Module) -> Optional[Fp16OptimizerPlan]:
        """The plan of the flow `read` saw (None: no `FP16_Optimizer` call, or refused, which is
        reported and recorded in the state)."""
        self._star = star_only_names(self.state.index, self.apex)
        try:
            flow = self._analyse(module)
        except Refused as refused:
            self.state.fp16_optimizer_refused = True
            self.report(refused.node, REFUSED, refused.why + "; the file uses the shim")
            return None
        if flow is None:
            return None
        for where, code, message in flow.notes:
            self.report(where, code, message)
        return flow.plan(module, self._training(flow))

    def _training(self, flow: Flow) -> TrainingPlan:
        """The GradScaler plan the flow implies, as the rules after the rewrite read it."""
        assert flow.scaler_call is not None  # `_analyse` built it
        in_function = any(isinstance(p, cst.FunctionDef) for p in self.ancestors(flow.statement))
        autocast = cst.Call(
            cst.parse_expression("torch.autocast"),
            [
                cst.Arg(cst.SimpleString(f'"{self.options.device}"')),
                keyword("dtype", cst.parse_expression(f"torch.{self.options.dtype}")),
            ]
            + ([keyword("enabled", flow.guard.test.deep_clone())] if flow.guard is not None else []),
        )
        return TrainingPlan(
            scaler=flow.scaler,
            placement="local" if in_function else "module",
            scaler_call=flow.scaler_call,
            autocast_call=autocast,
            models=set(flow.models),
            optimizers={flow.target},
            step_lines=frozenset(self.position(c)[0] for c in flow.steps),
        )

    def _analyse(self, module: cst.Module) -> Optional[Flow]:
        call = self._the_call(module)
        if call is None:
            return None
        flow = self._flow_of(call)
        flow.scaler = scaler_name(lambda name: self.name_is_free(name, module))
        built = scaler_call(call, flow, self.options)
        if flow.guard is not None and not any(
            a.keyword is not None and a.keyword.value == "enabled" for a in built.args
        ):
            built = built.with_changes(args=[*built.args, keyword("enabled", flow.guard.test.deep_clone())])
        flow.scaler_call = built
        self._uses(flow)
        self._pairs(flow)
        self._conversions(module, flow)
        self._tie(flow)
        self._dropped_ifs(flow)
        for backward in list(flow.backwards.values()):
            self._region(backward, flow)
        flow.notes.insert(
            0,
            (
                call,
                FLOW,
                f"`{flow.target} = FP16_Optimizer(...)` became `{flow.scaler} = "
                "torch.amp.GradScaler(...)`: the model keeps fp32 weights (Apex: fp16 weights "
                "with fp32 master copies) and its forward up to the loss runs under "
                "torch.autocast; forwards outside that region run in fp32",
            ),
        )
        return flow

    def _the_call(self, module: cst.Module) -> Optional[cst.Call]:
        """The one `FP16_Optimizer(...)` call; a second one or a use other than a call refuses."""
        uses = [
            n
            for n in self.findall(
                module,
                m.Name("FP16_Optimizer") | m.Attribute(attr=m.Name("FP16_Optimizer")),
                ("FP16_Optimizer",),
            )
            if not (
                isinstance(n, cst.Name)
                and isinstance(parent := self.parent(n), cst.Attribute)
                and parent.attr is n
            )
            and self._name(n) == FP16_OPTIMIZER
            and not any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(n))
        ]
        if not uses:
            return None
        calls = [call for call in map(self._called, uses) if call is not None]
        other = next((n for n in uses if self._called(n) is None), None)
        if other is not None:
            raise Refused(
                other,
                f"`{self.code_of(other)}` is used as a value (a type check or a "
                "reference the rule cannot follow), not called",
            )
        if len(calls) > 1:
            raise Refused(calls[1], "the file builds more than one `FP16_Optimizer`")
        return calls[0]

    def _called(self, node: cst.CSTNode) -> Optional[cst.Call]:
        """The call whose function `node` is, if it is one."""
        parent = self.parent(node)
        return parent if isinstance(parent, cst.Call) and parent.func is node else None

    def _grandparent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The parent of `node`'s parent (None where either is missing)."""
        parent = self.parent(node)
        return self.parent(parent) if parent is not None else None

    def _flow_of(self, call: cst.Call) -> Flow:
        assign = self.parent(call)
        line = self.parent(assign) if assign is not None else None
        if isinstance(assign, cst.Return):
            raise Refused(call, "the `FP16_Optimizer` is returned to callers this file does not show")
        if not (
            isinstance(assign, cst.Assign)
            and assign.value is call
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            raise Refused(call, "the `FP16_Optimizer` is not assigned to a plain name on a line of its own")
        guard = self._guard_of(line)
        outer = self._grandparent(guard) if guard is not None else line
        if any(
            isinstance(p, (cst.For, cst.While, cst.If, cst.Try, cst.With))
            for p in self._up_to_function(outer)
        ):
            raise Refused(call, "the `FP16_Optimizer` is built inside a loop, branch, `try` or `with`")
        args = bind_arguments(call, FP16_OPTIMIZER_ARGS)
        if args is None or "init_optimizer" not in args:
            raise Refused(call, "the `FP16_Optimizer` arguments are `*args`/`**kwargs`")
        return Flow(
            target=assign.targets[0].target.value, statement=line, inner=args["init_optimizer"], guard=guard
        )

    def _guard_of(self, line: cst.CSTNode) -> Optional[cst.If]:
        """`if cond:` (no `else`, a side-effect-free test) directly around `line`."""
        owner = if_without_else_around(self.parent(line), self.parent)
        return owner if owner is not None and pure(owner.test) else None

    # -- what the wrapper is used for -------------------------------------------------------------
    def _accesses(self, flow: Flow) -> list[cst.Name]:
        """Every read of the wrapper's name after it was bound (in nested scopes: every read)."""
        target = flow.target_node
        scope = self.get_metadata(ScopeProvider, target)
        inside = {id(n) for n in m.findall(flow.statement, m.Name())}
        line = self.position(flow.statement)[0]
        names: dict[int, cst.Name] = {}
        # libcst keeps assignments and references in sets: walk them in the file's order, so
        # that the refusal reported is the first in the file in every process.
        for assignment in self._in_order(scope.assignments[flow.target]):
            node = getattr(assignment, "node", None)
            if node is not target and isinstance(node, cst.Name) and self.position(node)[0] > line:
                raise Refused(node, f"`{flow.target}` is bound again after the `FP16_Optimizer` is built")
            for access in self._in_order(assignment.references):
                name = access.node
                if (
                    isinstance(name, cst.Name)
                    and id(name) not in inside
                    and (
                        self.get_metadata(ScopeProvider, name, None) is not scope
                        or self.position(name)[0] > line
                    )
                ):
                    names[id(name)] = name
        return sorted(names.values(), key=self.position)

    def _in_order(self, items) -> list:
        """libcst's assignments or accesses (each has a `node`) sorted by where that node is."""

        def where(item) -> tuple[int, int]:
            node = getattr(item, "node", None)  # a builtin's assignment has none
            return self.position(node) if isinstance(node, cst.CSTNode) else (0, 0)

        return sorted(items, key=where)

    def _uses(self, flow: Flow) -> None:
        home = self._function_of(flow.statement)
        for name in self._accesses(flow):
            if (
                flow.guard is not None
                and self._function_of(name) is not home
                and not self._reads_globals(name, flow)
            ):
                raise Refused(
                    name,
                    f"`{flow.target}` is used outside the function that builds it under "
                    f"`if {self.code_of(flow.guard.test)}:`, where that condition cannot be read",
                )
            attribute = self.parent(name)
            if not (isinstance(attribute, cst.Attribute) and attribute.value is name):
                raise Refused(
                    name,
                    f"`{flow.target}` is read as a value here ({self._line_code(name)}): "
                    "what is done with the wrapper there cannot be seen",
                )
            attr = attribute.attr.value
            call = self.parent(attribute)
            if attr in METHODS and isinstance(call, cst.Call) and call.func is attribute:
                self._method(flow, attr, call)
            elif attr == "loss_scale" and not self._is_target(attribute):
                flow.scale_reads.add(id(attribute))
            elif attr == "optimizer":
                flow.unwraps.add(id(attribute))
            elif attr not in PROXIED:
                why = (
                    "its checkpoint holds Apex's loss scaler object and the fp32 master weights, "
                    "which a native optimizer cannot load"
                    if "state_dict" in attr
                    else "it has no native counterpart"
                )
                raise Refused(attribute, f"`{self.code_of(attribute)}`: {why}")

    def _reads_globals(self, node: cst.CSTNode, flow: Flow) -> bool:
        """A guard at module level (`if args.fp16:`) reads in `node`'s functions as it reads
        where it ran: none of them binds a name of the guard itself."""
        if self._function_of(flow.statement) is not None or self.state.index is None:
            return False
        assert flow.guard is not None  # asked only about a guarded wrapper
        names = _free_names(flow.guard.test)
        for function in self.ancestors(node):
            if isinstance(function, cst.Lambda):
                return False
            if isinstance(function, cst.FunctionDef):
                tree = self.state.index.ast_of(function)  # the parse of a `def`, or None
                if not isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)) or any(
                    binds_in_ast(tree, name) is not None for name in names
                ):
                    return False
        return True

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return next((p for p in self.ancestors(node) if isinstance(p, (cst.FunctionDef, cst.Lambda))), None)

    def _site(self, line: cst.CSTNode, flow: Flow) -> cst.CSTNode:
        """The statement of its block that stands for `line`: the `if <guard>:` holding it alone."""
        block = self.parent(line)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            flow.guarded_by(owner)
            and owner.body is block
            and isinstance(block, cst.IndentedBlock)
            and len(block.body) == 1
        ):
            return owner
        return line

    def _is_target(self, node: cst.CSTNode) -> bool:
        parent = self.parent(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)) or (
            isinstance(parent, cst.AnnAssign) and parent.target is node
        )

    def _line_code(self, node: cst.CSTNode) -> str:
        return f"line {self.position(node)[0]}"

    def _method(self, flow: Flow, attr: str, call: cst.Call) -> None:
        line = self._statement(call)
        if attr == "backward":
            bound = bind_arguments(call, BACKWARD_ARGS)
            if (
                bound is None
                or "loss" not in bound
                or literal(bound.get("update_master_grads")) not in (None, True)
                or not (
                    isinstance(line, cst.SimpleStatementLine)
                    and len(line.body) == 1
                    and isinstance(line.body[0], cst.Expr)
                    and line.body[0].value is call
                )
            ):
                raise Refused(call, f"`{self.code_of(call)}` is not a plain backward on a line of its own")
            site = self._site(line, flow)
            if isinstance(site, cst.If) and site.orelse is not None:  # the guard's `if`, not `line`
                self._plain_backward(site, bound)
                line = site  # `if fp16: optimizer.backward(loss) else: loss.backward()`: one native line
            flow.backwards[id(line)] = call
        elif attr == "step":
            if call.args:
                raise Refused(call, "`step(closure)` cannot go through an enabled GradScaler")
            flow.steps.append(call)
        elif attr == "zero_grad":
            if bind_arguments(call, ("set_grads_to_None",)) is None or any(
                a.keyword is not None and a.keyword.value != "set_grads_to_None" for a in call.args
            ):
                raise Refused(call, f"`{self.code_of(call)}` takes arguments Apex's `zero_grad` does not")
            flow.calls.add(id(call))
        else:
            bound = bind_arguments(call, ("max_norm", "norm_type"))
            small = (
                line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
            )
            if (
                bound is None
                or "max_norm" not in bound
                or set(bound) - {"max_norm", "norm_type"}
                or getattr(small, "value", None) is not call
            ):
                raise Refused(call, f"`{self.code_of(call)}` is not a plain call on a line of its own")
            if not isinstance(small, cst.Expr):
                flow.notes.append((call, CLIP_NORM, None))
            flow.clips[id(line)] = call
            flow.calls.add(id(call))

    def _plain_backward(self, branch: cst.If, bound: dict) -> None:
        """The `else` of `if fp16: optimizer.backward(loss)` is `loss.backward()` of the same loss."""
        wanted = (
            f"{CODE(bound['loss'])}.backward()"
            if "retain_graph" not in bound
            else f"{CODE(bound['loss'])}.backward(retain_graph={CODE(bound['retain_graph'])})"
        )
        orelse = branch.orelse
        body = (
            orelse.body.body
            if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock)
            else ()
        )
        if not (
            len(body) == 1
            and isinstance(body[0], cst.SimpleStatementLine)
            and len(body[0].body) == 1
            and "".join(CODE(body[0].body[0]).split()) == "".join(wanted.split())
        ):
            raise Refused(
                branch,
                f"the `else` of `if {self.code_of(branch.test)}:` is not `{wanted}`, so the "
                "two paths do not collapse into one scaled backward",
            )

    def _line_of(self, call: cst.Call) -> cst.SimpleStatementLine:
        """The line of a `backward` or clip call `_method` accepted: a statement of its own."""
        return cst.ensure_type(self._statement(call), cst.SimpleStatementLine)

    def _pairs(self, flow: Flow) -> None:
        """Each backward is followed in its block by one step, with only clipping in between."""
        if not flow.backwards or not flow.steps:
            raise Refused(flow.statement, f"`{flow.target}` has no `backward` and `step` in this file")
        steps = {id(self._statement(c)): c for c in flow.steps}
        paired: set[int] = set()
        for backward in flow.backwards.values():
            line = self._site(self._line_of(backward), flow)
            block = self.parent(line)
            body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else [line]
            at = next(i for i, s in enumerate(body) if s is line)
            for later in body[at + 1 :]:
                if id(later) in steps:
                    paired.add(id(later))
                    break
                if id(later) in flow.clips or self._guarded_clip(later, flow):
                    continue
                if exits_early(later) or runs_backward(later) or self._touches(later, flow):
                    raise Refused(
                        later,
                        f"line {self.position(later)[0]} stands between `{self.code_of(backward)}` "
                        "and its step: it may read gradients or the wrapper (Apex updated the loss scale "
                        "at `backward` and kept the model's fp16 gradients scaled; natively the scale "
                        "changes at `update()` and the model's gradients are the ones stepped)",
                    )
            else:
                raise Refused(
                    backward, f"no `{flow.target}.step()` follows `{self.code_of(backward)}` in its block"
                )
        for line_id, step in steps.items():
            if line_id not in paired:
                raise Refused(step, f"`{self.code_of(step)}` does not follow a `backward` in its block")
        for clip in flow.clips.values():
            if not self._between_pair(clip, flow):
                raise Refused(clip, f"`{self.code_of(clip)}` is not between a `backward` and its step")

    def _touches(self, statement: cst.CSTNode, flow: Flow) -> bool:
        """The statement reads the wrapper or (possibly) gradients: Apex's fp16 model gradients
        stayed scaled after `backward` and did not feed the step; natively they are the ones
        stepped, so a read there (clipping `model.parameters()`) would act differently."""
        names = {n.value for n in m.findall(statement, m.Name()) if isinstance(n, cst.Name)}
        return flow.target in names or any(
            "grad" in n or n in ("parameters", "named_parameters") for n in names
        )

    def _guarded_clip(self, statement: cst.CSTNode, flow: Flow) -> bool:
        """`if fp16: optimizer.clip_master_grads(c) else: clip_grad_norm_(...)`: the `else` runs
        only where the scaler is disabled, on gradients Apex never scaled either."""
        if not (
            flow.guarded_by(statement)
            and len(statement.body.body) == 1
            and id(statement.body.body[0]) in flow.clips
        ):
            return False
        names = m.findall(statement.orelse, m.Name()) if statement.orelse is not None else []
        return not any(isinstance(n, cst.Name) and n.value == flow.target for n in names)

    def _between_pair(self, clip: cst.Call, flow: Flow) -> bool:
        line = self._site(self._line_of(clip), flow)
        block = self.parent(line)
        body = list(getattr(block, "body", ()))
        at = next((i for i, s in enumerate(body) if s is line), None)
        if at is None:
            return False
        sites = {id(self._site(self._line_of(c), flow)) for c in flow.backwards.values()}
        for earlier in reversed(body[:at]):
            if id(earlier) in sites:
                return True
            if id(earlier) not in flow.clips and not self._guarded_clip(earlier, flow):
                return False
        return False

    # -- the `if`s the rewrite empties ----------------------------------------------------------
    def _dropped_ifs(self, flow: Flow) -> None:
        """`if fp16:` statements whose every statement the rewrite removes go too."""
        removed = {k for k, v in flow.conversions.items() if v is None}
        if CODE(flow.inner) == flow.target:
            removed.add(id(flow.statement))
        for line in [flow.statement, *self._conversion_lines]:
            owner = self._grandparent(line)
            if (
                isinstance(owner, cst.If)
                and owner.orelse is None
                and not is_elif(owner, self.parent)
                and all(id(s) in removed for s in owner.body.body)
            ):
                flow.dropped_ifs.add(id(owner))

    # -- the optimizer's parameters --------------------------------------------------------------
    def _tie(self, flow: Flow) -> None:
        """Every parameter the wrapped optimizer holds is one of a converted model's."""
        constructor = flow.inner if isinstance(flow.inner, cst.Call) else self._bound_call(flow)
        if constructor is None:
            raise Refused(
                flow.inner,
                f"`{self.code_of(flow.inner)}` is not built in this scope, so which "
                "parameters it holds cannot be seen",
            )
        params = next(
            (a.value for a in constructor.args if a.keyword is not None and a.keyword.value == "params"),
            constructor.args[0].value
            if constructor.args and constructor.args[0].keyword is None and not constructor.args[0].star
            else None,
        )
        if params is None:
            raise Refused(constructor, "the optimizer's parameters are not its first argument")
        owners = [
            c.func.value
            for c in m.findall(
                params, m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters")))
            )
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
        ]
        unknown = _free_names(params) - {CODE(o).split(".")[0] for o in owners} - {"filter", "list", "tuple"}
        if not owners or unknown or any(CODE(o) not in flow.models for o in owners):
            raise Refused(
                params,
                f"`{self.code_of(params)}` may hold parameters of a model whose fp16 "
                "conversion this file does not show",
            )

    def _bound_call(self, flow: Flow) -> Optional[cst.Call]:
        if not isinstance(flow.inner, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, flow.target_node)
        line = self.position(flow.statement)[0]
        found = None
        for assignment in self._in_order(scope.assignments[flow.inner.value]):
            node = getattr(assignment, "node", None)
            if not isinstance(node, cst.Name):
                continue
            assign = self._grandparent(node)
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and self.position(node)[0] < line:
                found = assign.value if isinstance(assign.value, cst.Call) else None
        return found

    # -- the autocast region --------------------------------------------------------------------
    def _region(self, backward: cst.Call, flow: Flow) -> None:
        """The statements of the enclosing block from the first use of a converted model to the
        last assignment of the loss go under autocast."""
        bound = bind_arguments(backward, BACKWARD_ARGS)
        assert bound is not None  # `_method` took only backwards whose arguments bind
        found = loss_block(
            self._line_of(backward), reads(bound["loss"]), assigned, self.parent, self.statement_around
        )
        if found is None:
            raise Refused(backward, f"the loss of `{self.code_of(backward)}` is not computed in its function")
        block, body, last = found
        start = region_start(body, last, runs_backward)
        first = next((i for i in range(start, last + 1) if self._runs_model(body[i], flow)), None)
        if first is None:
            raise Refused(
                backward,
                f"no forward of {_names(flow.models)} is visible before the loss "
                "that this backward scales, so the autocast region cannot be placed",
            )
        flow.regions.setdefault(id(block), []).append((first, last))

    def _runs_model(self, statement: cst.CSTNode, flow: Flow) -> bool:
        if id(statement) in flow.conversions:
            return False
        if housekeeping_only(statement, flow.models):
            return False
        return bool(reads(statement) & flow.models)


def _names(codes) -> str:
    return ", ".join(f"`{c}`" for c in sorted(codes))


def _free_names(expr: cst.CSTNode) -> set[str]:
    """Names an expression reads from outside it (not attribute names, keywords, lambda
    parameters or comprehension targets)."""
    bound = {p.name.value for p in m.findall(expr, m.Param()) if isinstance(p, cst.Param)}
    for comp in m.findall(expr, m.CompFor()):
        if isinstance(comp, cst.CompFor):
            bound |= {n.value for n in m.findall(comp.target, m.Name()) if isinstance(n, cst.Name)}
    skip = {id(a.attr) for a in m.findall(expr, m.Attribute()) if isinstance(a, cst.Attribute)} | {
        id(a.keyword) for a in m.findall(expr, m.Arg()) if isinstance(a, cst.Arg) and a.keyword is not None
    }
    return {
        n.value for n in m.findall(expr, m.Name()) if isinstance(n, cst.Name) and id(n) not in skip
    } - bound


def plan_fp16_optimizer(module: cst.Module, state: FileState) -> Optional[Fp16OptimizerPlan]:
    """Plan `module`'s `FP16_Optimizer` flow (None: none, or refused and reported); the plan
    names nodes of `module`, the tree given."""
    planner = PlanFp16Optimizer(state)
    planner.read(module)
    return planner.decide(module)
