"""Which functions of a file must receive the GradScaler as a parameter.

A training script often calls `amp.initialize` under `if args.fp16:` in `main()` and
`scale_loss` in `train()`, which `main()` calls. Apex's process-global scaler reached `train`
without a parameter; the native scaler is a local of `main()`, so it is passed down: every
function that holds a scaler site gets a `scaler` parameter, and so does every function that
calls one of those (transitively), up to the function that builds the scaler. That is sound
only where every use of such a function is a direct call from a function that has the scaler
in scope after it was built, and where every chain of callers ends in that function (a function
nothing in the file calls, such as a `fit()` that calls the helper building the scaler, could
be passed it by nobody); `find_threading` refuses, with the reason, otherwise. This module
holds no rule; PlanTraining asks it, ThreadScalerThroughCalls carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m


@dataclass(frozen=True)
class Threaded:
    """A function that gets the scaler as its last parameter."""

    name: str
    line: int  # of its `def`, in the file as given
    keyword_only: bool  # after `*` (it has defaults, `*args` or keyword-only parameters)
    #: The parameter that received Apex's module as a value (carriers.py), which the scaler
    #: takes over, and its position (None: passed by keyword only); None: a new parameter.
    replaces: Optional[str] = None
    index: Optional[int] = None


def top_level_function(rule, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The module-level `def` around `node` (None at module level or inside a class)."""
    found = None
    for parent in rule.ancestors(node):
        if isinstance(parent, cst.ClassDef):
            found = None
        elif isinstance(parent, cst.FunctionDef):
            found = parent
    if found is not None and isinstance(rule.parent(found), cst.Module):
        return found
    return None


def _in_function_or_class(node: cst.CSTNode, rule) -> bool:
    return any(isinstance(p, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) for p in rule.ancestors(node))


def _keyword_only(function: cst.FunctionDef) -> bool:
    params = function.params
    return bool(
        params.kwonly_params
        or not isinstance(params.star_arg, cst.MaybeSentinel)
        or params.star_kwarg
        or params.posonly_params
        or any(p.default is not None for p in params.params)
    )


def find_threading(
    rule,
    module: cst.Module,
    builder: Optional[cst.FunctionDef],
    built_at: int,
    sites: list[cst.CSTNode],
    entry=None,
) -> Union[list[Threaded], str]:
    """The functions to thread the scaler through, or why no threading reaches every site.
    With no `builder` the scaler is a module global built at line `built_at`: the functions
    returned need no parameter, only to be called after it exists. With `entry`, a call is
    where the scaler is in scope exactly when `entry(call)` is true (the block of one of
    several `initialize` calls, after it), and `builder` is unused."""
    functions: dict[str, list[cst.FunctionDef]] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            functions.setdefault(statement.name.value, []).append(statement)
    slots = _slots(rule)
    pending = _first_pending(rule, module, builder, built_at, sites, entry, slots)
    if isinstance(pending, str):
        return pending
    threaded: list[cst.FunctionDef] = []
    while pending:
        function = pending.pop()
        if function in threaded:
            continue
        name = function.name.value
        if len(functions.get(name, ())) != 1 or function.asynchronous or function.decorators:
            return f"`{name}` is defined more than once, decorated or async"
        threaded.append(function)
        callers = _callers(rule, module, name)
        if isinstance(callers, str):
            return callers
        if builder is not None and entry is None and function is not builder and not callers:
            return (
                f"`{name}` is called by no function of this file, so the scaler built in "
                f"`{builder.name.value}` cannot reach it"
            )
        for caller, line, call in callers:
            if entry is not None:
                why = entry(call, caller)
                if why is True:
                    continue
                if why:
                    return f"`{name}` is called at line {line}, {why}"
            if entry is None and caller is builder:
                if line <= built_at:
                    return f"`{name}` is called at line {line}, before the scaler is built"
            elif caller is None:
                return f"`{name}` is called at module level (line {line}), where no scaler is in scope"
            else:
                pending.append(caller)
    return [_threaded(rule, f, slots.get(f.name.value)) for f in threaded]


def _first_pending(
    rule,
    module: cst.Module,
    builder: Optional[cst.FunctionDef],
    built_at: int,
    sites: list[cst.CSTNode],
    entry,
    slots: dict,
) -> Union[list[cst.FunctionDef], str]:
    """The functions `find_threading` starts from: those that receive Apex's module and those
    holding a site (the builder aside); or why a site is out of the scaler's reach."""
    pending: list[cst.FunctionDef] = []
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value in slots:
            pending.append(statement)  # receives Apex's module: the scaler takes its place
    for site in sites:
        holder = top_level_function(rule, site)
        line = rule.position(site)[0]
        if holder is None and (builder is not None or entry is not None or _in_function_or_class(site, rule)):
            return f"an Apex call at line {line} is not in a module-level function"
        if holder is None and line <= built_at:
            return f"an Apex call at line {line} runs before the scaler is built"
        if holder is not None and holder is not builder and holder not in pending:
            pending.append(holder)
    return pending


def _slots(rule) -> dict:
    carriers = rule.apex.carriers if rule.apex is not None else None
    return dict(carriers.slots) if carriers is not None and carriers.refusal is None else {}


def _threaded(rule, function: cst.FunctionDef, slot) -> Threaded:
    if slot is None:
        return Threaded(function.name.value, rule.position(function)[0], _keyword_only(function))
    return Threaded(
        function.name.value, rule.position(function)[0], slot.index is None, slot.param, slot.index
    )


def _callers(rule, module: cst.Module, name: str):
    """(function around the call, line, call) for every use of `name`, or why one is no direct
    call."""
    found = []
    for node in rule.findall(module, m.Name(name), {name}):
        parent = rule.parent(node)
        if isinstance(parent, cst.FunctionDef) and parent.name is node:
            continue
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            continue
        line = rule.position(node)[0]
        if not (isinstance(parent, cst.Call) and parent.func is node):
            return f"`{name}` is used other than by a direct call at line {line}"
        if any(arg.star == "**" for arg in parent.args):
            return f"`{name}` is called with `**kwargs` at line {line}, which may hold a `scaler`"
        found.append((top_level_function(rule, parent), line, parent))
    return found
