"""The install pass: after the tree's Python files are migrated, each install file's result.

Dependency files come back as ordinary file results (changed, with their new bytes and diff),
so that `--check`, `--diff`, `--format json`, interactive review and the one atomic writer
treat them as they treat Python files; Dockerfiles, shell scripts and Markdown come back with
diagnostics only.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Optional, Sequence

from ..cli.file_result import FileResult, Finding
from ..cli.report import unified_diff
from ..diagnostics import Code, Diagnostic
from ..io.source_file import SourceError, decode, read_stamped
from . import codes, conda, pyproject, requirements, setup_cfg, setup_py
from .edits import Edited, Found, Rewrite
from .kinds import DEPENDENCY_KINDS
from .needs import Needs, tree_needs, unseen_sources
from .requirement import SHIM_DISTRIBUTION, is_apex, name_of, normalised, replacement
from .steps import describe, steps

EDITORS: dict[str, Callable[[str, Rewrite], Edited]] = {
    "requirements": requirements.edit,
    "setup-py": setup_py.edit,
    "setup-cfg": setup_cfg.edit,
    "pyproject": pyproject.edit,
    "conda": conda.edit,
}


def _diagnostic(code: Code, line: int, col: int, message: str, fixed: bool) -> Finding:
    return Finding(Diagnostic(code.code, code.severity, line, col, message, fixed))


def _declares_shim(text: str, editor: Callable[[str, Rewrite], Edited]) -> bool:
    names: list[Optional[str]] = []

    def collect(requirement: str) -> None:
        names.append(name_of(requirement))

    editor(text, lambda r: collect(r))
    return normalised(SHIM_DISTRIBUTION) in names


#: Kinds that hold one list: a second Apex entry must not add `amp-migrate` a second time.
_ONE_LIST = ("requirements", "conda")


def _rewrite(needs: Needs, declared: bool, one_list: bool) -> Rewrite:
    added: set[str] = set()

    def rewrite(requirement: str) -> Optional[list[str]]:
        if not is_apex(requirement):
            return None
        decision = needs.decision
        if decision == "remove" or (decision == "replace" and declared):
            return []
        new = replacement(requirement)
        if one_list and new in added:
            return [] if decision == "replace" else [requirement]
        added.add(new)
        if decision == "replace":
            return [new]
        return [requirement] if declared or not needs.shim else [requirement, new]

    return rewrite


def _dependency_findings(found: Sequence[Found], needs: Needs) -> list[Finding]:
    findings = []
    for item in found:
        req, new = f"`{item.requirement}`", [n for n in item.new if n != item.requirement]
        if not item.editable:
            should = {
                "remove": "remove it: no file imports Apex or amp_shim after the migration",
                "replace": f"replace it by `{SHIM_DISTRIBUTION}`: {needs.shim[0] if needs.shim else ''}",
                "keep": f"keep it: {needs.why_kept}",
            }[needs.decision]
            message = f"{req} not edited ({item.why}); {should}"
            findings.append(
                _diagnostic(codes.APEX_DEPENDENCY_NOT_EDITED, item.line, item.col, message, False)
            )
        elif item.requirement in item.new:
            message = f"{req} kept: {needs.why_kept}"
            if new:
                message += f"; `{new[0]}` added for amp_shim: {needs.shim[0]}"
            findings.append(_diagnostic(codes.APEX_DEPENDENCY_KEPT, item.line, item.col, message, False))
        elif new:
            message = f"{req} → `{new[0]}`, the distribution that provides amp_shim: {needs.shim[0]}"
            findings.append(_diagnostic(codes.APEX_DEPENDENCY_REPLACED, item.line, item.col, message, True))
        elif needs.shim:
            message = f"{req} removed: `{SHIM_DISTRIBUTION}`, which provides amp_shim ({needs.shim[0]}), is declared"
            findings.append(_diagnostic(codes.APEX_DEPENDENCY_REPLACED, item.line, item.col, message, True))
        else:
            message = (
                f"{req} removed: no file under the given paths imports Apex or amp_shim after the migration"
            )
            findings.append(_diagnostic(codes.APEX_DEPENDENCY_REMOVED, item.line, item.col, message, True))
    return findings


def _step_findings(text: str, kind: str, needs: Needs) -> list[Finding]:
    findings = []
    for step in steps(text, dockerfile=kind == "dockerfile"):
        if needs.decision == "keep":
            still = f"still needed: {needs.why_kept}" if needs.apex else needs.why_kept
            message = f"{describe(step)}; {still}"
            findings.append(_diagnostic(codes.APEX_INSTALL_STEP_NEEDED, step.line, step.col, message, False))
            continue
        if needs.shim:
            why = f"install `{SHIM_DISTRIBUTION}` instead, which provides amp_shim: {needs.shim[0]}"
        else:
            why = "no file under the given paths imports Apex or amp_shim after the migration"
        message = f"{describe(step)}; no longer needed: {why}"
        findings.append(_diagnostic(codes.APEX_INSTALL_STEP_OBSOLETE, step.line, step.col, message, False))
    return findings


def _one(path: str, kind: str, needs: Callable[[], Needs], want_diff: bool) -> FileResult:
    try:
        data, stamp = read_stamped(path)
    except SourceError as exc:
        return FileResult(path, kind, error=str(exc))
    if b"apex" not in data.lower():
        return FileResult(path, kind)
    if kind not in DEPENDENCY_KINDS:  # read only: any bytes will do
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
        return FileResult(path, kind, scanned=True, findings=tuple(_step_findings(text, kind, needs())))
    try:
        source = decode(data)
    except SourceError as exc:
        return FileResult(path, kind, scanned=True, error=str(exc))
    editor = EDITORS[kind]
    declared = _declares_shim(source.text, editor)
    edited = editor(source.text, _rewrite(needs(), declared, kind in _ONE_LIST))
    result = FileResult(path, kind, scanned=True, findings=tuple(_dependency_findings(edited.found, needs())))
    if edited.text == source.text:
        return result
    try:
        new_bytes = source.to_bytes(edited.text)
    except SourceError as exc:
        return replace(result, error=str(exc))
    diff = unified_diff(source.text, edited.text, path) if want_diff else ""
    return replace(result, changed=True, new_bytes=new_bytes, diff=diff, stamp=stamp)


def migrate_install_files(
    files: Sequence[tuple[str, str]], results: Sequence[FileResult], mode: str, want_diff: bool
) -> list[FileResult]:
    """The result of each install file (path, kind), judged by what the migrated Python files
    and notebooks among `results` import, and by the other Python files and notebooks of the
    install file's folder, as they are on disk."""
    cached: dict[str, Needs] = {}

    def needs_of(folder: str) -> Callable[[], Needs]:
        def needs() -> Needs:  # read only when the install file mentions Apex
            if folder not in cached:
                cached[folder] = tree_needs([*results, *unseen_sources(folder, results)], mode)
            return cached[folder]

        return needs

    return [_one(path, kind, needs_of(os.path.dirname(path)), want_diff) for path, kind in files]
