"""The GradScaler an `FP16_Optimizer(...)` call's loss scale becomes, for the `FP16_Optimizer`
planner (plan/fp16_optimizer.py): a static scale, Apex's dynamic schedule, or a choice between
them made at run time, each with the note that says how it maps (AMP467, AMP468).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ..analysis.call_args import NOT_LITERAL
from ..diagnostics import Severity, define
from ..options import Options
from .fp16_flow import CODE, DYNAMIC_KEYS, FP16_OPTIMIZER_ARGS, Flow, Refused, keyword
from .options import STATIC_GROWTH_INTERVAL
from .types import bind_arguments, literal, pure

STATIC = define(
    "AMP467",
    "fp16-optimizer-static-scale",
    Severity.INFO,
    "`FP16_Optimizer`'s static loss scale became a GradScaler that starts there and never grows; "
    "it differs from Apex only on a step whose gradients are not finite.",
    "A static scale S never changed and never skipped a step. `init_scale=S, "
    "growth_interval=2**31 - 1` scales and unscales by the same S while gradients are finite; "
    "on a step with inf/NaN gradients Apex applied them (the weights became non-finite), "
    "GradScaler skips the step and halves its scale (as for AMP111). The default static scale "
    "1.0 scales nothing, so the GradScaler is disabled, which is exact.",
    before="optimizer = FP16_Optimizer(optimizer, static_loss_scale=128.0)",
    after='scaler = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=2**31 - 1)',
)
DYNAMIC = define(
    "AMP468",
    "fp16-optimizer-dynamic-scale",
    Severity.INFO,
    "`FP16_Optimizer`'s dynamic loss scaler became a GradScaler with the same schedule.",
    'With `dynamic_loss_scale=True` FP16_Optimizer uses Apex\'s amp `LossScaler("dynamic")` '
    "(not the legacy `DynamicLossScaler`): it starts at `min(init_scale, max_loss_scale)` "
    "(2**16 and 2**24 by default), halves the scale and skips the step on an overflow and "
    "doubles it after `scale_window` (2000) clean steps. GradScaler's `init_scale`, "
    "`backoff_factor=0.5`, `growth_factor=2.0` and `growth_interval` do the same. "
    "`scale_factor` was ignored by Apex and is dropped; `min_loss_scale`/`max_loss_scale` bounds "
    "have no GradScaler equivalent (its scale is unbounded).",
    before="optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True,\n"
    '                           dynamic_loss_args={"scale_window": 500})',
    after='scaler = torch.amp.GradScaler("cuda", growth_interval=500)',
)


def scaler_call(call: cst.Call, flow: Flow, options: Options) -> cst.Call:
    """`torch.amp.GradScaler(...)` with the schedule of the `FP16_Optimizer(...)` `call` (the
    notes saying how go into `flow`); refuses a scale it cannot follow."""
    args = bind_arguments(call, FP16_OPTIMIZER_ARGS) or {}
    scaler_args = [cst.Arg(cst.SimpleString(f'"{options.device}"'))]
    if not options.needs_loss_scaling:  # bfloat16: no scaling at all
        return _built(scaler_args + [keyword("enabled", cst.Name("False"))], None, None)
    dynamic = args.get("dynamic_loss_scale")
    dynamic_value = literal(dynamic) if dynamic is not None else False
    static = args.get("static_loss_scale")
    static_value = literal(static) if static is not None else 1.0
    for node, value in ((dynamic, dynamic_value), (static, static_value)):
        if value is NOT_LITERAL and node is not None and not pure(node):  # an absent one is None
            raise Refused(node, f"`{CODE(node)}` is an expression with side effects")
    init, window = (
        _dynamic_schedule(args.get("dynamic_loss_args"), flow) if dynamic_value is not False else (None, None)
    )
    if dynamic is not None and dynamic_value is not NOT_LITERAL and dynamic_value:
        flow.notes.append((dynamic, DYNAMIC, None))
        return _built(scaler_args, init, window)
    if isinstance(static_value, (int, float)) and not isinstance(static_value, bool):
        if not 0.0 < static_value < float("inf"):
            assert static is not None  # the default, 1.0, is a usable scale
            raise Refused(static, f"`static_loss_scale={static_value!r}` is no usable scale")
        if static_value == 1.0 and dynamic_value is False:
            flow.notes.append(
                (
                    static or call,
                    STATIC,
                    "a static loss scale of 1.0 scaled nothing: the "
                    "GradScaler is disabled, exactly as Apex neither scaled nor skipped",
                )
            )
            return _built(scaler_args + [keyword("enabled", cst.Name("False"))], None, None)
    elif static_value is not NOT_LITERAL:
        assert static is not None  # the default, 1.0, is a number
        raise Refused(static, f"`static_loss_scale={static_value!r}` is no number")
    static_expr = static if static is not None else cst.Float("1.0")
    flow.notes.append((static if static is not None else call, STATIC, None))
    never = cst.parse_expression(STATIC_GROWTH_INTERVAL)
    if dynamic_value is False:
        return _built(scaler_args, static_expr, never)
    assert dynamic is not None  # an absent `dynamic_loss_scale` is False
    flow.notes.append(
        (
            dynamic,
            DYNAMIC,
            f"`{CODE(dynamic)}` chooses at run time between "
            "Apex's dynamic scaler and the static scale; the GradScaler's arguments follow it",
        )
    )
    return _built(
        scaler_args,
        _if(dynamic, init or cst.Float("65536.0"), static_expr),
        _if(dynamic, window or cst.Integer("2000"), never),
    )


def _built(
    args: list[cst.Arg], init: Optional[cst.BaseExpression], window: Optional[cst.BaseExpression]
) -> cst.Call:
    if init is not None:
        args.append(keyword("init_scale", init))
    if window is not None:
        args.append(keyword("growth_interval", window))
    return cst.Call(cst.parse_expression("torch.amp.GradScaler"), args)


def _dynamic_schedule(
    node: Optional[cst.BaseExpression], flow: Flow
) -> tuple[Optional[cst.BaseExpression], Optional[cst.BaseExpression]]:
    """(init_scale, growth_interval) expressions for `dynamic_loss_args` (None: the default)."""
    if node is None or literal(node) is None:
        return None, None
    if not isinstance(node, cst.Dict) or any(not isinstance(e, cst.DictElement) for e in node.elements):
        raise Refused(node, "`dynamic_loss_args` is not a literal dict")
    given: dict[str, cst.BaseExpression] = {}
    for element in [e for e in node.elements if isinstance(e, cst.DictElement)]:  # every one, as checked
        key = literal(element.key)
        if key not in DYNAMIC_KEYS:
            raise Refused(element, f"`dynamic_loss_args` key {key!r} is not one Apex's LossScaler takes")
        if not pure(element.value):
            raise Refused(element.value, f"`{CODE(element.value)}` has side effects")
        given[key] = element.value
    for dropped in ("scale_factor", "min_loss_scale", "max_loss_scale"):
        if dropped in given:
            flow.notes.append(
                (
                    given[dropped],
                    DYNAMIC,
                    f"`{dropped}` has no GradScaler equivalent and was "
                    "dropped" + (" (Apex ignored it too)" if dropped == "scale_factor" else ""),
                )
            )
    cap = given.get("max_loss_scale", cst.parse_expression("2.0**24"))
    init = given.get("init_scale")
    start: Optional[cst.BaseExpression]
    if init is None and "max_loss_scale" not in given:
        start = None
    else:
        values = [literal(init) if init is not None else 2.0**16, literal(cap)]
        start = (
            cst.Float(repr(float(min(values))))
            if NOT_LITERAL not in values
            else cst.Call(
                cst.Name("min"),
                [
                    cst.Arg(
                        init or cst.Float("65536.0"),
                        comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                    ),
                    cst.Arg(cap),
                ],
            )
        )
    return start, given.get("scale_window")


def _if(test: cst.BaseExpression, yes: cst.BaseExpression, no: cst.BaseExpression) -> cst.IfExp:
    return cst.IfExp(
        test=test.deep_clone(), body=yes, orelse=no, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
    )
