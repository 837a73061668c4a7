"""How `amp.initialize`'s options become the arguments of the GradScaler and of autocast.

Two switches say what Apex did at run time: whether amp was on at all (autocast's `enabled`)
and whether losses were scaled (the GradScaler's `enabled`). Each is a literal bool or an
expression read where the scaler is built; a guard around `initialize`, `enabled=`, the opt
level and the loss scale each contribute a part, and the parts are joined with `and`. The
static scale, if any, adds `init_scale`/`growth_interval`; a scale written into Apex's scaler
right after `initialize` (`start_scale_write`) replaces `init_scale`. PlanTraining (rules/training_plan.py)
reads them here and decides where the scaler lives; this module holds no rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Collection, Optional, Sequence, TypeGuard, Union

import libcst as cst

from ..analysis.literals import NOT_LITERAL
from ..analysis.statements import find_statements
from ..diagnostics import Severity, define
from .types import LEVELS, PURE_BUILTINS, literal, pure

#: A switch: a literal bool, or an expression that is true where the thing is on.
Switch = Union[bool, cst.BaseExpression]
Report = Callable[..., None]

OPTION_NOT_LITERAL = define(
    "AMP103",
    "option-not-provable",
    Severity.WARNING,
    "An `amp.initialize` option is computed at run time in a way native code cannot follow.",
    "Options such as `opt_level=args.opt_level` are rewritten to an expression that is right "
    'for every value (`enabled=args.opt_level != "O0"`). A run-time `loss_scale` (which may be '
    '"dynamic" or a number), `**kwargs`, or an expression with side effects cannot be, so the '
    "file uses the shim. "
    "The message names the option and why: a `loss_scale` chosen at run time; an option, or a "
    "condition around `initialize`, with side effects; an `opt_level` that calls a builtin the "
    "file rebinds (native code reads the level where the scaler is built and again for autocast); "
    "an `enabled` that is not a plain expression; an `opt_level` that is not one of O0-O3, or a "
    "`loss_scale` that is no usable scale; `*args`/`**kwargs`; or a scale set right after "
    "`initialize` that is known only at run time (the GradScaler may be built where it is not), "
    "is no positive number, sets one of several per-loss scalers, turns on a scale Apex had at "
    "1.0 (no scaling), which a disabled GradScaler cannot follow, or, under O0, is not a power "
    "of two (Apex scaled fp32 losses by it, native code does not).",
    before="amp.initialize(model, opt, loss_scale=args.loss_scale)",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="an initialize option only known at run time",
    variants=(
        "side effects",
        "`**kwargs`",
        "not a plain expression",
        "no usable scale",
        "chosen at run time",
        "rebinds",
        "not one of O0-O3",
        "not a power of two",
        "known only at run time",
        "no positive number",
        "one of several per-loss scalers",
        "cannot follow",
    ),
    fallback_title="an `initialize` option that cannot be followed",
    shape=(
        "`opt_level=get_optim_level()` where the level lives in a module-level dict a setter fills at run "
        "time (a mixed-precision wrapper module)."
    ),
    fallback_why=(
        "Native code must decide where it is built whether autocast and the scaler are on and which "
        "GradScaler arguments apply, and it reads the option twice (the scaler's `enabled=` and autocast's). "
        "A call of a user function may do anything; the codemod reads option expressions only when they are "
        "free of calls other than unshadowed builtins. (Run-time levels and scales themselves are native: "
        "`opt_level=args.opt_level, loss_scale=args.loss_scale` becomes expressions right for every value, "
        "None meaning the level's default.)"
    ),
    by_hand=(
        "Read the option into a local first (`level = get_optim_level()`) and pass the local, or pin the "
        'options your runs use (`opt_level="O1"`), then re-run.'
    ),
)
O2_O3 = define(
    "AMP110",
    "fp16-weights-become-autocast",
    Severity.INFO,
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
    "AMP111",
    "static-loss-scale",
    Severity.INFO,
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
    "AMP116",
    "unit-loss-scale-disables-scaler",
    Severity.INFO,
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
    variants=("so the GradScaler is disabled",),
)
RUNTIME_O3 = define(
    "AMP117",
    "run-time-o3-scaled",
    Severity.INFO,
    'If `opt_level` is "O3" at run time, this GradScaler is enabled, although Apex\'s O3 kept a '
    "static loss scale of 1.0.",
    "Where `initialize` and the autocast regions share a function, a run-time `opt_level` gives "
    '`GradScaler(enabled=level not in ("O0", "O3"))` and `autocast(enabled=level != "O0")`, '
    "right for every level. Here autocast runs elsewhere and follows `scaler.is_enabled()`, so "
    "the scaler is on at O3 too: it skips steps whose gradients are not finite, which Apex's O3 "
    "applied. O0, O1 and O2 are exact.",
    before="amp.initialize(model, opt, opt_level=opt_level)  # in Trainer.__init__",
    after='self.scaler = torch.amp.GradScaler("cuda", enabled=opt_level != "O0")',
)
RUNTIME_O0 = define(
    "AMP121",
    "run-time-o0-unscaled",
    Severity.INFO,
    'If `opt_level` is "O0" at run time, this GradScaler is disabled, although Apex\'s O0 '
    "still applied the `loss_scale` given.",
    "Where autocast runs away from the scaler it follows `scaler.is_enabled()`, so the scaler is "
    "off exactly where autocast must be: at O0. Apex's O0 (fp32 throughout) still scaled losses "
    "by an explicit `loss_scale`; in fp32 a power-of-two scale and its unscale leave gradients "
    "bit for bit the same, so the one difference is a step with inf/NaN gradients, which a "
    "dynamic Apex scaler skipped and the disabled GradScaler applies. O1, O2 and O3 are exact.",
    before='amp.initialize(model, opt, opt_level=args.opt_level, loss_scale="dynamic")  # in main()',
    after='scaler = torch.amp.GradScaler("cuda", enabled=args.opt_level != "O0")',
)
SCALE_BOUNDS = define(
    "AMP112",
    "loss-scale-bounds",
    Severity.INFO,
    "`min_loss_scale`/`max_loss_scale` have no GradScaler equivalent and were dropped.",
    "GradScaler's scale is unbounded: it can back off below Apex's floor and grow above its "
    "cap (2**24 by default, reached only after tens of thousands of clean steps).",
    before="amp.initialize(model, opt, min_loss_scale=1.0)",
    after='scaler = torch.amp.GradScaler("cuda")',
)
IGNORED_OPTIONS = define(
    "AMP113",
    "option-without-native-meaning",
    Severity.INFO,
    "An `amp.initialize` option with no native meaning was dropped "
    "(`keep_batchnorm_fp32`, `master_weights`, `cast_model_type`, `patch_torch_functions`, "
    "`cast_model_outputs`).",
    "Native weights stay fp32 (BatchNorm included) and autocast chooses each op's dtype, so "
    "these switches have nothing to act on. `cast_model_outputs` in particular: model outputs "
    "now come back in whatever dtype autocast gave their last op.",
)
RUN_TIME_SCALE = define(
    "AMP120",
    "run-time-loss-scale",
    Severity.INFO,
    "`loss_scale` is chosen at run time; the GradScaler's arguments are expressions right for "
    "each value it may take.",
    "\"dynamic\" (or None, the opt level's dynamic default) keeps GradScaler's defaults "
    "(`init_scale=2.0**16`, `growth_interval=2000`); a number S gives `init_scale=float(S)` "
    "and `growth_interval=2**31 - 1`, a scale that never grows (AMP111: it differs from Apex "
    "only on a step with non-finite gradients); 1.0 disables the scaler while autocast stays "
    "on, as Apex's `scale_loss` then neither scaled nor skipped (AMP116). Where the level may be "
    "O0 or O3, None is their default static 1.0 and also disables the scaler.",
    before='amp.initialize(model, opt, opt_level="O1", loss_scale=args.loss_scale)',
    after='scaler = torch.amp.GradScaler(\n    "cuda",\n'
    '    init_scale=2.0**16 if args.loss_scale in (None, "dynamic") else float(args.loss_scale),\n'
    '    growth_interval=2000 if args.loss_scale in (None, "dynamic") else 2**31 - 1,\n'
    '    enabled=args.loss_scale in (None, "dynamic") or float(args.loss_scale) != 1.0,\n)',
)
BF16 = define(
    "AMP115",
    "bfloat16-no-loss-scaling",
    Severity.INFO,
    "With `--dtype bfloat16` autocast runs in bfloat16 and the GradScaler is disabled.",
    "bfloat16 has float32's exponent range, so gradients do not underflow and loss scaling is "
    "unnecessary; a disabled GradScaler passes losses and steps through unchanged, so the code "
    "keeps its shape and can be switched back to float16.",
)

USER_AUTOCAST = define(
    "AMP141",
    "own-autocast-in-apex-region",
    Severity.WARNING,
    "The file's own `autocast` region lies inside the forward that native autocast must cover "
    "for Apex; the file uses the shim.",
    "Apex's O1 casts ignored torch's autocast state, so they stayed on inside the file's own "
    "`with autocast(...)` (in a file with an Apex path and a torch path, "
    '`autocast(enabled=args.amp == "torch")` is off on the Apex path and Apex still cast). '
    "Natively the inner region's `enabled` and `dtype` override the outer one, so where it is "
    "off the Apex path's forward would run in fp32. Merge the two paths' autocast into one by "
    "hand (`enabled=` true for both) to migrate natively.",
    before='with autocast(enabled=args.amp == "torch"):\n    loss = model(x)\n'
    "with amp.scale_loss(loss, opt) as scaled:\n    scaled.backward()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="the file's own autocast would switch native autocast off on the Apex path",
    fallback_title="the file's own autocast inside the Apex forward",
    shape=(
        "A trainer with an Apex path and a torch path chosen by a flag, whose forward runs under `with "
        'autocast(enabled=self.amp_type == "torch"):` for both.'
    ),
    by_hand=(
        'Use one autocast for both paths (`enabled=self.amp_type in ("apex", "torch")`) and one '
        "GradScaler; then the Apex path is the torch path."
    ),
)


def autocast_aliases(module: cst.Module) -> frozenset[str]:
    """Names the module's `from torch... import autocast as <name>` imports bind (any depth)."""
    names: set[str] = set()
    for node in find_statements(module, cst.ImportFrom):
        source = cst.Module([]).code_for_node(node.module) if node.module is not None else ""
        if source.split(".")[0] == "torch" and not isinstance(node.names, cst.ImportStar):
            names.update(
                a.evaluated_alias or a.evaluated_name for a in node.names if a.evaluated_name == "autocast"
            )
    return frozenset(names)


def own_autocast(statements: Sequence[cst.CSTNode], aliases: Collection[str] = ()) -> Optional[cst.With]:
    """The first `with <...>.autocast(...)` in `statements`, or a call of a name from `aliases`
    (a helper of the same name counts too, which only makes the file fall back)."""
    code = cst.Module([]).code_for_node
    for statement in statements:
        for node in find_statements(statement, cst.With):
            if any(
                isinstance(i.item, cst.Call)
                and (code(i.item.func).rsplit(".", 1)[-1] == "autocast" or code(i.item.func) in aliases)
                for i in node.items
            ):
                return node
    return None


_DROPPED = (
    "keep_batchnorm_fp32",
    "master_weights",
    "cast_model_type",
    "patch_torch_functions",
    "cast_model_outputs",
)


# -- switches ------------------------------------------------------------------------------------
def is_expression(switch: Switch) -> TypeGuard[cst.BaseExpression]:
    return not isinstance(switch, bool)


def switch_of(node: cst.BaseExpression) -> Switch:
    value = literal(node)
    return value if isinstance(value, bool) else node


def both(*switches: Switch) -> Switch:
    """`a and b and ...`, literal where any part is False or every part is True."""
    if any(s is False for s in switches):
        return False
    out: Switch = True
    for s in switches:  # (no part is False, so `out` is True until a part is an expression)
        if isinstance(out, bool):
            out = s
        elif not isinstance(s, bool):
            out = _and(out, s)
    return out


def _and(left: cst.BaseExpression, right: cst.BaseExpression) -> cst.BooleanOperation:
    """`left and right`, each part made a bool where it may not be one: `and` returns a falsy
    operand itself (`None`, `""`), and `torch.autocast(enabled=)` accepts only a bool."""

    def wrap(e):
        if not is_bool(e):
            return cst.Call(cst.Name("bool"), [cst.Arg(e)])
        if (
            isinstance(e, cst.BooleanOperation)
            and isinstance(e.operator, cst.Or)
            or isinstance(e, (cst.IfExp, cst.Lambda, cst.NamedExpr))
        ):
            return parenthesized(e)
        return e

    return cst.BooleanOperation(wrap(left), cst.And(), wrap(right))


_BOOL_CALLS = frozenset({"bool", "isinstance", "issubclass", "hasattr", "callable"})


def is_bool(node: cst.BaseExpression) -> bool:
    """Whether `node` evaluates to a bool whatever its operands hold."""
    if isinstance(node, (cst.Comparison,)) or (
        isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not)
    ):
        return True
    if isinstance(node, cst.Name):
        return node.value in ("True", "False")
    if isinstance(node, cst.BooleanOperation):
        return is_bool(node.left) and is_bool(node.right)
    if isinstance(node, cst.IfExp):
        return is_bool(node.body) and is_bool(node.orelse)
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in _BOOL_CALLS


_LOOSE = (cst.IfExp, cst.BooleanOperation, cst.Comparison, cst.Lambda, cst.NamedExpr)


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` as the operand of a comparison: in parentheses where it binds more loosely."""
    loose = isinstance(node, _LOOSE) or (
        isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not)
    )
    if loose and not node.lpar:
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def clone(switch: Switch) -> Switch:
    return switch.deep_clone() if is_expression(switch) else switch


def as_expression(switch: Switch) -> cst.BaseExpression:
    return cst.Name(str(switch)) if isinstance(switch, bool) else switch


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )


def string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


# -- reading the options -------------------------------------------------------------------------
@dataclass
class Level:
    """What an `opt_level` says: amp on, and losses scaled when `loss_scale` is left to it."""

    amp_on: Switch = True
    scaled_by_default: Switch = True
    values: tuple = ("O1",)  # the levels it may be
    run_time: Optional[cst.BaseExpression] = None  # a level read at run time, not a literal choice
    ok: bool = True


@dataclass
class Scale:
    """What `loss_scale` says: None where the level's default applies, else whether losses are
    scaled; with the GradScaler arguments of a static scale."""

    scaled: Optional[Switch] = None
    args: list[cst.Arg] = field(default_factory=list)
    ok: bool = True


@dataclass
class Reading:
    """The two switches and the static scale, from every option of one `initialize`."""

    amp_on: Switch = True
    scaling_on: Switch = True
    scale_args: list[cst.Arg] = field(default_factory=list)
    #: The run-time `opt_level` where the switches differ only when it is O3.
    o3_at_run_time: Optional[cst.BaseExpression] = None
    #: The run-time `opt_level` where the switches differ only when it is O0 (a scale given).
    o0_at_run_time: Optional[cst.BaseExpression] = None
    ok: bool = True


def static_value(node: Optional[cst.BaseExpression]):
    """A literal `loss_scale` as Apex read it ("128" -> 128.0, True -> 1.0), else NOT_LITERAL."""
    value = literal(node)
    if isinstance(value, (str, bool)) and value != "dynamic":
        try:
            return float(value)
        except ValueError:
            return NOT_LITERAL
    return value


def choose(test: cst.BaseExpression, when_true: Switch, when_false: Switch) -> Switch:
    """`when_true if test else when_false` for literal arms: a literal, the test, or its negation."""
    if when_true is when_false:
        return when_true
    return test if when_true is True else negation(test)


_OPPOSITE = (
    (cst.Equal, cst.NotEqual),
    (cst.NotEqual, cst.Equal),
    (cst.In, cst.NotIn),
    (cst.NotIn, cst.In),
    (cst.Is, cst.IsNot),
    (cst.IsNot, cst.Is),
)


def negation(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        return test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        for op, opposite in _OPPOSITE:
            if type(target.operator) is op:
                return test.with_changes(comparisons=[target.with_changes(operator=opposite())])
    if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Comparison)) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(cst.Not(), test)


class OptionReader:
    """Reads one `initialize`'s options into a Reading, reporting what it cannot follow."""

    def __init__(self, args: dict, call: cst.Call, report: Report, builtins: Collection[str] = ()) -> None:
        self.args, self.call, self.report, self.builtins = args, call, report, builtins

    def pure(self, node: cst.BaseExpression) -> bool:
        return pure(node, self.builtins)

    def read(self, guard: Switch, start: Optional[cst.BaseExpression] = None) -> Reading:
        """Both switches from the guard around `initialize`, its `opt_level`, `enabled` and
        `loss_scale` (in that order, as `and` reads them); `start`, a scale written into Apex's
        scaler right after `initialize` (`start_scale_write`), becomes the first scale."""
        level = self.level()
        enabled = self.enabled()
        scale = self.loss_scale(level) if level.ok else Scale(ok=False)
        if start is not None and scale.ok:
            scale = self._started(scale, level, start)
        report_dropped(self.args, self.report)
        if not (level.ok and scale.ok) or enabled is None:
            return Reading(ok=False)
        amp_on = both(guard, level.amp_on, enabled)
        if scale.scaled is None:
            scaling_on = both(clone(guard), level.scaled_by_default, clone(enabled))
        else:  # a loss scale given is used at every level, O0 included
            scaling_on = both(clone(guard), clone(enabled), scale.scaled)
        return Reading(
            amp_on,
            scaling_on,
            scale.args + max_scale_args(self.args, scale),
            o3_at_run_time=level.run_time if scale.scaled is None else None,
            o0_at_run_time=level.run_time if scale.scaled is True else None,
        )

    def level(self) -> Level:
        level = self.args.get("opt_level")
        if level is None:
            return Level()
        value = literal(level)
        if value is NOT_LITERAL:
            return self._conditional_level(level) or self._run_time_level(level)
        if value not in LEVELS:
            self.report(level, OPTION_NOT_LITERAL, f"`opt_level={value!r}` is not one of O0-O3")
            return Level(ok=False)
        if value in ("O2", "O3"):
            self.report(self.call, O2_O3)
        return Level(value != "O0", value in ("O1", "O2"), (value,))

    def _conditional_level(self, level: cst.BaseExpression) -> Optional[Level]:
        """`"O2" if args.half else "O0"`: each switch is a literal, the test or its negation."""
        if not isinstance(level, cst.IfExp) or not self.pure(level.test):
            return None
        arms = (literal(level.body), literal(level.orelse))
        if not all(isinstance(a, str) and a in LEVELS for a in arms):
            return None
        if {"O2", "O3"} & set(arms):
            self.report(self.call, O2_O3)
        return Level(
            choose(level.test, *(a != "O0" for a in arms)),
            choose(level.test.deep_clone(), *(a in ("O1", "O2") for a in arms)),
            arms,
        )

    def _run_time_level(self, level: cst.BaseExpression) -> Level:
        if not self.pure(level):
            why = (
                "calls a builtin this file rebinds"
                if pure(level, PURE_BUILTINS)
                else "calls code that may have side effects or give another value when read again"
            )
            self.report(
                level,
                OPTION_NOT_LITERAL,
                f"`opt_level={cst.Module([]).code_for_node(level)}` {why}; "
                "native code reads the level where the scaler is built and again for autocast",
            )
            return Level(ok=False)
        amp_on = cst.Comparison(parenthesized(level), [cst.ComparisonTarget(cst.NotEqual(), string("O0"))])
        scaled = cst.Comparison(
            parenthesized(level.deep_clone()),
            [
                cst.ComparisonTarget(
                    cst.NotIn(), cst.Tuple([cst.Element(string("O0")), cst.Element(string("O3"))])
                )
            ],
        )
        return Level(amp_on, scaled, LEVELS, level)

    def enabled(self) -> Optional[Switch]:
        """`enabled=`'s switch; None when it cannot be read."""
        enabled = self.args.get("enabled")
        value = literal(enabled)
        if enabled is None or value is True:
            return True
        if value is False:
            return False
        if value is NOT_LITERAL and self.pure(enabled):
            return enabled
        self.report(enabled, OPTION_NOT_LITERAL, "`enabled` is not a plain expression")
        return None

    def loss_scale(self, level: Level) -> Scale:
        loss_scale = self.args.get("loss_scale")
        value = static_value(loss_scale)
        if value is NOT_LITERAL:
            assert loss_scale is not None  # (an absent `loss_scale` is no run-time value)
            return self._run_time_scale(loss_scale, level)
        if value is None:
            if "O3" in level.values and level.run_time is None:
                self.report(
                    self.args.get("opt_level"),
                    UNSCALED,
                    "O3's default loss scale is a static 1.0: Apex did not scale losses, so "
                    "the GradScaler is disabled"
                    + (" where `opt_level` is O3" if len(level.values) > 1 else "")
                    + "; autocast stays on",
                )
            return Scale()
        if value == "dynamic":
            return Scale(True)
        if not 0.0 < value < float("inf"):
            self.report(loss_scale, OPTION_NOT_LITERAL, f"`loss_scale={value!r}` is no usable scale")
            return Scale(ok=False)
        if value == 1.0:
            if level.values != ("O0",):
                self.report(
                    loss_scale,
                    UNSCALED,
                    "a static `loss_scale` of 1.0: Apex did not scale "
                    "losses, so the GradScaler is disabled; autocast stays on",
                )
            return Scale(False)
        self.report(loss_scale, STATIC_SCALE)
        return Scale(
            True,
            [
                keyword("init_scale", cst.Float(repr(float(value)))),
                keyword("growth_interval", cst.parse_expression(STATIC_GROWTH_INTERVAL)),
            ],
        )

    def _started(self, scale: Scale, level: Level, start: cst.BaseExpression) -> Scale:
        """Apex's scaler 0 set to `start` before its first use: the GradScaler starts there.
        Apex kept the scale's kind (dynamic or static) and only the value changed, so a dynamic
        scale gets `init_scale=start` and a static one keeps its never-growing interval."""
        value, shown = literal(start), f"`_loss_scale = {cst.Module([]).code_for_node(start)}`"
        why = None
        if value is NOT_LITERAL:
            why = "is known only at run time, and the GradScaler may be built where it is not"
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            why = "is no positive number"
        elif literal(self.args.get("num_losses")) not in (None, 1):
            why = "sets one of several per-loss scalers"
        elif scale.scaled is False or level.values == ("O3",):
            why = "turns on a scale Apex had at 1.0 (no scaling), which a disabled GradScaler cannot follow"
        elif any(isinstance(a.value, cst.IfExp) for a in scale.args):
            why = "comes with a `loss_scale` chosen at run time"
        elif "O0" in level.values and scale.scaled is None and math.frexp(value)[0] != 0.5:
            why = "is not a power of two, and at O0 Apex scaled fp32 losses by it where native code does not"
        if why is not None:
            self.report(start, OPTION_NOT_LITERAL, f"{shown} right after `initialize` {why}")
            return Scale(ok=False)
        kept = [a for a in scale.args if a.keyword is None or a.keyword.value != "init_scale"]
        return Scale(scale.scaled, [keyword("init_scale", start.deep_clone()), *kept])

    def _run_time_scale(self, loss_scale: cst.BaseExpression, level: Level) -> Scale:
        """ "dynamic" or None: GradScaler's defaults; a number S: `init_scale=float(S)` that never
        grows; 1.0: no scaling. One expression per argument, right for each of them."""
        why = (
            "it has side effects"
            if not self.pure(loss_scale)
            else "the file rebinds `float`"
            if "float" not in self.builtins
            else None
        )
        if why is not None:
            self.report(loss_scale, OPTION_NOT_LITERAL, f"`loss_scale` is chosen at run time and {why}")
            return Scale(ok=False)
        self.report(loss_scale, RUN_TIME_SCALE)
        # None is the level's default: dynamic at O1/O2, a static 1.0 (no scaling) at O0/O3.
        default = level.scaled_by_default
        test, number = _dynamic_arm(loss_scale) if default is True else (None, loss_scale)

        def dynamic() -> cst.BaseExpression:
            of_number = cst.Comparison(
                parenthesized(number.deep_clone()),
                [
                    cst.ComparisonTarget(
                        cst.In(), cst.Tuple([cst.Element(cst.Name("None")), cst.Element(string("dynamic"))])
                    )
                ],
            )
            return (
                of_number
                if test is None
                else cst.BooleanOperation(_or_operand(test.deep_clone()), cst.Or(), of_number)
            )

        def as_float() -> cst.Call:
            return cst.Call(cst.Name("float"), [cst.Arg(number.deep_clone())])

        start = literal(self.args.get("max_loss_scale"))
        start = float(start) if isinstance(start, (int, float)) and start < 2.0**16 else None
        init = cst.IfExp(
            dynamic(), cst.Float(repr(start)) if start else cst.parse_expression("2.0**16"), as_float()
        )
        growth = cst.IfExp(dynamic(), cst.Integer("2000"), cst.parse_expression(STATIC_GROWTH_INTERVAL))
        not_one = cst.Comparison(as_float(), [cst.ComparisonTarget(cst.NotEqual(), cst.Float("1.0"))])
        scaled: cst.BaseExpression
        if default is True:
            scaled = cst.BooleanOperation(dynamic(), cst.Or(), not_one)
        else:
            scaled = _scaled_with_level_default(number, default, not_one)
        return Scale(scaled, [keyword("init_scale", init), keyword("growth_interval", growth)])


def _scaled_with_level_default(
    number: cst.BaseExpression, default: Switch, not_one: cst.BaseExpression
) -> cst.BaseExpression:
    """`X == "dynamic" or (<level's default> if X is None else float(X) != 1.0)`: whether Apex
    scaled losses, for a run-time `loss_scale` X at a level whose default may be a static 1.0."""

    def compare(op: cst.BaseCompOp, right: cst.BaseExpression) -> cst.Comparison:
        return cst.Comparison(parenthesized(number.deep_clone()), [cst.ComparisonTarget(op, right)])

    named = compare(cst.Equal(), string("dynamic"))
    if default is False:
        rest: cst.BaseExpression = cst.BooleanOperation(
            compare(cst.IsNot(), cst.Name("None")), cst.And(), not_one
        )
    else:
        rest = cst.IfExp(
            compare(cst.Is(), cst.Name("None")),
            _or_operand(as_expression(clone(default))),
            not_one,
            lpar=[cst.LeftParen()],
            rpar=[cst.RightParen()],
        )
    return cst.BooleanOperation(named, cst.Or(), rest)


def start_scale_write(
    statement: cst.CSTNode, block: Optional[cst.CSTNode], is_loss_scalers: Callable[[cst.CSTNode], bool]
) -> Optional[tuple[cst.SimpleStatementLine, cst.BaseExpression]]:
    """The statement right after the `initialize` statement `statement` (in `block`, its parent)
    when it is `<amp>._amp_state.loss_scalers[0]._loss_scale = value`, with that value: Apex's
    first scale set before any loss is scaled, which is GradScaler's `init_scale`."""
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    body = list(block.body)
    at = next((i for i, s in enumerate(body) if s is statement), None)
    if at is None or at + 1 == len(body):
        return None
    line = body[at + 1]
    if not (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Assign)
        and len(line.body[0].targets) == 1
    ):
        return None
    target = line.body[0].targets[0].target
    if not (
        isinstance(target, cst.Attribute)
        and target.attr.value == "_loss_scale"
        and isinstance(target.value, cst.Subscript)
        and len(target.value.slice) == 1
        and isinstance(target.value.slice[0].slice, cst.Index)
        and literal(target.value.slice[0].slice.value) == 0
        and is_loss_scalers(target.value.value)
    ):
        return None
    return line, line.body[0].value


def _or_operand(node: cst.BaseExpression) -> cst.BaseExpression:
    return parenthesized(node) if isinstance(node, (cst.IfExp, cst.Lambda, cst.NamedExpr)) else node


def _dynamic_arm(loss_scale: cst.BaseExpression) -> tuple[Optional[cst.BaseExpression], cst.BaseExpression]:
    """`None if args.loss_scale == 0 else args.loss_scale` -> (`args.loss_scale == 0`,
    `args.loss_scale`): the test that picks a dynamic arm, and the value otherwise."""
    if isinstance(loss_scale, cst.IfExp):
        for dynamic, other, test in (
            (loss_scale.body, loss_scale.orelse, loss_scale.test),
            (loss_scale.orelse, loss_scale.body, None),
        ):
            if literal(dynamic) in (None, "dynamic") and literal(other) is NOT_LITERAL:
                return (test if test is not None else negation(loss_scale.test.deep_clone())), other
    return None, loss_scale


def max_scale_args(args: dict, scale: Scale) -> list[cst.Arg]:
    """A dynamic scale starts at `max_loss_scale` where that is below Apex's 2**16."""
    max_scale = literal(args.get("max_loss_scale"))
    if (
        isinstance(max_scale, (int, float))
        and max_scale < 2.0**16
        and scale.scaled is not False
        and not scale.args
    ):
        return [keyword("init_scale", cst.Float(repr(float(max_scale))))]
    return []


def report_dropped(args: dict, report: Report) -> None:
    for bound in ("min_loss_scale", "max_loss_scale"):
        if bound in args and literal(args[bound]) is not None:
            report(args[bound], SCALE_BOUNDS)
    for option in _DROPPED:
        if option in args and literal(args[option]) is not None:
            report(args[option], IGNORED_OPTIONS, f"`{option}` has no native meaning and was dropped")


def _same(a: Switch, b: Switch) -> bool:
    code = cst.Module([]).code_for_node
    return a is b if isinstance(a, bool) or isinstance(b, bool) else code(a) == code(b)


def arguments(
    reading: Reading, local: bool, scaler: str, options, call: cst.Call, report: Report, apart: bool = False
) -> Union[tuple[cst.Call, cst.Call], str]:
    """The GradScaler's and autocast's calls; or why autocast, which runs where the scaler is
    only reached (not where it is built), cannot follow the switches. `apart`: autocast
    elsewhere reads the amp switch the owner publishes beside the scaler (project/share.py),
    so each switch is its own expression, right for every value of the options."""
    scaler_args: list[cst.Arg] = [cst.Arg(string(options.device)), *reading.scale_args]
    autocast_args = [
        cst.Arg(string(options.device)),
        keyword("dtype", cst.parse_expression(f"torch.{options.dtype}")),
    ]
    amp_on, scaling_on = reading.amp_on, reading.scaling_on
    if not options.needs_loss_scaling:
        report(call, BF16)
        scaling_on = False
    if apart:
        if scaling_on is not True:
            scaler_args.append(keyword("enabled", as_expression(scaling_on)))
        autocast_args.append(keyword("enabled", as_expression(clone(amp_on))))
        return (
            cst.Call(cst.parse_expression("torch.amp.GradScaler"), scaler_args),
            cst.Call(cst.parse_expression("torch.autocast"), autocast_args),
        )
    if amp_on is False:  # O0: fp32 throughout, losses scaled only by a `loss_scale` given
        autocast_args.append(keyword("enabled", cst.Name("False")))
        if scaling_on is not True:
            scaler_args.append(keyword("enabled", as_expression(scaling_on)))
    elif scaling_on is False:
        if is_expression(amp_on) and not local:
            return (
                ("with bfloat16" if not options.needs_loss_scaling else "with a static loss scale of 1.0")
                + " the scaler is disabled, so autocast "
                "cannot follow it; whether amp is enabled is only known where `initialize` is"
            )
        scaler_args.append(keyword("enabled", cst.Name("False")))
        if is_expression(amp_on):
            autocast_args.append(keyword("enabled", amp_on))
    elif not _same(amp_on, scaling_on) and (local or not is_expression(amp_on)):
        scaler_args.append(keyword("enabled", as_expression(scaling_on)))
        if is_expression(amp_on):
            autocast_args.append(keyword("enabled", amp_on))
    elif is_expression(amp_on):
        if not _same(amp_on, scaling_on):
            if reading.o0_at_run_time is not None:
                report(reading.o0_at_run_time, RUNTIME_O0)
            elif reading.o3_at_run_time is None:
                return (
                    "for some values of the options Apex cast without scaling losses (O3, a scale "
                    "of 1.0) or scaled without casting (O0 with a scale), so autocast, which runs "
                    "elsewhere, cannot follow `scaler.is_enabled()` there"
                )
            else:
                report(reading.o3_at_run_time, RUNTIME_O3)
        scaler_args.append(keyword("enabled", amp_on))
        autocast_args.append(keyword("enabled", cst.parse_expression(f"{scaler}.is_enabled()")))
    return (
        cst.Call(cst.parse_expression("torch.amp.GradScaler"), scaler_args),
        cst.Call(cst.parse_expression("torch.autocast"), autocast_args),
    )
