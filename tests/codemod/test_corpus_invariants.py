"""Every fixture input, migrated once per target (native, shim, auto), and every invariant the
suite holds a migration to checked on those results, in one test per file.

For every input under fixtures/ (golden cases, programs, examples, install files, project
trees and their outputs):

- pruning changes nothing: `--target auto` gives the same code, diagnostics and target with
  `AMP_MIGRATE_NO_PRUNE=1` (also without the file's options, where it has some);
- the text check that lets a second run skip the file never misses code that touches Apex;
- characters `str.splitlines()` takes for line breaks and Python does not, inserted where
  Python ignores them (every character of every class, in one mutated input: line_breaks.py),
  change neither target's migration; the mutation does put each character there and Python
  reads the same program;
- rules report only the codes they declare.

For a golden case, `fixtures/rules/<rule>/<case>.py` (golden.py), besides: each target's exact
output, a second run that changes nothing, output that compiles; the pinned diagnostics and
no AMP002; shim output that touches only imports and imports only what `amp_shim` has;
`--target auto` choosing native exactly when native is possible; every diagnostic at a place
in the file; every `torch.` name in the native output resolving and its amp calls binding;
every native message carrying a variant its code declares.

These were separate tests, each migrating every file again; merged here, every assertion kept
(old test -> where its assertion is now):

- test_golden.py::test_native_output_matches_golden -> _check_native
- test_golden.py::test_shim_output_matches_golden_and_only_touches_imports -> _check_shim
- test_golden.py::test_auto_takes_native_when_possible_else_shim -> _check_auto
- test_golden.py::test_every_diagnostic_points_at_a_place_in_the_file -> _check_places
- test_golden.py::test_there_are_at_least_sixty_golden_cases -> test_there_are_enough_golden_cases
- test_pruning.py::test_pruned_and_unpruned_runs_agree -> _check_pruning
- test_pruning.py::test_text_check_never_misses_code_that_touches_apex (fixture files; its
  hand-written texts stay in test_pruning.py) -> _check_text_check, on inputs and, for a golden
  case, on its expected outputs
- test_line_break_fuzz.py::test_line_break_characters_in_comments_and_strings_change_no_migration
  and ::test_mutations_put_every_character_where_python_ignores_it -> _check_line_breaks
- test_native_output_is_valid_torch.py::test_every_torch_name_resolves_and_amp_calls_bind
  -> _check_torch_names; ::test_there_are_native_outputs_to_check -> test_there_are_enough_golden_cases
- test_shim_surface.py::test_every_golden_shim_output_imports_only_what_amp_shim_really_has
  (shim and auto) -> _check_shim_imports; its count -> test_golden_shim_outputs_import_amp_shim
- test_rule_architecture.py::test_rules_report_only_codes_they_declare_on_every_golden_input
  -> _check_reported_codes (now on every input), and its "some rule reported" ->
  test_the_report_spy_sees_what_rules_report
- test_explain_describes_every_message.py::test_every_message_the_golden_cases_emit_carries_a_declared_variant
  -> _check_variants
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from amp_migrate import migrate_source
from amp_migrate.diagnostics import CODES
from amp_migrate.migrate import MigrationError, MigrationResult, may_touch_apex, touches_apex
from amp_migrate.rules.base import Rule
from fixture_files import GOLDEN_INPUTS, INPUTS, fixture_id

from . import line_breaks
from .golden import UPDATE, Case, cases
from .native_torch import torch_name_problems
from .shim_imports import deprecated_torch_amp_only, shim_imports

TARGETS = ("native", "shim", "auto")
GOLDEN = frozenset(GOLDEN_INPUTS)
Outcome = MigrationResult | MigrationError


def migrate(text: str, target: str, options: dict[str, str]) -> Outcome:
    try:
        return migrate_source(text, target=target, **options)
    except MigrationError as exc:
        return exc


class Reports:
    """Every (rule, code) that `Rule.report` sees while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: dict[type, set[str]] = {}
        original = Rule.report

        def record(rule, node, code, *args, **kwargs):
            self.seen.setdefault(type(rule), set()).add(code.code)
            return original(rule, node, code, *args, **kwargs)

        monkeypatch.setattr(Rule, "report", record)

    def undeclared(self) -> dict[str, list[str]]:
        wrong = {
            rule.__name__: sorted(codes - {c.code for c in rule.EMITS}) for rule, codes in self.seen.items()
        }
        return {name: codes for name, codes in wrong.items() if codes}


#: The quick tier (`-m "not slow"`) keeps every QUICK_EVERY-th golden case and a few other
#: inputs; the full run takes every input once.
QUICK_EVERY = 20
QUICK = frozenset(GOLDEN_INPUTS[::QUICK_EVERY] + [p for p in INPUTS if p not in GOLDEN][:: QUICK_EVERY * 3])
#: AMP_MIGRATE_GOLDEN_DIRS (golden.py) limits the run to those folders' golden cases.
SELECTED = [c.path for c in cases()] if len(cases()) < len(GOLDEN_INPUTS) else INPUTS
PARAMS = [pytest.param(p, id=fixture_id(p), marks=() if p in QUICK else pytest.mark.slow) for p in SELECTED]


def test_there_are_enough_golden_cases():
    assert len(GOLDEN_INPUTS) >= 60, len(GOLDEN_INPUTS)
    assert sum(1 for p in GOLDEN_INPUTS if Case(p).expected("native").exists()) >= 30


def test_golden_shim_outputs_import_amp_shim():
    """The shim-import check below is not vacuous: the golden cases the shim migrates (their
    shim output, which `--target auto` gives too where native is refused) import from it."""
    checked = 0
    for path in GOLDEN_INPUTS:
        output = Case(path).expected("shim").read_text()
        if output != path.read_text():
            checked += sum(1 for _ in shim_imports(output))
    assert checked > 30


def test_the_report_spy_sees_what_rules_report(monkeypatch: pytest.MonkeyPatch):
    """The undeclared-code check below is not vacuous: the spy sees rules report."""
    reports = Reports(monkeypatch)
    case = next(Case(p) for p in GOLDEN_INPUTS if Case(p).codes)
    migrate_source(case.source, target="native", **case.options)
    assert reports.seen, "no rule reported anything"


@pytest.mark.parametrize("path", PARAMS)
def test_fixture_input_keeps_every_invariant(path: Path, monkeypatch: pytest.MonkeyPatch):
    _check_input(path, monkeypatch)


def _check_input(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = fixture_id(path)
    text = path.read_text(encoding="utf-8")
    options = Case(path).options
    reports = Reports(monkeypatch)
    runs = {target: migrate(text, target, options) for target in TARGETS}
    assert not reports.undeclared(), f"{where}: rules reported codes they do not declare"
    _check_text_check(where, text)
    _check_line_breaks(path, text, options, runs)
    _check_pruning(where, text, options, runs["auto"], monkeypatch)
    if path in GOLDEN:
        _check_golden(Case(path), {t: _result(where, t, r) for t, r in runs.items()})
        unsafe = _result(where, "unsafe", migrate(text, "native", {**options, "unsafe_fixes": True}))
        _check_unsafe(Case(path), runs["native"], unsafe)


def _result(where: str, target: str, run: Outcome) -> MigrationResult:
    assert isinstance(run, MigrationResult), f"{where}: the {target} run raised {run!r}"
    return run


def _check_text_check(where: str, text: str) -> None:
    """A second run is skipped when the text check says no: it must be a superset."""
    assert may_touch_apex(text) or not touches_apex(ast.parse(text)), f"{where}: the text check misses it"


def _pruning_view(where: str, run: Outcome) -> tuple:
    result = _result(where, "auto", run)
    return result.code, sorted(result.diagnostics, key=repr), result.target_used


def _check_pruning(
    where: str, text: str, options: dict, pruned: Outcome, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = migrate(text, "auto", {}) if options else pruned
    monkeypatch.setenv("AMP_MIGRATE_NO_PRUNE", "1")
    assert _pruning_view(where, migrate(text, "auto", options)) == _pruning_view(where, pruned), (
        f"{where}: pruned and unpruned runs differ"
    )
    if options:
        assert _pruning_view(where, migrate(text, "auto", {})) == _pruning_view(where, plain), (
            f"{where}: pruned and unpruned runs differ without the file's options"
        )
    monkeypatch.delenv("AMP_MIGRATE_NO_PRUNE")


#: Known defects, each found by the one input holding every character class: (fixture, target)
#: -> what changes. No class alone changes these migrations (checked above), as the per-class
#: tests before the merge checked.
COMBINED_DEFECTS: dict[tuple[str, str], str] = {}


def _check_line_breaks(path: Path, text: str, options: dict, runs: dict[str, Outcome]) -> None:
    where, every = fixture_id(path), line_breaks.EVERY_CHARACTER
    based = line_breaks.base(path, text)
    mutated = line_breaks.mutate(path, based, every)
    if mutated is None:
        assert line_breaks.find_sites(based) is None, f"{where}: no place to insert a character"
        return  # Python cannot read it either: nothing to compare
    for char in every:
        assert mutated.count(char) > based.count(char), (where, char)
    assert line_breaks.program(mutated, every) == line_breaks.program(based, every), where
    for target in ("native", "shim"):
        baseline = runs[target] if based == text else migrate(based, target, options)
        expected = line_breaks.without(line_breaks.outcome(baseline), every)
        changed = (
            line_breaks.without(line_breaks.outcome(migrate(mutated, target, options)), every) != expected
        )
        if (where, target) in COMBINED_DEFECTS:
            # Each class alone must still leave the migration as it was; the defect shows only
            # with all of them, and this fails once it is fixed (remove the entry then).
            assert _which_class(path, based, target, options, baseline).startswith("only"), where
            assert changed, f"{where}: fixed; remove it from COMBINED_DEFECTS"
        elif changed:
            culprit = _which_class(path, based, target, options, baseline)
            raise AssertionError(f"{where}: {culprit} characters changed the {target} migration")


def _which_class(path: Path, based: str, target: str, options: dict, baseline: Outcome) -> str:
    """On a failure, the class that alone changes the migration, with its mutated input."""
    for name, characters in line_breaks.CLASSES.items():
        mutated = line_breaks.mutate(path, based, characters)
        if mutated is None:
            continue
        got = line_breaks.without(line_breaks.outcome(migrate(mutated, target, options)), characters)
        if got != line_breaks.without(line_breaks.outcome(baseline), characters):
            return f"{name}; mutated input:\n{mutated!r}\n"
    return "only all the classes together (no one class alone)"


def _check_golden(case: Case, results: dict[str, MigrationResult]) -> None:
    _check_native(case, results["native"])
    _check_shim(case, results["shim"])
    _check_auto(case, results)
    _check_places(case, results)
    for target in ("shim", "auto"):
        _check_shim_imports(case, target, results[target])
    _check_torch_names(case, results["native"])
    _check_variants(case, results["native"])
    for target in ("native", "shim"):
        _check_text_check(f"{case.id}.{target}.py", case.expected(target).read_text())


def _check_expected(case: Case, target: str, result: MigrationResult) -> None:
    """The exact output, which compiles, and which a second run leaves as it is."""
    path = case.expected(target)
    if UPDATE:
        path.write_text(result.code)
    assert path.exists(), f"missing golden file {path.name}"
    assert result.code == path.read_text(), f"{case.id}: {target} output differs from {path.name}"
    compile(result.code, str(path), "exec", dont_inherit=True)
    again = migrate_source(result.code, target=target, **case.options)
    assert again.code == result.code, f"{case.id}: a second {target} run changed the output"


def _check_native(case: Case, result: MigrationResult) -> None:
    _check_expected(case, "native", result)
    if case.codes is not None:
        # AMP003 ("native refused") accompanies every fallback; the reasons are what is pinned.
        assert {d.code for d in result.diagnostics} - {"AMP003"} == case.codes, case.id
    assert not any(d.code == "AMP002" for d in result.diagnostics), (case.id, result.diagnostics)


def _check_shim(case: Case, result: MigrationResult) -> None:
    _check_expected(case, "shim", result)
    before, after = deprecated_torch_amp_only(case.source).splitlines(), result.code.splitlines()
    assert len(before) == len(after), case.id
    for old, new in zip(before, after):
        if old != new:
            assert "import" in old and "apex" in old and "amp_shim" in new, (case.id, old, new)


def _check_auto(case: Case, results: dict[str, MigrationResult]) -> None:
    native, auto = results["native"], results["auto"]
    if any(d.code == "AMP003" for d in native.diagnostics):
        assert auto.code == case.expected("shim").read_text(), case.id
        # "shim", or None where the shim lacks what the file uses (an error, file untouched)
        assert auto.target_used == results["shim"].target_used, case.id
        assert any(d.falls_back for d in auto.diagnostics), case.id
    else:
        assert auto.code == native.code, case.id
        assert auto.target_used == native.target_used, case.id


def _check_unsafe(case: Case, native: Outcome, unsafe: MigrationResult) -> None:
    """`--unsafe-fixes` changes only the cases with an unsafe fix: those have `<case>.unsafe.py`
    (the native output with the fix applied), which compiles, is stable under a second run with
    the flag, and whose every unsafe diagnostic names its differences entry; without the flag
    the same codes make the file fall back. Every other case comes out exactly as without it."""
    path = case.path.with_name(f"{case.path.stem}.unsafe.py")
    applied = [d for d in unsafe.diagnostics if d.unsafe]
    assert isinstance(native, MigrationResult)
    if not applied:
        if UPDATE and path.exists():
            path.unlink()
        assert not path.exists(), f"{case.id}: {path.name} exists but no unsafe fix applies"

        # Where the file falls back for other reasons, an unsafe fix's message says it was not applied.
        def seen(result: MigrationResult) -> tuple:
            places = [
                (d.code, d.line, d.col, d.fixed, CODES[d.code].unsafe or d.message)
                for d in result.diagnostics
            ]
            return result.code, places, result.target_used

        assert seen(unsafe) == seen(native), (
            f"{case.id}: --unsafe-fixes changed a case that has no unsafe fix"
        )
        return
    if UPDATE:
        path.write_text(unsafe.code)
    assert path.exists(), f"missing golden file {path.name}"
    assert unsafe.code == path.read_text(), f"{case.id}: the unsafe-fixes output differs from {path.name}"
    assert unsafe.target_used == "native" and not any(d.falls_back for d in unsafe.diagnostics), case.id
    compile(unsafe.code, str(path), "exec", dont_inherit=True)
    again = migrate_source(unsafe.code, target="native", unsafe_fixes=True, **case.options)
    assert again.code == unsafe.code, f"{case.id}: a second unsafe-fixes run changed the output"
    for d in applied:
        assert CODES[d.code].unsafe and f"entry {CODES[d.code].unsafe}" in d.message, (case.id, d)
    refused = {d.code for d in native.diagnostics if CODES[d.code].unsafe and d.falls_back}
    assert refused == {d.code for d in applied}, f"{case.id}: without the flag the same fixes must fall back"
    assert native.code == case.path.read_text(), case.id


def _check_places(case: Case, results: dict[str, MigrationResult]) -> None:
    lines = case.source.count("\n") + 1
    for target, result in results.items():
        for d in result.diagnostics:
            assert 1 <= d.line <= lines and d.col >= 1, (case.id, target, d)


def _check_shim_imports(case: Case, target: str, result: MigrationResult) -> None:
    if result.target_used != "shim":
        return
    for module, name in shim_imports(result.code):
        imported = importlib.import_module(module)
        if name not in (None, "*"):
            assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (
                case.id,
                target,
                module,
                name,
            )


def _check_torch_names(case: Case, result: MigrationResult) -> None:
    assert torch_name_problems(result.code) == [], f"{case.id}.native.py"


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def _check_variants(case: Case, result: MigrationResult) -> None:
    """Messages the scan of the package cannot read (a reason handed on whole) are still held to
    their code's phrases where the code declares them."""
    for diagnostic in result.diagnostics:
        phrases = [_norm(v) for v in CODES[diagnostic.code].variants]
        assert not phrases or any(p in _norm(diagnostic.message) for p in phrases), (
            case.id,
            diagnostic.code,
            diagnostic.message,
        )
