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

Soundness
    Nothing is rewritten here; the rule makes every other rule's reads trustworthy. The
    binder follows the bindings of each name an Apex import binds through the statements as
    Python runs them (branches and loops join, a `try` handler sees every state its body
    passed through, `del` and the end of an `except ... as` unbind) and treats code that runs
    later than it is written (function bodies, closures, `global` rebinding) as seeing every
    binding of the name in the scope that owns it. Its sets can only be too large, so a read
    it calls Apex's is Apex's on every path; a read that can be either is reported here and the
    file falls back to the shim, whose import-only rewrite leaves every binding as it was.

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

import libcst as cst

from ..diagnostics import Severity, define
from .base import Rule

NAME_REBOUND = define(
    "AMP020", "apex-name-rebound", Severity.WARNING,
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
)


class ReboundApexNames(Rule):
    """Reports the reads of an Apex import's name that another binding can reach too."""

    HANDLES = ()
    EMITS = (NAME_REBOUND,)

    @classmethod
    def applies(cls, state, context) -> bool:
        # Only files that bind an Apex import's name some other way have anything to report.
        known = state.scratch.get("binding")
        return (known is None or known.table is None) and super().applies(state, context)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        tree = super().transform_module_impl(tree)  # records where the reads sit, rewrites nothing
        for read, apex, other in self.apex.ambiguous_reads():
            self.report(read, NAME_REBOUND, self._message(read, apex, other))
        return tree

    def _message(self, read: cst.Name, apex: list, other: list) -> str:
        def where(binding) -> str:
            return f"`{binding.what}` (line {self.position(binding.node)[0]})"

        theirs = sorted(other or apex[1:], key=lambda b: self.position(b.node))
        ours = min(apex, key=lambda b: self.position(b.node))
        return (f"`{read.value}` here can be `{ours.apex}` from {where(ours)} or the value "
                f"bound by {where(theirs[0])}"
                + (f" and {len(theirs) - 1} other binding(s)" if len(theirs) > 1 else "")
                + "; the file uses the shim")
