"""One line index: the codemod numbers lines as Python's parser does, and keeps form feeds
that libcst cannot read where Python ignores them."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from amp_migrate import migrate_source
from amp_migrate.io.lines import count_line_breaks, form_feed_indents, split_lines

NOT_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


@pytest.mark.parametrize("char", list(NOT_BREAKS), ids=lambda c: f"U+{ord(c):04X}")
def test_line_n_holds_the_statement_the_parser_puts_on_line_n(char):
    text = f'a = 1  # x{char}y\r\nb = \'{char}\'\rc = 3\n"""{char}\n{char}"""\nd = 4'
    lines = split_lines(text)
    for stmt in ast.parse(text).body:
        assert lines[stmt.lineno - 1].lstrip().startswith(ast.get_source_segment(text, stmt)[:1])
    assert [line[:1] for line in lines] == ["a", "b", "c", '"', char, "d"]
    assert count_line_breaks(text) == len(lines) - 1
    assert "".join(split_lines(text, keepends=True)) == text


@pytest.mark.parametrize("text", ["", "\n", "a", "a\n", "a\r\n\r\nb\r", "\n\n", "a\rb\n\rc"])
def test_split_lines_agrees_with_splitlines_on_the_three_real_breaks(text):
    assert split_lines(text) == text.splitlines()
    assert split_lines(text, keepends=True) == text.splitlines(keepends=True)


FORM_FEED_BLOCK = """\
import torch
from apex import amp


def train(model, optimizer, data):
\x0c    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in data:
\x0c        optimizer.zero_grad()
        loss = model(x).sum()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
\x0cdef evaluate(model, x):
    return model(x)
"""


def test_libcst_alone_cannot_parse_a_block_indented_past_a_form_feed():
    """The reason for `form_feed_indents`; if libcst learns the tokenizer's rule, it can go."""
    ast.parse(FORM_FEED_BLOCK)
    with pytest.raises(cst.ParserSyntaxError):
        cst.parse_module(FORM_FEED_BLOCK)


def test_statements_after_a_form_feed_migrate_and_keep_it_on_unchanged_lines():
    result = migrate_source(FORM_FEED_BLOCK, target="native")
    assert result.target_used == "native", result.diagnostics
    assert "\x0c        optimizer.zero_grad()\n" in result.code
    assert "\x0cdef evaluate(model, x):\n" in result.code
    assert "scaler.step(optimizer)" in result.code
    shim = migrate_source(FORM_FEED_BLOCK, target="shim")
    assert shim.code == FORM_FEED_BLOCK.replace("from apex import amp", "from amp_shim import amp")


@pytest.mark.parametrize("target", ["native", "shim", "auto"])
def test_a_file_with_nothing_to_migrate_and_a_form_feed_indent_is_left_as_it_is(target):
    text = "import torch  # cuda.amp is gone\n\n\ndef f(m):\n\x0c    y = 1\n    return m.amp\n"
    result = migrate_source(text, target=target)
    assert (result.code, result.changed) == (text, False)


def test_diagnostics_on_a_line_after_a_form_feed_count_it_as_a_column():
    prefix = "\x0c  \x0c"  # Python: indented by nothing
    text = f"from apex import amp\n{prefix}model, opt = amp.initialize(model, opt, loss_scale=128.0)\n"
    plain = text.replace(prefix, "")
    shifted = {(d.code, d.line, d.col) for d in migrate_source(text, target="native").diagnostics}
    expected = {
        (d.code, d.line, d.col + (len(prefix) if d.line == 2 else 0))
        for d in migrate_source(plain, target="native").diagnostics
    }
    assert shifted == expected and any(line == 2 for _, line, _ in shifted)


def test_form_feeds_inside_strings_and_brackets_are_left_to_libcst():
    text = 'x = f(\n\x0c    1)\ns = """\n\x0c    kept"""\n'
    assert form_feed_indents(text) is None
