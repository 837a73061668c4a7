"""Notebooks: code cells migrated together, IPython syntax kept, outputs and metadata kept,
unchanged cells byte-identical, the result valid nbformat, diagnostics at cell and line."""

import json

import nbformat

from .conftest import run_cli, snapshot, write

CELLS = [
    ("markdown", "# Training\n\nWith Apex."),
    ("code", "%matplotlib inline\n!pip install apex\nimport torch\nfrom apex import amp"),
    ("code", "x = torch.randn(4, 4)\nprint(x.sum())"),
    (
        "code",
        "model = torch.nn.Linear(4, 4)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")',
    ),
    (
        "code",
        "for step in range(3):\n    optimizer.zero_grad()\n    loss = model(x).sum()\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n"
        "    optimizer.step()\n    %time pass\nloss",
    ),
    ("code", "%%bash\necho apex"),
]


def make_notebook(path, cells=CELLS, **write_kwargs):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    for n, (kind, source) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
        cell.id = f"c{n}"
        if kind == "code":
            cell.execution_count = n
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output {n}\n")]
        nb.cells.append(cell)
    text = nbformat.writes(nb, **write_kwargs) + "\n"
    write(path, text)
    return text


def cell_spans(text):
    """The exact text of each cell object in the notebook's JSON."""
    decoder = json.JSONDecoder()
    i = text.index("[", text.index('"cells"')) + 1
    spans = []
    while True:
        while text[i] in " \r\n\t,":
            i += 1
        if text[i] == "]":
            return spans
        _, end = decoder.raw_decode(text, i)
        spans.append(text[i:end])
        i = end


def test_notebook_round_trip(project):
    old = make_notebook(project / "train.ipynb")
    result = run_cli(["train.ipynb"], project)
    assert result.exit_code == 0, result.output
    new = (project / "train.ipynb").read_text()
    nb = nbformat.reads(new, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    old_spans, new_spans = cell_spans(old), cell_spans(new)
    changed = [n for n, (a, b) in enumerate(zip(old_spans, new_spans)) if a != b]
    assert changed == [1, 3, 4]
    # Outside the changed cells, not a byte moved; inside them, only the source.
    for n in changed:
        old, new = old.replace(old_spans[n], f"<cell {n}>"), new.replace(new_spans[n], f"<cell {n}>")
    assert new == old
    old_nb = nbformat.reads(make_notebook(project / "again.ipynb"), as_version=nbformat.NO_CONVERT)
    for before, after in zip(old_nb.cells, nb.cells):
        assert {k: v for k, v in before.items() if k != "source"} == {
            k: v for k, v in after.items() if k != "source"
        }
    sources = [c.source for c in nb.cells]
    assert sources[1].startswith("%matplotlib inline\n!pip install apex\nimport torch")
    assert "apex import" not in sources[1]
    assert sources[3].endswith('scaler = torch.amp.GradScaler("cuda")')
    assert "scaler.scale(loss).backward()" in sources[4] and "    %time pass\nloss" in sources[4]
    assert sources[5] == "%%bash\necho apex"
    # Idempotent.
    again = snapshot(project)
    assert run_cli(["--check", "train.ipynb"], project).exit_code == 0, "not idempotent"
    assert snapshot(project) == again


def test_notebook_layout_other_than_nbformats_is_kept(project):
    path = project / "wide.ipynb"
    make_notebook(path)
    nb = json.loads(path.read_text())
    old = json.dumps(nb, indent=2, ensure_ascii=True) + "\n"
    write(path, old.replace("\n", "\r\n"))
    assert run_cli(["--target", "shim", "wide.ipynb"], project).exit_code == 0
    new = path.read_bytes().decode()
    assert new == old.replace("\n", "\r\n").replace("from apex import amp", "from amp_shim import amp")


def test_notebook_diagnostics_point_at_cell_and_line(project):
    cells = [
        ("code", "import torch\nfrom apex import amp"),
        ("markdown", "text"),
        ("code", "x = 1\nmodel, optimizer = amp.initialize(model, optimizer)"),
    ]
    make_notebook(project / "nb.ipynb", cells)
    result = run_cli(["--format", "json", "--check", "nb.ipynb"], project)
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["kind"] == "notebook"
    (diagnostic,) = [d for d in entry["diagnostics"] if d["severity"] == "warning"]
    assert (diagnostic["cell"], diagnostic["line"]) == (3, 2)
    text = run_cli(["--check", "nb.ipynb"], project).output
    assert f"nb.ipynb:cell 3:2:{diagnostic['col']}: {diagnostic['code']} " in text


def test_notebook_diff_is_per_cell(project):
    make_notebook(project / "t.ipynb")
    result = run_cli(["--diff", "--target", "shim", "t.ipynb"], project)
    assert "--- t.ipynb:cell 2\n+++ t.ipynb:cell 2\n" in result.output
    assert "-from apex import amp\n+from amp_shim import amp\n" in result.output


def test_syntax_error_in_a_cell_is_reported_at_that_cell(project):
    cells = [("code", "from apex import amp"), ("code", "x = 1\ndef f(:\n    pass")]
    make_notebook(project / "bad.ipynb", cells)
    before = snapshot(project)
    result = run_cli(["bad.ipynb"], project)
    assert result.exit_code == 2
    assert "bad.ipynb:cell 2:2:" in result.output and "AMP001" in result.output
    assert snapshot(project) == before


def test_rewrite_spanning_cells_falls_back_to_the_shim(project):
    cells = [
        (
            "code",
            "import torch\nfrom apex import amp\nmodel, opt = amp.initialize(model, opt)\nout = model(x)",
        ),
        ("code", "loss = out.sum()\nwith amp.scale_loss(loss, opt) as s:\n    s.backward()\nopt.step()"),
    ]
    make_notebook(project / "span.ipynb", cells)
    native = run_cli(["--target", "native", "--check", "span.ipynb"], project)
    assert native.exit_code == 2, native.output
    assert (
        "span.ipynb:cell 1:2:1: AMP023 the native rewrite of this code reaches into cell 2" in native.output
    )
    assert "AMP003" in native.output
    result = run_cli(["--format", "json", "span.ipynb"], project)
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["target_used"] == "shim" and entry["written"]
    (spans,) = [d for d in entry["diagnostics"] if d["code"] == "AMP023"]
    assert (spans["cell"], spans["line"], spans["severity"]) == (1, 2, "warning")
    nb = nbformat.read(project / "span.ipynb", as_version=4)
    assert nb.cells[0].source.startswith("import torch\nfrom amp_shim import amp\n")
    assert nb.cells[1].source == cells[1][1]
