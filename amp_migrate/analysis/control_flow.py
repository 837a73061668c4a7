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
from typing import Callable, Iterable, Iterator

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


def exclusive_branches(
    a: cst.CSTNode, b: cst.CSTNode, ancestors: Callable[[cst.CSTNode], Iterable[cst.CSTNode]]
) -> bool:
    """`a` and `b` sit in different arms of one `if`/`elif`/`else` or `match`, so no run of
    the statement runs both. Other shapes (a `try` body and its handler, two loops) may run
    both, and count as not exclusive."""
    above_a = list(ancestors(a))
    above_b = {id(node) for node in ancestors(b)}
    below = a
    for node in above_a:
        if id(node) in above_b:
            if isinstance(node, cst.If):
                return _arm_of(node, below) != _arm_of(node, _child_towards(node, b, ancestors))
            if isinstance(node, cst.Match):
                return below is not _child_towards(node, b, ancestors)
            return False
        below = node
    return False


def _child_towards(
    parent: cst.CSTNode, node: cst.CSTNode, ancestors: Callable[[cst.CSTNode], Iterable[cst.CSTNode]]
) -> cst.CSTNode:
    """The child of `parent` on the way down to `node`."""
    below = node
    for above in ancestors(node):
        if above is parent:
            return below
        below = above
    return node


def _arm_of(statement: cst.If, child: cst.CSTNode) -> str:
    if child is statement.body:
        return "body"
    if child is statement.orelse:
        return "orelse"
    return "test"
