"""Where each line of a file went when the migration rewrote it.

Diagnostics are positions in the text the rules read, the file as it was. After an in-place
rewrite the user opens the written file, where a statement below a removed import sits a few
lines higher; the JSON report gives both. The mapping is the one `verify` uses to find the
migrated counterpart of an original line (runs/locate.py): a line diff, where an unchanged line
maps to itself moved, a rewritten one to the line of its changed block that reads mostly like
it, and a line with no such counterpart (removed, or replaced by code unlike it) to None.
"""

from __future__ import annotations

from typing import Optional

from ..io.lines import split_lines


def line_map(before: str, after: str) -> tuple[Optional[int], ...]:
    """For each line of `before` (index: line - 1), its 1-based line in `after`, or None."""
    from ..runs.locate import Source

    # Lines as the parser counts them (lines.py): diagnostics are parser positions.
    old, new = split_lines(before), split_lines(after)
    # Only the span between the first and the last change is diffed: a line diff of a whole
    # long file full of equal blank lines costs tens of milliseconds, its changed middle little.
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    middle = Source(tuple(old[head : len(old) - tail]), tuple(new[head : len(new) - tail])).counterparts()
    moved = len(new) - len(old)
    return (
        tuple(range(1, head + 1))
        + tuple(None if line is None else line + head for line in middle)
        + tuple(range(len(old) - tail + 1 + moved, len(old) + 1 + moved))
    )
