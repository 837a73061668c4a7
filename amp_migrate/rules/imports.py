"""Imports: point Apex imports at the shim, or, after a native rewrite, drop the dead ones.

Shim target: `from apex import amp` becomes `from amp_shim import amp`, `import apex` becomes
`import amp_shim as apex`; nothing else in the file moves, so behaviour cannot change.

Native target: once the other rules have replaced every use, Apex imports that nothing reads
are removed, together with the scaffolding that existed only to guard them
(`try: from apex import amp / except ImportError: amp = None`, `if args.fp16: from apex import
amp`), and `import torch` is added where a rule needs it and no top-level import binds `torch`
already (`import torch.distributed` does). Any Apex use still left is reported and sends the
file to the shim: native output never keeps an import of a package that no longer exists.

What it does
    `ShimImports` (shim target) points Apex imports at `amp_shim`. `SettleImports` (native
    target) removes the Apex imports nothing reads any more, with the guards that existed only
    for them: a `try:` whose body held only those imports (and `pass`, or flags set to
    constants) loses its handlers when they only report that Apex is missing (pass, print,
    warn, log, raise or exit, set a flag); its `else:` arm then stands in its place, and flags
    the body set stay as plain assignments. A handler that does more (imports a fallback,
    defines something) stays. It adds the imports the other rules asked for.
    `RemainingApexUses` reports any Apex use no rule rewrote (AMP900), which sends the file to
    the shim.

Why
    A native output must not import the package the project is leaving; a shim output must
    import the package that now provides Apex's names.

Fix safety
    Safe: the shim rewrite changes only which module is loaded, and the native one removes
    only imports with no read left. A leftover use sends the file to the shim instead of
    leaving an import that would fail.

Example
    try:
        from apex import amp
    except ImportError:
        amp = None
becomes nothing once every use of `amp` was rewritten natively, and
`from amp_shim import amp` inside the same `try` under the shim target.

Soundness
    Shim target: `amp_shim` exports Apex's names with Apex's behaviour, so pointing the imports
    at it changes what module is loaded and nothing the program does. Native target: an import
    is removed only when no read of its names is left, and any Apex use that no rule rewrote is
    reported and sends the file to the shim, so a native output never runs part Apex, part
    native. A guard's handler goes only when what is left of its `try:` body (`pass`,
    `NAME = <constant>`) cannot raise: the handler can never run, so removing it changes
    nothing, and the program behaves as it did where Apex imported. The `else:` arm ran exactly
    then, and its exceptions were never the handlers', so it runs in the `try:`'s place (inside
    a `try:`/`finally:` when there is a `finally:` arm). A body that still holds anything else
    (another import, a call) keeps its `try:` as it is: that may still raise ImportError.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union, cast

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ScopeProvider

from ..analysis.binding import APEX, is_apex_name, read_names
from ..analysis.import_guards import apex_import, settled_try
from ..diagnostics import Severity, define
from ..plan.types import pure
from .base import Rule, add_requested_imports
from .facts import Fact

SHIM = "amp_shim"

UNSUPPORTED = define(
    "AMP900",
    "apex-use-not-migrated",
    Severity.WARNING,
    "This Apex use has no provably right native form; the file uses the shim.",
    "Native output must train exactly as the Apex code did, or in the documented way it "
    "differs. Uses that no rule understands (Apex internals such as `amp._amp_state`, "
    "optimizers without a torch equivalent, code that passes Apex objects around) would need "
    "judgement, so `--target auto` rewrites the file's imports to the shim instead, which "
    "keeps Apex's behaviour. Migrate the named use by hand, then run amp-migrate again. "
    "The message says which case this is: an import is still needed because a use of it has no "
    "native rule, or a use has no native equivalent amp-migrate can prove right.",
    before="from apex import amp\nscaler = amp._amp_state.loss_scalers[0]",
    after="from amp_shim import amp\nscaler = amp._amp_state.loss_scalers[0]",
    falls_back=True,
    refusal="an Apex use no rule can prove right natively",
    variants=(
        "no native rule",
        "can prove right",
    ),
    fallback_title="an Apex use with no native rule",
    shape=(
        "A module kept for its Apex import although nothing in it has a native form amp-migrate can prove: a "
        "framework's context object that forwards `amp.initialize` options from its users (`**kwargs`), a "
        "test fixture that imports `apex` for the framework's own amp switch, `apex.reparameterization`, "
        "`apex.contrib` kernels."
    ),
    fallback_why=(
        "A native rewrite needs both ends of each Apex use; these files are one end of an API whose other "
        "end (the framework's users, the contrib kernel) the tree does not show, or Apex code with no torch "
        "equivalent."
    ),
    by_hand="Use the framework's native AMP switch where it has one; keep the shim for the rest.",
)

SHIM_NAME_MISSING = define(
    "AMP470",
    "shim-name-missing",
    Severity.ERROR,
    "An Apex module or name this file uses does not exist in the shim; the file was left untouched.",
    "The shim target only points imports at `amp_shim`, which provides `apex.amp`, "
    "`apex.fp16_utils`, `apex.optimizers`, `apex.parallel` and `apex.normalization` as of "
    "Apex's last release. Names that older releases had (`apex.optimizers.FP16_Optimizer`, "
    "`apex.reparameterization`) or that live elsewhere in Apex (`apex.contrib`, fused "
    "autograd functions) would fail at import or when read, so no output is written: every "
    "name the shim target emits is checked against what `amp_shim` really exports. Migrate "
    "the named use by hand (e.g. to `torch.nn.utils.parametrizations.weight_norm`, or to the "
    "shim's `amp_shim.fp16_utils.FP16_Optimizer` after checking its behaviour), then run again.",
    before="from apex.optimizers import FP16_Optimizer",
    after="from apex.optimizers import FP16_Optimizer  # unchanged: amp_shim.optimizers has none",
    refusal="an Apex module or name missing from the release the shim reproduces",
)
SHIM_ARGUMENT_REJECTED = define(
    "AMP471",
    "shim-argument-rejected",
    Severity.ERROR,
    "A call passes an Apex class or function an argument the shim's version does not take; "
    "the file was left untouched.",
    "`amp_shim` has the signatures of Apex's last release. Older releases took arguments it "
    "dropped, e.g. FusedAdam's `max_grad_norm=` and `eps_inside_sqrt=` (pre-2019 FusedAdam, "
    "which clipped by the gradient norms the old `apex.optimizers.FP16_Optimizer` passed to "
    "its `step`); under the shim the call would raise TypeError, so no output is written. "
    "Remove the argument (clip with `torch.nn.utils.clip_grad_norm_` where it clipped) and "
    "run again.",
    before="optimizer = FusedAdam(params, lr=1e-4, bias_correction=False, max_grad_norm=1.0)",
    after="optimizer = FusedAdam(params, lr=1e-4, bias_correction=False, max_grad_norm=1.0)  # unchanged",
    refusal="an argument the release the shim reproduces does not take",
)


def shim_module_name(name: str) -> str:
    return SHIM + name[len(APEX) :]


def _dotted(name: str) -> Union[cst.Name, cst.Attribute]:
    # A dotted module name parses to a name or a chain of attributes.
    return cast(Union[cst.Name, cst.Attribute], cst.parse_expression(name))


class ShimImports(Rule):
    """`apex` → `amp_shim` in import statements, and nowhere else."""

    HANDLES = ("apex",)
    EMITS = (SHIM_NAME_MISSING, SHIM_ARGUMENT_REJECTED)
    READS = frozenset[Fact]()
    WRITES = frozenset({Fact.IMPORTS_SETTLED})
    ACTS_ON = (cst.If, cst.Try, cst.SimpleStatementLine)  # what leave_node removes or settles

    def interest(self):
        return None if self.state.apex_words is None else frozenset({APEX})

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        names = []
        for alias in updated_node.names:
            full = get_full_name_for_node(alias.name) or ""
            if not is_apex_name(full):
                names.append(alias)
                continue
            if alias.asname is not None:
                names.append(alias.with_changes(name=_dotted(shim_module_name(full))))
            else:  # `import apex.amp` binds `apex`: bind the shim package to that name
                names.append(alias.with_changes(name=cst.Name(SHIM), asname=cst.AsName(name=cst.Name(APEX))))
        return updated_node.with_changes(names=names)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        if updated_node.relative or updated_node.module is None:
            return updated_node
        full = get_full_name_for_node(updated_node.module) or ""
        if not is_apex_name(full):
            return updated_node
        return updated_node.with_changes(module=_dotted(shim_module_name(full)))


def _emptied(original: cst.CSTNode, updated: cst.CSTNode) -> bool:
    """An `if` (no `else`, a side-effect-free test) whose body this pass removed entirely."""
    return (
        isinstance(original, cst.If)
        and isinstance(updated, cst.If)
        and original.orelse is None
        and isinstance(updated.body, cst.IndentedBlock)
        and not updated.body.body
        and bool(original.body.body)
        and pure(original.test)
    )


class SettleImports(Rule):
    """Drop Apex imports nothing reads (and their guards), add the imports rules asked for."""

    HANDLES = ("apex",)
    EMITS = ()
    READS = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.AVAILABILITY_SETTLED, Fact.IMPORT_REQUESTS})
    WRITES = frozenset({Fact.IMPORTS_SETTLED})

    def interest(self):
        return None if self.state.apex_words is None else frozenset({APEX})

    @classmethod
    def applies(cls, state, context) -> bool:
        return bool(context.scratch.get(AddImportsVisitor.CONTEXT_KEY)) or super().applies(state, context)

    _read: Optional[set[str]] = None

    def _reads(self) -> set[str]:
        """Names read anywhere. When the imports alone bind every Apex name (the binder's
        table), a read of the name is a read of the import; reads spell an Apex word."""
        if self._read is None:
            self._read = read_names(self._wrapped_module(), self.state.skipping(self.state.apex_words))
        return self._read

    def _unused(self, stmt: cst.CSTNode) -> bool:
        """An Apex import statement none of whose bound names is read anywhere."""
        if not apex_import(stmt):
            return False
        body = cast(  # what `apex_import` accepted
            Sequence[Union[cst.Import, cst.ImportFrom]],
            stmt.body if isinstance(stmt, cst.SimpleStatementLine) else [stmt],
        )
        if self.apex is not None and self.apex.table is not None:
            for small in body:
                if isinstance(small.names, cst.ImportStar):
                    return False
                if any(
                    (alias.evaluated_alias or alias.evaluated_name.split(".")[0]) in self._reads()
                    for alias in small.names
                ):
                    return False
            return True
        assert self.apex is not None, "the binder is set before the walk"
        for small in body:
            if not isinstance(small.names, cst.ImportStar):
                known = [self.apex.import_is_read(alias) for alias in small.names]
                if None not in known:  # the flow of a rebound name says which reads see it
                    if any(known):
                        return False
                    continue
            scope = self.get_metadata(ScopeProvider, small, None)
            if scope is None or isinstance(small.names, cst.ImportStar):
                return False
            for alias in small.names:
                bound = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
                for assignment in scope.assignments[bound]:
                    if getattr(assignment, "node", None) is small and assignment.references:
                        return False
        return True

    def _dead_guard(self, node: cst.CSTNode) -> bool:
        """`if cond: <apex imports>`, all unused."""
        return (
            isinstance(node, cst.If)
            and node.orelse is None
            and bool(node.body.body)
            and all(self._unused(s) for s in node.body.body)
        )

    def leave_node(self, original_node, updated_node):
        if self._dead_guard(original_node):
            return cst.RemoveFromParent()
        if isinstance(original_node, cst.Try):
            settled = settled_try(original_node, updated_node, self._unused)
            if settled is not None:
                return settled
        if isinstance(original_node, cst.SimpleStatementLine) and self._unused(original_node):
            return cst.RemoveFromParent()
        if _emptied(original_node, updated_node):
            return cst.RemoveFromParent()  # `if args.fp16:` that held only an Apex import guard
        return super().leave_node(original_node, updated_node)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        if AddImportsVisitor.CONTEXT_KEY in self.context.scratch:
            tree = add_requested_imports(self.context, tree, self.state.index)
        return tree


class RemainingApexUses(Rule):
    """Whatever Apex use survived the native rules is not understood: fall back."""

    HANDLES = ()
    EMITS = (UNSUPPORTED,)
    READS = frozenset({Fact.FALLBACK_REASONS, Fact.IMPORTS_SETTLED})
    WRITES = frozenset({Fact.FALLBACK_REASONS})

    @classmethod
    def applies(cls, state, context) -> bool:
        # A file already falling back names its reasons; leftovers would only repeat them.
        return not state.falls_back and super().applies(state, context)

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            if is_apex_name(get_full_name_for_node(alias.name) or ""):
                self.report(
                    node,
                    UNSUPPORTED,
                    f"`import {get_full_name_for_node(alias.name)}` is still needed: "
                    "a use of it has no native rule",
                )
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.module is not None and not node.relative:
            name = get_full_name_for_node(node.module) or ""
            if is_apex_name(name):
                self.report(
                    node,
                    UNSUPPORTED,
                    f"`from {name} import ...` is still needed: a use of it has no native rule",
                )
        return False

    def visit_Name(self, node: cst.Name) -> Optional[bool]:
        self._check(node)
        return None

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self._check(node):
            node.value.visit(self)  # `x.amp`: the attribute name is no read of `amp`
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # `f(amp=1)`: the keyword is no read of `amp`
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return not isinstance(node.target, cst.Name)  # a plain target binds, it does not read

    def _check(self, node: cst.CSTNode) -> bool:
        name = self.apex_name(node)
        if name is None:
            return False
        self.report(node, UNSUPPORTED, f"`{name}` has no native equivalent amp-migrate can prove right")
        return True
