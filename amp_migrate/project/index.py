"""The project index: what each module of a tree does with Apex, read with Python's `ast`.

Apex's `amp` is one process-wide state: `amp.initialize` in one module sets up what
`amp.scale_loss`, `amp.master_params` and `amp.state_dict` in another read, and an
`FP16_Optimizer` built in a script is stepped through `optimizer.backward(loss)` in the
trainer it is handed to. Migrating those files one at a time cannot see that; this pass
records, per module, where Apex state is set up ("owner" sites), where it is used ("use"
sites, whether or not the module imports Apex itself), and which modules of the tree import
which, so that `groups.py` can say which files must share a target.

The pass is cheap on purpose: a text test picks candidate files, only those are parsed (by
Python's parser, about a tenth of libcst's cost), and every other file gives its import lines
to a regular expression. No scope analysis: names are matched the way they are spelled after
the module's own imports, which errs towards grouping more files, never fewer.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Protocol, TypeGuard

from .. import deep_stack
from ..analysis.ast_names import dotted_chain

# A file that does not spell `apex` can still receive Apex's objects: it is worth parsing only
# if it spells an amp-state call on a handed-in `amp` or an FP16_Optimizer method (`in` tests
# run at C speed; a regular expression with these alternatives costs more than the parse).
_HANDED_WORDS = (
    "scale_loss",
    "master_params",
    "master_grads",
    "_amp_state",
    "amp.state_dict",
    "amp.load_state_dict",
    "amp.initialize",
)
_BACKWARD_WITH_ARGUMENT = re.compile(r"\.backward\(\s*[A-Za-z_]")
_RECEIVER = re.compile(r"(\w+)\s*$")


def is_candidate(text: str) -> bool:
    """Whether the file's text could give a fact."""
    if "apex" in text or any(word in text for word in _HANDED_WORDS):
        return True
    if ".backward(" not in text:
        return False
    for match in _BACKWARD_WITH_ARGUMENT.finditer(text):
        receiver = _RECEIVER.search(text, max(0, match.start() - 60), match.start())
        if receiver and _optimizer_like(receiver.group(1)):
            return True
    return False


_MAIN_GUARD = re.compile(r"^if[ \t(]+__name__[ \t]*==[ \t]*['\"]__main__['\"]", re.M)
_IMPORT_TEXT = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]+))", re.M
)

AMP_STATE = ("scale_loss", "master_params", "state_dict", "load_state_dict", "_amp_state")
SHIM = "amp_shim"
STATEFUL = ("apex", "apex.amp", "apex.fp16_utils")
FP16_METHODS = ("backward", "clip_master_grads", "update_master_grads")


@dataclass(frozen=True)
class Site:
    """One place in a module: `what` is how a person would name it (`amp.scale_loss`)."""

    line: int
    col: int
    what: str
    function: str = "<module>"


@dataclass(frozen=True)
class Import:
    """`import a.b` (names empty) or `from a.b import c` (level > 0 for relative imports)."""

    module: str
    names: tuple[str, ...] = ()
    level: int = 0


@dataclass
class ModuleFacts:
    path: str  # relative to the tree, "/"-separated
    name: str  # dotted, from the tree's layout
    parsed: bool = False
    script: bool = False  # runs as a program: `if __name__ == "__main__":` at module level
    imports: list[Import] = field(default_factory=list)
    apex_imports: list[Site] = field(default_factory=list)
    initialize: list[Site] = field(default_factory=list)  # what: "model, opt = amp.initialize"
    fp16_optimizers: list[Site] = field(default_factory=list)
    providers: list[Site] = field(default_factory=list)  # what: the function returning Apex
    dynamic: list[Site] = field(default_factory=list)  # what: the module `import_module` names
    provided: list[Site] = field(default_factory=list)  # `amp = get_amp(...)`; what: "mod.func"
    uses: list[Site] = field(default_factory=list)  # amp state read or FP16_Optimizer stepped
    foreign: list[Site] = field(default_factory=list)  # uses on objects this module did not import

    @property
    def owns(self) -> list[Site]:
        """Sites that set Apex state up or hand Apex's module out."""
        return self.initialize + self.fp16_optimizers + self.providers + self.dynamic_state

    @property
    def dynamic_state(self) -> list[Site]:
        """Run-time imports of the Apex modules that hold state (`apex`, `apex.amp`,
        `apex.fp16_utils`); `apex.optimizers` and the like hold none."""
        return [s for s in self.dynamic if s.what in STATEFUL]

    @property
    def touches(self) -> bool:
        return bool(self.owns or self.uses or self.foreign or self.provided)


def module_name(path: str) -> str:
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _apex_module(text: object) -> TypeGuard[str]:
    return isinstance(text, str) and (text == "apex" or text.startswith("apex."))


def _migrated(text: object) -> bool:
    """The shim a previous run put in Apex's place: nothing left to tie."""
    return isinstance(text, str) and (text == SHIM or text.startswith(SHIM + "."))


def _dynamic_import(call: ast.Call) -> Optional[str]:
    """The Apex module `importlib.import_module("apex.amp")` / `__import__("apex")` names."""
    func = dotted_chain(call.func)
    if func is None or func.rsplit(".", 1)[-1] not in ("import_module", "__import__"):
        return None
    if call.args and isinstance(call.args[0], ast.Constant) and _apex_module(call.args[0].value):
        return call.args[0].value
    return None


def _amp_like(receiver: str) -> bool:
    """A receiver spelled like Apex's module handed around: `amp`, `self.amp`, `args.apex_amp`."""
    last = receiver.rsplit(".", 1)[-1]
    return last == "amp" or (last.endswith("_amp") and not last.startswith("use"))


def _optimizer_like(receiver: str) -> bool:
    last = receiver.rsplit(".", 1)[-1].lower()
    return "optim" in last or last in ("opt", "fp16_opt")


# Lines worth a look: a statement that spells none of these words gives no fact.
_HIT_TEXT = re.compile(
    r"\b(?:import|initialize|scale_loss|master_params|state_dict|load_state_dict|_amp_state"
    r"|FP16_Optimizer|backward|clip_master_grads|update_master_grads|import_module|__import__)\b"
    r"|\breturn[ \t]+\w+[ \t]*(?:#|$)",
    re.M,
)
_BODIES = ("body", "orelse", "finalbody")


def hit_lines(text: str, pattern: re.Pattern = _HIT_TEXT) -> list[int]:
    """The (sorted, 1-based) lines on which `pattern` matches."""
    found: list[int] = []
    line, pos = 1, 0
    for match in pattern.finditer(text):
        line += text.count("\n", pos, match.start())
        pos = match.start()
        if not found or found[-1] != line:
            found.append(line)
    return found


def _spans(node: ast.stmt, hits: list[int]) -> bool:
    i = bisect.bisect_left(hits, node.lineno)
    return i < len(hits) and hits[i] <= (node.end_lineno or node.lineno)


def _units(body: list, hits: list[int], stack: tuple[str, ...]) -> Iterator[tuple[ast.AST, tuple[str, ...]]]:
    """The parts of the statements in `body` that hold a hit line, with their enclosing
    function and class names: simple statements whole, compound ones as their header parts
    (a `with` item, an `if` test, a decorator) and, recursively, their blocks."""
    for stmt in body:
        if not _spans(stmt, hits):
            continue
        if not any(hasattr(stmt, name) for name in _BODIES):
            yield stmt, stack
            continue
        inner = (
            (*stack, stmt.name)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            else stack
        )
        for name, value in ast.iter_fields(stmt):
            if name in _BODIES:
                yield from _units(value, hits, inner)
            elif name in ("handlers", "cases"):
                for part in value:
                    yield from _units(part.body, hits, inner)
                    yield from ((n, stack) for n in ast.iter_child_nodes(part) if not isinstance(n, ast.stmt))
            elif isinstance(value, ast.AST):
                yield value, stack
            elif isinstance(value, list):
                yield from ((v, stack) for v in value if isinstance(v, ast.AST))


@dataclass(frozen=True)
class CallAssignment:
    """`key = callee(...)`: resolved against the tree's providers once every module is read."""

    site: Site  # what: the callee as spelled
    key: str  # the target as spelled (`amp`, `self.amp`)


def _bindings(nodes: Iterable[ast.AST]) -> dict[str, str]:
    """Every name an Apex import (or `x = importlib.import_module("apex...")`) binds, to the
    Apex name it means."""
    bound: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _apex_module(alias.name) or _migrated(alias.name):
                    root = alias.name.split(".")[0]
                    bound[alias.asname or root] = alias.name if alias.asname else root
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (_apex_module(node.module) or _migrated(node.module))
        ):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            dynamic = _dynamic_import(node.value)
            if dynamic:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = dynamic
    return bound


class Located(Protocol):
    """A node with a position: a statement, an expression, an alias, an argument."""

    lineno: int
    col_offset: int


def column(lines: list[str], node: Located) -> int:
    """The 1-based column of a node in characters (the parser counts UTF-8 bytes)."""
    line = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
    if line.isascii():
        return node.col_offset + 1
    return len(line.encode("utf-8")[: node.col_offset].decode("utf-8", "replace")) + 1


class _Reader:
    """Fills a module's facts from the parts of its tree that hold a hit line."""

    def __init__(
        self, facts: ModuleFacts, tree: ast.Module, text: str, provided: Mapping[str, str] = {}
    ) -> None:
        self.facts = facts
        self.lines = text.split("\n")
        hits = hit_lines(text)
        self.nodes = [(node, stack) for unit, stack in _units(tree.body, hits, ()) for node in ast.walk(unit)]
        # local name -> the Apex name it means
        self.bound = {**provided, **_bindings(node for node, _ in self.nodes)}
        self.handled: set[int] = set()

    def read(self) -> "_Reader":
        for node, stack in self.nodes:
            self.stack = stack
            kind = type(node).__name__
            handler = getattr(self, f"visit_{kind}", None)
            if handler is not None:
                handler(node)
        return self

    def _site(self, node: Located, what: str) -> Site:
        return Site(node.lineno, column(self.lines, node), what, ".".join(self.stack) or "<module>")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.facts.imports.append(Import(alias.name))
            if _apex_module(alias.name):
                self.facts.apex_imports.append(self._site(node, f"import {alias.name}"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self.facts.imports.append(Import(module, tuple(a.name for a in node.names), node.level))
        if not node.level and _apex_module(module):
            names = ", ".join(a.name for a in node.names)
            self.facts.apex_imports.append(self._site(node, f"from {module} import {names}"))

    def qualify(self, dotted: str) -> str:
        root, _, rest = dotted.partition(".")
        if root in self.bound:
            return self.bound[root] + ("." + rest if rest else "")
        return dotted

    def visit_Assign(self, node: ast.Assign) -> None:
        callee = dotted_chain(node.value.func) if isinstance(node.value, ast.Call) else None
        if callee and self._is_initialize(callee):
            targets = " = ".join(ast.unparse(t) for t in node.targets)
            self.facts.initialize.append(self._site(node, f"{targets} = {callee}"))
            self.handled.add(id(node.value))

    def _is_initialize(self, callee: str) -> bool:
        receiver, _, attr = callee.rpartition(".")
        if attr != "initialize" or not receiver:
            return False
        qualified = self.qualify(receiver)
        if _migrated(qualified):
            return False
        return (_apex_module(qualified) and qualified.endswith("amp")) or _amp_like(receiver)

    def visit_Call(self, node: ast.Call) -> None:
        dynamic = _dynamic_import(node)
        if dynamic:
            self.facts.dynamic.append(self._site(node, dynamic))
            return
        callee = dotted_chain(node.func)
        if callee is None or id(node) in self.handled:
            return
        qualified = self.qualify(callee)
        if _migrated(qualified):
            return
        receiver, _, attr = callee.rpartition(".")
        if self._is_initialize(callee):
            self.facts.initialize.append(self._site(node, callee))
        elif _apex_module(qualified) and qualified.endswith("FP16_Optimizer"):
            self.facts.fp16_optimizers.append(self._site(node, callee))
        elif receiver and attr in AMP_STATE:
            self._amp_state(node, callee, receiver, attr)
        elif receiver and attr in FP16_METHODS:
            if attr != "backward" or (node.args and _optimizer_like(receiver)):
                self.facts.foreign.append(self._site(node, f"{callee}(...) (FP16_Optimizer)"))

    def _amp_state(self, node: ast.Call, callee: str, receiver: str, attr: str) -> None:
        qualified = self.qualify(receiver)
        if _apex_module(qualified):
            self.facts.uses.append(self._site(node, callee))
        elif _amp_like(receiver) or attr in ("scale_loss", "master_params"):
            self.facts.foreign.append(self._site(node, callee))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "_amp_state":
            self.facts.uses.append(self._site(node, dotted_chain(node) or "_amp_state"))

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        returned = None
        if isinstance(value, ast.Name) and _apex_module(self.bound.get(value.id)):
            returned = self.bound[value.id]
        elif isinstance(value, ast.Call):
            returned = _dynamic_import(value)
        if returned and self.stack:
            self.facts.providers.append(self._site(node, self.stack[-1]))


def _text_imports(text: str) -> list[Import]:
    """Import statements read from the text of a file that is not parsed (over-reading one in
    a string only adds an edge)."""
    found = []
    for match in _IMPORT_TEXT.finditer(text):
        if match.group(3) is not None:
            for part in match.group(3).split(","):
                name = part.split(" as ")[0].strip()
                if re.fullmatch(r"[\w.]+", name):
                    found.append(Import(name))
            continue
        dots_module = match.group(1)
        module = dots_module.lstrip(".")
        names = [n.split(" as ")[0].strip() for n in match.group(2).strip("()").split(",")]
        found.append(
            Import(
                module, tuple(n for n in names if re.fullmatch(r"\w+|\*", n)), len(dots_module) - len(module)
            )
        )
    return found


def _parse(text: str) -> Optional[ast.Module]:
    return _parse_or_why(text)[0]


def _parse_or_why(text: str) -> tuple[Optional[ast.Module], bool]:
    """Python's parse, or None and whether the text is beyond what Python runs (nested past
    its limits: amp_migrate/deep_stack.py) rather than syntax it cannot read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text), False
    except (SyntaxError, RecursionError, MemoryError) as exc:
        if not deep_stack.beyond_python(exc) and not isinstance(exc, SyntaxError):
            raise
        return None, deep_stack.beyond_python(exc)
    except ValueError:
        return None, False


def _read(facts: ModuleFacts, tree: ast.Module, text: str, provided: Mapping[str, str] = {}) -> bool:
    """Fill `facts` from the tree; False, with the facts as they were, where the nesting is
    too deep even for the deep stack (the file is then read as one that does not parse)."""

    def read() -> ModuleFacts:
        fresh = ModuleFacts(facts.path, facts.name, provided=list(facts.provided))
        _Reader(fresh, tree, text, provided).read()
        return fresh

    try:
        found = deep_stack.call(read)
    except deep_stack.TooDeep:
        return False
    facts.__dict__.update(found.__dict__)
    return True


@dataclass(frozen=True)
class Spelling:
    """How one module can import another as a module object: `import {module}` (relative 0),
    or `from {"." * relative}{module} import {obj}`."""

    module: str
    obj: Optional[str] = None
    relative: int = 0


@dataclass
class ProjectIndex:
    """Facts per module (keyed by path relative to the tree) and the tree's import edges."""

    modules: dict[str, ModuleFacts]
    edges: dict[str, set[str]]  # importer -> the tree's modules it imports
    resolver: Optional["_Resolver"] = None

    def facts(self, path: str) -> ModuleFacts:
        return self.modules[path]

    def reaches(self, start: str, goal: str) -> bool:
        """Whether importing `start` imports `goal` (through any chain of the tree's imports)."""
        seen, todo = {start}, [start]
        while todo:
            for nxt in self.edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    def imported(self, path: str) -> bool:
        """Whether some module of the tree imports `path` (else it runs only as a program)."""
        return any(path in targets for targets in self.edges.values())

    def spelling(self, importer: str, target: str) -> Optional[Spelling]:
        """How `importer` can import `target` as a module object: the way it already spells an
        import of it, else an absolute import another module spells that resolves the same
        from `importer`; None when the tree shows no such spelling."""
        if self.resolver is None:
            return None
        for imp in self.modules[importer].imports:
            found = _spelled(self.resolver, importer, imp, target)
            if found is not None:
                return found
        for path in sorted(self.modules):
            for imp in self.modules[path].imports if path != importer else ():
                found = _spelled(self.resolver, path, imp, target) if not imp.level else None
                if found is not None and self.resolver.lookup(importer, found.module) == [target]:
                    return found
        return self._inside_package(self.resolver, importer, target)

    def one_name(self, target: str) -> bool:
        """Whether every import of `target` in the tree names one module object: its absolute
        spellings agree, and beside relative imports (made inside its package) the absolute one
        names the package too. A file on `sys.path` twice (`import optimization` and
        `from pkg import optimization`) is two modules, each with its own globals."""
        absolute, relative = set(), False
        for path, facts in self.modules.items():
            for imp in facts.imports:
                found = _spelled(self.resolver, path, imp, target) if self.resolver else None
                if found is not None and found.relative:
                    relative = True
                elif found is not None:
                    absolute.add(found.module)
        return len(absolute) <= 1 and not (relative and absolute and "." not in min(absolute))

    def _inside_package(self, resolver: "_Resolver", importer: str, target: str) -> Optional[Spelling]:
        """`import pkg.loop` where `importer` imports the package `pkg` (absolutely) and the
        target lies inside it."""
        parts = self.modules[target].name.split(".")
        for imp in self.modules[importer].imports:
            if imp.level or not imp.module:
                continue
            for start in range(len(parts) - 1):
                dotted = ".".join(parts[start:])
                if dotted.startswith(imp.module + ".") and resolver.lookup(importer, dotted) == [target]:
                    return Spelling(dotted)
        return None


def _spelled(resolver: "_Resolver", importer: str, imp: Import, target: str) -> Optional[Spelling]:
    """The module object `imp` (an import `importer` spells) reaches `target` as, if it does."""
    if imp.level:
        module = resolver.relative_module(importer, imp)
        if resolver.by_name.get(module) == target and imp.module:
            parent, _, last = imp.module.rpartition(".")
            return Spelling(parent, last, imp.level)
        for name in imp.names:
            if resolver.by_name.get(f"{module}.{name}") == target:
                return Spelling(imp.module, name, imp.level)
        return None
    if target in resolver.lookup(importer, imp.module):
        return Spelling(imp.module)
    for name in imp.names:
        if target in resolver.lookup(importer, f"{imp.module}.{name}"):
            return Spelling(f"{imp.module}.{name}")
    return None


class _Resolver:
    """Dotted names to the tree's modules: the importer's own package first, then the tree's
    root, then any module whose path ends with the name (a script run from its folder)."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.by_name: dict[str, str] = {}
        self.by_suffix: dict[str, list[str]] = {}
        for path in paths:
            name = module_name(path)
            self.by_name[name] = path
            parts = name.split(".")
            for start in range(len(parts)):
                self.by_suffix.setdefault(".".join(parts[start:]), []).append(path)

    def lookup(self, importer: str, dotted: str) -> list[str]:
        if not dotted:
            return []
        package = module_name(importer).split(".")[:-1]
        for prefix in (package, []):
            found = self.by_name.get(".".join([*prefix, dotted]))
            if found:
                return [found]
        return list(self.by_suffix.get(dotted, ()))

    def relative_module(self, importer: str, imp: Import) -> str:
        """The dotted name a relative import (`from ..a import b`) names from `importer`."""
        package = module_name(importer).split(".")
        if not importer.endswith("__init__.py"):
            package = package[:-1]
        base = package[: len(package) - (imp.level - 1)] if imp.level > 1 else package
        return ".".join([*base, imp.module] if imp.module else base)

    def targets(self, importer: str, imp: Import) -> list[str]:
        if imp.level:
            module = self.relative_module(importer, imp)
            found = [self.by_name[module]] if module in self.by_name else []
            subs = [self.by_name.get(f"{module}.{n}") for n in imp.names]
            return found + [s for s in subs if s]
        found = self.lookup(importer, imp.module)
        for name in imp.names:
            found += self.lookup(importer, f"{imp.module}.{name}")
        return found


def build_index(sources: Mapping[str, str]) -> ProjectIndex:
    """Index a tree given as relative path -> text (Python files only)."""
    resolver = _Resolver(sources)
    modules: dict[str, ModuleFacts] = {}
    trees: dict[str, ast.Module] = {}
    sources = {path: _one_newline(text) for path, text in sources.items()}
    for path, text in sources.items():
        facts = modules[path] = ModuleFacts(path, module_name(path))
        candidate = is_candidate(text)
        tree, beyond = _parse_or_why(text) if candidate else (None, False)
        if tree is not None and _read(facts, tree, text):
            trees[path] = tree
            facts.script = _MAIN_GUARD.search(text) is not None
            facts.parsed = True
            continue
        facts.imports = _text_imports(text)
        if candidate and tree is None and not beyond:
            _unparsed(facts, text)
    edges = {
        path: {t for imp in facts.imports for t in resolver.targets(path, imp) if t != path}
        for path, facts in modules.items()
    }
    _resolve_provided(sources, modules, trees, edges)
    return ProjectIndex(modules, edges, resolver)


def _one_newline(text: str) -> str:
    """The text with `\r\n` and `\r` as `\n`: the parser counts all three as line breaks, so
    line numbers stay the parser's (amp_migrate/io/lines.py)."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _unparsed(facts: ModuleFacts, text: str) -> None:
    """A file that imports Apex but does not parse is left untouched, Apex and all: count its
    first Apex import as a use of amp state, so that its group cannot go native around it.
    Not a file nested beyond what Python runs: it never shares the state of a process."""
    for imp in facts.imports:
        if _apex_module(imp.module):
            line = hit_lines(text, re.compile(r"^[ \t]*(?:from|import)[ \t]+apex\b", re.M))
            facts.uses.append(Site(line[0] if line else 1, 1, "Apex, in a file that does not parse"))
            return


def _resolve_provided(
    sources: Mapping[str, str],
    modules: dict[str, ModuleFacts],
    trees: dict[str, ast.Module],
    edges: dict[str, set[str]],
) -> None:
    """`amp = get_amp(fp16)` where `get_amp`, in this module or one it imports, returns Apex's
    module: a provided site naming the provider (found under any name the first text test
    did not look for: `mp = get_amp(fp16)`)."""
    providers: dict[str, list[tuple[str, Site]]] = {}
    for path, facts in modules.items():
        for site in facts.providers:
            providers.setdefault(site.what, []).append((path, site))
    if not providers:
        return
    named = re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, sorted(providers))))
    for path, text in sources.items():
        tree = (trees.get(path) or _parse(text)) if named.search(text) else None
        if tree is None:
            continue
        # `from utils import get_amp as amp_or_none`: the call spells the alias
        aliases = {
            a.asname: a.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for a in node.names
            if a.asname and a.name in providers
        }
        pattern = re.compile(r"\b(?:%s)\s*\(" % "|".join(map(re.escape, sorted({*providers, *aliases}))))
        hits = hit_lines(text, pattern)
        lines = text.split("\n")
        for unit, stack in _units(tree.body, hits, ()):
            for node in ast.walk(unit):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    _provided(modules[path], node, stack, providers, edges[path], lines, aliases)
        names = {site.what.split(" = ")[0] for site in modules[path].provided}
        if any("." not in name and not _amp_like(name) for name in names):
            _reread(modules, path, text, tree, {n: "apex.amp" for n in names if "." not in n})


def _reread(
    modules: dict[str, ModuleFacts], path: str, text: str, tree: ast.Module, provided: dict[str, str]
) -> None:
    """Read a module again with the names a provider's call binds (`mp = get_amp()`) known
    as Apex's module, so that `mp.initialize(...)` counts as it would under any other name."""
    old = modules[path]
    facts = modules[path] = ModuleFacts(path, old.name, provided=old.provided)
    if not _read(facts, tree, text, provided):
        modules[path] = old
        return
    facts.parsed = True
    if not old.parsed:
        facts.imports = old.imports


def _provided(
    facts: ModuleFacts,
    node: ast.Assign,
    stack: tuple[str, ...],
    providers: dict[str, list[tuple[str, Site]]],
    imported: set[str],
    lines: list[str],
    aliases: Mapping[str, str] = {},
) -> None:
    call = node.value
    assert isinstance(call, ast.Call)  # the callers pass an assignment of a call
    callee = dotted_chain(call.func)
    function = callee.rsplit(".", 1)[-1] if callee else ""
    function = aliases.get(function, function) if callee == function else function
    for provider_path, site in providers.get(function, ()):
        if provider_path != facts.path and provider_path not in imported:
            continue
        for target in node.targets:
            key = dotted_chain(target) or ast.unparse(target)
            facts.provided.append(
                Site(
                    node.lineno,
                    column(lines, node),
                    f"{key} = {callee}(...), from {provider_path}:{site.line}",
                    ".".join(stack) or "<module>",
                )
            )
