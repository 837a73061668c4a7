"""Rules visit only statements that spell their words; that must never change a result
(test_corpus_invariants.py runs every fixture input pruned and unpruned)."""

import ast

import libcst as cst
import pytest

from amp_migrate.analysis.source_index import SourceIndex
from amp_migrate.migrate import migrate_source

SAMPLE = """\
import torch
from apex import amp


@torch.no_grad()
def evaluate(model, loader):
    for x in loader:
        model(x)


def train(model, optimizer, data):
    model, optimizer = amp.initialize(model, optimizer)
    for x, y in data:
        if x is None:
            continue
        elif y is None:
            break
        else:
            loss = model(x).sum()
        try:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        except RuntimeError:
            pass
        finally:
            optimizer.step(); print("stepped")
        if y: print(y)
"""


def _index(text: str) -> SourceIndex:
    return SourceIndex(text, cst.parse_module(text), ast.parse(text))


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


def test_index_pairs_every_statement_with_its_lines():
    index = _index(SAMPLE)
    assert index.statements is not None
    places = {_code(e.node).splitlines()[0]: (e.start, e.end) for e in index.statements}
    assert places["import torch"] == (1, 1)
    assert places["@torch.no_grad()"] == (5, 8)  # decorators count
    train = index.statements[-1]
    flat, stack = {}, list(train.children)
    while stack:
        entry = stack.pop()
        flat[_code(entry.node).splitlines()[0]] = (entry.start, entry.end)
        stack.extend(entry.children)
    assert flat["continue"] == (15, 15)
    assert flat["break"] == (17, 17)  # elif
    assert flat["loss = model(x).sum()"] == (19, 19)  # else
    assert flat["scaled.backward()"] == (22, 22)  # inside with, inside try
    assert flat["pass"] == (24, 24)  # except
    assert flat['optimizer.step(); print("stepped")'] == (26, 26)  # finally, two statements
    assert flat["if y: print(y)"] == (27, 27)  # one-line suite: a unit


def test_index_skips_statements_that_spell_none_of_the_words():
    index = _index(SAMPLE)
    skipped = index.skipped({"amp"})
    kept = [e for e in index.statements if id(e.node) not in skipped]
    assert [_code(e.node).splitlines()[0] for e in kept] == [
        "from apex import amp",
        "def train(model, optimizer, data):",
    ]
    train = kept[-1]
    inside = [_code(e.node).splitlines()[0] for e in train.children if id(e.node) in skipped]
    assert inside == []  # both statements of train's body spell `amp`
    loop = train.children[1]
    assert [_code(e.node).splitlines()[0] for e in loop.children if id(e.node) in skipped] == [
        "if x is None:",
        "if y: print(y)",
    ]


def test_unchanged_statements_keep_their_identity_through_the_rules(monkeypatch):
    from amp_migrate import migrate

    seen = {}
    real = migrate._run

    def spy(rules, module, text, index, options, *project, **planned):
        out, state = real(rules, module, text, index, options, *project, **planned)
        seen["before"], seen["after"] = module, out
        return out, state

    monkeypatch.setattr(migrate, "_run", spy)
    migrate_source(SAMPLE)
    before, after = seen["before"], seen["after"]
    assert after is not before
    evaluate = [s for s in after.body if isinstance(s, cst.FunctionDef) and s.name.value == "evaluate"]
    assert evaluate and evaluate[0] is before.body[2]  # it spells no Apex word: never rebuilt


def test_unpairable_files_are_not_pruned():
    text = "x = 1\n"
    index = SourceIndex(text, cst.parse_module(text), ast.parse("x = 1\ny = 2\n"))
    assert index.statements is None and index.skipped({"amp"}) == frozenset()


@pytest.mark.parametrize(
    "source, name, expected",
    [
        ("def f(optimizer):\n    optimizer.step()\n", "optimizer", True),
        ("def f():\n    optimizer = make()\n    optimizer.step()\n", "optimizer", True),
        ("def f():\n    optimizer.step()\n", "optimizer", None),
        ("def f():\n    global optimizer\n    optimizer = make()\n", "optimizer", False),
        ("def f():\n    for optimizer in opts:\n        optimizer.step()\n", "optimizer", True),
        ("def f():\n    def g(optimizer):\n        pass\n    optimizer.step()\n", "optimizer", None),
        ("def f():\n    with make() as (a, optimizer):\n        pass\n", "optimizer", True),
        ("def f():\n    import optimizer\n", "optimizer", True),
        ("def f(*, k=1, **optimizer):\n    pass\n", "optimizer", True),
    ],
)
def test_binding_scope_of_a_name_in_a_function(source, name, expected):
    from amp_migrate.plan.types import binds_in_ast

    assert binds_in_ast(ast.parse(source).body[0], name) is expected


TEXT_CASES = [
    "import apex\n",
    "import os, \\\n    apex\n",
    "from apex import amp\n",
    "from \\\n  apex import amp\n",
    "x = torch.cuda.amp.autocast()\n",
    "from torch.cuda import amp\n",
    "y = self.amp\n",
    "z = a.torch.amp\n",
    "import torch.cuda.amp as tca\n",
    "from torch.cpu.amp import autocast\n",
]


@pytest.mark.parametrize("text", TEXT_CASES, ids=lambda t: t[:30])
def test_text_check_never_misses_code_that_touches_apex(text):
    """A second run is skipped when the text check says no: it must be a superset (every
    fixture file is held to it in test_corpus_invariants.py)."""
    from amp_migrate.migrate import may_touch_apex, touches_apex

    tree = ast.parse(text)
    assert may_touch_apex(text) or not touches_apex(tree)


def test_text_check_lets_native_torch_amp_through():
    from amp_migrate.migrate import may_touch_apex

    assert not may_touch_apex("import torch\n# apex is gone\nscaler = torch.amp.GradScaler()\n")


def test_rules_do_not_enter_functions_that_spell_no_apex_word(monkeypatch):
    """Only ForwardOutsideAutocast reads `evaluate`, which spells no Apex word: it calls the
    model `initialize` cast, outside autocast, which is what that rule reports (AMP170)."""
    from amp_migrate.plan.planner import Planner
    from amp_migrate.rules.base import Rule

    entered: set[tuple[str, str]] = set()
    real = Rule.visit_node

    def spy(self, node):
        if isinstance(node, cst.FunctionDef):
            entered.add((type(self).__name__, node.name.value))
        return real(self, node)

    real_planner = Planner.on_visit

    def planner_spy(self, node):
        enters = real_planner(self, node)
        if enters and isinstance(node, cst.FunctionDef):
            entered.add((type(self).__name__, node.name.value))
        return enters

    monkeypatch.setattr(Rule, "visit_node", spy)
    monkeypatch.setattr(Planner, "on_visit", planner_spy)
    result = migrate_source(SAMPLE)
    assert result.changed
    readers = {rule for rule, function in entered if function == "evaluate"}
    assert ("PlanTraining", "train") in entered and readers == {"ForwardOutsideAutocast"}
    assert [d.line for d in result.diagnostics if d.code == "AMP170"] == [
        SAMPLE.splitlines().index("        model(x)") + 1
    ]
    monkeypatch.setenv("AMP_MIGRATE_NO_PRUNE", "1")
    entered.clear()
    unpruned = migrate_source(SAMPLE)
    assert (unpruned.code, unpruned.diagnostics) == (result.code, result.diagnostics)
    assert len({rule for rule, function in entered if function == "evaluate"}) > 1


def test_the_evaluation_check_does_not_enter_functions_that_name_no_model(monkeypatch):
    from amp_migrate.rules.eval_casts import ForwardOutsideAutocast

    entered: set[str] = set()
    real = ForwardOutsideAutocast.visit_node

    def spy(self, node):
        if isinstance(node, cst.FunctionDef):
            entered.add(node.name.value)
        return real(self, node)

    monkeypatch.setattr(ForwardOutsideAutocast, "visit_node", spy)
    migrate_source(SAMPLE + "\n\ndef log(values):\n    for v in values:\n        print(v)\n")
    assert "evaluate" in entered and "log" not in entered


SHIM_OUTPUT = """\
import torch
import amp_shim as apex
model, optimizer = apex.amp.initialize(model, optimizer, opt_level="O1")
with apex.amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
"""


def test_the_amp_of_a_name_that_only_holds_amp_shim_is_not_apex():
    """A shim migration's output (`import amp_shim as apex`) is left without a libcst parse, on
    a second run and in the output check that simulates one."""
    from amp_migrate.migrate import touches_apex

    assert not touches_apex(ast.parse(SHIM_OUTPUT))
    assert not touches_apex(ast.parse("import amp_shim\namp_shim.amp.initialize(model, optimizer)\n"))
    result = migrate_source(SHIM_OUTPUT)
    assert not result.changed and result.diagnostics == ()


@pytest.mark.parametrize(
    "rebinding",
    [
        "apex = load_module()\n",
        "def f(apex):\n    return apex\n",
        "from apex_helpers import *\n",
        "for apex in modules:\n    pass\n",
        "def g():\n    global apex\n",
        "import real_apex as apex\n",
        "from elsewhere import apex\n",
        "class apex:\n    pass\n",
        "try:\n    pass\nexcept Exception as apex:\n    pass\n",
        "match value:\n    case apex:\n        pass\n",
        "match value:\n    case [*apex]:\n        pass\n",
    ],
)
def test_a_name_bound_to_anything_else_anywhere_may_still_hold_apex(rebinding):
    from amp_migrate.migrate import touches_apex

    assert touches_apex(ast.parse(SHIM_OUTPUT + rebinding))
