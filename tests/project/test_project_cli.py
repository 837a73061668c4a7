"""`amp-migrate PATH` on trees whose files share Apex objects: each group ends on one target,
the files moved to the shim say which file and line moved them, and no tree ends half native
and half Apex."""

import pytest

from amp_migrate import migrate_source
from amp_migrate.project import build_index, find_groups

from .conftest import PROJECTS, codes, run_json, sources

NATIVE_MARK, SHIM_MARK = "torch.amp.GradScaler", "amp_shim"


def assert_groups_on_one_target(root, before):
    """Every group of the original tree is all native or all shim on disk."""
    after = sources(root)
    for group in find_groups(build_index(before)):
        marks = {
            (
                "shim"
                if SHIM_MARK in after[p]
                else "native"
                if NATIVE_MARK in after[p] or "apex" not in after[p]
                else "apex"
            )
            for p in group.members
            if after[p] != before[p] or "apex" in after[p]
        }
        assert len(marks - {"apex"} if "shim" in marks else marks) <= 1, (group.members, marks)
        assert not ("native" in marks and ("shim" in marks or "apex" in marks)), (group.members, marks)


@pytest.mark.slow
def test_a_script_that_would_go_native_alone_uses_the_shim_with_its_checkpoint_helper(tree):
    root = tree("checkpoint_helper_sets_scale")
    before = sources(root)
    assert migrate_source(before["train.py"]).target_used == "native"  # alone, it would
    document = run_json(root)
    train, helper = document["by_path"]["train.py"], document["by_path"]["utils/checkpoint.py"]
    assert train["target_used"] == helper["target_used"] == "shim"
    (moved,) = [d for d in train["diagnostics"] if d["code"] == "AMP030"]
    assert moved["line"] == 10  # the initialize call
    assert moved["message"].startswith("uses the shim because utils/checkpoint.py:21 does: AMP313")
    assert "AMP030" not in codes(helper)
    assert document["exit"] == 0 and document["summary"]["written"] == 2
    assert_groups_on_one_target(root, before)


def test_a_script_and_the_checkpoint_helper_it_imports_go_native_with_one_scaler(tree):
    root = tree("checkpoint_helper")
    before = sources(root)
    document = run_json(root)
    train, helper = document["by_path"]["train.py"], document["by_path"]["utils/checkpoint.py"]
    assert train["target_used"] == helper["target_used"] == "native"
    after = sources(root)
    assert "import utils.checkpoint as _amp_checkpoint" in after["train.py"]
    assert "_amp_checkpoint.scaler = scaler" in after["train.py"]
    assert "\nscaler = None\n" in after["utils/checkpoint.py"]
    assert '"amp": scaler.state_dict()' in after["utils/checkpoint.py"]
    assert "AMP131" in codes(train) and "AMP131" in codes(helper)
    assert_groups_on_one_target(root, before)


def test_a_self_contained_script_beside_a_group_stays_native(tree):
    root = tree("trainer_package")
    before = sources(root)
    document = run_json(root, "--diff")
    files = document["by_path"]
    assert files["finetune_alone.py"]["target_used"] == "native"
    assert files["main.py"]["target_used"] == files["trainer/loop.py"]["target_used"] == "native"
    assert "AMP030" not in codes(files["finetune_alone.py"])
    assert sources(root) == before  # --diff writes nothing


def test_callers_of_a_function_returning_apex_amp_are_warned_and_the_provider_uses_the_shim(tree):
    root = tree("amp_provider")
    before = sources(root)
    document = run_json(root, "--check")
    files = document["by_path"]
    learner = files["models/learner.py"]
    assert not learner["changed"] and codes(learner) == ["AMP031", "AMP162", "AMP031"]
    assert [d["line"] for d in learner["diagnostics"]] == [10, 10, 28]
    assert "register_half_function" in learner["diagnostics"][1]["message"]  # the provider's line, named
    assert files["utils/pytorch_utils.py"]["target_used"] == "shim"
    assert document["summary"]["kept_apex"] == 1
    assert document["exit"] == 1
    assert sources(root) == before


def test_check_counts_a_file_whose_apex_stays_even_when_nothing_would_change(tree):
    root = tree("amp_provider")
    run_json(root)  # migrate: the provider now imports amp_shim
    assert "from amp_shim import amp" in (root / "utils" / "pytorch_utils.py").read_text()
    again = run_json(root, "--check")
    assert again["exit"] == 0 and again["summary"]["kept_apex"] == 0  # the provider returns the shim


def test_a_run_time_import_of_apex_keeps_the_module_it_imports_on_the_shim(tree):
    root = tree("dynamic_import")
    before = sources(root)
    assert migrate_source(before["steps.py"]).target_used == "native"
    document = run_json(root, "--check")
    files = document["by_path"]
    backend, steps = files["backend.py"], files["steps.py"]
    assert [(d["code"], d["line"]) for d in backend["diagnostics"] if d["code"] == "AMP032"] == [
        ("AMP032", 11)
    ]
    assert steps["target_used"] == "shim"
    (moved,) = [d for d in steps["diagnostics"] if d["code"] == "AMP030"]
    assert "backend.py:11 does: it imports 'apex.amp' at run time" in moved["message"]
    assert document["exit"] == 1 and document["summary"]["kept_apex"] == 1


def test_an_engine_stepping_an_fp16_optimizer_it_was_handed_keeps_its_builder_on_the_shim(tree):
    root = tree("fp16_handed")
    before = sources(root)
    document = run_json(root)
    files = document["by_path"]
    assert files["train.py"]["target_used"] == "shim"
    engine = files["engine.py"]
    assert not engine["changed"] and codes(engine) == ["AMP033"] and engine["diagnostics"][0]["line"] == 8
    assert sources(root)["engine.py"] == before["engine.py"]
    assert_groups_on_one_target(root, before)


def test_target_native_leaves_a_group_untouched_when_one_member_cannot_go_native(tree):
    root = tree("checkpoint_helper_sets_scale")
    before = sources(root)
    document = run_json(root, "--target", "native")
    train = document["by_path"]["train.py"]
    assert not train["changed"] and "AMP034" in codes(train)
    assert document["exit"] == 2 and sources(root) == before


def test_migrating_the_tree_twice_changes_nothing_the_second_time(tree):
    root = tree("checkpoint_helper")
    run_json(root)
    migrated = sources(root)
    again = run_json(root)
    assert sources(root) == migrated and again["summary"]["changed"] == 0


@pytest.mark.parametrize("name", sorted(p.name for p in PROJECTS.iterdir() if p.is_dir()))
@pytest.mark.slow
def test_a_second_run_on_a_migrated_tree_changes_nothing(tree, name):
    """The shim a first run put in Apex's place ties nothing: a re-run leaves every file as it is."""
    root = tree(name)
    first = run_json(root)
    migrated = sources(root)
    again = run_json(root, "--check")
    assert sources(root) == migrated
    assert not [f["path"] for f in again["files"] if f["changed"]]
    assert again["summary"]["kept_apex"] <= first["summary"]["kept_apex"]  # a run-time import stays
    assert again["exit"] == (1 if again["summary"]["kept_apex"] else 0)
