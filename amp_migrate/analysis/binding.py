"""Which expressions mean an Apex object, whatever the file calls it.

Names are resolved with libcst's `QualifiedNameProvider`, so `from apex import amp as A`,
`import apex` + `apex.amp.initialize`, imports inside functions or under `if`/`try` all give
`apex.amp.initialize`, while a local variable that happens to be called `amp` gives nothing.
Two bindings that scope analysis cannot see are added where the file proves them:
attributes that only ever hold an Apex object (`self.amp = amp`), and handles returned by the
old `amp.init()` API.

Scope analysis is the codemod's largest cost, and most files do not need it: when no name an
Apex import binds is bound any other way anywhere in the file (no `amp = ...`, no parameter or
loop variable called `amp`; `amp = None` in an import guard excepted), every read of that name
means the import, and a table from the import statements answers exactly what
`QualifiedNameProvider` would. Files that do rebind such a name get a flow analysis of those
names (`reaching.py`): a read is the Apex object only where every binding that can reach it is
the Apex import (or the `amp = None` guard); reads that other bindings reach too are reported
by the rule that checks them (`rules/rebinding.py`) and send the file to the shim.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, ClassVar, Iterable, Optional, TypeVar, cast

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedName, QualifiedNameProvider

from .apex_names import APEX, is_apex_name
from .carriers import Carriers, find_carriers
from .cst_nodes import children

if TYPE_CHECKING:
    from .reaching import Binding, Reaching

HANDLE = "apex.amp.AmpHandle"  # what `amp.init()` returns
WRAPPED = "apex.amp.OptimWrapper"  # what `handle.wrap_optimizer(opt)` returns

GetMetadata = Callable[..., object]

_T = TypeVar("_T")


_GUARD_VALUES = ("None", "False", "True")


NOTHING: frozenset[int] = frozenset()


class Pruned:
    """A read-only visitor (`visit_<Type>` handlers; returning False skips the children) that
    does not enter the statements whose ids it is given (see SourceIndex)."""

    def __init__(self, skip: AbstractSet[int] = NOTHING, parents: Optional[dict] = None) -> None:
        self.skip = skip
        self.parents = parents  # filled with the parent of every node entered, if given

    #: Called on every node before its `visit_<Type>` handler (False skips the children).
    visit_node: ClassVar[Optional[Callable[[Any, cst.CSTNode], Optional[bool]]]] = None

    def walk(self, tree: cst.CSTNode) -> None:
        stack: list[tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(tree, None)]
        skip, parents, cls = self.skip, self.parents, type(self)
        every = cls.visit_node
        handlers = _handlers(cls)
        while stack:
            node, parent = stack.pop()
            if id(node) in skip:
                continue
            if parents is not None:
                parents[node] = parent
            if every is not None and every(self, node) is False:
                continue
            kind = type(node)
            func = handlers[kind] if kind in handlers else _visit_handler(cls, kind)
            if func is not None and func(self, node) is False:
                continue
            stack.extend((child, node) for child in reversed(children(node)))


def _handlers(cls: type) -> dict[type, Any]:
    """The class's `visit_<Type>` handler by node type, filled as types are met. The table
    lives on the class, not in a module-level dict: the walkers that functions define per call
    (`find`'s) hold what they found, and a global table keyed by class would keep every one of
    them, and the trees they point into, for the process's life."""
    table = cls.__dict__.get("_visit_table")
    if table is None:
        table = {}
        cls._visit_table = table  # type: ignore[attr-defined]  # set on any walker class, on first use
    return table


def _visit_handler(cls: type, node_type: type):
    table = _handlers(cls)
    if node_type not in table:
        table[node_type] = getattr(cls, "visit_" + node_type.__name__, None)
    return table[node_type]


def find(
    tree: cst.CSTNode, matcher, skip: AbstractSet[int] = NOTHING, parents: Optional[dict] = None
) -> list[cst.CSTNode]:
    """`m.findall` that does not enter the skipped statements; `parents`, if given, gets
    the parent of every node the search entered."""
    found: list[cst.CSTNode] = []
    named = getattr(cst, type(matcher).__name__, None)  # m.Call matches cst.Call only
    node_type: type[cst.CSTNode] = (
        named if isinstance(named, type) and issubclass(named, cst.CSTNode) else cst.CSTNode
    )

    class _Find(Pruned):
        def visit_node(self, node: cst.CSTNode) -> None:
            if isinstance(node, node_type) and m.matches(node, matcher):
                found.append(node)

    _Find(skip, parents).walk(tree)
    return found


DEPRECATED_AMP_MODULES = ("torch.cuda.amp", "torch.cpu.amp")


def _apex_or_deprecated(module: str) -> bool:
    return is_apex_name(module) or module.startswith(DEPRECATED_AMP_MODULES)


def imports_apex(node: ast.Import | ast.ImportFrom) -> bool:
    """Whether an import statement imports Apex or torch's deprecated amp."""
    if isinstance(node, ast.Import):
        return any(_apex_or_deprecated(a.name) for a in node.names)
    module = node.module or ""
    return not node.level and (
        _apex_or_deprecated(module)
        or (module in ("torch.cuda", "torch.cpu") and any(a.name in ("amp", "*") for a in node.names))
    )


#: Apex modules whose `import *` binds a known set of names (the rules that handle those
#: names register them). A star import of any other Apex module binds unknown names.
STAR_EXPORTS: dict[str, frozenset[str]] = {}


def apex_import_words(imports: Iterable[ast.Import | ast.ImportFrom]) -> Optional[frozenset[str]]:
    """The words a statement must spell to touch Apex or torch's deprecated amp: the names
    their imports bind, `apex` and `amp`. None when a star import makes that unknowable."""
    words = {APEX, "amp"}
    for node in imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _apex_or_deprecated(alias.name):
                    words.add(alias.asname or alias.name.split(".")[0])
            continue
        module = node.module or ""
        if node.level or not (_apex_or_deprecated(module) or module in ("torch.cuda", "torch.cpu")):
            continue
        for alias in node.names:
            if alias.name == "*":
                if module not in STAR_EXPORTS:
                    return None
                words |= STAR_EXPORTS[module]
            else:
                words.add(alias.asname or alias.name)
    return frozenset(words)


class _Bindings(Pruned):
    """One pass: what Apex imports bind, and every other name binding in the file."""

    def __init__(self, skip: AbstractSet[int] = NOTHING) -> None:
        super().__init__(skip)
        self.apex: dict[str, set[str]] = {}
        self.other: set[str] = set()
        self.assigns: list[cst.Assign] = []
        self.star = False  # a star import of an Apex module binds names nobody knows
        self.star_names: set[str] = set()  # what the known ones bind
        self._guards: set[int] = set()

    def _bind(self, target: cst.CSTNode) -> None:
        for name in m.findall(target, m.Name()) if not isinstance(target, cst.Name) else [target]:
            self.other.add(cast(cst.Name, name).value)  # what `m.Name()` found

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            full = _dotted(alias.name)
            bound = (
                alias.asname.name.value
                if alias.asname and isinstance(alias.asname.name, cst.Name)
                else full.split(".")[0]
            )
            if is_apex_name(full):
                self.apex.setdefault(bound, set()).add(full if alias.asname else APEX)
            else:
                self.other.add(bound)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        module = _dotted(node.module) if node.module is not None and not node.relative else ""
        if isinstance(node.names, cst.ImportStar):
            if module in STAR_EXPORTS:
                self.star_names |= STAR_EXPORTS[module]
            else:
                self.star = self.star or is_apex_name(module)
            return False
        for alias in node.names:
            name = _dotted(alias.name)
            bound = (
                alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            )
            if is_apex_name(module):
                self.apex.setdefault(bound, set()).add(f"{module}.{name}")
            else:
                self.other.add(bound)
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assigns.append(node)
        if id(node) in self._guards:
            return
        for t in node.targets:
            self._bind(_bound_part(t.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(_bound_part(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(_bound_part(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(_bound_part(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(_bound_part(node.target))

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(_bound_part(node.asname.name))

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind(node.name.name)
        # `except ImportError: amp = None`: the import guard binds no other object (reads
        # elsewhere that only `amp = None` reaches are told apart by the flow analysis).
        for statement in node.body.body:
            for small in (
                getattr(statement, "body", ()) if isinstance(statement, cst.SimpleStatementLine) else ()
            ):
                if (
                    isinstance(small, cst.Assign)
                    and isinstance(small.value, cst.Name)
                    and small.value.value in _GUARD_VALUES
                    and all(isinstance(t.target, cst.Name) for t in small.targets)
                ):
                    self._guards.add(id(small))

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(_bound_part(node.target))  # `del amp` unbinds: reads after it fail

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.other.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.other.add(node.name.value)

    def visit_Param(self, node: cst.Param) -> None:
        self.other.add(node.name.value)

    def visit_Global(self, node: cst.Global) -> None:
        self.other.update(n.name.value for n in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.other.update(n.name.value for n in node.names)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        if node.name is not None:
            self.other.add(node.name.value)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        if node.name is not None:
            self.other.add(node.name.value)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        if node.rest is not None:
            self.other.add(node.rest.value)


def _dotted(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).replace(" ", "")


def _bound_part(target: cst.CSTNode) -> cst.CSTNode:
    """The names an assignment target binds: `a`, `a, b`; not `x.attr` or `x[i]`."""
    if isinstance(target, (cst.Attribute, cst.Subscript)):
        return cst.Tuple([])
    if isinstance(target, (cst.Tuple, cst.List)):
        # An expression's bound part is an expression (an empty tuple, or itself).
        return cst.Tuple(
            [cst.Element(cast(cst.BaseExpression, _bound_part(e.value))) for e in target.elements]
        )
    if isinstance(target, cst.StarredElement):
        return _bound_part(target.value)
    return target


class _NotReads(Pruned):
    """Name nodes that read nothing: attribute names, keywords, import aliases, plain targets."""

    def __init__(self, skip: AbstractSet[int] = NOTHING) -> None:
        super().__init__(skip)
        self.ids: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.ids.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.ids.add(id(node.keyword))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        self.ids.update(id(n) for n in m.findall(node, m.Name()))
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None:
            self.ids.update(id(n) for n in m.findall(node.module, m.Name()))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if isinstance(node.target, cst.Name):
            self.ids.add(id(node.target))


def is_read(name: cst.Name, parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]]) -> Optional[bool]:
    """Whether `name` reads a variable (not an attribute name, a keyword, an import's name or
    a plain assignment target); None when its parent is not known."""
    owner = parent(name)
    if owner is None:
        return None
    if (
        isinstance(owner, cst.Attribute)
        and owner.attr is name
        or isinstance(owner, cst.Arg)
        and owner.keyword is name
        or isinstance(owner, cst.AssignTarget)
        and owner.target is name
    ):
        return False
    if isinstance(owner, cst.AsName):  # `import apex as A`, `with f() as A`: binds
        return False
    while isinstance(owner, cst.Attribute):  # `import apex.amp`, `from apex.amp import x`
        owner = parent(owner)
        if owner is None:
            return None
    return not isinstance(owner, (cst.ImportAlias, cst.ImportFrom))


def read_names(tree: cst.CSTNode, skip: AbstractSet[int] = NOTHING) -> set[str]:
    """The names read outside import statements and the skipped statements."""
    found: set[str] = set()
    parents: dict[cst.CSTNode, Optional[cst.CSTNode]] = {}

    class _Reads(Pruned):
        def visit_Import(self, node: cst.Import) -> bool:
            return False

        def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
            return False

        def visit_Name(self, node: cst.Name) -> None:
            if is_read(node, parents.get) is not False:
                found.add(node.value)

    _Reads(skip, parents).walk(tree)
    return found


def not_reads(tree: cst.CSTNode, skip: AbstractSet[int] = NOTHING) -> set[int]:
    """Ids of the Name nodes that read nothing (attribute names, keywords, import aliases,
    plain assignment targets), outside the skipped statements."""
    collect = _NotReads(skip)
    collect.walk(tree)
    return collect.ids


def plain_apex_bindings(module: cst.Module, skip: AbstractSet[int] = NOTHING) -> Optional[dict[str, str]]:
    """Local name → Apex name when the imports alone decide what every read means, else None.
    `skip`: statements that spell no Apex word (they can neither import nor rebind one)."""
    seen = _Bindings(skip)
    seen.walk(module)
    return _table(seen)


def _table(seen: _Bindings) -> Optional[dict[str, str]]:
    if (
        seen.star
        or any(len(v) > 1 for v in seen.apex.values())
        or set(seen.apex) & (seen.other | seen.star_names)
    ):
        return None
    return {name: next(iter(values)) for name, values in seen.apex.items()}


CARRIED = "apex.amp"  # what a parameter that receives Apex's module holds


def _carriers_of(
    module: cst.Module, seeds: Optional[dict[str, str]], parsed: Optional[tuple[str, ast.Module]] = None
) -> Optional[Carriers]:
    """The proven flow of Apex's module as a value (only for files that bind an Apex name
    otherwise too: a parameter `amp`, `amp = None`). `parsed`: the module's text and Python's
    parse of it, where the caller has them (rendering and parsing again costs a parse)."""
    if parsed is not None:
        return find_carriers(parsed[1], parsed[0], seeds)
    source = module.code
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return find_carriers(tree, source, seeds)


def _unsubscripted(node: cst.CSTNode) -> cst.CSTNode:
    """`x[i][j]` → `x`: an attribute of an item has the container's name with the attribute, as
    QualifiedNameProvider says (`amp._amp_state.loss_scalers[0].loss_scale` is
    `apex.amp._amp_state.loss_scalers.loss_scale`)."""
    while isinstance(node, cst.Subscript):
        node = node.value
    return node


class ApexBinder:
    """Answers "which Apex name is this expression?" for one module."""

    def __init__(
        self,
        module: cst.Module,
        get_metadata: GetMetadata,
        known: Optional["ApexBinder"] = None,
        skipping: Callable[[Optional[Iterable[str]]], AbstractSet[int]] = lambda words: NOTHING,
        words: Optional[Iterable[str]] = None,
        parent: Callable[[cst.CSTNode], Optional[cst.CSTNode]] = lambda node: None,
        seeds: Optional[dict[str, str]] = None,
        parsed: Optional[tuple[str, ast.Module]] = None,
    ) -> None:
        """`known`: the binder of the file as first read. Rules delete the assignments that
        proved a holder or a handle, so later rules keep the original file's facts.
        `skipping(words)`: the statements that spell none of `words`, which the binder's
        passes need not enter; `words`: the file's Apex words (`apex_import_words`; None:
        unknown, every statement is read). `parent`: a node's parent where the caller knows it,
        which tells whether a name is a read without a pass over the file. `seeds`: function ->
        parameter of this module that other modules of a project pass Apex's module to.
        `parsed`: `module`'s own text and Python's parse of it, where the caller has them."""
        self._get = get_metadata
        self._parent = parent
        self._module = module
        self._skipping = skipping
        self._skip = skipping(words)
        self._not_reads: Optional[set[int]] = None
        #: What was worked out about a tree, for the next rule's binder: a rule that changes
        #: nothing hands the very same tree on. {kind: (tree, value)}
        self._per_tree: dict[tuple, tuple[cst.Module, object]] = {}
        self.holders: dict[str, str] = {}  # self.<attr> -> apex name
        self.handles: set[str] = set()  # local names bound to amp.init()
        self.wrapped: set[str] = set()  # names bound to handle.wrap_optimizer(...)
        if known is not None:
            self._take_over(known)
        else:
            self._first_read(module, words, seeds, parsed)

    #: Apex name of each name an Apex import binds, where no name is bound otherwise too
    #: (None: the flow of bindings decides, `reaching()`).
    table: Optional[dict[str, str]]
    #: Names an Apex import binds; where one is bound otherwise too, the flow of its
    #: bindings decides what each read means.
    imported: frozenset[str]
    _stars: bool  # a star import of Apex
    #: Names the file binds other than by an Apex import (only those that spell an
    #: Apex word are known: the others do not matter).
    bound_elsewhere: frozenset[str]
    #: Apex's module handed around as a value (`train(model, optimizer, amp)`), where
    #: that flow is proven: the parameters that receive it read as the module.
    carriers: Optional[Carriers]

    def _take_over(self, known: "ApexBinder") -> None:
        """The facts of the file as first read, from the binder that read it."""
        self.table = known.table
        self.holders, self.handles, self.wrapped = known.holders, known.handles, known.wrapped
        self.bound_elsewhere = known.bound_elsewhere
        self.imported, self._stars = known.imported, known._stars
        self._per_tree = known._per_tree
        self.carriers = known.carriers

    def _first_read(
        self,
        module: cst.Module,
        words: Optional[Iterable[str]],
        seeds: Optional[dict[str, str]],
        parsed: Optional[tuple[str, ast.Module]],
    ) -> None:
        seen = _Bindings(self._skip)
        seen.walk(module)
        self.table = _table(seen)
        self.imported = frozenset(seen.apex)
        self._stars = seen.star or bool(seen.star_names)
        self.bound_elsewhere = frozenset(seen.other)
        self.carriers = (
            _carriers_of(module, seeds, parsed)
            if seeds
            or set(seen.apex) & seen.other
            or any(isinstance(a.value, cst.Name) and a.value.value in seen.apex for a in seen.assigns)
            else None
        )
        if self.carriers is not None and self.carriers.refusal is None and self.carriers.slots:
            self.table = None
            self.imported = self.imported | {s.param for s in self.carriers.slots.values()}
        self._scan(module, words, seen.assigns)

    def imported_name(self, node: cst.CSTNode) -> Optional[str]:
        """The Apex name `node` reaches through an import alone (not through `self.` holders)."""
        return self._direct(node)

    def _direct(self, node: cst.CSTNode, read: Optional[bool] = None) -> Optional[str]:
        """`read`: `node` is known to be read (an assigned value)."""
        if self.table is not None:
            return self._plain(node, read)
        base = node
        while isinstance(base, (cst.Attribute, cst.Call, cst.Subscript)):
            base = base.func if isinstance(base, cst.Call) else base.value
        if isinstance(base, cst.Name) and base.value in self.imported:
            return self._flowing(node)
        if not self._stars:  # only an import (tracked above) or a star import binds Apex names
            return None
        names = cast(AbstractSet[QualifiedName], self._get(QualifiedNameProvider, node, set()))
        apex = sorted(q.name for q in names if is_apex_name(q.name))
        return apex[0] if apex else None

    _reaching: Optional[Reaching] = None

    def reaching(self) -> Reaching:
        """The bindings that reach each read of the names Apex imports bind (computed once per
        tree, only for files that rebind one of them)."""
        if self._reaching is None:
            from .reaching import Reaching  # it reads trees with this module's helpers

            skip = self._skipping(self.imported)
            self._reaching = self._of_tree(
                ("reaching", skip), lambda: Reaching(self._module, self.imported, skip)
            )
        return self._reaching

    def _of_tree(self, kind: tuple, compute: Callable[[], _T]) -> _T:
        """`compute()` for this binder's tree, or what an earlier binder computed for the
        same tree (`kind` names the question and what it depends on besides the tree)."""
        known = self._per_tree.get(kind)
        if known is not None and known[0] is self._module:
            return cast(_T, known[1])  # what `compute` of the same `kind` gave
        value = compute()
        self._per_tree[kind] = (self._module, value)
        return value

    def _flowing(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Name):
            reaching = self.reaching().reads.get(node)
            apex = sorted({a for a in map(self._apex_of, reaching or ()) if a is not None})
            # A read that something else can reach too is reported (rules/rebinding.py) and
            # the file falls back; answering Apex keeps the other rules' view as it was.
            return apex[0] if apex else None
        if isinstance(node, cst.Attribute):
            base = self._flowing(_unsubscripted(node.value))
            return f"{base}.{node.attr.value}" if base is not None else None
        if isinstance(node, cst.Call):
            return self._flowing(node.func)
        return None

    def ambiguous_reads(self) -> list[tuple[cst.Name, list[Binding], list[Binding]]]:
        """Reads that an Apex import reaches and so does another binding (or another Apex
        import of a different object): (the read, the Apex bindings, the others). The
        `amp = None` of an import guard is no other object: nothing would call it."""
        if self.table is not None:
            return []
        out = []
        for read, reaching in self.reaching().reads.items():
            apex = [b for b in reaching if self._apex_of(b) is not None]
            other = [b for b in reaching if self._apex_of(b) is None and not b.harmless]
            if apex and (other or len({self._apex_of(b) for b in apex}) > 1):
                out.append((read, apex, other))
        return out

    def _apex_of(self, binding: Binding) -> Optional[str]:
        """What a binding binds of Apex: an import's object, or Apex's module for a parameter
        that receives it (`carriers`)."""
        if binding.apex is not None or not isinstance(binding.node, cst.Param):
            return binding.apex
        return CARRIED if id(binding.node) in self._carrier_params() else None

    def _carrier_params(self) -> frozenset[int]:
        slots = self.carriers.slots if self.carriers is not None and self.carriers.refusal is None else {}
        if not slots:
            return frozenset()

        def compute() -> frozenset[int]:
            found = set()
            for statement in self._module.body:
                if not isinstance(statement, cst.FunctionDef):
                    continue
                slot = slots.get(statement.name.value)
                if slot is None:
                    continue
                params = statement.params
                for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                    if param.name.value == slot.param:
                        found.add(id(param))
            return frozenset(found)

        return self._of_tree(("carrier_params",), compute)

    def import_is_read(self, alias: cst.ImportAlias) -> Optional[bool]:
        """Whether some read can see the binding this import alias makes (None: not known,
        the alias binds no name the flow analysis follows)."""
        binding = self.reaching().bindings.get(alias) if self.imported else None
        if binding is None:
            return None
        return any(binding in reaching for reaching in self.reaching().reads.values())

    def _plain(self, node: cst.CSTNode, read: Optional[bool] = None) -> Optional[str]:
        """`read`: known to be a read (the base of an attribute or call rules asked about;
        rules never ask about names inside import statements)."""
        if isinstance(node, cst.Name):
            table = self.table
            assert table is not None, "_direct asks _plain only where the file has a table"
            if node.value not in table:
                return None
            # Like QualifiedNameProvider: only reads have a name.
            if read is None:
                read = is_read(node, self._parent)
            if read is None:
                if self._not_reads is None:
                    self._not_reads = self._of_tree(
                        ("not_reads", self._skip), lambda: not_reads(self._module, self._skip)
                    )
                read = id(node) not in self._not_reads
            return table[node.value] if read else None
        if isinstance(node, cst.Attribute):
            base = self._plain(_unsubscripted(node.value), True)
            return f"{base}.{node.attr.value}" if base is not None else None
        if isinstance(node, cst.Call):
            return self._plain(node.func, True)
        return None

    def _scan(self, module: cst.Module, words: Optional[Iterable[str]], first: list[cst.Assign]) -> None:
        # Statements that spell an Apex word name the candidates; every assignment to a
        # candidate attribute or a handle spells its name, so a second pass sees them all.
        more: set[str] = set()
        for a in first:
            if isinstance(a.value, cst.Call):
                if self._direct(a.value.func) != "apex.amp.init":
                    continue  # an instance (`FusedAdam(...)`): no holder, no handle
            elif self._direct(a.value, read=True) is None:
                continue  # not an Apex object
            for t in a.targets:
                if isinstance(t.target, cst.Attribute) and m.matches(t.target.value, m.Name("self")):
                    more.add(t.target.attr.value)
                elif isinstance(t.target, cst.Name):
                    more.add(t.target.value)
        assigns = (
            cast(list[cst.Assign], find(module, m.Assign(), self._skipping(set(words) | more)))
            if more and words is not None
            else first
        )
        candidates: dict[str, set] = {}
        wraps = []  # `x = h.wrap_optimizer(opt)`: judged once every handle is known
        wrap_call = m.Call(func=m.Attribute(attr=m.Name("wrap_optimizer")))
        for assign in assigns:
            if m.matches(assign.value, wrap_call):
                wraps.append(assign)
            if isinstance(assign.value, cst.Call) and self._direct(assign.value.func) == "apex.amp.init":
                if len(assign.targets) == 1:
                    target = assign.targets[0].target
                    if isinstance(target, cst.Name):
                        self.handles.add(target.value)
                    elif isinstance(target, cst.Attribute) and m.matches(target.value, m.Name("self")):
                        candidates.setdefault(target.attr.value, set()).add(HANDLE)
                continue
            # `self.norm = FusedLayerNorm(d)` holds an instance, not the Apex object itself.
            value_name = None if isinstance(assign.value, cst.Call) else self._direct(assign.value, read=True)
            for t in assign.targets:
                if isinstance(t.target, cst.Attribute) and m.matches(t.target.value, m.Name("self")):
                    candidates.setdefault(t.target.attr.value, set()).add(value_name)
        for assign in wraps:
            wrap = cast(cst.Attribute, cast(cst.Call, assign.value).func)  # what `wrap_call` matched
            if self._bound(wrap.value) == HANDLE and len(assign.targets) == 1:
                self.wrapped.add(cst.Module([]).code_for_node(assign.targets[0].target))
        for attr, values in candidates.items():
            if len(values) == 1 and None not in values:
                self.holders[attr] = values.pop()

    def name_of(self, node: cst.CSTNode) -> Optional[str]:
        """The Apex qualified name `node` evaluates to, or None if it is not an Apex object."""
        direct = self._direct(node)
        if direct is not None:
            return direct
        return self._bound(node)

    def _bound(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Call):
            return self._bound(node.func)
        if isinstance(node, cst.Name) and node.value in self.handles:
            return HANDLE
        if isinstance(node, cst.Attribute):
            # Only `scale_loss` is the wrapper's own; `step`, `zero_grad`, ... are forwarded to
            # the optimizer it wraps, which stays.
            if node.attr.value == "scale_loss" and cst.Module([]).code_for_node(node.value) in self.wrapped:
                return f"{WRAPPED}.scale_loss"
            if m.matches(node.value, m.Name("self")) and node.attr.value in self.holders:
                return self.holders[node.attr.value]
            base = self._bound(node.value)
            if base is not None:
                return f"{base}.{node.attr.value}"
        return None

    def words(self) -> set[str]:
        """Names beyond the imports that can reach Apex here: holders, handles, wrappers."""
        out = set(self.holders) | set(self.handles)
        out.update(w.rsplit(".", 1)[-1] for w in self.wrapped)
        if self.carriers is not None and self.carriers.refusal is None:
            out |= self.carriers.names()
        return out

    def is_(self, node: cst.CSTNode, *names: str) -> bool:
        return self.name_of(node) in names
