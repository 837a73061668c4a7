"""What the command line shows of files with characters `str.splitlines()` breaks at and
Python does not: diffs and notebook positions count lines as the parser does."""

import json

import nbformat

from .conftest import run_cli, write


def test_diff_breaks_lines_only_where_python_does(project):
    source = (
        "# page one\x0c\nimport torch\nfrom apex import amp  # mixed precision\u2028(O1)\n"
        "model, optimizer = amp.initialize(model, optimizer)\nprint('a\x1cb')\n"
    )
    write(project / "train.py", source)
    result = run_cli(["--diff", "--target", "shim", "train.py"], project)
    assert result.exit_code == 0, result.output
    assert (
        "@@ -1,5 +1,5 @@\n # page one\x0c\n import torch\n-from apex import amp  # mixed precision\u2028(O1)\n"
        "+from amp_shim import amp  # mixed precision\u2028(O1)\n"
    ) in result.output
    assert "No newline at end of file" not in result.output


def test_notebook_diagnostic_after_a_cell_with_carriage_return_breaks_is_on_its_own_line(project):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\rfrom apex import amp\rx = 1"),
        nbformat.v4.new_code_cell(
            "y = 2\nmodel, optimizer = amp.initialize(model, optimizer, "
            "loss_scale=128.0)\nz = 3\nw = 4\nv = 5"
        ),
    ]
    write(project / "nb.ipynb", nbformat.writes(nb))
    result = run_cli(["--format", "json", "--check", "--target", "native", "nb.ipynb"], project)
    (entry,) = json.loads(result.stdout)["files"]
    placed = {(d["cell"], d["line"]) for d in entry["diagnostics"] if d["code"] != "AMP003"}
    assert placed == {(2, 2)}, entry["diagnostics"]
