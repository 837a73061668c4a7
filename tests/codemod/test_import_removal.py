"""Where no removed name is read, the codemod drops deprecated imports itself instead of
running libcst's `RemoveImportsVisitor` with its whole-file scope analysis: the text must be
what the visitor writes, comments after removed aliases included."""

import ast

import libcst as cst
import pytest

from amp_migrate.analysis.binding import NOTHING
from amp_migrate.analysis.source_index import SourceIndex
from amp_migrate.rules import deprecated_amp
from amp_migrate.rules.deprecated_amp import _DropImports, _RemoveUnusedImports, remove_unused_imports

AUTOCAST = ("torch.cuda.amp", "autocast", None)
SCALER = ("torch.cuda.amp", "GradScaler", None)
MODULE = ("torch.cuda.amp", None, None)
PARENTHESIZED = """\
from torch.cuda.amp import (  # what we use
    autocast,  # the region
    GradScaler,  # the scaler
    custom_fwd,
)
"""
OWN_LINE_COMMENTS = """\
from torch.cuda.amp import (
    # first
    autocast,
    # the scaler comes next
    GradScaler,

    # and the last
    custom_fwd,
)
"""

CASES = [
    ("import torch.cuda.amp\n", [MODULE]),
    ("import os, torch.cuda.amp\n", [MODULE]),
    ("import torch.cuda.amp, os\n", [MODULE]),
    ("import torch.cuda.amp as tca, os  # note\n", [("torch.cuda.amp", None, "tca")]),
    ("import torch.cuda.amp as tca\n", [MODULE]),  # another alias: kept
    ("from torch.cuda.amp import autocast, GradScaler\n", [AUTOCAST]),
    ("from torch.cuda.amp import autocast, GradScaler\n", [SCALER]),
    ("from torch.cuda.amp import autocast, GradScaler\n", [AUTOCAST, SCALER]),
    ("from torch.cuda.amp import autocast as ac, GradScaler\n", [("torch.cuda.amp", "autocast", "ac")]),
    ("from torch.cuda.amp import autocast as ac\n", [AUTOCAST]),
    ("from torch.cuda.amp import (autocast, GradScaler,)\n", [SCALER]),
    ("from torch.cuda.amp import (autocast)\n", [AUTOCAST]),
    ("from torch.cuda import amp\n", [("torch.cuda", "amp", None)]),
    ("from torch.cuda.amp import *\n", [AUTOCAST]),
    ("from . import autocast\n", [AUTOCAST]),
    ("import os; from torch.cuda.amp import autocast\nx = 1\n", [AUTOCAST]),
    ("def f():\n    from torch.cuda.amp import autocast\n\n    return 1\n", [AUTOCAST]),
    ("def f():\n    from torch.cuda.amp import autocast\n    # why\n    return 1\n", [AUTOCAST]),
    (
        "if x:\n    from torch.cuda.amp import autocast\nelse:\n    import torch.cuda.amp\n",
        [AUTOCAST, MODULE],
    ),
    (PARENTHESIZED, [AUTOCAST]),
    (PARENTHESIZED, [SCALER]),
    (PARENTHESIZED, [AUTOCAST, SCALER]),
    (PARENTHESIZED, [SCALER, ("torch.cuda.amp", "custom_fwd", None)]),
    (PARENTHESIZED, [AUTOCAST, SCALER, ("torch.cuda.amp", "custom_fwd", None)]),
    (OWN_LINE_COMMENTS, [AUTOCAST]),
    (OWN_LINE_COMMENTS, [SCALER]),
    (OWN_LINE_COMMENTS, [AUTOCAST, SCALER]),
    (OWN_LINE_COMMENTS, [("torch.cuda.amp", "custom_fwd", None)]),
    (OWN_LINE_COMMENTS.replace("(\n", "(  # lead\n"), [AUTOCAST]),
    (OWN_LINE_COMMENTS.replace("(\n", "(\n\n"), [AUTOCAST]),
    (PARENTHESIZED.replace("custom_fwd,", "custom_fwd  # last"), [("torch.cuda.amp", "custom_fwd", None)]),
]


def _by_libcst(text: str, removals) -> str:
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    context = CodemodContext()
    for module, obj, alias in removals:
        RemoveImportsVisitor.remove_unused_import(context, module, obj, alias)
    return _RemoveUnusedImports(context, None, NOTHING).transform_module(cst.parse_module(text)).code


@pytest.mark.parametrize("text, removals", CASES)
def test_dropping_unread_imports_writes_what_libcsts_removal_writes(text, removals):
    dropped = cst.parse_module(text).visit(_DropImports(removals, None, NOTHING)).code
    assert dropped == _by_libcst(text, removals)


def test_imports_go_without_scope_analysis_when_no_removed_name_is_read(monkeypatch):
    text = "import torch\nfrom torch.cuda.amp import autocast, GradScaler\n\nx = torch.autocast('cuda')\n"
    module = cst.parse_module(text)
    index = SourceIndex(text, module, ast.parse(text))
    monkeypatch.setattr(deprecated_amp, "_RemoveUnusedImports", None)  # not called
    tree = remove_unused_imports(module, [AUTOCAST, SCALER], index)
    assert tree.code == "import torch\n\nx = torch.autocast('cuda')\n"
    assert tree.body[0] is module.body[0] and tree.body[1] is module.body[2]


def test_a_removed_name_still_read_keeps_its_import():
    text = "from torch.cuda.amp import autocast, GradScaler\n\nscaler = GradScaler()\n"
    module = cst.parse_module(text)
    index = SourceIndex(text, module, ast.parse(text))
    tree = remove_unused_imports(module, [AUTOCAST, SCALER], index)
    assert tree.code == "from torch.cuda.amp import GradScaler\n\nscaler = GradScaler()\n"
    assert tree.body[1] is module.body[1]
