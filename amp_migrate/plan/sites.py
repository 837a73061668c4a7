"""The training planner's reading of a file: Apex's calls that must reach the GradScaler, and
the questions about where they sit (their statement, function, class, lines) that every part of
the planner asks. Each part (units.py, methods.py, inference.py, training.py) derives from it.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Optional, Union

import libcst as cst
import libcst.matchers as m

from ..file_state import FileState
from .planner import Planner
from .types import (
    INIT,
    INITIALIZE,
    LOAD_STATE_DICT,
    LOSS_SCALERS,
    MASTER_PARAMS,
    PURE_BUILTINS,
    SCALE_LOSS,
    STATE_DICT,
    binds_in_ast,
    words_of,
)

if TYPE_CHECKING:
    from .switch_flow import _Stores


def _bound_names(node: ast.AST) -> tuple[str, ...]:
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return (node.id,)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (node.name,)
    if isinstance(node, ast.alias):
        return (node.asname or node.name.split(".")[0],)
    if isinstance(node, ast.arg):
        return (node.arg,)
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return (node.name,)
    return ()


class TrainingSites(Planner):
    """The sites of Apex's training calls in one file, collected by the planner's visit."""

    MARKERS = ("initialize", "scale_loss", "init(")
    #: One placement for several `initialize` calls (methods.py), while their parts are planned.
    forced_placement: Optional[str] = None

    def also_spells(self) -> Optional[frozenset[str]]:
        return self.state.apex_words

    def interest(self) -> Optional[frozenset[str]]:
        return self.words_for(
            INITIALIZE, INIT, *SCALE_LOSS, MASTER_PARAMS, STATE_DICT, LOAD_STATE_DICT, *LOSS_SCALERS
        )

    def __init__(self, state: FileState) -> None:
        super().__init__(state)
        self.inits: list[tuple[cst.Call, cst.CSTNode]] = []  # (call, statement)
        self.sites: list[cst.CSTNode] = []  # every call that will reach the scaler
        self.scale_losses: list[cst.Call] = []
        self._binds_cache: dict[tuple[int, str], Optional[bool]] = {}
        self._builtins: Optional[tuple[str, ...]] = None
        self._flagged: set[int] = set()  # lines of the `if FLAG:` branches reported (AMP158)
        # the file's ast and stores, () where it does not parse
        self._stored: Optional[Union[tuple[ast.Module, _Stores], tuple[()]]] = None

    def visit_Call(self, node: cst.Call) -> None:
        name = self.apex_name(node.func)
        if name in (INITIALIZE, INIT):
            self.inits.append((node, self._statement(node)))
        elif name in SCALE_LOSS:
            self.scale_losses.append(node)
            self.sites.append(node)
        elif name in (MASTER_PARAMS, STATE_DICT, LOAD_STATE_DICT):
            self.sites.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "loss_scalers" and self.apex_name(node) in LOSS_SCALERS:
            self.sites.append(node)  # a read of Apex's scale reaches the scaler too

    def _lines_of(self, statement: cst.CSTNode) -> range:
        first = self.position(statement)[0]
        tree = self.state.index.ast_of(statement) if self.state.index is not None else None
        last = getattr(tree, "end_lineno", None) or first
        return range(first, last + 1)

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return parent
        return node

    def scope_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.Lambda)):
                return parent if isinstance(parent, cst.FunctionDef) else None
        return None

    def class_of(self, function: cst.FunctionDef) -> Optional[cst.ClassDef]:
        block = self.parent(function)
        owner = self.parent(block) if block is not None else None
        if (
            isinstance(owner, cst.ClassDef)
            and function.params.params
            and function.params.params[0].name.value == "self"
        ):
            return owner
        return None

    def _step_sites(self, module: cst.Module, optimizers: set[str], init: cst.CSTNode) -> list[cst.Call]:
        """The `X.step()` calls whose `X` is an optimizer `scale_loss` scaled: in the scope
        that binds it where `initialize` or `scale_loss` sees it (an `optimizer` parameter of
        some other function is another variable), or `self.X` in the same class."""
        matcher = m.Call(func=m.Attribute(attr=m.Name("step")))
        calls = [  # what the matcher finds: calls of an attribute
            (c, c.func.value)
            for c in self.findall(module, matcher, words_of(optimizers), ("step",))
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
            if self.code_of(c.func.value) in optimizers
        ]
        seen_from = [init] + [s for s in self.scale_losses]
        return [c for c, owner in calls if self._same_variable(owner, c, seen_from)]

    def _same_variable(self, expr: cst.BaseExpression, where: cst.CSTNode, sites: list[cst.CSTNode]) -> bool:
        if isinstance(expr, cst.Name):
            scope = self._binding_scope(where, expr.value)
            return any(self._binding_scope(s, expr.value) is scope for s in sites)
        if m.matches(expr, m.Attribute(value=m.Name("self"))):
            here = self.scope_of(where)
            owner = self.class_of(here) if here is not None else None
            return any(self._class_around(s) is owner for s in sites)
        return True  # `trainer.optimizer`: one object wherever it is read

    def _class_around(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        function = self.scope_of(node)
        return self.class_of(function) if function is not None else None

    def _binding_scope(self, node: cst.CSTNode, name: str) -> Optional[cst.FunctionDef]:
        """The function whose variable `name` is where `node` reads it (None: the module's)."""
        for parent in self.ancestors(node):
            if isinstance(parent, cst.FunctionDef):
                key = (id(parent), name)
                if key not in self._binds_cache:
                    index = self.state.index
                    tree = index.ast_of(parent) if index is not None else None
                    if index is not None and not index.may_spell(parent, name):
                        self._binds_cache[key] = None
                    elif isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._binds_cache[key] = binds_in_ast(tree, name)
                    else:  # beyond this interpreter's parser: by spelling, as Apex users wrote it
                        self._binds_cache[key] = None
                binds = self._binds_cache[key]
                if binds is not None:
                    return parent if binds else None
        return None

    def _free_builtins(self) -> tuple[str, ...]:
        """The builtins of PURE_BUILTINS that nothing in the file binds (any scope)."""
        if self._builtins is None:
            index = self.state.index
            spelled = {b for b in PURE_BUILTINS if index is None or index.spells(b)}
            try:
                tree = (
                    (index.tree if index is not None else ast.parse(self.state.original)) if spelled else None
                )
            except (SyntaxError, ValueError):
                tree, spelled = None, set(PURE_BUILTINS)
            bound = (
                index.bound_names()
                if index is not None and tree is not None
                else {
                    name
                    for node in (ast.walk(tree) if tree is not None else ())
                    for name in _bound_names(node)
                }
            ) & spelled
            self._builtins = tuple(b for b in PURE_BUILTINS if b not in bound)
        return self._builtins
