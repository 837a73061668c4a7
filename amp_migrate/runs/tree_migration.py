"""The migration `verify` makes of its copy, against the one `amp-migrate .` makes of the tree.

verify migrates the same code the user would get: the target, device and dtype come from its
command line, else from the tree's `[tool.amp-migrate]` table, else the migrate command's
defaults, with one exception: a device this machine cannot run (cuda on a CPU-only machine)
is replaced by cpu, so that the copy can run at all. Where that makes the copy's migration
differ from the tree's, verify says so, and says whether the two codes differ only in the
device and dtype arguments, by migrating the tree's files both ways and comparing them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..cli import config
from ..migrate import MigrationResult
from ..options import Options

#: The migrate command's defaults (amp_migrate/cli/main.py, `_options_and_files`).
DEFAULT_TARGET, DEFAULT_DEVICE, DEFAULT_DTYPE = "auto", "cuda", "float16"
#: Lines of code shown where the two migrations differ beyond the arguments.
_SHOWN = 5


class SettingsProblem(ValueError):
    """A configuration or option the migrate command would refuse as well (a usage error)."""


@dataclass(frozen=True)
class Choice:
    """The options of both migrations, and where the tree's came from."""

    target: str
    device: str  # the copy's
    dtype: str  # the copy's
    tree_device: str  # what `amp-migrate .` in the tree writes
    tree_dtype: str
    device_reason: str  # why the copy's device is what it is
    config_path: Optional[str]  # the pyproject.toml whose [tool.amp-migrate] applied, if any
    unsafe_fixes: bool = False  # both migrations apply the unsafe fixes (flag, else the tree's config)

    @property
    def differs(self) -> bool:
        return (self.device, self.dtype) != (self.tree_device, self.tree_dtype)


def runnable(device: str) -> bool:
    """Whether torch can run `device` here (cpu always; `torch.<device>.is_available()` else)."""
    import torch

    if device == "cpu":
        return True
    module = getattr(torch, device, None)
    available = getattr(module, "is_available", None)
    return bool(available()) if callable(available) else False


def choose(
    root: Path,
    target: Optional[str],
    device: Optional[str],
    dtype: Optional[str],
    unsafe_fixes: Optional[bool] = None,
) -> Choice:
    """Flags over the tree's config over the migrate command's defaults; the copy's device is
    the tree's unless this machine cannot run it, then cpu."""
    try:
        found = config.find([str(root)])
    except config.ConfigError as exc:
        raise SettingsProblem(str(exc)) from None
    tree_target = target or found.target or DEFAULT_TARGET
    tree_device = found.device or DEFAULT_DEVICE
    tree_dtype = found.dtype or DEFAULT_DTYPE
    copy_dtype = dtype or tree_dtype
    if device:
        copy_device, reason = device, "verify's --device"
    elif runnable(tree_device):
        copy_device, reason = tree_device, "the tree's device"
    else:
        copy_device, reason = "cpu", f"torch cannot run {tree_device} here"
    for checked in ((tree_target, tree_device, tree_dtype), (tree_target, copy_device, copy_dtype)):
        try:
            Options(*checked)  # type: ignore[arg-type]  # Options checks the target itself
        except ValueError as exc:
            raise SettingsProblem(str(exc)) from None
    unsafe = unsafe_fixes if unsafe_fixes is not None else bool(found.unsafe_fixes)
    return Choice(tree_target, copy_device, copy_dtype, tree_device, tree_dtype, reason, found.path, unsafe)


def _literal(device: str) -> re.Pattern:
    return re.compile(rf"""(["']){re.escape(device)}\1""")


def _normalised(lines: Sequence[str], choice: Choice) -> list[str]:
    """The copy's lines with its device and dtype spelled as the tree's."""
    device = _literal(choice.device)
    dtype = re.compile(rf"\btorch\.{choice.dtype}\b")
    return [
        dtype.sub(
            f"torch.{choice.tree_dtype}", device.sub(lambda m: f"{m[1]}{choice.tree_device}{m[1]}", line)
        )
        for line in lines
    ]


def _first_difference(copy: str, tree: str, choice: Choice) -> Optional[int]:
    """The tree migration's first line (1-based) that the copy's differs from, other than in
    the device and dtype spelled in it; only lines where the two migrations differ are
    respelled, so that the program's own "cpu" strings are left alone."""
    ours, theirs = copy.splitlines(), tree.splitlines()
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal" and _normalised(ours[i1:i2], choice) != theirs[j1:j2]:
            return j1 + 1
    return None


def beyond_arguments(
    copy: Mapping[str, MigrationResult], tree: Mapping[str, MigrationResult], choice: Choice
) -> list[str]:
    """Where the copy's migration differs from the tree's other than in the device and dtype
    arguments: `FILE:LINE: TEXT` of the tree's migration (a few), or the file and its targets
    where one migration keeps it on the shim and the other does not."""
    found: list[str] = []
    changed = {path for results in (copy, tree) for path, result in results.items() if result.changed}
    for path in sorted(changed):
        ours, theirs = copy.get(path), tree.get(path)
        if ours is None or theirs is None:
            found.append(f"{path}: migrated only {'by verify' if theirs is None else 'in the tree'}")
            continue
        if ours.target_used != theirs.target_used:
            found.append(
                f"{path}: {theirs.target_used or 'unchanged'} in the tree, {ours.target_used} in the copy"
            )
            continue
        line = _first_difference(ours.code, theirs.code, choice)
        if line is not None:
            lines = theirs.code.splitlines()
            text = lines[line - 1].strip() if line <= len(lines) else "(the end of the file)"
            found.append(f"{path}:{line}: {text}")
    return found[:_SHOWN]


def note_lines(choice: Choice) -> list[str]:
    """The first lines of verify's text output where the copy is not migrated as the tree is."""
    if not choice.differs:
        return []
    where = f"{choice.config_path} [tool.amp-migrate]" if choice.config_path else "the defaults"
    return [
        f"note: the copy is migrated with --device {choice.device} --dtype {choice.dtype}",
        f"      ({choice.device_reason}); `amp-migrate .` in this tree targets",
        f"      --device {choice.tree_device} --dtype {choice.tree_dtype} ({where}).",
    ]


def same_code(copy: Mapping[str, MigrationResult], tree: Mapping[str, MigrationResult]) -> bool:
    """Whether the two migrations wrote the same files alike (nothing in them names a device)."""
    paths = set(copy) | set(tree)
    return all(p in copy and p in tree and copy[p].code == tree[p].code for p in paths)


def comparison_lines(differences: Optional[Sequence[str]], same: bool = False) -> list[str]:
    """What comparing the two migrations found (None: they were not compared, being alike)."""
    if differences is None:
        return []
    if same:
        return ["note: the two migrations write the same code (none of it names the device or dtype)."]
    if not differences:
        return ["note: the two migrations differ only in the device and dtype arguments."]
    lines = ["note: the two migrations differ beyond the device and dtype arguments, first at:"]
    return lines + [f"  {difference}" for difference in differences]
