"""fp16_utils: `apex.fp16_utils` helpers with an exact torch form; the rest goes to the shim.

What it does
    * `to_python_float(t)` becomes `t.item()`;
    * `clip_grad_norm` becomes `torch.nn.utils.clip_grad_norm_` (Apex's name is that very
      function on every torch newer than 0.4);
    * `FP16_Optimizer`, the model converters (`network_to_half`, `FP16Model`, `tofp16`,
      `BN_convert_float`, `convert_module`, `convert_network`), the manual master-weight
      helpers (`prep_param_lists`, `model_grads_to_master_grads`,
      `master_params_to_model_params`) and the legacy `LossScaler`/`DynamicLossScaler` are
      reported, and the file uses the shim.

    `from apex.fp16_utils import *` (Apex's ImageNet example) is understood too: a bare call
    of one of the star import's names that the file does not define is that Apex function.
    When every such use was rewritten the star import is removed (nothing else can tell that
    it became unused); otherwise the names that still need it are reported and the file uses
    the shim.

Why
    These helpers predate `torch.amp`. `to_python_float` existed for torch 0.3, whose tensors
    had no `.item()`; `clip_grad_norm` is an alias. The other helpers implement a
    pure-fp16 model with hand-managed fp32 master weights, whose native replacement (an fp32
    model under autocast with a `GradScaler`) changes the training loop, the model's dtype and
    its checkpoint keys (`network.` and `1.` prefixes); amp-migrate does not rewrite that
    without proof, so the shim keeps the Apex behaviour.

Soundness
    Only helpers whose torch form is the same call are rewritten: `to_python_float(t)` is
    `t.item()` for every tensor and NumPy scalar, and `clip_grad_norm` was bound to
    `torch.nn.utils.clip_grad_norm_` itself on every torch since 0.4. Everything that changes a
    model's dtype or manages master weights by hand changes the training loop and the
    checkpoint keys, and falls back to the shim.

Fix safety
    Safe. `to_python_float(t)` was `t.item()` whenever `t` has `.item()` (every tensor and
    NumPy scalar); for other objects Apex returned `t[0]` (a list holding the number), which
    the rewrite no longer does: such a call now raises `AttributeError`.

Example
    from apex.fp16_utils import *                 losses.update(reduced_loss.item(), n)
    losses.update(to_python_float(reduced_loss), n)
"""

from __future__ import annotations

import ast
from typing import Optional, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ScopeProvider

from ..analysis.binding import find, not_reads
from ..analysis.fp16_names import PACKAGE, STAR, public, star_module
from ..analysis.statements import if_without_else_around
from ..diagnostics import Code, Severity, define
from ..plan.types import pure
from .base import Rule, add_requested_imports
from .facts import Fact

TO_ITEM = define(
    "AMP450",
    "to-python-float-to-item",
    Severity.INFO,
    "`to_python_float(t)` became `t.item()`.",
    "Apex's `to_python_float` returned `t.item()` when `t` has an `item` method and `t[0]` "
    "otherwise, a fallback for torch 0.3 tensors. Every tensor and NumPy scalar has `.item()`, "
    "so the call is exactly `t.item()`. Behaviour note: an argument without `.item()` (a list "
    "holding the number) used to give its first element and now raises AttributeError.",
    before="from apex.fp16_utils import to_python_float\nlosses.update(to_python_float(loss), n)",
    after="losses.update(loss.item(), n)",
)
CLIP_GRAD_NORM = define(
    "AMP451",
    "clip-grad-norm-to-torch",
    Severity.INFO,
    "`apex.fp16_utils.clip_grad_norm` became `torch.nn.utils.clip_grad_norm_`.",
    "On torch newer than 0.4 Apex defines `clip_grad_norm = torch.nn.utils.clip_grad_norm_`: "
    "the same function object, so nothing changes but the name.",
    before="from apex.fp16_utils import clip_grad_norm\nclip_grad_norm(model.parameters(), 1.0)",
    after="import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
)
FP16_OPTIMIZER = define(
    "AMP460",
    "fp16-optimizer-not-migrated",
    Severity.WARNING,
    "`FP16_Optimizer` has no provably right native form here; the file uses the shim.",
    "`FP16_Optimizer` wraps an optimizer of an fp16 model with fp32 master weights and its own "
    "loss scaler, and owns `backward`, `step`, `clip_master_grads` and a checkpoint format of "
    "its own. Its native replacement (an fp32 model under `torch.autocast`, a "
    "`torch.amp.GradScaler`, `scaler.scale(loss).backward()`, `scaler.step(opt)`) rewrites "
    "the model construction, the training loop and the checkpoints together; until that is "
    "proven for the file, the shim keeps Apex's behaviour.",
    before="from apex.fp16_utils import FP16_Optimizer\n"
    "optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)",
    after="from amp_shim.fp16_utils import FP16_Optimizer\n"
    "optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)",
    falls_back=True,
    refusal="an FP16_Optimizer use not provably the native recipe",
    fallback_title="`apex.fp16_utils` helpers with no native form here",
    shape=(
        "`FP16_Optimizer`, `FP16_Module`, `fp32_to_fp16` or `fp16_to_fp32` of `apex.fp16_utils` outside an "
        "`FP16_Optimizer` flow that the native recipe covers (where the flow itself is refused, AMP466 is "
        "reported instead)."
    ),
    by_hand=(
        "Rewrite the recipe together: keep the model in fp32, run the forward under `torch.autocast`, "
        "replace the wrapper by the bare optimizer and a `torch.amp.GradScaler` "
        "(`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`), and convert the "
        "checkpoints."
    ),
)
MODEL_CONVERSION = define(
    "AMP461",
    "fp16-model-conversion-not-migrated",
    Severity.WARNING,
    "This Apex fp16 model conversion has no provably right native form here; the file uses the shim.",
    "`network_to_half`, `FP16Model`, `tofp16`, `BN_convert_float`, `convert_module` and "
    "`convert_network` make a pure-fp16 model (affine BatchNorm kept in fp32), some of them "
    "inside a wrapper module that adds `1.` or `network.` to every state-dict key. Native "
    "mixed precision keeps the model in fp32 and casts per op under `torch.autocast`, which "
    "also needs a loss scaler and different checkpoints; the rewrite is not local, so the "
    "shim keeps Apex's behaviour.",
    before="from apex.fp16_utils import network_to_half\nmodel = network_to_half(model)",
    after="from amp_shim.fp16_utils import network_to_half\nmodel = network_to_half(model)",
    falls_back=True,
    refusal="an fp16 model conversion with no provable native form",
    fallback_title="`apex.fp16_utils` helpers with no native form here",
    shape=(
        "`network_to_half(model)`, `FP16Model(model)`, `tofp16()`, `BN_convert_float(model)`, "
        "`convert_module` or `convert_network` making a pure-fp16 model, outside an `FP16_Optimizer` flow "
        "the native recipe covers."
    ),
    by_hand=(
        "Drop the conversion and keep the model in fp32 under `torch.autocast` with a "
        "`torch.amp.GradScaler`; strip the `1.`/`network.` prefixes a wrapper added to old checkpoints' "
        "keys."
    ),
)
MASTER_PARAMS = define(
    "AMP462",
    "fp16-master-params-not-migrated",
    Severity.WARNING,
    "Apex's manual master-weight helpers have no provably right native form here; the file uses the shim.",
    "`prep_param_lists`, `model_grads_to_master_grads` and `master_params_to_model_params` "
    "implement fp32 master weights for an fp16 model by hand, around a loss scale the file "
    "manages itself. The native recipe (fp32 model, autocast, GradScaler) removes the copies "
    "altogether, which changes the training loop beyond these calls; the shim keeps Apex's "
    "behaviour.",
    before="from apex.fp16_utils import prep_param_lists\n"
    "model_params, master_params = prep_param_lists(model)",
    after="from amp_shim.fp16_utils import prep_param_lists\n"
    "model_params, master_params = prep_param_lists(model)",
    falls_back=True,
    refusal="manual master weights with no provable native form",
    fallback_title="`apex.fp16_utils` helpers with no native form here",
    shape=(
        "`model_params, master_params = prep_param_lists(model)`, then "
        "`model_grads_to_master_grads(model_params, master_params)` and "
        "`master_params_to_model_params(model_params, master_params)` around a step the file scales by hand."
    ),
    by_hand=(
        "Keep the model in fp32 and step its own parameters: delete the master copies, run the forward under "
        "`torch.autocast`, and scale with a `torch.amp.GradScaler` instead of the file's loss scale."
    ),
)
LEGACY_SCALER = define(
    "AMP463",
    "fp16-loss-scaler-not-migrated",
    Severity.WARNING,
    "Apex's legacy `LossScaler` / `DynamicLossScaler` have no provably right native form "
    "here; the file uses the shim.",
    "The legacy scalers of `apex.fp16_utils` differ from `torch.amp.GradScaler`: "
    "`DynamicLossScaler` starts at 2**32, grows every 1000 steps and never goes below 1, and "
    "the file itself decides when to skip a step from `has_overflow`. A GradScaler would skip "
    "and rescale on its own terms, so the shim keeps Apex's arithmetic.",
    before="from apex.fp16_utils import DynamicLossScaler\nscaler = DynamicLossScaler()",
    after="from amp_shim.fp16_utils import DynamicLossScaler\nscaler = DynamicLossScaler()",
    falls_back=True,
    refusal="legacy loss scalers with no provable native form",
    fallback_title="`apex.fp16_utils` helpers with no native form here",
    shape=(
        "`LossScaler(scale)` or `DynamicLossScaler()` whose `loss_scale`, `has_overflow` and `update_scale` "
        "the training loop calls itself, skipping the step on an overflow."
    ),
    by_hand=(
        "Replace the scaler and the loop's skip logic by a `torch.amp.GradScaler` (`init_scale=2.**32, "
        "growth_interval=1000` come closest to `DynamicLossScaler`'s start and growth; it has no floor of 1) "
        "and let `scaler.step` skip."
    ),
)
STAR_IMPORT_NEEDED = define(
    "AMP464",
    "fp16-utils-star-import-still-needed",
    Severity.WARNING,
    "`from apex.fp16_utils import *` still provides names the file uses; the file uses the shim.",
    "amp-migrate removes a star import of `apex.fp16_utils` only when every name the file "
    "takes from it was rewritten. The names in the message were not (a helper with no native "
    "form, a use other than a call, or a name such as `torch` that the star import happens to "
    "provide), or the star import sits inside a `try:` or `if` block, which amp-migrate does "
    "not restructure. Import the names explicitly, or migrate them by hand. "
    "The message names each name still needed for a use, or the block the star import sits "
    "inside.",
    before="from apex.fp16_utils import *\noptimizer = FP16_Optimizer(optimizer)",
    after="from amp_shim.fp16_utils import *\noptimizer = FP16_Optimizer(optimizer)",
    falls_back=True,
    refusal="the star import still provides names the file uses",
    variants=(
        "still needed for",
        "sits inside a",
    ),
    fallback_title="`apex.fp16_utils` helpers with no native form here",
    shape=(
        "`from apex.fp16_utils import *` (Apex's ImageNet example) in a file that still uses a name it "
        "provides with no native form (`network_to_half`, `FP16_Optimizer`), uses one other than by a call, "
        "or takes a name such as `torch` from it; or the star import inside a `try:` or `if` block."
    ),
    by_hand=(
        "Import the names the file uses explicitly (`import torch`, `from apex.fp16_utils import "
        "to_python_float`), or migrate the uses the message names by hand, then re-run."
    ),
)

_TO_PYTHON_FLOAT = "apex.fp16_utils.to_python_float"
_CLIP_GRAD_NORM = "apex.fp16_utils.clip_grad_norm"
_FALLBACKS: dict[str, Code] = {
    **dict.fromkeys(("FP16_Optimizer", "FP16_Module", "fp32_to_fp16", "fp16_to_fp32"), FP16_OPTIMIZER),
    **dict.fromkeys(
        ("network_to_half", "FP16Model", "tofp16", "BN_convert_float", "convert_module", "convert_network"),
        MODEL_CONVERSION,
    ),
    **dict.fromkeys(
        ("prep_param_lists", "model_grads_to_master_grads", "master_params_to_model_params"), MASTER_PARAMS
    ),
    **dict.fromkeys(("LossScaler", "DynamicLossScaler"), LEGACY_SCALER),
}
_STAR_EXPORTS = STAR
_public = public
_star_module = star_module


def _only_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    """The `t` of `to_python_float(t)` or `to_python_float(t=t)`, else None."""
    if len(call.args) != 1:
        return None
    arg = call.args[0]
    if arg.star or (arg.keyword is not None and arg.keyword.value != "t"):
        return None
    return arg.value


def _receiver(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` as the object of an attribute access, parenthesized unless it binds tightly."""
    if expr.lpar or isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class Fp16UtilsToTorch(Rule):
    """`apex.fp16_utils` helpers with an exact torch form, rewritten; the others reported."""

    HANDLES = (_TO_PYTHON_FLOAT, _CLIP_GRAD_NORM, *(f"{PACKAGE}.{name}" for name in _FALLBACKS))
    EMITS = (
        TO_ITEM,
        CLIP_GRAD_NORM,
        FP16_OPTIMIZER,
        MODEL_CONVERSION,
        MASTER_PARAMS,
        LEGACY_SCALER,
        STAR_IMPORT_NEEDED,
    )
    READS = frozenset({Fact.APEX_ANALYSED, Fact.FP16_OPTIMIZER_REFUSED})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.IMPORT_REQUESTS})

    MARKERS = ("fp16_util",)

    def interest(self):
        words = self.words_for(PACKAGE)
        if words is not None and self.state.index is not None:
            for node in self.state.index.imports():
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module in _STAR_EXPORTS
                    and any(a.name == "*" for a in node.names)
                ):
                    words |= _STAR_EXPORTS[node.module]
        return words

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._star_names: dict[int, str] = {}  # id(Name) -> name, for names a star import provides
        self._still_needed: set[str] = set()
        self._star_imports: list[cst.ImportFrom] = []
        self._removed_star = False
        #: id of a star import inside a block -> why it cannot go (None: it can, see `_drop`)
        self._guarded: dict[int, Optional[str]] = {}
        self._drop: set[int] = set()  # `try`/`if` statements that held only a removable star import

    # -- star imports -----------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        exported: set[str] = set()
        for found in self._find_star_imports(node):
            self._star_imports.append(found)
            exported |= _STAR_EXPORTS[_star_module(found) or ""]
        if not exported:
            return
        if self.apex is not None and self.apex.table is not None and not exported & self.apex.bound_elsewhere:
            # Nothing else binds these names: every read of one is a read of the star import.
            skip = self.state.skipping(exported)
            not_read = not_reads(node, skip)
            for name in find(node, m.Name(), skip, self._seen_parents):
                if isinstance(name, cst.Name) and name.value in exported and id(name) not in not_read:
                    self._star_names[id(name)] = name.value
                    if not self._rewritable_star_use(name):
                        self._still_needed.add(name.value)
        else:
            self._star_uses_by_scope(exported)
        top_level = {
            id(s) for stmt in node.body if isinstance(stmt, cst.SimpleStatementLine) for s in stmt.body
        }
        for found in self._star_imports:
            if id(found) not in top_level:
                self._guarded[id(found)] = self._guard_removal(found)

    def _star_uses_by_scope(self, exported: set[str]) -> None:
        wrapper = self.context.wrapper
        assert wrapper is not None  # set while the rule transforms the module
        scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
        for scope in scopes:
            for access in scope.accesses:
                name = access.node
                if isinstance(name, cst.Name) and name.value in exported and not access.referents:
                    self._star_names[id(name)] = name.value
                    if not self._rewritable_star_use(name):
                        self._still_needed.add(name.value)

    def _find_star_imports(self, module: cst.Module) -> list[cst.ImportFrom]:
        return _star_imports_in(self.findall(module, m.ImportFrom(names=m.ImportStar())))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        if (
            self._removed_star
            and AddImportsVisitor.CONTEXT_KEY in self.context.scratch
            and "apex" not in tree.code
        ):
            # Later rules (SettleImports among them) skip a file that no longer mentions Apex,
            # so the imports this rule asked for are added here.
            tree = add_requested_imports(self.context, tree, self.state.index)
        return tree

    def _rewritable_star_use(self, name: cst.Name) -> bool:
        if name.value == "clip_grad_norm":
            return True
        parent = self.parent(name)
        return (
            name.value == "to_python_float"
            and isinstance(parent, cst.Call)
            and parent.func is name
            and _only_argument(parent) is not None
        )

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> Union[cst.ImportFrom, cst.RemovalSentinel]:
        if _star_module(original_node) is None:
            return updated_node
        if self._still_needed:
            names = ", ".join(f"`{n}`" for n in sorted(self._still_needed))
            self.report(
                original_node,
                STAR_IMPORT_NEEDED,
                f"`{self.code_of(original_node)}` is still needed for {names}; the file uses the shim",
            )
            return updated_node
        why = self._guarded.get(id(original_node))
        if why is not None:
            self.report(
                original_node,
                STAR_IMPORT_NEEDED,
                f"`{self.code_of(original_node)}` sits inside a block {why}; the file uses the shim",
            )
            return updated_node
        self._removed_star = True
        return cst.RemoveFromParent()

    def _guard_removal(self, star: cst.ImportFrom) -> Optional[str]:
        """Why the star import cannot leave its block (None: it can). Alone in a `try:` whose
        handlers only report a missing Apex (pass, a call such as `print`, `raise`), or in an
        `if` without `else` whose test reads nothing but names, the whole statement goes."""
        line = self.parent(star)
        block = self.parent(line) if isinstance(line, cst.SimpleStatementLine) else None
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            not isinstance(line, cst.SimpleStatementLine)
            or len(line.body) != 1
            or owner is None
            or not isinstance(block, cst.IndentedBlock)  # where `owner` is not None, it is
        ):
            return "that shares its line with other statements"
        if len(block.body) > 1:
            return None  # the block keeps other statements
        if isinstance(owner, cst.Try) and owner.body is block:
            if owner.orelse is not None or owner.finalbody is not None:
                return "of a `try` with `else`/`finally`"
            assigned = [
                h
                for h in owner.handlers
                if not all(
                    isinstance(small, (cst.Pass, cst.Raise)) or m.matches(small, m.Expr(m.Call()))
                    for stmt in h.body.body
                    if isinstance(stmt, cst.SimpleStatementLine)
                    for small in stmt.body
                )
                or not all(isinstance(stmt, cst.SimpleStatementLine) for stmt in h.body.body)
            ]
            if assigned:
                return (
                    f"whose `except` (line {self.position(assigned[0])[0]}) does more than report the "
                    "missing import, so the `try` cannot simply go"
                )
            self._drop.add(id(owner))
            return None
        bare = if_without_else_around(block, self.parent)
        if bare is not None and pure(bare.test):
            self._drop.add(id(bare))
            return None
        return "that is neither a `try` nor an `if` without `else`"

    def leave_Try(self, original_node: cst.Try, updated_node: cst.Try):
        if id(original_node) in self._drop and not self._still_needed:
            self._removed_star = True
            return cst.RemoveFromParent()
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if id(original_node) in self._drop and not self._still_needed:
            self._removed_star = True
            return cst.RemoveFromParent()
        return updated_node

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    # -- which fp16_utils name ------------------------------------------------------------------
    def _fp16_name(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Name) and id(node) in self._star_names:
            return f"{PACKAGE}.{node.value}"
        return _public(self.apex_name(node))

    def _is_attr_name(self, node: cst.Name) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.Attribute) and parent.attr is node

    # -- fallbacks --------------------------------------------------------------------------
    def visit_Name(self, node: cst.Name) -> None:
        if not self._is_attr_name(node):
            self._report_fallback(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._report_fallback(node)

    def _report_fallback(self, node: Union[cst.Name, cst.Attribute]) -> None:
        name = self._fp16_name(node)
        if name is None or not name.startswith(PACKAGE + "."):
            return
        code = _FALLBACKS.get(name[len(PACKAGE) + 1 :])
        refused = self.state.fp16_optimizer_refused
        if code is FP16_OPTIMIZER and refused:
            return  # the flow's own rule said where and why
        if code is MODEL_CONVERSION and refused:
            self.report(
                node,
                code,
                f"`{self.code_of(node)}` makes the fp16 model of an `FP16_Optimizer` flow "
                "that has no native form here (AMP466 says why); the file uses the shim",
            )
            return
        if code is not None:
            self.report(
                node,
                code,
                f"`{self.code_of(node)}` ({name}) has no native form amp-migrate "
                "can prove right; the file uses the shim",
            )

    # -- rewrites ---------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._fp16_name(original_node.func) != _TO_PYTHON_FLOAT:
            return updated_node
        if _only_argument(original_node) is None:
            return updated_node  # RemainingApexUses (or the star import check) reports it
        value = _only_argument(updated_node)
        assert value is not None
        self.report(
            original_node,
            TO_ITEM,
            f"`{self.code_of(original_node)}` became `.item()`; Apex's `t[0]` fallback for "
            "objects without `.item()` is gone",
        )
        return cst.Call(
            cst.Attribute(value=_receiver(value), attr=cst.Name("item")),
            lpar=updated_node.lpar,
            rpar=updated_node.rpar,
        )

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if self._is_attr_name(original_node):
            return updated_node
        return self._clip_grad_norm(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._clip_grad_norm(original_node, updated_node)

    def _clip_grad_norm(
        self, original_node: Union[cst.Name, cst.Attribute], updated_node: cst.BaseExpression
    ) -> cst.BaseExpression:
        if self._fp16_name(original_node) != _CLIP_GRAD_NORM:
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "torch")
        self.report(original_node, CLIP_GRAD_NORM)
        return cst.parse_expression("torch.nn.utils.clip_grad_norm_").with_changes(
            lpar=updated_node.lpar, rpar=updated_node.rpar
        )


def _star_imports_in(found: list[cst.CSTNode]) -> list[cst.ImportFrom]:
    return [node for node in found if isinstance(node, cst.ImportFrom) and _star_module(node) is not None]
