"""Apex's module from a provider function of the tree (`amp = get_amp(fp16)`): the group goes
native where the provider only imports and returns it and every call is followed
(project/provide.py, amp_migrate/analysis/provided.py); otherwise the reason where it arises.

Golden outputs as in test_shared_scaler.py: fixtures/project_outputs/<tree>/ (regenerate with
AMP_MIGRATE_UPDATE_GOLDEN=1 and read every changed output)."""

import ast

import pytest

from amp_migrate.project import migrate_project

from .conftest import PROJECTS, assert_project_golden, run_json, sources


@pytest.mark.parametrize("name", ("amp_provider_native", "amp_provider_stored"))
def test_a_provider_group_migrates_to_its_golden_output(name):
    assert_project_golden(name)


def test_every_caller_and_the_provider_go_native_together():
    results = migrate_project(sources(PROJECTS / "amp_provider_native"))
    assert {p: r.target_used for p, r in results.items() if r.changed} == {
        "textcls/train.py": "native",
        "textcls/distill.py": "native",
        "textcls/utils/amp_utils.py": "native",
    }
    assert "def load_amp" not in results["textcls/utils/amp_utils.py"].code
    assert 'scaler = torch.amp.GradScaler("cuda", enabled=args.half)' in results["textcls/distill.py"].code
    assert "load_amp" not in results["textcls/train.py"].code


@pytest.mark.slow
def test_the_command_line_migrates_the_group_natively(tree):
    root = tree("amp_provider_native")
    document = run_json(root)
    files = document["by_path"]
    assert {
        files[p]["target_used"]
        for p in ("textcls/train.py", "textcls/distill.py", "textcls/utils/amp_utils.py")
    } == {"native"}
    assert "apex" not in (root / "textcls" / "utils" / "amp_utils.py").read_text()
    again = run_json(root, "--check")
    assert again["exit"] == 0


def test_the_command_line_says_why_a_stored_value_keeps_the_group_on_the_shim(tree):
    files = run_json(tree("amp_provider_stored"))["by_path"]
    assert files["summarizer/half.py"]["target_used"] == "shim"
    model = files["summarizer/model.py"]
    assert not model["changed"]
    assert [(d["code"], d["line"]) for d in model["diagnostics"]] == [("AMP031", 11), ("AMP163", 11)]


PROVIDER = """import torch


def get_amp(fp16):
    if fp16:
{body}
    else:
        amp = None
    return amp
"""
CALLER = """import torch

from lib.amp_utils import get_amp


def train(model, optimizer, x, fp16=False):
    amp = get_amp(fp16)
{between}    if {guard}:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss = model(x).sum()
    if amp:
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
    else:
        loss.backward()
    optimizer.step()
"""
IMPORT = "        from apex import amp\n"


def _run(body=IMPORT, guard="fp16 and amp", between=""):
    return migrate_project(
        {
            "lib/amp_utils.py": PROVIDER.format(body=body.rstrip("\n")),
            "train.py": CALLER.format(guard=guard, between=between),
        }
    )


def _codes(result):
    return [d.code for d in result.diagnostics]


@pytest.mark.parametrize("guard", ("fp16 and amp", "amp", "amp is not None", "fp16"))
def test_a_guard_equal_to_the_providers_condition_goes_native(guard):
    results = _run(guard=guard)
    assert results["train.py"].target_used == results["lib/amp_utils.py"].target_used == "native"
    assert (
        'scaler = torch.amp.GradScaler("cuda", enabled=fp16)\n' in results["train.py"].code
        and "get_amp" not in results["train.py"].code
    )


@pytest.mark.parametrize(
    "body, at, why",
    [
        (
            IMPORT + '        amp.register_half_function(torch, "einsum")\n',
            7,
            "also runs `amp.register_half_function",
        ),
        (
            "        try:\n            from apex import amp\n        except ImportError:\n            amp = None\n",
            8,
            "does more than raise when Apex is missing",
        ),
        ("        print('apex')\n" + IMPORT, 6, "also runs `print('apex')`"),
    ],
)
def test_a_provider_that_does_more_keeps_the_group_on_the_shim_and_says_where(body, at, why):
    results = _run(body=body)
    provider, caller = results["lib/amp_utils.py"], results["train.py"]
    assert provider.target_used == "shim" and not caller.changed
    (own,) = [d for d in provider.diagnostics if d.code == "AMP162"]
    assert own.line == at and why in own.message
    (there,) = [d for d in caller.diagnostics if d.code == "AMP162"]
    assert there.line == 7 and f"lib/amp_utils.py:{at}" in there.message and "AMP031" in _codes(caller)


@pytest.mark.parametrize(
    "guard, between, why",
    [
        ("amp and x is not None", "", "is not the provider's condition"),
        ("fp16", "    fp16 = not fp16\n", "rebinds what the provider's condition reads"),
        ("amp", "    print(amp)\n", "read before Apex is set up"),
        ("amp", "    reset(fp16)\n", "may change what the provider's condition read"),
    ],
)
def test_a_caller_whose_value_cannot_be_followed_keeps_the_group_on_the_shim(guard, between, why):
    results = _run(guard=guard, between=between)
    assert results["lib/amp_utils.py"].target_used == "shim" and not results["train.py"].changed
    (found,) = [d for d in results["train.py"].diagnostics if d.code == "AMP163"]
    assert why in found.message


def test_a_provider_named_by_a_module_that_does_not_call_it_stays_on_the_shim():
    files = {
        "lib/amp_utils.py": PROVIDER.format(body=IMPORT.rstrip("\n")),
        "train.py": CALLER.format(guard="amp", between=""),
        "lib/__init__.py": "from .amp_utils import get_amp\n",
    }
    results = migrate_project(files)
    assert results["lib/amp_utils.py"].target_used == "shim"
    assert any(
        d.code == "AMP162" and "lib/__init__.py names it" in d.message
        for d in results["lib/amp_utils.py"].diagnostics
    )


SHAPED_CALLER = """import torch

from lib.amp_utils import {imported}


def train(model, optimizer, x, fp16=False):
    amp = {call}
    {guard}model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    loss = model(x).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""
ALWAYS = "def get_amp():\n    from apex import amp\n    return amp\n"
RETURNED_INSIDE = (
    "def get_amp(on=True):\n    if on:\n        from apex import amp\n        return amp\n    return None\n"
)


@pytest.mark.parametrize(
    "provider, imported, call, guard, enabled",
    [
        (ALWAYS, "get_amp", "get_amp()", "", 'GradScaler("cuda")\n'),
        (
            RETURNED_INSIDE,
            "get_amp",
            "get_amp(fp16)",
            "if amp:\n        ",
            'GradScaler("cuda", enabled=fp16)\n',
        ),
        (
            RETURNED_INSIDE,
            "get_amp",
            "get_amp()",
            "if amp:\n        ",
            'GradScaler("cuda")\n',
        ),  # the default, True
        (
            RETURNED_INSIDE,
            "get_amp as amp_or_none",
            "amp_or_none(on=fp16)",
            "if amp is not None:\n        ",
            'GradScaler("cuda", enabled=fp16)\n',
        ),
    ],
)
def test_provider_shapes_and_an_aliased_import_go_native(provider, imported, call, guard, enabled):
    results = migrate_project(
        {
            "lib/amp_utils.py": provider,
            "train.py": SHAPED_CALLER.format(imported=imported, call=call, guard=guard),
        }
    )
    code = results["train.py"].code
    assert results["train.py"].target_used == results["lib/amp_utils.py"].target_used == "native"
    assert f"    scaler = torch.amp.{enabled}" in code
    assert "amp = None" not in code and "get_amp" not in code and "import" not in code.split("\n", 2)[2]


def _tab_mixed(text: str, line: str) -> str:
    """`line` (indented by 12 spaces) indented by `    \\t    `: the same column to Python (a
    block's lines must all be spelled so), a spelling libcst cannot read inside a block
    indented by spaces."""
    assert f"\n{line}\n" in text, line
    return text.replace(f"\n{line}\n", "\n    \t    " + line.lstrip(" ") + "\n", 1)


@pytest.mark.slow
def test_a_group_whose_provider_and_caller_mix_tabs_into_indentation_migrates_like_one_that_does_not():
    plain = sources(PROJECTS / "amp_provider_native")
    mixed = dict(plain)
    provider, caller = "textcls/utils/amp_utils.py", "textcls/train.py"
    mixed[provider] = _tab_mixed(plain[provider], "            from apex import amp")
    kept = "            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)"
    mixed[caller] = _tab_mixed(_tab_mixed(plain[caller], "            loss.backward()"), kept)
    expected, results = migrate_project(plain), migrate_project(mixed)
    assert {p: (r.changed, r.target_used) for p, r in results.items()} == {
        p: (r.changed, r.target_used) for p, r in expected.items()
    }
    for path, result in results.items():
        assert ast.dump(ast.parse(result.code)) == ast.dump(ast.parse(expected[path].code)), path
        assert [d.code for d in result.diagnostics] == [d.code for d in expected[path].diagnostics], path
    assert "def load_amp" not in results[provider].code
    assert "\n    \t    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n" in results[caller].code
