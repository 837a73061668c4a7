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

Soundness
    The flow is rewritten only when everything that touches the wrapper is visible in the file
    and has a native counterpart: one `FP16_Optimizer`, bound to a plain name that nothing else
    reads (no passing it on, no `state_dict`, no other attribute); every `backward` followed in
    its own block by the same optimizer's `step`, with only `clip_master_grads` in between (no
    early exit, second backward or read of gradients: Apex updated its scale at `backward` and
    stepped masters the fp16 gradients no longer fed, GradScaler updates at `update()` and
    steps the model's own gradients); every parameter the
    wrapped optimizer holds comes from a model whose conversion to fp16 this rule removes; and
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from ..analysis.autocast_region import loss_block, region_start
from ..analysis.call_args import NOT_LITERAL
from ..analysis.control_flow import exits_early, runs_backward
from ..analysis.fp16_names import PACKAGE, fp16_name, star_only_names
from ..diagnostics import Code, Severity, define
from ..file_state import FileState
from .options import STATIC_GROWTH_INTERVAL
from .planner import Planner
from .types import Fp16OptimizerPlan, TrainingPlan, bind_arguments, binds_in_ast, literal, pure, scaler_name

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10; only ever read by the type checker here

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
STATIC = define(
    "AMP467",
    "fp16-optimizer-static-scale",
    Severity.INFO,
    "`FP16_Optimizer`'s static loss scale became a GradScaler that starts there and never grows; "
    "it differs from Apex only on a step whose gradients are not finite.",
    "A static scale S never changed and never skipped a step. `init_scale=S, "
    "growth_interval=2**31 - 1` scales and unscales by the same S while gradients are finite; "
    "on a step with inf/NaN gradients Apex applied them (the weights became non-finite), "
    "GradScaler skips the step and halves its scale (as for AMP111). The default static scale "
    "1.0 scales nothing, so the GradScaler is disabled, which is exact.",
    before="optimizer = FP16_Optimizer(optimizer, static_loss_scale=128.0)",
    after='scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)',
)
DYNAMIC = define(
    "AMP468",
    "fp16-optimizer-dynamic-scale",
    Severity.INFO,
    "`FP16_Optimizer`'s dynamic loss scaler became a GradScaler with the same schedule.",
    'With `dynamic_loss_scale=True` FP16_Optimizer uses Apex\'s amp `LossScaler("dynamic")` '
    "(not the legacy `DynamicLossScaler`): it starts at `min(init_scale, max_loss_scale)` "
    "(2**16 and 2**24 by default), halves the scale and skips the step on an overflow and "
    "doubles it after `scale_window` (2000) clean steps. GradScaler's `init_scale`, "
    "`backoff_factor=0.5`, `growth_factor=2.0` and `growth_interval` do the same. "
    "`scale_factor` was ignored by Apex and is dropped; `min_loss_scale`/`max_loss_scale` bounds "
    "have no GradScaler equivalent (its scale is unbounded).",
    before="optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True,\n"
    '                           dynamic_loss_args={"scale_window": 500})',
    after='scaler = torch.amp.GradScaler("cuda", growth_interval=500)',
)
CONVERSION = define(
    "AMP469",
    "fp16-model-conversion-removed",
    Severity.INFO,
    "The model's conversion to fp16 was removed: its weights stay fp32 and autocast chooses "
    "each op's precision.",
    "`network_to_half`, `.half()`, `BN_convert_float` and `FP16Model` made the fp16 model "
    "FP16_Optimizer needed. Natively the fp32 model runs under autocast. `network_to_half` "
    "wrapped the model in `nn.Sequential(tofp16(), model)` (state-dict keys `1.*`) and "
    "`FP16Model` in a module with a `network` attribute (keys `network.*`); the model is now "
    "the bare one, so old checkpoints of it need their keys renamed.",
    before="model = network_to_half(model)",
    after="# removed",
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

FP16_OPTIMIZER = f"{PACKAGE}.FP16_Optimizer"
CONVERTERS = {
    f"{PACKAGE}.network_to_half": "1.",
    f"{PACKAGE}.FP16Model": "network.",
    f"{PACKAGE}.BN_convert_float": "",
}
FP16_OPTIMIZER_ARGS = (
    "init_optimizer",
    "static_loss_scale",
    "dynamic_loss_scale",
    "dynamic_loss_args",
    "verbose",
)
_DYNAMIC_KEYS = ("init_scale", "scale_factor", "scale_window", "min_loss_scale", "max_loss_scale")
_METHODS = ("backward", "step", "zero_grad", "clip_master_grads")
BACKWARD_ARGS = ("loss", "update_master_grads", "retain_graph")  # FP16_Optimizer.backward's parameters
_PROXIED = ("param_groups", "state")  # FP16_Optimizer forwards these to the optimizer it wraps
_HALF_SPELLINGS = ("float16", "half", "HalfTensor")
_HOUSEKEEPING = ("zero_grad", "train", "eval", "to", "cuda", "cpu", "requires_grad_")
_CODE = cst.Module([]).code_for_node


class Refused(Exception):
    def __init__(self, node: cst.CSTNode, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


@dataclass
class Flow:
    """The flow as the planner follows it, keyed by ids of the nodes of the tree it reads;
    frozen into an `Fp16OptimizerPlan` once every check passed."""

    target: str
    statement: cst.SimpleStatementLine
    inner: cst.BaseExpression
    scaler: str = "scaler"
    scaler_call: Optional[cst.Call] = None
    backwards: dict[int, cst.Call] = field(default_factory=dict)  # statement -> backward call
    steps: list[cst.Call] = field(default_factory=list)
    clips: dict[int, cst.Call] = field(default_factory=dict)  # statement -> clip call
    calls: set[int] = field(default_factory=set)  # zero_grad / clip calls to rewrite
    unwraps: set[int] = field(default_factory=set)  # `optimizer.optimizer`
    scale_reads: set[int] = field(default_factory=set)  # `optimizer.loss_scale`
    conversions: dict[int, Optional[cst.BaseExpression]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    regions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    notes: list[tuple[cst.CSTNode, Code, Optional[str]]] = field(default_factory=list)
    #: `if args.fp16:` around the wrapper: the GradScaler is built before it with `enabled=`
    guard: Optional[cst.If] = None
    dropped_ifs: set[int] = field(default_factory=set)  # `if` statements left with nothing in them

    @property
    def target_node(self) -> cst.BaseAssignTargetExpression:
        """The wrapper's name where `statement` binds it (`_flow_of` checked the shape)."""
        return cst.ensure_type(self.statement.body[0], cst.Assign).targets[0].target

    def guarded_by(self, node: Optional[cst.CSTNode]) -> TypeGuard[cst.If]:
        """`node` is an `if` on the wrapper's own guard."""
        return (
            self.guard is not None and isinstance(node, cst.If) and _CODE(node.test) == _CODE(self.guard.test)
        )

    def plan(self, module: cst.Module, training: TrainingPlan) -> Fp16OptimizerPlan:
        return Fp16OptimizerPlan(
            module=module,
            training=training,
            target=self.target,
            statement=self.statement,
            inner=self.inner,
            guard=self.guard,
            backwards=dict(self.backwards),
            clips=dict(self.clips),
            calls=frozenset(self.calls),
            unwraps=frozenset(self.unwraps),
            scale_reads=frozenset(self.scale_reads),
            conversions=dict(self.conversions),
            regions={block: tuple(spans) for block, spans in self.regions.items()},
            dropped_ifs=frozenset(self.dropped_ifs),
        )


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spaced as a keyword argument is."""
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )


def _reads(node: cst.CSTNode) -> set[str]:
    """Names and dotted attributes an expression or statement reads (`loss`, `self.model`)."""
    found: set[str] = set()
    for name in m.findall(node, m.Name() | m.Attribute()):
        found.add(_CODE(name))
    return found


def _assigned(statement: cst.CSTNode) -> set[str]:
    """What a statement assigns, anywhere in it (targets of `=`, `+=`, `for`, `with ... as`)."""
    targets = m.findall(statement, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For() | m.WithItem())
    out: set[str] = set()
    for node in targets:
        target: Optional[cst.BaseExpression]
        if isinstance(node, cst.WithItem):
            target = node.asname.name if node.asname is not None else None
        else:  # `AssignTarget`, `AugAssign`, `AnnAssign`, `For`: each has a `target`
            target = getattr(node, "target", None)
        if target is not None:
            out |= {_CODE(t) for t in m.findall(target, m.Name() | m.Attribute())}
    return out


class PlanFp16Optimizer(Planner):
    """Follow a file's `FP16_Optimizer` flow and plan its native form, or refuse it."""

    MARKERS = ("FP16_Optimizer",)
    HANDLES = (FP16_OPTIMIZER, *CONVERTERS)
    EMITS = (FLOW, REFUSED, STATIC, DYNAMIC, CONVERSION, CLIP_NORM)
    LEAVES = ("fp16_optimizer", "fp16_optimizer_refused")

    def interest(self):
        return None

    @classmethod
    def applies(cls, state: FileState) -> bool:
        return state.training is None and super().applies(state)

    def __init__(self, state: FileState) -> None:
        super().__init__(state)
        self._star: set[str] = set()
        self._conversion_lines: list[cst.CSTNode] = []

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

    def _name(self, node: cst.CSTNode) -> Optional[str]:
        assert self.apex is not None
        return fp16_name(self.apex, node, self._star)

    def _analyse(self, module: cst.Module) -> Optional[Flow]:
        call = self._the_call(module)
        if call is None:
            return None
        flow = self._flow_of(call)
        flow.scaler = scaler_name(lambda name: self.name_is_free(name, module))
        scaler_call = self._scaler_call(call, flow)
        if flow.guard is not None and not any(
            a.keyword is not None and a.keyword.value == "enabled" for a in scaler_call.args
        ):
            scaler_call = scaler_call.with_changes(
                args=[*scaler_call.args, keyword("enabled", flow.guard.test.deep_clone())]
            )
        flow.scaler_call = scaler_call
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
        block = self.parent(line)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.If) and owner.body is block and owner.orelse is None and pure(owner.test):
            return owner
        return None

    def _up_to_function(self, node: Optional[cst.CSTNode]) -> Iterator[cst.CSTNode]:
        if node is None:  # above a module-level guard: nothing
            return
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.Module)):
                return
            yield parent

    # -- the loss scale ---------------------------------------------------------------------------
    def _scaler_call(self, call: cst.Call, flow: Flow) -> cst.Call:
        args = bind_arguments(call, FP16_OPTIMIZER_ARGS) or {}
        scaler_args = [cst.Arg(cst.SimpleString(f'"{self.options.device}"'))]
        if not self.options.needs_loss_scaling:  # bfloat16: no scaling at all
            return self._built(scaler_args + [keyword("enabled", cst.Name("False"))], None, None)
        dynamic = args.get("dynamic_loss_scale")
        dynamic_value = literal(dynamic) if dynamic is not None else False
        static = args.get("static_loss_scale")
        static_value = literal(static) if static is not None else 1.0
        for node, value in ((dynamic, dynamic_value), (static, static_value)):
            if value is NOT_LITERAL and node is not None and not pure(node):  # an absent one is None
                raise Refused(node, f"`{self.code_of(node)}` is an expression with side effects")
        init, window = (
            self._dynamic_schedule(args.get("dynamic_loss_args"), flow)
            if dynamic_value is not False
            else (None, None)
        )
        if dynamic is not None and dynamic_value is not NOT_LITERAL and dynamic_value:
            flow.notes.append((dynamic, DYNAMIC, None))
            return self._built(scaler_args, init, window)
        if isinstance(static_value, (int, float)) and not isinstance(static_value, bool):
            if not 0.0 < static_value < float("inf"):
                assert static is not None  # the default, 1.0, is a usable scale
                raise Refused(static, f"`static_loss_scale={static_value!r}` is no usable scale")
            if static_value == 1.0 and dynamic_value is False:
                flow.notes.append(
                    (
                        static or call,
                        STATIC,
                        "a static loss scale of 1.0 scaled nothing: the "
                        "GradScaler is disabled, exactly as Apex neither scaled nor skipped",
                    )
                )
                return self._built(scaler_args + [keyword("enabled", cst.Name("False"))], None, None)
        elif static_value is not NOT_LITERAL:
            assert static is not None  # the default, 1.0, is a number
            raise Refused(static, f"`static_loss_scale={static_value!r}` is no number")
        static_expr = static if static is not None else cst.Float("1.0")
        flow.notes.append((static if static is not None else call, STATIC, None))
        never = cst.parse_expression(STATIC_GROWTH_INTERVAL)
        if dynamic_value is False:
            return self._built(scaler_args, static_expr, never)
        assert dynamic is not None  # an absent `dynamic_loss_scale` is False
        flow.notes.append(
            (
                dynamic,
                DYNAMIC,
                f"`{self.code_of(dynamic)}` chooses at run time between "
                "Apex's dynamic scaler and the static scale; the GradScaler's arguments follow it",
            )
        )
        return self._built(
            scaler_args,
            _if(dynamic, init or cst.Float("65536.0"), static_expr),
            _if(dynamic, window or cst.Integer("2000"), never),
        )

    @staticmethod
    def _built(
        args: list[cst.Arg], init: Optional[cst.BaseExpression], window: Optional[cst.BaseExpression]
    ) -> cst.Call:
        if init is not None:
            args.append(keyword("init_scale", init))
        if window is not None:
            args.append(keyword("growth_interval", window))
        return cst.Call(cst.parse_expression("torch.amp.GradScaler"), args)

    def _dynamic_schedule(
        self, node: Optional[cst.BaseExpression], flow: Flow
    ) -> tuple[Optional[cst.BaseExpression], Optional[cst.BaseExpression]]:
        """(init_scale, growth_interval) expressions for `dynamic_loss_args` (None: the default)."""
        if node is None or literal(node) is None:
            return None, None
        if not isinstance(node, cst.Dict) or any(not isinstance(e, cst.DictElement) for e in node.elements):
            raise Refused(node, "`dynamic_loss_args` is not a literal dict")
        given: dict[str, cst.BaseExpression] = {}
        for element in [e for e in node.elements if isinstance(e, cst.DictElement)]:  # every one, as checked
            key = literal(element.key)
            if key not in _DYNAMIC_KEYS:
                raise Refused(element, f"`dynamic_loss_args` key {key!r} is not one Apex's LossScaler takes")
            if not pure(element.value):
                raise Refused(element.value, f"`{self.code_of(element.value)}` has side effects")
            given[key] = element.value
        for dropped in ("scale_factor", "min_loss_scale", "max_loss_scale"):
            if dropped in given:
                flow.notes.append(
                    (
                        given[dropped],
                        DYNAMIC,
                        f"`{dropped}` has no GradScaler equivalent and was "
                        "dropped" + (" (Apex ignored it too)" if dropped == "scale_factor" else ""),
                    )
                )
        cap = given.get("max_loss_scale", cst.parse_expression("2.0**24"))
        init = given.get("init_scale")
        start: Optional[cst.BaseExpression]
        if init is None and "max_loss_scale" not in given:
            start = None
        else:
            values = [literal(init) if init is not None else 2.0**16, literal(cap)]
            start = (
                cst.Float(repr(float(min(values))))
                if NOT_LITERAL not in values
                else cst.Call(
                    cst.Name("min"),
                    [
                        cst.Arg(
                            init or cst.Float("65536.0"),
                            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                        ),
                        cst.Arg(cap),
                    ],
                )
            )
        return start, given.get("scale_window")

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
            if attr in _METHODS and isinstance(call, cst.Call) and call.func is attribute:
                self._method(flow, attr, call)
            elif attr == "loss_scale" and not self._is_target(attribute):
                flow.scale_reads.add(id(attribute))
            elif attr == "optimizer":
                flow.unwraps.add(id(attribute))
            elif attr not in _PROXIED:
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
            f"{_CODE(bound['loss'])}.backward()"
            if "retain_graph" not in bound
            else f"{_CODE(bound['loss'])}.backward(retain_graph={_CODE(bound['retain_graph'])})"
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
            and "".join(_CODE(body[0].body[0]).split()) == "".join(wanted.split())
        ):
            raise Refused(
                branch,
                f"the `else` of `if {self.code_of(branch.test)}:` is not `{wanted}`, so the "
                "two paths do not collapse into one scaled backward",
            )

    def _statement(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        statements = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
        return next((p for p in self.ancestors(node) if isinstance(p, statements)), None)

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

    # -- the fp16 model -------------------------------------------------------------------------
    def _conversion_calls(self, module: cst.Module) -> list[cst.Call]:
        return [call for call in m.findall(module, m.Call()) if self._is_conversion(call)]

    def _conversions(self, module: cst.Module, flow: Flow) -> None:
        """Each fp16 conversion is a whole statement that converts one model (which it now keeps
        fp32); any other fp16 value refuses."""
        self._refuse_half_values(module)
        for call in self._conversion_calls(module):
            line = self._statement(call)
            if id(line) not in flow.conversions:
                self._conversion(call, line, flow)
        if not flow.models:
            raise Refused(
                flow.statement,
                "no conversion of a model to fp16 is visible in this file, so "
                "the parameters the optimizer holds may be fp16 from code the rule cannot see",
            )
        self._model_reads(module, flow.models)

    def _refuse_half_values(self, module: cst.Module) -> None:
        """An fp16 dtype (`torch.float16`, `torch.cuda.HalfTensor`) that is neither called nor the
        argument of a conversion makes fp16 values."""
        for node in m.findall(
            module,
            m.Attribute(
                value=m.Name("torch") | m.Attribute(m.Name("torch"), m.Name("cuda")),
                attr=m.OneOf(*map(m.Name, _HALF_SPELLINGS)),
            ),
        ):
            parent = self.parent(node)
            converts = isinstance(parent, cst.Arg) and self._is_conversion(self.parent(parent))
            if not converts and not (isinstance(parent, cst.Call) and parent.func is node):
                raise Refused(
                    node,
                    f"`{self.code_of(node)}` makes fp16 values that fp32 weights would meet outside autocast",
                )

    def _conversion(self, call: cst.Call, line: Optional[cst.CSTNode], flow: Flow) -> None:
        """`call`, a conversion on `line`, converts a model, which the rewrite keeps fp32."""
        small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if (
            line is None
            or not isinstance(small, (cst.Assign, cst.Expr))
            or not self._within(call, small.value)
        ):
            raise Refused(
                call, f"`{self.code_of(call)}` converts to fp16 outside a statement that converts a model"
            )
        self._conversion_lines.append(line)
        self._check_condition(line, call, flow)
        stripped, prefixes = self._strip(small.value)
        if any(c is not None for c in m.findall(stripped, m.Call()) if self._is_conversion(c)):
            raise Refused(
                call,
                f"`{self.code_of(call)}` makes an fp16 value that is no model, which fp32 "
                "weights would meet outside autocast",
            )
        model = self._converted_model(call, small, stripped)
        kept = flow.conversions[id(line)] = None if _CODE(model) == _CODE(stripped) else stripped
        flow.models.add(_CODE(model))
        kind = (
            " and its state-dict keys lose the `{}` prefix".format("`, `".join(sorted(prefixes)))
            if prefixes
            else ""
        )
        done = (
            f"`{self.code_of(small).strip()}` removed"
            if kept is None
            else f"`{self.code_of(small).strip()}` became `{_CODE(small.with_changes(value=kept)).strip()}`"
        )
        flow.notes.append((line, CONVERSION, f"{done}: `{_CODE(model)}` stays fp32{kind}"))

    def _converted_model(
        self, call: cst.Call, small: Union[cst.Assign, cst.Expr], stripped: cst.BaseExpression
    ) -> cst.BaseExpression:
        """The model a conversion statement converts: the name it assigns or, on a line of its
        own, the one whose methods it calls."""
        if isinstance(small, cst.Assign):
            if len(small.targets) != 1 or not pure(small.targets[0].target):
                raise Refused(call, "the converted model is not assigned to a plain name")
            return small.targets[0].target
        model = stripped
        while isinstance(model, cst.Call) and isinstance(model.func, cst.Attribute):
            model = model.func.value  # `model.cuda().half()`: `model`
        if not isinstance(model, (cst.Name, cst.Attribute)) or not pure(model):
            raise Refused(call, f"`{self.code_of(call)}` converts no model by name")
        # `model.cuda().half()` on its own line still moves the model: `model.cuda()` is kept
        return model

    def _check_condition(self, line: cst.CSTNode, call: cst.Call, flow: Flow) -> None:
        """A conversion runs unconditionally or under the wrapper's own guard: natively the model
        stays fp32 either way, which is right only where Apex's fp16 model got FP16_Optimizer."""
        conditions = [p for p in self._up_to_function(line) if isinstance(p, cst.BaseCompoundStatement)]
        if not conditions or (
            len(conditions) == 1 and flow.guarded_by(conditions[0]) and conditions[0].orelse is None
        ):
            return
        raise Refused(
            call,
            f"`{self.code_of(call)}` runs under a condition other than the one that builds "
            "the `FP16_Optimizer`",
        )

    def _dropped_ifs(self, flow: Flow) -> None:
        """`if fp16:` statements whose every statement the rewrite removes go too."""
        removed = {k for k, v in flow.conversions.items() if v is None}
        if _CODE(flow.inner) == flow.target:
            removed.add(id(flow.statement))
        for line in [flow.statement, *self._conversion_lines]:
            owner = self._grandparent(line)
            if (
                isinstance(owner, cst.If)
                and owner.orelse is None
                and all(id(s) in removed for s in owner.body.body)
            ):
                flow.dropped_ifs.add(id(owner))

    def _within(self, node: cst.CSTNode, value: cst.CSTNode) -> bool:
        return node is value or any(a is value for a in self.ancestors(node))

    def _is_conversion(self, call: Optional[cst.CSTNode]) -> TypeGuard[cst.Call]:
        if not isinstance(call, cst.Call):
            return False
        return (
            (m.matches(call.func, m.Attribute(attr=m.Name("half"))) and not call.args)
            or self._name(call.func) in CONVERTERS
            or _half_type(call) is not None
        )

    def _strip(self, expr: cst.BaseExpression) -> tuple[cst.BaseExpression, set[str]]:
        """`network_to_half(Net().cuda())` → (`Net().cuda()`, {"1."}); `m.cuda().half()` → `m.cuda()`."""
        prefixes: set[str] = set()
        while isinstance(expr, cst.Call):
            name = self._name(expr.func)
            if (
                name in CONVERTERS
                and len(expr.args) == 1
                and expr.args[0].keyword is None
                and not expr.args[0].star
            ):
                if CONVERTERS[name]:
                    prefixes.add(CONVERTERS[name])
                expr = expr.args[0].value
            elif (
                isinstance(expr.func, cst.Attribute)
                and m.matches(expr.func, m.Attribute(attr=m.Name("half")))
                and not expr.args
            ):
                expr = expr.func.value
            elif _half_type(expr) is not None:  # `model.type(torch.cuda.HalfTensor)`: to CUDA, in fp32
                inner, more = self._strip(cst.ensure_type(expr.func, cst.Attribute).value)
                prefixes |= more
                return (
                    cst.Call(cst.Attribute(inner, cst.Name("cuda"))) if _half_type(expr) else inner
                ), prefixes
            elif isinstance(expr.func, cst.Attribute):
                inner, more = self._strip(expr.func.value)
                prefixes |= more
                return expr.with_changes(func=expr.func.with_changes(value=inner)), prefixes
            else:
                break
        return expr, prefixes

    def _model_reads(self, module: cst.Module, models: set[str]) -> None:
        """The wrapper modules had a shape of their own (`model[1]`, `model.network`); the first
        such read in the file is reported, whichever model it reads (not a set's first)."""
        for node in m.findall(module, m.Subscript() | m.Attribute(attr=m.Name("network"))):
            if isinstance(node, (cst.Subscript, cst.Attribute)) and _CODE(node.value) in models:
                raise Refused(
                    node,
                    f"`{self.code_of(node)}` reads the fp16 wrapper module, which the "
                    "native model does not have",
                )

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
        unknown = _free_names(params) - {_CODE(o).split(".")[0] for o in owners} - {"filter", "list", "tuple"}
        if not owners or unknown or any(_CODE(o) not in flow.models for o in owners):
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
            self._line_of(backward), _reads(bound["loss"]), _assigned, self.parent, self.statement_around
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
        housekeeping = m.Expr(m.Call(func=m.Attribute(attr=m.OneOf(*map(m.Name, _HOUSEKEEPING)))))
        if isinstance(statement, cst.SimpleStatementLine) and all(
            m.matches(s, housekeeping) and _CODE(_receiver(s)) in flow.models for s in statement.body
        ):
            return False
        return bool(_reads(statement) & flow.models)


def _receiver(statement: cst.BaseSmallStatement) -> cst.BaseExpression:
    """`model` of a statement `model.train()` (one `_runs_model`'s housekeeping matcher matched)."""
    call = cst.ensure_type(cst.ensure_type(statement, cst.Expr).value, cst.Call)
    return cst.ensure_type(call.func, cst.Attribute).value


def _half_type(call: cst.Call) -> Optional[bool]:
    """`x.type(torch.cuda.HalfTensor)` → True (it also moves `x` to CUDA), `x.type(torch.HalfTensor)`
    or `x.type(torch.float16)` → False; None for any other call."""
    if not (
        m.matches(call.func, m.Attribute(attr=m.Name("type")))
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
    ):
        return None
    spelled = _CODE(call.args[0].value)
    if spelled == "torch.cuda.HalfTensor":
        return True
    return False if spelled in ("torch.HalfTensor", "torch.half", "torch.float16") else None


def _if(test: cst.BaseExpression, yes: cst.BaseExpression, no: cst.BaseExpression) -> cst.IfExp:
    return cst.IfExp(
        test=test.deep_clone(), body=yes, orelse=no, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
    )


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
