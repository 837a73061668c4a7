"""Plans for `initialize` calls that each govern one block: one per fold, per branch, per function.

Apex rebuilt its loss scalers at every `initialize` call (the old scale was lost), and every
`scale_loss`, step and `amp.state_dict()` used the newest ones. A native GradScaler built where
each `initialize` ran is the same object wherever a site is provably tied to one call: the site
sits in the block that holds that `initialize` (or the `if` guarding it), after it, in the same
function, and no other `initialize` can run in between (the blocks are disjoint and the
functions holding them do not call each other). A k-fold loop with a fresh `initialize` per
fold, one `initialize` per branch of an `if`/`else`, and one per training function are such
blocks. A loop that only runs `initialize` on each element (plain assignments beside it) is
one unit as a whole: the state it leaves is the last call's, fresh, so sites after the loop are
tied to it as to one `initialize` where the loop stands. Sites in functions called from such a block (`train_one_epoch(model, optimizer)` in
the fold loop) get the block's scaler as a parameter (plan/threaded.py), passed only by calls
in a block after its `initialize`. Anything else keeps AMP101/AMP102 with the reason. This module holds no rule: it is a
part of PlanTraining (rules/training_plan.py), which mixes it in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Union

import libcst as cst
import libcst.matchers as m

from ..analysis.statements import is_elif
from .inference import InferencePlanning
from .methods import MethodTies, branch_arms
from .threaded import find_threading
from .types import InferenceRegion, PlanPart, TrainingPlan


class Unit:
    """The block one `initialize` governs, and from which line on."""

    def __init__(
        self,
        call: cst.Call,
        statement: cst.CSTNode,
        block: cst.CSTNode,
        anchor: cst.CSTNode,
        after: int,
        span: tuple[int, int],
    ) -> None:
        self.call, self.statement, self.block, self.anchor = call, statement, block, anchor
        self.after, self.span = after, span
        self.sites: list[cst.CSTNode] = []
        #: The `if` of an `if`/`else` with one `initialize` per arm (exactly one runs): the code
        #: after it, in `pair_block` from line `pair_after` on, runs after this unit's or a sibling's.
        self.pair: Optional[cst.If] = None
        self.pair_block: Optional[cst.CSTNode] = None
        self.pair_after = 0
        self.methods: list[cst.FunctionDef] = []  # other methods of its class tied to it (plan/methods.py)


#: How one `initialize` is planned: (call, its statement, the module, its unit, the functions the
#: scaler is handed to) -> the plan, or None where refused (reported).
PlanOne = Callable[[cst.Call, cst.CSTNode, cst.Module, Optional[Unit], tuple], Optional[TrainingPlan]]


class UnitPlanning(MethodTies, InferencePlanning):
    """PlanTraining's planning for `initialize` calls that each govern one block."""

    def _initializing_loop(self, statement: cst.CSTNode) -> Optional[cst.For]:
        """The `for` whose body only runs this `initialize` on one element each (plain
        assignments beside it, no other Apex call): Apex's state after the loop is the last
        call's, fresh, as if one `initialize` had run where the loop stands."""
        block = self.parent(statement)
        loop = self.parent(block) if block is not None else None
        if (
            not isinstance(loop, cst.For)
            or loop.body is not block
            or loop.orelse is not None
            or loop.asynchronous
        ):
            return None
        if sum(1 for _, s in self.inits if any(p is loop for p in self.ancestors(s))) != 1:
            return None
        simple = m.SimpleStatementLine(body=[m.OneOf(m.Assign(), m.Expr())])
        if not all(m.matches(s, simple) for s in block.body) or any(
            any(p is loop for p in self.ancestors(site)) for site in self.sites
        ):
            return None
        return loop

    def _unit_of(self, call: cst.Call, statement: cst.CSTNode) -> Unit:
        statement = self._initializing_loop(statement) or statement
        block, anchor = self.parent(statement), statement
        assert block is not None  # a statement of the file stands in a block
        owner = self.parent(block)
        if (
            isinstance(owner, cst.If)
            and owner.body is block
            and owner.orelse is None
            and not is_elif(owner, self.parent)
        ):
            block, anchor = self.parent(owner), owner
        assert isinstance(block, (cst.BaseSuite, cst.Module))
        body = list(block.body)
        first = self.position(anchor)[0] if isinstance(block, cst.Module) else self.position(body[0])[0]
        unit = Unit(
            call,
            statement,
            block,
            anchor,
            self._lines_of(statement)[-1],
            (first, self._lines_of(body[-1])[-1]),
        )
        arms = branch_arms(self, anchor)
        if arms is not None and all(
            sum(1 for c, s in self.inits if any(p is arm for p in self.ancestors(s))) == 1 for arm in arms[1]
        ):
            unit.pair, unit.pair_block, unit.pair_after = (
                arms[0],
                self.parent(arms[0]),
                self._lines_of(arms[0])[-1],
            )
        return unit

    def _plan_in_units(self, module: cst.Module, plan_one: PlanOne) -> Union[TrainingPlan, str]:
        """A plan part per `initialize`, each made by `plan_one`; or why sites are not tied to one."""
        units = [self._unit_of(call, statement) for call, statement in self.inits]
        outside: list[cst.CSTNode] = []
        why = (
            self._disjoint(units)
            or self._assign(units, self.sites, outside)
            or self._tie_methods(units, outside)
            or self._isolated(units)
        )
        if why:
            return why
        threaded = self._thread_from_units(module, units, outside) if outside else []
        if isinstance(threaded, str):
            return threaded
        plans, regions, trained = [], [], []
        self.forced_placement = "self" if any(u.methods for u in units) else None
        for unit in units:
            if not unit.sites and self._inference_shaped(unit.call):
                region = self._inference_region(unit.call, unit.statement)
                if not isinstance(region, InferenceRegion):  # refused (reported): ""
                    return ""
                regions.append(region)
                continue
            plan = self._plan_unit(unit, module, outside, threaded, plan_one)
            if plan is None:
                return ""
            if isinstance(plan, str):
                return plan
            plans.append(plan)
            trained.append(unit)
        self.forced_placement = None
        steps = {line for plan in plans for line in plan.step_lines}
        every = self._step_sites(module, set().union(*(p.optimizers for p in plans)), units[0].statement)
        stray = [c for c in every if self.position(c)[0] not in steps]
        if stray:
            return f"the step at line {self.position(stray[0])[0]} is tied to no `initialize`"
        if not plans or not self._regions_apart(regions, [self.position(site)[0] for site in self.sites]):
            return "" if plans else "no `scale_loss` goes with any `initialize`"
        tied = self._tied_parts(trained, plans)
        if isinstance(tied, str):
            return tied
        if len(plans) == 1 and not tied:
            return replace(plans[0], inference=tuple(regions))
        return replace(
            plans[0],
            inference=tuple(regions),
            models=set().union(*(p.models for p in plans)),
            optimizers=set().union(*(p.optimizers for p in plans)),
            step_lines=frozenset(steps),
            eager_unscale_lines=frozenset().union(*(p.eager_unscale_lines for p in plans)),
            threaded=tuple(threaded),
            parts=tuple(
                PlanPart(
                    u.span[0], u.span[1], p.scaler_call, p.autocast_call, p.hoisted, p.init_scope, p.init_line
                )
                for u, p in zip(trained, plans)
            )
            + tuple(tied),
        )

    def _disjoint(self, units: list[Unit]) -> str:
        for unit in units:
            for other in units:
                if other is unit:
                    continue
                if other.block is unit.block:
                    return (
                        f"the `initialize` calls at lines {self.position(unit.call)[0]} and "
                        f"{self.position(other.call)[0]} share one block, so one's scaler "
                        "would replace the other's"
                    )
                if any(p is unit.block for p in self.ancestors(other.anchor)):
                    return (
                        f"the `initialize` at line {self.position(other.call)[0]} runs inside the "
                        f"block of the one at line {self.position(unit.call)[0]}"
                    )
                why = self._calls_into(unit, other)
                if why:
                    return why
        return ""

    def _calls_into(self, unit: Unit, other: Unit) -> str:
        """A function holding one unit must not call the one holding another."""
        here, there = self.scope_of(unit.statement), self.scope_of(other.statement)
        if there is None or here is there:
            return ""
        name = there.name.value
        if self.findall(here if here is not None else self._module(), m.Name(name), {name}):
            return (
                f"`{here.name.value if here is not None else 'the module'}` calls `{name}`, "
                "which calls `initialize` again"
            )
        return ""

    def _assign(self, units: list[Unit], sites: list[cst.CSTNode], outside: list[cst.CSTNode]) -> str:
        """Each site to the unit whose block holds it; sites in other functions to `outside`."""
        functions = {id(self.scope_of(u.statement)) for u in units}
        for site in sites:
            holder = self._holder(units, site)
            if holder is not None:
                for unit in units:
                    if (
                        unit is holder
                        or unit.pair is not None
                        and unit.pair is holder.pair
                        and self._holder([unit], site) is unit
                    ):
                        unit.sites.append(site)
            elif id(self.scope_of(site)) in functions or self.scope_of(site) is None:
                return f"the Apex call at line {self.position(site)[0]} is tied to no single `initialize`"
            else:
                outside.append(site)
        return ""

    def _thread_from_units(self, module: cst.Module, units: list[Unit], outside: list[cst.CSTNode]):
        """The functions holding `outside` sites get the scaler as a parameter from calls in
        the block of one `initialize`, after it; or why they cannot."""

        def entry(call: cst.CSTNode, caller) -> Union[bool, str]:
            if self._holder(units, call) is not None:
                return True
            if any(caller is self.scope_of(u.statement) for u in units):
                return "outside the block of its `initialize`"
            return False

        return find_threading(self, module, None, 0, outside, entry)

    def _unit_steps(self, unit: Unit, steps: list[cst.Call], threaded) -> list[cst.Call]:
        """The steps one unit's scaler serves: in its block, in a function it passes the
        scaler to, or in a method tied to it."""
        passed = {t.line for t in threaded}
        return [
            c
            for c in steps
            if self._holder([unit], c) is unit
            or ((scope := self.scope_of(c)) is not None and self.position(scope)[0] in passed)
            or any(self.scope_of(c) is f for f in unit.methods)
        ]

    def _plan_unit(
        self, unit: Unit, module: cst.Module, outside: list[cst.CSTNode], threaded: list, plan_one: PlanOne
    ) -> Union[TrainingPlan, str, None]:
        """The plan for one unit: its own sites (and those of the functions it passes the
        scaler to), a scaler built where it ran."""
        every = (self.sites, self.scale_losses)
        self.sites = unit.sites + outside
        self.scale_losses = [s for s in every[1] if any(s is u for u in self.sites)]
        try:
            if not self.scale_losses:
                return f"no `scale_loss` goes with the `initialize` at line {self.position(unit.call)[0]}"
            return plan_one(unit.call, unit.statement, module, unit, tuple(threaded))
        finally:
            self.sites, self.scale_losses = every
