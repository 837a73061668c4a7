"""optimizer_alias: `opt_cls = FusedSGD` … `opt_cls(params, lr=...)` → `opt_cls = torch.optim.SGD`.

What it does
    A name bound to an Apex optimizer class (`optim_name = FusedSGD`, often after
    `optim_name = optim.SGD` and under `if args.fused:`) and only ever called becomes the torch
    class when every call through the name passes arguments the torch class takes with the
    same meaning: `FusedSGD` → `torch.optim.SGD`; `FusedAdam` → `torch.optim.AdamW` when every
    call passes `weight_decay`.

Why
    The optimizers rule rewrites calls of the Apex classes; a class stored in a variable is
    called elsewhere, so its arguments must be read at every call site through that variable.

Soundness
    The alias is rewritten only when all of the variable's bindings in its scope are plain
    assignments and every read of it is a call, so every object it creates is built by one of
    those calls. Each call must bind (no `*args`/`**kwargs`) to parameters whose meaning and
    default are the torch class's: FusedSGD's `params, lr, momentum, dampening, weight_decay,
    nesterov` are SGD's in the same order (its Apex-only switches keep torch's behaviour at
    their defaults and must not be passed); FusedAdam with `adam_w_mode` at its default is
    AdamW's update, its `lr, betas, eps` are AdamW's, and `weight_decay` must be passed at
    every call because the defaults differ (0 vs 0.01). One difference stays and is reported:
    FusedSGD zeroed gradients in `zero_grad()`; torch sets them to None.

Fix safety
    Safe where it applies; a call with other arguments, or any other use of the name
    (`isinstance(o, optim_name)`, passing it on) leaves it to the optimizers rule, which
    reports AMP504 and sends the file to the shim.

Example
    optim_name = optim.SGD
    if opt.fused:
        optim_name = FusedSGD
    optimizer = optim_name(params, lr=0.1, momentum=0.9)
becomes
    optim_name = optim.SGD
    if opt.fused:
        optim_name = functools.partial(torch.optim.SGD, fused=True)
    optimizer = optim_name(params, lr=0.1, momentum=0.9)
"""

from __future__ import annotations

import ast
import re
from typing import Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ScopeProvider

from ..diagnostics import Severity, define
from .base import Rule
from .facts import Fact

ALIASED = define(
    "AMP481",
    "optimizer-class-alias-to-torch",
    Severity.INFO,
    "A variable holding an Apex optimizer class now holds the torch class that every call "
    "through it builds the same optimizer with.",
    "`optim_name = FusedSGD` followed only by calls `optim_name(params, lr=..., momentum=...)` "
    "builds FusedSGD optimizers whose update is torch.optim.SGD's step for step with those "
    "arguments, so the variable holds `torch.optim.SGD` instead (FusedAdam: `torch.optim.AdamW`, "
    "when every call passes `weight_decay`), with `fused=True` on cuda and cpu as for a call. "
    "`zero_grad()` of torch's SGD sets gradients to None "
    "where FusedSGD zeroed them; the step is the same for every parameter that receives a "
    "gradient each iteration.",
    before="optim_name = FusedSGD\noptimizer = optim_name(params, lr=0.1, momentum=0.9)",
    after="optim_name = functools.partial(torch.optim.SGD, fused=True)\n"
    "optimizer = optim_name(params, lr=0.1, momentum=0.9)",
)

_SGD = ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov")
#: Apex class -> (torch class, positional parameters shared in order, keywords it may take,
#: keywords every call must pass)
_CLASSES = {
    "FusedSGD": ("torch.optim.SGD", _SGD, set(_SGD), set()),
    "FusedAdam": (
        "torch.optim.AdamW",
        ("params", "lr"),
        {"params", "lr", "betas", "eps", "weight_decay"},
        {"weight_decay"},
    ),
}


def _apex_class(name: Optional[str]) -> Optional[str]:
    if name is None or not name.startswith("apex.optimizers."):
        return None
    short = name.rsplit(".", 1)[-1]
    return short if short in _CLASSES else None


class OptimizerClassAlias(Rule):
    """Point a variable that only builds optimizers from an Apex class at the torch class."""

    HANDLES = tuple(f"apex.optimizers.{name}" for name in _CLASSES)
    EMITS = (ALIASED,)
    READS = frozenset({Fact.APEX_ANALYSED})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.IMPORT_REQUESTS, Fact.OPTIMIZER_ALIASES_REWRITTEN})

    MARKERS = ("Fused",)
    #: `name = FusedSGD` (or `apex.optimizers.FusedAdam`) alone on the right of an assignment
    _ALIAS = re.compile(r"=\s*(?:[\w.]+\.)?Fused(?:SGD|Adam)\s*(?:#.*)?$", re.MULTILINE)

    @classmethod
    def applies(cls, state, context) -> bool:
        return super().applies(state, context) and cls._ALIAS.search(state.original) is not None

    #: The calls through the variable spell no Apex word: `_refusal` asks for their parents.
    PARENTS_EVERYWHERE = True

    def scope_questions(self):
        # Scope is asked only about `x = <name or attribute>` targets and their bindings' reads:
        # the statements spelling such a name hold them all (base.Rule.scope_questions).
        index = self.state.index
        names = (
            None
            if index is None
            else {
                node.targets[0].id
                for node in ast.walk(index.tree)
                if isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.Name, ast.Attribute))
            }
        )
        return None if names is None else (names, names)

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self._aliases: dict[int, str] = {}  # id of the class reference in `x = FusedSGD` -> torch class

    def visit_Assign(self, node: cst.Assign) -> None:
        short = (
            _apex_class(self.apex_name(node.value))
            if isinstance(node.value, (cst.Name, cst.Attribute))
            else None
        )
        if short is None or len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        why = self._refusal(node.targets[0].target, short)
        if why is None:
            self._aliases[id(node.value)] = _CLASSES[short][0]
            self.report(
                node,
                ALIASED,
                f"`{self.code_of(node).strip()}`: every call through "
                f"`{node.targets[0].target.value}` builds what `{_CLASSES[short][0]}` builds with "
                "the same arguments",
            )

    def _refusal(self, target: cst.Name, short: str) -> Optional[str]:
        scope = self.get_metadata(ScopeProvider, target, None)
        if scope is None:
            return "no scope"
        assignments = list(scope.assignments[target.value])
        for assignment in assignments:
            node = getattr(assignment, "node", None)
            assign_target = self.parent(node) if isinstance(node, cst.Name) else None
            holder = self.parent(assign_target) if assign_target is not None else None
            if not (isinstance(holder, cst.Assign) and isinstance(assign_target, cst.AssignTarget)):
                return "bound otherwise"
        for access in {id(a.node): a.node for asg in assignments for a in asg.references}.values():
            call = self.parent(access)
            if not (isinstance(call, cst.Call) and call.func is access) or self._bad_call(call, short):
                return "used otherwise"
        return None

    @staticmethod
    def _bad_call(call: cst.Call, short: str) -> bool:
        _, positional, keywords, required = _CLASSES[short]
        given: set[str] = set()
        for i, arg in enumerate(call.args):
            if arg.star:
                return True
            if arg.keyword is None:
                if i >= len(positional):
                    return True
                given.add(positional[i])
            elif arg.keyword.value not in keywords:
                return True
            else:
                given.add(arg.keyword.value)
        return not required <= given

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._replace(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._replace(original_node, updated_node)

    def _replace(self, original_node, updated_node) -> cst.BaseExpression:
        torch_class = self._aliases.get(id(original_node))
        if torch_class is None:
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "torch")
        if self.options.device not in ("cuda", "cpu"):
            return cst.parse_expression(torch_class)
        AddImportsVisitor.add_needed_import(self.context, "functools")
        return cst.parse_expression(f"functools.partial({torch_class}, fused=True)")
