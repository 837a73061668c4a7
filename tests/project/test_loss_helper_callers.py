"""A function that scales the loss it is given puts autocast in its callers (AMP207); a caller
in another module of the tree cannot get it, so there the file uses the shim (AMP206)."""

from amp_migrate import migrate_source
from amp_migrate.project import migrate_project

from .conftest import PROJECTS, codes, run_json, sources


def test_alone_the_script_puts_autocast_around_its_loops_forward():
    text = (PROJECTS / "loss_helper_imported_elsewhere" / "train.py").read_text()
    result = migrate_source(text)
    assert result.target_used == "native"
    assert "AMP207" in {d.code for d in result.diagnostics}
    assert "with torch.autocast(" in result.code and "scaler.scale(loss).backward()" in result.code


def test_with_the_module_that_calls_the_helper_the_script_uses_the_shim():
    files = sources(PROJECTS / "loss_helper_imported_elsewhere")
    results = migrate_project(files)
    train = results["train.py"]
    assert train.target_used == "shim"
    (found,) = [d for d in train.diagnostics if d.code == "AMP206"]
    assert found.line == 6 and "finetune.py" in found.message
    assert results["finetune.py"].code == files["finetune.py"]


def test_the_command_line_moves_the_script_to_the_shim_too(tree):
    root = tree("loss_helper_imported_elsewhere")
    document = run_json(root)
    train = document["by_path"]["train.py"]
    assert train["target_used"] == "shim" and "AMP206" in codes(train)
    assert "amp_shim" in sources(root)["train.py"]


def test_without_a_caller_elsewhere_the_tree_keeps_the_native_script():
    files = sources(PROJECTS / "loss_helper_imported_elsewhere")
    del files["finetune.py"]
    assert migrate_project(files)["train.py"].target_used == "native"


def test_the_report_names_the_nearest_module_that_spells_the_helper_as_the_run_was_given_it(tmp_path):
    """A sibling in the file's own folder, not the first path of the tree: so a run that also
    covers other folders reports the same module for the file."""
    files = sources(PROJECTS / "loss_helper_imported_elsewhere")
    for path, text in files.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / path).write_text(text)
    (tmp_path / "aaa").mkdir()
    (tmp_path / "aaa" / "notes.py").write_text("# backward_step is the script's helper\n")
    train = run_json(tmp_path, "--diff")["by_path"]["pkg/train.py"]
    (found,) = [d for d in train["diagnostics"] if d["code"] == "AMP206"]
    assert "is also named in pkg/finetune.py," in found["message"]
    alone = run_json(tmp_path / "pkg", "--diff")["by_path"]["train.py"]
    (found,) = [d for d in alone["diagnostics"] if d["code"] == "AMP206"]
    assert "is also named in finetune.py," in found["message"]
