"""The one list of fixture files every test that walks fixtures/ reads.

A golden case's expected outputs (`<case>.native.py`, `<case>.shim.py`) are what a migration
must produce, not inputs: they are left out of `INPUTS` here, once, rather than by each test.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
RULES = FIXTURES / "rules"
EXPECTED_SUFFIXES = (".native.py", ".shim.py", ".unsafe.py")


def is_expected_output(path: Path) -> bool:
    return path.name.endswith(EXPECTED_SUFFIXES)


#: Every Python file under fixtures/: inputs and golden outputs.
ALL_FILES = sorted(FIXTURES.rglob("*.py"))
#: The inputs: golden cases, programs, examples, install files, project trees and their outputs.
INPUTS = [p for p in ALL_FILES if not is_expected_output(p)]
#: Golden-case inputs, `fixtures/rules/<rule>/<case>.py`.
GOLDEN_INPUTS = [p for p in INPUTS if p.parent.parent == RULES]


def fixture_id(path: Path) -> str:
    """`rules/initialize/basic.py`: a test id and failure message that say which file."""
    return path.relative_to(FIXTURES).as_posix()
