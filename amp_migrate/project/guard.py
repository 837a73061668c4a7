"""The `if` test around an owner's one `initialize`, as other modules can rely on it.

The owner's plan hoists `if cond: model, opt = amp.initialize(...)` into the scaler's
`enabled=cond`, so an and-ed part of `cond` that holds the same value elsewhere is the scaler's
switch there. Two ways carry it into another module: that module calls the owner's function
with the same argument (share.py `owner_switch`), or the owner calls that module's function
with the part as an argument (entry_switch.py). Both need the part read where `initialize`
ran to keep its value: a path rooted at a parameter of the owner's function that the function
never rebinds, no `global`/`nonlocal` of it, and no store into the path anywhere in the owner.
"""

from __future__ import annotations

import ast
from typing import Optional

from ..plan.switch_flow import _ast_path, _conflict, _Stores


def conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in conjuncts(value)]
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "bool"
        and len(test.args) == 1
        and not test.keywords
    ):
        return conjuncts(test.args[0])
    return [test]


def end_line(node: ast.stmt | ast.expr) -> int:
    """The node's last line (`ast.parse` sets it on every statement and expression)."""
    assert node.end_lineno is not None
    return node.end_lineno


def guarded_builder(tree: ast.Module, line: int) -> Optional[tuple[ast.FunctionDef, ast.If]]:
    """The module-level function whose body holds `if cond:` (no `else`) around the simple
    statement on `line` (the `initialize`): the guard the owner's plan hoists into `enabled=`."""
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or not function.lineno <= line <= end_line(function):
            continue
        for guard in function.body:
            if (
                isinstance(guard, ast.If)
                and not guard.orelse
                and any(
                    isinstance(s, (ast.Assign, ast.Expr, ast.AnnAssign)) and s.lineno <= line <= end_line(s)
                    for s in guard.body
                )
            ):
                return function, guard
    return None


def parameters(function: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """(positional parameters, keyword-only parameters)."""
    args = function.args
    return [a.arg for a in [*args.posonlyargs, *args.args]], [a.arg for a in args.kwonlyargs]


def stable_paths(tree: ast.Module, function: ast.FunctionDef, guard: ast.If) -> list[tuple[str, ...]]:
    """The access paths of the guard's and-ed parts that hold, wherever `function` reads them,
    the value they held at the guard: rooted at a parameter never rebound in `function`,
    neither declared global nor stored into anywhere in the module."""
    stores = _Stores()
    stores.visit(tree)
    positional, keyword = parameters(function)
    found = []
    for part in conjuncts(guard.test):
        path = _ast_path(part)
        if (
            path is None
            or path[0] not in positional + keyword
            or path[0] in stores.declared
            or any(
                (p == path[:1] and function.lineno <= line <= end_line(function))
                or (len(p) > 1 and _conflict(p, path))
                for p, line, _, _ in stores.found
            )
        ):
            continue
        found.append(path)
    return found
