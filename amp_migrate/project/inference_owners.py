"""Owners that only prepare models for inference, apart from the one that trains.

A user module (a trainer's loop) is tied to every module that calls `initialize` and may share
a process with it, and a user tied to two such owners keeps the shim (share.py, "one owner per
use"). An evaluation script that imports a helper from the trainer module (`to_cuda`) and calls
`model = amp.initialize(model, opt_level=...)` with no optimizer is such an owner, but it sets
up nothing the trainer's scaler could be: Apex's `scale_loss` works only on an optimizer some
`initialize` was given, and that script gave none. It competes only if it shares a process
with the training owner or runs the user's Apex code itself, so it steps aside where:

* every `initialize` of it is given no optimizer (none, `None`, `[]`, `()`);
* it runs only as a program (`if __name__ == "__main__":`, imported by no module of the tree),
  imports no training owner, and nothing it imports (but the user) imports the user;
* it names no function of the user that holds an Apex use (imported by name or by a star
  import, or spelled `module.fit` through an import of the user's module).

It keeps its own migration (an inference region, plan/inference.py) and the user gets its
scaler from the training owner alone. Anything else and it competes as before.
"""

from __future__ import annotations

import ast
from typing import Callable, Mapping, Optional

from .callers import callee_names, mentions
from .index import _MAIN_GUARD, ProjectIndex


def _parse(text: str) -> Optional[ast.Module]:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _is_initialize(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "initialize") or (
        isinstance(func, ast.Name) and func.id == "initialize"
    )


def _no_optimizer(call: ast.Call) -> bool:
    """`initialize(models)` given no optimizer: none, `None`, or an empty list or tuple."""
    given = (
        call.args[1]
        if len(call.args) > 1
        else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
    )
    if any(isinstance(a, ast.Starred) for a in call.args[:2]) or any(k.arg is None for k in call.keywords):
        return False
    return (
        given is None
        or (isinstance(given, ast.Constant) and given.value is None)
        or (isinstance(given, (ast.List, ast.Tuple)) and not given.elts)
    )


def inference_only(index: ProjectIndex, text: str, path: str) -> bool:
    """Every `initialize` the index found in `path` is given no optimizer."""
    tree = _parse(text)
    lines = {site.line for site in index.facts(path).initialize}
    if tree is None or not lines:
        return False
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt) and n.lineno in lines
        for n in ast.walk(n)
        if isinstance(n, ast.Call) and _is_initialize(n)
    ]
    return len({c.lineno for c in calls}) >= len(lines) and all(_no_optimizer(c) for c in calls)


def _names(tree: ast.Module, spellings: set[str]) -> bool:
    """Whether the program names the function: imports it by name (`from engine import fit`,
    or `*`), or spells `module.fit` through an import of its module."""
    return any("." not in s for s in spellings) or bool(mentions(tree, spellings))


def _together(
    index: ProjectIndex,
    texts: Mapping[str, str],
    program: str,
    trainers: list[str],
    user: str,
    call: Callable[[str], str] = str,
) -> str:
    """Why `program` may share a process with a training owner or run the user's Apex code;
    "" where it runs in a process of its own that does neither."""
    text = texts.get(program, "")
    tree = _parse(text)
    importer = next((p for p, targets in sorted(index.edges.items()) if program in targets), None)
    if importer is not None:
        return f"{call(importer)} imports it"
    if tree is None or _MAIN_GUARD.search(text) is None:
        return 'it is not a program of its own (no `if __name__ == "__main__":`)'
    trainer = next((t for t in trainers if index.reaches(program, t)), None)
    if trainer is not None:
        return f"it imports {call(trainer)}"
    between = next(
        (
            m
            for m in sorted(index.modules)
            if m not in (program, user) and index.reaches(program, m) and index.reaches(m, user)
        ),
        None,
    )
    if between is not None:
        return f"it imports {call(between)}, which imports {call(user)}"
    functions = {
        site.function.split(".", 1)[0] for site in index.facts(user).uses + index.facts(user).foreign
    }
    if "<module>" in functions:
        return f"{call(user)} uses Apex at module level"
    named = sorted(name for name in functions if _names(tree, callee_names(index, program, tree, user, name)))
    return f"it names `{named[0]}` of {call(user)}, which uses Apex" if named else ""


def competing(index: ProjectIndex, texts: Mapping[str, str], owners: list[str], user: str) -> list[str]:
    """The owners among `owners` that may have set up the scaler `user` reads: all of them,
    less those that only prepare models for inference in a process of their own, where one
    that trains remains."""
    inference = [o for o in owners if inference_only(index, texts.get(o, ""), o)]
    trainers = [o for o in owners if o not in inference]
    if not trainers or not inference:
        return owners
    if all(not _together(index, texts, o, trainers, user) for o in inference):
        return trainers
    return owners


def why_competing(
    index: ProjectIndex,
    texts: Mapping[str, str],
    owners: list[str],
    user: str,
    call: Callable[[str], str] = str,
) -> str:
    """For a message: why the owners of `owners` that only prepare models for inference still
    compete ("" where none does)."""
    inference = [o for o in owners if inference_only(index, texts.get(o, ""), o)]
    trainers = [o for o in owners if o not in inference]
    if not trainers:
        return ""
    for owner in inference:
        why = _together(index, texts, owner, trainers, user, call)
        if why:
            return f" ({call(owner)} only prepares models for inference, but {why})"
    return ""
