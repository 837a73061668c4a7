"""The fp16 model of an `FP16_Optimizer` flow, for its planner (plan/fp16_optimizer.py): which
statements convert which model to fp16 (`network_to_half`, `.half()`, `FP16Model`,
`BN_convert_float`, `.type(torch.cuda.HalfTensor)`), what each keeps once the weights stay
fp32, and the fp16 values no conversion accounts for, which refuse the flow (AMP469).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
import libcst.matchers as m

from ..analysis.fp16_names import fp16_name
from ..diagnostics import Severity, define
from ..file_state import FileState
from .fp16_flow import CODE, CONVERTERS, HALF_SPELLINGS, Flow, Refused
from .planner import Planner
from .types import pure

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10; only ever read by the type checker here

CONVERSION = define(
    "AMP469",
    "fp16-model-conversion-removed",
    Severity.INFO,
    "The model's conversion to fp16 was removed: its weights stay fp32 and autocast chooses "
    "each op's precision.",
    "`network_to_half`, `.half()`, `BN_convert_float` and `FP16Model` made the fp16 model "
    "FP16_Optimizer needed. Natively the fp32 model runs under autocast. `network_to_half` "
    "wrapped the model in `nn.Sequential(tofp16(), model)` (state-dict keys `1.*`) and "
    "`FP16Model` in a module with a `network` attribute (keys `network.*`); the model is now "
    "the bare one, so old checkpoints of it need their keys renamed.",
    before="model = network_to_half(model)",
    after="# removed",
)


class Fp16Model(Planner):
    """The model-conversion part of `PlanFp16Optimizer`, and the reading helpers its parts share."""

    def __init__(self, state: FileState) -> None:
        super().__init__(state)
        self._star: set[str] = set()
        self._conversion_lines: list[cst.CSTNode] = []

    def _name(self, node: cst.CSTNode) -> Optional[str]:
        assert self.apex is not None
        return fp16_name(self.apex, node, self._star)

    def _statement(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        statements = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
        return next((p for p in self.ancestors(node) if isinstance(p, statements)), None)

    def _up_to_function(self, node: Optional[cst.CSTNode]) -> Iterator[cst.CSTNode]:
        if node is None:  # above a module-level guard: nothing
            return
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.Module)):
                return
            yield parent

    def _conversion_calls(self, module: cst.Module) -> list[cst.Call]:
        return [call for call in m.findall(module, m.Call()) if self._is_conversion(call)]

    def _conversions(self, module: cst.Module, flow: Flow) -> None:
        """Each fp16 conversion is a whole statement that converts one model (which it now keeps
        fp32); any other fp16 value refuses."""
        self._refuse_half_values(module)
        for call in self._conversion_calls(module):
            line = self._statement(call)
            if id(line) not in flow.conversions:
                self._conversion(call, line, flow)
        if not flow.models:
            raise Refused(
                flow.statement,
                "no conversion of a model to fp16 is visible in this file, so "
                "the parameters the optimizer holds may be fp16 from code the rule cannot see",
            )
        self._model_reads(module, flow.models)

    def _refuse_half_values(self, module: cst.Module) -> None:
        """An fp16 dtype (`torch.float16`, `torch.cuda.HalfTensor`) that is neither called nor the
        argument of a conversion makes fp16 values."""
        for node in m.findall(
            module,
            m.Attribute(
                value=m.Name("torch") | m.Attribute(m.Name("torch"), m.Name("cuda")),
                attr=m.OneOf(*map(m.Name, HALF_SPELLINGS)),
            ),
        ):
            parent = self.parent(node)
            converts = isinstance(parent, cst.Arg) and self._is_conversion(self.parent(parent))
            if not converts and not (isinstance(parent, cst.Call) and parent.func is node):
                raise Refused(
                    node,
                    f"`{self.code_of(node)}` makes fp16 values that fp32 weights would meet outside autocast",
                )

    def _conversion(self, call: cst.Call, line: Optional[cst.CSTNode], flow: Flow) -> None:
        """`call`, a conversion on `line`, converts a model, which the rewrite keeps fp32."""
        small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if (
            line is None
            or not isinstance(small, (cst.Assign, cst.Expr))
            or not self._within(call, small.value)
        ):
            raise Refused(
                call, f"`{self.code_of(call)}` converts to fp16 outside a statement that converts a model"
            )
        self._conversion_lines.append(line)
        self._check_condition(line, call, flow)
        stripped, prefixes = self._strip(small.value)
        if any(c is not None for c in m.findall(stripped, m.Call()) if self._is_conversion(c)):
            raise Refused(
                call,
                f"`{self.code_of(call)}` makes an fp16 value that is no model, which fp32 "
                "weights would meet outside autocast",
            )
        model = self._converted_model(call, small, stripped)
        kept = flow.conversions[id(line)] = None if CODE(model) == CODE(stripped) else stripped
        flow.models.add(CODE(model))
        kind = (
            " and its state-dict keys lose the `{}` prefix".format("`, `".join(sorted(prefixes)))
            if prefixes
            else ""
        )
        done = (
            f"`{self.code_of(small).strip()}` removed"
            if kept is None
            else f"`{self.code_of(small).strip()}` became `{CODE(small.with_changes(value=kept)).strip()}`"
        )
        flow.notes.append((line, CONVERSION, f"{done}: `{CODE(model)}` stays fp32{kind}"))

    def _converted_model(
        self, call: cst.Call, small: Union[cst.Assign, cst.Expr], stripped: cst.BaseExpression
    ) -> cst.BaseExpression:
        """The model a conversion statement converts: the name it assigns or, on a line of its
        own, the one whose methods it calls."""
        if isinstance(small, cst.Assign):
            if len(small.targets) != 1 or not pure(small.targets[0].target):
                raise Refused(call, "the converted model is not assigned to a plain name")
            return small.targets[0].target
        model = stripped
        while isinstance(model, cst.Call) and isinstance(model.func, cst.Attribute):
            model = model.func.value  # `model.cuda().half()`: `model`
        if not isinstance(model, (cst.Name, cst.Attribute)) or not pure(model):
            raise Refused(call, f"`{self.code_of(call)}` converts no model by name")
        # `model.cuda().half()` on its own line still moves the model: `model.cuda()` is kept
        return model

    def _check_condition(self, line: cst.CSTNode, call: cst.Call, flow: Flow) -> None:
        """A conversion runs unconditionally or under the wrapper's own guard: natively the model
        stays fp32 either way, which is right only where Apex's fp16 model got FP16_Optimizer."""
        conditions = [p for p in self._up_to_function(line) if isinstance(p, cst.BaseCompoundStatement)]
        if not conditions or (
            len(conditions) == 1 and flow.guarded_by(conditions[0]) and conditions[0].orelse is None
        ):
            return
        raise Refused(
            call,
            f"`{self.code_of(call)}` runs under a condition other than the one that builds "
            "the `FP16_Optimizer`",
        )

    def _within(self, node: cst.CSTNode, value: cst.CSTNode) -> bool:
        return node is value or any(a is value for a in self.ancestors(node))

    def _is_conversion(self, call: Optional[cst.CSTNode]) -> TypeGuard[cst.Call]:
        if not isinstance(call, cst.Call):
            return False
        return (
            (m.matches(call.func, m.Attribute(attr=m.Name("half"))) and not call.args)
            or self._name(call.func) in CONVERTERS
            or _half_type(call) is not None
        )

    def _strip(self, expr: cst.BaseExpression) -> tuple[cst.BaseExpression, set[str]]:
        """`network_to_half(Net().cuda())` → (`Net().cuda()`, {"1."}); `m.cuda().half()` → `m.cuda()`."""
        prefixes: set[str] = set()
        while isinstance(expr, cst.Call):
            name = self._name(expr.func)
            if (
                name in CONVERTERS
                and len(expr.args) == 1
                and expr.args[0].keyword is None
                and not expr.args[0].star
            ):
                if CONVERTERS[name]:
                    prefixes.add(CONVERTERS[name])
                expr = expr.args[0].value
            elif (
                isinstance(expr.func, cst.Attribute)
                and m.matches(expr.func, m.Attribute(attr=m.Name("half")))
                and not expr.args
            ):
                expr = expr.func.value
            elif _half_type(expr) is not None:  # `model.type(torch.cuda.HalfTensor)`: to CUDA, in fp32
                inner, more = self._strip(cst.ensure_type(expr.func, cst.Attribute).value)
                prefixes |= more
                return (
                    cst.Call(cst.Attribute(inner, cst.Name("cuda"))) if _half_type(expr) else inner
                ), prefixes
            elif isinstance(expr.func, cst.Attribute):
                inner, more = self._strip(expr.func.value)
                prefixes |= more
                return expr.with_changes(func=expr.func.with_changes(value=inner)), prefixes
            else:
                break
        return expr, prefixes

    def _model_reads(self, module: cst.Module, models: set[str]) -> None:
        """The wrapper modules had a shape of their own (`model[1]`, `model.network`); the first
        such read in the file is reported, whichever model it reads (not a set's first)."""
        for node in m.findall(module, m.Subscript() | m.Attribute(attr=m.Name("network"))):
            if isinstance(node, (cst.Subscript, cst.Attribute)) and CODE(node.value) in models:
                raise Refused(
                    node,
                    f"`{self.code_of(node)}` reads the fp16 wrapper module, which the "
                    "native model does not have",
                )


def _half_type(call: cst.Call) -> Optional[bool]:
    """`x.type(torch.cuda.HalfTensor)` → True (it also moves `x` to CUDA), `x.type(torch.HalfTensor)`
    or `x.type(torch.float16)` → False; None for any other call."""
    if not (
        m.matches(call.func, m.Attribute(attr=m.Name("type")))
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
    ):
        return None
    spelled = CODE(call.args[0].value)
    if spelled == "torch.cuda.HalfTensor":
        return True
    return False if spelled in ("torch.HalfTensor", "torch.half", "torch.float16") else None
