"""The fix-safety tiers: an unsafe fix falls back by default, is applied with `--unsafe-fixes`
(the option, the CLI flag, the config key), and names a docs/differences.md entry that names
its rule and codes. The goldens (test_corpus_invariants) hold the outputs of both tiers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from amp_migrate import docs, migrate_source
from amp_migrate.cli.config import ConfigError, load
from amp_migrate.diagnostics import CODES, Severity, define
from amp_migrate.differences import DIFFERENCES
from amp_migrate.rules import REGISTRY

TWO_LOSSES = textwrap.dedent(
    """\
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in data:
        out = model(x)
        with amp.scale_loss(crit_a(out, y), optimizer) as scaled:
            scaled.backward(retain_graph=True)
        with amp.scale_loss(crit_b(out, y), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        optimizer.zero_grad()
    """
)


def _unsafe_codes() -> list[str]:
    docs.register_all_codes()
    return sorted(c for c, entry in CODES.items() if entry.unsafe)


def test_there_are_unsafe_fixes_and_each_names_an_entry_that_names_it_back():
    codes = _unsafe_codes()
    assert codes, "no code is an unsafe fix"
    for code in codes:
        entry = DIFFERENCES[CODES[code].unsafe]
        assert code in entry.codes, (code, entry.id)
        assert f"entry {entry.id}" in CODES[code].why, f"{code}'s page does not name its entry"
        assert CODES[code].severity == Severity.WARNING, code


def test_every_entry_names_its_rule_its_codes_and_what_verify_accepts():
    docs.register_all_codes()
    planners_and_rules = {rule.__name__ for rule in REGISTRY} | {"PlanTraining"}
    for entry in DIFFERENCES.values():
        assert entry.rule in planners_and_rules, entry.rule
        assert entry.codes and all(CODES[c].unsafe == entry.id for c in entry.codes), entry.id
        assert entry.quantities and entry.what and entry.when and entry.size, entry.id
        row = next(
            line for line in docs.render_unsafe_fixes().splitlines() if line.startswith(f"| {entry.id} |")
        )
        assert entry.rule in row and all(c in row for c in entry.codes), row


def test_an_unsafe_fix_cannot_also_be_a_fallback():
    with pytest.raises(ValueError, match="never a fallback"):
        define("AMP999", "test-only", Severity.WARNING, "s", "w", falls_back=True, unsafe="U1")
    assert "AMP999" not in CODES


def test_without_the_flag_an_unsafe_fix_keeps_the_shim_and_says_how_to_apply_it():
    result = migrate_source(TWO_LOSSES, target="auto")
    assert result.target_used == "shim"
    (reason,) = [d for d in result.diagnostics if d.code == "AMP216"]
    assert reason.falls_back and not reason.unsafe and not reason.fixed
    assert "entry U1" in reason.message and "`--unsafe-fixes` applies it" in reason.message


def test_with_the_flag_the_unsafe_fix_is_applied_and_its_warning_names_the_entry():
    result = migrate_source(TWO_LOSSES, target="auto", unsafe_fixes=True)
    assert result.target_used == "native"
    (applied,) = [d for d in result.diagnostics if d.code == "AMP216"]
    assert applied.unsafe and applied.fixed and not applied.falls_back
    assert (
        applied.severity == Severity.WARNING
        and "applied" in applied.message
        and "entry U1" in applied.message
    )
    assert "scaler.scale(crit_a(out, y)).backward(retain_graph=True)" in result.code


def test_an_allowed_unsafe_fix_in_a_file_that_falls_back_anyway_says_it_was_not_applied():
    text = TWO_LOSSES + "print(amp._amp_state.loss_scalers[1].loss_scale())\n"
    result = migrate_source(text, target="auto", unsafe_fixes=True)
    assert result.target_used == "shim"
    (kept,) = [d for d in result.diagnostics if d.code == "AMP216"]
    assert not kept.unsafe and "not applied" in kept.message


def test_per_loss_scalers_each_see_one_exit_per_step_and_stay_safe():
    text = TWO_LOSSES.replace('opt_level="O1"', 'opt_level="O1", num_losses=2')
    text = text.replace(
        "optimizer) as scaled:\n        scaled.backward(retain",
        "optimizer, loss_id=0) as scaled:\n        scaled.backward(retain",
    )
    text = text.replace("crit_b(out, y), optimizer)", "crit_b(out, y), optimizer, loss_id=1)")
    result = migrate_source(text, target="auto")
    assert not any(d.code in ("AMP215", "AMP216") for d in result.diagnostics), result.diagnostics


def test_exits_in_exclusive_branches_are_one_per_step():
    text = TWO_LOSSES.replace(
        "    with amp.scale_loss(crit_b(out, y), optimizer) as scaled:\n        scaled.backward()\n",
        "    else:\n        with amp.scale_loss(crit_b(out, y), optimizer) as scaled:\n            scaled.backward()\n",
    ).replace(
        "    with amp.scale_loss(crit_a(out, y), optimizer) as scaled:\n        scaled.backward(retain_graph=True)\n",
        "    if use_a:\n        with amp.scale_loss(crit_a(out, y), optimizer) as scaled:\n            scaled.backward()\n",
    )
    assert "else:" in text and "if use_a:" in text
    result = migrate_source(text, target="auto")
    assert not any(d.code in ("AMP215", "AMP216") for d in result.diagnostics), result.diagnostics


def test_a_scale_loss_in_a_loop_over_losses_before_one_step_is_several_exits():
    text = TWO_LOSSES.replace(
        "    with amp.scale_loss(crit_a(out, y), optimizer) as scaled:\n        scaled.backward(retain_graph=True)\n"
        "    with amp.scale_loss(crit_b(out, y), optimizer) as scaled:\n        scaled.backward()\n",
        "    for crit in (crit_a, crit_b):\n        with amp.scale_loss(crit(out, y), optimizer) as scaled:\n"
        "            scaled.backward(retain_graph=True)\n",
    )
    assert "for crit in" in text
    result = migrate_source(text, target="auto")
    (found,) = [d for d in result.diagnostics if d.code == "AMP216"]
    assert "in a loop" in found.message and result.target_used == "shim"


def test_the_config_key_is_a_boolean(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.amp-migrate]\nunsafe-fixes = true\n")
    config = load(str(path))
    assert config is not None and config.unsafe_fixes is True
    path.write_text('[tool.amp-migrate]\nunsafe-fixes = "yes"\n')
    with pytest.raises(ConfigError, match="unsafe-fixes must be true or false"):
        load(str(path))


@pytest.mark.slow
def test_the_flag_and_the_config_key_apply_it_and_json_and_the_status_line_say_so(tmp_path):
    (tmp_path / "train.py").write_text(TWO_LOSSES)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "amp_migrate", "--check", *args, "train.py"]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    safe = json.loads(run("--format", "json").stdout)
    (entry,) = safe["files"]
    assert (
        entry["target_used"] == "shim" and entry["unsafe_fixes"] == [] and not safe["options"]["unsafe_fixes"]
    )
    flagged = json.loads(run("--format", "json", "--unsafe-fixes").stdout)
    (entry,) = flagged["files"]
    assert entry["target_used"] == "native" and entry["unsafe_fixes"] == ["AMP216"]
    assert [d["unsafe"] for d in entry["diagnostics"] if d["code"] == "AMP216"] == [True]
    assert "(native, unsafe fixes: AMP216)" in run("--unsafe-fixes").stdout
    (tmp_path / "pyproject.toml").write_text("[tool.amp-migrate]\nunsafe-fixes = true\n")
    assert "(native, unsafe fixes: AMP216)" in run().stdout
    assert "(shim fallback: AMP216)" in run("--no-unsafe-fixes").stdout
