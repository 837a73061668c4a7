"""`apex.normalization` → `torch.nn.LayerNorm` / `torch.nn.RMSNorm`.

What it does
    `FusedLayerNorm(shape, eps, elementwise_affine)` becomes `torch.nn.LayerNorm(...)` and
    `FusedRMSNorm(...)` becomes `torch.nn.RMSNorm(...)`, with the same arguments.

Why
    Apex's fused norms import `fused_layer_norm_cuda` even to run on CPU; torch's modules
    compute the same normalisation with their own fused kernels and need nothing else.

Soundness
    `torch.nn.LayerNorm`/`RMSNorm` normalise over the same trailing shape with the same affine
    parameters under the same names, so outputs and checkpoints match; Apex's `eps` is always
    passed because torch's RMSNorm defaults differ. Variants whose output dtype differs
    (`MixedFused*`), unknown arguments and uses where the torch class would mean something else
    (`isinstance`, bases, a bare `FusedRMSNorm`) fall back.

Fix safety
    Safe where it applies. The parameters are named `weight` (and `bias`) in both, so checkpoints load unchanged.
    `memory_efficient` only trades memory for recomputation in backward
    and is dropped. torch's RMSNorm defaults to `eps=None` (the dtype's machine epsilon) where
    Apex defaults to 1e-5, so Apex's value is always passed.

    `MixedFusedLayerNorm`/`MixedFusedRMSNorm` return the parameters' dtype, not the input's;
    torch's norms need a `.to(weight.dtype)` on every output, which is not a rewrite of the
    constructor, so these fall back to the shim. So do `**kwargs` and unknown arguments.

    A bare `FusedLayerNorm` used as a value (`norm_layer=FusedLayerNorm`,
    `partial(FusedLayerNorm, eps=1e-6)`) becomes `torch.nn.LayerNorm`: its first three
    arguments and their defaults are the same, so whoever calls it builds the same layer
    (unless it passes `memory_efficient`, which torch rejects loudly). A bare `FusedRMSNorm`
    falls back: the caller may rely on Apex's eps default, which a bare torch class does not
    have. In `isinstance`/`issubclass` checks and class bases the torch class would also match
    norms this file never created (and `FusedLayerNorm` is not a `torch.nn.LayerNorm`
    subclass), so those fall back too.

Example
    self.ln = FusedLayerNorm(hidden, eps=1e-12)
becomes
    self.ln = torch.nn.LayerNorm(hidden, eps=1e-12)
"""

from __future__ import annotations

import libcst as cst

from ..analysis.call_args import bind, new_keyword, rebuild_call
from ..diagnostics import Severity, define
from .base import ApexClassRule
from .facts import Fact

NORM_REFERENCE = define(
    "AMP540",
    "fused-norm-class-reference",
    Severity.INFO,
    "`FusedLayerNorm` used as a value became `torch.nn.LayerNorm`.",
    "Both take `normalized_shape, eps=1e-5, elementwise_affine=True` in that order, so a "
    "caller that passes those builds the same layer with the same parameter names. A caller "
    "that passes `memory_efficient` must drop it (torch raises a TypeError).",
    before="block = Block(dim, norm_layer=FusedLayerNorm)",
    after="block = Block(dim, norm_layer=torch.nn.LayerNorm)",
)
NORM_ARGUMENT = define(
    "AMP541",
    "fused-norm-argument-not-mappable",
    Severity.WARNING,
    "An argument of this Apex norm cannot be checked; the file uses the shim.",
    "`*args`, `**kwargs` and arguments the Apex constructor does not have cannot be mapped "
    "provably to torch's constructor, so the file keeps Apex's class through the shim.",
    before="norm = FusedLayerNorm(dim, **norm_kwargs)",
    after="from amp_shim.normalization import FusedLayerNorm  # import rewritten only",
    falls_back=True,
    refusal="a norm argument that cannot be checked",
    fallback_title="Apex's fused norms that cannot be mapped",
    shape=(
        "`FusedLayerNorm(*args)`, `FusedRMSNorm(hidden, **norm_kwargs)`, or an argument the Apex constructor "
        "does not have."
    ),
    by_hand=(
        "Spell the arguments out (`FusedLayerNorm(hidden, eps=1e-5)`), then re-run; or write the "
        "`torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine)` call yourself."
    ),
)
MIXED_NORM = define(
    "AMP542",
    "mixed-fused-norm",
    Severity.WARNING,
    "MixedFusedLayerNorm/MixedFusedRMSNorm return the parameters' dtype; the file uses the shim.",
    "The mixed variants normalise a half-precision input with fp32 (or any) parameters and "
    "return the parameters' dtype. torch's norms return the input's dtype (or fp32 under "
    "autocast), so every output would need `.to(norm.weight.dtype)`, which a constructor "
    "rewrite cannot add. Replace them by hand if the output dtype does not matter to you.",
    before="norm = MixedFusedLayerNorm(hidden, eps=1e-5)",
    after="from amp_shim.normalization import MixedFusedLayerNorm  # import rewritten only",
    falls_back=True,
    refusal="the output dtype differs from torch's norms",
    fallback_title="Apex's fused norms that cannot be mapped",
    shape="`MixedFusedLayerNorm(hidden)` or `MixedFusedRMSNorm(hidden)` (Megatron-style models).",
    by_hand=(
        "Use `torch.nn.LayerNorm` or `torch.nn.RMSNorm` and cast the output where the parameters' dtype "
        "matters (`norm(x).to(norm.weight.dtype)`), or keep the shim."
    ),
)
NORM_CLASS_CHECK = define(
    "AMP543",
    "fused-norm-class-not-mappable",
    Severity.WARNING,
    "An Apex norm class is used without a call where the torch class would not behave the "
    "same; the file uses the shim.",
    "`isinstance(m, FusedLayerNorm)` would become true for every `torch.nn.LayerNorm`, "
    "including ones this file never replaced, and a subclass of the Apex class may rely on "
    "its internals. A bare `FusedRMSNorm` cannot carry Apex's eps default (1e-5; torch's is "
    "the dtype's machine epsilon).",
    before="if isinstance(module, FusedLayerNorm):\n    no_decay.append(module.weight)",
    after="from amp_shim.normalization import FusedLayerNorm  # import rewritten only",
    falls_back=True,
    refusal="the torch class would also match other objects",
    fallback_title="Apex's fused norms that cannot be mapped",
    shape=(
        "`isinstance(module, FusedLayerNorm)` (in weight-decay groups or initialization), a subclass of an "
        "Apex norm, or a bare `FusedRMSNorm` passed as a class."
    ),
    by_hand=(
        "Test for the torch class once nothing builds Apex's (`isinstance(module, torch.nn.LayerNorm)`), "
        "subclass the torch class, or pass `functools.partial(torch.nn.RMSNorm, eps=1e-5)`."
    ),
)


def _names(cls: str) -> set[str]:
    return {f"apex.normalization.{cls}", f"apex.normalization.fused_layer_norm.{cls}"}


LAYER_NORM = _names("FusedLayerNorm")
RMS_NORM = _names("FusedRMSNorm")
MIXED = _names("MixedFusedLayerNorm") | _names("MixedFusedRMSNorm")

SIGNATURE = ("normalized_shape", "eps", "elementwise_affine", "memory_efficient")
TORCH_ARGS = ("normalized_shape", "eps", "elementwise_affine")
APEX_EPS = "1e-5"


class FusedNormsToTorch(ApexClassRule):
    """FusedLayerNorm/FusedRMSNorm → torch.nn.LayerNorm/RMSNorm with the same arguments."""

    MARKERS = ("normalization",)

    HANDLED = frozenset(LAYER_NORM | RMS_NORM | MIXED)
    HANDLES = tuple(sorted(HANDLED))
    EMITS = (NORM_REFERENCE, NORM_ARGUMENT, MIXED_NORM, NORM_CLASS_CHECK)
    READS = frozenset({Fact.APEX_ANALYSED})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.IMPORT_REQUESTS})

    def _short(self, name: str) -> str:
        return name.rsplit(".", 1)[1]

    def rewrite_call(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        short = self._short(name)
        if name in MIXED:
            self.report(original, MIXED_NORM, f"`{short}` returns its parameters' dtype")
            return updated
        bound = bind(updated, SIGNATURE)
        if bound.problem is not None:
            self.report(original, NORM_ARGUMENT, f"`{short}(...)` kept: {bound.problem}")
            return updated
        if name in LAYER_NORM:
            return rebuild_call(updated, "torch.nn.LayerNorm", bound, TORCH_ARGS, TORCH_ARGS)
        extra = [] if "eps" in bound.args else [new_keyword("eps", APEX_EPS)]
        return rebuild_call(updated, "torch.nn.RMSNorm", bound, TORCH_ARGS, TORCH_ARGS, extra)

    def bare_reference(self, node: cst.CSTNode, name: str) -> None:
        short = self._short(name)
        if name in MIXED:
            self.report(node, MIXED_NORM, f"`{short}` returns its parameters' dtype")
        elif name in LAYER_NORM and self.reference_context(node) == "value":
            self.report(node, NORM_REFERENCE)
            self.replacements[id(node)] = "torch.nn.LayerNorm"
        else:
            self.report(node, NORM_CLASS_CHECK, f"`{short}` used without a call cannot be mapped provably")
