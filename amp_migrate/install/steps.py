"""Install steps in Dockerfiles, shell scripts and Markdown: which lines clone, pip install or
build Apex. Read only: these lines are reported, never edited.

A command is read in its context: backslash-continued lines form one command line, split at
`&&`, `||`, `;` and `|`; a `cd apex` (or Dockerfile `WORKDIR apex`) makes a later
`pip install .` or `python setup.py install` install Apex, until the next `cd`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CLONES = "clones Apex's repository"
PIP_INSTALLS = "pip installs Apex"
BUILDS = "builds Apex's C++/CUDA extensions"

_CLONE = re.compile(r"\bgit\s+clone\b.*github\.com[/:]nvidia/apex(?:\.git)?(?:\s|$|/)", re.I)
_PIP = re.compile(r"\bpip3?\s+install\b|\bpython[\d.]*\s+-m\s+pip\s+install\b|\buv\s+pip\s+install\b")
_SETUP_INSTALL = re.compile(r"\bsetup\.py\s+(?:install|develop|build_ext|bdist_wheel)\b")
_EXTENSIONS = re.compile(r"--(?:cpp|cuda)_ext\b|\bAPEX_(?:CPP|CUDA)_EXT\b|--deprecated_fused_\w+|--fast_\w+")
_APEX_ARG = re.compile(
    r"(?:^|\s)(?:-e\s+)?['\"]?(?:apex|\.{0,2}/?(?:\S*/)?apex/?|\S*github\.com[/:]nvidia/apex\S*)['\"]?(?=\s|$)",
    re.I,
)
_HERE = re.compile(r"(?:^|\s)(?:-e\s+)?['\"]?\./?['\"]?(?=\s|$)")
_CD = re.compile(r"^\s*(?:cd|pushd|WORKDIR)\s+(\S+)", re.I)
_SPLIT = re.compile(r"&&|\|\||;|\|")
_PROMPT = re.compile(r"^\s*(?:[$>]\s+|RUN\s+)", re.I)  # `$ pip ...`, `> pip ...`, `RUN pip ...`


@dataclass(frozen=True)
class Step:
    line: int
    col: int
    does: tuple[str, ...]  # CLONES, PIP_INSTALLS, BUILDS, in that order


def _logical_lines(text: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """Lines joined over backslash continuations: (first line, [(line, text), ...])."""
    joined: list[tuple[int, list[tuple[int, str]]]] = []
    current: list[tuple[int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        current.append((number, line))
        if not line.rstrip().endswith("\\"):
            joined.append((current[0][0], current))
            current = []
    if current:
        joined.append((current[0][0], current))
    return joined


def _into_apex(target: str) -> bool:
    target = target.strip("'\"").rstrip("/")
    return target.rsplit("/", 1)[-1] == "apex"


def steps(text: str, dockerfile: bool = False) -> list[Step]:
    """Every line that clones, installs or builds Apex, in line order. In a Dockerfile each
    instruction runs in a new shell: only `WORKDIR` carries a folder to the next."""
    found: dict[int, tuple[int, list[str]]] = {}
    in_apex = False

    def note(line: int, col: int, what: str) -> None:
        _, does = found.setdefault(line, (col, []))
        if what not in does:
            does.append(what)

    for _, lines in _logical_lines(text):
        if dockerfile and not _CD.match(lines[0][1]):
            in_apex = False
        # Commands of one logical line, each with the physical line it starts on.
        for number, raw in lines:
            if raw.lstrip().startswith("#"):  # a comment, or a Markdown heading
                continue
            line = _PROMPT.sub("", raw.rstrip("\\").replace("`", " "))
            for command in _SPLIT.split(line):
                col = max(1, raw.find(command.strip()) + 1) if command.strip() else 1
                cd = _CD.match(command)
                if cd:
                    in_apex = _into_apex(cd.group(1))
                    continue
                if _CLONE.search(command):
                    note(number, col, CLONES)
                pip = _PIP.search(command)
                setup = _SETUP_INSTALL.search(command)
                if pip and (
                    _APEX_ARG.search(command[pip.end() :]) or (in_apex and _HERE.search(command[pip.end() :]))
                ):
                    note(number, col, PIP_INSTALLS)
                elif setup and in_apex:
                    note(number, col, PIP_INSTALLS if "install" in setup.group(0) else BUILDS)
                if _EXTENSIONS.search(command) and (pip or setup or in_apex or number in found):
                    note(number, col, BUILDS)
    order = (CLONES, PIP_INSTALLS, BUILDS)
    return [
        Step(line, col, tuple(sorted(does, key=order.index))) for line, (col, does) in sorted(found.items())
    ]


def describe(step: Step) -> str:
    return ", ".join(step.does)
