"""What every rule shares: the file's state, Apex name binding, diagnostics, and helpers.

A rule is a libcst codemod (one class per transform, as in libcst's own codemods) that reads
like the recipe it implements. Rules run in order over one file; each sees the previous rule's
output with fresh metadata. Imports are settled once, by the last rule, so a rule is a plain
`Codemod` and transformer rather than a `CodemodCommand`, whose `transform_module` would run
the import passes after each one. Only libcst's public API is used
(tests/codemod/test_libcst_public_api.py).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import replace
from typing import AbstractSet, ClassVar, Iterable, Optional, Sequence, cast

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from ..analysis.binding import NOTHING, children
from ..analysis.call_args import dotted
from ..analysis.cst_reach import NODE_TYPES, concrete, holders_of
from ..analysis.fast_metadata import FastMetadataWrapper
from ..analysis.source_index import SourceIndex
from ..analysis.statements import BLOCKS as _BLOCKS
from ..analysis.statements import STATEMENTS as _STATEMENTS
from ..diagnostics import Code
from ..file_reader import FileReader
from ..file_state import FileState
from ..plan.types import TrainingPlan
from .facts import Fact

_UNDEFINED = object()


@contextmanager
def metadata_without_copy(codemod: Codemod, module: cst.Module):
    """`module` in a MetadataWrapper that the codemod's context holds while it runs, as
    `Codemod.transform_module` sets it up, minus libcst's defensive deep copy of the tree:
    unchanged statements keep their identity, which positions are keyed by."""
    wrapper = FastMetadataWrapper(module, unsafe_skip_copy=True)
    with codemod.resolve(wrapper):
        codemod.context = replace(codemod.context, wrapper=wrapper)
        try:
            yield wrapper.module
        finally:
            codemod.context = replace(codemod.context, wrapper=None)


_WORD = re.compile(r"\w+")


def may_read_names(tree: cst.CSTNode, names: AbstractSet[str], index: SourceIndex) -> bool:
    """Whether libcst's scope analysis could find a use of one of `names` in `tree` outside
    import statements: a `Name` spelling one (an attribute's own name is none), a string with
    one as a word where strings are read as names (in an annotation, or under a call or
    subscript that may be `typing`'s), or any `__all__` (its strings are exports)."""
    typing = [index.qualifying(part) for part in ("typing", "typing_extensions")]
    known = [words for words in typing if words is not None]
    typing_words = frozenset().union(*known) if len(known) == len(typing) else None
    stack: list[tuple[cst.CSTNode, bool]] = [(tree, False)]
    skip = index.skipped(set(names) | {"__all__"})
    while stack:
        node, strings = stack.pop()
        if id(node) in skip or isinstance(node, (cst.Import, cst.ImportFrom)):
            continue
        if isinstance(node, cst.Name):
            if node.value in names or node.value == "__all__":
                return True
        elif isinstance(node, cst.Attribute):
            stack.append((node.value, strings))
        elif isinstance(node, (cst.SimpleString, cst.FormattedStringText)):
            if strings and not names.isdisjoint(_WORD.findall(node.value)):
                return True
        else:
            if isinstance(node, cst.Annotation):
                strings = True
            elif isinstance(node, (cst.Call, cst.Subscript)) and not strings:
                name = get_full_name_for_node(node.func if isinstance(node, cst.Call) else node.value)
                strings = typing_words is None or name is None or not typing_words.isdisjoint(name.split("."))
            stack.extend((child, strings) for child in children(node))
    return False


class _DropStatements(cst.CSTTransformer):
    """Removes the given statements; every other node it hands back is the node it got, or,
    for a compound statement or block that lost statements, a copy holding the same nodes."""

    def __init__(self, skip: AbstractSet[int]) -> None:
        super().__init__()
        self.skip = skip
        self._changed: list[bool] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        enter = id(node) not in self.skip and isinstance(node, _BLOCKS)
        if enter:
            self._changed.append(False)
        return enter

    def on_leave(self, original_node, updated_node):
        if id(original_node) in self.skip and isinstance(original_node, _STATEMENTS):
            if self._changed:
                self._changed[-1] = True
            return cst.RemoveFromParent()
        if not isinstance(original_node, _BLOCKS):
            return original_node
        if not self._changed.pop():
            return original_node
        if self._changed:
            self._changed[-1] = True
        return updated_node


def statements_spelling(module: cst.Module, skip: AbstractSet[int]) -> cst.Module:
    """`module` without the statements in `skip`, for analyses that need only the rest (the
    result need not be valid code: a block may be left empty)."""
    return module.visit(_DropStatements(skip)) if skip else module


class Rule(FileReader, Codemod, cst.CSTTransformer):
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
    #: Qualified names of the Apex objects (or deprecated torch names) the rule rewrites or
    #: judges, as the binder spells them (`apex.amp.scale_loss`); read by docs and tests.
    HANDLES: ClassVar[tuple[str, ...]] = ()
    #: Every diagnostic the rule can report (the `Code`s `define` returned); a test holds each
    #: rule to it, and docs/diagnostics.md groups the codes by it.
    EMITS: ClassVar[tuple[Code, ...]] = ()
    #: The facts (rules/facts.py) the rule relies on and the ones it leaves for later rules:
    #: the registry runs every writer of a fact before its readers (rules/order.py).
    READS: ClassVar[frozenset[Fact]] = frozenset()
    WRITES: ClassVar[frozenset[Fact]] = frozenset()

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        Codemod.__init__(self, context)
        cst.CSTTransformer.__init__(self)
        FileReader.__init__(self, state)
        self._words: Optional[frozenset[str]] = None  # set while statements are being skipped
        self._also: Optional[frozenset[str]] = None
        self._original: AbstractSet[int] = NOTHING
        self._skip_new: set[int] = set()
        self._changed: list[bool] = []
        self._path: list[cst.CSTNode] = []  # the nodes being visited, outermost first
        self._passive_types = _passive(type(self))
        self._entered_types = _entered(type(self))
        self._untouched_types = self._passive_types | (NODE_TYPES - self._entered_types)

    # -- what the rule looks at ------------------------------------------------------------
    def interest(self) -> Optional[Iterable[str]]:
        """Words a statement must spell for this rule to act in it; None: every statement.
        By default the file's Apex words (imports, holders, handles, wrapped optimizers)."""
        return self.state.apex_words

    #: Whether the rule acts only on lines that also spell an Apex word (as `amp.state_dict()`
    #: does, unlike `model.state_dict()`).
    APEX_ON_THE_LINE: ClassVar[bool] = False

    #: The node types a rule's own `visit_node` / `leave_node` acts on, besides its
    #: `visit_<Type>` / `leave_<Type>` handlers (None: any type).
    ACTS_ON: ClassVar[Optional[tuple[type, ...]]] = None

    #: Whether `parent()` must answer for nodes anywhere in the file, not only in the statements
    #: the rule visits (a rule that follows a binding's reads to the calls around them).
    PARENTS_EVERYWHERE: ClassVar[bool] = False

    def also_spells(self) -> Optional[Iterable[str]]:
        """A second set of words the same line must spell too (None: no such condition)."""
        return self.state.apex_words if self.APEX_ON_THE_LINE else None

    def scope_questions(self) -> Optional[tuple[Iterable[str], Iterable[str]]]:
        """`(asked, names)` when the rule asks ScopeProvider (or QualifiedNameProvider) only
        about nodes on lines that spell one of `asked`, and only what names in `names` are
        bound to (None: anything). Scope analysis then reads only those lines' statements and
        the statements that bind one of `names` or declare it global, with the compound
        statements around them: every scope, binding and `global` that decides such a
        question is there, in the same order (reads of a name do not change what it is bound
        to elsewhere). A rule that asks which reads a binding has (`assignment.references`)
        needs every statement that spells the name: it puts the name among `asked` too."""
        return None

    # -- running ---------------------------------------------------------------------------
    # A rule is a plain CSTTransformer (no rule uses matcher decorators, so nothing needs
    # MatcherDecoratableTransformer's per-node bookkeeping), visited by libcst as
    # `tree.visit(rule)`. Statements outside the rule's interest and layout nodes it has no
    # handler for are not entered, and a node whose subtree the rule left alone is returned
    # as the very node it got, so that statements keep their identity (and their place in the
    # SourceIndex) from rule to rule.
    def on_visit(self, node: cst.CSTNode) -> bool:
        kind = type(node)
        if kind in self._passive_types or id(node) in self._skip:
            return False
        if kind not in self._entered_types:  # nothing below can change: not entered, not rebuilt
            self._seen_parents[node] = self._path[-1] if self._path else None
            return False
        if (
            self._words is not None
            and type(node) is cst.SimpleStatementLine
            and id(node) not in self._original
            and not cast(SourceIndex, self.state.index).spells_in(
                node, self._words, self._also
            )  # set with _words
        ):
            self._skip_new.add(id(node))  # a line an earlier rule wrote, nothing for this rule
            return False
        self._seen_parents[node] = self._path[-1] if self._path else None
        self._path.append(node)
        self._changed.append(False)
        return self.visit_node(node)

    def on_leave(self, original_node, updated_node):
        if (
            type(original_node) in self._untouched_types
            or id(original_node) in self._skip
            or id(original_node) in self._skip_new
        ):
            return original_node
        self._path.pop()
        children_changed = self._changed.pop()
        result = self.leave_node(original_node, updated_node)
        if result is updated_node and not children_changed:
            return original_node
        if self._changed:
            self._changed[-1] = True
        if self.state.index is not None:
            self.state.index.inherit(original_node, result)
        return result

    def visit_node(self, node: cst.CSTNode) -> bool:
        """CSTTransformer.on_visit, with the `visit_<Type>` lookup cached per class."""
        func = _handler(type(self), "visit_", type(node))
        return func is None or func(self, node) is not False

    def leave_node(self, original_node, updated_node):
        func = _handler(type(self), "leave_", type(original_node))
        return updated_node if func is None else func(self, original_node, updated_node)

    # No rule has `visit_<Type>_<attribute>` handlers (tests/codemod/test_rule_classes.py).
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    @classmethod
    def applies(cls, state: FileState, context: CodemodContext) -> bool:
        """Cheap test, before the rule is even built, of whether it can find anything to do
        (on the file as given: rules only ever remove Apex text)."""
        return not cls.MARKERS or any(marker in state.original for marker in cls.MARKERS)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # Every rule gets a tree no one else holds (the parse, or the previous rule's output),
        # so the defensive deep copy libcst's MetadataWrapper makes by default would only cost
        # time, and unchanged statements keep their identity.
        with metadata_without_copy(self, tree) as module:
            return self.transform_module_impl(module)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self.bind(tree)
        words, also = self.interest(), self.also_spells()
        self._skip = self._parent_skip = self.state.skipping(words, also)
        if self.PARENTS_EVERYWHERE:
            self._parent_skip = NOTHING
        if self._skip and self.state.index is not None and words is not None:  # words: what skips
            self._words = frozenset(words)
            self._also = frozenset(also) if also is not None else None
            self._original = self.state.index.original_ids
        return tree.visit(self)

    def enter_also(self, *statements: cst.CSTNode) -> None:
        """Visit these statements of the tree being read, though they spell none of the rule's
        words: a rule that moves a statement acts where it moves it to. Called before the
        traversal reaches them (from `visit_Module`)."""
        self._skip = frozenset(self._skip) - {id(s) for s in statements}

    def get_metadata(self, key, node, default=_UNDEFINED):
        if (
            key is QualifiedNameProvider
            and key not in self.metadata
            and isinstance(default, (set, frozenset))
            and not default
        ):
            # What QualifiedNameProvider's value for `node` is (scope.get_qualified_names_for,
            # or nothing where no scope is recorded), without its pass over every node.
            scope = self.get_metadata(ScopeProvider, node, None)
            return scope.get_qualified_names_for(node) if scope else default
        if key is ScopeProvider and key not in self.metadata and self.state.index is not None:
            questions = self.scope_questions()
            if questions is not None:
                skip = self.state.index.skipped_for_scopes(*questions)
                pruned = statements_spelling(self.context.wrapper.module, skip)
                self.metadata = {
                    **self.metadata,
                    key: FastMetadataWrapper(pruned, unsafe_skip_copy=True).resolve(key),
                }
        if key not in self.metadata:
            if key not in self.LAZY_METADATA and key not in self.get_inherited_dependencies():
                raise KeyError(f"{key.__name__} is not available to {type(self).__name__}")
            self.metadata = {**self.metadata, key: self.context.wrapper.resolve(key)}
        value = self.metadata[key][node] if default is _UNDEFINED else self.metadata[key].get(node, default)
        # QualifiedNameProvider, alone among libcst's providers, stores a callable that computes
        # the set on first use; libcst's own get_metadata calls it the same way.
        return value() if key is QualifiedNameProvider and callable(value) else value


_HANDLERS: dict[tuple[type, str, type], object] = {}

#: Whitespace, comments and punctuation: nodes that hold no code.
_LAYOUT = (
    cst.BaseParenthesizableWhitespace,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Dot,
    cst.Comma,
    cst.AssignEqual,
    cst.Colon,
    cst.Semicolon,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
    cst.BaseAugOp,
    cst.ImportStar,
)
_LAYOUT_TYPES = frozenset(c for c in vars(cst).values() if isinstance(c, type) and issubclass(c, _LAYOUT))
_PASSIVE: dict[type, frozenset[type]] = {}


def _passive(cls: type) -> frozenset[type]:
    """The layout node types a rule class has no handler for: a rule visit neither enters
    nor rebuilds them (nothing in them can change, and no rule asks for their parents)."""
    try:
        return _PASSIVE[cls]
    except KeyError:
        out = _PASSIVE[cls] = frozenset(
            t
            for t in _LAYOUT_TYPES
            if _handler(cls, "visit_", t) is None and _handler(cls, "leave_", t) is None
        )
        return out


_ENTERED: dict[type, frozenset[type]] = {}


def _entered(cls: "type[Rule]") -> frozenset[type]:
    """The node types a visit of the rule class enters: those whose subtree can hold a node it
    has a handler for (or, for a rule with its own `visit_node` or `leave_node`, one of the
    types it names in `ACTS_ON`; every type when it names none). A node of any other type
    has its parent recorded but is neither entered nor rebuilt: nothing below it can change."""
    try:
        return _ENTERED[cls]
    except KeyError:
        generic = cls.visit_node is not Rule.visit_node or cls.leave_node is not Rule.leave_node
        if generic and cls.ACTS_ON is None:
            out = NODE_TYPES
        else:
            handled = {
                t
                for t in NODE_TYPES
                if _handler(cls, "visit_", t) is not None or _handler(cls, "leave_", t) is not None
            }
            out = holders_of(frozenset(handled | concrete(cls.ACTS_ON or ())))
        _ENTERED[cls] = out
        return out


def _handler(cls: type, prefix: str, node_type: type):
    key = (cls, prefix, node_type)
    try:
        return _HANDLERS[key]
    except KeyError:
        found = getattr(cls, prefix + node_type.__name__, None)
        if found is not None and getattr(found, "__module__", "").startswith("libcst"):
            found = None  # libcst's typed no-op stubs
        _HANDLERS[key] = found
        return found


def add_requested_imports(
    context: CodemodContext, tree: cst.Module, index: Optional[SourceIndex] = None
) -> cst.Module:
    """Add the plain `import X` lines rules asked for (through AddImportsVisitor's context
    key) where AddImportsVisitor puts them: after the docstring and the leading imports, with
    a blank line before what follows. A module that a top-level `import` anywhere already
    binds to its name is not imported again: `import torch` after a `sys.path.insert(...)`
    (AddImportsVisitor looks only at the leading block) or `import torch.distributed`, which
    binds `torch` too. Done here, not by AddImportsVisitor, because that one walks the whole
    file for a one-line change."""
    requested = context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
    context.scratch[AddImportsVisitor.CONTEXT_KEY] = []
    if not requested:
        return tree
    if any(item.obj_name is not None or item.alias is not None or item.relative for item in requested):
        context.scratch[AddImportsVisitor.CONTEXT_KEY] = requested
        tree = AddImportsVisitor(context).transform_module(tree)
        context.scratch[AddImportsVisitor.CONTEXT_KEY] = []
        return tree
    imported = [
        alias
        for stmt in tree.body
        if isinstance(stmt, cst.SimpleStatementLine)
        for small in stmt.body
        if isinstance(small, cst.Import)
        for alias in small.names
    ]
    missing = sorted(
        name
        for name in {item.module_name for item in requested}
        if not any(_binds(a, name) for a in imported)
    )
    if not missing:
        return tree
    at = _leading_block_end(tree)
    body = list(tree.body)
    new = [cst.parse_statement(f"import {name}", config=tree.config_for_parsing) for name in missing]
    if at < len(body):
        following = body[at]
        lines = following.leading_lines
        if not lines or lines[0].comment is not None:
            moved = following.with_changes(leading_lines=(cst.EmptyLine(), *lines))
            if index is not None:
                index.inherit(following, moved)
            body[at] = moved
    return tree.with_changes(body=body[:at] + new + body[at:])


def _binds(alias: cst.ImportAlias, module: str) -> bool:
    """After `import <alias>`, the name `module`'s first part is bound to it and `module` is
    loaded: `import torch.distributed` binds `torch` (and loads `torch`), while `import
    torch.distributed as dist` binds only `dist`."""
    full = alias.evaluated_name
    if alias.asname is not None:
        return alias.evaluated_alias == module == full
    return full == module or full.startswith(module + ".")


def _leading_block_end(tree: cst.Module) -> int:
    """Index of the first statement after the docstring and the leading imports."""
    body = tree.body
    first = m.SimpleStatementLine(
        body=[m.Expr(m.SimpleString()) | m.Assign(targets=[m.AssignTarget(m.Name("__strict__"))])]
    )
    i = 1 if body and m.matches(body[0], first) else 0
    while i < len(body) and m.matches(body[i], m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
        i += 1
    return i


class TrainingRule(Rule):
    """A rule that carries out the plan; it has nothing to do in a file without one."""

    def __init__(self, context, state) -> None:
        super().__init__(context, state)
        self.plan: Optional[TrainingPlan] = state.training

    @classmethod
    def applies(cls, state, context) -> bool:
        return state.training is not None and super().applies(state, context)


class ApexClassRule(Rule):
    """A rule that rewrites calls of some Apex callables and judges their bare references."""

    #: Apex qualified names this rule is about.
    HANDLED: frozenset = frozenset()
    ACTS_ON = (cst.Name, cst.Attribute)  # bare references, judged and replaced in visit_node/leave_node

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        super().__init__(context, state)
        self.replacements: dict[int, str] = {}  # id(original node) -> torch name

    def interest(self):
        return self.words_for(*self.HANDLED)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def handled_name(self, node: cst.CSTNode) -> Optional[str]:
        name = self.apex_name(node)
        return name if name in self.HANDLED else None

    def direct(self, node: cst.CSTNode) -> bool:
        """`node` names the Apex object through an import. The binder also resolves
        `self.<attr>` when every assignment to it is Apex-valued, but it cannot tell a held
        class (`self.norm_cls = FusedLayerNorm`) from a held instance
        (`self.norm = FusedLayerNorm(d)`); the assignment is judged instead, where the class is
        named directly."""
        assert self.apex is not None
        return self.apex.imported_name(node) is not None

    def use_torch(self) -> None:
        AddImportsVisitor.add_needed_import(self.context, "torch")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = self.handled_name(original_node.func)
        if name is None or not self.direct(original_node.func):
            return updated_node
        replaced = self.rewrite_call(original_node, updated_node, name)
        if replaced is not updated_node:
            self.use_torch()
        return replaced

    def visit_node(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = self.handled_name(node)
            if name is not None and self.direct(node):
                parent = self.parent(node)
                if not (isinstance(parent, cst.Call) and parent.func is node):
                    self.bare_reference(node, name)
                return False
        return super().visit_node(node)

    def leave_node(self, original_node, updated_node):
        replacement = self.replacements.get(id(original_node))
        if replacement is not None:
            if replacement.split(".")[0] == "torch":
                self.use_torch()
            return dotted(replacement)
        return super().leave_node(original_node, updated_node)

    def reference_context(self, node: cst.CSTNode) -> str:
        """'check' for isinstance/issubclass arguments and class bases, else 'value'."""
        parent = self.parent(node)
        while isinstance(parent, (cst.Element, cst.Tuple)):
            parent = self.parent(parent)
        if isinstance(parent, cst.Arg):
            owner = self.parent(parent)
            if isinstance(owner, cst.ClassDef):
                return "check"
            if isinstance(owner, cst.Call) and m.matches(
                owner.func, m.Name("isinstance") | m.Name("issubclass")
            ):
                return "check"
        return "value"

    # -- what subclasses implement ---------------------------------------------------------
    def rewrite_call(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        raise NotImplementedError

    def bare_reference(self, node: cst.CSTNode, name: str) -> None:
        raise NotImplementedError
