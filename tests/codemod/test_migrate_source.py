"""`migrate_source` as an API: its guarantees beyond any one rule."""

from __future__ import annotations

import pytest

import amp_migrate.rules as rules
from amp_migrate import MigrationError, migrate_source
from amp_migrate.rules.base import Rule

LOOP = """\
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in data:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


def test_file_without_apex_comes_back_identical_and_unparsed():
    text = "def f(x):\n    return x  # no mixed precision here\n"
    result = migrate_source(text)
    assert result.code is text
    assert not result.changed and result.target_used is None and result.diagnostics == ()


def test_invalid_python_without_apex_is_not_even_parsed():
    assert migrate_source("def broken(:\n").code == "def broken(:\n"


def test_invalid_python_with_apex_raises_migration_error_with_location():
    with pytest.raises(MigrationError) as info:
        migrate_source("from apex import amp\n\ndef broken(:\n    pass\n")
    assert info.value.line == 3
    assert info.value.col >= 1
    assert "syntax error" in str(info.value)
    assert info.value.as_diagnostic().code == "AMP001"


@pytest.mark.parametrize("target", ["auto", "native", "shim"])
def test_result_reports_whether_and_how_the_code_changed(target):
    result = migrate_source(LOOP, target=target)
    assert result.changed
    assert result.target_used == ("shim" if target == "shim" else "native")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target": "torch"}, "target must be one of"),
        ({"dtype": "float32"}, "dtype must be one of"),
        ({"device": "cuda:0"}, "device must be a device type"),
    ],
)
def test_bad_options_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        migrate_source(LOOP, **kwargs)


def test_modern_syntax_parses_and_survives_byte_for_byte():
    modern = """\
from apex import amp
type Batch = tuple[int, int]


def describe(command: str | None) -> str:
    match command.split():
        case ["go", direction]:
            return f"going {direction!r:>10}"
        case _:
            return f"{(n := len(command))=}"


model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in data:
    loss = criterion(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""
    result = migrate_source(modern)
    assert result.target_used == "native"
    head = modern.split("\n\n\nmodel")[0].replace("from apex import amp\n", "")
    assert head in result.code


def test_output_with_an_undefined_name_is_refused_and_the_input_kept(monkeypatch):
    import libcst as cst

    class Sabotage(Rule):
        """A rule with a bug: it introduces a name that nothing defines."""

        MARKERS = ()

        def leave_Module(self, original_node, updated_node):
            return updated_node.with_changes(
                body=list(updated_node.body) + [cst.parse_statement("undefined_helper()\n")]
            )

    monkeypatch.setattr(rules, "NATIVE_RULES", rules.NATIVE_RULES + [Sabotage])
    import amp_migrate.migrate as migrate

    monkeypatch.setattr(migrate, "NATIVE_RULES", rules.NATIVE_RULES)
    result = migrate_source(LOOP, target="native")
    assert result.code == LOOP and not result.changed
    failed = [d for d in result.diagnostics if d.code == "AMP002"]
    assert failed and "undefined_helper" in failed[0].message


def test_output_that_a_second_run_would_change_is_refused(monkeypatch):
    import libcst as cst

    class Grows(Rule):
        """A rule with a bug: every run appends another line."""

        MARKERS = ()

        def leave_Module(self, original_node, updated_node):
            return updated_node.with_changes(body=list(updated_node.body) + [cst.parse_statement("pass\n")])

    import amp_migrate.migrate as migrate

    monkeypatch.setattr(migrate, "NATIVE_RULES", rules.NATIVE_RULES + [Grows])
    # The output no longer touches Apex, so a real second run would return it as it is;
    # here it is made to look as if it still did, so that the rules run on it again.
    monkeypatch.setattr(migrate, "touches_apex", lambda tree: True)
    monkeypatch.setattr(migrate, "might_use_apex", lambda text: True)
    monkeypatch.setattr(migrate, "may_touch_apex", lambda text: True)
    result = migrate_source(LOOP, target="native")
    assert result.code == LOOP
    assert any(d.code == "AMP002" and "second run" in d.message for d in result.diagnostics)


def test_native_output_that_still_imports_apex_is_refused(monkeypatch):
    import libcst as cst

    class KeepsApex(Rule):
        """A rule with a bug: it adds an Apex import to native output."""

        MARKERS = ()

        def leave_Module(self, original_node, updated_node):
            return updated_node.with_changes(
                body=[cst.parse_statement("from apex import \\\n    amp\n")] + list(updated_node.body)
            )

    import amp_migrate.migrate as migrate

    monkeypatch.setattr(migrate, "NATIVE_RULES", rules.NATIVE_RULES + [KeepsApex])
    result = migrate_source(LOOP, target="native")
    assert result.code == LOOP and not result.changed
    assert any(d.code == "AMP002" and "still imports `apex`" in d.message for d in result.diagnostics)


@pytest.mark.parametrize(
    "text",
    [
        "import apex\n",
        "import os, apex.amp as a\n",
        "import os, \\\n    apex\n",
        "from apex import amp\n",
        "from \\\napex.optimizers import FusedAdam\n",
        "x = 1; import apex.parallel\n",
        "if True:\n    from apex.fp16_utils import *\n",
    ],
)
def test_the_text_check_sees_every_apex_import_the_output_check_would(text):
    """A native output is parsed again only where the text may import Apex: the text test
    must hold wherever `output_imports_apex` would find an import."""
    import ast

    from amp_migrate.migrate import may_touch_apex, might_use_apex
    from amp_migrate.verify import imports_apex

    assert imports_apex(ast.parse(text))
    assert might_use_apex(text) and may_touch_apex(text)


def test_output_without_apex_is_not_migrated_again(monkeypatch):
    import amp_migrate.migrate as migrate

    calls = []
    real = migrate._transform
    monkeypatch.setattr(migrate, "_transform", lambda *a: calls.append(1) or real(*a))
    result = migrate_source(LOOP, target="native")
    assert result.changed and "apex" not in result.code
    assert len(calls) == 1
    assert migrate_source(result.code, target="native").code == result.code


def test_diagnostic_lines_point_into_the_original_file():
    text = (
        LOOP.replace('opt_level="O1")', 'opt_level="O1", num_losses=2)')
        .replace("as scaled_loss", "as scaled_loss")
        .replace("scale_loss(loss, optimizer)", "scale_loss(loss, optimizer, loss_id=1)")
    )
    result = migrate_source(text)
    lines = sorted(d.line for d in result.diagnostics if d.code == "AMP114")
    assert lines == [3, 7]
