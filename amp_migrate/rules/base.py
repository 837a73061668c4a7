"""What every rule shares: the file's state, Apex name binding, diagnostics, and helpers.

A rule is a libcst codemod command (one class per transform, as in libcst's own codemods)
that reads like the recipe it implements. Rules run in order over one file; each sees the
previous rule's output with fresh metadata. Imports are settled once, by the last rule, so the
per-command import passes of `CodemodCommand.transform_module` are skipped here.
"""
from __future__ import annotations

import difflib
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import ClassVar, Optional, Sequence

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst._metadata_dependent import LazyValue
from libcst.metadata import (MetadataWrapper, ParentNodeProvider, PositionProvider,
                             QualifiedNameProvider, ScopeProvider)

_UNDEFINED = object()

from ..binding import ApexBinder
from ..diagnostics import Code, Diagnostic
from ..options import Options


@dataclass
class FileState:
    """Everything the rules of one file share, besides the tree itself."""

    options: Options
    diagnostics: list[Diagnostic] = field(default_factory=list)
    scratch: dict = field(default_factory=dict)  # cross-rule facts, keyed by the rule that owns them
    original: str = ""
    current: str = ""
    _line_map: Optional[dict[int, int]] = None

    @property
    def falls_back(self) -> bool:
        return any(d.falls_back for d in self.diagnostics)

    def advance(self, code: str) -> None:
        """The next rule sees `code`; positions it reports are mapped back to the original."""
        if code != self.current:
            self.current = code
            self._line_map = None

    def original_line(self, line: int) -> int:
        """A line of the current text as a line of the original (for diagnostics)."""
        if self.current == self.original or line <= 0:
            return line
        if self._line_map is None:
            self._line_map = {}
            old, new = self.original.splitlines(), self.current.splitlines()
            matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes():
                for j in range(j1, j2):
                    self._line_map[j + 1] = (i1 + (j - j1) if tag == "equal" else min(i1, max(i2 - 1, i1))) + 1
        return self._line_map.get(line, line)


class Rule(VisitorBasedCodemodCommand):
    """Base class of the codemod's rules."""

    #: Providers a rule may ask for through `get_metadata`, resolved on first use only: a
    #: rule that reports nothing never computes positions, and the Apex binder needs scope
    #: analysis only for files that rebind an imported Apex name.
    LAZY_METADATA: ClassVar[Sequence] = (
        PositionProvider,
        QualifiedNameProvider,
        ParentNodeProvider,
        ScopeProvider,
    )
    #: Text the file must contain for the rule to have anything to do (any one of them);
    #: files without it skip the rule's parse-tree passes entirely.
    MARKERS: ClassVar[tuple[str, ...]] = ("apex",)

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        super().__init__(context)
        self.state = state
        self.options = state.options
        self.apex: Optional[ApexBinder] = None
        self._parents: Optional[dict[cst.CSTNode, cst.CSTNode]] = None

    # -- running ---------------------------------------------------------------------------
    # No rule uses matcher decorators (@m.visit, @m.call_if_inside), so the per-node matcher
    # bookkeeping of libcst's MatcherDecoratableTransformer is skipped: plain CSTTransformer
    # dispatch, which is most of a rule's cost on a large file otherwise.
    def on_visit(self, node: cst.CSTNode) -> bool:
        return cst.CSTTransformer.on_visit(self, node)

    def on_leave(self, original_node, updated_node):
        return cst.CSTTransformer.on_leave(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        cst.CSTTransformer.on_visit_attribute(self, node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        cst.CSTTransformer.on_leave_attribute(self, original_node, attribute)

    @classmethod
    def applies(cls, state: FileState, context: CodemodContext) -> bool:
        """Cheap test, before the rule is even built, of whether it can find anything to do."""
        return not cls.MARKERS or any(marker in state.current for marker in cls.MARKERS)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        return Codemod.transform_module(self, tree)

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module):
        # Every rule gets a tree no one else holds (the parse, or the previous rule's output),
        # so the defensive deep copy libcst makes by default would only cost time.
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=None)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.apex = ApexBinder(tree, self.get_metadata, self.state.scratch.get("binding"))
        self.state.scratch.setdefault("binding", self.apex)
        return super().transform_module_impl(tree)

    def get_metadata(self, key, node, default=_UNDEFINED):
        if key not in self.metadata:
            if key not in self.LAZY_METADATA and key not in self.get_inherited_dependencies():
                raise KeyError(f"{key.__name__} is not available to {type(self).__name__}")
            self.metadata = {**self.metadata, key: self.context.wrapper.resolve(key)}
        value = self.metadata[key][node] if default is _UNDEFINED else self.metadata[key].get(node, default)
        return value() if isinstance(value, LazyValue) else value

    # -- helpers for rules -----------------------------------------------------------------
    def apex_name(self, node: cst.CSTNode) -> Optional[str]:
        assert self.apex is not None
        return self.apex.name_of(node)

    def code_of(self, node: cst.CSTNode) -> str:
        return cst.Module([]).code_for_node(node)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        try:
            start = self.get_metadata(PositionProvider, node).start
        except KeyError:  # a node this rule built: no position
            return (0, 0)
        return start.line, start.column + 1

    def report(self, node: cst.CSTNode, code: Code, message: Optional[str] = None, *,
               fixed: bool = True) -> None:
        line, col = self.position(node)
        line = self.state.original_line(line)
        diag = Diagnostic(code.code, code.severity, line, col, message or code.summary,
                          fixed and not code.falls_back)
        if diag not in self.state.diagnostics:
            self.state.diagnostics.append(diag)

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        # What ParentNodeProvider gives, from a walk over `children` (a third of its cost).
        if self._parents is None:
            self._parents = {}
            stack: list[cst.CSTNode] = [self.context.wrapper.module]
            while stack:
                current = stack.pop()
                for child in current.children:
                    self._parents[child] = current
                    stack.append(child)
        return self._parents.get(node)

    def statement_around(self, block: cst.CSTNode) -> Optional[cst.BaseCompoundStatement]:
        """The compound statement (`if`, `with`, `try`) whose body `block` is, when it sits in a
        block itself; None at a loop, function, class or module boundary, which a search for
        what happened earlier in the same iteration must not cross."""
        owner: Optional[cst.CSTNode] = block
        while True:
            owner = self.parent(owner)
            if owner is None or isinstance(owner, (cst.For, cst.While, cst.FunctionDef,
                                                   cst.ClassDef, cst.Lambda, cst.Module)):
                return None
            if isinstance(owner, cst.BaseCompoundStatement) and \
                    isinstance(self.parent(owner), (cst.IndentedBlock, cst.Module)):
                return owner

    def ancestors(self, node: cst.CSTNode):
        parent = self.parent(node)
        while parent is not None:
            yield parent
            parent = self.parent(parent)



def add_requested_imports(context: CodemodContext, tree: cst.Module) -> cst.Module:
    """Run libcst's AddImportsVisitor for what rules asked, minus plain `import X` already bound
    at module level. (AddImportsVisitor looks only at the leading import block, so an
    `import torch` after a `sys.path.insert(...)` would otherwise be added a second time.)"""
    requested = context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
    if not requested:
        return tree
    bound = {alias.evaluated_alias or alias.evaluated_name
             for stmt in tree.body if isinstance(stmt, cst.SimpleStatementLine)
             for small in stmt.body if isinstance(small, cst.Import)
             for alias in small.names}
    context.scratch[AddImportsVisitor.CONTEXT_KEY] = [
        item for item in requested
        if not (item.obj_name is None and item.alias is None and not item.relative
                and item.module_name in bound)]
    tree = AddImportsVisitor(context).transform_module(tree)
    context.scratch[AddImportsVisitor.CONTEXT_KEY] = []
    return tree
