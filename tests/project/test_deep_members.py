"""A module nested beyond what Python runs is read as text and belongs to no group; modules
nested deeply, within what Python compiles, are read as any other (on a deeper stack)."""

import pytest

from amp_migrate.project import build_index, find_groups, migrate_project

from .conftest import PROJECTS, sources

LOOP = """\
from apex import amp

def train(model, optimizer, x):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""


def _sum(terms: int) -> str:
    return "x = " + " + ".join(["a"] * terms) + "\n"


def test_a_module_python_cannot_compile_is_read_as_text_and_joins_no_group():
    index = build_index({"deep.py": "from apex import amp\nimport helper\n" + _sum(5000), "helper.py": LOOP})
    deep = index.modules["deep.py"]
    assert not deep.parsed and not deep.touches
    assert index.edges["deep.py"] == {"helper.py"}
    assert all("deep.py" not in group.members for group in find_groups(index))


def test_a_module_python_cannot_compile_is_its_own_error_and_the_others_go_native():
    results = migrate_project({"deep.py": LOOP + _sum(5000), "one.py": LOOP, "two.py": LOOP})
    assert [(d.code, d.line) for d in results["deep.py"].diagnostics] == [("AMP001", 1)]
    assert not results["deep.py"].changed
    assert results["one.py"].target_used == results["two.py"].target_used == "native"
    assert not results["one.py"].diagnostics


@pytest.mark.slow
def test_a_group_whose_modules_hold_deep_expressions_shares_its_scaler_as_without_them():
    deep = "\n\ndef _total(a):\n    return " + " + ".join(["a"] * 700) + "\n"
    files = sources(PROJECTS / "optimizer_factory")
    results = migrate_project({p: t + deep if p.endswith(".py") else t for p, t in files.items()})
    factory, trainer = results["textkit/modeling/optimization.py"], results["textkit/train.py"]
    assert factory.target_used == trainer.target_used == "native"
    assert "_amp_optimization.scaler.scale(loss).backward()" in trainer.code
