"""The rule architecture holds: each rule declares what it handles and emits as data on its
class, the registry and the docs derive from that data, rules share code only through helper
modules, and a new rule is one module plus its fixtures.

These checks are structural on purpose: a code emitted by a rule that does not declare it, or a
rule that imports another, is caught here before a reader of docs/diagnostics.md is misled.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import amp_migrate
from amp_migrate import docs, rules
from amp_migrate.analysis.binding import HANDLE, WRAPPED
from amp_migrate.diagnostics import CODES, Code
from amp_migrate.rules.base import Rule

PACKAGE = Path(amp_migrate.__file__).resolve().parent
RULES_PACKAGE = "amp_migrate.rules"
MAX_FUNCTION_LINES = 60
#: Functions over the limit, each waiting on its owner's split (remove the entry with the split).
OVERSIZED: set[tuple[str, str]] = set()
NON_RULE_CODE_MODULES = docs.NON_RULE_CODE_MODULES
#: Names that Apex's own objects answer to, as the binder spells them: what `amp.init()` and
#: `handle.wrap_optimizer()` return.
BINDER_CLASSES = {HANDLE: "amp_shim.amp.handle.AmpHandle", WRAPPED: "amp_shim.amp.opt.OptimWrapper"}
#: Names older Apex releases exported and the last one lost (so the shim has none); the rules
#: still recognise them to report them (fp16_names.STAR lists them for `import *`).
REMOVED_APEX_NAMES = frozenset(
    {"apex.fp16_utils.FP16_Module", "apex.fp16_utils.fp32_to_fp16", "apex.fp16_utils.fp16_to_fp32"}
)
DOC_SECTIONS = ("What it does", "Why", "Fix safety", "Example", "Soundness")


def _all_rule_package_modules() -> list:
    docs.register_all_codes()
    return [
        importlib.import_module(f"{RULES_PACKAGE}.{info.name}")
        for info in pkgutil.iter_modules(rules.__path__)
    ]


RULE_MODULES = sorted({rule.__module__ for rule in rules.ALL_RULES})
HELPER_MODULES = sorted(
    module.__name__ for module in _all_rule_package_modules() if module.__name__ not in RULE_MODULES
)


def _defining_module(code: Code) -> str:
    for name, module in sys.modules.items():
        if name.startswith("amp_migrate") and any(
            value is code for value in vars(module).values() if isinstance(value, Code)
        ):
            if code in _own_codes(module):
                return name
    raise AssertionError(f"{code.code} is defined nowhere")


def _own_codes(module) -> list[Code]:
    """The codes whose `define(...)` call is in `module`'s source."""
    tree = _source_tree(module)
    defined = []
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "define"
        ):
            defined.append(node.value.args[0].value)
    # A code in the source but not registered: the file changed after it was imported.
    return [CODES[code] for code in defined if code in CODES]


def _rules_in(module_name: str) -> list[type[Rule]]:
    return [rule for rule in rules.ALL_RULES if rule.__module__ == module_name]


@functools.cache
def _source_tree(module) -> ast.Module:
    """A module's parsed source: the checks below read each module many times."""
    return ast.parse(inspect.getsource(module))


def _codes_referenced(module) -> set[str]:
    """Every diagnostic code a module's source names (a module-level Code read by name)."""
    tree = _source_tree(module)
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    return {value.code for name, value in vars(module).items() if name in names and isinstance(value, Code)}


def _relative_imports(module) -> set[str]:
    """The modules of amp_migrate that `module` imports, as absolute names."""
    tree = _source_tree(module)
    package = module.__name__.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("amp_migrate"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("amp_migrate")}
    return found


# -- the registry ------------------------------------------------------------------------------
def test_every_rule_class_in_the_rules_package_is_registered():
    """A rule class that no list names would never run: each concrete Rule subclass (one that
    declares what it emits or handles) is in the REGISTRY, which NATIVE_RULES and SHIM_RULES are
    ordered from."""
    concrete = {
        cls
        for module in _all_rule_package_modules()
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, Rule)
        and cls is not Rule
        and cls.__module__ == module.__name__
        and ("EMITS" in vars(cls) or "HANDLES" in vars(cls))
    }
    assert concrete == set(rules.ALL_RULES)


@pytest.mark.parametrize("rule", rules.ALL_RULES, ids=lambda r: r.__name__)
def test_every_rule_declares_handles_and_emits_on_its_own_class(rule):
    assert "HANDLES" in vars(rule) and "EMITS" in vars(rule), rule.__name__
    assert isinstance(rule.HANDLES, tuple) and all(isinstance(n, str) for n in rule.HANDLES)
    assert isinstance(rule.EMITS, tuple) and all(isinstance(c, Code) for c in rule.EMITS)
    assert len(set(rule.EMITS)) == len(rule.EMITS), "a code listed twice"
    assert all(CODES[c.code] is c for c in rule.EMITS), "EMITS holds a code the registry does not"


# -- codes belong to rules ---------------------------------------------------------------------
def test_every_code_defined_under_rules_is_emitted_by_some_rule():
    docs.register_all_codes()
    unclaimed = sorted(
        code
        for code, entry in CODES.items()
        if not rules.emitters(code) and _defining_module(entry) not in NON_RULE_CODE_MODULES
    )
    assert not unclaimed, f"codes no rule declares in EMITS: {unclaimed}"


def test_codes_reported_outside_the_rules_are_in_no_rules_emits():
    docs.register_all_codes()
    for module_name in NON_RULE_CODE_MODULES:
        for code in _own_codes(importlib.import_module(module_name)):
            assert not rules.emitters(code.code), f"{code.code} ({module_name}) is claimed by a rule"


@pytest.mark.parametrize("module_name", RULE_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_a_rule_modules_own_codes_are_emitted_by_exactly_one_rule_of_that_module(module_name):
    module = importlib.import_module(module_name)
    for code in _own_codes(module):
        claimed = rules.emitters(code.code)
        assert len(claimed) == 1, f"{code.code} is in the EMITS of {[r.__name__ for r in claimed]}"
        assert claimed[0].__module__ == module_name, f"{code.code} is emitted from another module"


@pytest.mark.parametrize("module_name", RULE_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_a_rule_module_names_only_codes_its_rules_declare(module_name):
    module = importlib.import_module(module_name)
    declared = {code.code for rule in _rules_in(module_name) for code in rule.EMITS}
    undeclared = sorted(_codes_referenced(module) - declared)
    assert not undeclared, f"{module_name} names codes none of its rules declares: {undeclared}"


@pytest.mark.parametrize("module_name", HELPER_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_a_code_a_helper_reports_is_declared_by_a_rule_that_imports_the_helper(module_name):
    module = importlib.import_module(module_name)
    users = [
        rule for rule in rules.ALL_RULES if module_name in _relative_imports(sys.modules[rule.__module__])
    ]
    for code in _codes_referenced(module) & {c.code for c in _own_codes(module)}:
        assert any(code in {c.code for c in rule.EMITS} for rule in users), (
            f"{code} ({module_name}) is declared by none of the rules that import it"
        )


def test_every_code_that_falls_back_says_why_a_careful_person_refuses_it():
    """bench/real_corpus.py's fallback table and docs/diagnostics.md show the phrase."""
    docs.register_all_codes()
    assert [code for code, entry in sorted(CODES.items()) if entry.falls_back and not entry.refusal] == []


# -- what a rule handles -----------------------------------------------------------------------
def _shim_has(name: str) -> bool:
    """`apex.X.Y...` has a counterpart in amp_shim, found the way Python finds it: the longest
    prefix that imports as a module, then attributes (or attributes the shim sets at run time,
    as `initialize` sets `_amp_state.loss_scalers`)."""
    parts = ["amp_shim"] + name.split(".")[1:]
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        while rest and hasattr(obj, rest[0]):
            obj, rest = getattr(obj, rest[0]), rest[1:]
        if not rest or (len(rest) == 1 and not inspect.ismodule(obj) and _assigned_in_shim(rest[0])):
            return True
    return False


def _assigned_in_shim(attribute: str) -> bool:
    shim = Path(importlib.import_module("amp_shim").__file__).parent
    pattern = re.compile(rf"\.{re.escape(attribute)}\s*=[^=]")
    return any(pattern.search(path.read_text(encoding="utf-8")) for path in shim.rglob("*.py"))


def _method_of_binder_class(name: str) -> bool:
    for binder, shim_class in BINDER_CLASSES.items():
        if name.startswith(binder + "."):
            module, cls = shim_class.rsplit(".", 1)
            return hasattr(getattr(importlib.import_module(module), cls), name[len(binder) + 1 :])
    return False


def _torch_has(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


@pytest.mark.parametrize("name", sorted(rules.handled_names()))
def test_every_handled_name_is_real(name):
    """A HANDLES entry names something Apex's last release (which the shim reproduces) has,
    a method of an object an Apex call returns, or a deprecated torch spelling that exists."""
    if name.startswith("torch."):
        assert _torch_has(name), name
    elif name.startswith(tuple(BINDER_CLASSES)):
        assert _method_of_binder_class(name), name
    else:
        assert name == "apex" or name.startswith("apex."), name
        assert _shim_has(name) != (name in REMOVED_APEX_NAMES), (
            f"{name}: in amp_shim and in REMOVED_APEX_NAMES"
            if name in REMOVED_APEX_NAMES
            else f"{name} has no counterpart in amp_shim"
        )


# -- modules -----------------------------------------------------------------------------------
@pytest.mark.parametrize("module_name", RULE_MODULES + HELPER_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_no_module_under_rules_imports_a_rule_module(module_name):
    """Rules share code through helper modules only, so that a rule can change or go away
    without touching another."""
    if module_name == RULES_PACKAGE:
        return
    imported = _relative_imports(importlib.import_module(module_name)) & set(RULE_MODULES)
    assert not imported - {module_name}, f"{module_name} imports {sorted(imported - {module_name})}"


@pytest.mark.parametrize("module_name", RULE_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_every_rule_module_documents_itself_in_ruff_style(module_name):
    doc = importlib.import_module(module_name).__doc__ or ""
    missing = [section for section in DOC_SECTIONS if not re.search(rf"^{section}\b", doc, re.M)]
    assert not missing, f"{module_name}'s docstring lacks {missing}"


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


@pytest.mark.slow
def test_no_function_in_the_package_is_over_sixty_lines_and_the_allow_list_is_current():
    long = sorted(
        (str(path.relative_to(PACKAGE)), name, length)
        for path in PACKAGE.rglob("*.py")
        for name, length in _functions(path)
        if length > MAX_FUNCTION_LINES
    )
    assert [entry for entry in long if entry[:2] not in OVERSIZED] == []
    still = {entry[:2] for entry in long}
    assert OVERSIZED <= still, f"split already; drop from OVERSIZED: {sorted(OVERSIZED - still)}"


# -- fix-safety tiers ----------------------------------------------------------------------------
#: How a rule's "Fix safety" paragraph opens: its tier first, as ruff's rule docs say theirs.
TIER_OPENINGS = ("Safe", "Unsafe", "No fix")
PLANNER_MODULES = sorted({planner.__module__ for planner in rules.PLANNERS})


def _fix_safety(module_name: str) -> str:
    doc = importlib.import_module(module_name).__doc__ or ""
    found = re.search(r"^Fix safety\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    assert found, f"{module_name}'s docstring has no Fix safety section"
    return " ".join(found.group(1).split())


@pytest.mark.parametrize("module_name", RULE_MODULES + PLANNER_MODULES, ids=lambda m: m.rsplit(".", 1)[-1])
def test_every_rule_states_its_fix_safety_tier_first_and_names_only_real_entries(module_name):
    from amp_migrate.differences import DIFFERENCES

    text = _fix_safety(module_name)
    assert text.startswith(TIER_OPENINGS), f"{module_name}: Fix safety opens {text[:40]!r}"
    named = set(re.findall(r"\bU\d+\b", text))
    assert named <= set(DIFFERENCES), f"{module_name} names {sorted(named - set(DIFFERENCES))}"


def test_every_documented_difference_names_the_rule_and_the_codes_that_emit_it():
    from amp_migrate.differences import DIFFERENCES

    classes = {c.__name__: c for c in [*rules.ALL_RULES, *rules.PLANNERS]}
    page = (PACKAGE.parent / "docs" / "differences.md").read_text(encoding="utf-8")
    for entry in DIFFERENCES.values():
        assert entry.rule in classes, f"{entry.id} names {entry.rule}, no rule or planner"
        emitted = {code.code for code in classes[entry.rule].EMITS}
        assert entry.codes and set(entry.codes) <= emitted, (entry.id, entry.codes, entry.rule)
        for code in entry.codes:
            assert CODES[code].unsafe == entry.id, f"{code} does not name {entry.id}"
        assert entry.id in _fix_safety(classes[entry.rule].__module__), (
            f"{entry.rule}'s Fix safety lacks {entry.id}"
        )
        row = next(line for line in page.splitlines() if line.startswith(f"| {entry.id} |"))
        assert f"`{entry.rule}`" in row and all(code in row for code in entry.codes), row
    unsafe_codes = {code.code for code in CODES.values() if code.unsafe}
    assert unsafe_codes == {c for e in DIFFERENCES.values() for c in e.codes}
