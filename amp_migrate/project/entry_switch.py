"""The scaler's switch handed to a user's function as an argument.

A training entry (`train_net(args, config)`) calls `initialize` under `if config.fp16:` and then
the loop of the trainer module it imports, passing the same test on:
`train(model, optimizer, ..., fp16=config.fp16)`. The trainer's
`if fp16: <scaled backward> else: loss.backward()` is then the scaler's switch: the parameter
holds, on entry, an and-ed part of the guard the owner hoists into `enabled=`. This module finds
those entries on the owner's side; plan/switch_flow.py follows the parameter inside the user
(never rebound, passed down unchanged) and stops at the entry.

An entry (function, parameter, rest) is given where, in the owner, the guard is a module-level
function's `if` around its one `initialize` (guard.py: a path from a parameter that nothing
rebinds or stores into), and every call of the user's function there

* is in that function's body after the `if` (the scaler the owner builds before the `if` is
  set on the user by then), and passes for the parameter a path that is a prefix of the
  guard's part (`fp16=config.fp16`, or `cfg=config` where the user tests `cfg.fp16`), all calls
  the same part;

and nothing else may call it: every mention of the function's name in the owner is such a call,
and no other module of the tree that reaches the user by imports spells the name at all (a
name, an attribute, an import). The user checks its own module (plan/switch_flow.py).
"""

from __future__ import annotations

import ast
from typing import Callable, Mapping, Optional

from ..plan.switch_flow import _ast_path
from .callers import STAR, callee_names, dotted
from .guard import conjuncts, end_line, guarded_builder, parameters, stable_paths
from .index import ProjectIndex

Entry = tuple[str, str, tuple[str, ...]]  # (user's function, its parameter, rest of the path)


def _parse(text: str) -> Optional[ast.Module]:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _spells(tree: ast.Module, name: str) -> bool:
    """Whether the module spells `name` as a name, an attribute or an imported name."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id == name) or (
            isinstance(node, ast.Attribute) and node.attr == name
        ):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            name in (a.name.rsplit(".", 1)[-1], a.asname) for a in node.names
        ):
            return True
    return False


def _argument(call: ast.Call, name: str, index: Optional[int]) -> Optional[ast.expr]:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if index is None or any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return None
    return call.args[index] if index < len(call.args) else None


def _calls(tree: ast.Module, names: set[str]) -> Optional[list[ast.Call]]:
    """The calls spelled as one of `names`; None where a name is mentioned other than called."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and dotted(n.func) in names]
    called = {id(c.func) for c in calls}
    spelled = [n for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in names]
    return calls if all(id(n) in called for n in spelled) else None


def _after(function: ast.FunctionDef, guard: ast.If, call: ast.Call) -> bool:
    """`call` runs in `function`'s body, in a statement after the guard."""
    return any(
        s.lineno > end_line(guard) and any(n is call for n in ast.walk(s)) for s in function.body
    ) and not any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        and any(c is call for c in ast.walk(n))
        for n in ast.walk(function)
        if n is not function
    )


def _entry(
    calls: list[ast.Call], param: str, index: Optional[int], paths: list[tuple[str, ...]]
) -> Optional[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(the guard path, the rest of it past the argument) that every call of `calls` passes a
    prefix of for `param`, or None."""
    found = set()
    for call in calls:
        value = _argument(call, param, index)
        passed = _ast_path(value) if value is not None else None
        match = next(
            ((p, p[len(passed) :]) for p in paths if passed is not None and p[: len(passed)] == passed), None
        )
        if match is None:
            return None
        found.add(match)
    return found.pop() if len(found) == 1 else None


def _called_elsewhere(index: ProjectIndex, texts: Mapping[str, str], owner: str, user: str, name: str) -> str:
    """A module of the tree, other than the two, that may call the user's function: it reaches
    the user by imports and spells the name."""
    for path, text in sorted(texts.items()):
        if path in (owner, user) or path not in index.modules or not index.reaches(path, user):
            continue
        tree = _parse(text)
        if tree is None or _spells(tree, name):
            return path
    return ""


def _rebinds(function: ast.FunctionDef, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        for n in ast.walk(function)
    ) or any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(function))


class _Handover:
    """One owner's calls into one user: what they hand over (`entries`), and for each call
    that passes the guard's part but cannot be relied on, (the user function's line, why)."""

    def __init__(
        self,
        index: ProjectIndex,
        texts: Mapping[str, str],
        owner: str,
        user: str,
        call: Callable[[str], str] = str,
    ) -> None:
        self.index, self.texts, self.owner, self.user, self.call = index, texts, owner, user, call
        self.entries: list[Entry] = []
        self.refused: list[tuple[int, str]] = []
        facts = index.facts(owner)
        if len(facts.initialize) != 1 or index.resolver is None:
            return
        tree, user_tree = _parse(texts.get(owner, "")), _parse(texts.get(user, ""))
        if tree is None or user_tree is None:
            return
        self.tree: ast.Module = tree
        self.user_tree: ast.Module = user_tree
        builder = guarded_builder(self.tree, facts.initialize[0].line)
        if builder is not None:
            self.function, self.guard = builder
            self.stable = stable_paths(self.tree, self.function, self.guard)
            self._examine()

    def _examine(self) -> None:
        every = [p for p in (_ast_path(c) for c in conjuncts(self.guard.test)) if p is not None]
        for fd in [s for s in self.user_tree.body if isinstance(s, ast.FunctionDef)]:
            names = {
                fd.name if n == STAR else n
                for n in callee_names(self.index, self.owner, self.tree, self.user, fd.name)
            }
            calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call) and dotted(n.func) in names]
            positional, keyword = parameters(fd)
            for param in positional + keyword if calls else ():
                handed = _entry(calls, param, positional.index(param) if param in positional else None, every)
                if handed is None:
                    continue
                why = self._doubt(fd, param, calls, handed[0])
                if why:
                    self.refused.append(
                        (
                            fd.lineno,
                            f"`{param}` of `{fd.name}` is given `{'.'.join(handed[0])}`, "
                            f"the test around {self.call(self.owner)}'s `initialize`, but {why}",
                        )
                    )
                else:
                    self.entries.append((fd.name, param, handed[1]))

    def _doubt(self, fd: ast.FunctionDef, param: str, calls: list[ast.Call], path: tuple[str, ...]) -> str:
        """Why the calls' argument may not be the scaler's switch where the user reads it; ""."""
        owner, user, name = self.call(self.owner), self.call(self.user), fd.name
        if path not in self.stable:
            return f"it may change after that test (rebound or stored into in {owner})"
        early = [str(c.lineno) for c in calls if not _after(self.function, self.guard, c)]
        if early:
            return f"{owner} also calls it at line {', '.join(early)}, not after that test in `{self.function.name}`"
        if _calls(self.tree, {dotted(c.func) for c in calls}) is None:
            return f"{owner} names `{name}` other than by calling it"
        other = _called_elsewhere(self.index, self.texts, self.owner, self.user, name)
        if other:
            return f"{self.call(other)} also names `{name}` and may call it with another value"
        tops = [
            d.name
            for d in self.user_tree.body
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        if tops.count(name) != 1 or any(
            isinstance(n, ast.Name) and n.id == name for n in ast.walk(self.user_tree)
        ):
            return f"{user} itself names `{name}` (a call there may pass another value)"
        if _rebinds(fd, param):
            return f"`{name}` rebinds `{param}`"
        return ""


def entry_switch(index: ProjectIndex, texts: Mapping[str, str], owner: str, user: str) -> tuple[Entry, ...]:
    """The parameters of `user`'s functions that hold a part of the owner's guard on entry."""
    return tuple(_Handover(index, texts, owner, user).entries)


def entry_refusals(
    index: ProjectIndex, texts: Mapping[str, str], owner: str, user: str, call: Callable[[str], str] = str
) -> list[tuple[int, str]]:
    """The owner's calls that pass its guard into the user but cannot be relied on: (the user
    function's line, why); messages call files by `call(path)`."""
    return _Handover(index, texts, owner, user, call).refused
