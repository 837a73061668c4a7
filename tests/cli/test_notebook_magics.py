"""IPython lines in notebooks keep what they reference: `%time`/`%timeit` statements are
migrated as code; any other IPython line that names something the native rewrite removes sends
the notebook to the shim (AMP021 at its cell and line)."""

import json

import nbformat
import pytest

from amp_migrate.io.notebook import _Masked, _restore

from .conftest import run_cli, snapshot
from .test_notebooks import make_notebook

SETUP = [
    ("code", "import torch\nfrom apex import amp"),
    (
        "code",
        "model = torch.nn.Linear(4, 4)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")',
    ),
    (
        "code",
        "for step in range(3):\n    optimizer.zero_grad()\n    loss = model(torch.randn(2, 4)).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n"
        "    optimizer.step()",
    ),
]


def migrate(project, last_cell: str, *args: str):
    make_notebook(project / "nb.ipynb", SETUP + [("code", last_cell)])
    result = run_cli(["--format", "json", *args, "nb.ipynb"], project)
    (entry,) = json.loads(result.stdout)["files"]
    nb = nbformat.read(project / "nb.ipynb", as_version=4)
    return entry, [c.source for c in nb.cells]


@pytest.mark.parametrize(
    "line, migrated",
    [
        ("%time print(amp.state_dict())", "%time print(scaler.state_dict())"),
        ("%time state = amp.state_dict()  # for the log", "%time state = scaler.state_dict()  # for the log"),
        ("%timeit -n 3 -r 1 amp.state_dict()", "%timeit -n 3 -r 1 scaler.state_dict()"),
        ("if True:\n    %time print(amp.state_dict())", "if True:\n    %time print(scaler.state_dict())"),
    ],
)
def test_time_magic_statements_are_migrated_as_code(project, line, migrated):
    entry, sources = migrate(project, line)
    assert entry["target_used"] == "native", entry
    assert sources[3] == migrated
    assert "apex" not in "".join(sources)
    again = snapshot(project)
    assert run_cli(["--check", "nb.ipynb"], project).exit_code == 0, "not idempotent"
    assert snapshot(project) == again


@pytest.mark.parametrize(
    "line, name, col",
    [
        ("!echo {amp.state_dict()}", "amp", 8),
        ("files = !ls $amp", "amp", 14),
        ("%store amp", "amp", 8),
        ("amp.initialize?", "amp", 1),
        ("%time x = 1; print(amp)", "amp", 20),  # two statements: not migrated as code
        ("%timeit -n 1 -r 1 amp.state_dict() \\\n    if True else None", "amp", 19),  # continued
        ("%timeit state = amp.state_dict()", "amp", 17),  # %timeit keeps no assignment
        ("cat {amp.__file__}", "amp", 6),  # automagic `%cat`, which expands `{expr}`
    ],
)
def test_ipython_lines_naming_a_removed_name_fall_back_at_their_cell_and_line(project, line, name, col):
    entry, sources = migrate(project, "x = 1\n" + line)
    assert entry["target_used"] == "shim"
    assert sources[0] == "import torch\nfrom amp_shim import amp"
    assert sources[3] == "x = 1\n" + line
    (found,) = [d for d in entry["diagnostics"] if d["code"] == "AMP021"]
    assert (found["cell"], found["line"], found["col"]) == (4, 2, col)
    assert f"names `{name}`" in found["message"]


def test_a_timeit_cell_is_not_migrated_and_is_checked_like_an_ipython_line(project):
    """IPython runs a `%%timeit` body many times, in a namespace of its own."""
    cell = "%%timeit -n 2\nstate = dict(lr=0.1)\nstate.update(amp.state_dict())"
    entry, sources = migrate(project, cell)
    assert entry["target_used"] == "shim" and sources[3] == cell
    (found,) = [d for d in entry["diagnostics"] if d["code"] == "AMP021"]
    assert (found["cell"], found["line"], found["col"]) == (4, 3, 14)
    entry, sources = migrate(project, "%%timeit -n 2\nstate = dict(lr=0.1)")
    assert entry["target_used"] == "native" and sources[3] == "%%timeit -n 2\nstate = dict(lr=0.1)"


def test_native_target_leaves_the_notebook_untouched_and_says_where(project):
    make_notebook(project / "nb.ipynb", SETUP + [("code", "%store amp")])
    before = snapshot(project)
    result = run_cli(["--target", "native", "nb.ipynb"], project)
    assert result.exit_code != 0
    assert "nb.ipynb:cell 4:1:8: AMP021 " in result.output
    assert snapshot(project) == before


@pytest.mark.parametrize(
    "line",
    [
        "!pip install apex",
        "%pip install apex",
        "%matplotlib inline",
        "%load_ext autoreload",
        "print?",
        "%time model(torch.ones(1, 4))",
        "!echo {step}",
        "%env APEX_LOG=1",
        # automagic: IPython runs these line magics and aliases without their `%`
        "ls ./embeddings/",
        "pip install apex",
        "cd ..\nls -la",
        "mkdir -p logs",
    ],
)
def test_ipython_lines_that_name_nothing_removed_stay_native(project, line):
    entry, sources = migrate(project, line)
    assert entry["target_used"] == "native", entry
    assert sources[3] == line
    assert not [d for d in entry["diagnostics"] if d["code"] == "AMP021"]


@pytest.mark.parametrize(
    "piece",
    [
        # the statement the marker sits on is no longer whole: it continues on the next line
        "scaler.step(  # __amp_migrate_time_0__\n    optimizer)",
        # the `%timeit` loop's body became two statements
        "for __amp_migrate_timeit_0__ in __amp_migrate_repeat__: scaler.step(optimizer); scaler.update()",
        # or an assignment, which `%timeit` would not keep
        "for __amp_migrate_timeit_0__ in __amp_migrate_repeat__: scaler = torch.amp.GradScaler()",
    ],
)
def test_a_timed_statement_that_is_not_one_statement_any_more_cannot_be_put_back(piece):
    prefix = "%timeit " if "timeit" in piece else "%time "
    assert _restore(piece, [_Masked(["..."], 1, prefix, "optimizer.step()")], set()) is None


@pytest.mark.parametrize("line", ["ls = 3", "pwd", "cd(1)", "    ls -la"])
def test_a_line_that_is_python_or_indented_is_never_taken_for_automagic(line):
    """IPython applies automagic only where the line is no Python, and only at a cell's top level."""
    from amp_migrate.io.notebook import _automagic

    assert not _automagic(line)
