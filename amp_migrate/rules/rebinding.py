"""A name an Apex import binds, read where another binding of it can reach too.

What it does
    Reports each read of a name that an Apex import binds (`amp`, `apex`, `scale_loss`) where
    some other binding of the same name can also be what the read sees: an assignment
    (`amp = Helper()`), a loop variable, a `with ... as amp`, another import, `del amp`, or a
    function's `global amp` rebinding. The message names the other binding's line.

Why
    The native rules rewrite reads of Apex's objects (`amp.state_dict()` becomes
    `scaler.state_dict()`) and delete the import. Where the name can hold something else at
    that point (`if args.debug: amp = Recorder()`, or a function that may run after the
    module rebound the name), one of the two paths would run code it never ran before, and
    which one runs is decided at run time. Reads that only the Apex import (or the
    `amp = None` of an `except ImportError` guard) reaches are migrated; reads that only
    other bindings reach are left alone, with no diagnostic.

    One pair is no ambiguity: `try: from apex.normalization import FusedLayerNorm as
    LayerNorm` with `except Exception: from torch.nn import LayerNorm`. The native rewrite of
    the Apex binding is `torch.nn.LayerNorm`, the very object the other binding holds, so after
    migration the name means one object on every path (AMP022 says so); only where the read
    uses an argument the two classes do not share (`memory_efficient`, `bias`, `*args`) do
    the paths differ, and AMP020 stays. `FusedRMSNorm` and `torch.nn.RMSNorm` pair up the same
    way for calls that pass `eps` (their defaults differ).

Soundness
    Nothing is rewritten here; the rule makes every other rule's reads trustworthy. The
    binder follows the bindings of each name an Apex import binds through the statements as
    Python runs them (branches and loops join, a `try` handler sees every state its body
    passed through, `del` and the end of an `except ... as` unbind) and treats code that runs
    later than it is written (function bodies, closures, `global` rebinding) as seeing every
    binding of the name in the scope that owns it. Its sets can only be too large, so a read
    it calls Apex's is Apex's on every path; a read that can be either is reported here and the
    file falls back to the shim, whose import-only rewrite leaves every binding as it was.
    A read whose other bindings all import the Apex object's native counterpart (the class its
    rule rewrites it to, `from torch.nn import LayerNorm`) is not reported when it calls the
    name with arguments both constructors take with the same meaning and defaults
    (`normalized_shape, eps=1e-5, elementwise_affine=True`) or passes the class on as a
    value: the Apex path builds what the rewrite builds (normalization.py's soundness), and
    the other path built `torch.nn.LayerNorm` already.

Fix safety
    No fix; `--target auto` uses the shim for the file. Renaming the other object (or the
    import, `from apex import amp as apex_amp`) makes every read unambiguous.

Example
    from apex import amp
    if args.record:
        amp = Recorder()
    model, opt = amp.initialize(model, opt)  # Apex's, or the Recorder's?
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ..analysis.call_args import bind
from ..diagnostics import Severity, define
from .base import Rule
from .facts import Fact

NAME_REBOUND = define(
    "AMP020",
    "apex-name-rebound",
    Severity.WARNING,
    "This name can hold Apex's object or another value bound to it; the file uses the shim.",
    "A read of a name that an Apex import binds is rewritten natively only where the import is "
    "the one binding that can reach it. Here another binding of the same name (named in the "
    "message with its line) can reach it too: an assignment on some path, a loop variable, a "
    "`with ... as`, another import, `del`, or a function rebinding it through `global` (a "
    "function may run at any time, so its reads see every binding of a module name). Which "
    "object the read gets is decided at run time, so no single rewrite is right; the shim keeps "
    "both paths as they were. Give the other object its own name to migrate natively.",
    before="from apex import amp\nif args.record:\n    amp = Recorder()\n"
    "model, opt = amp.initialize(model, opt)",
    after="from amp_shim import amp\nif args.record:\n    amp = Recorder()\n"
    "model, opt = amp.initialize(model, opt)",
    falls_back=True,
    refusal="the name may hold Apex's object or another one at run time",
    fallback_title="a name that is Apex's object or another one",
    shape=(
        "`try: from apex.normalization import FusedLayerNorm as LayerNorm; LayerNorm(8)` (a probe) `except "
        "Exception: LayerNorm = MyLayerNorm`: the other binding is a class of the project's own (or a read "
        "passes an argument only one of the two classes takes, such as `memory_efficient=True`)."
    ),
    fallback_why=(
        "Which class a read of `LayerNorm` gets is decided at run time by the probe. The codemod rewrites a "
        "read only where every binding that reaches it means one object after migration. `from torch.nn "
        "import LayerNorm` as the other binding is such a case (AMP022, and `RMSNorm` in calls that pass "
        "`eps`): the native rewrite of `FusedLayerNorm` is `torch.nn.LayerNorm`, so calls with the arguments "
        "both take (`normalized_shape, eps, elementwise_affine`) and the class passed as a value are "
        "migrated. A class of the project's own computes something else, and `memory_efficient` is accepted "
        "by one branch and a `TypeError` in the other, so those reads keep both paths."
    ),
    by_hand=(
        "Decide which class the model uses and bind the name once (`from torch.nn import LayerNorm`, or "
        "`LayerNorm = MyLayerNorm`)."
    ),
)


COLLAPSED = define(
    "AMP022",
    "apex-or-native-name-collapsed",
    Severity.INFO,
    "This name holds Apex's class or its native counterpart; both become the native class.",
    "`try: from apex.normalization import FusedLayerNorm as LayerNorm` / `except: from "
    "torch.nn import LayerNorm` makes the name one of two classes. The native rewrite of "
    "`FusedLayerNorm` is `torch.nn.LayerNorm` with the same arguments, which is what the other "
    "binding holds, so every read becomes `torch.nn.LayerNorm` and the program builds the same "
    "layers whichever branch ran. `FusedRMSNorm` and `torch.nn.RMSNorm` pair up the same way in "
    "calls that pass `eps` (Apex's default is 1e-5, torch's the dtype's epsilon). The fallback "
    "import stays and is harmless.",
    before="try:\n    from apex.normalization import FusedLayerNorm as LayerNorm\n    LayerNorm(8)\n"
    "except Exception:\n    from torch.nn import LayerNorm\nnorm = LayerNorm(hidden, eps=1e-5)",
    after="try:\n    torch.nn.LayerNorm(8)\nexcept Exception:\n    from torch.nn import LayerNorm\n"
    "norm = torch.nn.LayerNorm(hidden, eps=1e-5)",
)

_NORM_ARGS = ("normalized_shape", "eps", "elementwise_affine")
#: Apex classes whose native rewrite is a torch class with the same meaning: (the torch class,
#: the constructor arguments in order they share, the ones a call must pass because their
#: defaults differ, whether the bare class may be passed on as a value).
NATIVE_TWINS = {
    **{
        f"apex.normalization{m}.FusedLayerNorm": ("torch.nn.LayerNorm", _NORM_ARGS, (), True)
        for m in ("", ".fused_layer_norm")
    },
    # Apex's eps defaults to 1e-5, torch's RMSNorm to the dtype's machine epsilon.
    **{
        f"apex.normalization{m}.FusedRMSNorm": ("torch.nn.RMSNorm", _NORM_ARGS, ("eps",), False)
        for m in ("", ".fused_layer_norm")
    },
}


def _import_of(node: cst.CSTNode, parent) -> Optional[str]:
    """The qualified name an `from a.b import C [as D]` alias binds (None for anything else)."""
    owner = parent(node)
    if (
        not isinstance(node, cst.ImportAlias)
        or not isinstance(owner, cst.ImportFrom)
        or owner.relative
        or owner.module is None
        or not isinstance(node.name, cst.Name)
    ):
        return None
    return f"{cst.Module([]).code_for_node(owner.module)}.{node.name.value}"


class ReboundApexNames(Rule):
    """Reports the reads of an Apex import's name that another binding can reach too."""

    HANDLES = ()
    EMITS = (NAME_REBOUND, COLLAPSED)
    READS = frozenset({Fact.BINDING, Fact.PARSED, Fact.PROJECT})
    WRITES = frozenset({Fact.APEX_ANALYSED, Fact.BINDING, Fact.FALLBACK_REASONS})

    @classmethod
    def applies(cls, state, context) -> bool:
        # Only files that bind an Apex import's name some other way have anything to report.
        known = state.binding
        return (known is None or known.table is None) and super().applies(state, context)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)  # records where the reads sit, rewrites nothing
        assert self.apex is not None  # bound by Rule.transform_module_impl
        for read, apex, other in self.apex.ambiguous_reads():
            twin = self._twin(read, apex, other)
            if twin is not None:
                self.report(
                    read,
                    COLLAPSED,
                    f"`{read.value}` is `{apex[0].apex}` or `{twin}`; both are `{twin}` after migration",
                )
            else:
                self.report(read, NAME_REBOUND, self._message(read, apex, other))
        return tree

    def _twin(self, read: cst.Name, apex: list, other: list) -> Optional[str]:
        """The native class every binding of this read means after migration, or None where
        the Apex binding and the others can differ for it."""
        twins = {NATIVE_TWINS.get(b.apex) for b in apex}
        if len(twins) != 1 or None in twins or not other:
            return None
        (twin,) = twins
        assert twin is not None  # (None is not in twins)
        native, shared, required, as_value = twin
        if any(_import_of(b.node, self.parent) != native for b in other):
            return None
        call = self.parent(read)
        if isinstance(call, cst.Call) and call.func is read:
            bound = bind(call, shared)
            return native if bound.problem is None and all(a in bound.args for a in required) else None
        return native if as_value else None

    def _message(self, read: cst.Name, apex: list, other: list) -> str:
        def where(binding) -> str:
            return f"`{binding.what}` (line {self.position(binding.node)[0]})"

        theirs = sorted(other or apex[1:], key=lambda b: self.position(b.node))
        ours = min(apex, key=lambda b: self.position(b.node))
        return (
            f"`{read.value}` here can be `{ours.apex}` from {where(ours)} or the value "
            f"bound by {where(theirs[0])}"
            + (f" and {len(theirs) - 1} other binding(s)" if len(theirs) > 1 else "")
            + "; the file uses the shim"
        )
