"""`migrate_source`: the codemod as a pure function from source text to migrated text.

parse → rules (native, or shim imports) → choose the target → verify (compile, no new
undefined names, a second run changes nothing). The CLI only discovers files, runs this in a
pool, reports and writes.

Python's own parser reads every file first (a tenth of libcst's cost): a file whose code
neither imports Apex nor touches an `amp` attribute is returned without a libcst parse, and its
statement spans let each rule visit only the statements that spell what it acts on
(`SourceIndex`).
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import replace
from typing import Optional, Sequence

import libcst as cst
from libcst.codemod import CodemodContext

from . import deep_stack
from .analysis.ast_names import module_only_names
from .analysis.binding import apex_import_words, imports_apex
from .analysis.dynamic_apex import CALL_TEXT, dynamic_apex_use, importer_aliases
from .analysis.prefilter import might_use_apex
from .analysis.provided import ProvidedPart, migrate_part
from .analysis.source_index import SourceIndex, walk_ast
from .diagnostics import (
    INDENTATION_UNREADABLE,
    NATIVE_IMPOSSIBLE,
    PARSE_ERROR,
    VERIFY_FAILED,
    Code,
    Diagnostic,
    settle_unsafe,
)
from .io.indentation import TabIndents, tab_indents
from .io.indentation import message as indentation_message
from .io.lines import form_feed_indents
from .io.render import render
from .migration_result import MigrationResult
from .options import Options, Target
from .plan import plan_file
from .plan.types import SharedScaler
from .rules import NATIVE_RULES, SHIM_RULES
from .rules.base import FileState, Rule
from .rules.imports import SHIM_ARGUMENT_REJECTED, SHIM_NAME_MISSING
from .verify import InputDoesNotCompile, VerificationError, shim_names_missing, verify_output
from .verify import imports_apex as output_imports_apex


class MigrationError(Exception):
    """The source could not be migrated at all (it does not parse)."""

    def __init__(self, message: str, line: int = 0, col: int = 0, code: Code = PARSE_ERROR) -> None:
        super().__init__(f"{line}:{col}: {message}" if line else message)
        self.message = message
        self.line = line
        self.col = col
        self.code = code

    def as_diagnostic(self) -> Diagnostic:
        return Diagnostic(self.code.code, self.code.severity, self.line, self.col, self.message, False)


def python_ast(text: str) -> Optional[ast.Module]:
    """Python's parse of `text`, or None (syntax newer than this interpreter, NUL bytes, or
    nesting past the parser's limits)."""
    try:
        return _parsed(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _parsed(text: str) -> ast.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. invalid escapes: the user's to fix, not ours
        return ast.parse(text)


def _python_tree(text: str) -> Optional[ast.Module]:
    """Python's parse of `text`; None where its parser may only be older than the syntax.
    MigrationError where it refuses the file for one of its limits (too many nested
    parentheses, expressions nested past the recursion limit): Python cannot run the file, and
    no output of it could be checked to compile, whatever libcst reads."""
    try:
        with deep_stack.callers_limit():
            return _parsed(text)
    except (SyntaxError, RecursionError, MemoryError) as exc:
        if not deep_stack.beyond_python(exc):
            if isinstance(exc, SyntaxError):
                return None
            raise
        if isinstance(exc, SyntaxError):
            raise MigrationError(f"syntax error: {exc.msg}", exc.lineno or 0, exc.offset or 0) from None
        raise MigrationError(deep_stack.TOO_DEEP, 1, 1) from None
    except ValueError:  # NUL bytes
        return None


_GAP = r"(?:\s|\\\n)"  # whitespace, or a backslash continuation
_APEX_IMPORT_TEXT = re.compile(
    rf"\bimport\b(?:[^\n]|\\\n)*\bapex\b|\bfrom{_GAP}+apex\b"
    rf"|\bfrom{_GAP}+torch{_GAP}*\.{_GAP}*(?:cuda|cpu)\b"
)
_AMP_ATTRIBUTE_TEXT = re.compile(rf"\.{_GAP}*amp\b")
_BEFORE_DOT = re.compile(r"(?:\s|\\)*(\w*)(?:\s|\\)*$")


def may_touch_apex(text: str) -> bool:
    """A cheap superset of `touches_apex`, read from the text (comments and strings
    included): an import line naming `apex` or torch's deprecated amp modules, a call that may
    run or import Apex by name (`exec`, `import_module`, ... in a text that spells `apex`), or
    an `.amp` attribute of anything but the plain name `torch`."""
    if _APEX_IMPORT_TEXT.search(text) or ("apex" in text and CALL_TEXT.search(text)):
        return True
    for match in _AMP_ATTRIBUTE_TEXT.finditer(text):
        before = _BEFORE_DOT.search(text, max(0, match.start() - 200), match.start())
        name = before.group(1) if before else ""
        ahead = text[: before.start(1)].rstrip(" \t\n\\") if before else ""
        if name != "torch" or ahead.endswith("."):
            return True
    return False


def touches_apex(tree: ast.Module) -> bool:
    """Whether the code (not its comments) could give a rule anything to do: an import of
    Apex or of torch's deprecated amp, an `amp` attribute other than `torch.amp`, or a call
    that reaches Apex by a name in a string (`importlib.import_module("apex.amp")`,
    `exec("from apex import amp")`), which a file whose only Apex it is must still report.
    Every other rule acts on names those bind, so a file without them is left as it is. The
    `amp` of a name that can only hold `amp_shim` (a shim migration's `import amp_shim as apex`)
    is the shim's, not Apex's."""
    imports = list(SourceIndex.imports_of(tree))
    if any(imports_apex(node) for node in imports):
        return True
    importers = importer_aliases(imports)
    imports_shim = any(
        isinstance(n, ast.Import) and any(a.name == "amp_shim" for a in n.names) for n in imports
    )
    shim: Optional[frozenset[str]] = None  # names that only ever hold amp_shim: its `amp` is not Apex's
    for node in walk_ast(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "amp" and not (isinstance(node.value, ast.Name) and node.value.id == "torch"):
                if not imports_shim or not isinstance(node.value, ast.Name):
                    return True
                if shim is None:
                    shim = module_only_names("amp_shim", list(walk_ast(tree)))
                if node.value.id not in shim:
                    return True
        elif isinstance(node, ast.Call) and dynamic_apex_use(node, importers=importers) is not None:
            return True
    return False


#: The libcst parse of the text being migrated, kept for its run again on the deep stack
#: (libcst's parser takes seconds on the deepest expressions Python compiles).
_parses: dict[str, cst.Module] = {}


def parse(text: str) -> cst.Module:
    if text in _parses:
        return _parses[text]
    try:
        module = _parses[text] = cst.parse_module(text)
        return module
    except cst.ParserSyntaxError as exc:
        # Python's own parser names the place and the problem more precisely, when it agrees.
        try:
            ast.parse(text)
        except SyntaxError as py:
            raise MigrationError(f"syntax error: {py.msg}", py.lineno or 0, py.offset or 0) from None
        except ValueError:  # e.g. NUL bytes
            pass
        raise MigrationError(f"syntax error: {exc.message}", exc.raw_line, exc.raw_column + 1) from None


def _run(
    rules: Sequence[type[Rule]],
    module: cst.Module,
    text: str,
    index: Optional[SourceIndex],
    options: Options,
    project: Optional[SharedScaler] = None,
    planned: bool = False,
) -> tuple[cst.Module, FileState]:
    words = apex_import_words(index.imports()) if index is not None else None
    state = FileState(options, original=text, index=index, apex_words=words, parsed=module, project=project)
    if planned:
        plan_file(module, state)
    context = CodemodContext()
    for rule in rules:
        if rule.applies(state, context):
            module = rule(context, state).transform_module(module)
    return module, state


def _sorted(diagnostics) -> tuple[Diagnostic, ...]:
    return tuple(sorted(diagnostics, key=lambda d: (d.line, d.col, d.code)))


def _transform(
    module: cst.Module,
    original: str,
    tree: Optional[ast.Module],
    options: Options,
    project: Optional[SharedScaler] = None,
) -> tuple[str, tuple[Diagnostic, ...], Optional[str]]:
    """The rewritten code, its diagnostics, and the target that produced it."""
    index = SourceIndex(original, module, tree) if tree is not None else None
    if options.target == "shim":
        shimmed, state = _run(SHIM_RULES, module, original, index, options)
        return _code(shimmed, module, original, index), _sorted(state.diagnostics), "shim"
    native, state = _run(NATIVE_RULES, module, original, index, options, project, planned=True)
    if not state.falls_back:
        return (
            _code(native, module, original, index),
            _sorted(settle_unsafe(state.diagnostics, True)),
            "native",
        )
    reasons = [d for d in settle_unsafe(state.diagnostics, False) if d.falls_back]
    if options.target == "native":
        return (
            original,
            _sorted(
                reasons
                + [
                    Diagnostic(
                        NATIVE_IMPOSSIBLE.code,
                        NATIVE_IMPOSSIBLE.severity,
                        1,
                        1,
                        NATIVE_IMPOSSIBLE.summary,
                        False,
                    )
                ]
            ),
            None,
        )
    shimmed, shim_state = _run(SHIM_RULES, module, original, index, options)
    again = [d for d in shim_state.diagnostics if d not in reasons]  # rules of both targets report once
    return _code(shimmed, module, original, index), _sorted(reasons + again), "shim"


def _code(result: cst.Module, parsed: cst.Module, original: str, index: Optional[SourceIndex]) -> str:
    """The rules' output as text: the text as given when no rule changed the tree (rules
    hand back the very tree they got then, and libcst renders a parse as its text), and the
    original lines of every top-level statement no rule replaced (io/render.py)."""
    return render(result, parsed, original, index)


def _missing_diagnostic(missing) -> Diagnostic:
    code = SHIM_ARGUMENT_REJECTED if missing.kind == "argument" else SHIM_NAME_MISSING
    return Diagnostic(code.code, code.severity, missing.line, missing.col, missing.message, False)


def _with_part(text: str, options: Options, project: SharedScaler) -> MigrationResult:
    """A file with a part in a provider group (amp_migrate/analysis/provided.py): the part applied around
    the ordinary migration, with the rest of its project role."""
    part = project.provided
    assert isinstance(part, ProvidedPart)  # SharedScaler.provided holds one (typed `object` there)
    without = replace(project, provided=None)
    rest = None if without == SharedScaler() else without
    return migrate_part(
        text,
        part,
        lambda code: _again(code, options, rest),
    )


def _again(text: str, options: Options, project: Optional[SharedScaler]) -> MigrationResult:
    """`migrate_source` of a text derived from the file's, with the same options."""
    return migrate_source(
        text,
        target=options.target,
        device=options.device,
        dtype=options.dtype,
        unsafe_fixes=options.unsafe_fixes,
        project=project,
    )


def _with_spaced_indents(
    tabs: TabIndents, options: Options, project: Optional[SharedScaler]
) -> MigrationResult:
    """The migration of the spaced text, indented back as the file was; AMP004 at the first
    line libcst cannot read where either step would not provably keep the program."""
    unreadable = MigrationError(indentation_message(tabs.line), tabs.line, 1, INDENTATION_UNREADABLE)
    if tabs.text == tabs.original:
        raise unreadable
    try:
        result = _again(tabs.text, options, project)
    except MigrationError as exc:
        raise MigrationError(exc.message, exc.line, tabs.column(exc.line, exc.col), exc.code) from None
    code = tabs.restore(result.code)
    if code is None:
        raise unreadable
    return replace(
        result,
        code=code,
        diagnostics=tuple(replace(d, col=tabs.column(d.line, d.col)) for d in result.diagnostics),
    )


def _with_form_feed_indents(indents, options: Options, project: Optional[SharedScaler]) -> MigrationResult:
    """Migrate the text without the form feeds, then put them back, columns included."""
    try:
        result = _again(indents.text, options, project)
    except MigrationError as exc:
        column = indents.column(exc.line, exc.col)
        raise MigrationError(exc.message, exc.line, column, exc.code) from None
    return replace(
        result,
        code=indents.restore(result.code),
        diagnostics=tuple(replace(d, col=indents.column(d.line, d.col)) for d in result.diagnostics),
    )


def migrate_source(
    text: str,
    *,
    target: Target = "auto",
    device: str = "cuda",
    dtype: str = "float16",
    unsafe_fixes: bool = False,
    project: Optional[SharedScaler] = None,
) -> MigrationResult:
    """Migrate one Python source text off Apex.

    Raises `MigrationError` when the text does not parse. Never returns code that does not
    parse, compile, resolve its names, or that a second run would change: such output is
    dropped, the text is returned as given, and an AMP002 diagnostic says why. Nor shim
    output that takes from `amp_shim` what it does not have: the text is returned as given,
    with an error (AMP470, AMP471) where the file uses it. `project` is the file's part in a
    GradScaler shared with other modules (amp_migrate/project/share.py); None: the file alone.
    A file nested deeper than the recursion limit lets the rules read is migrated again on a
    deeper stack (amp_migrate/deep_stack.py); one too deep for that, or for Python, is a
    MigrationError.
    """
    try:
        return deep_stack.call(_migrate, text, Options(target, device, dtype, unsafe_fixes), project)
    except deep_stack.TooDeep as exc:
        raise MigrationError(str(exc), 1, 1) from None
    finally:
        _parses.clear()


def _migrate(text: str, options: Options, project: Optional[SharedScaler]) -> MigrationResult:
    if project is not None and project.provided is not None:
        return _with_part(text, options, project)
    handed = project is not None and bool(project.carrier_slots)  # receives Apex's module as a value
    if not might_use_apex(text) and not handed:
        return MigrationResult(text, (), None)
    indents = form_feed_indents(text)
    if indents is not None:  # libcst cannot parse statements indented past a form feed
        return _with_form_feed_indents(indents, options, project)
    tree = _python_tree(text)
    if tree is not None and not touches_apex(tree) and not handed:
        return MigrationResult(text, (), None)
    tabs = tab_indents(text) if tree is not None else None
    if tabs is not None:  # libcst cannot read how the indentation mixes tabs and spaces
        return _with_spaced_indents(tabs, options, project)
    module = parse(text)
    code, diagnostics, used = _transform(module, text, tree, options, project)
    if code == text:
        return MigrationResult(text, diagnostics, None)
    return _verified(text, tree, code, diagnostics, used, options, project)


def _verified(
    text: str,
    tree: Optional[ast.Module],
    code: str,
    diagnostics: tuple[Diagnostic, ...],
    used: Optional[str],
    options: Options,
    project: Optional[SharedScaler],
) -> MigrationResult:
    """The result of migrating `text` to `code`, once the output is checked (migrate_source's
    promises: it parses, compiles, resolves, is stable, and takes from `amp_shim` only what it has);
    `text` as given with the reason where it is not."""
    try:
        verify_output(text, tree, code)
        again_possible = might_use_apex(code) and may_touch_apex(code)
        # Without `again_possible` no import line names Apex (the text test is a superset of
        # `output_imports_apex`), so a native output needs no second parse.
        after_tree = python_ast(code) if again_possible or used == "shim" else None
        if used == "shim":
            missing = shim_names_missing(text, tree, code, after_tree)
            if missing:  # the file stays as it is: no fix was applied
                kept = [d for d in diagnostics if not d.fixed]
                return MigrationResult(text, _sorted([*kept, *map(_missing_diagnostic, missing)]), None)
        elif after_tree is not None and output_imports_apex(after_tree):
            raise VerificationError(f"the native output still imports `{output_imports_apex(after_tree)}`")
        if again_possible and (after_tree is None or touches_apex(after_tree)):
            try:
                after = cst.parse_module(code)
            except cst.ParserSyntaxError as exc:
                raise VerificationError(
                    f"the output does not parse: {exc.message} at line {exc.raw_line}"
                ) from exc
            again, _, _ = _transform(after, code, after_tree, options, project)
            if again != code:
                raise VerificationError("a second run would change the output again")
    except InputDoesNotCompile as exc:
        error = exc.error
        raise MigrationError(f"syntax error: {error.msg}", error.lineno or 0, error.offset or 0) from None
    except VerificationError as exc:
        failed = Diagnostic(
            VERIFY_FAILED.code, VERIFY_FAILED.severity, 1, 1, f"{VERIFY_FAILED.summary} ({exc})", False
        )
        return MigrationResult(text, _sorted(list(diagnostics) + [failed]), None)
    return MigrationResult(code, diagnostics, used, True)
