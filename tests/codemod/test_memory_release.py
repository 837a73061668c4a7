"""Migrating a file leaves nothing of it behind: a run over a large tree holds one file's trees
at a time, not every file's."""

from __future__ import annotations

import gc

import libcst as cst

from amp_migrate.migrate import migrate_source
from fixture_files import GOLDEN_INPUTS


def _live_trees() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is cst.Module)


def test_no_syntax_tree_outlives_its_migration() -> None:
    texts = [p.read_text(encoding="utf-8") for p in GOLDEN_INPUTS[:25]]
    migrate_source(texts[0])  # first use: what importing and warming up keeps
    before = _live_trees()
    for text in texts:
        for target in ("auto", "native", "shim"):
            migrate_source(text, target=target)  # type: ignore[arg-type]
    assert _live_trees() - before <= 2
