"""One GradScaler across the modules of a group (amp_migrate/project/share.py): where it lives
follows the import direction, each module's output is checked against a golden copy, and what
cannot be handed over keeps the group on the shim with the reason at the use.

Golden outputs: fixtures/project_outputs/<tree>/ holds each changed file as `migrate_project`
leaves it (device "cuda") and `diagnostics.txt` (`path: CODE ...` per file). Regenerate with
AMP_MIGRATE_UPDATE_GOLDEN=1 and read every changed output."""

import pytest

from amp_migrate.project import migrate_project

from .conftest import PROJECTS, assert_project_golden, sources

GOLDEN_TREES = (
    "checkpoint_helper",
    "trainer_package",
    "optimizer_factory",
    "scripts_share_helper",
    "two_setups_one_trainer",
    "module_value_checkpoint_helper",
    "module_value_helper_called_elsewhere",
)


@pytest.mark.parametrize("name", GOLDEN_TREES)
@pytest.mark.slow
def test_each_module_of_a_group_migrates_to_its_golden_output(name):
    assert_project_golden(name)


def test_a_trainer_that_imports_the_optimizer_factory_reads_the_factory_global():
    results = migrate_project(sources(PROJECTS / "optimizer_factory"))
    factory, trainer = results["textkit/modeling/optimization.py"], results["textkit/train.py"]
    assert factory.target_used == trainer.target_used == "native"
    assert (
        "\nscaler = None\n" in factory.code
        and "    global scaler, amp_enabled\n    scaler = torch.amp.GradScaler(" in factory.code
    )
    assert "import textkit.modeling.optimization as _amp_optimization" in trainer.code
    assert "_amp_optimization.scaler.scale(loss).backward()" in trainer.code
    assert "enabled=_amp_optimization.amp_enabled" in trainer.code  # a run-time opt level


@pytest.mark.slow
def test_scripts_run_one_at_a_time_each_set_the_helper_attribute():
    results = migrate_project(sources(PROJECTS / "scripts_share_helper"))
    for script in ("src/pretrain/run_pretrain.py", "src/tasks/run_vqa.py"):
        assert "_amp_load_save.scaler = scaler" in results[script].code
    assert results["src/utils/load_save.py"].target_used == "native"


def test_two_setups_that_may_run_in_one_process_keep_the_shim_and_say_why():
    results = migrate_project(sources(PROJECTS / "two_setups_one_trainer"))
    assert {r.target_used for r in results.values() if r.changed} == {"shim"}
    (reason,) = [d for d in results["engine/loop.py"].diagnostics if d.code == "AMP102"]
    assert (
        "engine/classifier.py, engine/detector.py each call `initialize` and may run in one process"
        in reason.message
    )


FACTORY = """from apex import amp


def build(model, optimizer):
    return amp.initialize(model, optimizer, opt_level="{level}")
"""
TRAINER = """from apex import amp
from factory import build


def fit(model, optimizer, x):
    model, optimizer = build(model, optimizer)
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""
SAVER = """import torch
from apex import amp
from factory import build


def save(model, optimizer, path):
    torch.save({"amp": amp.state_dict()}, path)
"""


def test_autocast_that_cannot_follow_the_shared_scaler_reads_the_factory_amp_switch():
    """O3's static scale of 1.0: the scaler is disabled while Apex's casts were on, so the
    trainer's autocast reads the `amp_enabled` the factory keeps beside the scaler."""
    results = migrate_project({"factory.py": FACTORY.format(level="O3"), "trainer.py": TRAINER})
    assert results["trainer.py"].target_used == results["factory.py"].target_used == "native"
    assert "    global scaler, amp_enabled\n" in results["factory.py"].code
    assert "enabled=_amp_factory.amp_enabled)" in results["trainer.py"].code


def test_autocast_that_cannot_follow_a_scaler_the_factory_also_scales_with_keeps_the_shim():
    """The factory scales a loss of its own: its autocast and the trainer's would need the
    switch in two places, which is not handed over; O3's disabled scaler cannot lead them."""
    own = (
        FACTORY.format(level="O3")
        + """

def warm_up(model, optimizer, x):
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""
    )
    results = migrate_project({"factory.py": own, "trainer.py": TRAINER})
    assert results["trainer.py"].target_used == "shim"
    assert "AMP130" in [d.code for d in results["factory.py"].diagnostics if d.falls_back] or "AMP101" in [
        d.code for d in results["factory.py"].diagnostics if d.falls_back
    ]


def test_a_checkpoint_helper_needs_no_autocast_so_o3_shares_its_scaler():
    results = migrate_project({"factory.py": FACTORY.format(level="O3"), "saver.py": SAVER})
    assert results["factory.py"].target_used == results["saver.py"].target_used == "native"
    assert '{"amp": _amp_factory.scaler.state_dict()}' in results["saver.py"].code


def test_a_helper_importing_a_script_does_not_read_the_script_global():
    """A script runs as `__main__`: `import train` from a helper would run it again as another
    module, whose global no `initialize` ever set."""
    script = FACTORY.format(level="O1") + '\n\nif __name__ == "__main__":\n    build(None, None)\n'
    results = migrate_project({"factory.py": script, "saver.py": SAVER, "main.py": "import factory\n"})
    assert results["saver.py"].target_used == "shim"
    (reason,) = [d for d in results["saver.py"].diagnostics if d.code == "AMP102"]
    assert reason.line == 7 and "cannot reach a scaler built in factory.py" in reason.message


def test_a_module_imported_under_two_names_is_two_modules_and_keeps_the_shim():
    """`from optimization import ...` (its folder on sys.path) and `from pkg.optimization import
    ...` load the file twice: the global one copy's `initialize` sets is not the other's."""
    factory = FACTORY.format(level="O1")
    trainer = TRAINER.replace("from factory import build", "from pkg.factory import build")
    main = "import sys\nsys.path.insert(0, 'pkg')\nfrom factory import build\nfrom pkg.trainer import fit\n"
    results = migrate_project(
        {"pkg/__init__.py": "", "pkg/factory.py": factory, "pkg/trainer.py": trainer, "main.py": main}
    )
    assert results["pkg/trainer.py"].target_used == "shim"
    alone = migrate_project(
        {
            "pkg/__init__.py": "",
            "pkg/factory.py": factory,
            "pkg/trainer.py": trainer,
            "main.py": main.replace("from factory", "from pkg.factory"),
        }
    )
    assert alone["pkg/trainer.py"].target_used == "native"


LEARNER = """import torch
from apex import amp


class Learner:
    def __init__(self, model, optimizer, fp16=False):
        self.model = model
        self.optimizer = optimizer
        if fp16:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def fit(self, batches):
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            self.optimizer.step()
"""
CALLBACK = """import torch
from apex import amp

from learner import Learner


def save(learner: Learner, path):
    torch.save({"amp": amp.state_dict()}, path)
"""


def test_a_scaler_kept_on_self_is_also_the_module_global_a_callback_reads():
    results = migrate_project(
        {
            "learner.py": LEARNER,
            "callbacks.py": CALLBACK,
            "main.py": "from learner import Learner\nimport callbacks\n",
        }
    )
    learner = results["learner.py"].code
    assert results["learner.py"].target_used == results["callbacks.py"].target_used == "native"
    assert (
        'self.scaler = torch.amp.GradScaler("cuda", enabled=fp16)\n        global scaler\n'
        "        scaler = self.scaler\n" in learner
    )
    assert '{"amp": _amp_learner.scaler.state_dict()}' in results["callbacks.py"].code


def test_two_helpers_with_one_module_name_get_two_aliases_in_the_script():
    script = (
        "from apex import amp\nfrom utils import save\nfrom models import save as model_save\n\n\n"
        "def train(model, optimizer):\n"
        '    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        '    save.write()\n    model_save.write()\n\n\nif __name__ == "__main__":\n    train(None, None)\n'
    )
    helper = 'import torch\nfrom apex import amp\n\n\ndef write():\n    torch.save({"amp": amp.state_dict()}, "x.pt")\n'
    results = migrate_project(
        {
            "main.py": script,
            "utils/__init__.py": "",
            "utils/save.py": helper,
            "models/__init__.py": "",
            "models/save.py": helper,
        }
    )
    code = results["main.py"].code
    assert "import models.save as _amp_save\nimport utils.save as _amp_save_1\n" in code
    assert "    _amp_save.scaler = scaler\n    _amp_save_1.scaler = scaler\n" in code


def test_a_user_that_also_runs_as_a_program_is_not_handed_the_scaler_by_attribute():
    """Run as `python helper.py`, the helper is `__main__`; the attribute the owner sets on the
    module it imports by name is another module's."""
    owner = (
        "import helper\nfrom apex import amp\n\n\ndef setup(model, optimizer):\n"
        '    return amp.initialize(model, optimizer, opt_level="O1")\n'
    )
    helper = (
        SAVER.replace("from factory import build\n", "")
        + '\n\nif __name__ == "__main__":\n    save(None, None, "x")\n'
    )
    results = migrate_project({"owner.py": owner, "helper.py": helper})
    assert results["helper.py"].target_used == "shim"


def test_a_helper_handed_apex_module_takes_the_scaler_in_that_parameter():
    results = migrate_project(sources(PROJECTS / "module_value_checkpoint_helper"))
    script, helper = results["train.py"], results["tts_like/utils/io.py"]
    assert script.target_used == helper.target_used == "native"
    assert "load_checkpoint(model, optimizer, args.restore_path, scaler=scaler)" in script.code
    assert "def load_checkpoint(model, optimizer, checkpoint_path, scaler=None):" in helper.code
    assert (
        'if scaler.is_enabled() and "amp" in state:\n        scaler.load_state_dict(state["amp"])'
        in helper.code
    )


def test_a_helper_another_module_calls_without_apex_module_keeps_the_group_on_the_shim():
    results = migrate_project(sources(PROJECTS / "module_value_helper_called_elsewhere"))
    script, helper = results["train.py"], results["tts_like/utils/io.py"]
    assert script.target_used == "shim" and not helper.changed
    refused = [d for d in script.diagnostics if d.code == "AMP155"]
    assert [(d.line, d.col) for d in refused] == [(37, 16)] and "load_checkpoint" in refused[0].message
    assert [d.code for d in helper.diagnostics] == ["AMP033"]
