"""Where the forward of a scaled backward is, and how it goes under `torch.autocast`.

Apex cast the whole forward that made a loss; natively that forward runs under `with
torch.autocast(...)`. Both ways into the native recipe (amp's `scale_loss`, rules/scale_loss.py,
and `FP16_Optimizer.backward`, plan/fp16_optimizer.py) place that region alike: climb from the
backward's statement through the blocks around it to the one where the loss was last assigned
before it, start the region after the last earlier backward of that block (a loss computed
before an earlier backward shares that one's forward) and end it at the loss; then, when the
blocks are rebuilt, wrap each (merged) span of statements in one `with`. What counts as an
assignment, a backward or a model's use differs between the two, so each caller passes its
own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import AbstractSet, Optional, Union, cast

import libcst as cst
import libcst.matchers as m

#: What a block holds: `IndentedBlock.body` is typed `BaseStatement`, whose only kinds these are.
Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]
Block = Union[cst.IndentedBlock, cst.Module]


#: Model methods that set a mode or clear gradients rather than run the forward pass.
HOUSEKEEPING = ("zero_grad", "train", "eval", "to", "cuda", "cpu", "requires_grad_")
_HOUSEKEEPING_CALL = m.Expr(m.Call(func=m.Attribute(attr=m.OneOf(*map(m.Name, HOUSEKEEPING)))))


def housekeeping_only(statement: cst.CSTNode, models: AbstractSet[str]) -> bool:
    """The statement is a line of `model.train()`, `model.zero_grad()`, ... calls on `models`
    only: it reads a model without running its forward, so a region need not start there."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        m.matches(s, _HOUSEKEEPING_CALL)
        and cst.Module([]).code_for_node(
            cst.ensure_type(
                cst.ensure_type(cst.ensure_type(s, cst.Expr).value, cst.Call).func, cst.Attribute
            ).value
        )
        in models
        for s in statement.body
    )


def loss_block(
    statement: cst.CSTNode,
    loss_names: AbstractSet[str],
    assigned: Callable[[cst.CSTNode], AbstractSet[str]],
    parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]],
    statement_around: Callable[[cst.CSTNode], Optional[cst.CSTNode]],
) -> Optional[tuple[Block, list[cst.BaseStatement], int]]:
    """(block, its statements, index of the last one before `statement`'s that assigns one of
    `loss_names`), in the innermost block around `statement` that has one, climbing only
    through compound statements in the same iteration (`statement_around`); None where the
    loss is not computed there."""
    current = statement
    while True:
        block = parent(current)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None
        body = list(block.body)
        at = next(i for i, s in enumerate(body) if s is current)
        last = next((i for i in range(at - 1, -1, -1) if assigned(body[i]) & loss_names), None)
        if last is not None:
            return block, body, last
        owner = statement_around(block)
        if owner is None:
            return None
        current = owner


def region_start(
    body: Sequence[cst.BaseStatement], last: int, backward: Callable[[cst.CSTNode], bool]
) -> int:
    """The first statement of `body` after the last one before `body[last]` that runs a
    backward (0: none does): the forward of the loss assigned at `last` starts there at the
    earliest."""
    return next((i + 1 for i in range(last - 1, -1, -1) if backward(body[i])), 0)


def merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of statement indices, sorted, with overlapping or adjacent ones joined: two
    regions that meet become one `with`."""
    out: list[list[int]] = []
    for first, last in sorted(spans):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return [(a, b) for a, b in out]


def wrap_spans(
    count: int,
    spans: Iterable[tuple[int, int]],
    autocast_at: Callable[[int], cst.Call],
    inside: Callable[[int], Sequence[cst.BaseStatement]],
    outside: Callable[[int], Sequence[cst.BaseStatement]],
) -> list[cst.BaseStatement]:
    """A block's `count` statements rebuilt: each merged span under `with <autocast_at(first)>:`
    (a copy), holding what `inside(k)` gives for each of its statements and taking the first
    one's leading lines; every other statement `k` becomes `outside(k)`."""
    starts = dict(merged(spans))
    out: list[cst.BaseStatement] = []
    i = 0
    while i < count:
        if i in starts:
            last = starts[i]
            inner = [s for k in range(i, last + 1) for s in inside(k)]
            lead = cast(Statement, inner[0]).leading_lines
            inner[0] = inner[0].with_changes(leading_lines=())
            out.append(
                cst.With(
                    items=[cst.WithItem(autocast_at(i).deep_clone())],
                    body=cst.IndentedBlock(body=inner),
                    leading_lines=lead,
                )
            )
            i = last + 1
            continue
        out.extend(outside(i))
        i += 1
    return out
