"""The text test that lets a file go without parsing: one that never spells these cannot use
Apex or torch's deprecated `torch.cuda.amp` / `torch.cpu.amp` (`from torch.cuda import amp`
included). Kept apart from `migrate` so that deciding it needs neither libcst nor the rules:
a run over files without Apex imports neither.
"""

from __future__ import annotations

_MARKERS = ("apex", "cuda.amp", "cpu.amp", "torch.cuda import", "torch.cpu import")


def might_use_apex(text: str) -> bool:
    return any(marker in text for marker in _MARKERS)
