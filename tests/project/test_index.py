"""What the project index records, read from the fixture trees and small sources."""

from amp_migrate.project import build_index, find_groups
from amp_migrate.project.index import hit_lines, module_name

from .conftest import PROJECTS, sources


def test_module_names_and_relative_imports_give_the_trees_edges():
    index = build_index(sources(PROJECTS / "trainer_package"))
    assert module_name("trainer/__init__.py") == "trainer"
    assert index.edges["main.py"] == {"trainer/__init__.py"}
    assert index.edges["trainer/__init__.py"] == {"trainer/loop.py"}
    assert index.edges["trainer/loop.py"] == {"trainer/metrics.py"}
    assert not index.modules["trainer/metrics.py"].parsed  # no Apex word: its imports come from text


def test_initialize_records_what_its_results_are_bound_to():
    facts = build_index(sources(PROJECTS / "trainer_package")).modules["main.py"]
    (site,) = facts.initialize
    assert (site.line, site.function) == (10, "main")
    assert site.what == "(model, optimizer) = amp.initialize"


def test_uses_of_amp_state_are_recorded_per_function():
    facts = build_index(sources(PROJECTS / "checkpoint_helper")).modules["utils/checkpoint.py"]
    assert [(s.what, s.function) for s in facts.uses] == [
        ("amp.state_dict", "save_checkpoint"),
        ("amp.load_state_dict", "load_checkpoint"),
    ]
    assert not facts.initialize


def test_a_function_returning_apex_amp_is_a_provider_and_its_callers_are_found_under_any_name():
    index = build_index(sources(PROJECTS / "amp_provider"))
    (provider,) = index.modules["utils/pytorch_utils.py"].providers
    assert provider.what == "get_amp"
    learner = index.modules["models/learner.py"]
    assert [s.what.split(",")[0] for s in learner.provided] == [
        "self.amp = get_amp(...)",
        "mp = get_amp(...)",
    ]
    assert [s.what for s in learner.initialize] == [
        "(self.model, self.optimizer) = self.amp.initialize",
        "(model, optimizer) = mp.initialize",
    ]


def test_a_provider_is_only_matched_in_modules_that_can_reach_it():
    index = build_index(
        {
            "lib/amp_utils.py": "def get_amp():\n    from apex import amp\n    return amp\n",
            "elsewhere.py": "def get_amp():\n    return None\namp = get_amp()\n",
        }
    )
    assert index.modules["elsewhere.py"].provided == []


def test_run_time_imports_of_apex_are_recorded_with_the_module_named():
    facts = build_index(sources(PROJECTS / "dynamic_import")).modules["backend.py"]
    assert [s.what for s in facts.dynamic] == ["apex.amp"]
    assert facts.dynamic_state == facts.dynamic
    other = build_index(
        {
            "opt.py": "import importlib\nFused = importlib.import_module('apex.optimizers')\n"
            "x = __import__('apex')\n"
        }
    ).modules["opt.py"]
    assert [s.what for s in other.dynamic] == ["apex.optimizers", "apex"]
    assert [s.what for s in other.dynamic_state] == ["apex"]


def test_fp16_optimizer_methods_on_an_object_handed_in_are_foreign_uses():
    index = build_index(sources(PROJECTS / "fp16_handed"))
    assert [s.what for s in index.modules["train.py"].fp16_optimizers] == ["FP16_Optimizer"]
    engine = index.modules["engine.py"]
    assert [s.line for s in engine.foreign] == [8, 9]
    assert not engine.apex_imports


def test_tensor_backward_with_a_gradient_is_not_an_fp16_optimizer_use():
    facts = build_index(
        {
            "m.py": "def f(y, grad, optimizer):\n    y.backward(grad)\n"
            "    loss.backward()\n    optimizer.backward(y)\n"
        }
    ).modules["m.py"]
    assert [s.line for s in facts.foreign] == [4]


def test_hit_lines_count_lines_as_the_parser_does():
    assert hit_lines("x = 1\nimport os\n\n\nreturn amp\n") == [2, 5]


def test_groups_tie_a_user_to_the_owner_it_shares_an_importer_with():
    (group,) = find_groups(build_index(sources(PROJECTS / "trainer_package"))).__iter__()
    assert group.members == ("main.py", "trainer/loop.py")  # finetune_alone.py stays alone
    (tie,) = group.ties
    assert (tie.user, tie.owner) == ("trainer/loop.py", "main.py")
    assert tie.how == "main.py reaches both by imports"


def test_a_user_no_owner_shares_an_importer_with_is_tied_to_every_owner():
    index = build_index(
        {
            "a.py": "from apex import amp\nm, o = amp.initialize(m, o)\n",
            "b.py": "from apex import amp\nm, o = amp.initialize(m, o)\n",
            "helper.py": "from apex import amp\ndef save():\n    return amp.state_dict()\n",
        }
    )
    (group,) = find_groups(index)
    assert group.members == ("a.py", "b.py", "helper.py")


def test_apex_imports_without_amp_state_tie_nothing():
    index = build_index(
        {
            "train.py": "from apex import amp\nfrom factory import make\n"
            "m, o = amp.initialize(m, make(m))\nwith amp.scale_loss(l, o) as s:\n    s.backward()\n",
            "factory.py": "from apex.optimizers import FusedAdam\ndef make(m):\n    return FusedAdam(m.parameters())\n",
        }
    )
    assert find_groups(index) == []


def test_sites_are_located_in_characters_on_the_parsers_lines():
    text = "# café\rfrom apex import amp\r\nx = 'é'; m, o = amp.initialize(m, o)\n"
    (site,) = build_index({"m.py": text}).modules["m.py"].initialize
    assert (site.line, site.col) == (3, 10)


def test_a_user_with_no_importer_is_not_tied_to_scripts_or_to_owners_in_other_folders():
    init = "from apex import amp\nm, o = amp.initialize(m, o)\n"
    index = build_index(
        {
            "examples/run_a.py": init + "if __name__ == '__main__':\n    pass\n",
            "other/setup_amp.py": init,
            "pkg/setup_amp.py": init,
            "pkg/steps/helper.py": "from apex import amp\ndef save():\n    return amp.state_dict()\n",
        }
    )
    (group,) = find_groups(index)
    assert group.members == ("pkg/setup_amp.py", "pkg/steps/helper.py")
    assert index.modules["examples/run_a.py"].script and not index.modules["pkg/setup_amp.py"].script


def test_how_one_module_can_import_another_as_a_module_object():
    from amp_migrate.project.index import Spelling

    index = build_index(
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/opt.py": "",
            "pkg/b/__init__.py": "",
            "pkg/b/train.py": "from ..a.opt import make\n",
            "pkg/b/eval.py": "from pkg.a.opt import make\n",
            "main.py": "import pkg\n",
            "pkg/b/loop.py": "",
        }
    )
    assert index.spelling("pkg/b/train.py", "pkg/a/opt.py") == Spelling("a", "opt", 2)
    assert index.spelling("pkg/b/eval.py", "pkg/a/opt.py") == Spelling("pkg.a.opt")
    assert index.spelling("pkg/b/loop.py", "pkg/a/opt.py") == Spelling("pkg.a.opt")  # eval.py's, resolved
    assert index.spelling("main.py", "pkg/b/loop.py") == Spelling(
        "pkg.b.loop"
    )  # inside the package it imports
    assert index.one_name("pkg/a/opt.py")


def test_import_reach_and_entry_modules():
    index = build_index(
        {
            "main.py": "import trainer\n",
            "trainer.py": "import utils\n",
            "utils.py": "",
            "other.py": "import utils\n",
        }
    )
    assert index.reaches("main.py", "utils.py") and not index.reaches("utils.py", "main.py")
    assert index.imported("trainer.py") and not index.imported("main.py")


def test_a_file_imported_under_two_absolute_names_is_two_modules():
    index = build_index(
        {"pkg/__init__.py": "", "pkg/opt.py": "", "a.py": "import opt\n", "b.py": "from pkg import opt\n"}
    )
    assert not index.one_name("pkg/opt.py")
