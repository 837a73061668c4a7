"""A rule visit enters only what can hold a node the rule handles, and still reaches every one."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext

from amp_migrate.analysis.cst_reach import NODE_TYPES, child_types, holders_of
from amp_migrate.options import Options
from amp_migrate.rules.base import FileState, Rule

SOURCE = """\
import os
x = f(1, g(y=[h(2)]))
if x:
    def inner(a: int = k()) -> None:
        return (lambda: m(3))()
"""


def test_field_annotations_give_each_node_type_its_children() -> None:
    assert cst.Arg in child_types(cst.Call) and cst.Name in child_types(cst.Attribute)
    assert child_types(cst.Name) == {cst.LeftParen, cst.RightParen}
    assert all(child_types(t) <= NODE_TYPES for t in NODE_TYPES)


def test_only_types_whose_subtree_can_hold_a_call_hold_one() -> None:
    holders = holders_of(frozenset({cst.Call}))
    assert {cst.Call, cst.Arg, cst.Attribute, cst.Lambda, cst.IndentedBlock, cst.Module} <= holders
    assert not {cst.Name, cst.Integer, cst.SimpleString, cst.Comma, cst.Pass} & holders


def test_statement_handlers_never_enter_an_expression() -> None:
    holders = holders_of(frozenset({cst.Import}))
    assert cst.SimpleStatementLine in holders and cst.FunctionDef in holders
    assert not {cst.Call, cst.Arg, cst.Name, cst.Lambda, cst.Param} & holders


class _Calls(Rule):
    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.calls: list[str] = []
        self.entered: set[type] = set()

    def visit_node(self, node):
        self.entered.add(type(node))
        return super().visit_node(node)

    ACTS_ON = ()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(cst.Module([]).code_for_node(node.func))

    def leave_Call(self, original_node, updated_node):
        renamed = isinstance(original_node.func, cst.Name) and original_node.func.value == "h"
        return updated_node.with_changes(func=cst.Name("q")) if renamed else updated_node


def _visit(rule_class: type[Rule]) -> tuple[Rule, str]:
    module = cst.parse_module(SOURCE)
    state = FileState(Options("auto", "cpu", "float16"), original=SOURCE, parsed=module)
    rule = rule_class(CodemodContext(), state)
    return rule, rule.transform_module(module).code


def test_a_rule_reaches_every_call_and_enters_no_leaf() -> None:
    rule, code = _visit(_Calls)
    assert sorted(rule.calls) == ["(lambda: m(3))", "f", "g", "h", "k", "m"]
    assert "q(2)" in code and code.replace("q(2)", "h(2)") == SOURCE
    assert not rule.entered & {cst.Name, cst.Integer, cst.Comma}
