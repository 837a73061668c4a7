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
    `--device`. It runs on every file, Apex or not.

Why
    The `torch.cuda.amp` / `torch.cpu.amp` entry points have warned `FutureWarning` since
    torch 2.4 and are thin wrappers around `torch.amp`. Many migrations off Apex stopped at
    them; finishing the job leaves one spelling in the code base.

Fix safety
    Every rewrite calls what the deprecated wrapper called, with the same values:

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
from typing import Optional, Sequence, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider

from ..diagnostics import Severity, define
from .base import Rule

AUTOCAST_FIXED = define(
    "AMP601", "deprecated-autocast", Severity.INFO,
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
    "AMP602", "deprecated-grad-scaler", Severity.INFO,
    "`torch.cuda.amp.GradScaler(...)` / `torch.cpu.amp.GradScaler(...)` became "
    "`torch.amp.GradScaler(device, ...)`.",
    "The device-specific scalers are deprecated subclasses of `torch.amp.GradScaler` that only "
    "pass their device. The new signature is the old one with the device in front, so every "
    "argument keeps its meaning.",
    before="scaler = torch.cuda.amp.GradScaler(2.0**12, enabled=use_amp)",
    after='scaler = torch.amp.GradScaler("cuda", 2.0**12, enabled=use_amp)',
)
CUSTOM_FWD_BWD_FIXED = define(
    "AMP603", "deprecated-custom-fwd-bwd", Severity.INFO,
    "`torch.cuda.amp.custom_fwd` / `custom_bwd` became `torch.amp.custom_fwd` / `custom_bwd` "
    "with `device_type=\"cuda\"`.",
    "The CUDA-specific decorators are deprecated and defined in torch as the generic ones with "
    "`device_type=\"cuda\"`. The generic ones take `device_type` as a required keyword, so the "
    "bare decorator `@custom_fwd` becomes a call.",
    before="@staticmethod\n@custom_fwd(cast_inputs=torch.float32)\ndef forward(ctx, x): ...",
    after='@staticmethod\n@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)\n'
          "def forward(ctx, x): ...",
)
TYPE_REFERENCE_FIXED = define(
    "AMP604", "deprecated-amp-type-reference", Severity.INFO,
    "A deprecated autocast or GradScaler class used as a type became its `torch.amp` base "
    "class.",
    "Once its constructions are migrated, an object is a `torch.amp.GradScaler` (or "
    "`torch.autocast`), no longer an instance of the deprecated subclass, so annotations and "
    "`isinstance` checks must name the base class. The base class also matches objects of "
    "other devices; check the rewritten `isinstance` if the file tells devices apart that way.",
    before="def step(scaler: torch.cuda.amp.GradScaler): ...",
    after="def step(scaler: torch.amp.GradScaler): ...",
)
REFERENCE_KEPT = define(
    "AMP605", "deprecated-amp-reference-kept", Severity.WARNING,
    "A deprecated `torch.cuda.amp` / `torch.cpu.amp` name is used in a way with no provably "
    "right rewrite; it was left as it is.",
    "The deprecated names still work (with a `FutureWarning`), so the file is correct as it "
    "is, but it was not finished. A name that is stored or passed instead of called "
    "(`ctx = torch.cuda.amp.autocast if amp else nullcontext`) may be called later with "
    "positional arguments in the old order, which `torch.autocast` reads differently; calls "
    "with `*args`/`**kwargs` hide which argument is which; and `torch` may mean something else "
    "where the call is. Rewrite the named use by hand, e.g. with "
    "`functools.partial(torch.autocast, \"cuda\", dtype=torch.float16)` when it is only called "
    "with keyword arguments.",
    before="ctx = torch.cuda.amp.autocast if use_amp else contextlib.nullcontext",
    after="ctx = torch.cuda.amp.autocast if use_amp else contextlib.nullcontext  # unchanged",
)

_DEPRECATED_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
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


def _dotted(name: str) -> Union[cst.Name, cst.Attribute]:
    return cst.parse_expression(name)  # type: ignore[return-value]


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def _insert_args(call: cst.Call, index: int, new: Sequence[cst.Arg]) -> cst.Call:
    """`call` with `new` inserted before its argument `index`, in the call's layout.

    Arguments that start on their own line after `(` get one line each; otherwise they are
    separated by `, `. A trailing comma stays trailing.
    """
    args = list(call.args)
    if args and isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        after = call.whitespace_before_args.with_changes(first_line=cst.TrailingWhitespace(),
                                                         empty_lines=[])
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

    METADATA_DEPENDENCIES = Rule.METADATA_DEPENDENCIES + (ScopeProvider,)
    APEX_PREFIXES = ()  # torch's own deprecated API: runs on files without Apex too

    def __init__(self, context: CodemodContext, state) -> None:
        super().__init__(context, state)
        self.changed = False
        self.imports: list[tuple[str, Optional[str], Optional[str]]] = []
        self.plain_imports: set[str] = set()  # `import torch.cuda.amp` (binds `torch`)

    # -- what a node means ------------------------------------------------------------------
    def deprecated(self, node: cst.CSTNode) -> Optional[Deprecated]:
        """The deprecated object `node` names, `_AMBIGUOUS` if it may also be another, else None."""
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        ours = {DEPRECATED[n] for n in names if n in DEPRECATED}
        if not ours:
            return None
        if len(ours) > 1 or len(names) > 1:
            return _AMBIGUOUS
        return ours.pop()

    def torch_is_module(self, node: cst.CSTNode) -> bool:
        """`torch` at `node` is the torch package, or unbound (then `import torch` is added)."""
        scope = self.get_metadata(ScopeProvider, node, None)
        if scope is None or "torch" not in scope:
            return True
        return all(_binds_torch_module(a) for a in scope["torch"])

    def fixed(self, node: cst.CSTNode, code, message: str) -> None:
        self.report(node, code, message)
        self.changed = True

    def kept(self, node: cst.CSTNode, message: str) -> None:
        self.report(node, REFERENCE_KEPT, message, fixed=False)

    # -- imports: remember them, to remove the ones nothing reads afterwards ---------------
    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = get_full_name_for_node(alias.name) or ""
            if name in _DEPRECATED_MODULES or name.startswith(tuple(f"{d}." for d in _DEPRECATED_MODULES)):
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
            self.kept(original_node, "this name may be a deprecated torch AMP object or another "
                                     "one, depending on which import ran; left as it is")
            return updated_node
        if not self.torch_is_module(original_node):
            self.kept(original_node, f"`torch` here is not the torch package, so `{old.old}` "
                                     "was left as it is")
            return updated_node
        if old.kind == "autocast":
            return self.autocast(original_node, updated_node, old)
        if old.kind == "GradScaler":
            self.fixed(original_node, GRAD_SCALER_FIXED,
                       f'`{old.old}(...)` → `torch.amp.GradScaler("{old.device}", ...)`')
            return _insert_args(updated_node.with_changes(func=_dotted("torch.amp.GradScaler")),
                                0, [cst.Arg(_string(old.device))])
        return self.custom_fwd_bwd(original_node, updated_node, old)

    def autocast(self, original_node: cst.Call, updated_node: cst.Call,
                 old: Deprecated) -> cst.BaseExpression:
        """Positional arguments become keywords; the old default dtype is written out."""
        args: list[cst.Arg] = []
        for index, arg in enumerate(updated_node.args):
            if arg.star:
                self.kept(original_node, f"`{old.old}` is called with `{arg.star}` arguments, "
                                         "which may pass the dtype twice once it is written "
                                         "out; left as it is")
                return updated_node
            if arg.keyword is None:
                if index >= len(_OLD_AUTOCAST_PARAMS):
                    self.kept(original_node, f"`{old.old}` is called with more positional "
                                             "arguments than it takes; left as it is")
                    return updated_node
                arg = arg.with_changes(
                    keyword=cst.Name(_OLD_AUTOCAST_PARAMS[index]),
                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                          whitespace_after=cst.SimpleWhitespace("")))
            args.append(arg)
        new = [cst.Arg(_string(old.device))]
        if not any(arg.keyword.value == "dtype" for arg in args if arg.keyword is not None):
            new.append(_keyword("dtype", _dotted(f"torch.{_DEFAULT_DTYPE[old.device]}")))
        self.fixed(original_node, AUTOCAST_FIXED,
                   f'`{old.old}(...)` → `torch.autocast("{old.device}", ...)`')
        call = updated_node.with_changes(func=_dotted("torch.autocast"), args=args)
        return _insert_args(call, 0, new)

    def custom_fwd_bwd(self, original_node: cst.Call, updated_node: cst.Call,
                       old: Deprecated) -> cst.BaseExpression:
        """`device_type` goes after the positional arguments, before any keyword."""
        index = next((i for i, arg in enumerate(updated_node.args)
                      if arg.keyword is not None or arg.star == "**"), len(updated_node.args))
        self.fixed(original_node, CUSTOM_FWD_BWD_FIXED,
                   f'`{old.old}` → `torch.amp.{old.kind}(device_type="{old.device}")`')
        call = updated_node.with_changes(func=_dotted(f"torch.amp.{old.kind}"))
        return _insert_args(call, index, [_keyword("device_type", _string(old.device))])

    def leave_Decorator(self, original_node: cst.Decorator,
                        updated_node: cst.Decorator) -> cst.Decorator:
        """The bare `@custom_fwd` / `@custom_bwd` becomes a call: `device_type` is required."""
        old = self.deprecated(original_node.decorator)
        if (old is None or old is _AMBIGUOUS or old.kind not in ("custom_fwd", "custom_bwd")
                or not m.matches(original_node.decorator, m.Name() | m.Attribute())
                or not self.torch_is_module(original_node)):
            return updated_node
        self.fixed(original_node.decorator, CUSTOM_FWD_BWD_FIXED,
                   f'`@{old.old}` → `@torch.amp.{old.kind}(device_type="{old.device}")`')
        return updated_node.with_changes(decorator=cst.Call(
            func=_dotted(f"torch.amp.{old.kind}"),
            args=[_keyword("device_type", _string(old.device))]))

    # -- references that are not calls ------------------------------------------------------
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        parent = self.parent(original_node)
        if isinstance(parent, cst.Attribute) and parent.attr is original_node:
            return updated_node
        return self.reference(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute,
                        updated_node: cst.Attribute) -> cst.BaseExpression:
        return self.reference(original_node, updated_node)

    def reference(self, original_node: Union[cst.Name, cst.Attribute],
                  updated_node: cst.BaseExpression) -> cst.BaseExpression:
        old = self.deprecated(original_node)
        if old is None:
            return updated_node
        parent = self.parent(original_node)
        if isinstance(parent, cst.Call) and parent.func is original_node:
            return updated_node  # leave_Call
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(original_node)):
            return updated_node
        if isinstance(parent, cst.Decorator) and old is not _AMBIGUOUS and old.kind in ("custom_fwd", "custom_bwd"):
            return updated_node  # leave_Decorator
        spelled = get_full_name_for_node(original_node)
        if old is _AMBIGUOUS:
            self.kept(original_node, f"`{spelled}` may be a deprecated torch AMP object or "
                                     "another one, depending on which import ran; left as it is")
            return updated_node
        if old.kind in ("autocast", "GradScaler") and self.is_type_position(original_node) \
                and self.torch_is_module(original_node):
            new = "torch.autocast" if old.kind == "autocast" else "torch.amp.GradScaler"
            self.fixed(original_node, TYPE_REFERENCE_FIXED,
                       f"`{spelled}` as a type → `{new}`, its base class (which also matches "
                       "other devices)")
            return _dotted(new)
        self.kept(original_node, f"`{spelled}` ({old.old}) is used without being called; "
                                 "it has no provably right rewrite and was left as it is")
        return updated_node

    def is_type_position(self, node: cst.CSTNode) -> bool:
        """In an annotation, or the class argument of `isinstance`/`issubclass`."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Annotation):
                return True
            if isinstance(ancestor, cst.Arg):
                call = self.parent(ancestor)
                return (m.matches(call, _TYPE_CHECK) and len(call.args) == 2
                        and call.args[1] is ancestor
                        and (child is node or isinstance(child, cst.Tuple)))
            if not isinstance(ancestor, (cst.Tuple, cst.Element)):
                return False
            if isinstance(ancestor, cst.Tuple):
                child = ancestor
        return False

    # -- the whole file ---------------------------------------------------------------------
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)
        if not self.changed:
            return tree
        AddImportsVisitor.add_needed_import(self.context, "torch")
        removals = CodemodContext()
        for module, obj, alias in self.imports:
            RemoveImportsVisitor.remove_unused_import(removals, module, obj, alias)
        if self.imports:
            tree = RemoveImportsVisitor(removals).transform_module(tree)
        if self.plain_imports and not _reads_deprecated_names(tree):
            tree = tree.visit(_PlainImportsToTorch(self.plain_imports))
        return tree


def _reads_deprecated_names(tree: cst.Module) -> bool:
    """Whether anything outside import statements still names `torch.{cuda,cpu}.amp`."""
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    names = wrapper.resolve(QualifiedNameProvider)
    imports = {id(n) for stmt in m.findall(wrapper.module, m.Import() | m.ImportFrom())
               for n in m.findall(stmt, m.Name() | m.Attribute())}
    for node, qualified in names.items():
        if id(node) in imports:
            continue
        for q in qualified:
            if any(q.name == d or q.name.startswith(d + ".") for d in _DEPRECATED_MODULES):
                return True
    return False


class _PlainImportsToTorch(cst.CSTTransformer):
    """`import torch.cuda.amp` (which binds `torch`) → `import torch`, once nothing reads the
    deprecated module; dropped where the statement already imports torch."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_Import(self, original_node: cst.Import,
                     updated_node: cst.Import) -> Union[cst.Import, cst.RemovalSentinel]:
        aliases: list[cst.ImportAlias] = []
        for alias in updated_node.names:
            name = get_full_name_for_node(alias.name) or ""
            if alias.asname is None and name in self.names:
                alias = alias.with_changes(name=cst.Name("torch"))
            if alias.asname is None and m.matches(alias.name, m.Name("torch")) and any(
                    a.asname is None and m.matches(a.name, m.Name("torch")) for a in aliases):
                continue
            aliases.append(alias)
        aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=aliases)
