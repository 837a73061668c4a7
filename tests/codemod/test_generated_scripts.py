"""Property test: random legacy training scripts, assembled from the patterns the rules
support, always migrate natively to code that compiles, that a second run leaves alone, and
that names no Apex object; their shim migration differs from the input only in import lines."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_migrate import migrate_source
from amp_migrate.diagnostics import CODES

IMPORTS = {
    "from": ("from apex import amp", "amp"),
    "from_as": ("from apex import amp as apex_amp", "apex_amp"),
    "module": ("import apex", "apex.amp"),
    "module_as": ("import apex.amp as A", "A"),
    "try": ("try:\n    from apex import amp\nexcept ImportError:\n    amp = None", "amp"),
}


@st.composite
def scripts(draw) -> str:
    import_line, amp = IMPORTS[draw(st.sampled_from(sorted(IMPORTS)))]
    level = draw(st.sampled_from(['"O0"', '"O1"', '"O2"', '"O3"', "args.opt_level"]))
    two_optimizers = draw(st.booleans())
    accumulate = draw(st.booleans())
    delay_unscale = accumulate and draw(st.booleans())
    clip = draw(st.booleans())
    checkpoint = draw(st.booleans())
    layout = draw(st.sampled_from(["function", "class", "split"]))
    comment = draw(st.sampled_from(["", "  # keep this comment"]))
    loss_name = draw(st.sampled_from(["loss", "total_loss"]))
    scaled_name = draw(st.sampled_from(["scaled_loss", "scaled"]))

    opts = "[opt_a, opt_b]" if two_optimizers else "optimizer"
    owner = "self." if layout == "class" else ""
    opt_list = [f"{owner}opt_a", f"{owner}opt_b"] if two_optimizers else [f"{owner}optimizer"]
    opts_expr = "[" + ", ".join(opt_list) + "]" if two_optimizers else opt_list[0]
    model = f"{owner}model"
    init = (
        f"{model}, {opts_expr} = {amp}.initialize({'model'}, {opts}, opt_level={level})"
        if layout != "class"
        else f"self.model, {opts_expr} = {amp}.initialize(model, {opts}, opt_level={level})"
    )
    steps = "\n".join(f"{o}.step()" for o in opt_list)
    clip_lines = (
        "".join(f"torch.nn.utils.clip_grad_norm_({amp}.master_params({o}), 1.0)\n" for o in opt_list)
        if clip
        else ""
    )
    scale_kwargs = ", delay_unscale=not last" if delay_unscale else ""
    lines = [f"{o}.zero_grad()" for o in opt_list]
    lines += [f"out = {model}(x){comment}", f"{loss_name} = criterion(out, y)"]
    if accumulate:
        lines += [f"{loss_name} = {loss_name} / 4", "last = (i + 1) % 4 == 0"]
    lines += [
        f"with {amp}.scale_loss({loss_name}, {opts_expr}{scale_kwargs}) as {scaled_name}:",
        f"    {scaled_name}.backward()",
    ]
    body = "\n".join(lines) + "\n"
    step_block = clip_lines + steps + "\n"
    if accumulate:
        body += "if last:\n" + textwrap.indent(step_block, "    ")
    else:
        body += step_block
    loop = "for i, (x, y) in enumerate(data):\n" + textwrap.indent(body, "    ")
    save = f"torch.save({{'amp': {amp}.state_dict()}}, 'ckpt.pt')\n" if checkpoint else ""

    header = f"import torch\n{import_line}\n\n\n"
    if layout == "function":
        code = "def main(args, model, optimizer, opt_a, opt_b, data):\n" + textwrap.indent(
            init + "\n" + loop + save, "    "
        )
    elif layout == "split":
        code = (
            "def setup(args, model, optimizer, opt_a, opt_b):\n"
            + textwrap.indent(init + f"\nreturn model, {opts_expr}\n", "    ")
            + "\n\ndef train(model, optimizer, opt_a, opt_b, data):\n"
            + textwrap.indent(loop + save, "    ")
        )
    else:
        code = (
            "class Trainer:\n    def __init__(self, args, model, optimizer, opt_a, opt_b):\n"
            + textwrap.indent(init + "\n", " " * 8)
            + "\n    def fit(self, data):\n"
            + textwrap.indent(loop + save, " " * 8)
        )
    return header + code


def _split_runtime_level(script: str) -> bool:
    """A run-time opt_level in `setup` cannot reach a module-level scaler (AMP101)."""
    return "def setup(" in script and "opt_level=args.opt_level" in script


SETTINGS = settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@SETTINGS
@given(scripts())
@pytest.mark.slow
def test_generated_scripts_migrate_natively_and_idempotently(script):
    compile(script, "<generated>", "exec")
    result = migrate_source(script, target="auto")
    compile(result.code, "<migrated>", "exec")
    assert migrate_source(result.code, target="auto").code == result.code
    if _split_runtime_level(script):
        assert result.target_used == "shim"
        assert {d.code for d in result.diagnostics if d.falls_back} == {"AMP101"}
        return
    unsafe = {d.code for d in result.diagnostics if CODES[d.code].unsafe}
    if unsafe:  # an unsafe fix (an accumulation window at a dynamic scale): native with the flag
        assert result.target_used == "shim" and unsafe == {d.code for d in result.diagnostics if d.falls_back}
        result = migrate_source(script, target="auto", unsafe_fixes=True)
        assert migrate_source(result.code, target="auto", unsafe_fixes=True).code == result.code
    assert result.target_used == "native", [d.format() for d in result.diagnostics]
    assert not re.search(r"\bapex\b", result.code), result.code
    assert "amp_shim" not in result.code
    assert "scaler.step(" in result.code and "scaler.update()" in result.code


@SETTINGS
@given(scripts())
@pytest.mark.slow
def test_generated_scripts_shim_output_changes_only_import_lines(script):
    result = migrate_source(script, target="shim")
    compile(result.code, "<shim>", "exec")
    before, after = script.splitlines(), result.code.splitlines()
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert changed
    for old, new in changed:
        assert re.match(r"\s*(from|import) ", old) and "apex" in old and "amp_shim" in new
    assert migrate_source(result.code, target="shim").code == result.code
