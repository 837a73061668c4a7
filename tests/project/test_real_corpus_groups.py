"""The real corpus (../shared/corpus, read in place, never copied): every pair of files that
pairs.tsv lists as sharing Apex between modules, laid out in memory at its manifest paths,
lands in one group when both files touch amp state, and the project pass leaves no group of
those repositories half native."""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

import pytest

from amp_migrate.project import build_index, find_groups, migrate_project

ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus"))
CORPUS = next((c for c in CANDIDATES if (c / "pairs.tsv").is_file()), None)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CORPUS is None, reason="the real-code corpus is not here")]


def _table(name: str) -> list[dict]:
    if CORPUS is None:
        return []
    with open(CORPUS / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = {row["file_name"]: row for row in _table("manifest.tsv")}
PAIRS = _table("pairs.tsv")


@lru_cache(maxsize=None)
def repository(repo: str) -> dict[str, str]:
    return {
        row["path"]: (CORPUS / "files" / name).read_text(encoding="utf-8", errors="replace")
        for name, row in ROWS.items()
        if row["repo"] == repo and name.endswith(".py")
    }


def _touches_state(facts) -> bool:
    return bool(
        facts.initialize
        or facts.fp16_optimizers
        or facts.providers
        or facts.uses
        or facts.foreign
        or facts.provided
    )


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p["file_a"].split("__")[1])
def test_files_sharing_amp_state_across_modules_are_grouped(pair):
    a, b = ROWS[pair["file_a"]], ROWS[pair["file_b"]]
    index = build_index(repository(a["repo"]))
    facts_a, facts_b = index.modules[a["path"]], index.modules[b["path"]]
    if not (_touches_state(facts_a) and _touches_state(facts_b)):
        pytest.skip(f"{pair['relation']}: one side holds no amp state")  # FusedAdam, a wrapper's caller
    assert any({a["path"], b["path"]} <= set(g.members) for g in find_groups(index))


@pytest.mark.parametrize("repo", sorted({ROWS[p["file_a"]]["repo"] for p in PAIRS}))
@pytest.mark.slow
def test_no_group_of_a_real_repository_ends_half_native(repo):
    files = repository(repo)
    results = migrate_project(files)
    index = build_index(files)
    for group in find_groups(index):
        targets = {results[p].target_used for p in group.members if results[p].changed}
        assert len(targets) <= 1, (group.members, targets)
        if "native" in targets:  # and no member that touches amp state was left as it was
            assert all(results[p].changed or not _touches_state(index.modules[p]) for p in group.members)
