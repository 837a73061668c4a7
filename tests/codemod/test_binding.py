"""Apex name binding: the import-table fast path answers exactly what libcst's
QualifiedNameProvider answers, and steps aside whenever a file rebinds an imported name."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from amp_migrate.analysis.binding import ApexBinder, is_apex_name, plain_apex_bindings

from .golden import cases


@pytest.mark.parametrize(
    "source, table",
    [
        ("from apex import amp\n", {"amp": "apex.amp"}),
        ("from apex import amp as A\n", {"A": "apex.amp"}),
        ("import apex\n", {"apex": "apex"}),
        ("import apex.amp\n", {"apex": "apex"}),
        ("import apex.amp as X\n", {"X": "apex.amp"}),
        ("from apex.amp import scale_loss as sl\n", {"sl": "apex.amp.scale_loss"}),
        ("try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n", {"amp": "apex.amp"}),
        ("import os\n", {}),
    ],
)
def test_import_table_when_nothing_rebinds(source, table):
    assert plain_apex_bindings(cst.parse_module(source)) == table


@pytest.mark.parametrize(
    "rebinding",
    [
        "amp = Meter()",
        "def f(amp):\n    pass",
        "for amp in xs:\n    pass",
        "with open(p) as amp:\n    pass",
        "[amp for amp in xs]",
        "import torch.cuda.amp as amp",
        "class amp:\n    pass",
        "from apex.amp.frontend import *",
        "from apex import parallel as amp",
        "del amp",
        "amp = None",  # outside an import guard, `amp = None` is a binding like any other
    ],
)
def test_any_other_binding_of_an_imported_name_needs_scope_analysis(rebinding):
    assert plain_apex_bindings(cst.parse_module(f"from apex import amp\n{rebinding}\n")) is None


def test_a_star_import_with_known_names_keeps_the_import_table():
    import ast

    from amp_migrate.analysis.binding import apex_import_words

    source = "from apex import amp\nfrom apex.fp16_utils import *\n"
    assert plain_apex_bindings(cst.parse_module(source)) == {"amp": "apex.amp"}
    words = apex_import_words(n for n in ast.parse(source).body)
    assert {"amp", "to_python_float", "FP16_Optimizer"} <= words
    assert apex_import_words(ast.parse("from apex.amp.frontend import *\n").body) is None


class _Compare(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, binder: ApexBinder) -> None:
        super().__init__()
        self.binder = binder
        self.checked = 0

    def visit_Call(self, node: cst.Call) -> None:
        names = sorted(
            q.name for q in self.get_metadata(QualifiedNameProvider, node.func, set()) if is_apex_name(q.name)
        )
        expected = names[0] if names else None
        assert self.binder._plain(node.func) == expected, cst.Module([]).code_for_node(node)
        self.checked += 1


@pytest.mark.slow
def test_fast_path_agrees_with_qualified_name_provider_on_every_golden_input():
    compared = 0
    for case in cases():
        module = cst.parse_module(case.source)
        table = plain_apex_bindings(module)
        if table is None:
            continue
        binder = ApexBinder(module, lambda *a: set())
        visitor = _Compare(binder)
        MetadataWrapper(module).visit(visitor)
        compared += visitor.checked
    assert compared > 500
