"""libcst's MetadataWrapper, minus the walks that compute nothing."""

from __future__ import annotations

from contextlib import ExitStack

from libcst.metadata import MetadataWrapper


class FastMetadataWrapper(MetadataWrapper):
    """A MetadataWrapper without the walks that compute nothing. libcst resolves providers
    in rounds, and each round walks the whole tree once for the batchable providers, even
    when there are none (PositionProvider's round) or when every one works in `visit_Module`
    alone (ScopeProvider and ExpressionContextProvider each run a visitor of their own
    there): such a round calls `visit_Module` and walks nothing."""

    def visit_batched(self, visitors, before_visit=None, after_leave=None):
        visitors = list(visitors)
        handlers = [v.get_visitors() for v in visitors]
        if (
            before_visit is not None
            or after_leave is not None
            or any(set(h) - {"visit_Module"} for h in handlers)
        ):
            return super().visit_batched(visitors, before_visit, after_leave)
        with ExitStack() as stack:
            for v in visitors:
                stack.enter_context(v.resolve(self))
            for h in handlers:
                if "visit_Module" in h:
                    h["visit_Module"](self.module)
        return self.module
