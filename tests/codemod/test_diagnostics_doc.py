"""docs/diagnostics.md and docs/fallbacks.md are generated from the diagnostic registry and
must match it; every code that falls back carries what the fallback page says about it."""

from __future__ import annotations

import re

import pytest

from amp_migrate import docs
from amp_migrate.diagnostics import CODES

docs.register_all_codes()


def test_generated_pages_are_up_to_date():
    assert set(docs.PAGES) == {docs.PATH, docs.FALLBACKS_PATH, docs.DIFFERENCES_PATH}
    for path, render in docs.PAGES.items():
        name = path.relative_to(docs.PATH.parents[1])
        assert path.exists(), f"{name} is missing: run `python -m amp_migrate.docs`"
        assert path.read_text(encoding="utf-8") == render(), (
            f"{name} is out of date: run `python -m amp_migrate.docs`"
        )


@pytest.mark.parametrize("code", sorted(c for c, entry in CODES.items() if entry.falls_back or entry.unsafe))
def test_every_code_that_falls_back_has_a_fallback_entry(code: str):
    entry = CODES[code]
    missing = [f for f in ("shape", "by_hand", "fallback_title", "refusal") if not getattr(entry, f).strip()]
    assert not missing, f"{code} falls back but its define(...) has no {', '.join(missing)}"
    headings = re.findall(r"^## (AMP\d{3}(?:, AMP\d{3})*) — ", docs.render_fallbacks(), re.M)
    assert code in {c for heading in headings for c in heading.split(", ")}
    assert entry.by_hand in docs.render_code(entry), f"`amp-migrate explain {code}` omits its advice"


@pytest.mark.parametrize(
    "code", sorted(c for c, entry in CODES.items() if not entry.falls_back and not entry.unsafe)
)
def test_a_code_that_never_falls_back_has_no_fallback_entry(code: str):
    entry = CODES[code]
    assert not (entry.shape or entry.fallback_why or entry.fallback_title), (
        f"{code} does not fall back, so docs/fallbacks.md does not list it"
    )


def test_the_fallback_page_cites_no_document_outside_the_repository():
    page = docs.render_fallbacks()
    assert not [word for word in ("§", "DESIGN.md", "apex_api.md") if word in page]


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
