"""The codemod's own tree walks must see what libcst's and Python's walks see, in the same
order where order matters: a rule, which skips the layout nodes it has no handler for and
hands back unchanged subtrees as they were, calls the same handlers on the same nodes in the
same order as a plain libcst transformer and builds the same tree, and `walk_ast` yields
every node `ast.walk` does but the `Load`/`Store`/`Del` markers."""

import ast

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.codemod import CodemodContext

from amp_migrate.analysis.source_index import walk_ast
from amp_migrate.analysis.statements import find_statements
from amp_migrate.options import Options
from amp_migrate.rules import base
from amp_migrate.rules.base import FileState, Rule
from fixture_files import INPUTS, fixture_id

# Inputs of every shape the golden tests hold (not their expected outputs).
SOURCES = INPUTS[::7]

SAMPLE = """\
import torch as T
from apex import amp


@decorate(amp, key=lambda x: x[1:2])
async def run(model: "T.nn.Module", *args, opt=None, **kw) -> None:
    global counter
    async with amp.scale_loss(loss, opt) as (scaled, _):
        await scaled.backward()
    f"{model!r:>{width}}" ; x = [y async for y in z if y] ; del x
    match kw:
        case {"a": 1, **rest} if rest: pass
        case [first, *others]: print(first)
    try:
        pass
    except* ValueError as e:
        raise
    return {**kw, "k": (yield)}
"""


class _Handlers:
    """Records every handler call; rewrites every `amp` name, and drops `del` lines and
    `pass` statements, so that parents are rebuilt around changed, removed and flattened
    children."""

    log: list

    def on_visit(self, node):
        self.log.append(("visit", type(node).__name__, id(node)))
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        self.log.append(("leave", type(original_node).__name__, id(original_node)))
        return super().on_leave(original_node, updated_node)

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value="AMP") if updated_node.value == "amp" else updated_node

    def leave_Del(self, original_node, updated_node):
        return cst.RemoveFromParent()

    def leave_Pass(self, original_node, updated_node):
        return cst.RemoveFromParent()

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if any(isinstance(s, cst.Expr) and isinstance(s.value, cst.Await) for s in original_node.body):
            return cst.FlattenSentinel([updated_node, updated_node.deep_clone()])
        return updated_node


class _Recorder(_Handlers, Rule):
    MARKERS = ()

    def __init__(self, context, state, log):
        super().__init__(context, state)
        self.log = log

    def interest(self):
        return None


class _Plain(_Handlers, cst.CSTTransformer):
    def __init__(self, log):
        super().__init__()
        self.log = log


def _run(module: cst.Module, as_rule: bool):
    log: list = []
    if as_rule:
        rule = _Recorder(CodemodContext(), FileState(Options()), log)
        result = module.visit(rule)
    else:
        result = module.visit(_Plain(log))
    # A rule does not enter the layout nodes it ignores: compare the calls on the rest.
    passive = base._passive(_Recorder)
    kept = [entry for entry in log if getattr(cst, entry[1]) not in passive]
    return kept, result


KINDS = ("With", "ImportFrom", "If", "FunctionDef", "Try", "Assign", "Return")
TEXTS = [pytest.param(SAMPLE, id="sample")] + [
    pytest.param(
        p.read_text(encoding="utf-8"), id=fixture_id(p), marks=() if i % 8 == 0 else pytest.mark.slow
    )
    for i, p in enumerate(SOURCES)
]


@pytest.mark.parametrize("text", TEXTS)
def test_our_walks_see_what_libcsts_and_pythons_walks_see(text):
    """Per text: a rule visit calls the handlers libcst's visit calls, in its order, and builds
    its tree; `walk_ast` yields what `ast.walk` yields but the context markers; and
    `find_statements` finds what the matchers find, in the same order, for each statement kind
    (from the module and from each top-level statement)."""
    module = cst.parse_module(text)
    fast_log, fast = _run(module, as_rule=True)
    libcst_log, slow = _run(module, as_rule=False)
    assert fast_log == libcst_log
    assert fast.code == slow.code
    assert fast.deep_equals(slow)
    tree = ast.parse(text)
    expected = sorted(id(n) for n in ast.walk(tree) if not isinstance(n, ast.expr_context))
    assert sorted(id(n) for n in walk_ast(tree)) == expected
    for kind in KINDS:
        for part in [module, *module.body]:
            found = [id(n) for n in m.findall(part, getattr(m, kind)())]
            assert [id(n) for n in find_statements(part, getattr(cst, kind))] == found, kind


def test_unchanged_subtrees_keep_their_identity():
    module = cst.parse_module("import torch\n\n\ndef f(x):\n    return x + 1\n\n\ny = amp\n")
    _, result = _run(module, as_rule=True)
    assert result.body[1] is module.body[1]  # nothing in `f` changed
    assert result.body[2] is not module.body[2]


@pytest.mark.parametrize(
    "provider",
    [
        "PositionProvider",
        "ScopeProvider",
        "QualifiedNameProvider",
        "ParentNodeProvider",
        "ExpressionContextProvider",
    ],
)
def test_fast_metadata_wrapper_resolves_what_libcst_resolves(provider):
    import libcst.metadata as meta

    from amp_migrate.rules.base import FastMetadataWrapper

    key = getattr(meta, provider)
    module = cst.parse_module(SAMPLE)
    fast = FastMetadataWrapper(module, unsafe_skip_copy=True).resolve(key)
    slow = meta.MetadataWrapper(module, unsafe_skip_copy=True).resolve(key)
    # Nodes of the file itself (scope analysis also parses string annotations, anew each time).
    ours = set()
    stack = [module]
    while stack:
        node = stack.pop()
        ours.add(id(node))
        stack.extend(node.children)
    fast = {n: v for n, v in fast.items() if id(n) in ours}
    slow = {n: v for n, v in slow.items() if id(n) in ours}
    assert fast.keys() == slow.keys()

    def plain(value):
        if callable(value):  # libcst's LazyValue
            value = value()
        if key is meta.ScopeProvider:
            return (
                None
                if value is None
                else (
                    type(value).__name__,
                    sorted(value._assignments),
                    sorted(a.node.value for a in value.accesses if isinstance(a.node, cst.Name)),
                )
            )
        if key is meta.QualifiedNameProvider:
            return sorted((q.name, q.source.name) for q in value)
        if key is meta.ParentNodeProvider:
            return id(value)
        return value

    assert {id(n): plain(v) for n, v in fast.items()} == {id(n): plain(v) for n, v in slow.items()}


def test_transformers_without_matcher_dispatch_have_no_matcher_decorators():
    """A plain CSTTransformer or CSTVisitor (every rule is one) would ignore them silently."""
    import libcst.matchers as m
    from libcst.matchers._visitors import (
        _gather_constructed_leave_funcs,
        _gather_constructed_visit_funcs,
        _gather_matchers,
    )

    import amp_migrate.rules  # noqa: F401 - defines every rule module's classes

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    matching = (m.MatcherDecoratableTransformer, m.MatcherDecoratableVisitor)
    found = [
        cls
        for base_class in (cst.CSTTransformer, cst.CSTVisitor)
        for cls in subclasses(base_class)
        if cls.__module__.startswith("amp_migrate") and not issubclass(cls, matching)
    ]
    assert Rule in found and len(found) > 20
    for cls in found:
        instance = cls.__new__(cls)
        assert (
            _gather_matchers(instance),
            _gather_constructed_visit_funcs(instance),
            _gather_constructed_leave_funcs(instance),
        ) == ({}, {}, {}), cls
