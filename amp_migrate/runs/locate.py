"""Where a diverging step's migrated statements are: the lines `verify` points the user at.

The recorder writes, per step, the call sites of the amp calls each run made for it (its
"step_calls"): the shim run's lie in the original tree, the native run's in the migrated copy.
For the step where the runs diverged this module lists

* the migrated statements that ran for it (native call sites, with their source line, and
  whether the migration wrote that line), marking a forward that ran under a different autocast
  than the original's forward at the same place in the step, and a statement under a guard
  (`if`, `while`, ...) that the migration wrote;
* the original's amp calls at that step whose migration made no call at all in the native run
  (a deleted `scaler.unscale_`, a `scaler.load_state_dict` that never ran), with the original
  line and the lines the migration put in its place.

Line numbers of the copy are those `amp-migrate` writes into the user's files; which of them the
migration changed comes from a line diff of each migrated file against its original.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

#: Reads a file of the migrated tree by its relative path (None: unreadable).
Reader = Callable[[str], Optional[str]]

#: What the migration turns each Apex call into: an original call whose counterparts are all
#: missing from the native run's calls for the same step did not survive the migration.
COUNTERPARTS: Mapping[str, tuple[str, ...]] = {
    "amp.initialize": ("GradScaler()", "torch.autocast"),
    "amp.scale_loss": ("scaler.scale",),
    "amp.master_params": ("scaler.unscale_",),
    "amp.state_dict": ("scaler.state_dict",),
    "amp.load_state_dict": ("scaler.load_state_dict",),
    "optimizer.step": ("scaler.step", "optimizer.step"),
}


@dataclass(frozen=True)
class Source:
    """One Python file of the tree, as the user wrote it and as the migration left it."""

    original: tuple[str, ...]
    migrated: tuple[str, ...]

    @classmethod
    def of(cls, original: str, migrated: str) -> "Source":
        return cls(tuple(original.splitlines()), tuple(migrated.splitlines()))

    @functools.cached_property
    def _opcodes(self) -> Sequence[tuple[str, int, int, int, int]]:
        return difflib.SequenceMatcher(None, self.original, self.migrated, autojunk=False).get_opcodes()

    def changed_lines(self) -> frozenset[int]:
        """1-based lines of the migrated text that the migration wrote or rewrote."""
        return frozenset(
            line + 1
            for tag, _, _, j1, j2 in self._opcodes
            if tag in ("replace", "insert")
            for line in range(j1, j2)
        )

    def migrated_range(self, original_line: int) -> tuple[int, int]:
        """The 1-based lines (first, last) of the migrated text that stand where `original_line`
        stood: the line itself when unchanged; in a changed block, the one line that reads
        mostly like it (a rewritten call), else the whole block (empty, last < first, where the
        block was deleted)."""
        index = original_line - 1
        for tag, i1, i2, j1, j2 in self._opcodes:
            if i1 <= index < i2:
                if tag == "equal":
                    return j1 + index - i1 + 1, j1 + index - i1 + 1
                return self._closest(self.original[index].strip(), j1, j2) or (j1 + 1, j2)
        return len(self.migrated) + 1, len(self.migrated)

    def counterparts(self) -> tuple[Optional[int], ...]:
        """For each original line (index: line - 1), the 1-based migrated line that is it moved
        or rewritten (the line of its changed block that reads mostly like it), or None: deleted, or
        replaced by code that reads like none of it. A line of a changed block that reappears
        there as it was (re-indented under a new `with`) is found by its text, not scored
        against every line of the block."""
        out: list[Optional[int]] = [None] * len(self.original)
        for tag, i1, i2, j1, j2 in self._opcodes:
            if tag == "equal":
                out[i1:i2] = range(j1 + 1, j1 + 1 + i2 - i1)
                continue
            first: dict[str, int] = {}
            for j in range(j2 - 1, j1 - 1, -1):
                first[self.migrated[j].strip()] = j + 1
            for i in range(i1, i2):
                text = self.original[i].strip()
                closest = (first[text], 0) if text in first else self._closest(text, j1, j2)
                out[i] = closest[0] if closest else None
        return tuple(out)

    def _closest(self, text: str, j1: int, j2: int) -> Optional[tuple[int, int]]:
        scored = [
            (difflib.SequenceMatcher(None, text, self.migrated[j].strip()).ratio(), j + 1)
            for j in range(j1, j2)
        ]
        best = max(scored, default=(0.0, 0))
        return (best[1], best[1]) if best[0] >= 0.6 else None


@dataclass(frozen=True)
class Site:
    """A migrated statement that ran for the diverging step (native run)."""

    call: str
    file: str
    line: int
    text: str
    changed: bool  # the migration wrote this line
    note: str = ""
    times: int = 1  # how often it ran for the step (twice: two iterations made one step)


@dataclass(frozen=True)
class Missing:
    """An amp call the original made for the diverging step whose migration made none."""

    call: str
    expected: tuple[str, ...]
    file: str
    original_line: int
    original_text: str
    migrated_lines: tuple[int, int]  # (first, last) in the migrated file; last < first: deleted
    migrated_text: tuple[str, ...]


@dataclass(frozen=True)
class Location:
    step: int
    ran: tuple[Site, ...]
    missing: tuple[Missing, ...]


def _kind(call: str) -> str:
    """`forward (autocast cpu float16)` -> `forward`; `torch.autocast (off)` -> `torch.autocast`."""
    return call.split(" (", 1)[0]


def _calls(calls: Sequence[Any], step: int) -> list[tuple[str, str, int]]:
    if not 0 < step <= len(calls):
        return []
    return [(str(c[0]), str(c[1]), int(c[2])) for c in calls[step - 1] if len(c) == 3]


class _Tree:
    """The sources `locate` reads: the migrated files with their originals, and a reader for
    the files the migration left as they were."""

    def __init__(self, sources: Mapping[str, Source], read: Reader) -> None:
        self.sources = sources
        self.read = read
        self._unchanged: dict[str, tuple[str, ...]] = {}

    def migrated_line(self, file: str, line: int) -> str:
        lines = self.sources[file].migrated if file in self.sources else self._lines(file)
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def original_line(self, file: str, line: int) -> str:
        lines = self.sources[file].original if file in self.sources else self._lines(file)
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def _lines(self, file: str) -> tuple[str, ...]:
        if file not in self._unchanged:
            text = self.read(file)
            self._unchanged[file] = tuple(text.splitlines()) if text is not None else ()
        return self._unchanged[file]


def _ran(tree: _Tree, native: list, shim: list) -> tuple[Site, ...]:
    """The native calls of the step, once per call site, each forward compared with the
    original's forward at the same position in the step."""
    shim_forwards = [call for call, _, _ in shim if _kind(call) == "forward"]
    changed = {file: source.changed_lines() for file, source in tree.sources.items()}
    sites: dict[tuple[str, str, int], Site] = {}
    forwards = 0
    for call, file, line in native:
        note = ""
        if _kind(call) == "forward":
            if forwards < len(shim_forwards) and shim_forwards[forwards] != call:
                note = (
                    f"the original's forward here ran with {shim_forwards[forwards][len('forward (') : -1]}"
                )
            forwards += 1
        key = (call, file, line)
        known = sites.get(key)
        if known is None:
            text = tree.migrated_line(file, line)
            note = note or _written_guard(tree, file, line, changed.get(file, frozenset()))
            sites[key] = Site(call, file, line, text, line in changed.get(file, ()), note)
        else:
            sites[key] = dataclasses.replace(known, note=known.note or note, times=known.times + 1)
    return tuple(sites.values())


#: Block headers that decide whether the statements under them run.
_GUARDS = ("if ", "elif ", "else:", "while ")


def _written_guard(tree: _Tree, file: str, line: int, changed: frozenset[int]) -> str:
    """A note when the block holding `line` opens with a guard the migration wrote (Apex has
    none around its steps: a migration that adds one decides when the scaler acts)."""
    source = tree.sources.get(file)
    if source is None or not 0 < line <= len(source.migrated):
        return ""
    indent = len(source.migrated[line - 1]) - len(source.migrated[line - 1].lstrip())
    for number in range(line - 1, 0, -1):
        text = source.migrated[number - 1]
        stripped = text.lstrip()
        if not stripped or stripped.startswith("#") or len(text) - len(stripped) >= indent:
            continue
        written = stripped.startswith(_GUARDS) and number in changed
        return f"under `{stripped}` (line {number}), which the migration wrote" if written else ""
    return ""


def _unmade(call: str, made: set[str]) -> Optional[tuple[str, ...]]:
    """The counterparts of the original's `call` of which the migrated program made none, or None
    when it made one (a copy kept on the shim makes the original's own calls). Apex's step also
    leaves the step's new loss scale behind: a `scaler.step` with no `update()` is half of it."""
    expected = COUNTERPARTS.get(call)
    if expected is None or call in made:
        return None
    if call == "optimizer.step" and "scaler.step" in made and "scaler.update" not in made:
        return ("scaler.update",)
    return None if made.intersection(expected) else expected


def _missing(tree: _Tree, native: list, shim: list) -> tuple[Missing, ...]:
    made = {_kind(call) for call, _, _ in native}
    found = []
    seen = set()
    for call, file, line in shim:
        expected = _unmade(call, made)
        if expected is None or (call, file, line) in seen:
            continue
        seen.add((call, file, line))
        source = tree.sources.get(file)
        first, last = source.migrated_range(line) if source else (line, line)
        # Within a changed block, the line where the migration made the call's other half.
        related = [
            n for c, f, n in native if f == file and first <= n <= last and _kind(c) in COUNTERPARTS[call]
        ]
        if related:
            first = last = related[0]
        texts = tuple(tree.migrated_line(file, n) for n in range(first, last + 1))
        found.append(
            Missing(call, expected, file, line, tree.original_line(file, line), (first, last), texts)
        )
    return tuple(found)


def locate(
    step: int,
    shim_calls: Sequence[Any],
    native_calls: Sequence[Any],
    sources: Mapping[str, Source],
    read: Reader,
) -> Location:
    """The statements to look at for `step` (1-based). `sources` holds each migrated file by
    its path relative to the tree; `read(path)` returns the text of any other file (or None)."""
    tree = _Tree(sources, read)
    native = _calls(native_calls, step)
    shim = _calls(shim_calls, step)
    return Location(step, _ran(tree, native, shim), _missing(tree, native, shim))


def changed_sources(originals: Mapping[str, str], migrated: Mapping[str, str]) -> dict[str, Source]:
    """The Sources of the files the migration changed (in both mappings, different texts)."""
    return {
        path: Source.of(originals[path], text)
        for path, text in migrated.items()
        if path in originals and originals[path] != text
    }


def describe(location: Optional[Location]) -> list[str]:
    """The location as the text report prints it, one line each."""
    if location is None or not (location.ran or location.missing):
        return []
    lines = [f"at step {location.step} the migrated program ran (* = a line the migration wrote):"]
    for site in location.ran:
        mark = "*" if site.changed else " "
        times = f" ({site.times} times)" if site.times > 1 else ""
        suffix = f"  <- {site.note}" if site.note else ""
        lines.append(f"  {site.file}:{site.line}{mark} {site.call}{times}: {site.text}{suffix}")
    if location.missing:
        lines.append(
            f"the original's amp calls at step {location.step} that the migrated program did not make:"
        )
    for missing in location.missing:
        first, last = missing.migrated_lines
        if last < first:
            where = f"deleted after line {last}"
        else:
            where = f"line {first}" if first == last else f"lines {first}-{last}"
            where += ": " + " | ".join(missing.migrated_text)
        lines.append(
            f"  {missing.file}:{missing.original_line} {missing.call}: {missing.original_text}  "
            f"-> no {' or '.join(missing.expected)} ran; migrated: {where}"
        )
    return lines
