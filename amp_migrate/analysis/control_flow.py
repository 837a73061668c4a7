"""What the rules that place scaler calls need to know about control flow inside one iteration.

GradScaler has invariants Apex did not: `unscale_` at most once per optimizer between two
`update()`s, `step` at most once, and `update()` only after a `step` or `unscale_` recorded
its overflow check. Whether generated calls keep them depends on which statements run on every
path, not on their order in the text, so the placement rules ask these questions of the tree:
does a statement leave the iteration early, does a test decide on finiteness, which tests guard
a block. They are read on the statements of one function body at a time, never across a loop,
function or class boundary (what `Rule.statement_around` also respects).
"""

from __future__ import annotations

import re
from typing import Iterator

import libcst as cst
import libcst.matchers as m

from .binding import children, find

#: Calls that test whether values are finite: the guards people put around a step after an
#: overflow (`if torch.isfinite(grad_norm): opt.step()`, `if math.isnan(loss): continue`).
_FINITENESS = re.compile(r"\b(isfinite|isnan|isinf|isposinf|isneginf|nan_to_num)\b")
_CODE = cst.Module([]).code_for_node

BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
STEP = m.Call(func=m.Attribute(attr=m.Name("step")))


def tests_finiteness(test: cst.BaseExpression) -> bool:
    return _FINITENESS.search(_CODE(test)) is not None


def exits_early(statement: cst.CSTNode) -> bool:
    """Whether running `statement` can leave the enclosing iteration or function before the
    statements after it run: `continue`/`break` not owned by a loop inside it, `return`, `raise`
    (outside nested functions and classes)."""

    def search(node: cst.CSTNode, in_loop: bool) -> bool:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(node, (cst.Return, cst.Raise)):
            return True
        if isinstance(node, (cst.Continue, cst.Break)):
            return not in_loop
        if isinstance(node, (cst.For, cst.While)):
            # its body owns `continue`/`break`; its `else` runs in the outer iteration
            return search(node.body, True) or (node.orelse is not None and search(node.orelse, in_loop))
        return any(search(child, in_loop) for child in children(node))

    return search(statement, False)


def guarded_exits(statement: cst.CSTNode) -> Iterator[cst.If]:
    """The `if`s inside `statement` whose body can leave the iteration early."""
    for node in find(statement, m.If()):
        if isinstance(node, cst.If) and exits_early(node.body):  # (what m.If() finds)
            yield node


def runs_backward(statement: cst.CSTNode) -> bool:
    return bool(find(statement, BACKWARD))
