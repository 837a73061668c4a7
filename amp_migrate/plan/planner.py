"""The planner's pass: a read-only visit of the file as given, before any rule runs.

A planner is a libcst `CSTVisitor` over the parse with the reading helpers every pass has
(file_reader.py). It enters only the statements that spell its `interest()` words, and in them
only the node types that can hold one its `visit_<Type>` handlers act on
(analysis/cst_reach.py); it records each entered node's parent. Metadata (scopes, qualified
names) is resolved on first use over the parse itself, without libcst's defensive copy, so a
node the planner saw is the node the rules after it see.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import libcst as cst
from libcst.metadata import QualifiedNameProvider, ScopeProvider

from ..analysis.cst_reach import NODE_TYPES, holders_of
from ..analysis.fast_metadata import FastMetadataWrapper
from ..diagnostics import Code
from ..file_reader import FileReader
from ..file_state import FileState

_UNDEFINED = object()


class Planner(FileReader, cst.CSTVisitor):
    """A pass that reads the parse and changes nothing."""

    #: Text the file must contain for the planner to have anything to do (any one of them).
    MARKERS: ClassVar[tuple[str, ...]] = ("apex",)
    #: The Apex names it handles and every code it can report (read by docs and tests).
    HANDLES: ClassVar[tuple[str, ...]] = ()
    EMITS: ClassVar[tuple[Code, ...]] = ()
    #: The `FileState` fields it fills for the rules (read by docs).
    LEAVES: ClassVar[tuple[str, ...]] = ()
    _entered_types: ClassVar[Optional[frozenset[type]]] = None

    def __init__(self, state: FileState) -> None:
        FileReader.__init__(self, state)
        cst.CSTVisitor.__init__(self)
        self._wrapper: Optional[FastMetadataWrapper] = None
        self._resolved: dict = {}
        self._path: list[cst.CSTNode] = []
        self._entered_here = type(self)._entered()

    @classmethod
    def applies(cls, state: FileState) -> bool:
        return any(marker in state.original for marker in cls.MARKERS)

    def interest(self) -> Optional[frozenset[str]]:
        """Words a statement must spell for the planner to enter it (None: every statement)."""
        return self.state.apex_words

    def also_spells(self) -> Optional[frozenset[str]]:
        """A second set of words the same line must spell too (None: no such condition)."""
        return None

    def read(self, module: cst.Module) -> None:
        """Visit `module` (the parse), binding its Apex names first."""
        self._wrapper = FastMetadataWrapper(module, unsafe_skip_copy=True)
        self.bind(module)
        self._skip = self._parent_skip = self.state.skipping(self.interest(), self.also_spells())
        module.visit(self)

    @classmethod
    def _entered(cls) -> frozenset[type]:
        if cls.__dict__.get("_entered_types") is None:
            handled = frozenset(t for t in NODE_TYPES if _own_handler(cls, t))
            cls._entered_types = holders_of(handled)
        return cls.__dict__["_entered_types"]

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self._skip:
            return False
        self._seen_parents[node] = self._path[-1] if self._path else None
        if type(node) not in self._entered_here:
            return False
        self._path.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if type(original_node) in self._entered_here and id(original_node) not in self._skip:
            self._path.pop()
            super().on_leave(original_node)

    def get_metadata(self, key, node, default=_UNDEFINED):
        if (
            key is QualifiedNameProvider
            and key not in self._resolved
            and isinstance(default, (set, frozenset))
            and not default
        ):
            # What QualifiedNameProvider says of `node`, without its pass over every node.
            scope = self.get_metadata(ScopeProvider, node, None)
            return scope.get_qualified_names_for(node) if scope else default
        if key not in self._resolved:
            assert self._wrapper is not None, "metadata is asked for before the visit"
            self._resolved[key] = self._wrapper.resolve(key)
        table = self._resolved[key]
        value = table[node] if default is _UNDEFINED else table.get(node, default)
        # QualifiedNameProvider stores a callable that computes the set on first use.
        return value() if key is QualifiedNameProvider and callable(value) else value


def _own_handler(cls: type, node_type: type) -> bool:
    """A `visit_<Type>` of the planner's own: libcst's visitor has a no-op one for every type."""
    found = getattr(cls, f"visit_{node_type.__name__}", None)
    return callable(found) and not getattr(found, "__module__", "").startswith("libcst")
