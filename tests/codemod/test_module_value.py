"""Apex's module handed around as a value (amp_migrate/analysis/carriers.py, rules/module_value.py): the
value becomes the GradScaler only where every place it goes is visible; every other flow is
refused with the place where it leaves."""

from __future__ import annotations

import ast
import textwrap

import pytest

from amp_migrate import migrate_source
from amp_migrate.analysis.carriers import find_carriers

TRAIN = """
def train(model, optimizer, inputs, amp):
    loss = model(inputs).sum()
    if amp is not None:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
"""


def _main(body: str, after: str = "    train(model, optimizer, inputs, amp)\n") -> str:
    return (
        TRAIN
        + textwrap.dedent("""
    def main(level, model, optimizer, inputs):
        if level == "O1":
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level=level)
        else:
            amp = None
    """)
        + textwrap.indent(textwrap.dedent(body), "    ")
        + after
    )


def _carriers(source: str):
    return find_carriers(ast.parse(source), source)


def test_a_module_passed_to_a_function_of_the_file_gets_that_slot():
    found = _carriers(_main(""))
    assert found.refusal is None and found.origin == "main"
    assert (found.slots["train"].param, found.slots["train"].index) == ("amp", 3)
    assert found.bare_else and found.nones


@pytest.mark.parametrize(
    "body, line, why",
    [
        ("args.amp = amp\n", 17, "`amp` is used in `args.amp = amp`"),
        ("print(amp)\n", 17, "passed to `print`"),
        ("handle = amp\n", 17, "`amp` is used in `handle = amp`"),
        ("amp.register_half_function(torch, 'einsum')\n", 17, "`amp.register_half_function` is used"),
        ("fn = lambda: amp\n", 17, "nested function"),
        ("amp = amp or None\n", 17, "bound to something other than"),
    ],
)
def test_a_value_that_leaves_what_the_file_shows_is_refused_where_it_leaves(body, line, why):
    found = _carriers(_main(body))
    (at_line, _), message = found.refusal
    assert at_line == line and why in message


def test_a_call_of_the_receiving_function_without_the_module_is_refused():
    source = _main(
        "", after="    train(model, optimizer, inputs, amp)\n    train(model, optimizer, inputs, None)\n"
    )
    (line, col), message = _carriers(source).refusal
    assert (line, col) == (18, 5) and "called without Apex's module" in message


def test_a_read_before_apex_is_set_up_is_refused():
    source = TRAIN + textwrap.dedent("""
    def main(level, model, optimizer, inputs):
        amp = None
        train(model, optimizer, inputs, amp)
        if level == "O1":
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level=level)
        train(model, optimizer, inputs, amp)
    """)
    (line, _), message = _carriers(source).refusal
    assert line == 13 and "before Apex is set up" in message


def test_a_module_returned_by_a_provider_is_refused_at_the_return():
    source = textwrap.dedent("""
    def get_amp(fp16):
        if fp16:
            from apex import amp
            amp.register_half_function(torch, "einsum")
        else:
            amp = None
        return amp
    """)
    (line, _), message = _carriers(source).refusal
    assert line == 8


def test_native_output_tests_the_scaler_where_the_code_tested_the_module():
    result = migrate_source(
        _main(
            "",
            after="    train(model, optimizer, inputs, amp)\n    return amp.state_dict() if amp else None\n",
        ),
        target="auto",
    )
    assert result.target_used == "native"
    assert "def train(model, optimizer, inputs, scaler):" in result.code
    assert "return scaler.state_dict() if scaler.is_enabled() else None" in result.code
    assert "amp = None" not in result.code and "else:" not in result.code


def test_a_refused_flow_sends_the_file_to_the_shim_with_the_place():
    result = migrate_source(_main("args.amp = amp\n"), target="auto")
    assert result.target_used == "shim"
    assert [(d.line, d.col) for d in result.diagnostics if d.code == "AMP155"] == [(17, 16)]


def test_an_import_whose_block_does_not_initialize_is_refused():
    source = TRAIN + textwrap.dedent("""
    def main(level, fp16, model, optimizer, inputs):
        if level == "O1":
            from apex import amp
        else:
            amp = None
        if fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level=level)
        train(model, optimizer, inputs, amp)
    """)
    (line, _), message = _carriers(source).refusal
    assert line == 13 and "does not run in the block that imports Apex" in message


def test_an_import_in_a_loop_is_refused():
    source = TRAIN + textwrap.dedent("""
    def main(level, model, optimizer, folds):
        for inputs in folds:
            if level == "O1":
                from apex import amp
                model, optimizer = amp.initialize(model, optimizer, opt_level=level)
            else:
                amp = None
            train(model, optimizer, inputs, amp)
    """)
    (line, _), message = _carriers(source).refusal
    assert line == 14 and "inside a loop" in message
