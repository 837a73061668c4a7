"""After an in-place rewrite the diagnostics still give lines of the file as it was: the text
report says so once, and the JSON report gives each diagnostic's line in the written file too
(`output_line`), or null where the migration removed or rewrote that line."""

from __future__ import annotations

import json

import jsonschema

from amp_migrate.cli.output_lines import line_map

from .conftest import SHIM_INPUT, run_cli, write
from .test_notebooks import make_notebook

# The Apex import goes (two lines up) and `train_step` gains a `scaler` parameter: AMP122 is
# at its `def`, line 6 here and line 4 in the written file.
TRAIN = (
    "import torch\n"
    "\n"
    "from apex import amp\n"
    "\n"
    "\n"
    "def train_step(args, model, optimizer, x):\n"
    "    loss = model(x).sum()\n"
    "    if args.fp16:\n"
    "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
    "            scaled_loss.backward()\n"
    "    else:\n"
    "        loss.backward()\n"
    "    optimizer.step()\n"
    "\n"
    "\n"
    "def main(args, model, optimizer, x):\n"
    "    if args.fp16:\n"
    '        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
    "    train_step(args, model, optimizer, x)\n"
)
POSITIONS_NOTE = "positions above are lines of each file as it was before this run rewrote it"


def _amp122(entry: dict) -> dict:
    (found,) = [d for d in entry["diagnostics"] if d["code"] == "AMP122"]
    return found


def test_json_gives_the_original_line_and_the_written_files_line(project, schema):
    write(project / "train.py", TRAIN)
    result = run_cli(["--format", "json", "train.py"], project)
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema)
    found = _amp122(document["files"][0])
    assert (found["line"], found["output_line"]) == (6, 4)
    written = (project / "train.py").read_text().splitlines()
    assert written[found["output_line"] - 1].startswith("def train_step(")


def test_text_says_positions_are_of_the_original_after_a_rewrite(project):
    write(project / "train.py", TRAIN)
    result = run_cli(["train.py"], project)
    assert "train.py:6:1: AMP122" in result.output, result.output
    notes = [line for line in result.output.splitlines() if POSITIONS_NOTE in line]
    assert len(notes) == 1 and "1 written file" in notes[0], result.output


def test_no_positions_note_where_nothing_was_written_or_nothing_moved(project):
    write(project / "train.py", TRAIN)
    assert POSITIONS_NOTE not in run_cli(["--check", "train.py"], project).output
    write(project / "shim.py", SHIM_INPUT)  # no diagnostic has moved
    assert POSITIONS_NOTE not in run_cli(["--target", "shim", "shim.py"], project).output


def test_json_output_line_of_a_removed_line_is_null_and_of_an_untouched_file_its_line(project):
    write(project / "train.py", TRAIN.replace('"O1"', '"O2"'))
    document = json.loads(run_cli(["--format", "json", "--check", "train.py"], project).stdout)
    (o2,) = [d for d in document["files"][0]["diagnostics"] if d["code"] == "AMP110"]
    assert o2["line"] == 18 and o2["output_line"] is None  # at `amp.initialize`, which is gone
    write(project / "bad.py", "from apex import amp\ndef f(:\n")
    document = json.loads(run_cli(["--format", "json", "--check", "bad.py"], project).stdout)
    (syntax,) = document["files"][0]["diagnostics"]
    assert syntax["output_line"] == syntax["line"] == 2


def test_notebook_diagnostics_get_their_line_in_the_written_cell(project):
    cell = TRAIN.replace("import torch\n\n", "import torch\n", 1).rstrip("\n")
    make_notebook(project / "nb.ipynb", [("markdown", "# train"), ("code", cell)])
    document = json.loads(run_cli(["--format", "json", "nb.ipynb"], project).stdout)
    found = _amp122(document["files"][0])
    assert (found["cell"], found["line"], found["output_line"]) == (2, 5, 4)
    written = "".join(json.loads((project / "nb.ipynb").read_text())["cells"][1]["source"]).splitlines()
    assert written[found["output_line"] - 1].startswith("def train_step(")


def test_line_map_follows_moved_reindented_and_rewritten_lines():
    before = "a = 1\nfrom apex import amp\nb = 2\nloss = f(x)\nc.step(opt)\nd = 4\n"
    after = "a = 1\nb = 2\nwith torch.autocast('cuda'):\n    loss = f(x)\nscaler.step(opt)\nd = 4\n"
    assert line_map(before, after) == (1, None, 2, 4, 5, 6)


def test_line_map_counts_lines_as_the_parser_does():
    # A form feed inside a line is no line break to Python (str.splitlines would break there).
    before = "x = '\f'\nfrom apex import amp\ny = 1\n"
    after = "x = '\f'\ny = 1\n"
    assert line_map(before, after) == (1, None, 2)
