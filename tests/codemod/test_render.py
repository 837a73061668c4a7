"""The output laid out from the original lines of the statements kept (io/render.py) is, byte for
byte, what libcst's `Module.code` gives, on every fixture input and real corpus file, whichever
top-level statements the rules replaced."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import libcst as cst
import pytest

from amp_migrate.analysis.source_index import SourceIndex
from amp_migrate.io import render as render_module
from amp_migrate.io.lines import normalise_line_breaks
from amp_migrate.io.render import render
from fixture_files import INPUTS, fixture_id

ROOT = Path(__file__).resolve().parents[2]
CORPUS = next(
    (
        c
        for c in (ROOT.parent / "shared" / "corpus" / "files", Path("/work/shared/corpus/files"))
        if c.is_dir()
    ),
    None,
)
FILES = [p for p in INPUTS if p.suffix == ".py"] + (sorted(CORPUS.glob("*.py")) if CORPUS else [])


def _replaced(module: cst.Module, which) -> cst.Module:
    """`module` with the chosen top-level statements replaced by copies (new nodes, same text)."""
    body = [s.deep_clone() if which(i, len(module.body)) else s for i, s in enumerate(module.body)]
    return module.with_changes(body=body)


def _inside(node: cst.CSTNode, depth: int = 0) -> cst.CSTNode:
    """A new class or function node whose body keeps every second statement (the parse's own
    nodes) and replaces the others, at every depth; every third body also gets a kept statement
    one level deeper (under `if True:`), where its original text would be indented wrongly."""
    if not isinstance(node, (cst.ClassDef, cst.FunctionDef)) or not isinstance(node.body, cst.IndentedBlock):
        return node.deep_clone()
    body: list = []
    for i, child in enumerate(node.body.body):
        if i % 2:
            body.append(child)  # kept: the very node
        elif isinstance(child, (cst.ClassDef, cst.FunctionDef)):
            body.append(_inside(child, depth + 1))
        else:
            body.append(child.deep_clone())
    if len(body) > 1 and depth % 3 == 0:
        body[1] = cst.If(cst.Name("True"), cst.IndentedBlock([body[1]]))
    return node.with_changes(body=node.body.with_changes(body=body))


def _replaced_inside(module: cst.Module) -> cst.Module:
    return module.with_changes(body=[_inside(s) for s in module.body])


CHOICES = {
    "every": lambda i, n: True,
    "every-second": lambda i, n: i % 2 == 0,
    "first": lambda i, n: i == 0,
    "last": lambda i, n: i == n - 1,
    "none-but-the-module": lambda i, n: False,
}


def _parsed(path: Path):
    text = normalise_line_breaks(path.read_text(encoding="utf-8", errors="replace"))[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in the files: theirs
            tree = ast.parse(text)
        module = cst.parse_module(text)
    except (SyntaxError, ValueError, cst.ParserSyntaxError, RecursionError):
        return None
    return text, module, SourceIndex(text, module, tree)


@pytest.mark.slow
def test_laid_out_from_the_lines_kept_it_is_what_libcst_renders():
    """Every second statement replaced puts a kept statement beside a replaced one at every
    boundary of the file; the first or the last (by turns) adds the header's and the footer's."""
    tiled = nested = 0
    checked = 0
    for number, path in enumerate(FILES):
        parsed = _parsed(path)
        if parsed is None:
            continue
        text, module, index = parsed
        texts = render_module._statement_texts(module, text, index)
        tiled += texts is not None
        nested += bool(texts and texts.nested)
        for name in ("every-second", "first" if number % 2 else "last"):
            result = _replaced(module, CHOICES[name])
            assert render(result, module, text, index) == result.code, f"{fixture_id_or_name(path)}: {name}"
        result = _replaced_inside(module)
        assert render(result, module, text, index) == result.code, f"{fixture_id_or_name(path)}: inside"
        checked += 1
    # The comparison is only worth something where the original lines were used.
    assert checked >= 600 and tiled >= 0.95 * checked, (tiled, checked)
    assert nested >= 0.5 * checked, (nested, checked)  # files with a class or function body read


def test_a_header_or_footer_the_rules_changed_is_laid_out_again():
    text = "# a comment\n\nimport torch\nx = 1\n# the end\n"
    module = cst.parse_module(text)
    index = SourceIndex(text, module, ast.parse(text))
    for result in (
        module.with_changes(header=[cst.EmptyLine(comment=cst.Comment("# new"))], body=list(module.body)),
        module.with_changes(footer=[], body=[module.body[0].deep_clone(), module.body[1]]),
    ):
        assert render(result, module, text, index) == result.code


@pytest.mark.parametrize(
    "text",
    [
        "x = 1",  # no final line break
        "def f():\n    return 1\n    # indented, the block's\n# the next statement's\ny = 2\n",
        "@decorator\n\n# between\ndef f():\n    pass\n\n\n\nclass C:\n    x = 1\n\n    # footer\n",
        "if a:\n    pass\nelif b:\n    pass\nelse:\n    z = (\n        1,\n    )\n",
        "s = '''\nmulti\nline\n'''; t = 1 \\\n    + 2\n",
        "# only a comment\n",
        "\n\n\nx = 1\n\n\n",
        "class C:\n    # first\n    a = 1\n\n    @d\n    def f(self):\n        b = 2\n        # deeper\n"
        "    # the next one's\n    def g(self):\n        if x:\n            pass\n\n        c = 3\n"
        "            # footer of the if's block? of g's?\n# col 0\n",
        "def outer():\n    def inner():\n        return 1\n    return inner\n\n\nclass D(\n    Base,\n):\n"
        "    x: int = 0\n    y = 1\n",
    ],
)
def test_every_kind_of_boundary_between_statements_tiles(text):
    module = cst.parse_module(text)
    index = SourceIndex(text, module, ast.parse(text))
    for name, which in CHOICES.items():
        result = _replaced(module, which)
        assert render(result, module, text, index) == result.code, name
    result = _replaced_inside(module)
    assert render(result, module, text, index) == result.code, "inside"


def fixture_id_or_name(path: Path) -> str:
    try:
        return fixture_id(path)
    except ValueError:
        return path.name


def test_a_kept_statement_moved_to_another_depth_is_laid_out_at_its_new_indentation():
    text = "class C:\n    def f(self):\n        x = 1\n    y = 2\n"
    module = cst.parse_module(text)
    index = SourceIndex(text, module, ast.parse(text))
    cls = module.body[0]
    method = cls.body.body[0]
    moved = cls.with_changes(body=cls.body.with_changes(body=[method.body.body[0], cls.body.body[1]]))
    result = module.with_changes(body=[moved])
    assert render(result, module, text, index) == result.code == "class C:\n    x = 1\n    y = 2\n"
