"""The shortcuts `Rule` takes in dispatch hold only while no rule needs what they skip."""

import re

import pytest
from libcst.codemod import CodemodContext
from libcst.matchers._visitors import _gather_constructed_leave_funcs, _gather_constructed_visit_funcs

from amp_migrate.options import Options
from amp_migrate.rules import NATIVE_RULES, SHIM_RULES
from amp_migrate.rules.base import FileState

RULES = NATIVE_RULES + SHIM_RULES


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_no_rule_uses_matcher_decorators(rule):
    instance = rule(CodemodContext(), FileState(Options("auto", "cuda", "float16")))
    assert not _gather_constructed_visit_funcs(instance)
    assert not _gather_constructed_leave_funcs(instance)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_no_rule_has_attribute_handlers(rule):
    attribute_handler = re.compile(r"^(visit|leave)_[A-Z]\w*_[a-z]\w*$")
    own = [
        name for klass in rule.__mro__ if klass.__module__.startswith("amp_migrate") for name in vars(klass)
    ]
    assert not [name for name in own if attribute_handler.match(name)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rules_hook_in_below_the_identity_bookkeeping(rule):
    """on_visit/on_leave keep unchanged statements identical; rules override visit_node and
    leave_node instead, or the bookkeeping would be skipped."""
    from amp_migrate.rules.base import Rule

    assert rule.on_visit is Rule.on_visit and rule.on_leave is Rule.on_leave
