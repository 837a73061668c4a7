"""Shim output takes from `amp_shim` only what it has: the exports table is the package's,
uses the shim lacks are errors at their place in the file, judged with Python's scoping
(test_corpus_invariants.py checks that every golden shim output imports real names)."""

from __future__ import annotations

import ast
import warnings

import pytest

from amp_migrate import migrate_source
from amp_migrate.analysis._shim_surface_table import MODULES, SIGNATURES
from amp_migrate.analysis.shim_surface import missing_names, real_table
from amp_migrate.verify import VerificationError, imports_apex, shim_names_missing

from .golden import cases


def test_the_exports_table_is_what_the_installed_amp_shim_exports():
    modules, signatures = real_table()
    assert modules == MODULES and signatures == SIGNATURES, (
        "amp_migrate/analysis/_shim_surface_table.py is out of date: run `python -m amp_migrate.analysis.shim_surface`"
    )


@pytest.mark.parametrize(
    "case, expected",
    [
        ("fp16_optimizer_from_optimizers_with_max_grad_norm", {("AMP470", 17, 37), ("AMP471", 25, 27)}),
        ("reparameterization_weight_norm", {("AMP470", 6, 6)}),
        ("contrib_optimizer_read_through_import_apex", {("AMP470", 17, 26)}),
    ],
)
@pytest.mark.parametrize("target", ["shim", "auto"])
def test_what_the_shim_lacks_is_an_error_where_the_file_uses_it(case, expected, target):
    (golden,) = [c for c in cases() if c.id == f"imports/{case}"]
    result = migrate_source(golden.source, target=target)
    assert result.code == golden.source and result.target_used is None
    errors = {(d.code, d.line, d.col) for d in result.diagnostics if d.severity == "error"}
    assert errors == expected
    assert not any(d.fixed for d in result.diagnostics)


def found(code: str, roots=("apex",)):
    return [(m.kind, m.shim_name, m.line, m.col) for m in missing_names(ast.parse(code), code, roots)]


def test_a_local_name_that_shadows_the_import_is_not_the_shims():
    code = (
        "from apex import amp\n"
        "def f(amp):\n"
        "    return amp.contrib\n"
        "class C:\n"
        "    amp = object()\n"
        "    x = amp.nothing\n"
        "print([amp.contrib for amp in range(3)])\n"
    )
    assert found(code) == []


def test_an_import_guard_none_keeps_the_name_the_shims():
    code = (
        "try:\n"
        "    import apex\n"
        "except ImportError:\n"
        "    apex = None\n"
        "def build(opt):\n"
        "    return apex.contrib.optimizers.FP16_Optimizer(opt)\n"
    )
    assert found(code) == [("name", "amp_shim.contrib", 6, 17)]


def test_a_name_bound_two_ways_is_not_judged():
    code = (
        "try:\n"
        "    from apex.optimizers import FusedAdam\n"
        "except ImportError:\n"
        "    from torch.optim import AdamW as FusedAdam\n"
        "opt = FusedAdam(params, max_grad_norm=1.0)\n"
    )
    assert found(code) == []


def test_class_bodies_do_not_reach_their_methods_and_globals_reach_the_module():
    code = (
        "import apex\n"
        "class C:\n"
        "    apex = None\n"
        "    def f(self):\n"
        "        return apex.contrib\n"
        "def g():\n"
        "    global apex\n"
        "    apex = None\n"
        "    return apex.contrib\n"
    )
    # The class body's `apex` does not reach the method; g's `global apex` is the import
    # (its `apex = None` is a guard's fallback, after which the read fails all the same).
    assert found(code) == [("name", "amp_shim.contrib", 5, 21), ("name", "amp_shim.contrib", 9, 17)]


def test_state_object_attributes_are_not_module_members():
    code = (
        "from apex.amp import _amp_state\n"
        "import apex.amp._amp_state as state_module\n"
        "import apex\n"
        "scale = _amp_state.loss_scalers[0].loss_scale()\n"
        "props = apex.amp._amp_state.opt_properties\n"
        "state_module.maybe_print('x')\n"
        "state_module.no_such_helper\n"
    )
    assert found(code) == [("name", "amp_shim.amp._amp_state.no_such_helper", 7, 14)]


def test_what_every_module_object_has_is_no_missing_name():
    code = "import apex.amp as amp\nprint(amp.__class__, amp.__dict__, amp.__name__, amp.__all__)\n"
    assert found(code) == []


def test_keyword_arguments_are_checked_unless_hidden_in_double_star():
    code = (
        "from apex.optimizers import FusedAdam, FusedSGD\n"
        "a = FusedAdam(params, lr=1e-3, max_grad_norm=1.0)\n"
        "b = FusedAdam(params, **options)\n"
        "c = FusedSGD(params, 0.1, 0.9, 0, 0, False, False, True, False, 'extra')\n"
    )
    assert found(code) == [
        ("argument", "amp_shim.optimizers.FusedAdam(max_grad_norm=)", 2, 32),
        ("argument", "amp_shim.optimizers.FusedSGD(#10)", 4, 65),
    ]


def test_columns_count_characters_and_lines_count_what_python_counts():
    code = "s = 'éé'; import apex.reparameterization  # \x0c form feed\nfrom apex.contrib import xentropy\n"
    assert found(code) == [
        ("module", "amp_shim.reparameterization", 1, 18),
        ("module", "amp_shim.contrib", 2, 6),
    ]


def test_existing_shim_imports_are_judged_too():
    code = "from amp_shim.optimizers import FP16_Optimizer\nfrom apex import amp\n"
    assert found(code, ("apex", "amp_shim")) == [("name", "amp_shim.optimizers.FP16_Optimizer", 1, 33)]


def test_an_output_use_the_input_does_not_account_for_is_a_rewrite_bug():
    before = "import torch\n"
    after = "import torch\nfrom amp_shim.contrib import xentropy\n"
    with pytest.raises(VerificationError, match="amp_shim.contrib"):
        shim_names_missing(before, ast.parse(before), after, ast.parse(after))


def test_the_native_net_finds_an_apex_import_at_any_depth():
    assert imports_apex(ast.parse("def f():\n    from apex.amp import scale_loss\n")) == "apex.amp"
    assert imports_apex(ast.parse("import amp_shim\nimport apex_like\n")) is None


def test_compiling_the_users_code_prints_no_warnings():
    source = (
        "from apex import amp\n"
        "model, optimizer = amp.initialize(model, optimizer)\n"
        "if optimizer is not ():\n"
        "    pattern = '\\d+'\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = migrate_source(source, target="shim")
    assert result.target_used == "shim"
    assert [w for w in caught if issubclass(w.category, (SyntaxWarning, DeprecationWarning))] == []
