"""The plan for a file's native training loop: one GradScaler, where it lives, how it is built.

Apex keeps its loss scalers in process-global state, so `amp.initialize`, `amp.scale_loss`,
`optimizer.step()` and `amp.state_dict()` may sit in different functions. Native code needs
one `GradScaler` that every one of those places can reach (DESIGN.md §2):

* a local, when they all share one function (or all run at module level);
* `self.<name>`, when they are all methods of one class;
* a module-level global otherwise, which needs `initialize`'s options to be literals.

This rule changes nothing; it reads the original file, decides, and reports what cannot be
made native (several `initialize` calls, options that are not literals where they would have
to be, `scale_loss` with no `initialize` in the file, ...). The rules after it carry the plan
out.

Soundness
    The plan builds the GradScaler from `initialize`'s options only where their meaning is
    exact: O0 and `enabled=False` give a disabled scaler (its `scale`, `step` and `update` pass
    through, as Apex's disabled amp did); a run-time `opt_level` gives
    `enabled=opt_level != "O0"`, right for every value; a guard around `initialize` becomes
    `enabled=<guard>`. A static `loss_scale` of 1.0 (O3's default) gives a disabled scaler
    under an enabled autocast, as Apex's `scale_loss` then neither scaled nor skipped; another
    static scale gives a scaler that never grows, Apex's bit for bit until a step with
    non-finite gradients (AMP111 states that one difference). It keeps one GradScaler per loss id when `num_losses > 1` and each
    optimizer is scaled under one loss id, because Apex kept one loss scale per loss id and an
    overflow in one backed off only that one; an optimizer scaled under two loss ids shares one
    scaler (its gradients must carry one scale), as AMP114 says. It refuses what it cannot
    express: several `initialize` calls, options with side effects or only known at run time
    where a literal is needed, a scaler no single place reaches, and per-loss scalers whose
    state `amp.state_dict()` would have to save as one.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst
import libcst.matchers as m

from ..diagnostics import Severity, define
from .apex_calls import NOT_LITERAL, literal as literal_value
from .base import Rule

_WORD = re.compile(r"\w+")

INITIALIZE = "apex.amp.initialize"
INIT = "apex.amp.init"
SCALE_LOSS = ("apex.amp.scale_loss", "apex.amp.handle.scale_loss", "apex.amp.AmpHandle.scale_loss",
              "apex.amp.OptimWrapper.scale_loss")
WRAPPED_SCALE_LOSS = "apex.amp.OptimWrapper.scale_loss"  # `optimizer.scale_loss(loss)`
MASTER_PARAMS = "apex.amp.master_params"
STATE_DICT = "apex.amp.state_dict"
LOAD_STATE_DICT = "apex.amp.load_state_dict"
#: `amp._amp_state.loss_scalers` (`from apex.amp import _amp_state`, or from its own module)
LOSS_SCALERS = ("apex.amp._amp_state.loss_scalers", "apex.amp._amp_state._amp_state.loss_scalers")
SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")
LEVELS = ("O0", "O1", "O2", "O3")
SCALE_LOSS_ARGS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")
INITIALIZE_ARGS = ("models", "optimizers", "enabled", "opt_level", "cast_model_type",
                   "patch_torch_functions", "keep_batchnorm_fp32", "master_weights",
                   "loss_scale", "cast_model_outputs", "num_losses", "verbosity",
                   "min_loss_scale", "max_loss_scale")

NO_PLACE = define(
    "AMP101", "scaler-unreachable", Severity.WARNING,
    "No single place for the GradScaler reaches every Apex call of this file.",
    "Apex's loss scalers are process-global; a GradScaler is an object that `initialize`'s "
    "replacement creates and that `scale_loss`, `step` and `state_dict` must reach. When they "
    "are spread over functions that share neither a class nor literal options that a "
    "module-level scaler could be built from, the file is migrated to the shim instead.",
    before="def setup(args):\n    model, opt = amp.initialize(model, opt, opt_level=args.opt_level)\n"
           "def train(model, opt):\n    with amp.scale_loss(loss, opt) as s:\n        s.backward()",
    after="def setup(args):\n    model, opt = amp.initialize(model, opt, opt_level=args.opt_level)  # amp_shim",
    falls_back=True,
)
INIT_COUNT = define(
    "AMP102", "initialize-not-once", Severity.WARNING,
    "The file calls `amp.initialize` (or `amp.init`) more than once, or uses `scale_loss` "
    "without calling it.",
    "The native rewrite turns the one `initialize` of a training script into the one "
    "GradScaler of its loop. Several calls (one per fold, per branch) or none at all (the call "
    "lives in another module) leave no single scaler to use, so the file keeps Apex's "
    "semantics through the shim.",
    falls_back=True,
)
OPTION_NOT_LITERAL = define(
    "AMP103", "option-not-provable", Severity.WARNING,
    "An `amp.initialize` option is computed at run time in a way native code cannot follow.",
    "Options such as `opt_level=args.opt_level` are rewritten to an expression that is right "
    "for every value (`enabled=args.opt_level != \"O0\"`). A run-time `loss_scale` (which may be "
    "\"dynamic\" or a number), `**kwargs`, or an expression with side effects cannot be, so the "
    "file uses the shim.",
    before='amp.initialize(model, opt, loss_scale=args.loss_scale)',
    after='# unchanged, imports point at amp_shim',
    falls_back=True,
)
O2_O3 = define(
    "AMP110", "fp16-weights-become-autocast", Severity.INFO,
    "O2/O3 kept fp16 model weights (with fp32 masters at O2); native code keeps fp32 weights "
    "and runs ops in reduced precision under autocast.",
    "torch has no master-weights mode. Autocast with fp32 weights is the native recipe and is "
    "numerically at least as good; memory use and speed differ from pure fp16 weights, and "
    "checkpoints hold fp32 weights as they did with Apex.",
    before='model, opt = amp.initialize(model, opt, opt_level="O2")',
    after='scaler = torch.amp.GradScaler("cuda")\n# forward under torch.autocast("cuda", dtype=torch.float16)',
)
#: GradScaler's growth interval for a static scale: the largest count its int32 growth tracker
#: reaches, so the scale grows after 2,147,483,647 clean steps at the earliest, in no real run.
STATIC_GROWTH_INTERVAL = "2**31 - 1"
STATIC_SCALE = define(
    "AMP111", "static-loss-scale", Severity.INFO,
    "A static `loss_scale` becomes a GradScaler that starts at that scale and never grows; it "
    "differs from Apex only on a step whose gradients are not finite.",
    "Apex's static scale never changed and never skipped a step. GradScaler has no static mode; "
    "`init_scale=S, growth_interval=2**31 - 1` comes closest: the interval is the largest count "
    "GradScaler's int32 growth tracker reaches, so the scale never grows in a real run, and "
    "losses, gradients, steps and parameters are Apex's bit for bit while gradients stay "
    "finite. The one difference is a step with inf/NaN gradients: Apex applied it (the "
    "parameters took the non-finite values) and kept the scale; GradScaler skips it and halves "
    "the scale (its backoff factor must be below 1), which then stays halved. A loss scale of 1.0 "
    "disables the scaler instead (AMP116).",
    before='amp.initialize(model, opt, opt_level="O1", loss_scale=128.0)',
    after='scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)',
)
UNSCALED = define(
    "AMP116", "unit-loss-scale-disables-scaler", Severity.INFO,
    "Apex did not scale losses here (a static `loss_scale` of 1.0, O3's default), so the "
    "GradScaler is disabled; autocast stays on.",
    "With a static scale of 1.0 Apex's `scale_loss` took its fast path: no scaling, no unscale, no "
    "overflow check, no skipped step (`loss_scale=1.0` is a common way to switch loss scaling "
    "off). A disabled GradScaler does the same: `scale(loss)` returns the loss, `step(opt)` "
    "calls `opt.step()`, `update()` does nothing and `get_scale()` is 1.0. A dynamic scaler "
    "would skip the steps with inf/NaN gradients that Apex applied.",
    before='amp.initialize(model, opt, opt_level="O1", loss_scale=1.0)',
    after='scaler = torch.amp.GradScaler("cuda", enabled=False)\n'
          '# the forward still runs under torch.autocast("cuda", dtype=torch.float16)',
)
RUNTIME_O3 = define(
    "AMP117", "run-time-o3-scaled", Severity.INFO,
    "If `opt_level` is \"O3\" at run time, this GradScaler is enabled, although Apex's O3 kept a "
    "static loss scale of 1.0.",
    "Where `initialize` and the autocast regions share a function, a run-time `opt_level` gives "
    "`GradScaler(enabled=level not in (\"O0\", \"O3\"))` and `autocast(enabled=level != \"O0\")`, "
    "right for every level. Here autocast runs elsewhere and follows `scaler.is_enabled()`, so "
    "the scaler is on at O3 too: it skips steps whose gradients are not finite, which Apex's O3 "
    "applied. O0, O1 and O2 are exact.",
    before='amp.initialize(model, opt, opt_level=opt_level)  # in Trainer.__init__',
    after='self.scaler = torch.amp.GradScaler("cuda", enabled=opt_level != "O0")',
)
SCALE_BOUNDS = define(
    "AMP112", "loss-scale-bounds", Severity.INFO,
    "`min_loss_scale`/`max_loss_scale` have no GradScaler equivalent and were dropped.",
    "GradScaler's scale is unbounded: it can back off below Apex's floor and grow above its "
    "cap (2**24 by default, reached only after tens of thousands of clean steps).",
    before='amp.initialize(model, opt, min_loss_scale=1.0)',
    after='scaler = torch.amp.GradScaler("cuda")',
)
IGNORED_OPTIONS = define(
    "AMP113", "option-without-native-meaning", Severity.INFO,
    "An `amp.initialize` option with no native meaning was dropped "
    "(`keep_batchnorm_fp32`, `master_weights`, `cast_model_type`, `patch_torch_functions`, "
    "`cast_model_outputs`).",
    "Native weights stay fp32 (BatchNorm included) and autocast chooses each op's dtype, so "
    "these switches have nothing to act on. `cast_model_outputs` in particular: model outputs "
    "now come back in whatever dtype autocast gave their last op.",
)
ONE_SCALER = define(
    "AMP114", "one-scaler-for-all-losses", Severity.INFO,
    "`num_losses`/`loss_id` per-loss scalers become one GradScaler, because an optimizer here "
    "is scaled under more than one loss id.",
    "Gradients of one optimizer must all carry one scale before `scaler.step` unscales them, "
    "so two losses that backward into the same optimizer (a GAN discriminator's real and fake "
    "losses) share one GradScaler, as in PyTorch's recipe for several losses. It is updated "
    "after each optimizer step. Training is the same until an overflow: Apex backed off only "
    "the overflowing loss's scaler, the shared scaler backs off for every loss. When each "
    "optimizer is scaled under one loss id, amp-migrate keeps one GradScaler per loss id instead.",
)
PER_LOSS_CHECKPOINT = define(
    "AMP104", "per-loss-scalers-in-checkpoint", Severity.WARNING,
    "Apex's per-loss scalers become one GradScaler per loss id here, and `amp.state_dict()` "
    "has no single native counterpart for them.",
    "With `num_losses > 1` and each optimizer stepped under its own `loss_id` (a GAN whose "
    "critic steps more often than its generator), the native loop keeps one GradScaler per "
    "loss id, as Apex kept one loss scaler per loss id. `amp.state_dict()` saved all of them in "
    "one dict; a native checkpoint would need one entry per scaler, which this rewrite does not "
    "invent, so the file uses the shim.",
    falls_back=True,
)
BF16 = define(
    "AMP115", "bfloat16-no-loss-scaling", Severity.INFO,
    "With `--dtype bfloat16` autocast runs in bfloat16 and the GradScaler is disabled.",
    "bfloat16 has float32's exponent range, so gradients do not underflow and loss scaling is "
    "unnecessary; a disabled GradScaler passes losses and steps through unchanged, so the code "
    "keeps its shape and can be switched back to float16.",
)


@dataclass
class TrainingPlan:
    scaler: str  # how code reaches it: "scaler" or "self.scaler"
    placement: str  # "local" | "self" | "module"
    scaler_call: cst.Call
    autocast_call: cst.Call
    models: set[str] = field(default_factory=set)
    optimizers: set[str] = field(default_factory=set)
    #: Lines (of the file as given) of the `optimizer.step()` calls that step an optimizer
    #: `scale_loss` scaled: the same variable, not just the same name.
    step_lines: frozenset = frozenset()
    #: Lines of the `scale_loss` calls at whose exit Apex unscaled and updated the scale.
    eager_unscale_lines: frozenset = frozenset()
    hoisted: bool = False  # built before the `if` that guarded `initialize`
    global_casts: bool = False  # `amp.init()`: casts were on everywhere, not for given models
    #: Apex's per-loss scalers kept apart (`num_losses > 1`, each optimizer stepped under one
    #: `loss_id`): loss id -> how code reaches its GradScaler. Empty: `scaler` serves every loss.
    loss_scalers: dict[int, str] = field(default_factory=dict)
    #: Optimizer (as `scale_loss` names it) -> its loss id, with `loss_scalers`.
    optimizer_losses: dict[str, int] = field(default_factory=dict)

    def scaler_for_loss(self, loss_id: int) -> str:
        return self.loss_scalers.get(loss_id, self.scaler)

    def scaler_for_optimizer(self, optimizer: str) -> str:
        loss_id = self.optimizer_losses.get(optimizer)
        return self.scaler if loss_id is None else self.scaler_for_loss(loss_id)

    @property
    def scalers(self) -> list[str]:
        """Every GradScaler the plan builds, in loss-id order."""
        return [self.loss_scalers[k] for k in sorted(self.loss_scalers)] or [self.scaler]


_COMPOUND = (cst.UnaryOperation, cst.BinaryOperation, cst.Tuple, cst.List, cst.ConcatenatedString)


def literal(node: Optional[cst.BaseExpression]):
    """The Python value of a literal argument (strings, numbers, True/False/None, arithmetic on
    numbers such as `2**24` or `128 * 128`, tuples), else NOT_LITERAL; None for an absent one.
    Compound expressions are judged by the evaluator every rule shares."""
    if node is None:
        return None
    if isinstance(node, (cst.SimpleString, cst.Integer, cst.Float)):
        return node.evaluated_value
    if isinstance(node, cst.Name):
        return {"True": True, "False": False, "None": None}.get(node.value, NOT_LITERAL)
    if isinstance(node, _COMPOUND):
        return literal_value(node)
    return NOT_LITERAL


def pure(node: cst.BaseExpression) -> bool:
    """Reading the expression twice gives the same value and does nothing else."""
    if literal(node) is not NOT_LITERAL:
        return True
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return pure(node.value)
    if isinstance(node, cst.Subscript):
        return pure(node.value) and all(
            isinstance(e.slice, cst.Index) and pure(e.slice.value) for e in node.slice)
    if isinstance(node, cst.Comparison):
        return pure(node.left) and all(pure(c.comparator) for c in node.comparisons)
    if isinstance(node, cst.BooleanOperation):
        return pure(node.left) and pure(node.right)
    if isinstance(node, cst.UnaryOperation):
        return pure(node.expression)
    return False


def bind_arguments(call: cst.Call, names=INITIALIZE_ARGS) -> Optional[dict[str, cst.BaseExpression]]:
    """Map a call's arguments to parameter names, or None when they cannot be (`*a`, `**k`)."""
    bound: dict[str, cst.BaseExpression] = {}
    for i, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if i >= len(names):
                return None
            bound[names[i]] = arg.value
        else:
            bound[arg.keyword.value] = arg.value
    return bound


def words_of(codes) -> set[str]:
    """What a statement must spell to mention one of these expressions: each one's last name
    (`self.opt` → `opt`)."""
    return {found[-1] for found in (_WORD.findall(code) for code in codes) if found}


def expression_codes(node: Optional[cst.BaseExpression]) -> list[str]:
    """`model` → ["model"]; `[netD, netG]` → ["netD", "netG"]; anything else → []."""
    if node is None:
        return []
    if isinstance(node, (cst.List, cst.Tuple)):
        out = []
        for el in node.elements:
            if isinstance(el, cst.StarredElement):
                return []
            out.extend(expression_codes(el.value))
        return out
    if isinstance(node, (cst.Name, cst.Attribute)) and pure(node):
        return [cst.Module([]).code_for_node(node)]
    return []


def _and(left: Optional[cst.BaseExpression], right: Optional[cst.BaseExpression]):
    if left is None:
        return right
    if right is None:
        return left

    def wrap(e):
        if isinstance(e, cst.BooleanOperation) and isinstance(e.operator, cst.Or):
            return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return e
    return cst.BooleanOperation(wrap(left), cst.And(), wrap(right))


def _kw(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_OWN_SCOPE = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _binds_in_ast(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> Optional[bool]:
    """Whether `function` makes `name` one of its own variables (a parameter or any binding in
    its body, not in nested functions, classes or comprehensions); False for `global name`;
    None if it does not bind the name at all."""
    args = function.args
    if any(a.arg == name for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                   *(a for a in (args.vararg, args.kwarg) if a is not None)]):
        return True
    found: Optional[bool] = None
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _NESTED):
            if node.name == name:
                found = True
            stack.extend(node.decorator_list)
            continue
        if isinstance(node, _OWN_SCOPE):
            continue
        if isinstance(node, ast.Global) and name in node.names:
            return False
        if isinstance(node, ast.Name):
            if node.id == name and isinstance(node.ctx, ast.Store):
                found = True
            continue
        if isinstance(node, ast.alias):
            if (node.asname or node.name.split(".")[0]) == name:
                found = True
            continue
        if isinstance(node, ast.ExceptHandler) and node.name == name:
            found = True
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
            found = True
        stack.extend(ast.iter_child_nodes(node))
    return found


class TrainingRule(Rule):
    """A rule that carries out the plan; it has nothing to do in a file without one."""

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.plan: Optional[TrainingPlan] = state.scratch.get("training")

    @classmethod
    def applies(cls, state, context) -> bool:
        return "training" in state.scratch and super().applies(state, context)


class PlanTraining(Rule):
    """Read the file's Apex training calls and decide where its GradScaler lives."""

    MARKERS = ("initialize", "scale_loss", "init(")
    APEX_ON_THE_LINE = True

    def interest(self):
        return self.words_for(INITIALIZE, INIT, *SCALE_LOSS, MASTER_PARAMS, STATE_DICT, LOAD_STATE_DICT,
                              *LOSS_SCALERS)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.inits: list[tuple[cst.Call, cst.CSTNode]] = []  # (call, statement)
        self.sites: list[cst.CSTNode] = []  # every call that will reach the scaler
        self.scale_losses: list[cst.Call] = []
        self._binds_cache: dict[tuple[int, str], Optional[bool]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        name = self.apex_name(node.func)
        if name in (INITIALIZE, INIT):
            self.inits.append((node, self._statement(node)))
        elif name in SCALE_LOSS:
            self.scale_losses.append(node)
            self.sites.append(node)
        elif name in (MASTER_PARAMS, STATE_DICT, LOAD_STATE_DICT):
            self.sites.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "loss_scalers" and self.apex_name(node) in LOSS_SCALERS:
            self.sites.append(node)  # a read of Apex's scale reaches the scaler too

    def _unscales_at_exit(self, call: cst.Call) -> bool:
        """Apex unscaled and updated its scale at this `scale_loss`'s exit (no `delay_unscale`,
        or a literal False)."""
        bound = bind_arguments(call, SCALE_LOSS_ARGS) or {}
        return literal(bound.get("delay_unscale")) in (None, False)

    def _lines_of(self, statement: cst.CSTNode) -> range:
        first = self.position(statement)[0]
        tree = self.state.index.ast_of(statement) if self.state.index is not None else None
        last = getattr(tree, "end_lineno", None) or first
        return range(first, last + 1)

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return parent
        return node

    def scope_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.Lambda)):
                return parent if isinstance(parent, cst.FunctionDef) else None
        return None

    def class_of(self, function: cst.FunctionDef) -> Optional[cst.ClassDef]:
        block = self.parent(function)
        owner = self.parent(block) if block is not None else None
        if isinstance(owner, cst.ClassDef) and function.params.params \
                and function.params.params[0].name.value == "self":
            return owner
        return None

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.inits and not self.scale_losses:
            return updated_node
        if len(self.inits) != 1 or not self.scale_losses:
            where = self.inits[1][0] if len(self.inits) > 1 else (
                self.inits[0][0] if self.inits else self.scale_losses[0])
            called = "amp.init" if self.inits and self.apex_name(self.inits[0][0].func) == INIT \
                else "amp.initialize"
            self.report(where, INIT_COUNT,
                        f"`{called}` is called more than once in this file" if len(self.inits) > 1
                        else f"no `scale_loss` in this file goes with the `{called}` here" if self.inits
                        else "`scale_loss` is used but `amp.initialize` is not called in this file")
            return updated_node
        call, statement = self.inits[0]
        plan = self._plan(call, statement, original_node)
        if plan is not None:
            self.state.scratch["training"] = plan
        return updated_node

    # -- deciding ------------------------------------------------------------------------------
    def _optimizer_codes(self) -> set[str]:
        codes: set[str] = set()
        for call in self.scale_losses:
            if self.apex_name(call.func) == WRAPPED_SCALE_LOSS:
                codes.add(self.code_of(call.func.value))
                continue
            bound = bind_arguments(call, SCALE_LOSS_ARGS)
            if bound is not None:
                codes.update(expression_codes(bound.get("optimizers")))
        return codes

    def _loss_ids(self) -> Optional[dict[str, int]]:
        """Optimizer -> the one literal `loss_id` every `scale_loss` of it uses; None when some
        optimizer is scaled under two loss ids (its gradients would mix two scales natively) or
        a loss id is only known at run time."""
        found: dict[str, int] = {}
        for call in self.scale_losses:
            if self.apex_name(call.func) == WRAPPED_SCALE_LOSS:
                return None
            bound = bind_arguments(call, SCALE_LOSS_ARGS)
            if bound is None:
                return None
            loss_id = literal(bound["loss_id"]) if "loss_id" in bound else 0
            codes = expression_codes(bound.get("optimizers"))
            if not isinstance(loss_id, int) or isinstance(loss_id, bool) or not codes:
                return None
            for code in codes:
                if found.setdefault(code, loss_id) != loss_id:
                    return None
        return found

    def _step_sites(self, module: cst.Module, optimizers: set[str], init: cst.CSTNode) -> list[cst.Call]:
        """The `X.step()` calls whose `X` is an optimizer `scale_loss` scaled: in the scope
        that binds it where `initialize` or `scale_loss` sees it (an `optimizer` parameter of
        some other function is another variable), or `self.X` in the same class."""
        matcher = m.Call(func=m.Attribute(attr=m.Name("step")))
        calls = [c for c in self.findall(module, matcher, words_of(optimizers), ("step",))
                 if self.code_of(c.func.value) in optimizers]
        seen_from = [init] + [s for s in self.scale_losses]
        return [c for c in calls if self._same_variable(c.func.value, c, seen_from)]

    def _same_variable(self, expr: cst.BaseExpression, where: cst.CSTNode, sites: list[cst.CSTNode]) -> bool:
        if isinstance(expr, cst.Name):
            scope = self._binding_scope(where, expr.value)
            return any(self._binding_scope(s, expr.value) is scope for s in sites)
        if m.matches(expr, m.Attribute(value=m.Name("self"))):
            here = self.scope_of(where)
            owner = self.class_of(here) if here is not None else None
            return any(self._class_around(s) is owner for s in sites)
        return True  # `trainer.optimizer`: one object wherever it is read

    def _class_around(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        function = self.scope_of(node)
        return self.class_of(function) if function is not None else None

    def _binding_scope(self, node: cst.CSTNode, name: str) -> Optional[cst.FunctionDef]:
        """The function whose variable `name` is where `node` reads it (None: the module's)."""
        for parent in self.ancestors(node):
            if isinstance(parent, cst.FunctionDef):
                key = (id(parent), name)
                if key not in self._binds_cache:
                    index = self.state.index
                    tree = index.ast_of(parent) if index is not None else None
                    if index is not None and not index.may_spell(parent, name):
                        self._binds_cache[key] = None
                    elif isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._binds_cache[key] = _binds_in_ast(tree, name)
                    else:  # beyond this interpreter's parser: by spelling, as Apex users wrote it
                        self._binds_cache[key] = None
                binds = self._binds_cache[key]
                if binds is not None:
                    return parent if binds else None
        return None

    def _placement(self, init_statement: cst.CSTNode, sites: list[cst.CSTNode]) -> Optional[str]:
        init_scope = self.scope_of(init_statement)
        scopes = {self.scope_of(s) for s in sites} | {init_scope}
        if len(scopes) == 1:
            return "local"
        if None not in scopes:
            classes = {self.class_of(f) for f in scopes}
            if len(classes) == 1 and None not in classes:
                return "self"
        return "module"

    def _name(self, module: cst.Module, placement: str) -> str:
        for name in SCALER_NAMES:
            if self.name_is_free(name, module):
                return name
        i = 1
        while not self.name_is_free(f"scaler_{i}", module):
            i += 1
        return f"scaler_{i}"

    def _free_name(self, module: cst.Module, wanted: str) -> str:
        name, i = wanted, 1
        while not self.name_is_free(name, module):
            name, i = f"{wanted}_{i}", i + 1
        return name

    def _plan(self, call: cst.Call, statement: cst.CSTNode, module: cst.Module) -> Optional[TrainingPlan]:
        is_init = self.apex_name(call.func) == INIT
        names = ("enabled", "enable_caching", "verbose", "allow_banned") if is_init else INITIALIZE_ARGS
        args = bind_arguments(call, names)
        if args is None:
            self.report(call, OPTION_NOT_LITERAL, "`amp.initialize` takes `*args`/`**kwargs` here")
            return None
        optimizers = self._optimizer_codes()
        steps = self._step_sites(module, optimizers, statement)
        sites = self.sites + steps
        placement = self._placement(statement, sites)

        conditions: list[cst.BaseExpression] = []
        ok = True
        level = args.get("opt_level", None)
        level_value = "O1" if level is None else literal(level)
        level_test: Optional[cst.Comparison] = None  # `opt_level != "O0"`, for a run-time level
        if level_value is NOT_LITERAL:
            if not pure(level):
                self.report(level, OPTION_NOT_LITERAL, "`opt_level` is an expression with side effects")
                ok = False
            else:
                level_test = cst.Comparison(level, [cst.ComparisonTarget(cst.NotEqual(), _string("O0"))])
                conditions.append(level_test)
        elif level_value not in LEVELS:
            self.report(level, OPTION_NOT_LITERAL, f"`opt_level={level_value!r}` is not one of O0-O3")
            ok = False
        elif level_value == "O0":
            conditions.append(cst.Name("False"))
        elif level_value in ("O2", "O3"):
            self.report(call, O2_O3)

        enabled = args.get("enabled")
        enabled_value = literal(enabled)
        if enabled_value is False:
            conditions.append(cst.Name("False"))
        elif enabled is not None and enabled_value is not True:
            if enabled_value is NOT_LITERAL and pure(enabled):
                conditions.append(enabled)
            else:
                self.report(enabled, OPTION_NOT_LITERAL, "`enabled` is not a plain expression")
                ok = False

        guard, nested = self._guard(statement)
        if nested:
            self.report(statement, NO_PLACE, "`amp.initialize` runs inside a loop or a branch "
                        "with an `else`, so no scaler built there reaches the rest of the code")
            ok = False
        elif guard is not None:
            if not pure(guard):
                self.report(statement, OPTION_NOT_LITERAL,
                            "`amp.initialize` runs under a condition with side effects")
                ok = False
            else:
                conditions.insert(0, guard)

        scaler_args: list[cst.Arg] = [cst.Arg(_string(self.options.device))]
        loss_scale = args.get("loss_scale")
        scale_value = literal(loss_scale)
        if isinstance(scale_value, (str, bool)) and scale_value != "dynamic":
            try:
                scale_value = float(scale_value)  # as Apex did: "128" -> 128.0, True -> 1.0
            except ValueError:
                scale_value = NOT_LITERAL
        unscaled = False  # a static scale of 1.0: Apex's scale_loss took its fast path
        scaling_test: Optional[cst.Comparison] = None  # which run-time levels scale losses
        if scale_value is NOT_LITERAL:
            self.report(loss_scale, OPTION_NOT_LITERAL,
                        "`loss_scale` is chosen at run time (it may be \"dynamic\" or a number)")
            ok = False
        elif scale_value is None and level_value == "O3":
            unscaled = True
            self.report(level, UNSCALED, "O3's default loss scale is a static 1.0: Apex did not scale "
                        "losses, so the GradScaler is disabled; autocast stays on")
        elif scale_value is None and level_test is not None:
            scaling_test = cst.Comparison(level.deep_clone(), [cst.ComparisonTarget(
                cst.NotIn(), cst.Tuple([cst.Element(_string("O0")), cst.Element(_string("O3"))]))])
        elif isinstance(scale_value, (int, float)):
            if not 0.0 < scale_value < float("inf"):
                self.report(loss_scale, OPTION_NOT_LITERAL, f"`loss_scale={scale_value!r}` is no usable scale")
                ok = False
            elif scale_value == 1.0:
                unscaled = level_value != "O0"
                if unscaled:
                    self.report(loss_scale, UNSCALED, "a static `loss_scale` of 1.0: Apex did not scale "
                                "losses, so the GradScaler is disabled; autocast stays on")
            else:
                scaler_args.append(_kw("init_scale", cst.Float(repr(float(scale_value)))))
                scaler_args.append(_kw("growth_interval", cst.parse_expression(STATIC_GROWTH_INTERVAL)))
                self.report(loss_scale, STATIC_SCALE)
        max_scale = literal(args.get("max_loss_scale"))
        if isinstance(max_scale, (int, float)) and max_scale < 2.0**16 and scale_value in (None, "dynamic"):
            scaler_args.append(_kw("init_scale", cst.Float(repr(float(max_scale)))))
        for bound in ("min_loss_scale", "max_loss_scale"):
            if bound in args and literal(args[bound]) is not None:
                self.report(args[bound], SCALE_BOUNDS)
        for option in ("keep_batchnorm_fp32", "master_weights", "cast_model_type",
                       "patch_torch_functions", "cast_model_outputs"):
            if option in args and literal(args[option]) is not None:
                self.report(args[option], IGNORED_OPTIONS, f"`{option}` has no native meaning and was dropped")
        losses = literal(args.get("num_losses"))
        per_loss: dict[str, int] = {}
        if "num_losses" in args and losses != 1:
            per_loss = self._loss_ids() or {}
            if len(set(per_loss.values())) < 2:
                per_loss = {}
                self.report(args["num_losses"], ONE_SCALER)
            elif any(self.apex_name(s.func) in (STATE_DICT, LOAD_STATE_DICT)
                     for s in self.sites if isinstance(s, cst.Call)):
                self.report(args["num_losses"], PER_LOSS_CHECKPOINT)
                ok = False

        enabled_expr: Optional[cst.BaseExpression] = None  # whether amp is on: autocast's `enabled`
        scaling_expr: Optional[cst.BaseExpression] = None  # whether losses are scaled: the scaler's
        for c in conditions:
            enabled_expr = _and(enabled_expr, c)
            scaling_expr = _and(scaling_expr, scaling_test if c is level_test and scaling_test else c.deep_clone())
        if any(literal(c) is False for c in conditions):
            enabled_expr = scaling_expr = cst.Name("False")
        if placement == "module" and enabled_expr is not None and literal(enabled_expr) is NOT_LITERAL:
            self.report(call, NO_PLACE, "the scaler must be module-level here, but whether amp is "
                        "enabled is only known inside the function that calls `initialize`")
            ok = False
        if not ok:
            return None

        name = self._name(module, placement)
        scaler = f"self.{name}" if placement == "self" else name
        loss_scalers: dict[int, str] = {}
        for loss_id in sorted(set(per_loss.values())):
            own = self._free_name(module, f"{name}{loss_id}")
            loss_scalers[loss_id] = f"self.{own}" if placement == "self" else own
        if loss_scalers:
            scaler = loss_scalers[min(loss_scalers)]
        fp16 = self.options.needs_loss_scaling
        if not fp16:
            self.report(call, BF16)
        if (not fp16 or unscaled) and enabled_expr is not None and literal(enabled_expr) is NOT_LITERAL \
                and placement != "local":
            why = "with bfloat16" if not fp16 else "with a static loss scale of 1.0"
            self.report(call, NO_PLACE, f"{why} the scaler is disabled, so autocast cannot follow "
                        "it; whether amp is enabled is only known where `initialize` is")
            return None
        autocast_args = [cst.Arg(_string(self.options.device)),
                         _kw("dtype", cst.parse_expression(f"torch.{self.options.dtype}"))]
        if enabled_expr is not None and literal(enabled_expr) is False:
            autocast_args.append(_kw("enabled", cst.Name("False")))
            scaler_args.append(_kw("enabled", cst.Name("False")))
        elif not fp16 or unscaled:
            scaler_args.append(_kw("enabled", cst.Name("False")))
            if enabled_expr is not None:
                autocast_args.append(_kw("enabled", enabled_expr))
        elif scaling_test is not None and placement == "local":
            scaler_args.append(_kw("enabled", scaling_expr))
            autocast_args.append(_kw("enabled", enabled_expr))
        elif enabled_expr is not None:
            if scaling_test is not None:
                self.report(level, RUNTIME_O3)
            scaler_args.append(_kw("enabled", enabled_expr))
            autocast_args.append(_kw("enabled", cst.parse_expression(f"{scaler}.is_enabled()")))
        return TrainingPlan(
            scaler=scaler,
            placement=placement,
            scaler_call=cst.Call(cst.parse_expression("torch.amp.GradScaler"), scaler_args),
            autocast_call=cst.Call(cst.parse_expression("torch.autocast"), autocast_args),
            models=set(expression_codes(args.get("models"))),
            optimizers=optimizers,
            step_lines=frozenset(self.position(c)[0] for c in steps),
            eager_unscale_lines=frozenset(line for c in self.scale_losses if self._unscales_at_exit(c)
                                          for line in self._lines_of(self._statement(c))),
            hoisted=guard is not None,
            global_casts=is_init,
            loss_scalers=loss_scalers,
            optimizer_losses=dict(per_loss),
        )

    def _guard(self, statement: cst.CSTNode) -> tuple[Optional[cst.BaseExpression], bool]:
        """The `if cond:` (without else) directly around `initialize`, and whether anything
        else (a loop, another branch) stands between it and its function."""
        block = self.parent(statement)
        owner = self.parent(block) if block is not None else None
        guard = None
        start: cst.CSTNode = statement
        if isinstance(owner, cst.If) and owner.body is block and owner.orelse is None:
            guard, start = owner.test, owner
        for parent in self.ancestors(start):
            if isinstance(parent, (cst.FunctionDef, cst.Module)):
                break
            if isinstance(parent, (cst.For, cst.While, cst.If, cst.Else, cst.ExceptHandler,
                                   cst.Match, cst.Lambda)):
                return guard, True
        return guard, False
