"""Scope questions answered from part of a file, and imports judged unused without scope
analysis, must give what the whole-file analysis gives (`AMP_MIGRATE_NO_PRUNE=1`)."""

import ast

import libcst as cst
import pytest

from amp_migrate.analysis.source_index import SourceIndex
from amp_migrate.migrate import migrate_source
from amp_migrate.rules.base import may_read_names, statements_spelling

# Each program puts a deprecated torch.cuda.amp name where only a whole-file scope analysis
# would seem to know what it means.
PROGRAMS = {
    "torch_rebound_as_parameter": """\
import torch


def plain(model, x):
    with torch.cuda.amp.autocast():
        return model(x)


def shadowed(torch, x):
    with torch.cuda.amp.autocast():
        return x
""",
    "import_in_function_and_global_rebinding": """\
import torch


def build():
    from torch.cuda.amp import GradScaler
    return GradScaler()


def reset():
    global GradScaler
    GradScaler = None
""",
    "global_torch_assigned_in_function": """\
import torch


def swap():
    global torch
    torch = object()


def step(x):
    with torch.cuda.amp.autocast(True):
        return x
""",
    "class_named_torch": """\
import torch


class torch:
    class cuda:
        amp = None


def step(x):
    with torch.cuda.amp.autocast():
        return x
""",
    "method_named_amp": """\
from torch.cuda.amp import autocast as cast


class Trainer:
    def amp(self):
        return cast(enabled=True)

    def step(self, x):
        with self.amp():
            return x
""",
    "read_before_import": """\
scaler = GradScaler()
from torch.cuda.amp import GradScaler
other = GradScaler(init_scale=2.0)
""",
    "import_used_in_string_annotation": '''\
from torch.cuda.amp import GradScaler


def make() -> "GradScaler":
    """Builds a GradScaler."""
    return GradScaler()


def keep(scaler: "GradScaler"):
    return scaler
''',
    "import_exported_by_all": """\
from torch.cuda.amp import autocast

__all__ = ["autocast", "run"]


def run(x):
    with autocast():
        return x
""",
    "import_named_only_in_docstrings_and_messages": '''\
"""Uses autocast from torch.cuda.amp."""
from torch.cuda.amp import autocast


def run(x):
    """autocast around the forward."""
    with autocast():
        print("autocast on")
        return x
''',
}


def _run(text: str, target: str):
    result = migrate_source(text, target=target)
    return result.code, [repr(d) for d in result.diagnostics], result.target_used


@pytest.mark.parametrize("target", ["auto", "shim"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.slow
def test_pruned_scope_analysis_agrees_with_the_whole_file(name, target, monkeypatch):
    text = PROGRAMS[name]
    pruned = _run(text, target)
    monkeypatch.setenv("AMP_MIGRATE_NO_PRUNE", "1")
    assert _run(text, target) == pruned


def test_a_shadowed_torch_is_left_alone_while_the_module_one_is_rewritten():
    code = migrate_source(PROGRAMS["torch_rebound_as_parameter"]).code
    assert 'torch.autocast("cuda"' in code
    assert "torch.cuda.amp.autocast()" in code  # the parameter named torch


def _tree(text: str) -> tuple[cst.Module, SourceIndex]:
    module = cst.parse_module(text)
    return module, SourceIndex(text, module, ast.parse(text))


def test_docstrings_and_attribute_names_are_no_use_of_an_import():
    module, index = _tree('"""amp here"""\nimport x\ny = torch.amp.GradScaler()\nprint("amp")\n')
    assert may_read_names(module, frozenset({"amp"}), index) is False


@pytest.mark.parametrize(
    "text",
    [
        "def f(s: 'amp.X'): pass\n",
        "__all__ = ['other']\n",
        "from typing import cast\ny = cast('amp', 1)\n",
        "f(amp=1)\n",
        "del amp\n",
    ],
)
def test_what_scope_analysis_may_read_as_a_use(text):
    module, index = _tree(text)
    assert may_read_names(module, frozenset({"amp"}), index)


def test_dropped_statements_leave_the_kept_nodes_themselves():
    text = "import torch\n\n\ndef f():\n    a = 1\n    b = torch.cuda\n\n\nc = 2\n"
    module, index = _tree(text)
    pruned = statements_spelling(module, index.skipped({"torch"}))
    function = pruned.body[1]
    assert [type(s).__name__ for s in pruned.body] == ["SimpleStatementLine", "FunctionDef"]
    assert function.body.body == (module.body[1].body.body[1],)  # the very node
    assert pruned.body[0] is module.body[0]


def test_names_bound_by_imports_of_a_package_start_its_qualified_names():
    _, index = _tree(
        "import torch.cuda as tc\nfrom torch.cuda.amp import autocast as ac\nfrom os import path\n"
    )
    assert index.root_words("torch") == {"torch", "tc", "ac"}
    assert index.qualifying("amp") == {"amp", "ac"}
    _, index = _tree("class torch: pass\ndef amp(): pass\n")
    assert index.root_words("torch") is None
    assert index.qualifying("amp") is None
    _, index = _tree("def amp(): pass\n")
    assert index.qualifying("amp", "torch") == {"amp"}  # a local's prefix cannot start with torch
