"""Every relative link in README.md, docs/ and bench/README.md names a file of the repository,
and every `#anchor` a heading of its page: the README points newcomers at docs/ and the pages
at each other, so a moved or renamed page must not leave a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(`{3,}|~{3,})")


def _prose(text: str) -> str:
    """The page without its fenced code blocks, whose brackets are code, not links."""
    kept, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", _prose(page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _links(page: Path) -> list[str]:
    """Link targets, less web addresses and `...` (a quoted message whose address is elided)."""
    prose = re.sub(r"`[^`\n]*`", "", _prose(page.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(prose) if "://" not in t and t != "..."]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_name_existing_files_and_headings(page):
    dead = []
    for target in _links(page):
        if target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_file() or ROOT not in linked.parents:
            dead.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)}: dead links {dead}"


def test_the_readme_links_every_results_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    assert set((ROOT / "docs" / "results").glob("*.md")) <= linked
