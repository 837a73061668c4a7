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
SETUP_INSTALLS = "installs Apex with setup.py"
BUILDS = "builds Apex's C++/CUDA extensions"
_ORDER = (CLONES, PIP_INSTALLS, SETUP_INSTALLS, BUILDS)

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
_PROMPT = re.compile(r"^\s*(?:[$>]\s+|RUN\s+)", re.I)  # `$ pip ...`, `> pip ...`, `RUN pip ...`


@dataclass(frozen=True)
class Step:
    line: int
    col: int
    does: tuple[str, ...]  # CLONES, PIP_INSTALLS, BUILDS, in that order


def _logical_lines(text: str) -> list[list[tuple[int, str]]]:
    """Lines joined over backslash continuations: each a list of (line number, text)."""
    joined: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        current.append((number, line))
        if not line.rstrip().endswith("\\"):
            joined.append(current)
            current = []
    if current:
        joined.append(current)
    return joined


def _commands(lines: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """The commands of one logical line: (line, column, text), comment lines left out."""
    text, starts = "", []  # starts: (offset in text, line, offset of the line's text in it)
    for number, raw in lines:
        if raw.lstrip().startswith("#"):  # a comment, or a Markdown heading
            continue
        line = _PROMPT.sub(lambda m: " " * len(m.group(0)), raw.rstrip().rstrip("\\").replace("`", " "))
        starts.append((len(text), number))
        text += line + " "
    commands = []
    for match in re.finditer(r"[^&|;]+", text):
        stripped = match.group(0).lstrip()
        if not stripped.strip():
            continue
        at = match.start() + len(match.group(0)) - len(stripped)
        base, number = max((s for s in starts if s[0] <= at), default=(0, 1))
        commands.append((number, at - base + 1, stripped.rstrip()))
    return commands


def _into_apex(target: str) -> bool:
    target = target.strip("'\"").rstrip("/")
    return target.rsplit("/", 1)[-1] == "apex"


def steps(text: str, dockerfile: bool = False) -> list[Step]:
    """Every line that clones, installs or builds Apex, in line order. In a Dockerfile each
    instruction runs in a new shell: only `WORKDIR` carries a folder to the next."""
    found: dict[int, tuple[int, list[str]]] = {}
    in_apex = workdir_apex = False

    def note(line: int, col: int, what: str) -> None:
        _, does = found.setdefault(line, (col, []))
        if what not in does:
            does.append(what)

    for lines in _logical_lines(text):
        if dockerfile:
            workdir = re.match(r"^\s*WORKDIR\s+(\S+)", lines[0][1], re.I)
            if workdir:
                workdir_apex = _into_apex(workdir.group(1))
            in_apex = workdir_apex
        for number, col, command in _commands(lines):
            cd = _CD.match(command)
            if cd:
                in_apex = _into_apex(cd.group(1))
                continue
            if _CLONE.search(command):
                note(number, col, CLONES)
            pip = _PIP.search(command)
            setup = _SETUP_INSTALL.search(command)
            args = command[pip.end() :] if pip else ""
            if pip and (_APEX_ARG.search(args) or (in_apex and _HERE.search(args))):
                note(number, col, PIP_INSTALLS)
            elif setup and in_apex:
                note(number, col, SETUP_INSTALLS if "install" in setup.group(0) else BUILDS)
            if _EXTENSIONS.search(command) and (number in found or in_apex):
                note(number, col, BUILDS)
    return [
        Step(line, col, tuple(sorted(does, key=_ORDER.index))) for line, (col, does) in sorted(found.items())
    ]


def describe(step: Step) -> str:
    return ", ".join(step.does)
