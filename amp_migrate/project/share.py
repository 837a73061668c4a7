"""One GradScaler for a group whose `initialize` and `scale_loss` sit in different modules.

Apex's amp state was one per process: a Trainer module scaled with what an optimizer
factory's `initialize` set up. The native scaler is an object, so it must live where both
modules reach it, and that follows the import direction (docs/decisions.md, "One scaler
across the modules of a group"):

* the owner (the module calling `initialize`) imports the user (the script imports its
  trainer or checkpoint helper): the user module gets `scaler = None`, and the owner sets
  `_amp_trainer.scaler = scaler` right after building it; the user reads its own global
  (not where the user runs as a program itself: as `__main__` it is another module object);
* otherwise the user imports the owner (`import pkg.optimization as _amp_optimization`)
  and reads `_amp_optimization.scaler`, which the owner keeps in a module global (set with
  `global scaler` where `initialize` ran). Only where the owner is a module some other
  module imports (a script runs as `__main__`, and importing it by name would run it again),
  does not itself import the user (no new cycle), and some module of the tree spells an
  import of it that resolves the same from the user.

Two facts travel with the roles. Where the owner's run-time options may make Apex cast without
scaling (or scale without casting), the owner also hands over autocast's own switch
(`amp_enabled`, beside the scaler), which the user's autocast reads instead of
`scaler.is_enabled()`. And for a user whose `if cond: <scaled> else: loss.backward()` must be
proven to follow the scaler's switch, `owner_switch` gives the `if` test around the owner's
`initialize` as paths from its builder's parameters (plan/switch_flow.py checks the user's side),
and `entry_switch` the user's parameters the owner passes that test to (entry_switch.py).

A user tied to several owners gets a scaler only when each owner is a separate program
(a script that imports it, none importing another): each sets the attribute, as each
program's `initialize` set Apex's state. Owners that only prepare models for inference in a
process of their own do not count (inference_owners.py). Anything else, and a tie the index only guessed,
keeps the group on the shim, with the reason in the user's AMP102.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from typing import Mapping, Optional

from ..plan.types import SCALER_NAMES, SharedScaler
from .callers import STAR, callee_names
from .carry import carrier_roles
from .entry_switch import entry_switch
from .groups import Group
from .guard import guarded_builder, parameters, stable_paths
from .index import _MAIN_GUARD, ProjectIndex, Spelling
from .inference_owners import competing, why_competing


def _free(word: str, *texts: str) -> str:
    """`word`, or `word_1`, `word_2`, ...: the first spelled in none of `texts`."""
    name, i = word, 0
    while any(re.search(rf"\b{re.escape(name)}\b", t) for t in texts):
        i += 1
        name = f"{word}_{i}"
    return name


def _scaler_name(*texts: str) -> str:
    for name in SCALER_NAMES:
        if not any(re.search(rf"\b{name}\b", t) for t in texts):
            return name
    return _free("amp_scaler", *texts)


def _import(spelling: Spelling, alias: str) -> tuple:
    """The (module, obj, asname, relative) AddImportsVisitor takes."""
    return (spelling.module, spelling.obj, alias, spelling.relative)


def _alias(index: ProjectIndex, target: str, importer_text: str, taken: tuple = ()) -> str:
    """`_amp_<module>`, spelled nowhere in the importer nor among the aliases it already adds."""
    last = index.facts(target).name.rsplit(".", 1)[-1] or "module"
    return _free(f"_amp_{last}", importer_text, " ".join(alias for _, _, alias, _ in taken))


class _Sharing:
    """The roles of one group's members, built up tie by tie."""

    def __init__(self, index: ProjectIndex, texts: Mapping[str, str], names: Mapping[str, str]) -> None:
        self.index, self.texts, self.names = index, texts, names
        self.roles: dict[str, SharedScaler] = {}

    def call(self, path: str) -> str:
        return self.names.get(path, path)

    def refuse(self, user: str, why: str, owners: list[str]) -> None:
        self.roles[user] = SharedScaler(refused=why)
        for owner in owners:
            if not self.owner_role(owner).owner:
                self.roles[owner] = SharedScaler(
                    refused=f"{self.call(user)}, which uses the scaler built here, cannot be handed it"
                )

    def owner_role(self, owner: str) -> SharedScaler:
        return self.roles.get(owner, SharedScaler())

    def attribute(self, owner: str, user: str, name: str, owners: tuple[str, ...] = ()) -> bool:
        """The owner sets `user`'s module attribute `name` (and, where the options of `owners`,
        all that set it, may make Apex cast without scaling, the user's amp switch)."""
        spelling = self.index.spelling(owner, user)
        if spelling is None or not self.index.one_name(user):
            return False
        role = self.owner_role(owner)
        alias = _alias(self.index, user, self.texts[owner], role.imports)
        owners = owners or (owner,)
        switch = (
            _free("amp_enabled", self.texts[user])
            if _scales(self.index, user)
            and not any(_scales(self.index, o) for o in owners)
            and any(_options_apart(self.index, self.texts[o], o) for o in owners)
            else ""
        )
        self.roles[owner] = replace(
            role,
            publish=(*role.publish, f"{alias}.{name}"),
            casts=role.casts or _scales(self.index, user),
            imports=(*role.imports, _import(spelling, alias)),
            other=_join(role.other, self.call(user)),
            amp_publish=(*role.amp_publish, f"{alias}.{switch}") if switch else role.amp_publish,
        )
        self.roles[user] = SharedScaler(
            name=name, reach=name, declare=True, other=self.call(owner), amp_switch=switch
        )
        return True

    def global_(self, owner: str, user: str) -> bool:
        """The user imports the owner and reads its global."""
        index = self.index
        facts = index.facts(owner)
        if facts.script or not index.imported(owner) or index.reaches(owner, user):
            return False
        spelling = index.spelling(user, owner)
        if spelling is None or not index.one_name(owner):
            return False
        role = self.owner_role(owner)
        name = role.name or _scaler_name(self.texts[owner])
        alias = _alias(index, owner, self.texts[user])
        switch = (
            role.amp_switch or _free("amp_enabled", self.texts[owner])
            if _scales(index, user)
            and not _scales(index, owner)
            and _options_apart(index, self.texts[owner], owner)
            else ""
        )
        self.roles[owner] = replace(
            role,
            name=name,
            global_=True,
            declare=True,
            casts=role.casts or _scales(index, user),
            other=_join(role.other, self.call(user)),
            amp_publish=(switch,) if switch else role.amp_publish,
            amp_switch=switch or role.amp_switch,
        )
        self.roles[user] = SharedScaler(
            name=name,
            reach=f"{alias}.{name}",
            imports=(_import(spelling, alias),),
            other=self.call(owner),
            amp_switch=f"{alias}.{switch}" if switch else "",
        )
        return True


def _callee(index: ProjectIndex, user: str, tree: ast.Module, owner: str, name: str) -> Optional[str]:
    """How `user` calls the function `name` of `owner`: `name` (or its alias) imported from
    it, or `module.name` through an import of the module; None unless exactly one way."""
    found = callee_names(index, user, tree, owner, name) - {STAR}
    return found.pop() if len(found) == 1 else None


def _own_program(index: ProjectIndex, path: str, text: str, user: str) -> bool:
    """`path` runs only as a program of its own that never loads `user`: a builder it calls
    there builds a scaler `user` never sees."""
    return (
        path in index.modules
        and _MAIN_GUARD.search(text) is not None
        and not index.imported(path)
        and not index.reaches(path, user)
    )


def owner_switch(
    index: ProjectIndex, texts: Mapping[str, str], owner: str, user: str
) -> tuple[str, tuple[tuple[int, str, tuple[str, ...]], ...]]:
    """The owner's guard around its one `initialize`, as `user` can check it (SharedScaler's
    `switch_via` and `switch_paths`): the paths of the guard's conjuncts rooted at a parameter
    the builder never rebinds and nothing in the owner stores into; ("", ()) where the builder
    is called from another module than `user` or the owner, or cannot be named from `user`."""
    facts = index.facts(owner)
    if len(facts.initialize) != 1 or index.resolver is None:
        return "", ()
    try:
        tree, user_tree = ast.parse(texts[owner]), ast.parse(texts[user])
    except (SyntaxError, ValueError):
        return "", ()
    found = guarded_builder(tree, facts.initialize[0].line)
    if found is None:
        return "", ()
    function, guard = found
    callee = _callee(index, user, user_tree, owner, function.name)
    call = re.compile(rf"\b{re.escape(function.name)}\s*\(")
    if (
        callee is None
        or len(call.findall(texts[owner])) != 1
        or any(
            call.search(t) and not _own_program(index, p, t, user)
            for p, t in texts.items()
            if p not in (owner, user)
        )
    ):
        return "", ()
    positional, _ = parameters(function)
    paths = [
        (positional.index(path[0]) if path[0] in positional else -1, path[0], path[1:])
        for path in stable_paths(tree, function, guard)
    ]
    return (callee, tuple(paths)) if paths else ("", ())


_SCALED_LEVELS = ("O1", "O2")


def _options_apart(index: ProjectIndex, text: str, owner: str) -> bool:
    """Whether the owner's `initialize` options may make Apex cast without scaling losses or
    scale without casting (a level or loss scale read at run time, O0, O3, a static scale): then
    the modules it hands the scaler to switch autocast by a flag it sets, not by the scaler."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    lines = {site.line for site in index.facts(owner).initialize}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and node.lineno in lines
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "initialize"
        ):
            options = {k.arg: k.value for k in node.keywords}
            level, scale = options.get("opt_level"), options.get("loss_scale")
            if level is not None and not (isinstance(level, ast.Constant) and level.value in _SCALED_LEVELS):
                return True
            if scale is not None and not (
                isinstance(scale, ast.Constant) and scale.value in ("dynamic", None)
            ):
                return True
    return False


def _scales(index: ProjectIndex, user: str) -> bool:
    """Whether `user` scales a loss (and so runs a forward under autocast)."""
    return any(site.what.endswith("scale_loss") for site in index.facts(user).uses)


def _join(listed: str, more: str) -> str:
    return f"{listed} and {more}" if listed else more


def owners_of(
    index: ProjectIndex, texts: Mapping[str, str], tied: list[str], user: str
) -> tuple[list[str], list[str]]:
    """(the owners that hand `user` the scaler, those whose switch its branches may follow).
    Owners that are each a program of their own all set the user's attribute, as before; else
    those that only prepare models for inference apart (inference_owners.py) drop out. Either
    way, where one owner trains and the others prepare models for inference apart, the user's
    branches follow that one's switch: the others' processes run none of its Apex code."""
    kept = competing(index, texts, tied, user) if len(tied) > 1 else tied
    if len(tied) > 1 and _one_at_a_time(index, tied, user):
        return tied, kept
    return kept, kept


def _one_at_a_time(index: ProjectIndex, owners: list[str], user: str) -> bool:
    """Each owner is a program of its own that imports the user, and none imports another."""
    return all(index.facts(o).script and user in index.edges.get(o, ()) for o in owners) and not any(
        index.reaches(a, b) for a in owners for b in owners if a != b
    )


def _group_roles(
    index: ProjectIndex, group: Group, texts: Mapping[str, str], names: Mapping[str, str]
) -> dict[str, SharedScaler]:
    facts = {p: index.facts(p) for p in group.members}
    carried = carrier_roles(index, group, texts)
    if carried is not None:
        return carried
    if any(
        f.fp16_optimizers or f.providers or f.provided or f.dynamic_state or f.foreign for f in facts.values()
    ):
        return {}
    sharing = _Sharing(index, texts, names)
    owners = {p for p, f in facts.items() if f.initialize}
    for user in sorted(p for p, f in facts.items() if f.uses and not f.initialize):
        ties = [t for t in group.ties if t.user == user and t.owner in owners]
        tied, kept = owners_of(index, texts, sorted({t.owner for t in ties}), user)
        if not tied:
            continue
        if any(t.how.startswith("no module of the tree") for t in ties):
            sharing.refuse(
                user,
                "no module of the tree imports both it and the module calling "
                "`initialize`, so no scaler can be handed over",
                tied,
            )
        elif len(tied) > 1:
            _several(sharing, tied, user)
        elif not _one(sharing, tied[0], user):
            sharing.refuse(
                user,
                f"it cannot reach a scaler built in {sharing.call(tied[0])} "
                "(neither imports the other, and no import of it resolves from here)",
                tied,
            )
        if len(kept) == 1 and sharing.roles[user].user:
            _switch(sharing, kept[0], user)
    return sharing.roles


def _switch(sharing: _Sharing, owner: str, user: str) -> None:
    """The owner's guard as the user can check it: through the user's call of the owner's
    builder (`owner_switch`), or the owner's calls into the user (entry_switch.py)."""
    via, paths = owner_switch(sharing.index, sharing.texts, owner, user)
    entries = entry_switch(sharing.index, sharing.texts, owner, user)
    if paths or entries:
        sharing.roles[user] = replace(
            sharing.roles[user], switch_via=via, switch_paths=paths, switch_entries=entries
        )


def _one(sharing: _Sharing, owner: str, user: str) -> bool:
    index = sharing.index
    if index.reaches(owner, user) and not index.reaches(user, owner) and not index.facts(user).script:
        name = sharing.roles.get(user, SharedScaler()).name or _scaler_name(sharing.texts[user])
        return sharing.attribute(owner, user, name)
    return sharing.global_(owner, user)


def _several(sharing: _Sharing, owners: list[str], user: str) -> None:
    listed = ", ".join(sharing.call(o) for o in owners)
    if not _one_at_a_time(sharing.index, owners, user):
        why = why_competing(sharing.index, sharing.texts, owners, user, sharing.call)
        sharing.refuse(user, f"{listed} each call `initialize` and may run in one process{why}", owners)
        return
    name = _scaler_name(sharing.texts[user])
    for owner in owners:
        if not sharing.attribute(owner, user, name, tuple(owners)):
            sharing.refuse(user, f"{sharing.call(owner)} cannot import it by a spelling of the tree", owners)
            return
    sharing.roles[user] = replace(sharing.roles[user], other=listed)


def shared_scalers(
    index: ProjectIndex,
    groups: list[Group],
    texts: Mapping[str, str],
    names: Optional[Mapping[str, str]] = None,
) -> dict[str, SharedScaler]:
    """Each grouped module's part in its group's shared GradScaler (path -> role); messages
    call files by `names` (default: their paths in the index)."""
    roles: dict[str, SharedScaler] = {}
    for group in groups:
        roles.update(_group_roles(index, group, texts, names or {}))
    return {p: r for p, r in roles.items() if r.owner or r.user or r.refused or r.carrier_calls}
