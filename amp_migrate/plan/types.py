"""What the training rules share: Apex's training calls, the plan for a file's GradScaler, and
the readers of `initialize`'s and `scale_loss`'s arguments.

`PlanTraining` (rules/training_plan.py) fills a `TrainingPlan` from the file as given; every
`TrainingRule` after it reads the plan and has nothing to do in a file without one. This
module holds no rule.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Mapping, Optional

import libcst as cst

from ..analysis.literals import NOT_LITERAL
from ..analysis.literals import literal as literal_value
from ..diagnostics import Severity, define

_WORD = re.compile(r"\w+")

INITIALIZE = "apex.amp.initialize"
INIT = "apex.amp.init"
SCALE_LOSS = (
    "apex.amp.scale_loss",
    "apex.amp.handle.scale_loss",
    "apex.amp.AmpHandle.scale_loss",
    "apex.amp.OptimWrapper.scale_loss",
)
WRAPPED_SCALE_LOSS = "apex.amp.OptimWrapper.scale_loss"  # `optimizer.scale_loss(loss)`
MASTER_PARAMS = "apex.amp.master_params"
STATE_DICT = "apex.amp.state_dict"
LOAD_STATE_DICT = "apex.amp.load_state_dict"
#: `amp._amp_state.loss_scalers` (`from apex.amp import _amp_state`, or from its own module)
LOSS_SCALERS = ("apex.amp._amp_state.loss_scalers", "apex.amp._amp_state._amp_state.loss_scalers")
SCALER_NAMES = ("scaler", "grad_scaler", "amp_scaler")


def scaler_name(is_free: Callable[[str], bool]) -> str:
    """The name a file's new GradScaler gets: the first of `SCALER_NAMES` the file leaves free,
    else the first free `scaler_1`, `scaler_2`, .... The training planner and the
    FP16_Optimizer planner both name theirs so, so a file reads the same whichever Apex API it
    used. (A project's shared scaler is named from the texts of every module it spans instead:
    project/share.py.)"""
    for name in SCALER_NAMES:
        if is_free(name):
            return name
    i = 1
    while not is_free(f"scaler_{i}"):
        i += 1
    return f"scaler_{i}"


LEVELS = ("O0", "O1", "O2", "O3")
SCALE_LOSS_ARGS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")
INITIALIZE_ARGS = (
    "models",
    "optimizers",
    "enabled",
    "opt_level",
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
    "cast_model_outputs",
    "num_losses",
    "verbosity",
    "min_loss_scale",
    "max_loss_scale",
)

ONE_SCALER = define(
    "AMP114",
    "one-scaler-for-all-losses",
    Severity.INFO,
    "`num_losses`/`loss_id` per-loss scalers become one GradScaler, because an optimizer here "
    "is scaled under more than one loss id.",
    "Gradients of one optimizer must all carry one scale before `scaler.step` unscales them, "
    "so two losses that backward into the same optimizer (a GAN discriminator's real and fake "
    "losses) share one GradScaler, as in PyTorch's recipe for several losses. It is updated "
    "after each optimizer step. Training is the same until an overflow: Apex backed off only "
    "the overflowing loss's scaler, the shared scaler backs off for every loss. When each "
    "optimizer is scaled under one loss id, amp-migrate keeps one GradScaler per loss id instead.",
)


@dataclass(frozen=True)
class SharedScaler:
    """This file's part in one GradScaler that several modules of a project share
    (amp_migrate/project/share.py decides it; `migrate_source(project=...)` carries it).

    An owner calls `initialize`: it keeps the scaler in its global `name` (`global_`) or sets
    the attribute `name` of each user module it imports (`publish`: `alias.name`). A user
    reads it through `reach` (`_amp_optimization.scaler`, or its own global `scaler`). With no
    role (`reach` and `name` empty), `refused` says why the file could not get one."""

    name: str = ""
    reach: str = ""  # user: how its code reaches the scaler
    #: imports to add, as AddImportsVisitor takes them: (module, obj, asname, relative)
    imports: tuple[tuple[str, Optional[str], str, int], ...] = ()
    declare: bool = False  # a module-level `name = None` (the attribute before `initialize` ran)
    global_: bool = False  # owner: the scaler is this module's global `name`
    publish: tuple[str, ...] = ()  # owner: attributes of user modules set to the scaler once built
    casts: bool = False  # owner: a user runs its forward under autocast that follows the scaler
    other: str = ""  # the module at the other end, for messages ("trainer.py")
    refused: str = ""  # why no role could be given (quoted by AMP102)
    #: user: the owner's module-level function whose `if` test guards `initialize` (so is a
    #: conjunct of the scaler's `enabled=`), as this module calls it (`load_model`, `opt.build`),
    #: and that test's access paths from its parameters: (position or -1, parameter, rest)
    switch_via: str = ""
    switch_paths: tuple[tuple[int, str, tuple[str, ...]], ...] = ()
    #: user: this module's functions the owner calls, after that guard, passing a part of it
    #: for a parameter: (function, parameter, rest of the part's path past the argument), so
    #: `if fp16:` in `train(..., fp16)` is the switch (project/entry_switch.py)
    switch_entries: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    #: Where Apex may have cast without scaling (or scaled without casting) for some values of
    #: run-time options, autocast cannot follow `scaler.is_enabled()`: the owner sets each of
    #: `amp_publish` (`_amp_fitter.amp_enabled`) to whether amp is on, beside the scaler, and the
    #: user's autocast reads `amp_switch` (its own global, declared False).
    amp_publish: tuple[str, ...] = ()
    amp_switch: str = ""
    #: Apex's module handed between modules as a value (carriers.py): the functions of this
    #: module whose parameter receives it, (function, parameter); the scaler takes the place
    #: (`reach` is the parameter's new name). And the functions of other modules this module
    #: passes it to, (name called, their parameter's new name).
    carrier_slots: tuple[tuple[str, str], ...] = ()
    carrier_calls: tuple[tuple[str, str], ...] = ()
    #: Apex's module obtained from a provider function of the tree (`amp = get_amp(fp16)`):
    #: this file's part in that group (amp_migrate/analysis/provided.py, a ProvidedPart), or None.
    provided: Optional[object] = None

    @property
    def owner(self) -> bool:
        return bool(self.global_ or self.publish)

    @property
    def user(self) -> bool:
        return bool(self.reach)


@dataclass(frozen=True)
class PlanPart:
    """One `initialize` of several: the lines it governs and how its scaler is built."""

    first: int
    last: int
    scaler_call: cst.Call
    autocast_call: cst.Call
    hoisted: bool
    init_scope: int = 0
    init_line: int = 0


@dataclass(frozen=True)
class InferenceRegion:
    """An `initialize` that only prepares models for inference (plan/inference.py): the line of
    its statement, the line of the statement after which autocast covers the rest of the block
    (the statement itself, or the `if` guarding it), and the autocast to open there (None: amp
    is off, nothing to cover)."""

    line: int
    anchor: int
    autocast_call: Optional[cst.Call] = None
    span: Optional[tuple] = None  # the region's first and last line, None when empty


@dataclass(frozen=True)
class CastSource:
    """One `amp.initialize` (or `amp.init`) as the evaluation check (eval_casts.py) reads it:
    which opt level it ran at and which model names it cast, so that forward calls the native
    rewrite leaves outside autocast can be named."""

    line: int  # of the call, in the file as given
    scope: int  # line of the `def` around it (0: module level)
    #: "O0".."O3" where literal ("O1" for `amp.init()`, Apex's default when none is given);
    #: None where only known at run time.
    opt_level: Optional[str]
    enabled: bool  # False: `enabled=False` given literally (nothing was cast)
    models: frozenset = frozenset()  # the models passed and the names `initialize` bound them to


@dataclass(frozen=True)
class TrainingPlan:
    scaler: str  # how code reaches it: "scaler" or "self.scaler"
    placement: str  # "local" | "self" | "module" | "threaded" (a parameter of the functions using it)
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
    #: Line of the `def` around `initialize` (0: module level): where the scaler's `enabled=`
    #: expression means what it says.
    init_scope: int = 0
    init_line: int = 0  # the last line of the `initialize` statement
    #: Functions that get the scaler as a parameter (placement "threaded"): name, line of the
    #: `def` and how the parameter is declared (plan/threaded.py's Threaded). Calls from other
    #: modules are not checked here; a project-level pass can check them by these names.
    threaded: tuple = ()
    #: Several `initialize` calls (or one run per loop iteration), each with its own local
    #: GradScaler built where it ran: the part whose lines hold a node says how (PlanPart).
    parts: tuple = ()
    #: The file's part in a scaler shared with other modules of its project (None: alone).
    shared: Optional[SharedScaler] = None
    #: `initialize` calls that only prepare models for inference, each with its region.
    inference: tuple = ()
    #: Lines of `initialize` statements dropped because Apex rebuilt, with the same options and
    #: before any use, the scaler the plan's `initialize` had built (an EMA model's dummy optimizer).
    absorbed: frozenset = frozenset()
    #: Lines of `if FLAG:` statements around `initialize` whose FLAG the Apex import's `try:` sets
    #: True: natively their body always runs, so it takes their place and their `else` goes.
    flag_branches: frozenset = frozenset()

    @property
    def scaler_calls(self) -> list[cst.Call]:
        """Every way the plan builds a GradScaler (one per part)."""
        return [part.scaler_call for part in self.parts] or [self.scaler_call]

    def at(self, line: int) -> "TrainingPlan":
        """The plan as it applies on `line` of the file as given."""
        for part in self.parts:
            if part.first <= line <= part.last:
                return replace(
                    self,
                    scaler_call=part.scaler_call,
                    autocast_call=part.autocast_call,
                    hoisted=part.hoisted,
                    init_scope=part.init_scope,
                    init_line=part.init_line,
                )
        return self

    def scaler_for_loss(self, loss_id: int) -> str:
        return self.loss_scalers.get(loss_id, self.scaler)

    def scaler_for_optimizer(self, optimizer: str) -> str:
        loss_id = self.optimizer_losses.get(optimizer)
        return self.scaler if loss_id is None else self.scaler_for_loss(loss_id)

    @property
    def scalers(self) -> list[str]:
        """Every GradScaler the plan builds, in loss-id order."""
        return [self.loss_scalers[k] for k in sorted(self.loss_scalers)] or [self.scaler]


@dataclass(frozen=True)
class Fp16OptimizerPlan:
    """What the native rewrite of a file's `FP16_Optimizer` flow does (plan/fp16_optimizer.py
    decides it, rules/fp16_optimizer.py carries it out). Nodes are named by their ids in
    `module`, the tree the planner read, which is the tree the rewrite transforms: the parse,
    where no rule before it changed the file (rules hand on unchanged nodes as they got them),
    else the rewrite's own tree, which it has planned again."""

    module: cst.Module
    #: The GradScaler, the autocast and the steps the flow implies, for the rules after it.
    training: TrainingPlan
    target: str  # the wrapper's name, which becomes the plain optimizer's
    statement: cst.SimpleStatementLine  # `target = FP16_Optimizer(...)`
    inner: cst.BaseExpression  # the optimizer it wraps
    #: `if args.fp16:` around the wrapper: the GradScaler is built before it with `enabled=`
    guard: Optional[cst.If] = None
    backwards: Mapping[int, cst.Call] = field(default_factory=dict)  # statement -> backward call
    clips: Mapping[int, cst.Call] = field(default_factory=dict)  # statement -> clip call
    calls: frozenset[int] = frozenset()  # zero_grad / clip calls to rewrite
    unwraps: frozenset[int] = frozenset()  # `optimizer.optimizer`
    scale_reads: frozenset[int] = frozenset()  # `optimizer.loss_scale`
    #: conversion statement -> the value it keeps (None: the statement goes)
    conversions: Mapping[int, Optional[cst.BaseExpression]] = field(default_factory=dict)
    #: block -> spans of its statements (first, last) to put under autocast
    regions: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    dropped_ifs: frozenset[int] = frozenset()  # `if` statements left with nothing in them


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


#: Builtins whose calls on pure arguments are pure, where the file does not rebind them.
PURE_BUILTINS = ("str", "int", "float", "format")


def pure(node: cst.BaseExpression, builtins: Collection[str] = ()) -> bool:
    """Reading the expression twice gives the same value and does nothing else: names,
    attribute and subscript reads, comparisons, arithmetic and formatting of such values,
    conditionals, and calls of the `builtins` given (those the file leaves alone)."""

    def each(*parts: Optional[cst.BaseExpression]) -> bool:
        return all(part is None or pure(part, builtins) for part in parts)

    if literal(node) is not NOT_LITERAL or isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return each(node.value)
    if isinstance(node, cst.Subscript):
        return each(node.value) and all(
            isinstance(e.slice, cst.Index) and each(e.slice.value) for e in node.slice
        )
    if isinstance(node, cst.Comparison):
        return each(node.left, *(c.comparator for c in node.comparisons))
    if isinstance(node, (cst.BooleanOperation, cst.BinaryOperation)):
        return each(node.left, node.right)
    if isinstance(node, cst.UnaryOperation):
        return each(node.expression)
    if isinstance(node, cst.IfExp):
        return each(node.test, node.body, node.orelse)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(e, cst.Element) and each(e.value) for e in node.elements)
    if isinstance(node, cst.FormattedString):
        return all(
            isinstance(p, cst.FormattedStringText)
            or (
                isinstance(p, cst.FormattedStringExpression)  # (the other kind of part)
                and each(p.expression)
                and (
                    p.format_spec is None
                    or all(
                        isinstance(f, cst.FormattedStringText)
                        or isinstance(f, cst.FormattedStringExpression)
                        and each(f.expression)
                        for f in p.format_spec
                    )
                )
            )
            for p in node.parts
        )
    if isinstance(node, cst.Call):
        return (
            isinstance(node.func, cst.Name)
            and node.func.value in builtins
            and all(not a.star and each(a.value) for a in node.args)
        )
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


_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_OWN_SCOPE = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def binds_in_ast(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> Optional[bool]:
    """Whether `function` makes `name` one of its own variables (a parameter or any binding in
    its body, not in nested functions, classes or comprehensions); False for `global name`;
    None if it does not bind the name at all."""
    args = function.args
    if any(
        a.arg == name
        for a in [
            *args.posonlyargs,
            *args.args,
            *args.kwonlyargs,
            *(a for a in (args.vararg, args.kwarg) if a is not None),
        ]
    ):
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
