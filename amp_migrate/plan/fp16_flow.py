"""What the parts of the `FP16_Optimizer` planner share: Apex's names and signatures, the
flow as it is followed (`Flow`), and the refusal that ends it (`Refused`).

plan/fp16_optimizer.py follows the wrapper, plan/fp16_model.py the model's conversions to
fp16, plan/fp16_scale.py the loss scale; rules/fp16_optimizer.py reads the signatures to
rewrite the calls. This module decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m

from ..analysis.fp16_names import PACKAGE
from ..diagnostics import Code
from .types import Fp16OptimizerPlan, TrainingPlan

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10; only ever read by the type checker here

FP16_OPTIMIZER = f"{PACKAGE}.FP16_Optimizer"
CONVERTERS = {
    f"{PACKAGE}.network_to_half": "1.",
    f"{PACKAGE}.FP16Model": "network.",
    f"{PACKAGE}.BN_convert_float": "",
}
FP16_OPTIMIZER_ARGS = (
    "init_optimizer",
    "static_loss_scale",
    "dynamic_loss_scale",
    "dynamic_loss_args",
    "verbose",
)
DYNAMIC_KEYS = ("init_scale", "scale_factor", "scale_window", "min_loss_scale", "max_loss_scale")
METHODS = ("backward", "step", "zero_grad", "clip_master_grads")
BACKWARD_ARGS = ("loss", "update_master_grads", "retain_graph")  # FP16_Optimizer.backward's parameters
PROXIED = ("param_groups", "state")  # FP16_Optimizer forwards these to the optimizer it wraps
HALF_SPELLINGS = ("float16", "half", "HalfTensor")
CODE = cst.Module([]).code_for_node


class Refused(Exception):
    """The flow has no native form amp-migrate can prove: `node` is where, `why` says why."""

    def __init__(self, node: cst.CSTNode, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


@dataclass
class Flow:
    """The flow as the planner follows it, keyed by ids of the nodes of the tree it reads;
    frozen into an `Fp16OptimizerPlan` once every check passed."""

    target: str
    statement: cst.SimpleStatementLine
    inner: cst.BaseExpression
    scaler: str = "scaler"
    scaler_call: Optional[cst.Call] = None
    backwards: dict[int, cst.Call] = field(default_factory=dict)  # statement -> backward call
    steps: list[cst.Call] = field(default_factory=list)
    clips: dict[int, cst.Call] = field(default_factory=dict)  # statement -> clip call
    calls: set[int] = field(default_factory=set)  # zero_grad / clip calls to rewrite
    unwraps: set[int] = field(default_factory=set)  # `optimizer.optimizer`
    scale_reads: set[int] = field(default_factory=set)  # `optimizer.loss_scale`
    conversions: dict[int, Optional[cst.BaseExpression]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    regions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    notes: list[tuple[cst.CSTNode, Code, Optional[str]]] = field(default_factory=list)
    #: `if args.fp16:` around the wrapper: the GradScaler is built before it with `enabled=`
    guard: Optional[cst.If] = None
    dropped_ifs: set[int] = field(default_factory=set)  # `if` statements left with nothing in them

    @property
    def target_node(self) -> cst.BaseAssignTargetExpression:
        """The wrapper's name where `statement` binds it (`_flow_of` checked the shape)."""
        return cst.ensure_type(self.statement.body[0], cst.Assign).targets[0].target

    def guarded_by(self, node: Optional[cst.CSTNode]) -> TypeGuard[cst.If]:
        """`node` is an `if` on the wrapper's own guard."""
        return (
            self.guard is not None and isinstance(node, cst.If) and CODE(node.test) == CODE(self.guard.test)
        )

    def plan(self, module: cst.Module, training: TrainingPlan) -> Fp16OptimizerPlan:
        """What the rewrite needs of the flow, frozen (the steps and models go into `training`)."""
        return Fp16OptimizerPlan(
            module=module,
            training=training,
            target=self.target,
            statement=self.statement,
            inner=self.inner,
            guard=self.guard,
            backwards=dict(self.backwards),
            clips=dict(self.clips),
            calls=frozenset(self.calls),
            unwraps=frozenset(self.unwraps),
            scale_reads=frozenset(self.scale_reads),
            conversions=dict(self.conversions),
            regions={block: tuple(spans) for block, spans in self.regions.items()},
            dropped_ifs=frozenset(self.dropped_ifs),
        )


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, spaced as a keyword argument is."""
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )


def reads(node: cst.CSTNode) -> set[str]:
    """Names and dotted attributes an expression or statement reads (`loss`, `self.model`)."""
    found: set[str] = set()
    for name in m.findall(node, m.Name() | m.Attribute()):
        found.add(CODE(name))
    return found


def assigned(statement: cst.CSTNode) -> set[str]:
    """What a statement assigns, anywhere in it (targets of `=`, `+=`, `for`, `with ... as`)."""
    targets = m.findall(statement, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For() | m.WithItem())
    out: set[str] = set()
    for node in targets:
        target: Optional[cst.BaseExpression]
        if isinstance(node, cst.WithItem):
            target = node.asname.name if node.asname is not None else None
        else:  # `AssignTarget`, `AugAssign`, `AnnAssign`, `For`: each has a `target`
            target = getattr(node, "target", None)
        if target is not None:
            out |= {CODE(t) for t in m.findall(target, m.Name() | m.Attribute())}
    return out
