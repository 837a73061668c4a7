"""Which `initialize` a site in a method of a trainer class runs after, from the class's calls.

A trainer class may call `amp.initialize` in more than one method (`fit()` and an `lr_find()`
that initializes again) and scale the loss in a helper method only one of them calls
(`self._train_batch()`), or call it in both arms of an `if`/`else` (`if self.test_only: ...
else: ...`) and save `amp.state_dict()` in a checkpoint method. Apex used the scalers of the
newest `initialize`. A site is tied to one `initialize` here when every chain of
`self.<method>(...)` calls that reaches it starts in that call's block after it, and no
method on the way can call (by any name it mentions) a function holding another
`initialize`; a method nothing in the class calls (a checkpoint hook the framework calls) is
tied to the only `initialize` there is (one call, or one per arm of one `if`/`else`, of which
exactly one runs). Each such `initialize` then sets `self.<scaler>`, which the tied methods
read. This module holds no rule: PlanTraining mixes it in through plan/units.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
import libcst.matchers as m

from ..analysis.statements import find_statements
from .sites import TrainingSites
from .types import PlanPart, TrainingPlan

if TYPE_CHECKING:
    from .units import Unit

#: A site reached from a method nothing in the class calls: any `initialize` may have run last.
ANYONE = "anyone"


def branch_arms(rule, anchor: cst.CSTNode) -> Optional[tuple[cst.If, list[cst.BaseSuite]]]:
    """The top `if` and its arms when `anchor` is a statement directly in one arm of an
    `if`/`elif`/`else` chain that ends in `else` (exactly one arm runs); else None."""
    block = rule.parent(anchor)
    owner = rule.parent(block) if block is not None else None
    if not isinstance(owner, (cst.If, cst.Else)):
        return None
    top = owner if isinstance(owner, cst.If) else rule.parent(owner)
    while isinstance(top, cst.If) and isinstance(rule.parent(top), cst.If) and rule.parent(top).orelse is top:
        top = rule.parent(top)
    if not isinstance(top, cst.If):
        return None
    arms: list[cst.BaseSuite] = []
    node: Union[cst.If, cst.Else, None] = top
    while isinstance(node, cst.If):
        arms.append(node.body)
        node = node.orelse
    if node is None:
        return None
    arms.append(node.body)
    return top, arms


class MethodTies(TrainingSites):
    """PlanTraining's reading of `self.<method>(...)` calls inside one trainer class."""

    def _module(self) -> cst.Module:
        """The module being planned."""
        return self.current_module()

    def _holder(self, units: list[Unit], node: cst.CSTNode) -> Optional[Unit]:
        """The unit whose block holds `node` after its `initialize` (None: no unit's)."""
        line = self.position(node)[0]
        scope = self.scope_of(node)
        for unit in units:
            if scope is not self.scope_of(unit.statement):
                continue
            if line > unit.after and any(p is unit.block for p in self.ancestors(node)):
                return unit
            if (
                unit.pair is not None
                and line > unit.pair_after
                and any(p is unit.pair_block for p in self.ancestors(node))
            ):
                return unit
        return None

    def _tie_methods(self, units: list[Unit], outside: list[cst.CSTNode]) -> str:
        """Move the sites in methods of the units' class from `outside` to the unit their
        calls tie them to (recording the methods on it); or why one is tied to no single one."""
        owner = self._units_class(units)
        if owner is None:
            return ""
        ties: dict[int, Union[str, list[Unit]]] = {}
        kept = []
        for site in outside:
            method = self.scope_of(site)
            if method is None or self.class_of(method) is not owner:
                kept.append(site)
                continue
            found = self._ties_of(method, owner, units, ties, ())
            if isinstance(found, str) and found != ANYONE:
                return found
            groups = self._groups(found) if isinstance(found, list) and found else self._groups(units)
            if len(groups) != 1:
                return self._not_one(site, method, found, units)
            for unit in groups[0]:
                unit.sites.append(site)
                if not any(f is method for f in unit.methods):
                    unit.methods.append(method)
        if kept and len(kept) != len(outside):
            return (
                f"the Apex call at line {self.position(kept[0])[0]} would need the scaler as a parameter "
                "and others read it from `self`"
            )
        outside[:] = kept
        return ""

    def _not_one(
        self, site: cst.CSTNode, method: cst.FunctionDef, found: Union[str, list[Unit]], units: list[Unit]
    ) -> str:
        line = self.position(site)[0]
        if found == ANYONE or not found:
            return (
                f"`{method.name.value}` (the Apex call at line {line}) may be called from outside its "
                "class, so which `initialize` ran last is not known there"
            )
        assert isinstance(found, list)  # the only other string, a reason, never gets here
        lines = " and ".join(str(self.position(g[0].call)[0]) for g in self._groups(found))
        return (
            f"the Apex call at line {line} runs after the `initialize` at lines {lines}, depending on "
            f"which method called `{method.name.value}`"
        )

    def _units_class(self, units: list[Unit]) -> Optional[cst.ClassDef]:
        classes = {
            id(c): c
            for c in (
                self.class_of(f) if f is not None else None
                for f in (self.scope_of(u.statement) for u in units)
            )
        }
        if len(classes) != 1 or None in classes.values():
            return None
        return next(iter(classes.values()))

    def _groups(self, units: list[Unit]) -> list[list[Unit]]:
        """Units grouped by the `if`/`else` whose arms they are (one group per lone unit)."""
        groups: dict[int, list[Unit]] = {}
        for unit in units:
            groups.setdefault(id(unit.pair) if unit.pair is not None else id(unit), []).append(unit)
        return list(groups.values())

    def _ties_of(
        self,
        method: cst.FunctionDef,
        owner: cst.ClassDef,
        units: list[Unit],
        ties: dict[int, Union[str, list[Unit]]],
        chain: tuple[cst.FunctionDef, ...],
    ) -> Union[str, list[Unit]]:
        """The units whose blocks call into `method` (ANYONE: something outside the class
        does); a string with a located reason where a call is no such tie."""
        if id(method) in ties:
            return ties[id(method)]
        if any(f is method for f in chain):
            return []
        name = method.name.value
        found: list[Unit] = []
        calls = self._self_calls(name, owner)
        if isinstance(calls, str) or calls is None:
            return calls or ANYONE
        for call in calls:
            holders = [u for u in units if self._holds(u, call)]
            caller = self.scope_of(call)
            if holders:
                found.extend(u for u in holders if u not in found)
            elif any(caller is self.scope_of(u.statement) for u in units):
                return (
                    f"`{name}` is called at line {self.position(call)[0]}, outside the block of "
                    "the `initialize` in that method"
                )
            else:
                assert caller is not None  # _self_calls keeps only calls from methods of `owner`
                more = self._ties_of(caller, owner, units, ties, chain + (method,))
                if isinstance(more, str):
                    return more
                found.extend(u for u in more if u not in found)
        result = found if calls else ANYONE
        if not chain:  # deeper results may miss callers on the chain (a cycle cut short)
            ties[id(method)] = result
        return result

    def _self_calls(self, name: str, owner: cst.ClassDef) -> Union[str, list[cst.Call], None]:
        """Every `self.<name>(...)` call in a method of `owner`; None where `name` is also used
        otherwise (called on an instance from outside, passed as a callback); a string where
        the method is not one plain definition."""
        module = self._module()
        defs = [
            d
            for d in self.findall(module, m.FunctionDef(name=m.Name(name)), {name})
            if isinstance(d, cst.FunctionDef)
        ]
        if len(defs) != 1 or defs[0].decorators or defs[0].asynchronous:
            return f"`{name}` is defined more than once, decorated or async"
        calls = []
        for node in self.findall(module, m.Name(name), {name}):
            parent = self.parent(node)
            if parent is defs[0] or isinstance(parent, cst.Arg) and parent.keyword is node:
                continue
            call = self.parent(parent) if isinstance(parent, cst.Attribute) else None
            caller = self.scope_of(node)
            if not (
                isinstance(parent, cst.Attribute)
                and parent.attr is node
                and m.matches(parent.value, m.Name("self"))
                and isinstance(call, cst.Call)
                and call.func is parent
                and caller is not None
                and self.class_of(caller) is owner
            ):
                return None
            calls.append(call)
        return calls

    def _holds(self, unit: Unit, node: cst.CSTNode) -> bool:
        return self._holder([unit], node) is unit

    def _isolated(self, units: list[Unit]) -> str:
        """No function holding one group's `initialize`, or tied to it, can reach (by a name it
        mentions, through the file's functions) a function that holds another group's."""
        groups = self._groups(units)
        holding: dict[int, list[list[Unit]]] = {}
        for group in groups:
            for unit in group:
                holding.setdefault(id(self.scope_of(unit.statement)), []).append(group)
        functions = self._functions_by_name()
        mentions: dict[int, set[str]] = {}
        for group in groups:
            starts = [self.scope_of(u.statement) for u in group] + [f for u in group for f in u.methods]
            seen: set[int] = set()
            pending = [f for f in starts if f is not None]
            while pending:
                function = pending.pop()
                if id(function) in seen:
                    continue
                seen.add(id(function))
                if any(other is not group for other in holding.get(id(function), ())):
                    first = starts[0]
                    assert first is not None  # a module-level group has nothing pending
                    return (
                        f"`{first.name.value}` may call `{function.name.value}` (by the name it "
                        "mentions), which calls `initialize` again"
                    )
                if id(function) not in mentions:
                    mentions[id(function)] = _NameCollector.of(function.body)
                pending.extend(f for name in mentions[id(function)] for f in functions.get(name, ()))
        return ""

    def _functions_by_name(self) -> dict[str, list[cst.FunctionDef]]:
        found: dict[str, list[cst.FunctionDef]] = {}
        for function in find_statements(self._module(), cst.FunctionDef):
            found.setdefault(function.name.value, []).append(function)
        return found

    def _tied_parts(self, units: list[Unit], plans: list[TrainingPlan]) -> Union[list[PlanPart], str]:
        """The plan parts for the code after an `if`/`else` with one `initialize` per arm and
        for the methods tied to a unit (after the units' own parts); or why the arms' autocasts
        differ where code runs after either."""
        parts: list[PlanPart] = []
        for group in self._groups(units):
            planned = [(u, p) for u, p in zip(units, plans) if any(u is g for g in group)]
            if not planned:
                continue
            unit = planned[0][0]
            after = unit.pair is not None and any(
                self._holder([unit], s) is unit
                and self.position(s)[0] > unit.pair_after
                and not any(p is unit.block for p in self.ancestors(s))
                for s in unit.sites
            )
            if not after and not unit.methods:
                continue
            casts = {self.code_of(p.autocast_call) for _, p in planned}
            switches = {self._enabled_code(p.scaler_call) for _, p in planned}
            if len(casts) > 1 or len(switches) > 1:
                lines = " and ".join(str(self.position(u.call)[0]) for u, _ in planned)
                what = "autocasts" if len(casts) > 1 else "scaler switches (`enabled=`)"
                shown = casts if len(casts) > 1 else {c or "always on" for c in switches}
                return (
                    f"the `initialize` calls at lines {lines}, one per branch, need different {what} "
                    f"({' / '.join(sorted(f'`{c}`' for c in shown))}) where code runs after either"
                )
            first = min((p for _, p in planned), key=lambda p: p.init_line)
            spans = [(self.position(f)[0], self._lines_of(f)[-1]) for f in unit.methods]
            if after:
                block = unit.pair_block
                assert isinstance(block, (cst.IndentedBlock, cst.Module))  # where an `if` stands
                body = block.body
                spans.append((unit.pair_after + 1, self._lines_of(body[-1])[-1]))
            parts.extend(
                PlanPart(
                    a, b, first.scaler_call, first.autocast_call, False, first.init_scope, first.init_line
                )
                for a, b in spans
            )
        return parts

    def _enabled_code(self, call: cst.Call) -> str:
        return next(
            (
                self.code_of(a.value)
                for a in call.args
                if a.keyword is not None and a.keyword.value == "enabled"
            ),
            "",
        )


class _NameCollector(cst.CSTVisitor):
    """Every name a subtree spells, collected once per function (no matcher machinery)."""

    def __init__(self) -> None:
        self.found: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.found.add(node.value)

    @classmethod
    def of(cls, node: cst.CSTNode) -> set[str]:
        collector = cls()
        node.visit(collector)
        return collector.found
