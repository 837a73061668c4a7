"""Two ways a group's scaler is handed over where the index alone refused
(project/inference_owners.py, project/entry_switch.py, plan/switch_flow.py `_entered`):

* an owner whose every `initialize` only prepares models for inference, in a program of its own
  that runs none of the code that scales, does not compete with the owner that trains (AMP153);
* the owner's guard passed as an argument into the user's function (`run_epochs(...,
  half=opts.mixed.enabled)`) makes the user's `if half:` the scaler's switch; where that cannot
  be relied on, the group keeps the shim and AMP154 says why at the user's function.

Golden outputs: fixtures/project_outputs/<tree>/ (AMP_MIGRATE_UPDATE_GOLDEN=1 regenerates them;
read every changed output)."""

import pytest

from amp_migrate.project import migrate_project
from amp_migrate.project.entry_switch import entry_refusals, entry_switch
from amp_migrate.project.index import build_index
from amp_migrate.project.inference_owners import competing, inference_only

from .conftest import PROJECTS, assert_project_golden, codes, run_json, sources

TREES = ("switch_argument_trainer", "switch_argument_called_elsewhere", "inference_owner_in_training_process")
ENGINE, PRETRAIN, SCORE = "caption/engine.py", "caption/pretrain.py", "tools/score.py"


@pytest.mark.parametrize("name", TREES)
def test_handover_trees_migrate_to_their_golden_outputs(name):
    assert_project_golden(name)


def _index(files):
    return build_index({p: t for p, t in files.items() if p.endswith(".py")})


def test_the_guard_passed_by_keyword_is_the_loops_switch():
    files = sources(PROJECTS / "switch_argument_trainer")
    assert entry_switch(_index(files), files, PRETRAIN, ENGINE) == (("run_epochs", "half", ()),)
    results = migrate_project(files)
    assert {results[p].target_used for p in (ENGINE, PRETRAIN, SCORE)} == {"native"}
    engine = results[ENGINE].code
    assert "scaler.scale(loss).backward()" in engine and "loss.backward()" not in engine.replace(
        "scaler.scale(loss).backward()", ""
    )
    assert "    _amp_engine.scaler = scaler\n" in results[PRETRAIN].code


def test_the_inference_program_steps_aside_and_says_so():
    files = sources(PROJECTS / "switch_argument_trainer")
    index = _index(files)
    assert inference_only(index, files[SCORE], SCORE) and not inference_only(index, files[PRETRAIN], PRETRAIN)
    assert competing(index, files, [PRETRAIN, SCORE], ENGINE) == [PRETRAIN]
    (note,) = [d for d in migrate_project(files)[SCORE].diagnostics if d.code == "AMP153"]
    assert note.line == 18 and "caption/engine.py gets the scaler caption/pretrain.py builds" in note.message


def test_an_inference_program_imported_by_the_trainer_competes_and_says_why():
    results = migrate_project(sources(PROJECTS / "inference_owner_in_training_process"))
    (reason,) = [d for d in results[ENGINE].diagnostics if d.code == "AMP102"]
    assert (
        "caption/score.py only prepares models for inference, but caption/pretrain.py imports it"
        in reason.message
    )


def test_an_inference_program_that_calls_the_scaling_function_competes():
    files = sources(PROJECTS / "switch_argument_trainer")
    files[SCORE] = files[SCORE].replace(
        "from caption.engine import move_batch", "from caption.engine import move_batch, run_epochs"
    )
    results = migrate_project(files)
    assert results[ENGINE].target_used == "shim"
    (reason,) = [d for d in results[ENGINE].diagnostics if d.code == "AMP102"]
    assert "it names `run_epochs` of caption/engine.py, which uses Apex" in reason.message


def test_a_keyword_none_optimizer_is_inference_only_and_a_list_of_one_is_not():
    files = sources(PROJECTS / "switch_argument_trainer")
    index = _index(files)
    none = files[SCORE].replace(
        'amp.initialize(model, opt_level="O1")', 'amp.initialize(model, optimizers=None, opt_level="O1")'
    )
    listed = files[SCORE].replace(
        'amp.initialize(model, opt_level="O1")', 'amp.initialize(model, [opt], opt_level="O1")'
    )
    assert inference_only(index, none, SCORE) and not inference_only(index, listed, SCORE)


def _pretrain_with(files, old, new):
    assert old in files[PRETRAIN]
    files[PRETRAIN] = files[PRETRAIN].replace(old, new)
    return files


CALL = "    run_epochs(model, optimizer, scheduler, loader, opts.epochs, log,\n"


def test_a_positional_prefix_of_the_guard_reaches_the_users_attribute_test():
    files = sources(PROJECTS / "switch_argument_trainer")
    files = _pretrain_with(files, "half=opts.mixed.enabled, ", "")
    files = _pretrain_with(
        files, "accumulate=opts.accumulate)", "accumulate=opts.accumulate, mixed=opts.mixed)"
    )
    files[ENGINE] = files[ENGINE].replace(
        "half=False, max_norm=0.0, accumulate=1)", "max_norm=0.0, accumulate=1, mixed=None)"
    )
    files[ENGINE] = files[ENGINE].replace("if half:", "if mixed.enabled:")
    assert entry_switch(_index(files), files, PRETRAIN, ENGINE) == (("run_epochs", "mixed", ("enabled",)),)
    assert migrate_project(files)[ENGINE].target_used == "native"
    files = _pretrain_with(
        files,
        CALL + "               max_norm=opts.clip, accumulate=opts.accumulate, mixed=opts.mixed)",
        CALL + "               opts.clip, opts.accumulate, opts.mixed)",
    )
    assert entry_switch(_index(files), files, PRETRAIN, ENGINE) == (("run_epochs", "mixed", ("enabled",)),)


@pytest.mark.parametrize(
    "change, why",
    [
        (
            (
                "    if opts.mixed.enabled:\n",
                "    run_epochs(model, optimizer, scheduler, loader, 1, log, half=opts.mixed.enabled)\n"
                "    if opts.mixed.enabled:\n",
            ),
            "caption/pretrain.py also calls it at line 13, not after that test in `pretrain`",
        ),
        (
            ("    return model\n", "    opts.mixed.enabled = False\n    return model\n"),
            "it may change after that test (rebound or stored into in caption/pretrain.py)",
        ),
        (
            ("    return model\n", "    log(run_epochs)\n    return model\n"),
            "caption/pretrain.py names `run_epochs` other than by calling it",
        ),
    ],
)
def test_an_owner_side_doubt_keeps_the_shim_with_amp154(change, why):
    files = _pretrain_with(sources(PROJECTS / "switch_argument_trainer"), *change)
    assert entry_switch(_index(files), files, PRETRAIN, ENGINE) == ()
    results = migrate_project(files)
    assert results[ENGINE].target_used == "shim"
    (note,) = [d for d in results[ENGINE].diagnostics if d.code == "AMP154"]
    assert note.line == 13 and note.message.endswith(why), note.message


@pytest.mark.parametrize(
    "old, new, why",
    [
        (
            "            step += 1\n",
            "            step += 1\n            half = half and step > 1\n",
            "`run_epochs` rebinds `half`",
        ),
        (
            "def move_batch(batch, device):\n",
            "def warm_up(model, optimizer, loader, log):\n"
            "    run_epochs(model, optimizer, None, loader, 1, log)\n\n\ndef move_batch(batch, device):\n",
            "caption/engine.py itself names `run_epochs` (a call there may pass another value)",
        ),
    ],
)
def test_a_user_side_doubt_keeps_the_shim_with_amp154(old, new, why):
    files = sources(PROJECTS / "switch_argument_trainer")
    files[ENGINE] = files[ENGINE].replace(old, new)
    index = _index(files)
    assert entry_switch(index, files, PRETRAIN, ENGINE) == ()
    assert [w for _, w in entry_refusals(index, files, PRETRAIN, ENGINE)][0].endswith(why)
    results = migrate_project(files)
    assert results[ENGINE].target_used == "shim"
    assert "AMP154" in [d.code for d in results[ENGINE].diagnostics]


def test_the_command_line_hands_the_switch_over_and_notes_the_inference_program(tree):
    document = run_json(tree("switch_argument_trainer"), "--check")
    files = document["by_path"]
    assert "AMP153" in codes(files["tools/score.py"])
    assert not [
        c for p in (ENGINE, PRETRAIN, SCORE) for c in codes(files[p]) if c in ("AMP030", "AMP102", "AMP220")
    ]


@pytest.mark.slow
def test_an_inference_script_run_one_at_a_time_still_sets_the_attribute_and_the_switch_follows_the_trainer():
    """Both programs import the loop module and neither imports the other: each sets its
    attribute, as before; the loop's `if fp16:` follows the training script's switch, since
    the evaluation program runs none of the loop's Apex code."""
    root = PROJECTS.parent / "programs" / "equivalence" / "switch_argument_trainer"
    results = migrate_project(sources(root), device="cpu")
    assert {r.target_used for r in results.values() if r.changed} == {"native"}
    assert "_amp_loop.scaler = scaler" in results["evaluate.py"].code
    assert "    scaler.scale(loss).backward()\n" in results["vlcore/loop.py"].code
    assert "AMP153" not in [d.code for d in results["evaluate.py"].diagnostics]
