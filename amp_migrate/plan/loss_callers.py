"""A function that scales the loss it is given: the forwards that made the loss are in its callers.

Training scripts often keep the backward and the step in a helper,
`def optimizer_step(loss, optimizer, model, args, is_update=True)`, that the loop calls right
after its forward: `loss = model(x).mean(); optimizer_step(loss / acc, optimizer, model, args)`.
Apex's O1 cast every torch function from `initialize` on, so that forward ran in mixed precision
without the helper saying so. Native autocast must surround the forward, so the region goes
around it in each caller, as if the `scale_loss` stood there; the helper keeps the scaled
backward, and the scaler reaches it the way every scaler site is reached (a `scaler` parameter
threaded through the callers, or the global).

That is sound only where every run of the helper's `scale_loss` scales a loss one of those
callers computed under the new region: the helper is a module-level function defined once,
undecorated, whose loss is one of its parameters that its body never rebinds, every use of its
name in the file is a direct call (never a value handed on, `functools.partial`, a callback, a
call from a lambda or a comprehension), at least one such call is in the file, each call binds
that parameter to a side-effect-free expression (no call that could run the forward after the
region ends) of locals the caller assigned before the call, and the caller reaches the scaler
the autocast reads. Anything else falls back (AMP205 for a call site, AMP206 for the function),
with the place. This module holds no rule; ScaleLossToGradScaler asks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m

from ..diagnostics import Code, Severity, define
from .types import pure

CALLER_LOSS_UNPROVEN = define(
    "AMP205",
    "caller-loss-not-from-forward",
    Severity.WARNING,
    "A call of the function that scales the loss it is given passes a loss that is not computed "
    "before the call in the caller, so there is no forward to put under autocast there.",
    "The function's `scale_loss` scales its loss parameter; the forward that made the loss is in "
    "each caller, and native autocast must surround it there, as Apex's O1 casts did. At this "
    "call the argument is not an expression of locals the caller assigned before it (it is a "
    "parameter of the caller, an attribute set elsewhere, a call that would run after the "
    "region, the parameter's default, or arguments given as `*args`/`**kwargs`), or the caller "
    "cannot reach the scaler autocast reads, so the file uses the shim. Compute the loss in a "
    "local right before the call to migrate it natively. "
    "The message names the loss given to the call and what it is instead.",
    before="def step(loss, opt):\n    with amp.scale_loss(loss, opt) as s:\n        s.backward()\n"
    "def train(batch_loss, opt):\n    step(batch_loss, opt)",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="a caller hands on a loss whose forward it does not show",
    variants=(
        "not computed before the call in the caller",
        "the loss given to",
    ),
    fallback_title="a helper that scales the loss it is given, with callers that cannot be followed",
    shape=(
        "A helper such as `def optimizer_step(loss, optimizer, model, args, is_update=True)` holds the "
        "`scale_loss` (and the step under `if is_update:`), and the loop calls it right after its forward. "
        "That is native where every use of the function in the file is a direct call passing, as the loss, "
        "an expression of locals the caller assigned before the call (autocast then goes around each "
        "caller's forward, AMP207). It falls back where a call passes a loss the caller was given itself (a "
        "parameter: the forward is further up), an attribute, a call (`step(criterion(model(x), y), opt)`: "
        "the forward would run after the region), the parameter's default, or `*args`/`**kwargs`, or where "
        "the caller cannot reach the scaler autocast reads."
    ),
    fallback_why=(
        "Apex O1 cast every forward from `initialize` on, wherever it ran. Natively each forward whose loss "
        "the function scales must be inside `torch.autocast`; a caller the file does not show, or a forward "
        "that runs inside the call's own arguments, would train in fp32 while its loss is scaled and stepped "
        "as if mixed precision had made it."
    ),
    by_hand=(
        "Compute the loss in a local right before the call (`loss = criterion(model(x), y)`, then "
        "`step(loss, opt)`), and call the function directly; or wrap the forward in each caller yourself and "
        "replace the `scale_loss` by `scaler.scale(loss).backward()`."
    ),
)
CALLED_OTHERWISE = define(
    "AMP206",
    "loss-helper-not-only-called",
    Severity.WARNING,
    "The function that scales the loss it is given is used other than by direct calls in this "
    "file (handed on as a value, called from a lambda or a comprehension, decorated, defined "
    "twice, or never called here), so not every forward that makes its loss can be put under "
    "autocast.",
    "Native autocast goes around the forward in each caller of the function; a caller that this "
    "file does not show (another module, a callback registry, `functools.partial`) would run its "
    "forward in fp32 where Apex's O1 cast it, so the file uses the shim. Call the function "
    "directly from the training loop to migrate it natively. "
    "The message says which case this is: the function is used other than by a direct call, is "
    "called from a lambda or a comprehension (where no statement of a block holds the forward), is "
    "not called in this file, or is also named in another module of the tree, whose calls of it "
    "would run their forward outside autocast.",
    before="def step(loss, opt):\n    with amp.scale_loss(loss, opt) as s:\n        s.backward()\n"
    "trainer = Trainer(backward_fn=step)",
    after="# unchanged, imports point at amp_shim",
    falls_back=True,
    refusal="the function that scales a given loss has callers the file does not show",
    variants=(
        "used other than by a direct call",
        "is called",
        "is not called in this file",
        "is also named in",
    ),
    fallback_title="a helper that scales the loss it is given, with callers that cannot be followed",
    shape=(
        "A helper such as `def optimizer_step(loss, optimizer, ...)` holds the `scale_loss`; that is native "
        "where every use of the function in the file is a direct call passing a loss its caller computed "
        "before the call (AMP207). It falls back where the function is handed on as a value "
        "(`Trainer(backward_fn=step)`, `functools.partial`), called from a lambda or a comprehension, "
        "decorated, defined twice, or never called in the file (its callers are in other modules; a method's "
        "loss parameter is AMP202)."
    ),
    fallback_why=(
        "Apex O1 cast every forward from `initialize` on, wherever it ran. Natively each forward whose loss "
        "the function scales must be inside `torch.autocast`; a caller the file does not show, or a forward "
        "that runs inside the call's own arguments, would train in fp32 while its loss is scaled and stepped "
        "as if mixed precision had made it."
    ),
    by_hand=(
        "Compute the loss in a local right before the call (`loss = criterion(model(x), y)`, then "
        "`step(loss, opt)`), and call the function directly; or wrap the forward in each caller yourself and "
        "replace the `scale_loss` by `scaler.scale(loss).backward()`."
    ),
)
CALLERS_CAST = define(
    "AMP207",
    "autocast-in-callers",
    Severity.INFO,
    "The loss is a parameter of this function: autocast goes around the forward in each of its callers.",
    "Every call of the function in the file passes a loss the caller computed right before it, "
    "so each caller's forward (from its first use of an `initialize`d model, or the statements "
    "the loss comes from, to the loss) runs under `torch.autocast`, and the function scales the "
    "loss with the GradScaler. Apex's O1 cast those forwards from `initialize` on. A caller in "
    "another module cannot be seen from this file alone (it would run its forward in fp32); "
    "migrating the tree (`amp-migrate PATH`) moves the file to the shim where another module "
    "names the function (AMP206). "
    "The message gives the line of each call: autocast covers the forward before its call there.",
    variants=("covers the forward before its call",),
)


@dataclass(frozen=True)
class CallerSite:
    """One call of the function: the call, the statement of its block that holds it, and the
    expression it passes as the loss."""

    call: cst.Call
    statement: cst.CSTNode
    loss: cst.BaseExpression


@dataclass(frozen=True)
class Refused:
    node: cst.CSTNode
    code: Code
    reason: str


def _innermost_function(rule, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    for parent in rule.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return parent if isinstance(parent, cst.FunctionDef) else None
    return None


def loss_parameter(
    rule, node: cst.CSTNode, loss: cst.BaseExpression, assigned
) -> Optional[tuple[cst.FunctionDef, str, Optional[int]]]:
    """(function, parameter, position or None for keyword-only) where `loss` is a parameter
    of the module-level function around `node` that its body never rebinds (`assigned(stmt)`
    names what a statement assigns); None otherwise, which AMP202 reports (a method's callers
    reach it through `self` or a framework's hooks, which this file may not show)."""
    if not isinstance(loss, cst.Name):
        return None
    function = _innermost_function(rule, node)
    if function is None or not isinstance(rule.parent(function), cst.Module):
        return None
    params = function.params
    positional = [*params.posonly_params, *params.params]
    index = next((i for i, p in enumerate(positional) if p.name.value == loss.value), None)
    if index is None and not any(p.name.value == loss.value for p in params.kwonly_params):
        return None
    if any(loss.value in assigned(stmt) for stmt in function.body.body):
        return None
    return function, loss.value, index


def function_refusal(rule, function: cst.FunctionDef) -> Optional[str]:
    """Why the function's callers cannot all be seen from its own definition, or None."""
    name = function.name.value
    if function.decorators or function.asynchronous:
        return f"`{name}` is decorated or async"
    same = [s for s in rule.parent(function).body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    if len(same) != 1:
        return f"`{name}` is defined more than once"
    return None


_OWN_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _statement_of(rule, node: cst.CSTNode) -> Union[cst.CSTNode, str]:
    """The statement of a block that holds `node`, or why it is in its own scope."""
    current = node
    while True:
        parent = rule.parent(current)
        if parent is None:
            return "its place in the file is unknown"
        if isinstance(parent, _OWN_SCOPES):
            return "from a lambda or a comprehension"
        if isinstance(parent, (cst.IndentedBlock, cst.Module)):
            return current
        current = parent


def _bound_loss(call: cst.Call, parameter: str, index: Optional[int]) -> Union[cst.BaseExpression, str]:
    if any(a.star for a in call.args):
        return "arguments are given as `*args`/`**kwargs`"
    for position, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == parameter:
            return arg.value
        if arg.keyword is None and position == index:
            return arg.value
    return f"`{parameter}` is left to its default"


def caller_sites(
    rule, module: cst.Module, function: cst.FunctionDef, parameter: str, index: Optional[int]
) -> Union[list[CallerSite], Refused]:
    """Every call of `function` in the file with the loss it passes, or the first reason one
    cannot be followed (AMP206 for the function, AMP205 for a call's loss)."""
    name = function.name.value
    why = function_refusal(rule, function)
    if why is not None:
        return Refused(function, CALLED_OTHERWISE, why)
    sites: list[CallerSite] = []
    for node in rule.findall(module, m.Name(name), {name}):
        parent = rule.parent(node)
        if (
            parent is function
            or (isinstance(parent, cst.Arg) and parent.keyword is node)
            or (isinstance(parent, cst.Attribute) and parent.attr is node)
        ):
            continue
        if not (isinstance(parent, cst.Call) and parent.func is node):
            return Refused(node, CALLED_OTHERWISE, f"`{name}` is used other than by a direct call")
        statement = _statement_of(rule, parent)
        if isinstance(statement, str):
            return Refused(parent, CALLED_OTHERWISE, f"`{name}` is called {statement}")
        loss = _bound_loss(parent, parameter, index)
        if isinstance(loss, str):
            return Refused(parent, CALLER_LOSS_UNPROVEN, f"the loss given to `{name}` here: {loss}")
        if not pure(loss):
            return Refused(
                loss,
                CALLER_LOSS_UNPROVEN,
                f"the loss given to `{name}` here, "
                f"`{rule.code_of(loss)}`, is computed by a call after the forward's region would end",
            )
        sites.append(CallerSite(parent, statement, loss))
    if not sites:
        return Refused(function, CALLED_OTHERWISE, f"`{name}` is not called in this file")
    return sites


def calls_any(statement: cst.CSTNode, names: frozenset[str]) -> bool:
    """Whether the statement calls one of the functions `names` (a backward of its own)."""
    return bool(names) and bool(
        m.findall(statement, m.Call(func=m.Name(m.MatchIfTrue(lambda v: v in names))))
    )


def _roots(expr: cst.CSTNode) -> set[str]:
    """The names an expression starts its reads from (`scaler` in `scaler.is_enabled()`)."""
    found: set[str] = set()

    class Roots(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

    expr.visit(Roots())
    return found


def autocast_reaches(rule, plan, site: CallerSite) -> Optional[str]:
    """Why the autocast the plan opens at this call would read a name the caller does not
    have, or None. `initialize`'s function has every name its expressions read; elsewhere only
    the scaler is read (`enabled=scaler.is_enabled()`), which a module-level or shared scaler
    gives every function and a threaded one gives the functions that receive it."""
    line = rule.position(site.call)[0]
    here = plan.at(line)
    caller = _innermost_function(rule, site.call)
    caller_line = rule.position(caller)[0] if caller is not None else 0
    if caller_line == here.init_scope:
        return None
    scaler_root = plan.scaler.split(".")[0]
    threaded = {t.name for t in plan.threaded}
    for root in sorted(_roots(here.autocast_call) - {"torch"}):
        if root == scaler_root and (
            plan.shared is not None
            or (plan.placement == "module" and not plan.parts)
            or (plan.placement == "threaded" and caller is not None and caller.name.value in threaded)
        ):
            continue
        return (
            f"its autocast reads `{root}`, which `{caller.name.value if caller else '<module>'}` "
            f"(line {line}) does not have"
        )
    return None
