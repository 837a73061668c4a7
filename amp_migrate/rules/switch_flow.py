"""Whether an `if` test is the very switch the GradScaler was built with.

`if args.fp16: <scaled backward> else: loss.backward()` collapses to one scaled backward only
where the test, when false, means the scaler is disabled: the test is one of the `and`-ed
parts of the scaler's `enabled=` (or the scaler is always disabled), and every name it reads
holds, where the `if` is, the value it held where the scaler was built. That is so in the
function that built it when nothing stores into the name after `initialize`; in a function
that reads it as a module global; and in a function the scaler was threaded through when the
name is a parameter that every caller passes on unchanged under the same name, from a
function for which the same holds. Attribute or item stores into the name (`args.fp16 =
False`) anywhere after `initialize` or in another function defeat the proof, as do `global`
and `nonlocal` declarations. This module holds no rule; the scale_loss rule asks it.
"""
from __future__ import annotations

import ast
from typing import Optional

import libcst as cst
import libcst.matchers as m

from .plan import TrainingPlan, literal

_DEPTH = 8


def conjuncts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And) and not expr.lpar:
        return conjuncts(expr.left) + conjuncts(expr.right)
    return [expr]


def squeezed(code: str) -> str:
    return "".join(code.split())


def _read_names(expr: cst.CSTNode) -> set[str]:
    """The variables an expression reads (`args` in `args.fp16`, not `fp16`)."""
    if isinstance(expr, cst.Name):
        return {expr.value}
    if isinstance(expr, cst.Attribute):
        return _read_names(expr.value)
    out: set[str] = set()
    for child in expr.children:
        out |= _read_names(child)
    return out


class _Stores(ast.NodeVisitor):
    """(name, "name" | "item", line, line of the module-level def around it or 0)."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str, int, int]] = []
        self.declared: set[str] = set()
        self.top = 0

    def visit_FunctionDef(self, node) -> None:
        outer = self.top
        if outer == 0:
            self.top = min([d.lineno for d in node.decorator_list] + [node.lineno])
        self.generic_visit(node)
        self.top = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Global(self, node) -> None:
        self.declared.update(node.names)

    visit_Nonlocal = visit_Global

    def _store(self, node, kind: str) -> None:
        target = node
        while isinstance(target, (ast.Attribute, ast.Subscript)):
            target, kind = target.value, "item"
        if isinstance(target, ast.Name):
            self.found.append((target.id, kind, node.lineno, self.top))

    def visit_Name(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._store(node, "name")

    def visit_Attribute(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._store(node, "item")
        self.generic_visit(node)

    visit_Subscript = visit_Attribute


class SwitchProof:
    def __init__(self, rule, plan: TrainingPlan) -> None:
        self.rule, self.plan = rule, plan
        self._stores: Optional[_Stores] = None

    def holds(self, branch: cst.If) -> bool:
        enabled = next((a.value for a in self.plan.scaler_call.args
                        if a.keyword is not None and a.keyword.value == "enabled"), None)
        if enabled is not None and literal(enabled) is False:
            return True  # always disabled: `scale(loss)` is `loss`
        code = self.rule.code_of
        test = squeezed(code(branch.test))
        if enabled is None or test not in {squeezed(code(c)) for c in conjuncts(enabled)}:
            return False
        stores = self._all_stores()
        if stores is None:
            return False
        function = self._function_of(branch)
        if function is False:
            return False
        names = _read_names(branch.test) - {"True", "False", "None"}
        return all(self._same(function, name, 0) for name in names)

    def _all_stores(self) -> Optional[_Stores]:
        if self._stores is None:
            try:
                tree = ast.parse(self.rule.state.original)
            except (SyntaxError, ValueError):
                return None
            self._stores = _Stores()
            self._stores.visit(tree)
        return self._stores

    def _function_of(self, node: cst.CSTNode):
        """The module-level def around `node` (None at module level, False when nested)."""
        functions = [p for p in self.rule.ancestors(node) if isinstance(p, (cst.FunctionDef, cst.Lambda, cst.ClassDef))]
        if not functions:
            return None
        if len(functions) > 1 or not isinstance(functions[0], cst.FunctionDef):
            return False
        return functions[0]

    def _line(self, function: Optional[cst.FunctionDef]) -> int:
        return self.rule.position(function)[0] if function is not None else 0

    def _same(self, function: Optional[cst.FunctionDef], name: str, depth: int) -> bool:
        stores, plan = self._stores, self.plan
        if name in stores.declared:
            return False
        if any(n == name and kind == "item" and (top != plan.init_scope or line > plan.init_line)
               for n, kind, line, top in stores.found):
            return False
        here = self._line(function)
        if here == plan.init_scope:
            return not any(n == name and top == here and line > plan.init_line
                           for n, _, line, top in stores.found)
        if function is None or depth > _DEPTH or any(n == name and top == here for n, _, _, top in stores.found):
            return False
        if plan.init_scope == 0 and not self._is_parameter(function, name):
            return not any(n == name and top == 0 and line > plan.init_line for n, _, line, top in stores.found)
        return self._passed_on(function, name, depth)

    @staticmethod
    def _is_parameter(function: cst.FunctionDef, name: str) -> bool:
        params = function.params
        return any(p.name.value == name for p in [*params.posonly_params, *params.params, *params.kwonly_params])

    def _passed_on(self, function: cst.FunctionDef, name: str, depth: int) -> bool:
        """`name` is a parameter of `function` that every call passes on as the caller's `name`."""
        params = function.params
        positional = [p.name.value for p in [*params.posonly_params, *params.params]]
        keyword_ok = name in [p.name.value for p in [*params.params, *params.kwonly_params]]
        if name not in positional and not keyword_ok:
            return False
        fname = function.name.value
        module = self.rule.context.wrapper.module
        calls = [c for c in self.rule.findall(module, m.Call(func=m.Name(fname)), {fname})]
        if not calls:
            return False
        for call in calls:
            value = self._argument(call, name, positional.index(name) if name in positional else None)
            if not (isinstance(value, cst.Name) and value.value == name):
                return False
            caller = self._function_of(call)
            if caller is False or not self._same(caller, name, depth + 1):
                return False
        return True

    @staticmethod
    def _argument(call: cst.Call, name: str, index: Optional[int]) -> Optional[cst.BaseExpression]:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == name:
                return arg.value
        if index is None:
            return None
        for i, arg in enumerate(call.args):
            if arg.star or arg.keyword is not None:
                return None
            if i == index:
                return arg.value
        return None
