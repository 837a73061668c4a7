"""`if cond: <scale_loss backward> else: loss.backward()` in a module whose GradScaler another
module builds (project/share.py `owner_switch`, plan/switch_flow.py): it collapses to one
scaled backward only where `cond` is provably the guard of the owner's `initialize` (passed down
unchanged from this module's one call of the owner's builder) and availability flags that are
True once Apex is gone. And where run-time options may make Apex cast without scaling, the
module that hands the scaler over sets autocast's switch beside it. Each tree's outputs are checked against fixtures/project_outputs/<tree>/
(AMP_MIGRATE_UPDATE_GOLDEN=1 regenerates them; read every changed output)."""

import pytest

from amp_migrate.project import migrate_project
from amp_migrate.project.index import build_index
from amp_migrate.project.share import owner_switch

from .conftest import PROJECTS, assert_project_golden, sources

TREES = (
    "flag_guarded_builder",
    "builder_shared_by_two_scripts",
    "builder_args_rebound",
    "builder_called_where_the_trainer_runs",
)
TRAINER, BUILDER = "train_contrastive.py", "simclr_like/builder.py"


@pytest.mark.parametrize("name", TREES)
def test_guarded_builder_trees_migrate_to_their_golden_outputs(name):
    assert_project_golden(name)


def test_flag_and_builder_guard_collapse_to_one_scaled_backward():
    results = migrate_project(sources(PROJECTS / "flag_guarded_builder"))
    trainer = results[TRAINER]
    assert results[BUILDER].target_used == trainer.target_used == "native"
    assert "_amp_builder.scaler.scale(loss).backward()" in trainer.code
    assert "loss.backward()" not in trainer.code.replace("scaler.scale(loss).backward()", "")
    assert "use_apex = True" in trainer.code and "try:" not in trainer.code


def test_the_builder_guard_is_given_from_its_parameters():
    files = sources(PROJECTS / "flag_guarded_builder")
    index = build_index({p: t for p, t in files.items() if p.endswith(".py")})
    assert owner_switch(index, files, BUILDER, TRAINER) == ("make_encoder", ((0, "cfg", ("fp16",)),))


@pytest.mark.parametrize("name", ["builder_args_rebound", "builder_called_where_the_trainer_runs"])
def test_a_guard_that_may_differ_from_the_builders_keeps_the_shim_with_amp220(name):
    results = migrate_project(sources(PROJECTS / name))
    assert results[TRAINER].target_used == results[BUILDER].target_used == "shim"
    assert [d.line for d in results[TRAINER].diagnostics if d.code == "AMP220"] == [23]


def test_a_second_program_calling_the_builder_in_its_own_process_does_not_block():
    files = sources(PROJECTS / "builder_shared_by_two_scripts")
    index = build_index({p: t for p, t in files.items() if p.endswith(".py")})
    assert owner_switch(index, files, BUILDER, TRAINER)[0] == "make_encoder"


# -- autocast's switch apart from the scaler's ---------------------------------------------------
APART_TREES = ("config_options_fitter", "factory_run_time_options")


@pytest.mark.parametrize("name", APART_TREES)
def test_run_time_option_trees_migrate_to_their_golden_outputs(name):
    test_guarded_builder_trees_migrate_to_their_golden_outputs(name)


def test_a_script_with_run_time_options_hands_the_fitter_its_amp_switch_beside_the_scaler():
    results = migrate_project(sources(PROJECTS / "config_options_fitter"))
    script, fitter = results["kaggle/train.py"], results["kaggle/tools/fitter.py"]
    assert script.target_used == fitter.target_used == "native"
    assert '_amp_fitter.amp_enabled = bool(args.fp16) and fitter.config.opt_level != "O0"' in script.code
    assert "\namp_enabled = False\n" in fitter.code
    assert 'torch.autocast("cuda", dtype=torch.float16, enabled=amp_enabled)' in fitter.code
    assert "is_enabled()" not in fitter.code


def test_options_fixed_to_a_scaled_level_keep_autocast_following_the_scaler():
    files = sources(PROJECTS / "config_options_fitter")
    files["kaggle/train.py"] = (
        files["kaggle/train.py"]
        .replace("opt_level=fitter.config.opt_level,\n", 'opt_level="O1",\n')
        .replace("loss_scale=fitter.config.loss_scale, ", "")
    )
    fitter = migrate_project(files)["kaggle/tools/fitter.py"]
    assert "enabled=scaler.is_enabled()" in fitter.code and "amp_enabled" not in fitter.code


def test_a_factory_read_through_its_module_global_keeps_amp_switch_beside_its_scaler():
    results = migrate_project(sources(PROJECTS / "factory_run_time_options"))
    factory, trainer = results["nlp/modeling/optimization.py"], results["nlp/train.py"]
    assert factory.target_used == trainer.target_used == "native"
    assert "\namp_enabled = False\n" in factory.code and "    global scaler, amp_enabled\n" in factory.code
    assert '    amp_enabled = bool(opt_level) and opt_level != "O0"\n' in factory.code
    assert "enabled=_amp_optimization.amp_enabled)" in trainer.code
