"""`[tool.amp-migrate]` in pyproject.toml: a project's defaults, which flags override.

As with ruff, the nearest pyproject.toml that has the table wins, searched upward from the
folder that holds every path given; a pyproject.toml without the table is passed over, so
that a monorepo's packages may share the root's settings.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python < 3.11
    import tomli as tomllib

from ..options import DTYPES, TARGETS

KEYS = ("target", "device", "dtype", "unsafe-fixes", "exclude", "include")


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    path: Optional[str] = None
    target: Optional[str] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    unsafe_fixes: Optional[bool] = None
    exclude: tuple[str, ...] = ()
    include: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path) if self.path else "."


def _strings(path: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.amp-migrate] {key} must be a list of glob strings")
    return tuple(value)


def _choice(path: str, key: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(
            f"{path}: [tool.amp-migrate] {key} must be one of {', '.join(choices)}, not {value!r}"
        )
    return value


def load(path: str) -> Optional[Config]:
    """The table in `path`, or None when the file has none."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    table = data.get("tool", {}).get("amp-migrate")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.amp-migrate] must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: [tool.amp-migrate] has unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"
        )
    device = table.get("device")
    if device is not None and not isinstance(device, str):
        raise ConfigError(f"{path}: [tool.amp-migrate] device must be a string")
    unsafe = table.get("unsafe-fixes")
    if unsafe is not None and not isinstance(unsafe, bool):
        raise ConfigError(f"{path}: [tool.amp-migrate] unsafe-fixes must be true or false, not {unsafe!r}")
    return Config(
        path=path,
        target=_choice(path, "target", table["target"], TARGETS) if "target" in table else None,
        device=device,
        dtype=_choice(path, "dtype", table["dtype"], DTYPES) if "dtype" in table else None,
        unsafe_fixes=unsafe,
        exclude=_strings(path, "exclude", table.get("exclude", [])),
        include=_strings(path, "include", table.get("include", [])),
    )


def find(paths: Sequence[str]) -> Config:
    """The configuration that applies to a run over `paths` (empty when there is none)."""
    absolute = [os.path.abspath(p) for p in paths] or [os.getcwd()]
    folder = os.path.commonpath(absolute)
    if not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate):
            config = load(candidate)
            if config is not None:
                return config
        parent = os.path.dirname(folder)
        if parent == folder:
            return Config()
        folder = parent
