"""An optimizer factory that calls `initialize` under `if FLAG: ... else: <warn>` (FLAG set True by
the Apex import's `try:`, AMP158) and a Trainer module that scales through Apex.

Where the Trainer scales unconditionally, the factory's scaler is its module global and both go
native; where the Trainer keeps its own switch (`self.amp_level`, from its constructor), nothing
in the tree ties that switch to the factory's guard, and the group uses the shim with AMP222 at
the Trainer's branch. Golden outputs as in test_shared_scaler.py (AMP_MIGRATE_UPDATE_GOLDEN=1)."""

import pytest

from amp_migrate.project import migrate_project

from .conftest import PROJECTS, assert_project_golden, sources


@pytest.mark.parametrize("name", ("flag_branch_factory", "trainer_flag_beside_factory"))
def test_each_module_migrates_to_its_golden_output(name):
    assert_project_golden(name)


def test_a_flag_branch_in_the_factory_is_its_body_and_the_group_goes_native():
    results = migrate_project(sources(PROJECTS / "flag_branch_factory"))
    factory, trainer = results["speechkit/optim.py"], results["speechkit/trainer.py"]
    assert factory.target_used == trainer.target_used == "native"
    assert "AMP158" in {d.code for d in factory.diagnostics}
    assert "else:" not in factory.code.split("def _setup_amp")[1]  # the warning branch is gone
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=bool(amp_level and optimizer)' in factory.code
    assert "_amp_optim.scaler.scale(loss).backward()" in trainer.code


def test_a_trainer_switch_of_its_own_keeps_the_group_on_the_shim_located_at_its_store():
    results = migrate_project(sources(PROJECTS / "trainer_flag_beside_factory"))
    assert {r.target_used for r in results.values() if r.changed} == {"shim"}
    (reason,) = [d for d in results["speechkit/trainer.py"].diagnostics if d.code == "AMP222"]
    assert reason.line == 23
    assert (
        "`self.amp_level` may be false while the GradScaler speechkit/optim.py builds is enabled: it is "
        "set at line 17, from `__init__`'s parameter `amp_level`" in reason.message
    )
