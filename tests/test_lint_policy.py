"""The lint and type checks CI runs (`.ci/run`: ruff check, ruff format --check, mypy) only mean
something if they are not silenced: every `# type: ignore` and `# noqa` in shipped code names
what it silences and says why, on the same line."""

from __future__ import annotations

import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = [REPO / "amp_migrate", REPO / "shim" / "amp_shim", REPO / "kernels"]
#: A type-ignore comment with its codes in brackets, then "# reason"; a noqa comment with its codes, then "- reason".
TYPE_IGNORE = re.compile(r"type:\s*ignore(?P<codes>\[[^\]]+\])?(?P<rest>.*)")
NOQA = re.compile(r"noqa(?P<codes>:\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<rest>.*)", re.I)


def _comments(path: Path):
    with tokenize.open(path) as handle:
        for token in tokenize.generate_tokens(handle.readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string


def _silencers():
    for root in SHIPPED:
        for path in sorted(root.rglob("*.py")):
            for line, comment in _comments(path):
                for pattern in (TYPE_IGNORE, NOQA):
                    found = pattern.search(comment)
                    if found:
                        yield f"{path.relative_to(REPO)}:{line}", found


def _has_reason(rest: str) -> bool:
    return bool(re.search(r"[A-Za-z]{3,}", rest))


def test_shipped_code_has_silencers_to_check():
    assert sum(1 for _ in _silencers()) > 0


@pytest.mark.parametrize("where, found", list(_silencers()), ids=lambda v: v if isinstance(v, str) else "")
def test_each_silenced_check_names_its_code_and_a_reason(where, found):
    assert found.group("codes"), f"{where}: a bare silencer hides every error on the line"
    assert _has_reason(found.group("rest")), f"{where}: say why after the code"
