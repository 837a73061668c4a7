"""Golden cases: `fixtures/rules/<rule>/<case>.py` and what each target must make of it.

    <case>.py          the legacy input; its first lines may hold
                       `# amp-migrate: device=cpu dtype=bfloat16` (options for the native run)
                       `# diagnostics: AMP101 AMP900` (the codes the native run must emit)
    <case>.native.py   the output of `--target native` (the input itself when native is refused)
    <case>.shim.py     the output of `--target shim`

`AMP_MIGRATE_UPDATE_GOLDEN=1 pytest tests/codemod` rewrites the expected files from the
current output (`AMP_MIGRATE_GOLDEN_DIRS=initialize,scale_loss` limits the run to those
folders); review the diff before committing it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fixture_files import GOLDEN_INPUTS, RULES

ROOT = RULES
UPDATE = os.environ.get("AMP_MIGRATE_UPDATE_GOLDEN") == "1"
_OPTIONS = re.compile(r"^# amp-migrate:(.*)$", re.M)
_CODES = re.compile(r"^# diagnostics:(.*)$", re.M)


@dataclass(frozen=True)
class Case:
    path: Path

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    @property
    def source(self) -> str:
        return self.path.read_text()

    def expected(self, target: str) -> Path:
        return self.path.with_name(f"{self.path.stem}.{target}.py")

    @property
    def options(self) -> dict[str, str]:
        found = _OPTIONS.search(self.source)
        if not found:
            return {}
        return dict(item.split("=", 1) for item in found.group(1).split())

    @property
    def codes(self) -> set[str] | None:
        found = _CODES.search(self.source)
        return None if found is None else set(found.group(1).split())


def cases() -> list[Case]:
    only = [d for d in os.environ.get("AMP_MIGRATE_GOLDEN_DIRS", "").split(",") if d]
    return [Case(p) for p in GOLDEN_INPUTS if not only or p.parent.name in only]
