"""The deep stack (amp_migrate/deep_stack.py): it gives a deep recursion's result, turns one
without end into TooDeep rather than a crash, puts the recursion limit back, and tells
Python's limits from its grammar."""

from __future__ import annotations

import sys

import pytest

from amp_migrate import deep_stack


def test_the_deep_stack_gives_the_result_and_puts_the_limit_back():
    def depth(n: int) -> int:
        return 0 if n == 0 else 1 + depth(n - 1)

    limit = sys.getrecursionlimit()
    assert deep_stack.call(depth, 5000) == 5000
    assert sys.getrecursionlimit() == limit


def test_a_recursion_without_end_through_c_calls_is_too_deep_not_a_crash():
    def forever(n: int) -> list:
        return sorted([n], key=lambda m: forever(m + 1))

    with pytest.raises(deep_stack.TooDeep):
        deep_stack.call(forever, 0)


@pytest.mark.parametrize(
    "error, beyond",
    [
        (SyntaxError("too many nested parentheses"), True),
        (SyntaxError("too many levels of indentation"), True),
        (RecursionError("maximum recursion depth exceeded during ast construction"), True),
        (MemoryError("Parser stack overflowed - Python source too complex to parse"), True),
        (SyntaxError("f-string: expressions nested too deeply"), False),  # Python 3.12 reads it
        (SyntaxError("invalid syntax"), False),
        (MemoryError(), False),
    ],
)
def test_pythons_limits_are_told_from_its_grammar(error, beyond):
    assert deep_stack.beyond_python(error) is beyond
