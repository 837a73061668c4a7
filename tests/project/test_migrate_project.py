"""`migrate_project`: the in-memory form the equivalence harness and the corpus bench use."""

from amp_migrate import migrate_source
from amp_migrate.project import migrate_project

from .conftest import PROJECTS, sources


def test_files_sharing_apex_state_get_one_target_in_memory():
    files = sources(PROJECTS / "checkpoint_helper_sets_scale")
    results = migrate_project(files, device="cpu")
    assert {results[p].target_used for p in ("train.py", "utils/checkpoint.py")} == {"shim"}
    assert [d.code for d in results["train.py"].diagnostics] == ["AMP030"]


def test_a_file_in_no_group_is_migrated_as_migrate_source_migrates_it():
    files = sources(PROJECTS / "trainer_package")
    results = migrate_project(files, device="cpu")
    alone = migrate_source(files["finetune_alone.py"], device="cpu")
    assert results["finetune_alone.py"] == alone


def test_a_file_that_does_not_parse_is_reported_and_keeps_its_group_on_the_shim():
    files = dict(sources(PROJECTS / "checkpoint_helper"))
    files["utils/checkpoint.py"] += "\ndef broken(:\n"
    results = migrate_project(files)
    assert [d.code for d in results["utils/checkpoint.py"].diagnostics] == ["AMP001"]
    assert results["train.py"].target_used == "shim"
    assert "AMP001" in results["train.py"].diagnostics[0].message
