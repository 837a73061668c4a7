"""What a pass over one file can ask about it: which Apex name an expression is, where a node
is in the file as given, its parent, the statements that spell some words, and diagnostics.

Two kinds of pass share it: the planner (plan/planner.py), a read-only visit of the parse, and
the rules (rules/base.py), which transform the tree. Each pass records the parents of the nodes
its traversal enters; a parent asked for before the traversal reaches it comes from a walk over
the statements the pass does not skip.
"""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Iterable, Optional, Union, cast

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node
from libcst.metadata import PositionProvider

from .analysis.binding import NOTHING, ApexBinder, children, find
from .analysis.fast_metadata import FastMetadataWrapper
from .diagnostics import Code, Diagnostic
from .file_state import FileState

_UNDEFINED = object()


class FileReader:
    """The reading half of a pass over one file; `get_metadata` is the pass's own."""

    def __init__(self, state: FileState) -> None:
        self.state = state
        self.options = state.options
        self.apex: Optional[ApexBinder] = None
        self._tree: Optional[cst.Module] = None
        self._parents: Optional[dict[cst.CSTNode, cst.CSTNode]] = None
        self._skip: AbstractSet[int] = NOTHING
        self._parent_skip: AbstractSet[int] = NOTHING
        self._seen_parents: dict[cst.CSTNode, Optional[cst.CSTNode]] = {}

    def get_metadata(self, key, node, default=_UNDEFINED):
        raise NotImplementedError  # each kind of pass resolves metadata its own way

    def bind(self, tree: cst.Module) -> None:
        """Start reading `tree`: its Apex binder, built from the file's first binder where an
        earlier pass made one (this pass then becomes the file's first)."""
        self._tree = tree
        known = self.state.binding
        index = self.state.index
        parsed = (
            (self.state.original, index.tree)
            if (known is None and index is not None and tree is self.state.parsed)
            else None
        )
        self.apex = ApexBinder(
            tree,
            self.get_metadata,
            known,
            self.state.skipping,
            self.state.apex_words,
            self._known_parent,
            dict(self.state.project.carrier_slots if self.state.project is not None else ()),
            parsed,
        )
        if known is None:
            self.state.binding = self.apex
            if self.state.apex_words is not None:
                self.state.apex_words = self.state.apex_words | self.apex.words()

    def words_for(self, *names: str) -> Optional[frozenset[str]]:
        """What a statement must spell to reach one of these Apex names: the name's last part
        (`amp.initialize`, `handle.scale_loss`), or a local name that an import or a `self.`
        holder binds to it or to something under it. Files that rebind an Apex name get all
        the Apex words."""
        words = self.state.apex_words
        if words is None or self.apex is None or self.apex.table is None:
            return words
        lasts = {name.rsplit(".", 1)[-1] for name in names}
        out = set(lasts)
        for local, full in list(self.apex.table.items()) + list(self.apex.holders.items()):
            if full.rsplit(".", 1)[-1] in lasts or any(full == n or full.startswith(n + ".") for n in names):
                out.add(local)
        return frozenset(out)

    def qualifying_words(self, part: str, first: Optional[str] = None) -> Optional[frozenset[str]]:
        """What a statement must spell for a name in it to have a qualified name with the
        dotted component `part` (None: unknown, every statement); `first`: only qualified
        names that start with it matter (see `SourceIndex.qualifying`)."""
        return self.state.index.qualifying(part, first) if self.state.index is not None else None

    def may_qualify_as(self, node: cst.CSTNode, part: str, first: Optional[str] = None) -> bool:
        """False when no qualified name of `node` (QualifiedNameProvider's) can have the
        dotted component `part`, told from its spelling and the file's imports, without scope
        analysis; True when it may."""
        words = self.qualifying_words(part, first)
        if words is None:
            return True
        name = get_full_name_for_node(node)
        return name is None or not words.isdisjoint(name.split("."))

    def may_start_with(self, node: cst.CSTNode, first: str) -> bool:
        """False when no qualified name of `node` can start with the component `first`: its
        dotted spelling starts with none of `SourceIndex.root_words(first)`."""
        words = self.state.index.root_words(first) if self.state.index is not None else None
        if words is None:
            return True
        name = get_full_name_for_node(node)
        return name is None or name.split(".", 1)[0] in words

    def name_is_free(self, name: str, tree: cst.Module) -> bool:
        """No code in the file spells `name` (cheap when the text never does)."""
        index = self.state.index
        if index is not None and not index.spells(name) and not find(tree, m.Name(name), index.original_ids):
            return True
        return name not in self.names_in_use(tree)

    def names_in_use(self, tree: cst.Module) -> set[str]:
        """Every name the code spells (the file as given, and what rules wrote since)."""
        index = self.state.index
        if index is None:
            return {cast(cst.Name, n).value for n in m.findall(tree, m.Name())}  # what m.Name() found
        return set(index.identifiers) | {
            cast(cst.Name, n).value for n in find(tree, m.Name(), index.original_ids)
        }

    def findall(
        self,
        tree: cst.CSTNode,
        matcher,
        words: Optional[Iterable[str]] = (),
        also: Optional[Iterable[str]] = None,
    ) -> list[cst.CSTNode]:
        """`m.findall` over the statements that spell one of `words` (default: `interest()`),
        with one of `also` on the same line if given."""
        parents = self._seen_parents if tree is self._wrapped_module() else None
        if words == ():
            return find(tree, matcher, self._skip, parents)
        skip = self.state.skipping(words, also)
        if words is None:
            self._parent_skip = NOTHING
        elif self._parent_skip:
            self._parent_skip = self._parent_skip & skip
        self._parents = None  # what was found must have parents
        return find(tree, matcher, skip, parents)

    def apex_name(self, node: cst.CSTNode) -> Optional[str]:
        assert self.apex is not None
        return self.apex.name_of(node)

    def code_of(self, node: cst.CSTNode) -> str:
        return cst.Module([]).code_for_node(node)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """Line and column of `node` in the file as given. Statements no rule has changed
        know their line (SourceIndex); a node inside one is placed by laying out that
        statement alone. A node no statement of the original file encloses has none: (0, 0)."""
        index = self.state.index
        if isinstance(node, cst.Module):
            return (1, 1)
        if index is None:
            return self._position_by_layout(node)
        statement: Optional[cst.CSTNode] = node
        while statement is not None:
            place = index.place_of(statement)
            if place is not None:
                break
            statement = self.parent(statement)
        else:
            return (0, 0)
        line, col = place
        if statement is node:
            return line, col + 1
        known = self.state.layouts.get(id(statement))
        if known is not None and known[0] is statement:
            positions = known[1]
        else:
            placed = cast(Union[cst.SimpleStatementLine, cst.BaseCompoundStatement], statement)  # has a place
            wrapper = FastMetadataWrapper(cst.Module(body=[placed]), unsafe_skip_copy=True)
            positions = wrapper.resolve(PositionProvider)
            self.state.layouts[id(statement)] = (statement, positions)
        where, base = positions.get(node), positions.get(statement)
        if where is None or base is None:
            return line, col + 1
        return line + where.start.line - base.start.line, where.start.column + col + 1

    def _position_by_layout(self, node: cst.CSTNode) -> tuple[int, int]:
        try:
            start = self.get_metadata(PositionProvider, node).start
        except KeyError:  # a node this rule built: no position
            return (0, 0)
        return start.line, start.column + 1

    def report(
        self, node: cst.CSTNode, code: Code, message: Optional[str] = None, *, fixed: bool = True
    ) -> None:
        line, col = self.position(node)
        # An unsafe fix is marked allowed here; migrate.py says in its message whether it applied.
        allowed = bool(code.unsafe) and self.options.unsafe_fixes
        diag = Diagnostic(code.code, code.severity, line, col, message or code.summary, False, allowed)
        diag = replace(diag, fixed=fixed and not diag.falls_back)
        if diag not in self.state.diagnostics:
            self.state.diagnostics.append(diag)

    def _known_parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The parent if the traversal has recorded it (no walk over the file)."""
        return self._seen_parents.get(node)

    def _wrapped_module(self) -> cst.Module:
        """The tree being read (set when the pass starts)."""
        assert self._tree is not None, "no tree is being read"
        return self._tree

    def current_module(self) -> cst.Module:
        """The tree this pass reads: the parse, or the output of the rules before it."""
        return self._wrapped_module()

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        # What ParentNodeProvider gives: recorded during the traversal for every node it
        # entered; for others (asked about before the traversal reaches them), from a walk
        # over node fields that does not enter the statements this rule skips.
        if node in self._seen_parents:
            return self._seen_parents[node]
        if self._parents is None:
            self._parents = {}
            stack: list[cst.CSTNode] = [self._wrapped_module()]
            skip = self._parent_skip
            while stack:
                current = stack.pop()
                for child in children(current):
                    self._parents[child] = current
                    if id(child) not in skip:
                        stack.append(child)
        return self._parents.get(node)

    def statement_around(self, block: cst.CSTNode) -> Optional[cst.BaseCompoundStatement]:
        """The compound statement (`if`, `with`, `try`) whose body `block` is, when it sits in a
        block itself; None at a loop, function, class or module boundary, which a search for
        what happened earlier in the same iteration must not cross."""
        owner = block
        while True:
            above = self.parent(owner)
            if above is None or isinstance(
                above, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)
            ):
                return None
            owner = above
            if isinstance(owner, cst.BaseCompoundStatement) and isinstance(
                self.parent(owner), (cst.IndentedBlock, cst.Module)
            ):
                return owner

    def ancestors(self, node: cst.CSTNode):
        parent = self.parent(node)
        while parent is not None:
            yield parent
            parent = self.parent(parent)
