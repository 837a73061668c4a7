"""One requirement string: whether it installs Apex, and what it becomes.

Apex is not on PyPI under its own name (the `apex` there is an unrelated package), so real
projects spell it many ways: `apex`, `apex @ git+https://github.com/NVIDIA/apex`,
`git+https://github.com/NVIDIA/apex.git#egg=apex`, `-e git+...apex`, conda-forge's
`nvidia-apex`. Each is recognised here, markers kept.
"""

from __future__ import annotations

import re
from typing import Optional

#: The distribution that provides `amp_shim`.
SHIM_DISTRIBUTION = "amp-migrate"

_EDITABLE = re.compile(r"^(?:-e|--editable)(?:\s+|=)")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
_URL = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git\+|hg\+|svn\+|bzr\+)", re.I)
_APEX_SOURCE = re.compile(r"github\.com[/:]nvidia/apex(?:\.git)?(?:$|[/@#?\s])", re.I)
_EGG_APEX = re.compile(r"#(?:.*&)?egg=apex(?:$|[&\s\[])", re.I)
_URL_MARKER = re.compile(r"\s+;")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _body(requirement: str) -> str:
    return _EDITABLE.sub("", requirement.strip(), count=1)


def name_of(requirement: str) -> Optional[str]:
    """The normalised distribution name a requirement names, or None for a bare URL or path."""
    body = _body(requirement)
    if _URL.match(body):
        return "apex" if _installs_apex_source(body) else None
    match = _NAME.match(body)
    return normalised(match.group(1)) if match else None


def _installs_apex_source(url: str) -> bool:
    return bool(_APEX_SOURCE.search(url) or _EGG_APEX.search(url))


def is_apex(requirement: str, conda: bool = False) -> bool:
    """Whether the requirement installs NVIDIA Apex (conda: `nvidia-apex`, as conda-forge
    names it, is Apex too; the channel prefix `conda-forge::` is allowed)."""
    body = _body(requirement)
    if conda:
        body = body.split("::", 1)[-1]
        match = _NAME.match(body)
        return match is not None and normalised(match.group(1)) in ("apex", "nvidia-apex")
    if _URL.match(body):
        return _installs_apex_source(body)
    if body.startswith((".", "/")):  # a local checkout: `./apex`, `../apex/`
        return bool(re.match(r"^(?:\.{1,2}/|/)(?:.*/)?apex/?$", body.split(";")[0].strip()))
    return name_of(body) == "apex"


def marker(requirement: str) -> str:
    """The environment-marker part of a requirement, with the separator as written
    (`; python_version < "3.12"`), or ""."""
    body = _body(requirement)
    if _URL.match(body) or " @ " in body or "@" in body.split(";")[0]:
        found = _URL_MARKER.search(body)  # PEP 508: a URL's marker follows a space
        return body[found.start() :] if found else ""
    index = body.find(";")
    return body[index:] if index >= 0 else ""


def replacement(requirement: str) -> str:
    """`amp-migrate` with the requirement's marker: what an Apex entry becomes when the tree
    uses the shim."""
    return SHIM_DISTRIBUTION + marker(requirement)
