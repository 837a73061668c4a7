"""`migrate_source` on nesting Python's limits refuse, and on deep nesting they allow: what
CPython compiles is migrated (on a deeper stack, amp_migrate/deep_stack.py); what it refuses
is AMP001 with its reason, whatever libcst reads."""

from __future__ import annotations

import sys

import pytest

from amp_migrate import MigrationError, migrate_source

from .test_migrate_source import LOOP


def _sum(terms: int) -> str:
    return "x = " + " + ".join(["a"] * terms) + "\n"


def test_a_sum_deeper_than_the_rules_recursion_limit_is_migrated_natively():
    limit = sys.getrecursionlimit()
    result = migrate_source(LOOP + _sum(600))
    assert result.target_used == "native" and result.code.endswith(_sum(600))
    compile(result.code, "<test>", "exec")
    assert sys.getrecursionlimit() == limit


def test_a_sum_python_cannot_compile_is_amp001_saying_so():
    with pytest.raises(MigrationError) as raised:
        migrate_source(LOOP + _sum(5000))
    assert (raised.value.code.code, raised.value.line, raised.value.message) == (
        "AMP001",
        1,
        "expressions nested too deeply to read (Python's recursion limit)",
    )


def test_parentheses_nested_past_pythons_limit_are_amp001_where_python_says():
    with pytest.raises(MigrationError) as raised:
        migrate_source(LOOP + "y = " + "(" * 1000 + "1" + ")" * 1000 + "\n")
    error = raised.value
    assert (error.code.code, error.line, error.message) == (
        "AMP001",
        10,
        "syntax error: too many nested parentheses",
    )


@pytest.mark.parametrize(
    "program, line, message",
    [
        ("return 1\n", 10, "'return' outside function"),
        ("nonlocal q\n", 10, "nonlocal declaration not allowed at module level"),
        (
            "".join("    " * i + f"for i{i} in x:\n" for i in range(21)) + "    " * 21 + "pass\n",
            30,
            "too many statically nested blocks",
        ),
    ],
)
def test_a_program_pythons_compiler_refuses_is_amp001_not_migrated(program, line, message):
    with pytest.raises(MigrationError) as raised:
        migrate_source(LOOP + program)
    error = raised.value
    assert (error.code.code, error.line, error.message) == ("AMP001", line, f"syntax error: {message}")


def test_a_top_level_await_python_compiles_only_in_a_notebook_is_still_migrated():
    result = migrate_source(LOOP + "await flush()\n")
    assert result.target_used == "native" and result.code.endswith("await flush()\n")


def test_a_future_import_after_the_first_statement_as_a_later_notebook_cell_has_is_still_migrated():
    result = migrate_source(LOOP + "from __future__ import print_function\n")
    assert result.target_used == "native"
    assert result.code.endswith("from __future__ import print_function\n")
