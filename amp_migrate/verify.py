"""The pipeline's own checks on every output, so that a rule bug never reaches a user's file.

Like a linter's undefined-name check, names are compared before and after: a name that the
input could resolve (or never used) must not become unresolvable in the output. The check
reads Python's own symbol tables (`symtable`, the compiler's scope analysis), which cost a
fraction of a libcst scope pass and agree with the interpreter by construction.
"""

from __future__ import annotations

import ast
import builtins
import symtable
import warnings
from typing import Optional

import libcst as cst

from .analysis.shim_surface import Missing, missing_names
from .analysis.source_index import walk_ast

_BUILTINS = set(dir(builtins)) | {
    "__file__",
    "__name__",
    "__doc__",
    "__spec__",
    "__loader__",
    "__package__",
    "__builtins__",
    "__path__",
    "__annotations__",
    "__class__",
    "__qualname__",
    "__module__",
    "__dict__",
}


def undefined_names(code: str) -> set[str]:
    """Names read somewhere that resolve to the module scope, where nothing binds them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's code's warnings are not ours to print
        top = symtable.symtable(code, "<amp-migrate>", "exec")
    bound = {
        s.get_name()
        for s in top.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace() or s.is_parameter()
    }
    tables, stack = [], [top]
    while stack:
        table = stack.pop()
        tables.append(table)
        stack.extend(table.get_children())
    bound.update(
        s.get_name()
        for table in tables
        for s in table.get_symbols()
        if s.is_declared_global() and s.is_assigned()
    )
    missing: set[str] = set()
    for table in tables:
        for symbol in table.get_symbols():
            if not symbol.is_referenced():
                continue
            # A module-level read, or a function's read that resolves to the module.
            global_read = table is top or symbol.is_global()
            if global_read and symbol.get_name() not in bound and symbol.get_name() not in _BUILTINS:
                missing.add(symbol.get_name())
    return missing


def read_before_bound(tree: ast.Module, names: set[str]) -> set[str]:
    """Those of `names` that the input reads before, or in the statement where, it binds
    them: it could not resolve them there either (a fragment's
    `model, opt = amp.initialize(model, opt)`, whose rewrite drops the assignment)."""
    found: set[str] = set()
    pending = set(names)
    for stmt in tree.body:
        if not pending:
            break
        read, bound = _module_level_names(stmt)
        found |= read & pending
        pending -= bound
    for node in walk_ast(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            read, bound = _module_level_names(node)
            found |= read & bound & names
    return found


def _module_level_names(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    read: set[str] = set()
    bound: set[str] = set()
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            stack.extend(node.decorator_list)
            continue  # bodies run later
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
        stack.extend(ast.iter_child_nodes(node))
    return read, bound


class VerificationError(Exception):
    pass


class InputDoesNotCompile(VerificationError):
    """The output does not compile, and neither does the input, which Python's parser reads:
    the compiler refuses the program itself (`return` outside a function, too many statically
    nested blocks), not syntax newer than this interpreter (nor a notebook's top-level
    `await` or a later cell's `__future__` import, which IPython runs)."""

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(f"the input does not compile: {error.msg} at line {error.lineno}")
        self.error = error


#: CPython's refusal of a `from __future__` import after the first statement.
_LATE_FUTURE_IMPORT = "from __future__ imports must occur at the beginning of the file"


def _compile_error(code: str, flags: int = 0) -> Optional[SyntaxError]:
    try:
        with warnings.catch_warnings():
            # `x is not ()` and invalid escapes warn at compile time: the user's code, not ours.
            warnings.simplefilter("ignore")
            compile(code, "<amp-migrate>", "exec", flags, dont_inherit=True)
    except SyntaxError as exc:
        return exc
    except ValueError as exc:  # NUL bytes
        return SyntaxError(str(exc))
    return None


def verify_output(before: str, before_tree: Optional[ast.Module], after: str) -> None:
    """Check that the output compiles and reads no name the input did not resolve; raise
    VerificationError if not."""
    error = _compile_error(after)
    if error is not None:
        # Syntax newer than this interpreter (a 3.12 `type` alias on 3.11) is judged by
        # libcst's parser alone; only a compile error the input did not have is a failure.
        before_error = _compile_error(before)
        if before_error is None:
            raise VerificationError(f"the output does not compile: {error.msg} at line {error.lineno}")
        # A notebook's cells may `await` at the top level, and a later cell may import from
        # `__future__`, as IPython compiles each cell on its own.
        refusal = _compile_error(before, ast.PyCF_ALLOW_TOP_LEVEL_AWAIT) if before_tree is not None else None
        if refusal is not None and refusal.msg != _LATE_FUTURE_IMPORT:
            raise InputDoesNotCompile(before_error)
        try:
            cst.parse_module(after)
        except cst.ParserSyntaxError as exc:
            raise VerificationError(
                f"the output does not parse: {exc.message} at line {exc.raw_line}"
            ) from exc
        return
    new = undefined_names(after)
    if new and before_tree is not None:  # only then is the input's own set worth computing
        new -= undefined_names(before) | read_before_bound(before_tree, new)
    elif new:
        new = set()  # the input is beyond this interpreter: nothing to compare with
    if new:
        raise VerificationError("the output reads names that nothing defines: " + ", ".join(sorted(new)))


def shim_names_missing(
    before: str, before_tree: Optional[ast.Module], after: str, after_tree: Optional[ast.Module]
) -> list[Missing]:
    """The modules, names and keyword arguments the shim output takes from `amp_shim` that it
    does not have, placed where the input spells them (the shim target only renames `apex`
    to `amp_shim`, so the input's Apex uses are the output's shim uses). An output whose uses
    the input's do not account for is a rewrite bug: VerificationError."""
    if after_tree is None:
        return []  # syntax beyond this interpreter: `compile` judged it, nothing to read
    found = missing_names(after_tree, after)
    if not found:
        return []
    located = missing_names(before_tree, before, ("apex", "amp_shim")) if before_tree else []
    if sorted(m.key for m in located) != sorted(m.key for m in found):
        raise VerificationError(
            "the output uses what amp_shim does not have: " + ", ".join(sorted({m.shim_name for m in found}))
        )
    return located


def imports_apex(tree: ast.Module) -> Optional[str]:
    """The first Apex module a native output still imports (a rule bug), or None."""
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for name in names:
            if name == "apex" or name.startswith("apex."):
                return name
    return None
