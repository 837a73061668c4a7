"""All-pairs covering of a parameter space, for tests whose dimensions are independent.

A full cross product tests every combination; most failures need only two dimensions to meet,
so a subset in which every pair of values (of any two dimensions) that the full product holds
appears at least once finds them at a fraction of the cost. The subset is chosen greedily and
deterministically from the valid rows (so dependent dimensions, such as a value that only exists
for some values of another, stay valid), in the order the rows are given.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import combinations

Row = Mapping[str, Hashable]


def pairs_of(row: Row) -> set[tuple]:
    """Every (dimension, value, dimension, value) pair a row covers."""
    items = sorted(row.items())
    return {(a, x, b, y) for (a, x), (b, y) in combinations(items, 2)}


def all_pairs(rows: Sequence[Row]) -> list[Row]:
    """A subset of `rows` covering every pair that `rows` covers, in first-seen order."""
    covers = [pairs_of(row) for row in rows]
    uncovered = set().union(*covers)
    chosen: list[int] = []
    while uncovered:
        best = max(range(len(rows)), key=lambda i: (len(covers[i] & uncovered), -i))
        chosen.append(best)
        uncovered -= covers[best]
    return [rows[i] for i in sorted(chosen)]
