"""The plan for a file's native training loop: one GradScaler, where it lives, how it is built.

Apex keeps its loss scalers in process-global state, so `amp.initialize`, `amp.scale_loss`,
`optimizer.step()` and `amp.state_dict()` may sit in different functions. Native code needs
one `GradScaler` that every one of those places can reach:

* a local, when they all share one function (or all run at module level);
* `self.<name>`, when they are all methods of one class;
* a module-level global otherwise, which needs `initialize`'s options to be literals.

This rule changes nothing; it reads the original file, decides, and reports what cannot be
made native (several `initialize` calls, options that are not literals where they would have
to be, `scale_loss` with no `initialize` in the file, ...). The rules after it carry the plan
out.

What it does
    Reads `amp.initialize`/`amp.init` and every call that must reach the scaler, and records a
    `TrainingPlan`: where the GradScaler lives and how `torch.amp.GradScaler(...)` and
    `torch.autocast(...)` are built from `initialize`'s options.

Why
    Every native rule after it has to agree on one scaler and one autocast; deciding once, from
    the file as given, keeps them from each guessing.

Fix safety
    No fix: nothing is rewritten here; the plan decides which tier the rules after it write in.
    Where k > 1 `scale_loss` exits share one optimizer step under a scale that can change (not
    O0, not a literal static `loss_scale`), the plan is the unsafe fix of docs/differences.md
    entry U1 (AMP215 for an accumulation window, AMP216 for several losses): with
    `--unsafe-fixes` it is carried out, otherwise the file keeps the shim. What cannot be
    planned falls back with a code naming the option or the placement; what changes behaviour in a way a user should know is reported as info
    (AMP111 for a static scale, AMP114 for a scaler shared by several losses, AMP120 for a
    scale chosen at run time).

Example
    class Trainer:
        def __init__(self, model, optimizer):
            self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O2")

        def train_step(self, batch):
            with amp.scale_loss(loss, self.optimizer) as scaled:
                scaled.backward()
plans `self.scaler = torch.amp.GradScaler("cuda")` in `__init__`, which the rules after it
write there and use in `train_step` (`self.scaler.scale(loss).backward()`).

Soundness
    The plan builds the GradScaler from `initialize`'s options only where their meaning is
    exact. Two switches say what Apex did: amp on (autocast's `enabled`) and losses scaled
    (the GradScaler's `enabled`). O0 and `enabled=False` turn amp off, and O0 scales losses
    only by a `loss_scale` given explicitly, as Apex's O0 did; a run-time `opt_level` gives
    `enabled=opt_level != "O0"`, right for every value, and a conditional of literal levels
    (`"O2" if args.half else "O0"`) its test or the test's negation; any other side-effect-free
    expression (`"O%d" % level`, `"O" + str(level)`, an f-string) is compared as it stands. A
    guard around `initialize` becomes `enabled=<guard>`. A static `loss_scale` of 1.0 (O3's
    default) gives a disabled scaler under an enabled autocast, as Apex's `scale_loss` then
    neither scaled nor skipped; another static scale gives a scaler that never grows, Apex's
    bit for bit until a step with non-finite gradients (AMP111 states that one difference); a
    run-time `loss_scale` gives one expression per argument that is each of these for the
    value it has (AMP120). It keeps one GradScaler per loss id when `num_losses > 1` and each
    optimizer is scaled under one loss id, because Apex kept one loss scale per loss id and an
    overflow in one backed off only that one; an optimizer scaled under two loss ids shares one
    scaler (its gradients must carry one scale), as AMP114 says. Several `initialize` calls
    each build their own scaler where every site is tied to one (plan/units.py,
    plan/methods.py). It refuses what it cannot express: several `initialize` calls a site is
    not provably tied to one of, options with side effects or only known at run time
    where a literal is needed, a scaler no single place reaches, and per-loss scalers whose
    state `amp.state_dict()` would have to save as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

import libcst as cst
import libcst.matchers as m

from ..analysis.statements import is_elif
from ..diagnostics import Severity, define
from ..file_state import FileState
from . import exits_per_step
from .inference import INFERENCE_DTYPE, INFERENCE_OUT_OF_REACH, SECOND_INITIALIZE
from .options import (  # codes it reports
    BF16,
    IGNORED_OPTIONS,
    O2_O3,
    OPTION_NOT_LITERAL,
    RUN_TIME_SCALE,
    RUNTIME_O0,
    RUNTIME_O3,
    SCALE_BOUNDS,
    STATIC_GROWTH_INTERVAL,
    STATIC_SCALE,
    UNSCALED,
    OptionReader,
    Reading,
    Switch,
    arguments,
    is_expression,
    keyword,
    start_scale_write,  # a scale Apex's scaler is given after initialize
    string,
    switch_of,
)
from .switch_flow import file_stores, flag_branch, function_of, import_flag
from .threaded import find_threading, top_level_function
from .types import (
    INIT,
    INITIALIZE,
    INITIALIZE_ARGS,
    LEVELS,
    LOAD_STATE_DICT,
    LOSS_SCALERS,
    ONE_SCALER,
    SCALE_LOSS_ARGS,
    STATE_DICT,
    WRAPPED_SCALE_LOSS,
    CastSource,
    SharedScaler,
    TrainingPlan,
    bind_arguments,
    expression_codes,
    literal,
    pure,
    scaler_name,
)
from .units import Unit, UnitPlanning

if TYPE_CHECKING:
    pass

NO_PLACE = define(
    "AMP101",
    "scaler-unreachable",
    Severity.WARNING,
    "No single place for the GradScaler reaches every Apex call of this file.",
    "Apex's loss scalers are process-global; a GradScaler is an object that `initialize`'s "
    "replacement creates and that `scale_loss`, `step` and `state_dict` must reach. When they "
    "are spread over functions that share neither a class nor literal options that a "
    "module-level scaler could be built from, the file is migrated to the shim instead. "
    "The message says which case this is: `initialize` runs inside a loop or a branch with an "
    "`else`, so no scaler built there reaches the rest of the code; or whether amp is enabled is "
    "only known where `initialize` runs, and the scaler cannot be passed on from there to the "
    "functions that use it; or autocast, which runs where the scaler is only reached, cannot "
    "follow its switches (with bfloat16 or a static loss scale of 1.0 the scaler is disabled "
    "while amp is on, and for some option values Apex cast without scaling losses or scaled "
    "without casting).",
    before="def setup(args):\n    model, opt = amp.initialize(model, opt, opt_level=args.opt_level)\n"
    "def train(model, opt):\n    with amp.scale_loss(loss, opt) as s:\n        s.backward()",
    after="def setup(args):\n    model, opt = amp.initialize(model, opt, opt_level=args.opt_level)  # amp_shim",
    falls_back=True,
    refusal="no single place for the scaler reaches every call",
    variants=(
        "runs inside a loop or a branch",
        "cannot be passed on from there",
        "cannot follow",
    ),
    fallback_title="no single place for the scaler",
    shape=(
        "`amp.initialize` inside a loop over several training objectives that also does Apex work per "
        "element (restores `amp.load_state_dict` per objective) or more than plain assignments; `initialize` "
        "in an optimizer factory's branch while `scale_loss` runs in a method of the optimizer wrapper class "
        "the factory's result is stored in, next to a legacy `FP16_Optimizer` branch; `if use_amp: "
        "initialize(...) else: ...` in an optimizer factory whose trainer lives in another module; a "
        "framework's `configure_apex_amp(opt_level=..., loss_scale=...)` whose users run the forward "
        "elsewhere, with options for which Apex cast without scaling (O3, a scale of 1.0) or scaled without "
        "casting (O0 with a scale)."
    ),
    fallback_why=(
        "Every `initialize` rebuilt Apex's global state: the last call's loss scaler is the one every later "
        "`scale_loss` uses, and O1's patches stack. Native code needs one GradScaler reachable from each "
        "`scale_loss` and step, built where the options are known; when its result flows through an object "
        "built in another function, no single built-once scaler is provably the one each use needs. A loop "
        "that only initializes each element (plain assignments beside the call, no other Apex call) is "
        "native: the state it leaves is the last call's fresh scaler, so one GradScaler is built before the "
        "loop (or before the `if` guarding it), updated after each objective's step; the stacked O1 patches "
        "cast exactly as one set does (the equivalence case `objectives-initialize-loop-O1` is bit for bit). "
        "A loop that also does Apex work per element ties that work to one iteration's state. Where autocast "
        "runs away from the scaler it can only follow `scaler.is_enabled()`, which is wrong for options "
        "whose casting and scaling differ. Migrated natively: a script (or another owner that imports the "
        "module it hands the scaler to) whose run-time options may differ so sets that module's "
        "`amp_enabled` beside its `scaler`, and the module's autocast reads it; an owner whose global the "
        "other modules read (an optimizer factory) keeps `amp_enabled` as a global beside `scaler`. A scaler "
        "kept on `self`, whose autocast runs in another method, still falls back (a missed opportunity: the "
        "switch could be kept on `self` the same way). An `initialize` in `if FLAG: ... else: <warn that "
        "Apex is missing>`, FLAG set True by the Apex import's `try:`, is native (AMP158: the flag is True "
        "once no Apex import is left, so the `if` is its body and the `if` around it, if any, is the guard); "
        "it still falls back here where the `try:` also imports something that may fail, something else "
        "stores the flag, or the `else` does more than report (`model = model.half()`). A run-time switch "
        "whose `initialize` sits in a helper (`setup_precision(model, opt, level)`) that the training "
        "function calls, where nothing in the file calls that training function: the scaler would be a local "
        "of the helper, and a `scaler` parameter added to the training function could be passed by no "
        "caller."
    ),
    by_hand=(
        "Move per-element Apex work out of the initializing loop (restore after it), or build one "
        "`torch.amp.GradScaler` before the loop and call `scaler.update()` after each objective's step."
    ),
)
INIT_COUNT = define(
    "AMP102",
    "initialize-not-once",
    Severity.WARNING,
    "The file calls `amp.initialize` (or `amp.init`) more than once, calls it with no "
    "`scale_loss` to go with it, or uses `scale_loss` without calling it.",
    "The native rewrite turns each `initialize` into a GradScaler built where it ran. Several "
    "calls (per fold, per branch, per training method of a class) each get their own where "
    "every `scale_loss`, step and `amp.state_dict()` is provably tied to the one Apex would have "
    "used: after it in its block, or in a method only calls from that block reach. Where a site "
    "may run after either (a helper both `fit()` and `lr_find()` call, a method called from "
    "outside the class), or no `initialize` is in the file (the call lives in another module "
    "this run cannot see), the file keeps Apex's semantics through the shim. The message says "
    "which case this is: `initialize` is called more than once in this file (with the reason no "
    "scaler per call could be tied to its uses); no `scale_loss` in this file goes with the one "
    "`initialize` here (the losses it prepares for are scaled where this file does not show, so "
    "a scaler built here would not be theirs); `scale_loss` or another amp call is used but "
    "`amp.initialize` is not called in this file; or per-loss scalers (`num_losses`) come with "
    "several `initialize` calls, which this rewrite does not split.",
    falls_back=True,
    refusal="several initialize calls, or none, leave no single scaler",
    variants=(
        "more than once",
        "no `scale_loss` in this file goes with",
        "is not called in this file",
        "per-loss scalers (`num_losses`)",
    ),
    fallback_title="`initialize` and `scale_loss` in modules the tree does not tie together",
    shape=(
        "A framework's task module calls `amp.initialize` in `prepare()` and a separate train-step module "
        "scales the loss (`with amp.scale_loss(loss, task.optimizer)`), while the module that hands the task "
        "to the step (the framework's runner, a registry, a config-built hook) is not among the files given; "
        "a runner that initializes and a wrapper called only from outside the tree; a model module whose "
        "several networks are each initialized in their own `initialize` call and stepped by a trainer that "
        "is not given."
    ),
    fallback_why=(
        "Apex's loss scaler is one global state per process; a GradScaler is an object that must reach every "
        "place that scales, steps, checkpoints and reads it. Without the code that connects the module "
        "building the scaler to the module using it, there is no provable place to thread it (one scaler for "
        "one process, not one per import), nor proof that the two modules run in one process with one "
        "`initialize` reaching the other. Building a second scaler in the using module would scale with a "
        "state the checkpoint code never saves and Apex never kept."
    ),
    by_hand=(
        "Run amp-migrate on the whole project (the module that connects them included): the project pass "
        "threads one scaler through a module attribute, a `self.` attribute or a new `scaler` parameter "
        "where it can see the connection. Otherwise pass the GradScaler explicitly from where `initialize` "
        "was to where `scale_loss` is."
    ),
)
MAIN_ONLY = define(
    "AMP123",
    "scaler-built-under-main",
    Severity.INFO,
    'This function uses the module-level GradScaler built under `if __name__ == "__main__":`.',
    "`initialize` ran in the script's entry block, so the scaler is built there (with its "
    "`enabled=` condition) and the module's functions read it as a global, as they read Apex's "
    "global state. Code that imports the module and calls the function without running the "
    "entry block finds no `scaler`; with Apex it found no initialised amp either, but one "
    "whose flag kept it off `scale_loss` worked.",
)
PER_LOSS_CHECKPOINT = define(
    "AMP104",
    "per-loss-scalers-in-checkpoint",
    Severity.WARNING,
    "Apex's per-loss scalers become one GradScaler per loss id here, and `amp.state_dict()` "
    "has no single native counterpart for them.",
    "With `num_losses > 1` and each optimizer stepped under its own `loss_id` (a GAN whose "
    "critic steps more often than its generator), the native loop keeps one GradScaler per "
    "loss id, as Apex kept one loss scaler per loss id. `amp.state_dict()` saved all of them in "
    "one dict; a native checkpoint would need one entry per scaler, which this rewrite does not "
    "invent, so the file uses the shim.",
    falls_back=True,
    refusal="per-loss scalers saved as one checkpoint entry",
    fallback_title="per-loss scalers saved in one checkpoint entry",
    shape=(
        "A GAN with `num_losses=2`, the critic stepped under `loss_id=0` more often than the generator under "
        "`loss_id=1`, and `amp.state_dict()` saved in its checkpoint."
    ),
    by_hand=(
        'Keep one `torch.amp.GradScaler` per loss and save each under its own key (`{"scaler_d": '
        'scaler_d.state_dict(), "scaler_g": scaler_g.state_dict()}`), loading them the same way.'
    ),
)

FLAG_BRANCH = define(
    "AMP158",
    "apex-flag-branch-always-runs",
    Severity.INFO,
    "`if FLAG: <amp.initialize> else: <Apex is missing>`: FLAG is the flag the Apex import's "
    "`try:` sets True, so natively the branch always runs and its `else` goes.",
    "A module that imports Apex under `try:` often records whether it could (`try: from apex "
    "import amp; APEX_OK = True / except ImportError: APEX_OK = False`) and calls `initialize` "
    "only where it did, warning otherwise. Natively no Apex import is left in that `try:`, so "
    "it cannot fail and the flag is True: the `if` is its body, and the scaler is built where "
    "`initialize` ran, under the `if` around it if there is one (its test joins `enabled=`). "
    "This holds only where the `try:` holds nothing else that may fail (Apex imports, constant "
    "assignments, constant log messages), nothing else stores the flag, the `if` is in a "
    "function defined after the `try:`, and the `else` only reports (log, print, `pass`, "
    "`raise`) with no Apex name in it; otherwise the `if`/`else` keeps `initialize` apart "
    "(AMP101). The warning the `else` gave when Apex was missing is gone: torch.amp needs no "
    "install.",
    before="if APEX_OK:\n    model, opt = amp.initialize(model, opt, opt_level=level)\n"
    'else:\n    logger.warning("no apex")',
    after='scaler = torch.amp.GradScaler("cuda", enabled=level != "O0")',
    variants=("always runs",),
)
SHARE_REFUSED = define(
    "AMP130",
    "shared-scaler-refused",
    Severity.WARNING,
    "The GradScaler this `initialize` builds would be read by other modules of the project, "
    "and they could not do with it what Apex did.",
    "In a project whose `initialize` and `scale_loss` (or `amp.state_dict()`) sit in different "
    "modules, the modules that scale or save read the one GradScaler this module builds, and "
    "run their forward under `torch.autocast(..., enabled=scaler.is_enabled())`. That is "
    "Apex's behaviour only where amp is on exactly when losses are scaled: not under O0 with a "
    "`loss_scale`, O3's static scale of 1.0, bfloat16, or per-loss scalers kept apart. Those "
    "projects use the shim; the message says which case this is. "
    "The message says which case this is: amp is on for some options where losses are not scaled; "
    "Apex's per-loss scalers stay apart; or `initialize` runs more than once here, and the other "
    "modules read one global.",
    before='model, opt = amp.initialize(model, opt, opt_level="O3")  # trainer.py scales',
    after="from amp_shim import amp  # every module of the group uses the shim",
    falls_back=True,
    refusal="modules sharing the scaler could not follow it as Apex did",
    variants=(
        "losses are not scaled",
        "runs more than once",
        "per-loss scalers stay apart",
    ),
    fallback_title="a scaler that other modules could not share as Apex did",
    shape=(
        '`initialize` in one module and `scale_loss` in another, with `opt_level="O0", loss_scale=128` '
        "(scaling without casting), O3 (casting with a static scale of 1.0), bfloat16, per-loss scalers, or "
        "`initialize` run more than once in the owner."
    ),
    by_hand=(
        "Where the options cast without scaling or scale without casting, hand the other modules autocast's "
        "own switch beside the scaler and open their autocast with it; or run one `initialize` with options "
        "under which Apex cast exactly when it scaled (O1 or O2 with the dynamic scale)."
    ),
)
SHARED = define(
    "AMP131",
    "scaler-shared-across-modules",
    Severity.INFO,
    "This GradScaler is shared with another module of the project: built where `initialize` "
    "was, read where `scale_loss`, the step or `amp.state_dict()` are.",
    "Apex's amp state was one per process, so a Trainer module scaled with what an optimizer "
    "factory's `initialize` set up. The native scaler is an object: the module that builds it "
    "keeps it in a module global that the users import the module for, or sets it as an "
    "attribute of the user module it imports (`trainer.scaler = scaler`). Code that reads it "
    "before `initialize` ran finds `None`, where Apex raised that amp was not initialized. "
    "The message says which side this module is on: the GradScaler built here is read by the "
    "modules it names, or the GradScaler used here is built by the module it names.",
    before='# optimization.py\nmodel, opt = amp.initialize(model, opt, opt_level="O1")\n'
    "# trainer.py\nwith amp.scale_loss(loss, opt) as s:\n    s.backward()",
    after='# optimization.py\nglobal scaler\nscaler = torch.amp.GradScaler("cuda")\n'
    "# trainer.py\nimport optimization as _amp_optimization\n"
    "_amp_optimization.scaler.scale(loss).backward()",
    variants=(
        "the GradScaler built here",
        "the GradScaler used here",
    ),
)


_MAIN = m.Comparison(
    left=m.Name("__name__"),
    comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString('"__main__"') | m.SimpleString("'__main__'"))],
)


def _script_entry(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.If) and node.orelse is None and m.matches(node.test, _MAIN)


class _Recipe(NamedTuple):
    """What `PlanTraining._plan` reads before it places, names and builds the scaler."""

    args: dict[str, cst.BaseExpression]
    optimizers: set[str]
    steps: list[cst.Call]
    placement: str
    guard_node: Optional[cst.BaseExpression]
    reading: Reading
    per_loss: dict[str, int]
    shared: Optional[SharedScaler]


class PlanTraining(UnitPlanning):
    """Read the file's Apex training calls and decide where its GradScaler lives."""

    HANDLES = (INITIALIZE, INIT)
    LEAVES = ("binding", "casts", "inference", "training")
    EMITS = (
        NO_PLACE,
        INIT_COUNT,
        FLAG_BRANCH,
        MAIN_ONLY,
        PER_LOSS_CHECKPOINT,
        SHARE_REFUSED,
        SHARED,
        ONE_SCALER,
        OPTION_NOT_LITERAL,
        O2_O3,
        STATIC_SCALE,
        UNSCALED,
        RUNTIME_O3,
        RUNTIME_O0,
        SCALE_BOUNDS,
        IGNORED_OPTIONS,
        RUN_TIME_SCALE,
        BF16,
        INFERENCE_OUT_OF_REACH,
        INFERENCE_DTYPE,
        SECOND_INITIALIZE,
        *exits_per_step.CODES,
    )

    def _unscales_at_exit(self, call: cst.Call) -> bool:
        """Apex unscaled and updated its scale at this `scale_loss`'s exit (no `delay_unscale`,
        or a literal False)."""
        bound = bind_arguments(call, SCALE_LOSS_ARGS) or {}
        return literal(bound.get("delay_unscale")) in (None, False)

    @classmethod
    def applies(cls, state: FileState) -> bool:
        return state.project is not None or super().applies(state)

    def decide(self, original_node: cst.Module) -> None:
        """Plan the file from the sites the visit collected (reports what it refuses)."""
        shared: Optional[SharedScaler] = self.state.project
        if not self.inits and shared is not None and self.sites and (shared.user or shared.refused):
            if shared.user:
                self._keep(self._plan_shared_use(original_node, shared))
            else:
                self._not_once(shared)
            return
        if not self.inits and not self.scale_losses:
            return
        self.state.casts = tuple(self._cast_source(call, statement) for call, statement in self.inits)
        if self._only_inference(shared):
            self._plan_inference(original_node)
            return
        absorbed = self._absorb(self._optimizer_codes()) if self.scale_losses else []
        if self.scale_losses and (
            len(self.inits) > 1 or self.inits and self._guard(self.inits[0][1], flags=len(self.inits) == 1)[1]
        ):
            self._plan_several(original_node)
            self._with_absorbed(absorbed)
            return
        if len(self.inits) != 1 or not (self.scale_losses or shared is not None and shared.owner):
            self._not_once(shared)
            return
        call, statement = self.inits[0]
        self._keep(self._plan(call, statement, original_node))
        self._with_absorbed(absorbed)
        return

    def _cast_source(self, call: cst.Call, statement: cst.CSTNode) -> CastSource:
        """What this `initialize` cast, for the check of forwards left outside autocast."""
        scope = self.scope_of(statement)
        if self.apex_name(call.func) == INIT:
            args: dict = bind_arguments(call, ("enabled",)) or {}
            level: Optional[str] = "O1"
        else:
            args = bind_arguments(call) or {}
            given = args.get("opt_level")
            level = "O1" if given is None else literal(given) if literal(given) in LEVELS else None
        models = set(expression_codes(args.get("models")))
        body = getattr(statement, "body", ())
        assign = body[0] if isinstance(body, Sequence) and len(body) == 1 else None
        if isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1:
            target: cst.BaseExpression = assign.targets[0].target
            if (
                "optimizers" in args
                and isinstance(target, (cst.Tuple, cst.List))
                and len(target.elements) == 2
            ):
                target = target.elements[0].value
            models.update(expression_codes(target))
        return CastSource(
            line=self.position(call)[0],
            scope=self.position(scope)[0] if scope else 0,
            opt_level=level,
            enabled=literal(args.get("enabled")) is not False,
            models=frozenset(models),
        )

    def _keep(self, plan: Optional[TrainingPlan]) -> None:
        if plan is not None:
            self.state.training = plan

    def _not_once(self, shared: Optional[SharedScaler]) -> None:
        where = (
            self.inits[1][0]
            if len(self.inits) > 1
            else (self.inits[0][0] if self.inits else (self.scale_losses or self.sites)[0])
        )
        called = (
            "amp.init" if self.inits and self.apex_name(self.inits[0][0].func) == INIT else "amp.initialize"
        )
        named = where.func if isinstance(where, cst.Call) else where
        used = "scale_loss" if self.scale_losses else (self.apex_name(named) or "amp").rsplit(".", 1)[-1]
        why = f", and {shared.refused}" if shared is not None and shared.refused else ""
        self.report(
            where,
            INIT_COUNT,
            f"`{called}` is called more than once in this file{why}"
            if len(self.inits) > 1
            else f"no `scale_loss` in this file goes with the `{called}` here{why}"
            if self.inits
            else f"`{used}` is used but `amp.initialize` is not called in this file{why}",
        )

    def _plan_shared_use(self, module: cst.Module, shared: SharedScaler) -> TrainingPlan:
        """A module that scales, steps or saves through the scaler another module's
        `initialize` builds: every site reads it as `shared.reach`, and autocast follows it
        (the owner refused where Apex's casts were not on exactly when its scaler was)."""
        self.report(self.sites[0], SHARED, f"the GradScaler used here is built by {shared.other}")
        optimizers = self._optimizer_codes()
        first = self._statement(self.scale_losses[0]) if self.scale_losses else module
        steps = self._step_sites(module, optimizers, first) if self.scale_losses else []
        device = cst.Arg(string(self.options.device))
        autocast = cst.Call(
            cst.parse_expression("torch.autocast"),
            [
                device,
                keyword("dtype", cst.parse_expression(f"torch.{self.options.dtype}")),
                keyword("enabled", cst.parse_expression(shared.amp_switch or f"{shared.reach}.is_enabled()")),
            ],
        )
        return TrainingPlan(
            scaler=shared.reach,
            placement="shared",
            scaler_call=cst.Call(cst.parse_expression("torch.amp.GradScaler"), [device]),
            autocast_call=autocast,
            optimizers=optimizers,
            step_lines=frozenset(self.position(c)[0] for c in steps),
            eager_unscale_lines=frozenset(
                line
                for c in self.scale_losses
                if self._unscales_at_exit(c)
                for line in self._lines_of(self._statement(c))
            ),
            global_casts=True,
            shared=shared,
        )

    def _plan_several(self, module: cst.Module) -> None:
        """Several `initialize` calls, or one that runs in a loop or a branch: a scaler each."""
        found = self._plan_in_units(module, self._plan)
        if isinstance(found, TrainingPlan):
            self.state.training = found
        elif found and len(self.inits) > 1:
            self.report(
                self.inits[1][0],
                INIT_COUNT,
                f"`amp.initialize` is called more than once in this file, and {found}",
            )
        elif found:
            self.report(
                self.inits[0][1],
                NO_PLACE,
                "`amp.initialize` runs inside a loop or a branch "
                f"with an `else`, and {found}{self._not_a_flag_branch(self.inits[0][1])}",
            )

    # -- deciding ------------------------------------------------------------------------------
    def _optimizer_codes(self) -> set[str]:
        codes: set[str] = set()
        for call in self.scale_losses:
            if self.apex_name(call.func) == WRAPPED_SCALE_LOSS:  # `optimizer.scale_loss(loss)`
                codes.add(self.code_of(cst.ensure_type(call.func, cst.Attribute).value))
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

    def _placement(self, init_statement: cst.CSTNode, sites: list[cst.CSTNode]) -> str:
        init_scope = self.scope_of(init_statement)
        scopes = {self.scope_of(s) for s in sites} | {init_scope}
        if len(scopes) == 1:
            return "local"
        if None not in scopes:
            classes = {self.class_of(f) for f in scopes if f is not None}  # (none is)
            if len(classes) == 1 and None not in classes:
                return "self"
        return "module"

    def _name(self, module: cst.Module, placement: str) -> str:
        return scaler_name(lambda name: self.name_is_free(name, module))

    def _free_name(self, module: cst.Module, wanted: str) -> str:
        name, i = wanted, 1
        while not self.name_is_free(name, module):
            name, i = f"{wanted}_{i}", i + 1
        return name

    def _plan(
        self,
        call: cst.Call,
        statement: cst.CSTNode,
        module: cst.Module,
        unit: Optional[Unit] = None,
        threaded: tuple = (),
    ) -> Optional[TrainingPlan]:
        """Options -> switches and scaler arguments, placement, naming: the recipe in order. Every
        refusal is reported; with a `unit`, the scaler serves only that block's sites."""
        recipe = self._recipe(call, statement, module, unit, threaded)
        if recipe is None:
            return None
        args, optimizers, steps, placement, guard_node, reading, per_loss, shared = recipe
        if placement == "module" and (
            is_expression(reading.amp_on) or is_expression(reading.scaling_on) or self._handed_on()
        ):
            placed = self._run_time_switch_placement(call, statement, module, guard_node, steps)
            if placed is None:
                return None
            placement, threaded = placed or (placement, threaded)
        scaler, loss_scalers = self._scaler_names(module, placement, per_loss)
        built = arguments(
            reading,
            placement == "local" and shared is None,
            scaler,
            self.options,
            call,
            self.report,
            apart=shared is not None and bool(shared.amp_publish),
        )
        if isinstance(built, str):
            self.report(call, NO_PLACE, built)
            return None
        if shared is not None and not self._shares(call, shared, built, scaler):
            return None
        if self._scale_is_dynamic(reading):
            self._check_exits_per_step(steps)
        scope = self.scope_of(statement)
        return TrainingPlan(
            scaler=scaler,
            placement=placement,
            scaler_call=built[0],
            autocast_call=built[1],
            models=set(expression_codes(args.get("models"))),
            optimizers=optimizers,
            step_lines=frozenset(self.position(c)[0] for c in steps),
            eager_unscale_lines=self._eager_unscale_lines(),
            hoisted=guard_node is not None,
            init_scope=self.position(scope)[0] if scope else 0,
            init_line=self._lines_of(statement)[-1],
            global_casts=self.apex_name(call.func) == INIT,
            loss_scalers=loss_scalers,
            optimizer_losses=dict(per_loss),
            threaded=threaded,
            shared=shared,
            flag_branches=frozenset(self._flagged) if unit is None else frozenset(),
        )

    def _recipe(
        self,
        call: cst.Call,
        statement: cst.CSTNode,
        module: cst.Module,
        unit: Optional[Unit],
        threaded: tuple,
    ) -> Optional[_Recipe]:
        """`_plan`'s reading of `initialize`, its steps, its guard and its options, before the
        scaler is placed and named; None where one is refused (reported)."""
        args = self._options_of(call)
        if args is None:
            return None
        optimizers = self._optimizer_codes()
        steps = self._step_sites(module, optimizers, statement)
        if unit is not None:
            steps = self._unit_steps(unit, steps, threaded)
        placement = (
            "threaded"
            if threaded
            else self.forced_placement or self._placement(statement, [*self.sites, *steps])
        )
        guard_node, guard = self._guard_switch(statement, nested_ok=unit is not None)
        start = start_scale_write(
            statement, self.parent(statement), lambda node: self.apex_name(node) in LOSS_SCALERS
        )
        reading = OptionReader(args, call, self.report, self._free_builtins()).read(
            True if guard is None else guard, start[1] if start else None
        )
        per_loss = self._per_loss(args)
        if guard is None or not reading.ok or per_loss is None:
            return None
        shared = self._shared_owner(call, reading, per_loss, unit)
        if shared is False:
            return None
        if unit is not None and per_loss:
            self.report(call, INIT_COUNT, "per-loss scalers (`num_losses`) with several `initialize` calls")
            return None
        return _Recipe(args, optimizers, steps, placement, guard_node, reading, per_loss, shared)

    def _eager_unscale_lines(self) -> frozenset[int]:
        """The lines of the `scale_loss` statements at whose exit Apex unscaled."""
        return frozenset(
            line
            for c in self.scale_losses
            if self._unscales_at_exit(c)
            for line in self._lines_of(self._statement(c))
        )

    def _scale_is_dynamic(self, reading: Reading) -> bool:
        """Apex's scale can change at a `scale_loss` exit: amp and loss scaling may be on, and no
        literal static `loss_scale` fixed it (AMP111 covers those)."""
        if reading.amp_on is False or reading.scaling_on is False:
            return False
        return not any(
            isinstance(arg.keyword, cst.Name)
            and arg.keyword.value == "growth_interval"
            and self.code_of(arg.value) == STATIC_GROWTH_INTERVAL
            for arg in reading.scale_args
        )

    def _check_exits_per_step(self, steps: Sequence[cst.CSTNode]) -> None:
        """AMP215/AMP216 where one of Apex's loss scalers updated more than once per step."""
        ids = self._loss_id_lines()
        exits = []
        for call in self.scale_losses:
            if self._unscales_at_exit(call):
                bound = bind_arguments(call, SCALE_LOSS_ARGS)
                codes = expression_codes(bound.get("optimizers")) if bound is not None else ()
                optimizers = frozenset(codes) if codes else None
                exits.append((self._statement(call), ids.get(self.position(call)[0]), optimizers))
        stepped = [
            (c, self.code_of(c.func.value))
            for c in steps
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
        ]
        exits_per_step.check(exits, stepped, self.ancestors, self.position, self.code_of, self.report)

    def _loss_id_lines(self) -> dict[int, Optional[int]]:
        """Each line of each `scale_loss` statement -> its literal `loss_id` (0 when not given;
        None when only known at run time)."""
        found: dict[int, Optional[int]] = {}
        for call in self.scale_losses:
            bound = bind_arguments(call, SCALE_LOSS_ARGS)
            value = literal(bound["loss_id"]) if bound is not None and "loss_id" in bound else 0
            loss_id = value if isinstance(value, int) and not isinstance(value, bool) and bound else None
            for line in self._lines_of(self._statement(call)):
                found[line] = loss_id
        return found

    def _run_time_switch_placement(
        self,
        call: cst.Call,
        statement: cst.CSTNode,
        module: cst.Module,
        guard_node: Optional[cst.CSTNode],
        steps: list,
    ) -> Optional[tuple]:
        """A module-level scaler whose switch is only known where `initialize` runs: passed as a
        parameter when built in a function (the new placement), read from the script's entry
        block (reported; `()` keeps the placement), or None (refused, reported)."""
        found = self._threading(module, statement, guard_node, self.sites + steps)
        if isinstance(found, str):
            self.report(
                call,
                NO_PLACE,
                "whether amp is enabled is only known where `initialize` "
                f"runs, and the scaler cannot be passed on from there: {found}",
            )
            return None
        if self.scope_of(statement) is not None:
            return "threaded", tuple(found)
        if any(_script_entry(p) for p in self.ancestors(statement)):
            for function in found:
                self.report(
                    self._def_at(module, function.line),
                    MAIN_ONLY,
                    f'`{function.name}` reads the scaler built under `if __name__ == "__main__":`',
                )
        return ()

    def _shares(
        self, call: cst.Call, shared: SharedScaler, built: tuple[cst.Call, cst.Call], scaler: str
    ) -> bool:
        """Whether the modules that read this scaler can (reported either way)."""
        why = None
        if shared.casts and not shared.amp_publish and not self._followed(built, scaler):
            why = (
                "amp is on for some options where losses are not scaled (O0 with a `loss_scale`, "
                "O3's static 1.0, bfloat16), and autocast there can only follow the scaler's `enabled`"
            )
        if why is not None:
            self.report(call, SHARE_REFUSED, f"{shared.other} uses the scaler built here, but {why}")
            return False
        self.report(call, SHARED, f"the GradScaler built here is read by {shared.other}")
        return True

    def _followed(self, built: tuple[cst.Call, cst.Call], scaler: str) -> bool:
        """Autocast is on exactly when the scaler is enabled, so that modules reading the scaler
        can open `torch.autocast(..., enabled=scaler.is_enabled())` where Apex's casts were on."""

        def enabled(call: cst.Call) -> Optional[str]:
            return next(
                (
                    self.code_of(a.value)
                    for a in call.args
                    if a.keyword is not None and a.keyword.value == "enabled"
                ),
                None,
            )

        scaling, casting = enabled(built[0]), enabled(built[1])
        return casting == scaling or casting == f"{scaler}.is_enabled()"

    def _shared_owner(self, call: cst.Call, reading, per_loss: dict, unit: Optional[Unit]):
        """This file's role as the owner of a scaler other modules read (None: it has none);
        False, reported, where those modules could not do what Apex did with it."""
        shared: Optional[SharedScaler] = self.state.project
        if shared is None or not shared.owner:
            return None
        why = None
        if per_loss:
            why = "Apex's per-loss scalers stay apart here, and one module attribute holds one scaler"
        elif unit is not None and shared.global_:
            why = "`initialize` runs more than once here, and the other modules read one global"
        if why is None:
            return shared
        self.report(call, SHARE_REFUSED, f"{shared.other} uses the scaler built here, but {why}")
        return False

    def _threading(
        self,
        module: cst.Module,
        statement: cst.CSTNode,
        guard: Optional[cst.CSTNode],
        sites: list[cst.CSTNode],
    ):
        builder = top_level_function(self, statement)
        if builder is None and any(
            isinstance(p, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) for p in self.ancestors(statement)
        ):
            return "`initialize` is not in a module-level function"
        anchor = self.parent(guard) if guard is not None else statement
        assert anchor is not None  # a guard is the test of an `if`
        built_at = self.position(anchor)[0]
        return find_threading(self, module, builder, built_at, sites)

    def _def_at(self, module: cst.Module, line: int) -> cst.CSTNode:
        return next(
            (s for s in module.body if isinstance(s, cst.FunctionDef) and self.position(s)[0] == line), module
        )

    def _options_of(self, call: cst.Call) -> Optional[dict[str, cst.BaseExpression]]:
        names = (
            ("enabled", "enable_caching", "verbose", "allow_banned")
            if self.apex_name(call.func) == INIT
            else INITIALIZE_ARGS
        )
        args = bind_arguments(call, names)
        if args is None:
            self.report(call, OPTION_NOT_LITERAL, "`amp.initialize` takes `*args`/`**kwargs` here")
        return args

    def _guard_switch(
        self, statement: cst.CSTNode, nested_ok: bool = False
    ) -> tuple[Optional[cst.BaseExpression], Optional[Switch]]:
        """The `if` test around `initialize`, and its switch (True: no guard; None: a guard no
        scaler built before it can follow)."""
        guard, nested = self._guard(statement, flags=not nested_ok)
        if nested and not nested_ok:
            self.report(
                statement,
                NO_PLACE,
                "`amp.initialize` runs inside a loop or a branch "
                "with an `else`, so no scaler built there reaches the rest of the code",
            )
            return guard, None
        if guard is None:
            return None, True
        if not pure(guard, self._free_builtins()):
            self.report(
                statement, OPTION_NOT_LITERAL, "`amp.initialize` runs under a condition with side effects"
            )
            return guard, None
        return guard, switch_of(guard)

    def _per_loss(self, args: dict[str, cst.BaseExpression]) -> Optional[dict[str, int]]:
        """Optimizer -> loss id where Apex's per-loss scalers stay apart ({}: one scaler for
        every loss); None where `amp.state_dict()` would have to save them as one."""
        if "num_losses" not in args or literal(args["num_losses"]) == 1:
            return {}
        per_loss = self._loss_ids() or {}
        if len(set(per_loss.values())) < 2:
            self.report(args["num_losses"], ONE_SCALER)
            return {}
        if any(
            self.apex_name(s.func) in (STATE_DICT, LOAD_STATE_DICT)
            for s in self.sites
            if isinstance(s, cst.Call)
        ):
            self.report(args["num_losses"], PER_LOSS_CHECKPOINT)
            return None
        return per_loss

    def _scaler_names(
        self, module: cst.Module, placement: str, per_loss: dict[str, int]
    ) -> tuple[str, dict[int, str]]:
        """How code reaches the scaler, and each loss id's own where they stay apart."""
        shared: Optional[SharedScaler] = self.state.project
        name = (
            shared.name
            if shared is not None and shared.global_ and placement != "self"
            else self._name(module, placement)
        )
        scaler = f"self.{name}" if placement == "self" else name
        loss_scalers: dict[int, str] = {}
        for loss_id in sorted(set(per_loss.values())):
            own = self._free_name(module, f"{name}{loss_id}")
            loss_scalers[loss_id] = f"self.{own}" if placement == "self" else own
        if loss_scalers:
            scaler = loss_scalers[min(loss_scalers)]
        return scaler, loss_scalers

    def _handed_on(self) -> bool:
        """Apex's module is passed to functions of the file (carriers.py): the scaler takes
        their parameter, so it is passed down from where it is built, never a module global."""
        assert self.apex is not None  # bound before the traversal (Rule.transform_module_impl)
        carriers = self.apex.carriers
        return carriers is not None and carriers.refusal is None and bool(carriers.slots)

    def _flag_branches(self, statement: cst.CSTNode) -> list[cst.If]:
        """The `if FLAG:` statements directly around `statement`, innermost first, whose body
        always runs natively (switch_flow.flag_branch); each is reported once (AMP158)."""
        found: list[cst.If] = []
        if self._stored is None:
            self._stored = file_stores(self) or ()
        stored = self._stored or None
        block = self.parent(statement)
        branch = self.parent(block) if block is not None else None
        while stored is not None and isinstance(branch, cst.If) and branch.body is block:
            line = flag_branch(self, branch, *stored)
            if line is None:
                break
            found.append(branch)
            if self.position(branch)[0] not in self._flagged:
                self._flagged.add(self.position(branch)[0])
                tail = "; its `else` never runs and goes" if branch.orelse is not None else ""
                self.report(
                    branch,
                    FLAG_BRANCH,
                    f"`{self.code_of(branch.test)}` is True natively (the Apex "
                    f"import's `try:` at line {line} sets it and nothing else does), so this `if` "
                    f"always runs `initialize`'s replacement{tail}",
                )
            block = self.parent(branch)
            branch = self.parent(block) if block is not None else None
        return found

    def _not_a_flag_branch(self, statement: cst.CSTNode) -> str:
        """Why the `if NAME: <initialize> else: ...` around `statement` is not read as its body
        (AMP158), for AMP101's message; "" where no such `if` is there."""
        block = self.parent(statement)
        branch = self.parent(block) if block is not None else None
        if (
            not isinstance(branch, cst.If)
            or branch.body is not block
            or not isinstance(branch.test, cst.Name)
            or not isinstance(branch.orelse, cst.Else)
            or not self._stored
        ):
            return ""
        where = (
            f" (`if {branch.test.value}:` at line {self.position(branch)[0]} is not always taken natively: "
        )
        where_read = function_of(self, branch)
        if not where_read or import_flag(self, *self._stored, branch.test, where_read) is None:
            return (
                where + f"no module-level `try:` of only Apex imports, constant flags and log messages "
                f"sets `{branch.test.value}` True before this function, with no other store of it)"
            )
        return where + "its `else` does more than report that Apex is missing)"

    def _none_else(self, branch: cst.If) -> bool:
        """`else: amp = None` beside the import of a module handed on as a value (carriers.py):
        the value becomes the scaler, built before the `if`, and the `else` goes."""
        assert self.apex is not None  # bound before the traversal (Rule.transform_module_impl)
        carriers = self.apex.carriers
        return (
            carriers is not None
            and carriers.refusal is None
            and self.position(branch)[0] in carriers.bare_else
        )

    def _guard(
        self, statement: cst.CSTNode, flags: bool = False
    ) -> tuple[Optional[cst.BaseExpression], bool]:
        """The `if cond:` (without else) directly around `initialize`, and whether anything
        else (a loop, another branch) stands between it and its function. With `flags`, the
        `if FLAG:` statements between (FLAG set True by the Apex import's `try:`, an `else` that
        only reports Apex missing) are their bodies natively, so the guard is the `if` around them."""
        start: cst.CSTNode = statement
        for branch in self._flag_branches(statement) if flags else ():
            start = branch
        block = self.parent(start)
        owner = self.parent(block) if block is not None else None
        guard = None
        if (
            isinstance(owner, cst.If)
            and owner.body is block
            and (owner.orelse is None or self._none_else(owner))
            and not is_elif(owner, self.parent)
        ):
            guard, start = owner.test, owner
        for parent in self.ancestors(start):
            if isinstance(parent, (cst.FunctionDef, cst.Module)):
                break
            if _script_entry(parent) and isinstance(self.parent(parent), cst.Module):
                continue  # `if __name__ == "__main__":` runs once, at module level
            if isinstance(
                parent, (cst.For, cst.While, cst.If, cst.Else, cst.ExceptHandler, cst.Match, cst.Lambda)
            ):
                return guard, True
        return guard, False
