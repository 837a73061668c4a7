"""Where each statement of a file sits, and which words each line spells.

A libcst transform rebuilds every node it visits, so a rule that walks a whole 2,000-line
file to rewrite three statements pays for 2,000 lines. Python's own parser (in C, a tenth of
libcst's cost) gives every statement's line span; pairing its statements with libcst's gives
each libcst statement a span too, and a rule then visits only the statements whose lines spell
a word it acts on (an Apex name, an optimizer the plan steps). The rest keep their identity
through every rule, which `Rule` relies on.

The index is a conservative filter: words are matched in the raw text (comments and strings
included), line by line as the parser numbers lines (`lines.split_lines`: a form feed or U+2028
in a comment starts no line), so it can only visit too much, never too little, for a rule
whose work is keyed to the words it declares. `AMP_MIGRATE_NO_PRUNE=1` turns it off (the tests compare both ways).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Literal, Optional, Protocol, Sequence, Union, cast

import libcst as cst

from ..io.lines import split_lines

_WORD = re.compile(r"\w+")

_COMPOUND: dict[type[cst.CSTNode], Union[type[ast.stmt], tuple[type[ast.stmt], ...]]] = {
    cst.If: ast.If,
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: ast.While,
    cst.With: (ast.With, ast.AsyncWith),
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: ast.ClassDef,
    cst.Try: ast.Try,
    cst.Match: ast.Match,
}
if hasattr(cst, "TryStar") and hasattr(ast, "TryStar"):
    _COMPOUND[cst.TryStar] = ast.TryStar

#: Python's compound statements with a `body` (all but `match`), and its loops.
_AstBlock = Union[
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Try,
]
_AstLoop = Union[ast.For, ast.AsyncFor, ast.While]


class _Unpaired(Exception):
    """libcst's and Python's statement lists disagree; the file is not pruned."""


@dataclass
class Statement:
    node: cst.CSTNode  # a SimpleStatementLine or a compound statement
    start: int  # first line (decorators included), 1-based
    end: int  # last line
    children: list["Statement"] = field(default_factory=list)
    #: A compound statement's header parts (decorators, parameters, the `if` test, the `for`
    #: target and iterable, the `with` items): skipped on their own when their lines spell
    #: nothing a rule acts on while the body does.
    header: list[cst.CSTNode] = field(default_factory=list)


def _header_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(node, cst.FunctionDef):
        return [*node.decorators, node.name, node.params] + ([node.returns] if node.returns else [])
    if isinstance(node, cst.ClassDef):
        return [*node.decorators, node.name, *node.bases, *node.keywords]
    if isinstance(node, (cst.If, cst.While)):
        return [node.test]
    if isinstance(node, cst.For):
        return [node.target, node.iter]
    if isinstance(node, cst.With):
        return list(node.items)
    return []


def pruning_enabled() -> bool:
    return os.environ.get("AMP_MIGRATE_NO_PRUNE", "") in ("", "0")


class SourceIndex:
    """The statements of one parsed file with their lines, and the words of every line."""

    def __init__(self, text: str, module: cst.Module, tree: ast.Module) -> None:
        self.module = module  # holds every indexed node alive, so their ids stay unique
        self.tree = tree
        self._line_words = [frozenset(_WORD.findall(line)) for line in split_lines(text)]
        self._places: dict[int, tuple[int, int]] = {}
        self._spans: dict[int, tuple[int, int]] = {}  # compound statements of the file as given
        self._ast: dict[int, ast.stmt] = {}  # and what Python's parser made of them
        self._kept: list[cst.CSTNode] = []  # statements that took over a place (their ids stay unique)
        try:
            self.statements: Optional[list[Statement]] = self._pair(module.body, tree.body)
        except _Unpaired:
            self.statements = None
        self._identifiers: Optional[frozenset[str]] = None
        self._words: Optional[frozenset[str]] = None
        self._new_lines: dict[int, list[frozenset[str]]] = {}
        self._skipped: dict[tuple, frozenset[int]] = {}
        self._by_word: Optional[dict[str, list[int]]] = None
        self._qualifying: dict[str, Optional[frozenset[str]]] = {}
        self._facts_cache: Optional[_Facts] = None
        self._flat_cache: Optional[list] = None
        self._imports: Optional[list] = None
        self.original_ids = frozenset(self._places)

    # -- pairing ---------------------------------------------------------------------------
    def _pair(self, nodes: Sequence[cst.CSTNode], stmts: Sequence[ast.stmt]) -> list[Statement]:
        out: list[Statement] = []
        i = 0
        for node in nodes:
            if isinstance(node, cst.SimpleStatementLine):
                count = len(node.body)
                group = stmts[i : i + count]
                if len(group) != count:
                    raise _Unpaired
                i += count
                entry = Statement(node, group[0].lineno, max(s.end_lineno or s.lineno for s in group))
                self._places[id(node)] = (group[0].lineno, group[0].col_offset)
            else:
                if i >= len(stmts):
                    raise _Unpaired
                stmt = stmts[i]
                i += 1
                expected = _COMPOUND.get(type(node))
                if expected is None or not isinstance(stmt, expected):
                    raise _Unpaired
                start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])
                entry = Statement(
                    node,
                    start,
                    stmt.end_lineno or stmt.lineno,
                    self._pair_children(node, stmt),
                    _header_nodes(node),
                )
                self._places[id(node)] = (stmt.lineno, stmt.col_offset)
                self._spans[id(node)] = (entry.start, entry.end)
                self._ast[id(node)] = stmt
            out.append(entry)
        if i != len(stmts):
            raise _Unpaired
        return out

    def _block(self, suite: cst.BaseSuite, stmts: Sequence[ast.stmt]) -> list[Statement]:
        if isinstance(suite, cst.IndentedBlock):
            return self._pair(suite.body, stmts)
        return []  # `if x: y` on one line: the compound statement is the unit

    def _pair_children(self, node: cst.CSTNode, stmt: ast.stmt) -> list[Statement]:
        # `_pair` checked that `stmt` is the `_COMPOUND` counterpart of `node`'s type, which
        # the casts below state (a `try*` has a `try`'s fields on both sides).
        if isinstance(node, cst.Match):
            match = cast(ast.Match, stmt)
            if len(node.cases) != len(match.cases):
                raise _Unpaired
            children: list[Statement] = []
            for case, ast_case in zip(node.cases, match.cases):
                children += self._block(case.body, ast_case.body)
            return children
        children = self._block(cast(cst.BaseCompoundStatement, node).body, cast(_AstBlock, stmt).body)
        if isinstance(node, cst.If):
            if_stmt = cast(ast.If, stmt)
            if isinstance(node.orelse, cst.If):
                children += self._pair([node.orelse], if_stmt.orelse)
            elif isinstance(node.orelse, cst.Else):
                children += self._block(node.orelse.body, if_stmt.orelse)
        elif isinstance(node, (cst.For, cst.While)) and node.orelse is not None:
            children += self._block(node.orelse.body, cast(_AstLoop, stmt).orelse)
        elif isinstance(node, cst.Try) or type(node).__name__ == "TryStar":
            try_node, try_stmt = cast(cst.Try, node), cast(ast.Try, stmt)
            if len(try_node.handlers) != len(try_stmt.handlers):
                raise _Unpaired
            for handler, ast_handler in zip(try_node.handlers, try_stmt.handlers):
                children += self._block(handler.body, ast_handler.body)
            if try_node.orelse is not None:
                children += self._block(try_node.orelse.body, try_stmt.orelse)
            if try_node.finalbody is not None:
                children += self._block(try_node.finalbody.body, try_stmt.finalbody)
        return children

    # -- queries ---------------------------------------------------------------------------
    def place_of(self, node: cst.CSTNode) -> Optional[tuple[int, int]]:
        """Line (1-based) and column (0-based) where a statement of the file as given starts
        (after its decorators), or where the statement it replaced started."""
        return self._places.get(id(node))

    def inherit(self, old: cst.CSTNode, new: object) -> None:
        """A rule replaced statement `old`: what took its place is reported at its line."""
        place = self._places.get(id(old))
        if place is None:
            return
        nodes = list(new.nodes) if isinstance(new, cst.FlattenSentinel) else [new]
        for node in nodes:
            if (
                isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
                and id(node) not in self._places
            ):
                self._places[id(node)] = place
                self._kept.append(node)

    def skipped(self, words: Optional[Iterable[str]], also: Optional[Iterable[str]] = None) -> frozenset[int]:
        """Ids of the statements none of whose lines spells one of `words` (and, if given,
        one of `also` on the same line), at every depth (a rule may have rebuilt the statement
        around one). None: every statement matters."""
        if words is None or self.statements is None or not pruning_enabled():
            return frozenset()
        wanted = frozenset(words)
        second = frozenset(also) if also is not None else None
        key = (wanted, second)
        if key not in self._skipped:
            self._skipped[key] = self._skip_ids(wanted, second)
        return self._skipped[key]

    def _lines_with(self, words: frozenset[str]) -> set[int]:
        if self._by_word is None:
            self._by_word = {}
            for number, line in enumerate(self._line_words, 1):
                for word in line:
                    self._by_word.setdefault(word, []).append(number)
        out: set[int] = set()
        for word in words:
            out.update(self._by_word.get(word, ()))
        return out

    def _skip_ids(self, wanted: frozenset[str], second: Optional[frozenset[str]]) -> frozenset[int]:
        hits = self._lines_with(wanted)
        if second is not None:
            hits &= self._lines_with(second)
        return self._skip_lines(hits)

    def skipped_for_scopes(self, asked: Iterable[str], bound: Iterable[str]) -> frozenset[int]:
        """Ids of the statements that neither spell one of `asked` on a line nor bind one of
        `bound` (nor declare it `global` or `nonlocal`) on a line; nothing when pruning is off."""
        if self.statements is None or not pruning_enabled():
            return frozenset()
        return self._skip_lines(self._lines_with(frozenset(asked)) | self._binding_lines(frozenset(bound)))

    def _binding_lines(self, names: frozenset[str]) -> set[int]:
        facts = self._facts()
        lines: set[int] = set()
        for _module, _level, aliases, first, last in facts.imports:
            if any((asname or name.split(".")[0]) in names for name, asname in aliases):
                lines.update(range(first, last + 1))
        for name in names & facts.bound.keys():
            lines.update(facts.bound[name])
        return lines

    def bound_names(self) -> frozenset[str]:
        """Every name the file binds, in any scope: assigned or deleted, a parameter, an
        import's name (`import a.b` binds `a`), a function or class, `except ... as`, a
        match capture (not a `global` declaration by itself)."""
        return frozenset(self._facts().assigned)

    def _facts(self) -> "_Facts":
        if self._facts_cache is None:
            self._facts_cache = _Facts(self.tree)
        return self._facts_cache

    def _skip_lines(self, hits: set[int]) -> frozenset[int]:
        flags = [0] * (len(self._line_words) + 1)
        for number in hits:
            if number < len(flags):
                flags[number] = 1
        marks = list(itertools.accumulate(flags))
        out: list[int] = []
        append, extend = out.append, out.extend
        for before, end, node_id, header_end, header_ids in self._flat():
            first = marks[before]
            if marks[end] == first:
                append(node_id)
            elif header_end is not None and marks[header_end] == first:
                extend(header_ids)
        return frozenset(out)

    def _flat(self) -> list[tuple[int, int, int, Optional[int], list[int]]]:
        """Every statement at every depth: the line before its first, its last line, its id,
        and the last line and ids of its header parts (when it has a body and a header of its
        own lines); lines past the file's end read as its last."""
        if self._flat_cache is None:
            self._flat_cache = []
            last = len(self._line_words)
            stack = list(self.statements or ())
            while stack:
                entry = stack.pop()
                header_end = entry.children[0].start - 1 if entry.children and entry.header else None
                if header_end is not None and header_end < entry.start:
                    header_end = None
                self._flat_cache.append(
                    (
                        min(entry.start, last + 1) - 1,
                        min(entry.end, last),
                        id(entry.node),
                        None if header_end is None else min(header_end, last),
                        [id(part) for part in entry.header],
                    )
                )
                stack.extend(entry.children)
        return self._flat_cache

    def spells_in(
        self, node: cst.SimpleStatementLine, words: frozenset[str], also: Optional[frozenset[str]]
    ) -> bool:
        """Whether a line of a statement a rule wrote spells one of `words` (and of `also`)."""
        lines = self._new_lines.get(id(node))
        if lines is None:
            code = cst.Module([]).code_for_node(node)
            lines = self._new_lines[id(node)] = [frozenset(_WORD.findall(text)) for text in split_lines(code)]
            self._kept.append(node)
        return any(line & words and (also is None or line & also) for line in lines)

    def may_spell(self, node: cst.CSTNode, word: str) -> bool:
        """False when `node` is a compound statement of the file as given none of whose lines
        spells `word`; True otherwise (it may)."""
        span = self._spans.get(id(node))
        if span is None:
            return True
        return any(word in line for line in self._line_words[span[0] - 1 : span[1]])

    def ast_of(self, node: cst.CSTNode) -> Optional[ast.stmt]:
        """Python's parse of a compound statement of the file as given."""
        return self._ast.get(id(node))

    def spells(self, word: str) -> bool:
        """Whether the text has `word` anywhere (code, comment or string)."""
        if self._words is None:
            self._words = frozenset().union(*self._line_words)
        return word in self._words

    @property
    def identifiers(self) -> frozenset[str]:
        """Every identifier the code spells outside strings and comments."""
        if self._identifiers is None:
            self._identifiers = frozenset(_identifiers(self.tree))
        return self._identifiers

    def qualifying(self, part: str, first: Optional[str] = None) -> Optional[frozenset[str]]:
        """What a name must spell for one of its qualified names (libcst's
        `QualifiedNameProvider`) to have `part` as a dotted component: `part` itself, or a
        name that an import with `part` in its module or imported name binds (an import's
        text, a local's function or class prefix or the name's own spelling are the only
        sources of a qualified name's parts). None, every name may, when a function or
        class is named `part`, or pruning is off. `first`: only qualified names that start with
        it are asked about; when no function or class is named `first` either, a local's
        prefix (which starts with a function or class name) cannot be one of them."""
        anchored = first is not None and self.root_words(first) is not None
        key = ("anchored " if anchored else "") + part
        if key not in self._qualifying:
            self._qualifying[key] = self._qualifying_words(part, anchored) if pruning_enabled() else None
        return self._qualifying[key]

    def _qualifying_words(self, part: str, anchored: bool) -> Optional[frozenset[str]]:
        facts = self._facts()
        if part in facts.defined and not anchored:
            return None
        words = {part}
        for module, _level, aliases, _first, _last in facts.imports:
            for name, asname in aliases:
                if part in (module or "").split(".") or part in name.split("."):
                    words.add(asname or name.split(".")[0])
        return frozenset(words)

    def root_words(self, first: str) -> Optional[frozenset[str]]:
        """The names a dotted name must start with for one of its qualified names to start
        with `first`: `first` itself, or a name an import of `first` or of a module under it
        binds. None, every name may, when a function or class is named `first` (a local's
        qualified name starts with the names of the functions and classes around it), or
        pruning is off."""
        key = "^" + first
        if key not in self._qualifying:
            self._qualifying[key] = self._root_words(first) if pruning_enabled() else None
        return self._qualifying[key]

    def _root_words(self, first: str) -> Optional[frozenset[str]]:
        facts = self._facts()
        if first in facts.defined:
            return None
        words = {first}
        for module, level, aliases, _, _ in facts.imports:
            if module is None:  # `import a.b as c`
                words.update(asname or first for name, asname in aliases if name.split(".")[0] == first)
            elif not level and module.split(".")[0] == first:
                words.update(asname or name for name, asname in aliases)
        return frozenset(words)

    def imports(self) -> Iterator[ast.Import | ast.ImportFrom]:
        """Every import statement, at any depth."""
        if self._imports is None:
            self._imports = list(self.imports_of(self.tree))
        return iter(self._imports)

    @staticmethod
    def imports_of(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
        stack: list[ast.AST] = list(tree.body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                stack.extend(getattr(node, name, ()) or ())


_BINDS_ITS_NAME = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.ExceptHandler,
    ast.MatchAs,
    ast.MatchStar,
)
_BindsItsName = Union[
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler, ast.MatchAs, ast.MatchStar
]


class _Located(Protocol):
    """A node with a place (a statement, an expression, an argument, a pattern)."""

    lineno: int
    end_lineno: Optional[int]


#: Each node type's fields but `ctx`, or False for a type that is no node (a str, None).
_AST_FIELDS: dict[type, Union[tuple[str, ...], Literal[False]]] = {}


def walk_ast(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node under `tree`, as `ast.walk` gives them but in no set order and without
    the `Load`/`Store`/`Del` context markers (a third of the nodes): three times faster, for
    passes that collect sets and read a name's `ctx` from the name itself."""
    stack: list = [tree]
    pop, push, extend, fields = stack.pop, stack.append, stack.extend, _AST_FIELDS
    while stack:
        node = pop()
        names = fields.get(type(node))
        if names is None:
            kind = type(node)
            names = fields[kind] = (
                tuple(f for f in kind._fields if f != "ctx") if issubclass(kind, ast.AST) else False
            )
        if names is False:
            continue  # a str in `global a, b`, a None key of a `{**d}` dict
        yield node
        for name in names:
            value = getattr(node, name, None)
            if type(value) is list:
                extend(value)
            elif isinstance(value, ast.AST):
                push(value)


class _Facts:
    """One walk over Python's parse: the names functions and classes take, every import
    (module, or None for `import x`; level; (name, asname) pairs; its lines), and the lines
    where each name is bound otherwise (assigned, deleted, a parameter, `global`, `except ...
    as`, a match capture, a type parameter)."""

    def __init__(self, tree: ast.Module) -> None:
        self.defined: set[str] = set()
        self.imports: list[tuple[Optional[str], int, list[tuple[str, Optional[str]]], int, int]] = []
        self.bound: dict[str, set[int]] = {}
        self.assigned: set[str] = set()
        # Dispatched on the exact type (`walk_ast` is the hot loop); the casts state what each
        # test proved.
        for node in walk_ast(tree):
            kind = type(node)
            names: list[str]
            if kind is ast.Name:
                name_node = cast(ast.Name, node)
                if isinstance(name_node.ctx, ast.Load):
                    continue
                names = [name_node.id]
                self.assigned.add(name_node.id)
            elif kind in _IMPORTS:
                self._import(cast(Union[ast.Import, ast.ImportFrom], node))
                continue
            elif kind is ast.alias:
                alias = cast(ast.alias, node)
                self.assigned.add(alias.asname or alias.name.split(".")[0])
                continue
            elif kind is ast.Global or kind is ast.Nonlocal:
                names = cast(Union[ast.Global, ast.Nonlocal], node).names
            elif kind is ast.arg:
                arg = cast(ast.arg, node)
                names = [arg.arg]
                self.assigned.add(arg.arg)
            elif kind in _NAMED:  # functions, classes, `except ... as`, match captures, type parameters
                names = [
                    getattr(node, f) for f in ("name", "rest") if isinstance(getattr(node, f, None), str)
                ]
                if kind in _DEFINES:
                    self.defined.add(
                        cast(Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef], node).name
                    )
                if kind in _BINDS_ITS_NAME:
                    bound_name = cast(_BindsItsName, node).name
                    if bound_name:
                        self.assigned.add(bound_name)
            else:
                continue
            located = cast(_Located, node)
            for name in names:
                self.bound.setdefault(name, set()).update(
                    range(located.lineno, (located.end_lineno or located.lineno) + 1)
                )

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        module = (node.module or "") if isinstance(node, ast.ImportFrom) else None
        self.imports.append(
            (
                module,
                getattr(node, "level", 0) or 0,
                [(a.name, a.asname) for a in node.names],
                node.lineno,
                node.end_lineno or node.lineno,
            )
        )


_IMPORTS = (ast.Import, ast.ImportFrom)
_DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: Node types with a `name` or `rest` field (a string where the node binds it), but `alias`.
_NAMED = tuple(
    kind
    for kind in vars(ast).values()
    if isinstance(kind, type)
    and issubclass(kind, ast.AST)
    and kind is not ast.alias
    and {"name", "rest"} & set(getattr(kind, "_fields", ()))
)


def _identifiers(tree: ast.AST) -> Iterator[str]:
    for node in walk_ast(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.arg
        elif isinstance(node, ast.alias):
            yield from node.name.split(".")
            if node.asname:
                yield node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from node.module.split(".")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            yield from node.names
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            yield node.name
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node.rest
