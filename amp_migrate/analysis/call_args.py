"""What the rules that replace Apex calls share: argument binding and rebuilt calls.

Apex's classes (`FusedAdam`, `DistributedDataParallel`, `FusedLayerNorm`) and `amp.initialize`
are replaced by torch calls only when their arguments say provably what the torch call needs,
so every such rule reads arguments the same way: matched to the Apex signature by name, and
judged by their literal value where they have one (`2**24`, `128 * 128`, `(0.9, 0.999)`,
`"dynamic"`), with one marker, `NOT_LITERAL`, for everything known only at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import libcst as cst

from .literals import NOT_LITERAL, literal


def dotted(name: str) -> Union[cst.Name, cst.Attribute]:
    return cst.parse_expression(name)  # type: ignore[return-value]  # a dotted name parses to one of these


@dataclass
class Bound:
    """A call's arguments matched to a signature by parameter name."""

    args: dict[str, cst.Arg] = field(default_factory=dict)
    problem: Optional[str] = None  # why the call cannot be matched, if it cannot

    def value(self, name: str) -> Optional[cst.BaseExpression]:
        arg = self.args.get(name)
        return None if arg is None else arg.value

    def is_(self, name: str, *allowed: Any) -> bool:
        """The argument is absent or a literal equal to one of `allowed`."""
        if name not in self.args:
            return True
        value = literal(self.value(name))
        return value is not NOT_LITERAL and any(_same(value, a) for a in allowed)


def _same(value: Any, allowed: Any) -> bool:
    """Flags compare by truth, as Apex reads them (`1 if adam_w_mode else 0`); numbers by value."""
    if isinstance(allowed, bool):
        return isinstance(value, (bool, int, float)) and bool(value) is allowed
    if allowed is None or value is None:
        return value is allowed
    return not isinstance(value, bool) and value == allowed


def bind(call: cst.Call, signature: Sequence[str]) -> Bound:
    """Match `call`'s arguments to `signature` (positional-or-keyword names, in order)."""
    bound = Bound()
    for index, arg in enumerate(call.args):
        if arg.star:
            bound.problem = f"`{arg.star}` arguments cannot be checked"
            return bound
        if arg.keyword is None:
            if index >= len(signature):
                bound.problem = f"it takes at most {len(signature)} positional arguments"
                return bound
            name = signature[index]
        else:
            name = arg.keyword.value
            if name not in signature:
                bound.problem = f"`{name}` is not one of its arguments"
                return bound
        if name in bound.args:
            bound.problem = f"`{name}` is given twice"
            return bound
        bound.args[name] = arg
    return bound


def as_keyword(arg: cst.Arg, name: str) -> cst.Arg:
    if arg.keyword is not None and arg.keyword.value == name:
        return arg
    return arg.with_changes(
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def new_keyword(name: str, value: str) -> cst.Arg:
    return as_keyword(cst.Arg(cst.parse_expression(value)), name)


def rebuild_call(
    call: cst.Call,
    func: str,
    bound: Bound,
    signature: Sequence[str],
    keep: Sequence[str],
    extra: Sequence[cst.Arg] = (),
) -> cst.Call:
    """`call` as a call of `func`: the arguments named in `keep`, in their original order, then
    `extra`. A positional argument stays positional only where `signature` (the new callee's)
    has it at the same place; commas, line breaks and comments of the kept arguments stay."""
    position = {id(arg): i for i, arg in enumerate(call.args)}
    kept = sorted((bound.args[n] for n in keep if n in bound.args), key=lambda a: position[id(a)])
    args: list[cst.Arg] = []
    positional = True
    for arg in kept:
        name = next(n for n, a in bound.args.items() if a is arg)
        if arg.keyword is None and positional and len(args) < len(signature) and signature[len(args)] == name:
            args.append(arg)
            continue
        positional = False
        args.append(as_keyword(arg, name))
    args.extend(extra)
    if not args:
        return call.with_changes(func=dotted(func), args=())
    last = call.args[-1] if call.args else None
    separator = next(
        (a.comma for a in call.args[:-1] if isinstance(a.comma, cst.Comma)), cst.MaybeSentinel.DEFAULT
    )
    out = []
    for i, arg in enumerate(args):
        if i == len(args) - 1:
            arg = arg.with_changes(
                comma=last.comma if last is not None else cst.MaybeSentinel.DEFAULT,
                whitespace_after_arg=last.whitespace_after_arg
                if last is not None
                else cst.SimpleWhitespace(""),
            )
        elif (last is not None and arg.value is last.value) or not isinstance(arg.comma, cst.Comma):
            arg = arg.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
        out.append(arg)
    return call.with_changes(func=dotted(func), args=out)
