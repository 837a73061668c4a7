"""The value of an expression that is a literal (`2**24`, `(0.9, 0.999)`, `"dynamic"`), with one
marker, `NOT_LITERAL`, for everything known only at run time. The rules that replace Apex calls
and the planner judge arguments by it alike.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Optional

import libcst as cst

NOT_LITERAL: Any = object()


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.AST) -> Any:
    """`ast.literal_eval`, plus arithmetic on numbers (`2**24`, `1024 * 1024`)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _evaluate(node.left), _evaluate(node.right)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
        if not numbers or isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("not a small numeric expression")
        return _ARITHMETIC[type(node.op)](left, right)
    return ast.literal_eval(node)


def literal(expr: Optional[cst.BaseExpression]) -> Any:
    """The Python value of a literal expression (`True`, `-1e-8`, `(0.9, 0.99)`, `2**24`),
    else NOT_LITERAL."""
    if expr is None:
        return NOT_LITERAL
    try:
        return _evaluate(ast.parse(cst.Module([]).code_for_node(expr).strip(), mode="eval").body)
    except (
        ValueError,
        SyntaxError,
        TypeError,
        ZeroDivisionError,
        OverflowError,
        MemoryError,
        RecursionError,
    ):
        return NOT_LITERAL
