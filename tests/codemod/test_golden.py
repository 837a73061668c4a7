"""Every golden case, for both targets: the exact output, a second run that changes nothing,
output that compiles, and `--target auto` choosing native exactly when native is possible."""

from __future__ import annotations

import functools

import libcst as cst
import pytest
from libcst.codemod import CodemodContext

from amp_migrate import migrate_source
from amp_migrate.options import Options
from amp_migrate.rules.base import FileState
from amp_migrate.rules.deprecated_amp import DeprecatedTorchAmp

from .golden import UPDATE, Case, cases

CASES = cases()


@functools.lru_cache(maxsize=None)
def migrated(source: str, target: str, options: tuple):
    return migrate_source(source, target=target, **dict(options))


def run(case: Case, target: str):
    return migrated(case.source, target, tuple(sorted(case.options.items())))


def check(case: Case, target: str):
    result = run(case, target)
    path = case.expected(target)
    if UPDATE:
        path.write_text(result.code)
    assert path.exists(), f"missing golden file {path.name}"
    assert result.code == path.read_text(), f"{case.id}: {target} output differs from {path.name}"
    compile(result.code, str(path), "exec", dont_inherit=True)
    again = migrated(result.code, target, tuple(sorted(case.options.items())))
    assert again.code == result.code, f"{case.id}: a second {target} run changed the output"
    return result


def test_there_are_at_least_sixty_golden_cases():
    assert len(CASES) >= 60, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_native_output_matches_golden(case: Case):
    result = check(case, "native")
    if case.codes is not None:
        # AMP003 ("native refused") accompanies every fallback; the reasons are what is pinned.
        assert {d.code for d in result.diagnostics} - {"AMP003"} == case.codes
    assert not any(d.code == "AMP002" for d in result.diagnostics), result.diagnostics


def deprecated_torch_amp_only(source: str) -> str:
    """`source` after the one rewrite besides imports that every target makes: torch's own
    deprecated `torch.cuda.amp` spellings (otherwise a later run would make it)."""
    module = cst.parse_module(source)
    state, context = FileState(Options("shim", "cuda", "float16"), original=source), CodemodContext()
    if DeprecatedTorchAmp.applies(state, context):
        module = DeprecatedTorchAmp(context, state).transform_module(module)
    return module.code


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_shim_output_matches_golden_and_only_touches_imports(case: Case):
    result = check(case, "shim")
    before, after = deprecated_torch_amp_only(case.source).splitlines(), result.code.splitlines()
    assert len(before) == len(after)
    for old, new in zip(before, after):
        if old != new:
            assert "import" in old and "apex" in old and "amp_shim" in new, (old, new)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_auto_takes_native_when_possible_else_shim(case: Case):
    native = run(case, "native")
    auto = run(case, "auto")
    if any(d.code == "AMP003" for d in native.diagnostics):
        assert auto.code == case.expected("shim").read_text()
        # "shim", or None where the shim lacks what the file uses (an error, file untouched)
        assert auto.target_used == run(case, "shim").target_used
        assert any(d.falls_back for d in auto.diagnostics)
    else:
        assert auto.code == native.code
        assert auto.target_used == native.target_used


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_diagnostic_points_at_a_place_in_the_file(case: Case):
    lines = case.source.count("\n") + 1
    for target in ("native", "shim", "auto"):
        for d in run(case, target).diagnostics:
            assert 1 <= d.line <= lines and d.col >= 1, (target, d)
