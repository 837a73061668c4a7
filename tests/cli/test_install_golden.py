"""Golden files for every install-file kind (fixtures/install/<case>/): each input, in a tree
whose Python files decide the outcome, becomes <case>/<outcome>/<file> (dependency files;
the others stay byte for byte) with <case>/<outcome>/diagnostics.txt.
AMP_MIGRATE_UPDATE_GOLDEN=1 rewrites the expected files; read every one before committing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import NATIVE_INPUT, run_cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "install"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
REPORTED = ("dockerfile", "shell", "markdown")

SHIM = "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer)\n"
CONTRIB = "from apex.contrib.sparsity import ASP\nASP.prune_trained_model(model, optimizer)\n"
#: The tree's Python files for each outcome: migrated native (no Apex, no shim left), on the
#: shim (AMP102 sends it there), left on Apex (`apex.contrib` is not in the shim: AMP470), and
#: one file left on Apex beside one on the shim.
DECIDERS = {
    "removed": {"train.py": NATIVE_INPUT},
    "replaced": {"train.py": SHIM},
    "kept": {"train.py": CONTRIB},
    "kept_beside_shim": {"train.py": CONTRIB, "finetune.py": SHIM},
}


def _input(case: str) -> Path:
    (path,) = [p for p in (FIXTURES / case).iterdir() if p.is_file()]
    return path


@pytest.mark.parametrize("outcome", sorted(DECIDERS))
@pytest.mark.parametrize("case", CASES)
def test_install_file_becomes_its_golden_output(tmp_path, case, outcome):
    source = _input(case)
    tree = tmp_path / "repo"
    tree.mkdir()
    shutil.copyfile(source, tree / source.name)
    for name, text in DECIDERS[outcome].items():
        (tree / name).write_text(text)
    document = json.loads(run_cli(["--format", "json", "repo"], tmp_path).stdout)
    entries = [f for f in document["files"] if f["path"] == f"repo/{source.name}" and f["kind"] != "python"]
    assert len(entries) == 1, document["files"]
    (entry,) = entries
    lines = "".join(
        f"{entry['path']}:{d['line']}:{d['col']}: {d['code']} {d['message']}\n" for d in entry["diagnostics"]
    )
    expected = FIXTURES / case / outcome
    output = (tree / source.name).read_bytes()
    if os.environ.get("AMP_MIGRATE_UPDATE_GOLDEN") == "1":
        expected.mkdir(exist_ok=True)
        (expected / "diagnostics.txt").write_text(lines)
        if entry["kind"] not in REPORTED:
            (expected / source.name).write_bytes(output)
    assert lines == (expected / "diagnostics.txt").read_text()
    if entry["kind"] in REPORTED:
        assert output == source.read_bytes()
        assert not entry["changed"]
    else:
        assert output == (expected / source.name).read_bytes()
        assert entry["written"] == (output != source.read_bytes())
