"""`with amp.scale_loss(loss, opt) as s: s.backward()` → autocast forward + `scaler.scale(loss)`.

What it does
    Rewrites each `scale_loss` block to `scaler.scale(loss).backward(...)` (or, when the body
    does more than one backward, binds `s = scaler.scale(loss)` and keeps the body), and wraps
    the forward pass in `with torch.autocast(...)`: the statements of the enclosing block from
    the first one that uses a model returned by `initialize` to the last one that assigns the
    loss (when no model use is visible there, from the earliest statement whose assignments
    flow into the loss, so that a forward through a wrapper such as `self.mnetwork` is
    covered).

Why
    Apex O1 patched torch functions globally from `initialize` on; native code says where
    reduced precision applies. Backward must run outside autocast, so the region ends before
    the `scale_loss` block. `loss_id` and `delay_unscale` have no native meaning: one scaler
    scales every loss, and gradients are unscaled once, at `scaler.step` or `unscale_`.

Soundness
    `scaler.scale(loss).backward()` produces the gradients Apex's `(loss.float() * S).backward()`
    did: the same power-of-two scale, multiplied in fp32. Each loss is scaled by its own loss
    id's scaler when the plan keeps them apart, and gradients stay scaled until `unscale_` or
    `step`, where Apex unscaled at the block's exit; the rules for `master_params` and `step`
    place those calls so that every read of gradients sees what Apex's code saw. Autocast
    covers the forward from the first use of an `initialize`d model to the loss, as Apex's O1
    patches did from `initialize` on, and ends before backward, which Apex never cast. Where the
    loss is a parameter of a module-level function whose every use in the file is a direct call
    passing a loss the caller computed right before it, the region goes around each caller's
    forward instead (plan/loss_callers.py; AMP205/AMP206 where a call or a use cannot be followed,
    and a tree moves the file to the shim where another module names the function). A loss
    computed elsewhere otherwise (no forward to wrap), several context managers in one `with`,
    `delay_overflow_check`, and optimizers given as anything but names or attributes (whose
    steps could not be found to become `scaler.step`, AMP221) fall back. `if cond: <scaled backward> else: loss.backward()`
    becomes one `scaler.scale(loss).backward()` only where `cond` is the switch the scaler was
    built with (plan/switch_flow.py: its `and`-ed parts are parts of `enabled=` read with the same
    value, the guard of another module's `initialize` reached through this module's one call
    of its builder, or import flags that are True once no Apex import is left), because a
    disabled scaler's `scale(loss)` is the loss itself. Branches that do more than the backward
    (clipping `amp.master_params` in one, the model's parameters in the other) stay apart, under
    the same proof: their plain backward must run only where the scaler is disabled (and
    `if not cond: loss.backward() else: <scaled>`, or `x == c` for `cond` `x != c`, needs the same of `cond`);
    where that is not provable the `else` branch could run under an enabled scaler, whose step
    would unscale gradients never scaled, and the file falls back (AMP220).

Fix safety
    Safe when the loss is computed in the function that calls `scale_loss`, or in each of its
    callers as above (the plan falls
    back otherwise). `delay_overflow_check` has no native equivalent and falls back. Unsafe
    (entry U1, AMP215/AMP216) where several blocks exit before one optimizer step: each block
    still becomes `scaler.scale(loss).backward()`, whose gradients are Apex's, but the scale
    they are multiplied by is updated once per step, where Apex updated it at every exit.

Example
    out = model(x)
    loss = crit(out, y)
    with amp.scale_loss(loss, opt) as scaled_loss:
        scaled_loss.backward()
becomes
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
        loss = crit(out, y)
    scaler.scale(loss).backward()
"""

from __future__ import annotations

from typing import Optional, Sequence, Union, cast

import libcst as cst
import libcst.matchers as m

from ..analysis.autocast_region import housekeeping_only, loss_block, region_start, wrap_spans
from ..analysis.binding import Pruned
from ..analysis.statements import find_statements
from ..diagnostics import Severity, define
from ..plan.loss_callers import (
    CALLED_OTHERWISE,
    CALLER_LOSS_UNPROVEN,
    CALLERS_CAST,
    CallerSite,
    Refused,
    autocast_reaches,
    caller_sites,
    calls_any,
    loss_parameter,
)
from ..plan.options import USER_AUTOCAST, autocast_aliases, own_autocast
from ..plan.switch_flow import SwitchProof, negation, squeezed
from ..plan.types import (
    ONE_SCALER,
    SCALE_LOSS,
    SCALE_LOSS_ARGS,
    WRAPPED_SCALE_LOSS,
    TrainingPlan,
    bind_arguments,
    expression_codes,
    literal,
)
from .base import TrainingRule
from .facts import Fact

UNSUPPORTED_BLOCK = define(
    "AMP201",
    "scale-loss-shape",
    Severity.WARNING,
    "This `scale_loss` use has no native rewrite (no `as` name, several context managers in "
    "one `with`, `delay_overflow_check`, or arguments given as `*args`/`**kwargs`).",
    "The native form binds the scaled loss to the `as` name, and `delay_overflow_check=True` "
    "(an undocumented switch, usually paired with manual `_amp_state` handling) has no "
    "GradScaler counterpart, so the file keeps Apex's semantics through the shim.",
    before="with amp.scale_loss(loss, opt, delay_overflow_check=True) as s:\n    s.backward()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="a scale_loss shape with no native equivalent",
    fallback_title="a `scale_loss` block with no native form",
    shape=(
        "`with amp.scale_loss(loss, optimizer):` with no `as` name, `with amp.scale_loss(loss, opt) as s, "
        "other():` (several context managers), `delay_overflow_check=True`, or the arguments given as "
        "`*args`/`**kwargs`."
    ),
    by_hand=(
        "Write it as `with amp.scale_loss(loss, optimizer) as scaled_loss: scaled_loss.backward()`, alone in "
        "its `with` and with plain arguments, then re-run; drop `delay_overflow_check` (`scaler.step` checks "
        "the gradients for inf/NaN itself)."
    ),
)
LOSS_NOT_HERE = define(
    "AMP202",
    "loss-computed-elsewhere",
    Severity.WARNING,
    "The loss passed to `scale_loss` is not computed in this function, so there is no "
    "forward pass to put under autocast.",
    "Apex O1 cast inside every torch function from `initialize` on. Native autocast must "
    "surround the forward pass, which happens somewhere this file does not show (the loss is "
    "a parameter or an attribute). The file uses the shim; move the forward and the "
    "`scale_loss` into one function to migrate it natively.",
    before="def backward(self, loss):\n    with amp.scale_loss(loss, self.opt) as s:\n        s.backward()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="the forward that made the loss is not in this function",
    fallback_title="the loss is computed outside the function that scales it",
    shape=(
        "A trainer plugin whose `backward(self, loss)` replaces the framework trainer's backward "
        "(`self.trainer.backward = self.backward`); a loss kept on an attribute. (A module-level helper "
        "`optimizer_step(loss, optimizer, ...)` whose callers in the file each pass a loss they computed "
        "right before the call is native: autocast goes around each caller's forward, AMP207; where that "
        "cannot be shown, AMP205, AMP206.)"
    ),
    fallback_why=(
        "Apex O1 patched torch functions globally from `initialize` on, so the forward ran in mixed "
        "precision wherever it was. Native autocast is a region: it must surround the forward, which is in "
        "another function (for a plugin, in the framework's trainer loop, which the plugin's hooks do not "
        "wrap). Putting only the `scale_loss` under autocast would train in fp32."
    ),
    by_hand=(
        "Wrap the forward where it runs (`with torch.autocast(...): loss = model(x)` in the caller) and "
        "replace the helper's `scale_loss` by `scaler.scale(loss).backward()`; for a framework plugin, use "
        "the framework's native AMP switch."
    ),
)
LOSS_ONLY_REGION = define(
    "AMP203",
    "autocast-covers-loss-only",
    Severity.INFO,
    "No use of an `initialize`d model precedes the loss here; autocast covers the statements "
    "the loss is computed from.",
    "The autocast region starts at the first statement that uses a model returned by "
    "`initialize`. None is visible in this block (the forward may run through a wrapper, "
    "`self.mnetwork = DataParallel(self.network)`, or a helper), so the region starts at the "
    "earliest statement whose assignments flow into the loss, by name: the forward that made "
    "the loss is among them. Apex cast every statement after `initialize`, so a wider region "
    "is closer to it, not further. Check that the forward is inside the `with` block.",
)

UNSCALED_BRANCH = define(
    "AMP220",
    "unscaled-backward-branch",
    Severity.WARNING,
    "`if cond: <scale_loss backward> else: loss.backward()` where `cond` is not the condition "
    "that enables the GradScaler.",
    "Where `cond` is the very condition the scaler is built with (`enabled=args.fp16`), the "
    "two branches collapse to `scaler.scale(loss).backward()`: a disabled scaler's `scale` is "
    "the loss itself. Otherwise the `else` branch may run while the GradScaler is enabled, and "
    "`scaler.step` would then unscale gradients that were never scaled (Apex applied them as "
    "they were), so the file uses the shim.",
    before="if args.fp16 and step >= warmup:\n    with amp.scale_loss(loss, opt) as s:\n"
    "        s.backward()\nelse:\n    loss.backward()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="an unscaled backward under another condition than the scaler's",
    variants=("while the GradScaler is enabled",),
    fallback_title="an unscaled backward under another condition than the scaler's",
    shape=(
        "`if self.use_amp: with amp.scale_loss(loss, opt) as s: s.backward()` / `else: loss.backward()` in a "
        "trainer (or branches that also clip, each its own parameters, or the plain backward first, `if C: "
        "loss.backward() else: <scaled>`, where `C` must be `not` the switch), while the `initialize` (and "
        "so the scaler's `enabled=`) is decided by another flag (`if args.apex: ...` in the optimizer "
        "factory), or by options the trainer's module may see changed (rebound after the builder's call, "
        "stored into, the builder also called from a module that loads the trainer); or an import flag that "
        "something other than its `try:` sets."
    ),
    fallback_why=(
        "The two branches collapse to `scaler.scale(loss).backward()` only where the `if` is provably the "
        "switch the scaler is built with (a disabled scaler's `scale` is the loss itself). Otherwise the "
        "`else` branch may run while the scaler is enabled: `scaler.step` would then unscale gradients that "
        "were never scaled, where Apex applied them as they were. Proven natively: each `and`-ed part of the "
        "test is a part of the scaler's `enabled=` read with the same value (in this function, passed down "
        "as a parameter, a `self.use_amp` set once from the switch in the method that builds the scaler, "
        "before `initialize`, or, for a scaler another module builds, the `if` test around that module's "
        "`initialize` in a function this module calls once with the same options, project/share.py), or a "
        "flag that one module-level `try:` sets True beside Apex's imports and nothing else stores (`apex = "
        "True`: no Apex import is left to fail)."
    ),
    by_hand="Build the scaler with `enabled=<the same flag>` the trainer tests, then re-run.",
)

INSTANCE_FLAG = define(
    "AMP222",
    "instance-flag-not-the-owners-switch",
    Severity.WARNING,
    "`if self.use_amp: <scale_loss backward> else: loss.backward()` in a class of one module, "
    "with the GradScaler built by `initialize` in another: nothing here proves that "
    "`self.use_amp` is false only where that scaler is disabled.",
    "A Trainer module often keeps a switch of its own (`self.use_amp = use_amp` in `__init__`) "
    "and scales the loss under it, while an optimizer factory in another module calls "
    "`initialize` under its own parameter of the same name. Both receive their value from the "
    "code that builds the optimizer and constructs the Trainer, often outside the package. "
    "Natively the Trainer's steps go through the factory's GradScaler; where `self.use_amp` is "
    "false while that scaler is enabled, the plain backward's gradients would be unscaled by "
    "`scaler.step` although they were never scaled. The proof would need that caller: one "
    "call of the factory and one construction of the class, in one function, passing the same "
    "unchanged value to both (and no other construction or factory call in the process). "
    "amp-migrate does not follow calls across modules for this, so the group uses the shim; "
    "the message names the store that sets the flag. To migrate natively, give the Trainer "
    "no switch of its own: scale unconditionally (the shared scaler is disabled where amp is "
    "off).",
    before="# trainer.py\nif self.use_amp:\n    with amp.scale_loss(loss, self.optimizer) as s:\n"
    "        s.backward()\nelse:\n    loss.backward()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="a class's own amp switch not tied to another module's scaler",
    fallback_title="a Trainer's own amp switch beside another module's scaler",
    shape=(
        "A Trainer module keeps the switch it was constructed with (`self.use_amp = use_amp` in `__init__`) "
        "and tests it around the scaled backward (`if self.use_amp: <scale_loss> else: loss.backward()`, and "
        "the same around clipping `amp.master_params`), while an optimizer factory in another module calls "
        "`initialize` under its own parameter of the same name (`if use_amp and optimizer: if AMP_AVAILABLE: "
        "...`). The code that passes one value to both (`initialize_optimizer(..., use_amp=x)`, "
        "`Trainer(..., use_amp=x)`) is the user's own script, outside the package."
    ),
    fallback_why=(
        "Natively the Trainer's steps go through the factory's GradScaler. Where `self.use_amp` is false "
        "while that scaler is enabled, the plain `loss.backward()` leaves unscaled gradients that "
        "`scaler.step` would divide by the scale (Apex applied them as they were). The two switches agree "
        "only through their caller. What a careful person needs to see before collapsing the branches: that "
        "caller in the tree, one function calling the factory once and constructing the class once, passing "
        "the same unchanged value to both; no other construction of the class and no other call of the "
        "factory in a process that loads it; no store into the Trainer's attribute after `__init__` (and no "
        "subclass that passes another value to `super().__init__`). amp-migrate does not follow that value "
        "across modules and through a constructor, so the group uses the shim; the message names the store "
        "that sets the attribute (`set at line 204, from __init__'s parameter use_amp`)."
    ),
    by_hand=(
        "Drop the Trainer's own switch around the scaled backward: scale unconditionally "
        "(`scaler.scale(loss).backward()`; a disabled scaler's `scale` is the loss itself) with the "
        "factory's scaler, and clip after `scaler.unscale_(optimizer)`."
    ),
)

UNFOLLOWED_OPTIMIZER = define(
    "AMP221",
    "scaled-optimizer-not-followed",
    Severity.WARNING,
    "The optimizers given to `scale_loss` are not a name, an attribute or a list of them "
    "(`optimizers[idx]`, a call), so the steps that must become `scaler.step` cannot be found.",
    "Natively every step of an optimizer whose gradients were scaled must go through "
    "`scaler.step` (which unscales them and skips a step with inf/NaN gradients) and be "
    "followed by `scaler.update()`. The rewrite finds those steps by the expression that names "
    "the optimizer; `optimizers[idx].step()` may or may not be the optimizer `scale_loss` got "
    "(another index, another list), and a step left as it is would apply gradients still "
    "multiplied by the scale. Bind the optimizer to a name first "
    "(`optimizer = optimizers[idx]`), then run amp-migrate again.",
    before="with amp.scale_loss(loss, optimizers[idx]) as s:\n    s.backward()\noptimizers[idx].step()",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="the optimizer whose steps must become scaler.step cannot be told apart",
    fallback_title="the optimizers given to `scale_loss` cannot be followed",
    shape=(
        "`with amp.scale_loss(loss, optimizers[idx]) as s: s.backward()` and `optimizers[idx].step()` (an "
        "item of a list, a call's result)."
    ),
    by_hand=(
        "Bind the optimizer to a name once per iteration (`optimizer = optimizers[idx]`) and use that name "
        "in `scale_loss` and for the step, then re-run."
    ),
)


def _only(suite: cst.BaseSuite) -> Optional[cst.BaseStatement]:
    return suite.body[0] if isinstance(suite, cst.IndentedBlock) and len(suite.body) == 1 else None


def _lone_call(line: cst.CSTNode) -> cst.Call:
    """The call of a line matched as `SimpleStatementLine(body=[Expr(Call(...))])`."""
    return cast(cst.Call, cast(cst.Expr, cast(cst.SimpleStatementLine, line).body[0]).value)


def _method_owner(call: cst.BaseExpression) -> cst.BaseExpression:
    """`x` of a call matched as `Call(func=Attribute(...))`, `x.method(...)`."""
    return cast(cst.Attribute, cast(cst.Call, call).func).value


def _same_backward(scaled: cst.BaseStatement, plain: cst.BaseStatement) -> bool:
    """`scaler.scale(L).backward(A)` and `L.backward(A)`, each alone on its line."""
    pattern = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(attr=m.Name("backward"))))])
    if not (m.matches(scaled, pattern) and m.matches(plain, pattern)):
        return False
    ours, theirs = _lone_call(scaled), _lone_call(plain)
    inner = _method_owner(ours)
    if not (
        isinstance(inner, cst.Call)
        and m.matches(inner, m.Call(func=m.Attribute(attr=m.Name("scale")), args=[m.Arg(keyword=None)]))
    ):
        return False
    code = cst.Module([]).code_for_node
    return squeezed(code(inner.args[0].value)) == squeezed(code(_method_owner(theirs))) and [
        squeezed(code(a)) for a in ours.args
    ] == [squeezed(code(a)) for a in theirs.args]


def _names(node: cst.CSTNode) -> set[str]:
    """Names and dotted attributes an expression reads (`loss`, `self.loss`)."""
    found: set[str] = set()
    code = cst.Module([]).code_for_node

    class Collect(Pruned):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

        def visit_Attribute(self, attr: cst.Attribute) -> None:
            found.add(code(attr))

    Collect().walk(node)
    return found


def _assigned(stmt: cst.CSTNode) -> set[str]:
    """Names a statement assigns anywhere inside it (not in nested functions or classes)."""
    out: set[str] = set()
    code = cst.Module([]).code_for_node

    class Collect(Pruned):
        def visit_FunctionDef(self, node) -> bool:
            return False

        def visit_ClassDef(self, node) -> bool:
            return False

        def _targets(self, target: cst.CSTNode) -> None:
            if isinstance(target, (cst.Tuple, cst.List)):
                for el in target.elements:
                    self._targets(el.value)
            elif isinstance(target, cst.StarredElement):
                self._targets(target.value)
            else:
                out.add(code(target))

        def visit_AssignTarget(self, node) -> None:
            self._targets(node.target)

        def visit_AugAssign(self, node) -> None:
            self._targets(node.target)

        def visit_AnnAssign(self, node) -> None:
            if node.value is not None:
                self._targets(node.target)

        def visit_NamedExpr(self, node) -> None:
            self._targets(node.target)

        def visit_For(self, node) -> None:
            self._targets(node.target)

        def visit_WithItem(self, node) -> None:
            if node.asname is not None:
                self._targets(node.asname.name)

    Collect().walk(stmt)
    return out


def _feeding(body: Sequence[cst.CSTNode], start: int, last: int) -> int:
    """The earliest statement of `body[start:last + 1]` whose assignments flow into what
    `body[last]` reads (a backward slice by names): where no model use is visible, the forward
    that made the loss is among those statements, and Apex cast all of them."""
    needed, first = _names(body[last]), last
    for i in range(last - 1, start - 1, -1):
        if _assigned(body[i]) & needed:
            needed |= _names(body[i])
            first = i
    return first


def _single_backward(stmt: cst.CSTNode, alias: str) -> Optional[cst.Call]:
    """`alias.backward(...)` alone on its line, not otherwise reading `alias`."""
    pattern = m.SimpleStatementLine(
        body=[m.Expr(m.Call(func=m.Attribute(value=m.Name(alias), attr=m.Name("backward"))))]
    )
    if not m.matches(stmt, pattern):
        return None
    call = _lone_call(stmt)
    if any(alias in _names(a.value) for a in call.args):
        return None
    return call


def _uses(stmt: cst.CSTNode, codes: set[str]) -> bool:
    """Does the statement run a model (anything but housekeeping calls on it)?"""
    if not codes:
        return False
    if housekeeping_only(stmt, codes):
        return False
    return bool(_names(stmt) & codes)


class ScaleLossToGradScaler(TrainingRule):
    HANDLES = SCALE_LOSS
    EMITS = (
        UNSUPPORTED_BLOCK,
        LOSS_NOT_HERE,
        LOSS_ONLY_REGION,
        UNSCALED_BRANCH,
        INSTANCE_FLAG,
        UNFOLLOWED_OPTIMIZER,
        ONE_SCALER,
        USER_AUTOCAST,
        CALLER_LOSS_UNPROVEN,
        CALLED_OTHERWISE,
        CALLERS_CAST,
    )
    READS = frozenset(
        {Fact.APEX_ANALYSED, Fact.MODULE_VALUE_REWRITTEN, Fact.SCALER_STATE_REWRITTEN, Fact.TRAINING}
    )
    WRITES = frozenset(
        {Fact.AMP_PLAN_CARRIED, Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.SCALER_CALLS_WRITTEN}
    )

    MARKERS = ()

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.withs: set[int] = set()  # original With nodes to rewrite
        self.regions: dict[int, list[tuple[int, int]]] = {}  # original block -> [(first, last)]
        self._autocast_aliases: Optional[frozenset[str]] = None  # `autocast as ac` imports
        #: Functions whose `scale_loss` scales a loss parameter (plan/loss_callers.py), and for each
        #: such `with` (by id) its callers' sites with whether a model use starts the region, or
        #: why they cannot all be followed.
        self._helpers: frozenset[str] = frozenset()
        self._delegated: dict[int, Union[Refused, list[tuple[CallerSite, bool]]]] = {}

    def _plan(self) -> TrainingPlan:
        """The plan, which the rule has wherever it acts (`TrainingRule.applies`)."""
        assert self.plan is not None, "asked in a file without a plan"
        return self.plan

    APEX_ON_THE_LINE = True

    def interest(self):
        words = self.words_for(*SCALE_LOSS)
        if self.plan is not None and words is not None:
            self._plan_callers(self.context.wrapper.module, words)
        return words if not self._helpers else words | self._helpers

    def also_spells(self):
        words = super().also_spells()
        return words if words is None or not self._helpers else frozenset(words) | self._helpers

    # -- a loss given as a parameter: the forwards are in the callers ----------------------------
    def _plan_callers(self, module: cst.Module, words) -> None:
        """Before the walk (a caller may come before the function it calls): each `scale_loss`
        whose loss is a parameter of its function gets the autocast regions of its callers, or
        the reason one cannot be followed (plan/loss_callers.py)."""
        pending = []
        for found_with in self.findall(module, m.With(), words):
            node = cast(cst.With, found_with)  # what m.With() found
            call = self._scale_loss_call(node)
            args = bind_arguments(call, SCALE_LOSS_ARGS) if call is not None else None
            found = loss_parameter(self, node, args["loss"], _assigned) if args and "loss" in args else None
            if found is not None:
                pending.append((node, *found))
        self._helpers = frozenset(function.name.value for _, function, _, _ in pending)
        for node, function, parameter, index in pending:
            sites = caller_sites(self, module, function, parameter, index)
            self._delegated[id(node)] = sites if isinstance(sites, Refused) else self._caller_regions(sites)

    def _caller_regions(self, sites):
        """The autocast region of each caller (recorded), or why one has none."""
        regions = []
        for site in sites:
            region = self._region(site.statement, _names(site.loss))
            if region is None:
                return Refused(
                    site.loss,
                    CALLER_LOSS_UNPROVEN,
                    "`{}` is not computed before the call in the caller".format(self.code_of(site.loss)),
                )
            why = autocast_reaches(self, self.plan, site)
            if why is not None:
                return Refused(site.call, CALLER_LOSS_UNPROVEN, why)
            block, first, last, saw_model = region
            if self._autocast_aliases is None:
                self._autocast_aliases = autocast_aliases(self.context.wrapper.module)
            inner = own_autocast(list(block.body)[first : last + 1], self._autocast_aliases)
            if inner is not None:
                return Refused(inner, USER_AUTOCAST, None)
            regions.append((site, block, first, last, saw_model))
        for _, block, first, last, _ in regions:
            self.regions.setdefault(id(block), []).append((first, last))
        return [(site, saw_model) for site, _, _, _, saw_model in regions]

    def _delegate(self, node: cst.With) -> bool:
        """Report what the callers' regions of this `with` came to; True where they are made."""
        found = self._delegated.get(id(node))
        if found is None:
            self.report(node, LOSS_NOT_HERE)
            return False
        if isinstance(found, Refused):
            self.report(found.node, found.code, found.reason)
            return False
        function = next(p for p in self.ancestors(node) if isinstance(p, cst.FunctionDef))
        lines = ", ".join(str(self.position(site.call)[0]) for site, _ in found)
        self.report(
            function,
            CALLERS_CAST,
            f"`{function.name.value}` scales its loss parameter; autocast "
            f"covers the forward before its call at line{'s' if len(found) > 1 else ''} {lines}",
        )
        for site, saw_model in found:
            if not saw_model:
                self.report(site.call, LOSS_ONLY_REGION)
        return True

    # -- finding ----------------------------------------------------------------------------------
    def _scale_loss_call(self, node: cst.With) -> Optional[cst.Call]:
        for item in node.items:
            if isinstance(item.item, cst.Call) and self.apex_name(item.item.func) in SCALE_LOSS:
                return item.item
        return None

    def visit_With(self, node: cst.With) -> None:
        if self.plan is None:
            return
        call = self._scale_loss_call(node)
        if call is None:
            return
        args = bind_arguments(call, SCALE_LOSS_ARGS)
        if (
            args is None
            or "loss" not in args
            or len(node.items) != 1
            or node.items[0].asname is None
            or not isinstance(node.items[0].asname.name, cst.Name)
            or node.asynchronous
        ):
            self.report(node, UNSUPPORTED_BLOCK)
            return
        if literal(args.get("delay_overflow_check")) not in (None, False):
            self.report(
                args["delay_overflow_check"],
                UNSUPPORTED_BLOCK,
                "`delay_overflow_check` has no GradScaler equivalent",
            )
            return
        if self.apex_name(call.func) != WRAPPED_SCALE_LOSS and not expression_codes(args.get("optimizers")):
            given = args.get("optimizers")
            self.report(
                given if given is not None else call,
                UNFOLLOWED_OPTIMIZER,
                "`{}` is not a name or attribute whose steps can be found".format(
                    self.code_of(given) if given is not None else "(no optimizers)"
                ),
            )
            return
        if "loss_id" in args and literal(args["loss_id"]) != 0 and not self.plan.loss_scalers:
            self.report(args["loss_id"], ONE_SCALER)
        region = self._region(node, _names(args["loss"]))
        if region is None:
            if self._delegate(node):
                self.withs.add(id(node))
            return
        block, first, last, saw_model = region
        if self._autocast_aliases is None:
            # The walk starts at the module.
            self._autocast_aliases = (
                autocast_aliases(cast(cst.Module, self._path[0])) if self._path else frozenset()
            )
        inner = own_autocast(list(block.body)[first : last + 1], self._autocast_aliases)
        if inner is not None:
            self.report(inner, USER_AUTOCAST)
            return
        if not saw_model:
            self.report(node, LOSS_ONLY_REGION)
        self.withs.add(id(node))
        spans = self.regions.setdefault(id(block), [])
        spans.append((first, last))

    def _region(self, node: cst.With, loss_names: set[str]):
        """(block, first, last, saw_model): the statements of `block` to put under autocast."""
        found = loss_block(node, loss_names, _assigned, self.parent, self.statement_around)
        if found is None:
            return None
        block, body, last = found
        # From the last backward before the loss was computed: a loss computed before an
        # earlier scale_loss shares its forward (both forwards ran under Apex's casts).
        start = region_start(
            body,
            last,
            lambda s: (
                any(self._scale_loss_call(w) is not None for w in find_statements(s, cst.With))
                or calls_any(s, self._helpers)
            ),
        )
        plan = self._plan()
        if plan.global_casts:  # amp.init(): everything since the last backward
            return block, start, last, True
        first = next((i for i in range(start, last + 1) if _uses(body[i], plan.models)), None)
        if first is None:  # no model use seen: from the earliest statement the loss comes from
            return block, _feeding(body, start, last), last, False
        return block, first, last, True

    # -- rewriting --------------------------------------------------------------------------------
    def _replacement(self, updated: cst.With) -> list[cst.BaseStatement]:
        # visit_With took this `with` (in `withs`) for one `scale_loss(...) as <name>`.
        call = cast(cst.Call, updated.items[0].item)
        args = bind_arguments(call, SCALE_LOSS_ARGS)
        asname = updated.items[0].asname
        assert args is not None and asname is not None and isinstance(asname.name, cst.Name)
        loss = args["loss"]
        loss_id = literal(args["loss_id"]) if "loss_id" in args else 0
        plan = self._plan()
        scaler = plan.scaler_for_loss(loss_id) if isinstance(loss_id, int) else plan.scaler
        scaled = cst.Call(cst.parse_expression(f"{scaler}.scale"), [cst.Arg(loss)])
        alias = asname.name.value
        body = updated.body
        statements: list[cst.BaseStatement]
        if isinstance(body, cst.IndentedBlock):
            statements = list(body.body)
            header = body.header
        else:
            suite = cast(cst.SimpleStatementSuite, body)  # the other kind of suite
            line = cst.SimpleStatementLine(list(suite.body))
            statements = [
                line.with_changes(
                    body=[
                        s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == len(suite.body) - 1 else s
                        for i, s in enumerate(suite.body)
                    ]
                )
            ]
            header = suite.trailing_whitespace
        single = _single_backward(statements[0], alias) if len(statements) == 1 else None
        out: list[cst.BaseStatement]
        if single is not None:
            line = cast(cst.SimpleStatementLine, statements[0])  # as `_single_backward` matched it
            new_call = single.with_changes(func=cst.Attribute(scaled, cst.Name("backward")))
            out = [line.with_changes(body=[line.body[0].with_changes(value=new_call)])]
        else:
            out = [
                cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(alias))], scaled)])
            ] + statements
        out[0] = out[0].with_changes(leading_lines=updated.leading_lines)
        if (
            header.comment is not None
            and isinstance(out[0], cst.SimpleStatementLine)
            and out[0].trailing_whitespace.comment is None
        ):
            out[0] = out[0].with_changes(trailing_whitespace=header)
        return out

    def _rebuild(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement], block_id: int
    ) -> list[cst.BaseStatement]:
        def outside(i: int) -> Sequence[cst.BaseStatement]:
            if id(original[i]) in self.withs:
                return self._replacement(cast(cst.With, updated[i]))  # a `with` it took
            return [updated[i]]

        return wrap_spans(
            len(updated),
            self.regions.get(block_id, []),
            lambda i: self._plan().at(self.position(original[i])[0]).autocast_call,
            lambda k: [updated[k]],
            outside,
        )

    # -- `if fp16: <scaled backward> else: loss.backward()` -------------------------------------
    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if not self.withs or not isinstance(original_node.orelse, cst.Else):
            return updated_node
        if self._unscaled_else(original_node, inverted=True):  # `if not fp16: loss.backward() else: <scaled>`
            test = original_node.test
            switch = negation(test)
            if switch is None or not SwitchProof(
                self, self._plan().at(self.position(original_node)[0])
            ).holds(original_node, switch):
                self.report(
                    original_node,
                    UNSCALED_BRANCH,
                    "`{}` may be true while the GradScaler is enabled".format(self.code_of(test)),
                )
            return updated_node
        scaled = _only(updated_node.body)
        plain = _only(original_node.orelse.body)
        with_ = _only(original_node.body)
        collapses = (
            scaled is not None
            and plain is not None
            and with_ is not None
            and id(with_) in self.withs
            and _same_backward(scaled, plain)
        )
        if not collapses and not self._unscaled_else(original_node):
            return updated_node
        proof = SwitchProof(self, self._plan().at(self.position(original_node)[0]))
        if not proof.holds(original_node):
            why = proof.instance_flag(original_node.test)
            if why is not None:
                self.report(original_node, INSTANCE_FLAG, why)
            else:
                self.report(
                    original_node,
                    UNSCALED_BRANCH,
                    "`{}` may be false while the GradScaler is enabled".format(
                        self.code_of(original_node.test)
                    ),
                )
            return updated_node
        if collapses and scaled is not None:  # (it collapses only where there is one)
            return scaled.with_changes(leading_lines=updated_node.leading_lines)
        return updated_node

    def _unscaled_else(self, node: cst.If, inverted: bool = False) -> bool:
        """`if cond: <scale_loss block>, ... else: loss.backward(), ...`: the `else` runs an
        unscaled backward whose gradients the scaler's step would unscale unless it is disabled
        there, so `cond` must be its switch even where the branches stay apart (clipping
        `amp.master_params` in one, the model's parameters in the other). `inverted`: the plain
        backward in the `if`, the scaled one in the `else`."""
        body, orelse = node.body, cast(cst.Else, node.orelse).body  # asked only with an `else`
        if not isinstance(body, cst.IndentedBlock) or not isinstance(orelse, cst.IndentedBlock):
            return False
        if inverted:
            body, orelse = orelse, body
        backward = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(attr=m.Name("backward"))))])
        return any(id(s) in self.withs for s in body.body) and any(
            m.matches(s, backward) for s in orelse.body
        )

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        if not self.withs and not self.regions:
            return updated_node
        if len(original_node.body) != len(updated_node.body):
            return updated_node
        return updated_node.with_changes(
            body=self._rebuild(original_node.body, updated_node.body, id(original_node))
        )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if (not self.withs and not self.regions) or len(original_node.body) != len(updated_node.body):
            return updated_node
        return updated_node.with_changes(
            body=self._rebuild(original_node.body, updated_node.body, id(original_node))
        )
