"""Deprecated torch AMP spellings: `torch.cuda.amp.*` and `torch.cpu.amp.*` → `torch.amp`.

What it does
    Rewrites torch's own deprecated mixed-precision API to the device-generic one:

    - `torch.cuda.amp.autocast(...)` → `torch.autocast("cuda", dtype=torch.float16, ...)`,
      `torch.cpu.amp.autocast(...)` → `torch.autocast("cpu", dtype=torch.bfloat16, ...)`
    - `torch.cuda.amp.GradScaler(...)` → `torch.amp.GradScaler("cuda", ...)` (and `"cpu"`)
    - `torch.cuda.amp.custom_fwd` / `custom_bwd` (bare or called) →
      `torch.amp.custom_fwd(device_type="cuda", ...)` / `torch.amp.custom_bwd(device_type="cuda")`
    - the same names as type references (annotations, `isinstance`) → `torch.autocast`,
      `torch.amp.GradScaler`

    whatever the file calls them (`from torch.cuda.amp import autocast as ac`,
    `from torch.cuda import amp`, `import torch.cuda.amp as tamp`), and removes the old imports
    that nothing reads any more. The device comes from the old spelling, never from
    `--device`. It runs on every file, Apex or not, and in every target: the shim target
    too, since a file left with deprecated spellings would be rewritten by the next run
    (shim output must be final, like native output).

Why
    The `torch.cuda.amp` / `torch.cpu.amp` entry points have warned `FutureWarning` since
    torch 2.4 and are thin wrappers around `torch.amp`. Many migrations off Apex stopped at
    them; finishing the job leaves one spelling in the code base.

Soundness
    The deprecated `torch.cuda.amp` / `torch.cpu.amp` entry points are thin wrappers that call
    `torch.amp` with a fixed device and default dtype; the rewrite calls the same function with
    those values written out (positional arguments become keywords, the old default dtype is
    passed explicitly because `torch.autocast` without one would inherit an enclosing region's),
    so every call does what it did.

Fix safety
    Safe: every rewrite calls what the deprecated wrapper called, with the same values:

    - The old autocast's `__init__(enabled=True, dtype=<float16|bfloat16>, cache_enabled=True)`
      takes its arguments in another order than `torch.autocast(device_type, dtype, enabled,
      cache_enabled)`: positional arguments become keywords. The old default dtype is written
      out, because `torch.autocast` without `dtype` inherits the dtype of an enclosing autocast
      region (and `torch.set_autocast_dtype`), which the old class never did. `cache_enabled`
      is not written out: it only decides whether cast weights are cached, not any value.
    - `torch.amp.GradScaler(device, init_scale, growth_factor, backoff_factor,
      growth_interval, enabled)` is the old signature with the device in front, so positional
      arguments keep their meaning one place later.
    - `torch.cuda.amp.custom_fwd(...)` is, in torch itself,
      `torch.amp.custom_fwd(..., device_type="cuda")`.

    Every name the rewrite introduces is fully dotted from `torch`, and `import torch` is added
    where the file lacks it; a site where `torch` means something else is left alone. A
    reference that is neither called, decorating, nor a type (`ctx = torch.cuda.amp.autocast`)
    has no provably right replacement (it may be called with positional arguments in the old
    order later) and is left as it is, with a warning.

Example
    Before::

        from torch.cuda.amp import GradScaler, autocast
        scaler = GradScaler(2.0**12)
        with autocast(enabled=use_amp):
            loss = model(x)

    After::

        import torch
        scaler = torch.amp.GradScaler("cuda", 2.0**12)
        with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
            loss = model(x)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Iterable, Optional, Sequence, Union, cast

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_absolute_module_from_package_for_import, get_full_name_for_node
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider

from ..analysis.binding import DEPRECATED_AMP_MODULES, NOTHING
from ..analysis.source_index import SourceIndex, pruning_enabled
from ..diagnostics import Code, Severity, define
from .base import FileState, Rule, add_requested_imports, may_read_names, metadata_without_copy
from .facts import Fact

AUTOCAST_FIXED = define(
    "AMP601",
    "deprecated-autocast",
    Severity.INFO,
    "`torch.cuda.amp.autocast(...)` / `torch.cpu.amp.autocast(...)` became "
    "`torch.autocast(device, dtype=..., ...)`.",
    "The device-specific autocast classes are deprecated (a `FutureWarning` since torch 2.4) "
    "wrappers around `torch.autocast`. Their arguments come in another order "
    "(`enabled, dtype, cache_enabled`), so positional arguments are written as keywords. "
    "Their default dtype (float16 on CUDA, bfloat16 on CPU) is written out because "
    "`torch.autocast` without `dtype` inherits the dtype of an enclosing autocast region, "
    "which the old classes did not. `cache_enabled` is left to its default: it only decides "
    "whether cast weights are cached inside the region, never a value.",
    before="with torch.cuda.amp.autocast(use_amp):\n    out = model(x)",
    after='with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):\n    out = model(x)',
)
GRAD_SCALER_FIXED = define(
    "AMP602",
    "deprecated-grad-scaler",
    Severity.INFO,
    "`torch.cuda.amp.GradScaler(...)` / `torch.cpu.amp.GradScaler(...)` became "
    "`torch.amp.GradScaler(device, ...)`.",
    "The device-specific scalers are deprecated subclasses of `torch.amp.GradScaler` that only "
    "pass their device. The new signature is the old one with the device in front, so every "
    "argument keeps its meaning.",
    before="scaler = torch.cuda.amp.GradScaler(2.0**12, enabled=use_amp)",
    after='scaler = torch.amp.GradScaler("cuda", 2.0**12, enabled=use_amp)',
)
CUSTOM_FWD_BWD_FIXED = define(
    "AMP603",
    "deprecated-custom-fwd-bwd",
    Severity.INFO,
    "`torch.cuda.amp.custom_fwd` / `custom_bwd` became `torch.amp.custom_fwd` / `custom_bwd` "
    'with `device_type="cuda"`.',
    "The CUDA-specific decorators are deprecated and defined in torch as the generic ones with "
    '`device_type="cuda"`. The generic ones take `device_type` as a required keyword, so the '
    "bare decorator `@custom_fwd` becomes a call.",
    before="@staticmethod\n@custom_fwd(cast_inputs=torch.float32)\ndef forward(ctx, x): ...",
    after='@staticmethod\n@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)\n'
    "def forward(ctx, x): ...",
    variants=("device_type=",),
)
TYPE_REFERENCE_FIXED = define(
    "AMP604",
    "deprecated-amp-type-reference",
    Severity.INFO,
    "A deprecated autocast or GradScaler class used as a type became its `torch.amp` base class.",
    "Migrated constructions build `torch.amp.GradScaler` (or `torch.autocast`) objects, which "
    "are not instances of the deprecated subclasses, so annotations and "
    "`isinstance` checks must name the base class. The base class also matches objects of "
    "other devices; check the rewritten `isinstance` if the file tells devices apart that way.",
    before="def step(scaler: torch.cuda.amp.GradScaler): ...",
    after="def step(scaler: torch.amp.GradScaler): ...",
    variants=("base class",),
)
REFERENCE_KEPT = define(
    "AMP605",
    "deprecated-amp-reference-kept",
    Severity.WARNING,
    "A deprecated `torch.cuda.amp` / `torch.cpu.amp` name is used in a way with no provably "
    "right rewrite; it was left as it is.",
    "The deprecated names still work (with a `FutureWarning`), so the file is correct as it "
    "is, but it was not finished. A name that is stored or passed instead of called "
    "(`ctx = torch.cuda.amp.autocast if amp else nullcontext`) may be called later with "
    "positional arguments in the old order, which `torch.autocast` reads differently; autocast "
    "calls with `*args`/`**kwargs` hide which argument is which; a name imported from either "
    "API (`try: from torch.amp import GradScaler / except ImportError: from torch.cuda.amp "
    "import GradScaler`) is called for both; and `torch` may mean something else where the "
    "call is. Rewrite the named use by hand, e.g. with "
    '`functools.partial(torch.autocast, "cuda", dtype=torch.float16)` when it is only called '
    "with keyword arguments.",
    before="ctx = torch.cuda.amp.autocast if use_amp else contextlib.nullcontext",
    after="ctx = torch.cuda.amp.autocast if use_amp else contextlib.nullcontext  # unchanged",
)

_DEPRECATED_MODULES = DEPRECATED_AMP_MODULES
_DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}
_OLD_AUTOCAST_PARAMS = ("enabled", "dtype", "cache_enabled")


@dataclass(frozen=True)
class Deprecated:
    """One deprecated torch AMP object, and the device its spelling implies."""

    old: str
    kind: str  # "autocast" | "GradScaler" | "custom_fwd" | "custom_bwd"
    device: str


def _table() -> dict[str, Deprecated]:
    entries = {
        "autocast": ("autocast", "autocast_mode.autocast"),
        "GradScaler": ("GradScaler", "grad_scaler.GradScaler"),
        "custom_fwd": ("custom_fwd", "autocast_mode.custom_fwd"),
        "custom_bwd": ("custom_bwd", "autocast_mode.custom_bwd"),
    }
    table = {}
    for device in ("cuda", "cpu"):
        for kind, spellings in entries.items():
            if device == "cpu" and kind in ("custom_fwd", "custom_bwd"):
                continue  # torch.cpu.amp never had them
            for spelling in spellings:
                old = f"torch.{device}.amp.{spelling}"
                table[old] = Deprecated(old, kind, device)
    return table


DEPRECATED = _table()
_AMBIGUOUS = Deprecated("", "", "")

_TYPE_CHECK = m.Call(func=m.Name("isinstance") | m.Name("issubclass"))


def _in_deprecated_module(name: str) -> bool:
    return any(name == d or name.startswith(d + ".") for d in _DEPRECATED_MODULES)


def _dotted(name: str) -> Union[cst.Name, cst.Attribute]:
    # A dotted module name parses to a name or a chain of attributes.
    return cast(Union[cst.Name, cst.Attribute], cst.parse_expression(name))


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def _insert_args(call: cst.Call, index: int, new: Sequence[cst.Arg]) -> cst.Call:
    """`call` with `new` inserted before its argument `index`, in the call's layout.

    Arguments that start on their own line after `(` get one line each; otherwise they are
    separated by `, `. A trailing comma stays trailing.
    """
    args = list(call.args)
    if args and isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        after = call.whitespace_before_args.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        sep = cst.Comma(whitespace_after=after)
    else:
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = [arg.with_changes(comma=sep) for arg in new]
    if index < len(args):
        return call.with_changes(args=args[:index] + new + args[index:])
    if args:
        last = args[-1]
        new[-1] = new[-1].with_changes(comma=last.comma)
        args[-1] = last.with_changes(comma=sep)
    else:
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args + new)


def _binds_torch_module(assignment) -> bool:
    """Whether a scope assignment of the name `torch` is an import of the torch package."""
    node = getattr(assignment, "node", None)
    if not isinstance(node, cst.Import):
        return False
    for alias in node.names:
        name = get_full_name_for_node(alias.name) or ""
        if alias.asname is None and name.split(".")[0] == "torch":
            return True
        if alias.asname is not None and alias.evaluated_alias == "torch" and name == "torch":
            return True
    return False


class DeprecatedTorchAmp(Rule):
    """`torch.cuda.amp.*` / `torch.cpu.amp.*` → `torch.autocast` / `torch.amp.*`."""

    HANDLES = tuple(DEPRECATED)
    EMITS = (AUTOCAST_FIXED, GRAD_SCALER_FIXED, CUSTOM_FWD_BWD_FIXED, TYPE_REFERENCE_FIXED, REFERENCE_KEPT)
    READS = frozenset[Fact]()
    WRITES = frozenset({Fact.IMPORT_REQUESTS})

    #: torch's own deprecated API, Apex or not; `from torch.cuda import amp` spells no
    #: `cuda.amp`.
    MARKERS = ("cuda.amp", "cpu.amp", "torch.cuda import", "torch.cpu import")

    def __init__(self, context: CodemodContext, state: FileState) -> None:
        super().__init__(context, state)
        self.changed = False
        self.imports: list[tuple[str, Optional[str], Optional[str]]] = []
        self.plain_imports: set[str] = set()  # `import torch.cuda.amp` (binds `torch`)

    def interest(self) -> Optional[Iterable[str]]:
        return self.qualifying_words("amp", "torch")

    def scope_questions(self):
        # `deprecated` asks about names on lines that spell an `amp` word, starting with a
        # name that can be torch's; `torch_is_module`, what `torch` is bound to.
        index = self.state.index
        names = index.root_words("torch") if index else None
        asked = self.qualifying_words("amp", "torch")
        return None if asked is None or names is None else (asked, names)

    # -- what a node means ------------------------------------------------------------------
    def deprecated(self, node: cst.CSTNode) -> Optional[Deprecated]:
        """The deprecated object `node` names, `_AMBIGUOUS` if it may also be another, else None."""
        if not (
            self.may_start_with(node, "torch")
            and self.may_qualify_as(node, "amp", "torch")
            and (self.may_qualify_as(node, "cuda", "torch") or self.may_qualify_as(node, "cpu", "torch"))
        ):
            return None  # no scope analysis for names that cannot be `torch.{cuda,cpu}.amp.*`
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        ours = sorted((DEPRECATED[n] for n in names if n in DEPRECATED), key=lambda d: d.old)
        if not ours:
            return None
        if len(ours) < len(names) or len({(d.kind, d.device) for d in ours}) > 1:
            return _AMBIGUOUS
        return ours[0]

    def torch_is_module(self, node: cst.CSTNode) -> bool:
        """`torch` at `node` is the torch package, or unbound (then `import torch` is added)."""
        scope = self.get_metadata(ScopeProvider, node, None)
        if scope is None or "torch" not in scope:
            return True
        return all(_binds_torch_module(a) for a in scope["torch"])

    def fixed(self, node: cst.CSTNode, code: Code, message: str) -> None:
        self.report(node, code, message)
        self.changed = True

    def kept(self, node: cst.CSTNode, message: str) -> None:
        self.report(node, REFERENCE_KEPT, message, fixed=False)

    # -- imports: remember them, to remove the ones nothing reads afterwards ---------------
    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = get_full_name_for_node(alias.name) or ""
            if _in_deprecated_module(name):
                if alias.asname is None:
                    self.plain_imports.add(name)
                else:
                    self.imports.append((name, None, alias.evaluated_alias))
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return False
        module = get_full_name_for_node(node.module) or ""
        for alias in node.names:
            full = f"{module}.{alias.evaluated_name}"
            if full in DEPRECATED or full in _DEPRECATED_MODULES:
                self.imports.append((module, alias.evaluated_name, alias.evaluated_alias))
        return False

    # -- calls ------------------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        old = self.deprecated(original_node.func)
        if old is None:
            return updated_node
        if old is _AMBIGUOUS:
            self.kept(
                original_node,
                "this name may be a deprecated torch AMP object or another "
                "one, depending on which import ran; left as it is",
            )
            return updated_node
        if not self.torch_is_module(original_node):
            self.kept(
                original_node, f"`torch` here is not the torch package, so `{old.old}` was left as it is"
            )
            return updated_node
        if old.kind == "autocast":
            return self.autocast(original_node, updated_node, old)
        if old.kind == "GradScaler":
            self.fixed(
                original_node,
                GRAD_SCALER_FIXED,
                f'`{old.old}(...)` → `torch.amp.GradScaler("{old.device}", ...)`',
            )
            return _insert_args(
                updated_node.with_changes(func=_dotted("torch.amp.GradScaler")),
                0,
                [cst.Arg(_string(old.device))],
            )
        return self.custom_fwd_bwd(original_node, updated_node, old)

    def autocast(
        self, original_node: cst.Call, updated_node: cst.Call, old: Deprecated
    ) -> cst.BaseExpression:
        """Positional arguments become keywords; the old default dtype is written out."""
        args: list[cst.Arg] = []
        for index, arg in enumerate(updated_node.args):
            if arg.star:
                self.kept(
                    original_node,
                    f"`{old.old}` is called with `{arg.star}` arguments, "
                    "which may pass the dtype twice once it is written "
                    "out; left as it is",
                )
                return updated_node
            if arg.keyword is None:
                if index >= len(_OLD_AUTOCAST_PARAMS):
                    self.kept(
                        original_node,
                        f"`{old.old}` is called with more positional arguments than it takes; left as it is",
                    )
                    return updated_node
                arg = arg.with_changes(
                    keyword=cst.Name(_OLD_AUTOCAST_PARAMS[index]),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                    ),
                )
            args.append(arg)
        new = [cst.Arg(_string(old.device))]
        if not any(arg.keyword.value == "dtype" for arg in args if arg.keyword is not None):
            new.append(_keyword("dtype", _dotted(f"torch.{_DEFAULT_DTYPE[old.device]}")))
        self.fixed(original_node, AUTOCAST_FIXED, f'`{old.old}(...)` → `torch.autocast("{old.device}", ...)`')
        call = updated_node.with_changes(func=_dotted("torch.autocast"), args=args)
        return _insert_args(call, 0, new)

    def custom_fwd_bwd(
        self, original_node: cst.Call, updated_node: cst.Call, old: Deprecated
    ) -> cst.BaseExpression:
        """`device_type` goes after the positional arguments, before any keyword."""
        index = next(
            (i for i, arg in enumerate(updated_node.args) if arg.keyword is not None or arg.star == "**"),
            len(updated_node.args),
        )
        self.fixed(
            original_node,
            CUSTOM_FWD_BWD_FIXED,
            f'`{old.old}` → `torch.amp.{old.kind}(device_type="{old.device}")`',
        )
        call = updated_node.with_changes(func=_dotted(f"torch.amp.{old.kind}"))
        return _insert_args(call, index, [_keyword("device_type", _string(old.device))])

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        """The bare `@custom_fwd` / `@custom_bwd` becomes a call: `device_type` is required."""
        old = self.deprecated(original_node.decorator)
        if (
            old is None
            or old is _AMBIGUOUS
            or old.kind not in ("custom_fwd", "custom_bwd")
            or not m.matches(original_node.decorator, m.Name() | m.Attribute())
        ):
            return updated_node
        if not self.torch_is_module(original_node):
            self.kept(
                original_node.decorator,
                f"`torch` here is not the torch package, so `@{old.old}` was left as it is",
            )
            return updated_node
        self.fixed(
            original_node.decorator,
            CUSTOM_FWD_BWD_FIXED,
            f'`@{old.old}` → `@torch.amp.{old.kind}(device_type="{old.device}")`',
        )
        return updated_node.with_changes(
            decorator=cst.Call(
                func=_dotted(f"torch.amp.{old.kind}"), args=[_keyword("device_type", _string(old.device))]
            )
        )

    # -- references that are not calls ------------------------------------------------------
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        parent = self.parent(original_node)
        if isinstance(parent, cst.Attribute) and parent.attr is original_node:
            return updated_node
        return self.reference(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self.reference(original_node, updated_node)

    def reference(
        self, original_node: Union[cst.Name, cst.Attribute], updated_node: cst.BaseExpression
    ) -> cst.BaseExpression:
        old = self.deprecated(original_node)
        if old is None:
            return updated_node
        parent = self.parent(original_node)
        if isinstance(parent, cst.Call) and parent.func is original_node:
            return updated_node  # leave_Call
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(original_node)):
            return updated_node
        if (
            isinstance(parent, cst.Decorator)
            and old is not _AMBIGUOUS
            and old.kind in ("custom_fwd", "custom_bwd")
        ):
            return updated_node  # leave_Decorator
        spelled = get_full_name_for_node(original_node)
        if old is _AMBIGUOUS:
            self.kept(
                original_node,
                f"`{spelled}` may be a deprecated torch AMP object or "
                "another one, depending on which import ran; left as it is",
            )
            return updated_node
        if (
            old.kind in ("autocast", "GradScaler")
            and self.is_type_position(original_node)
            and self.torch_is_module(original_node)
        ):
            new = "torch.autocast" if old.kind == "autocast" else "torch.amp.GradScaler"
            self.fixed(
                original_node,
                TYPE_REFERENCE_FIXED,
                f"`{spelled}` as a type → `{new}`, its base class (which also matches other devices)",
            )
            return _dotted(new)
        meaning = "" if spelled == old.old else f" (`{old.old}`)"
        self.kept(
            original_node,
            f"`{spelled}`{meaning} is used without being called; it has "
            "no provably right rewrite and was left as it is",
        )
        return updated_node

    def is_type_position(self, node: cst.CSTNode) -> bool:
        """In an annotation, or the class argument of `isinstance`/`issubclass`."""
        if any(isinstance(a, cst.Annotation) for a in self.ancestors(node)):
            return True
        ancestor = self.parent(node)
        while isinstance(ancestor, (cst.Element, cst.Tuple)):
            ancestor = self.parent(ancestor)
        if not isinstance(ancestor, cst.Arg):
            return False
        call = self.parent(ancestor)
        return (
            isinstance(call, cst.Call)
            and m.matches(call, _TYPE_CHECK)
            and len(call.args) == 2
            and call.args[1] is ancestor
        )

    # -- the whole file ---------------------------------------------------------------------
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        if not self.changed:
            return tree
        if self.imports and not self.plain_imports and not _imports_torch(tree):
            tree = _import_torch_before_deprecated_import(tree, self.state.index)
        AddImportsVisitor.add_needed_import(self.context, "torch")
        if self.imports:
            tree = remove_unused_imports(tree, self.imports, self.state.index)
        if self.plain_imports and not _reads_deprecated_names(tree):
            tree = tree.visit(
                _PlainImportsToTorch(self.plain_imports, _imports_torch(tree), self.state.index)
            )
        # SettleImports only runs on files that mention Apex; this rule's files need not.
        return add_requested_imports(self.context, tree, self.state.index)


_IMPORT_LINE = m.SimpleStatementLine(body=[m.AtLeastN(m.Import() | m.ImportFrom(), n=1)])


Removal = tuple[str, Optional[str], Optional[str]]  # module, object, alias


def remove_unused_imports(
    tree: cst.Module, removals: Sequence[Removal], index: Optional[SourceIndex]
) -> cst.Module:
    """What `RemoveImportsVisitor` with these removals makes of `tree` (and the blank line a
    function body would start with when its first import goes, dropped). When no name the
    removals bind is read anywhere (`may_read_names`), the visitor's scope analysis of the
    whole file could find no use either, and the imports go without it."""
    pruned = index is not None and pruning_enabled()
    skip = cast(SourceIndex, index).skipped({"import"}) if pruned else NOTHING
    names = {alias or obj or module.split(".")[0] for module, obj, alias in removals}
    if pruned and names and not may_read_names(tree, names, cast(SourceIndex, index)):
        return tree.visit(_DropImports(removals, index, skip))
    context = CodemodContext()
    for module, obj, alias in removals:
        RemoveImportsVisitor.remove_unused_import(context, module, obj, alias)
    return _RemoveUnusedImports(context, index, skip).transform_module(tree)


class _KeepIdentity(cst.CSTTransformer):
    """A transform that hands back the very node it got wherever nothing below it changed,
    passes a replaced statement's place in the file on to its replacement, so that the rules
    after this one still place their diagnostics on the original lines, and does not enter
    the statements in `skip` (which hold nothing it changes)."""

    def keep_identity(self, index: Optional[SourceIndex], skip: AbstractSet[int] = NOTHING) -> None:
        self.source_index = index
        self.skip = skip
        self.changed_below: list[bool] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.skip:
            return False
        self.changed_below.append(False)
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        if id(original_node) in self.skip:
            return original_node
        children_changed = self.changed_below.pop()
        result = super().on_leave(original_node, updated_node)
        if result is updated_node and not children_changed:
            return original_node
        if self.changed_below:
            self.changed_below[-1] = True
        if self.source_index is not None:
            self.source_index.inherit(original_node, result)
        return result


class _ImportRemoval(_KeepIdentity):
    """Unused-import removal, without the blank line a function body would start with when
    the import it started with goes."""

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = original_node.body
        if (
            len(body) > 1
            and updated_node.body
            and m.matches(body[0], _IMPORT_LINE)
            and updated_node.body[0].deep_equals(body[1])
        ):
            # A statement line (it equals the original's second line).
            first = cast(Union[cst.SimpleStatementLine, cst.BaseCompoundStatement], updated_node.body[0])
            kept = [line for line in first.leading_lines if line.comment is not None]
            moved = first.with_changes(leading_lines=kept)
            if self.source_index is not None:
                self.source_index.inherit(first, moved)
            return updated_node.with_changes(body=[moved, *updated_node.body[1:]])
        return updated_node


class _RemoveUnusedImports(_ImportRemoval, RemoveImportsVisitor):
    """libcst's unused-import removal, on the tree itself (no defensive copy)."""

    def __init__(self, context: CodemodContext, index: Optional[SourceIndex], skip: AbstractSet[int]) -> None:
        RemoveImportsVisitor.__init__(self, context)
        self.keep_identity(index, skip)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        with metadata_without_copy(self, tree) as module:
            return self.transform_module_impl(module)


class _DropImports(_ImportRemoval):
    """What `RemoveImportsVisitor` does to import statements when none of the names it
    removes is used: the aliases go, a comment after a removed alias's comma moves to the
    alias (or parenthesis) before it, and a statement left with no alias goes."""

    def __init__(
        self, removals: Sequence[Removal], index: Optional[SourceIndex], skip: AbstractSet[int]
    ) -> None:
        super().__init__()
        self.keep_identity(index, skip)
        # As the visitor keys them: one alias per module, the last one given.
        self.modules = {module: alias for module, obj, alias in removals if obj is None}
        self.objects: dict[str, set[tuple[str, Optional[str]]]] = {}
        for module, obj, alias in removals:
            if obj is not None:
                self.objects.setdefault(module, set()).add((obj, alias))

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import):
        names = original_node.names
        keep = [
            a
            for a in names
            if a.evaluated_name not in self.modules or a.evaluated_alias != self.modules[a.evaluated_name]
        ]
        return _kept(updated_node, names, keep, {})

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom):
        names = original_node.names
        if isinstance(names, cst.ImportStar):
            return updated_node
        module = get_absolute_module_from_package_for_import(None, updated_node)
        if module is None or module not in self.objects:
            return updated_node
        removed = self.objects[module]
        keep: list[cst.ImportAlias] = []
        updates: dict[str, object] = {}
        for alias in names:
            if (alias.evaluated_name, alias.evaluated_alias) not in removed:
                keep.append(alias)
                continue
            comma = alias.comma
            if not isinstance(comma, cst.Comma):
                continue
            if keep:
                before = keep[-1]
                if isinstance(before.comma, cst.Comma):
                    whitespace = _merge_whitespace_after(
                        before.comma.whitespace_after, comma.whitespace_after
                    )
                    keep[-1] = before.with_deep_changes(before.comma, whitespace_after=whitespace)
                else:
                    keep[-1] = before.with_changes(comma=comma)
            elif isinstance(updated_node.lpar, cst.LeftParen):
                lpar = updated_node.lpar
                whitespace = _merge_whitespace_after(lpar.whitespace_after, comma.whitespace_after)
                updates["lpar"] = lpar.with_changes(whitespace_after=whitespace)
        return _kept(updated_node, names, keep, updates)


def _kept(updated_node, names: Sequence[cst.ImportAlias], keep: list[cst.ImportAlias], updates: dict):
    """The import statement with only the aliases in `keep`, as RemoveImportsVisitor writes it."""
    if len(keep) == len(names):
        return updated_node
    if not keep:
        return cst.RemoveFromParent()
    if keep[-1] is not names[-1]:
        keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated_node.with_changes(names=keep, **updates)


def _merge_whitespace_after(
    left: cst.BaseParenthesizableWhitespace, right: cst.BaseParenthesizableWhitespace
) -> cst.BaseParenthesizableWhitespace:
    """The whitespace after the comma (or parenthesis) before a removed alias, with the
    comments that followed the removed alias's comma."""
    if not isinstance(right, cst.ParenthesizedWhitespace):
        return left
    if not isinstance(left, cst.ParenthesizedWhitespace):
        return right
    return left.with_changes(
        empty_lines=tuple(line for line in right.empty_lines if line.comment is not None)
    )


def _reads_deprecated_names(tree: cst.Module) -> bool:
    """Whether anything outside import statements still names `torch.{cuda,cpu}.amp`."""
    finder = _DeprecatedNameFinder()
    MetadataWrapper(tree, unsafe_skip_copy=True).visit(finder)
    return finder.found


class _DeprecatedNameFinder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute)):
            for q in self.get_metadata(QualifiedNameProvider, node, set()):
                if _in_deprecated_module(q.name):
                    self.found = True
        return not self.found and super().on_visit(node)


def _is_deprecated_import(stmt: cst.CSTNode) -> bool:
    if not m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
        return False
    small = cast(Union[cst.Import, cst.ImportFrom], cast(cst.SimpleStatementLine, stmt).body[0])  # as matched
    if isinstance(small, cst.ImportFrom):
        module = "" if small.relative or small.module is None else get_full_name_for_node(small.module) or ""
        names = (
            [module]
            if isinstance(small.names, cst.ImportStar)
            else [f"{module}.{a.evaluated_name}" for a in small.names]
        )
    else:
        names = [get_full_name_for_node(a.name) or "" for a in small.names]
    return any(_in_deprecated_module(n) for n in names)


def _import_torch_before_deprecated_import(tree: cst.Module, index: Optional[SourceIndex]) -> cst.Module:
    """`import torch` where the file's first deprecated AMP import is, so that it takes the
    place of the import it replaces (removed afterwards if nothing reads it any more)."""
    body = list(tree.body)
    for at, stmt in enumerate(body):
        if _is_deprecated_import(stmt):
            torch_import = cst.SimpleStatementLine(
                body=[cst.Import(names=[cst.ImportAlias(name=cst.Name("torch"))])],
                leading_lines=stmt.leading_lines,
            )
            moved = stmt.with_changes(leading_lines=[])
            if index is not None:
                index.inherit(stmt, moved)
            body[at : at + 1] = [torch_import, moved]
            return tree.with_changes(body=body)
    return tree


def _imports_torch(tree: cst.Module) -> bool:
    """Whether the module's top level has `import torch`."""
    return any(
        m.matches(
            stmt,
            m.SimpleStatementLine(
                body=[
                    m.Import(
                        names=[
                            m.ZeroOrMore(),
                            m.ImportAlias(name=m.Name("torch"), asname=None),
                            m.ZeroOrMore(),
                        ]
                    )
                ]
            ),
        )
        for stmt in tree.body
    )


class _PlainImportsToTorch(_KeepIdentity):
    """`import torch.cuda.amp` (which binds `torch`) → `import torch`, once nothing reads the
    deprecated module; dropped where the module imports torch already."""

    def __init__(self, names: set[str], imports_torch: bool, index: Optional[SourceIndex]) -> None:
        super().__init__()
        self.keep_identity(index)
        self.names = names
        self.imports_torch = imports_torch

    def leave_Import(
        self, original_node: cst.Import, updated_node: cst.Import
    ) -> Union[cst.Import, cst.RemovalSentinel]:
        aliases: list[cst.ImportAlias] = []
        for alias in updated_node.names:
            if alias.asname is None and get_full_name_for_node(alias.name) in self.names:
                if self.imports_torch or any(
                    a.asname is None and m.matches(a.name, m.Name("torch")) for a in aliases
                ):
                    continue
                alias = alias.with_changes(name=cst.Name("torch"))
            aliases.append(alias)
        if not aliases:
            return cst.RemoveFromParent()
        aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=aliases)
