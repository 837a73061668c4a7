"""docs/diagnostics.md is generated from the diagnostic registry and must match it."""

from __future__ import annotations

import re

import pytest

from amp_migrate import docs
from amp_migrate.diagnostics import CODES


def test_diagnostics_page_is_up_to_date():
    assert docs.PATH.exists(), "docs/diagnostics.md is missing: run `python -m amp_migrate.docs`"
    assert docs.PATH.read_text(encoding="utf-8") == docs.render(), (
        "docs/diagnostics.md is out of date: run `python -m amp_migrate.docs`"
    )


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_documented(code: str):
    entry = CODES[code]
    assert re.fullmatch(r"AMP\d{3}", entry.code), entry.code
    assert entry.code == code
    assert entry.name and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", entry.name), entry.name
    assert entry.summary.strip(), f"{code} has no summary"
    assert entry.why.strip(), f"{code} has no why"


def test_every_code_has_a_section():
    page = docs.render()
    for code, entry in CODES.items():
        assert f"\n### {code} {entry.name}\n" in page


@pytest.mark.parametrize("module", docs.native_rule_modules(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_native_rule_states_why_its_rewrite_is_sound(module):
    argument = docs.soundness(module)
    assert len(argument) > 150, f"{module.__name__} has no Soundness section in its docstring"
    assert f"{argument}\n" in docs.render()
