"""A file's part in a provider group: Apex's module obtained from a function of the tree.

`def get_amp(fp16): if fp16: from apex import amp; else: amp = None; return amp` hands its
callers Apex's module exactly when `fp16`, None otherwise. To a caller, `amp = get_amp(c)`
means what `amp = None; if c: from apex import amp` means in place, and that form the per-file
rules already migrate (carriers.py: the value becomes the GradScaler built where `initialize`
runs, enabled under the same condition). The project pass (project/provide.py) proves the
provider and each call, and hands each file a `ProvidedPart`:

* a caller gets the edits that spell its call that way, line for line (the import goes on a
  line of its own at the top of the `if` that runs `initialize`, whose test becomes the
  provider's condition in the caller's arguments); its native result drops the provider's name
  from its imports. Where that does not go native, the file is migrated as written and the
  reason is reported where it arises (`fallback`);
* the provider's module gets the provider function removed: no call of it is left in the tree.

Nothing here decides anything; `migrate_source` applies the part (no index is needed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Union

import libcst as cst
import libcst.matchers as m

from ..diagnostics import Diagnostic, Severity
from ..io.indentation import tab_indents
from ..migration_result import MigrationResult

#: (first line, byte column, last line, byte column, replacement) on the file as written
Edit = tuple[int, int, int, int, str]


@dataclass(frozen=True)
class ProvidedPart:
    """What one file does in its provider group (project/provide.py builds it)."""

    #: the caller's edits, sorted, none overlapping
    edits: tuple[Edit, ...] = ()
    #: whole lines the edits insert: (line in the edited text, line and column reported)
    inserted: tuple[tuple[int, int, int], ...] = ()
    #: caller: names its imports of the provider drop; provider's module: functions removed
    drop: tuple[str, ...] = ()
    removes: bool = False  # the provider's module: `drop` names the functions to remove
    #: (function, name): the `name = None` the edits put in that module-level function, which
    #: goes where the native code no longer reads the name (no test of the value was left)
    nones: tuple[tuple[str, str], ...] = ()
    notes: tuple[Diagnostic, ...] = ()  # added where the part went native
    refused: tuple[Diagnostic, ...] = ()  # the group cannot go native: added, nothing else done
    as_written: bool = False  # a member of a group that cannot go native: migrated as it is
    #: the code and severity of the caller's fallback (its message names the reason)
    fallback: Optional[Diagnostic] = None


Run = Callable[[str], MigrationResult]  # migrate_source without the part


def _offsets(lines: list[bytes]) -> list[int]:
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line)
    starts.append(at)
    return starts


def apply_edits(text: str, edits: tuple[Edit, ...]) -> str:
    data = text.encode("utf-8")
    starts = _offsets(data.splitlines(keepends=True))
    out, at = [], 0
    for line1, col1, line2, col2, new in edits:
        start, end = starts[line1 - 1] + col1, starts[line2 - 1] + col2
        out += [data[at:start], new.encode("utf-8")]
        at = end
    out.append(data[at:])
    return b"".join(out).decode("utf-8")


def _origin_line(part: ProvidedPart, line: int, col: int) -> tuple[int, int]:
    """A line of the edited text as the file's own line (and column)."""
    shift = 0
    for inserted, reported, reported_col in part.inserted:
        if line == inserted:
            return reported, reported_col
        if line > inserted:
            shift += 1
    return line - shift, col


def _remap(part: ProvidedPart, diagnostics) -> tuple[Diagnostic, ...]:
    out = []
    for d in diagnostics:
        line, col = _origin_line(part, d.line, d.col)
        out.append(replace(d, line=line, col=col))
    return tuple(out)


class _DropImported(cst.CSTTransformer):
    """Drops `names` (under any alias) from `from ... import` statements (the statement too when
    none is left): project/provide.py made sure the caller imports that name only from the
    provider's module."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def leave_ImportFrom(self, original_node, updated_node):
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        kept = [
            a for a in updated_node.names if not (isinstance(a.name, cst.Name) and a.name.value in self.names)
        ]
        if len(kept) == len(updated_node.names):
            return updated_node
        if not kept:
            return cst.RemoveFromParent()
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=kept)


class _DropUnreadNones(cst.CSTTransformer):
    """`name = None` statements of `function` that nothing in it reads any more."""

    def __init__(self, nones: tuple[tuple[str, str], ...]) -> None:
        self.nones = nones
        self.names: frozenset[str] = frozenset()

    def visit_FunctionDef(self, node) -> bool:
        wanted = {name for function, name in self.nones if function == node.name.value}
        spelled = _spelled(node)
        self.names = frozenset(n for n in wanted if spelled.get(n, 0) == 1)
        return bool(self.names)

    def leave_FunctionDef(self, original_node, updated_node):
        self.names = frozenset()
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if (
            len(updated_node.body) == 1
            and m.matches(
                updated_node.body[0],
                m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Name("None")),
            )
            and updated_node.body[0].targets[0].target.value in self.names
        ):
            return cst.RemoveFromParent()
        return updated_node


def _spelled(node: cst.CSTNode) -> dict[str, int]:
    """How often each name is spelled under `node` (an attribute's own name, `torch.amp`'s
    `amp`, is none)."""
    counts: dict[str, int] = {}

    class Count(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            counts[name.value] = counts.get(name.value, 0) + 1

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False

    node.visit(Count())
    return counts


class _DropFunctions(cst.CSTTransformer):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def leave_FunctionDef(self, original_node, updated_node):
        if original_node.name.value in self.names:
            return cst.RemoveFromParent()
        return updated_node

    def visit_FunctionDef(self, node) -> bool:
        return False  # only the module's own functions


def _visited(text: str, *visitors: cst.CSTTransformer) -> Optional[str]:
    """`text` parsed, transformed by `visitors` and rendered. Indentation that mixes tabs the
    way Python accepts and libcst cannot read is spaced for the parse and put back after
    (indentation.py); None where that is not provably the same program."""
    tabs = tab_indents(text)
    if tabs is not None and tabs.text == tabs.original:
        return None
    tree = cst.parse_module(text if tabs is None else tabs.text)
    for visitor in visitors:
        tree = tree.visit(visitor)
    return tree.code if tabs is None else tabs.restore(tree.code)


def migrate_part(text: str, part: ProvidedPart, run: Run) -> MigrationResult:
    """The file's result with its part applied (`run`: migrate_source on a text, no part)."""

    if part.refused or part.as_written:
        result = run(text)
        return replace(result, diagnostics=_sorted(result.diagnostics + part.refused))
    if part.removes:
        code = _visited(text, _DropFunctions(part.drop))
        if code is None:
            return run(text)
        result = run(code)
        if result.target_used == "shim" or any(
            d.falls_back or d.severity == Severity.ERROR for d in result.diagnostics
        ):
            return run(text)
        return MigrationResult(result.code, _sorted(result.diagnostics + part.notes), "native", True)
    edited = apply_edits(text, part.edits)
    result = run(edited)
    reasons = [d for d in _remap(part, result.diagnostics) if d.falls_back or d.severity == Severity.ERROR]
    if result.target_used == "native":
        dropped = _dropped_provider(result, part)
        if isinstance(dropped, str):
            return MigrationResult(
                dropped, _sorted(_remap(part, result.diagnostics) + part.notes), "native", True
            )
        reasons = dropped
    plain = run(text)
    if not reasons or part.fallback is None:
        return plain
    first = next((d for d in reasons if d.code == "AMP155"), reasons[0])  # the value's own flow first
    why = replace(
        part.fallback,
        line=first.line,
        col=first.col,
        message=f"{part.fallback.message}: {first.code} {first.message}",
    )
    return replace(plain, diagnostics=_sorted(plain.diagnostics + (why,)))


def _dropped_provider(result: MigrationResult, part: ProvidedPart) -> Union[str, list[Diagnostic]]:
    """The caller's native code without its import of the provider, or why it cannot go."""
    code = _visited(result.code, _DropImported(part.drop), _DropUnreadNones(part.nones))
    if code is None:
        line, why = 1, "the file's tab-mixed indentation cannot be put back around the change"
    else:
        try:
            compile(code, "<provided>", "exec")
            return code
        except SyntaxError as exc:  # an import of the provider alone in a block
            line, why = exc.lineno or 1, "dropping the provider's import leaves a block empty"
    return [replace(part.fallback, line=line, col=1, message=why)] if part.fallback is not None else []


def _sorted(diagnostics) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=lambda d: (d.line, d.col, d.code)))
