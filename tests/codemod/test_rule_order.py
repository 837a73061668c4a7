"""The rules run in an order derived from what each declares it reads and writes: the order
keeps every declaration, depends on nothing but the declarations, and a set of declarations
that admits no order is refused when the registry is built."""

from __future__ import annotations

import dataclasses
import inspect
import random

import pytest

from amp_migrate import rules
from amp_migrate.rules.base import FileState, Rule
from amp_migrate.rules.facts import DRIVER_PROVIDES, FIELDS, Fact
from amp_migrate.rules.order import RuleOrderError, ordered, unmet

#: FileState fields that are no fact: the file itself, what rules report, and a cache.
NOT_FACTS = {"options", "diagnostics", "original", "index", "apex_words", "file_stores", "layouts"}


def _rule(name: str, reads=(), writes=()) -> type[Rule]:
    return type(name, (Rule,), {"READS": frozenset(reads), "WRITES": frozenset(writes)})


@pytest.mark.parametrize("listed", [rules.NATIVE_RULES, rules.SHIM_RULES], ids=["native", "shim"])
def test_the_derived_order_keeps_every_declaration(listed):
    assert unmet(listed) == []


@pytest.mark.parametrize("target", ["native", "shim"])
def test_the_order_does_not_depend_on_how_the_registry_lists_the_rules(target):
    listed = [rule for rule, targets in rules.REGISTRY.items() if target in targets]
    expected = rules.NATIVE_RULES if target == "native" else rules.SHIM_RULES
    for seed in range(5):
        random.Random(seed).shuffle(listed)
        assert ordered(listed) == expected


def test_ties_go_to_the_class_name_that_sorts_first():
    b, a, c = _rule("B"), _rule("A"), _rule("C", reads={Fact.TRAINING})
    d = _rule("D", writes={Fact.TRAINING})
    assert [r.__name__ for r in ordered([c, b, d, a])] == ["A", "B", "D", "C"]


def test_a_reader_runs_after_every_writer_of_what_it_reads():
    reader = _rule("A", reads={Fact.CASTS})
    first, second = _rule("Y", writes={Fact.CASTS}), _rule("Z", writes={Fact.CASTS})
    assert [r.__name__ for r in ordered([reader, second, first])] == ["Y", "Z", "A"]


def test_a_rule_that_reads_and_writes_a_fact_runs_after_the_other_writers():
    both = _rule("A", reads={Fact.FALLBACK_REASONS}, writes={Fact.FALLBACK_REASONS})
    other = _rule("B", writes={Fact.FALLBACK_REASONS})
    assert [r.__name__ for r in ordered([both, other])] == ["B", "A"]


def test_a_dependency_cycle_is_an_error():
    a = _rule("A", reads={Fact.CASTS}, writes={Fact.TRAINING})
    b = _rule("B", reads={Fact.TRAINING}, writes={Fact.CASTS})
    with pytest.raises(RuleOrderError, match="cycle: A, B"):
        ordered([a, b, _rule("C")])


def test_a_fact_read_that_no_rule_writes_is_an_error():
    with pytest.raises(RuleOrderError, match="A reads FP16_PLAN"):
        ordered([_rule("A", reads={Fact.FP16_PLAN}), _rule("B", writes={Fact.CASTS})])


def test_a_fact_only_its_reader_writes_is_an_error():
    with pytest.raises(RuleOrderError, match="A reads FP16_PLAN"):
        ordered([_rule("A", reads={Fact.FP16_PLAN}, writes={Fact.FP16_PLAN})])


def test_what_the_driver_provides_needs_no_writer():
    assert ordered([_rule("A", reads=DRIVER_PROVIDES)])
    with pytest.raises(RuleOrderError):
        ordered([_rule("A", reads={Fact.PROJECT})], provided=frozenset())


def test_unmet_names_a_reader_placed_before_a_writer():
    reader, writer = _rule("A", reads={Fact.FP16_PLAN}), _rule("B", writes={Fact.FP16_PLAN})
    assert unmet([writer, reader]) == []
    assert unmet([reader, writer]) == [
        "A reads FP16_PLAN before B writes it",
        "A reads FP16_PLAN, which nothing before it writes",
    ]


def test_a_broken_registry_fails_at_import(monkeypatch):
    """rules/__init__.py builds NATIVE_RULES with `ordered`, so a bad declaration stops the
    package from importing rather than running rules in a wrong order."""
    import importlib

    monkeypatch.setattr(
        rules.ReboundApexNames, "READS", rules.ReboundApexNames.READS | {Fact.FALLBACK_REASONS}
    )
    try:
        with pytest.raises(RuleOrderError, match="cycle"):
            importlib.reload(rules)
    finally:
        monkeypatch.undo()
        importlib.reload(rules)


@pytest.mark.parametrize("rule", rules.ALL_RULES, ids=lambda r: r.__name__)
def test_every_rule_declares_its_reads_and_writes_on_its_own_class(rule):
    assert "READS" in vars(rule) and "WRITES" in vars(rule), rule.__name__
    assert all(isinstance(f, Fact) for f in rule.READS | rule.WRITES)


def test_every_state_fact_is_a_file_state_field_and_every_fact_field_has_a_fact():
    fields = {f.name for f in dataclasses.fields(FileState)}
    assert set(FIELDS.values()) <= fields
    assert fields - NOT_FACTS == set(FIELDS.values())


def test_every_fact_is_read_or_written_by_some_rule():
    used = {f for rule in rules.ALL_RULES for f in rule.READS | rule.WRITES}
    assert set(Fact) == used


@pytest.mark.parametrize("rule", rules.ALL_RULES, ids=lambda r: r.__name__)
def test_a_rule_that_can_send_the_file_to_the_shim_writes_the_fallback_reasons(rule):
    """RemainingApexUses and ForwardOutsideAutocast act only where nothing fell back yet."""
    falls_back = any(code.falls_back for code in rule.EMITS)
    assert falls_back == (Fact.FALLBACK_REASONS in rule.WRITES), rule.__name__


@pytest.mark.parametrize("rule", rules.ALL_RULES, ids=lambda r: r.__name__)
def test_a_rule_that_asks_for_imports_writes_the_import_requests(rule):
    source = "".join(
        inspect.getsource(klass) for klass in rule.__mro__ if klass.__module__.startswith("amp_migrate")
    )
    asks = "add_needed_import" in source or "remove_unused_import" in source
    assert asks == (Fact.IMPORT_REQUESTS in rule.WRITES), rule.__name__
