"""The running order of a list of rules, derived from what each reads and writes.

A rule runs after every other rule of the list that writes a fact it reads (facts.py). Among
the rules free to run next, the one whose class name sorts first runs: the order depends on
the declarations alone, never on how the registry lists the rules. A cycle, or a fact read
that no rule of the list writes and the driver does not provide, is an error when the
registry is built (at import). This module holds no rule.
"""

from __future__ import annotations

import heapq
from typing import AbstractSet, Iterable, Sequence

from .base import Rule
from .facts import DRIVER_PROVIDES, Fact


class RuleOrderError(Exception):
    """The declarations of a list of rules admit no running order."""


def _after(rules: Sequence[type[Rule]], provided: AbstractSet[Fact]) -> dict[type[Rule], set[type[Rule]]]:
    """Each rule → the rules that must run before it."""
    writers: dict[Fact, list[type[Rule]]] = {}
    for rule in rules:
        for fact in rule.WRITES:
            writers.setdefault(fact, []).append(rule)
    before: dict[type[Rule], set[type[Rule]]] = {rule: set() for rule in rules}
    for rule in rules:
        for fact in sorted(rule.READS, key=lambda f: f.value):
            others = [w for w in writers.get(fact, ()) if w is not rule]
            if not others and fact not in provided:
                raise RuleOrderError(
                    f"{rule.__name__} reads {fact.name}, which no other rule writes and the driver does not provide"
                )
            before[rule].update(others)
    return before


def ordered(rules: Iterable[type[Rule]], provided: AbstractSet[Fact] = DRIVER_PROVIDES) -> list[type[Rule]]:
    """`rules` in an order that runs every writer of a fact before its readers; ties go to
    the class name that sorts first."""
    rules = list(dict.fromkeys(rules))
    before = _after(rules, provided)
    waiting = {rule: len(needs) for rule, needs in before.items()}
    unlocks: dict[type[Rule], list[type[Rule]]] = {rule: [] for rule in rules}
    for rule, needs in before.items():
        for need in needs:
            unlocks[need].append(rule)
    ready = [(rule.__name__, rule) for rule, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    out: list[type[Rule]] = []
    while ready:
        _, rule = heapq.heappop(ready)
        out.append(rule)
        for later in unlocks[rule]:
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready, (later.__name__, later))
    if len(out) < len(rules):
        stuck = sorted(rule.__name__ for rule in rules if rule not in out)
        raise RuleOrderError(f"the reads and writes of these rules form a cycle: {', '.join(stuck)}")
    return out


def unmet(order: Sequence[type[Rule]], provided: AbstractSet[Fact] = DRIVER_PROVIDES) -> list[str]:
    """What `order` breaks: each rule that runs before a writer of a fact it reads, or reads a
    fact no earlier rule writes and the driver does not provide (empty: none)."""
    problems = []
    for i, rule in enumerate(order):
        for fact in sorted(rule.READS, key=lambda f: f.value):
            late = [w.__name__ for w in order[i + 1 :] if fact in w.WRITES]
            if late:
                problems.append(f"{rule.__name__} reads {fact.name} before {', '.join(late)} writes it")
            if fact not in provided and not any(fact in w.WRITES for w in order[:i]):
                problems.append(f"{rule.__name__} reads {fact.name}, which nothing before it writes")
    return problems
