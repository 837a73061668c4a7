"""Which install files a file name says a file is, as discovery sees them."""

from __future__ import annotations

import fnmatch
import os
from typing import Optional

#: Kinds whose Apex entries are edited.
DEPENDENCY_KINDS = ("requirements", "setup-py", "setup-cfg", "pyproject", "conda")
#: Kinds whose Apex install steps are reported only.
REPORTED_KINDS = ("dockerfile", "shell", "markdown")
KINDS = DEPENDENCY_KINDS + REPORTED_KINDS

_EXACT = {"setup.py": "setup-py", "setup.cfg": "setup-cfg", "pyproject.toml": "pyproject"}
# Matched against the lowercased file name, in order.
_PATTERNS = (
    ("*requirements*.txt", "requirements"),
    ("*requirements*.in", "requirements"),
    ("environment*.yml", "conda"),
    ("environment*.yaml", "conda"),
    ("dockerfile", "dockerfile"),
    ("dockerfile.*", "dockerfile"),
    ("*.dockerfile", "dockerfile"),
    ("containerfile", "dockerfile"),
    ("*.sh", "shell"),
    ("*.bash", "shell"),
    ("*.md", "markdown"),
    ("*.markdown", "markdown"),
    ("readme", "markdown"),
    ("readme.txt", "markdown"),
    ("readme.rst", "markdown"),
    ("install", "markdown"),
    ("install.txt", "markdown"),
    ("install.rst", "markdown"),
)


def install_kind(path: str) -> Optional[str]:
    """The install kind of a file (setup.py too, which is also migrated as Python), else None.
    Text files in a folder named `requirements` are requirements files (`requirements/dev.txt`)."""
    name = os.path.basename(path)
    if name in _EXACT:
        return _EXACT[name]
    lower = name.lower()
    if os.path.basename(os.path.dirname(path)) == "requirements" and lower.endswith((".txt", ".in")):
        return "requirements"
    return next((kind for pattern, kind in _PATTERNS if fnmatch.fnmatchcase(lower, pattern)), None)
