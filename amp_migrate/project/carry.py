"""Apex's module handed from one module to functions of another, as a value.

A training script imports Apex in `main()` (`amp = None` otherwise) and passes the module to a
helper it imports: `load_checkpoint(path, model, optimizer, amp)`, where the helper tests
`if amp:` and calls `amp.load_state_dict(...)`. Per file, the script refuses (AMP155: the helper's
uses cannot be seen) and the helper, which imports no Apex, is an AMP033 user. Together they are
provable: the group settles on roles where the script passes its GradScaler in that slot and
the helper's parameter becomes the scaler, tested with `is_enabled()` (rules/module_value.py).

A group qualifies when its only module that sets Apex up hands the value only to functions of
the other members (each of whose every Apex use is on that value, in those functions, proven by
carriers.py with the slot as a seed), and no module of the tree but the script names those
functions (a caller the index cannot follow would still pass Apex's module). Anything else:
None, and the group is judged as before.
"""

from __future__ import annotations

import ast
import re
from typing import Mapping, Optional

from ..analysis.carriers import Carriers, External, find_carriers
from ..plan.types import SharedScaler
from .groups import Group
from .index import Import, ProjectIndex


def _parse(text: str) -> Optional[ast.Module]:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _carriers(text: str, seeds: Optional[dict[str, str]] = None) -> Optional[Carriers]:
    tree = _parse(text)
    found = find_carriers(tree, text, seeds) if tree is not None else None
    return found if found is not None and found.refusal is None else None


def _function(tree: ast.Module, name: str) -> Optional[ast.FunctionDef]:
    defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name]
    return defs[0] if len(defs) == 1 and isinstance(defs[0], ast.FunctionDef) else None


def _receiver(
    index: ProjectIndex, texts: Mapping[str, str], passer: str, external: External
) -> Optional[tuple[str, str]]:
    """(path, parameter) of the function `external` calls, where the tree defines it."""
    found = (
        index.resolver.targets(passer, Import(external.module, (external.function,), external.level))
        if index.resolver is not None
        else []
    )
    for path in found:
        tree = _parse(texts.get(path, ""))
        function = _function(tree, external.function) if tree is not None else None
        if function is None:
            continue
        positional = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if external.keyword is not None:
            named = positional[len(function.args.posonlyargs) :] + [a.arg for a in function.args.kwonlyargs]
            return (path, external.keyword) if external.keyword in named else None
        assert external.index is not None  # passed by position (no keyword)
        return (path, positional[external.index]) if external.index < len(positional) else None
    return None


def _receiver_path(index: ProjectIndex, texts: Mapping[str, str], passer: str, external: External) -> str:
    """The module of the function `external` calls, where its receiver is known to be found."""
    target = _receiver(index, texts, passer, external)
    assert target is not None  # the caller found every external call's receiver already
    return target[0]


def _named_elsewhere(index: ProjectIndex, texts: Mapping[str, str], passer: str, receivers: dict) -> bool:
    """Whether a module other than the passer (and the receiver itself) spells a receiving
    function's name: a call the value flow cannot follow."""
    for path, seeds in receivers.items():
        for name in seeds:
            pattern = re.compile(rf"\b{re.escape(name)}\b")
            if any(pattern.search(text) for other, text in texts.items() if other not in (passer, path)):
                return True
    return False


def carrier_roles(
    index: ProjectIndex, group: Group, texts: Mapping[str, str]
) -> Optional[dict[str, SharedScaler]]:
    """The roles of a group tied only by Apex's module passed as a value, or None."""
    owners = [p for p in group.members if index.facts(p).initialize]
    if len(owners) != 1:
        return None
    passer = owners[0]
    found = _carriers(texts[passer]) if passer in texts else None
    if found is None or not found.external:
        return None
    receivers: dict[str, dict[str, str]] = {}
    for external in found.external.values():
        target = _receiver(index, texts, passer, external)
        if target is None or target[0] == passer or target[0] not in group.members:
            return None
        receivers.setdefault(target[0], {})[external.function] = target[1]
    if set(group.members) != {passer, *receivers} or _named_elsewhere(index, texts, passer, receivers):
        return None
    roles: dict[str, SharedScaler] = {}
    names: dict[str, str] = {}
    for path, seeds in receivers.items():
        facts = index.facts(path)
        own = _carriers(texts[path], seeds)
        if (
            own is None
            or own.external
            or facts.apex_imports
            or facts.owns
            or facts.provided
            or not all(site.function in own.slots for site in facts.uses + facts.foreign)
        ):
            return None
        names[path] = _free_word("scaler", texts[path])
        roles[path] = SharedScaler(
            reach=names[path], carrier_slots=tuple(sorted(seeds.items())), other=passer
        )
    calls = tuple(
        sorted((e.local, names[_receiver_path(index, texts, passer, e)]) for e in found.external.values())
    )
    roles[passer] = SharedScaler(carrier_calls=calls, other=", ".join(sorted(receivers)))
    return roles


def _free_word(word: str, text: str) -> str:
    name, i = word, 0
    while re.search(rf"\b{re.escape(name)}\b", text):
        i += 1
        name = f"{word}_{i}"
    return name
