"""`apex.optimizers` → `torch.optim` with `fused=True`.

What it does
    Rewrites `FusedAdam(...)` to `torch.optim.AdamW(...)` (or `torch.optim.Adam(...)` when
    `adam_w_mode=False`), `FusedSGD(...)` to `torch.optim.SGD(...)` and `FusedAdagrad(...)` to
    `torch.optim.Adagrad(...)`, with `fused=True` when the target device is `cuda` or `cpu`
    (torch has fused kernels for these four optimizers on both). `FusedLAMB` and
    `FusedNovoGrad`, which torch has no class for, become `amp_shim.optimizers.FusedLAMB` and
    `amp_shim.optimizers.FusedNovoGrad` (AMP505): the file's mixed precision is native, only
    the optimizer class comes from the shim.

Why
    Apex's fused optimizers need Apex's compiled extensions. torch's fused optimizers run the
    same update in one kernel, take `GradScaler`'s `found_inf`/`grad_scale` directly and need
    nothing besides torch.

Soundness
    FusedAdam's decoupled decay is AdamW's update and its L2 mode Adam's; FusedSGD and
    FusedAdagrad are torch's SGD and Adagrad step for step (tests/shim/test_optimizers.py
    compares them bit for bit). Every argument is carried over by name and defaults that
    differ are written out; torch's fused kernels take GradScaler's `found_inf`, so a step the
    scaler skips leaves parameters and state untouched, as Apex's patched step did. Apex-only
    arguments with non-default values fall back, and so does `FusedMixedPrecisionLamb`. The
    shim's LAMB and NovoGrad are the same objects in the legacy run and in the native one, where
    `scaler.step` unscales their gradients and skips an overflowing step before they run.

Fix safety
    Safe where it applies: the update math is the same. FusedAdam's decoupled decay is AdamW's, its
    L2 mode is Adam's, FusedSGD and FusedAdagrad match torch step for step. Every argument is
    carried over by name; `weight_decay` is always passed to AdamW, whose default (1e-2)
    differs from FusedAdam's (0). Arguments that only ever meant "as torch does it" are
    dropped (`bias_correction=True`, `amsgrad=False`, `master_weights=False`,
    `wd_after_momentum=False`, `adagrad_w_mode=False`, `set_grad_none=True`, and
    `materialize_master_grads`, which only acted under amp O2, gone after a native
    migration). What stays different is reported as info: torch cannot load an optimizer
    state dict saved by FusedAdam or FusedAdagrad (they keep `step` in the param group), and
    `zero_grad()` sets gradients to None where Apex's `set_grad_none=False` zeroed them.

    FusedLAMB and FusedNovoGrad have no torch class: the native code takes the very class the
    legacy program ran through the shim, `amp_shim.optimizers.FusedLAMB` (an Apex-formula
    `torch.optim.Optimizer` that knows nothing of amp), calls and bare references alike
    (AMP505); `torch.amp` drives it like any optimizer, so the training is the legacy one (the
    equivalence programs `fused-lamb` and `fused-novograd`, an overflow forced, are bit for bit
    the shim's). Anything whose torch form is not provably the same leaves the call untouched
    and sends the file to the shim: FusedMixedPrecisionLamb (it reads the scaler's overflow
    itself), Apex-only arguments with a non-default value, values that decide the class
    but are not literals (`adam_w_mode=flag`), `*args`/`**kwargs`, unknown keywords, and the
    class used without being called (`opt_cls = FusedAdam`, `isinstance(o, FusedSGD)`): the
    torch class needs `fused=True` and different defaults to behave the same, which a bare
    class reference cannot carry.

Example
    optimizer = FusedAdam(model.parameters(), lr=3e-4, betas=(0.9, 0.98), eps=1e-6)
becomes (`--device cuda`)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.98), eps=1e-6,
                                  weight_decay=0.0, fused=True)
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from ..analysis.call_args import Bound, bind, dotted, new_keyword, rebuild_call
from ..diagnostics import Severity, define
from .base import ApexClassRule
from .facts import Fact

CHECKPOINT_FORMAT = define(
    "AMP500",
    "optimizer-checkpoint-format",
    Severity.INFO,
    "The Apex optimizer became its torch.optim equivalent, whose state dict keeps `step` per parameter.",
    "FusedAdam and FusedAdagrad store the step count in each param group; torch.optim.Adam, "
    "AdamW and Adagrad store it in each parameter's state, and their `load_state_dict` fails "
    "with `KeyError: 'step'` on a state dict saved by Apex. Training from scratch is "
    "unaffected. To resume from an old checkpoint, move `group['step']` into "
    "`state[p]['step'] = torch.tensor(float(step))` for every parameter of the group before "
    "loading it.",
    before="from apex.optimizers import FusedAdam\nopt = FusedAdam(model.parameters(), lr=1e-3)",
    after="import torch\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)",
    variants=("each parameter's state",),
)
ZERO_GRAD_SETS_NONE = define(
    "AMP501",
    "optimizer-zero-grad-sets-none",
    Severity.INFO,
    "`zero_grad()` of the torch optimizer sets gradients to None; this Apex optimizer zeroed "
    "them (`set_grad_none=False`).",
    "Apex's `zero_grad()` takes no arguments and follows the constructor's `set_grad_none` "
    "(False by default for FusedSGD). torch's `zero_grad()` sets gradients to None unless "
    "called as `zero_grad(set_to_none=False)`. The step is the same for every parameter that "
    "gets a gradient each iteration; a parameter that is skipped in an iteration is no "
    "longer updated by momentum or weight decay alone, and code that reads `p.grad` right "
    "after `zero_grad()` sees None. Pass `set_to_none=False` where that matters.",
    before="opt = FusedSGD(params, lr=0.1, momentum=0.9)\nopt.zero_grad()",
    after="opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)\nopt.zero_grad(set_to_none=False)",
)
NO_TORCH_OPTIMIZER = define(
    "AMP502",
    "optimizer-without-torch-equivalent",
    Severity.WARNING,
    "This Apex optimizer has no torch.optim equivalent; the file uses the shim.",
    "torch.optim has no mixed-precision LAMB, and `FusedMixedPrecisionLamb` reads the loss "
    "scaler's overflow flag itself, so native `torch.amp` cannot drive it as Apex's amp did. The "
    "shim provides it with Apex's arguments and numerics, so `--target auto` rewrites the file's "
    "imports to it. (`FusedLAMB` and `FusedNovoGrad` are kept from the shim in native code, "
    "AMP505.) To go native, choose a torch optimizer (and retune) by hand.",
    before="from apex.optimizers import FusedMixedPrecisionLamb\nopt = FusedMixedPrecisionLamb(params, lr=1e-3)",
    after="from amp_shim.optimizers import FusedMixedPrecisionLamb\nopt = FusedMixedPrecisionLamb(params, lr=1e-3)",
    falls_back=True,
    refusal="no torch.optim equivalent",
    fallback_title="Apex optimizers",
    shape="`FusedMixedPrecisionLamb`.",
    fallback_why="torch.optim has no mixed-precision LAMB, and this one reads the loss scaler's overflow "
    "itself; any torch optimizer trains differently.",
    by_hand="Keep the shim's LAMB, or choose and retune a torch optimizer.",
)
KEPT_FROM_SHIM = define(
    "AMP505",
    "optimizer-kept-from-shim",
    Severity.INFO,
    "This Apex optimizer has no torch.optim class; the native code takes it from "
    "`amp_shim.optimizers`, and only it: the file's mixed precision is native.",
    "torch.optim has no LAMB or NovoGrad. `amp_shim.optimizers.FusedLAMB` and `FusedNovoGrad` "
    "are Apex's formulas and arguments as torch tensor ops, a plain `torch.optim.Optimizer` that "
    "knows nothing of amp; the native rewrite keeps the class from there, and `torch.amp` drives "
    "it like any optimizer: `scaler.step(opt)` unscales its gradients and skips its step on an "
    "overflow, as Apex's amp did. The training is the legacy program's through the shim, whose "
    "amp ran the same class. The file needs amp-migrate's `amp_shim` package installed for this "
    "class alone; `FusedMixedPrecisionLamb`, which reads the scaler's overflow itself, keeps the "
    "shim (AMP502).",
    before="from apex.optimizers import FusedLAMB\nopt = FusedLAMB(model.parameters(), lr=1e-3)",
    after="import amp_shim.optimizers\nopt = amp_shim.optimizers.FusedLAMB(model.parameters(), lr=1e-3)",
)
OPTIMIZER_ARGUMENT = define(
    "AMP503",
    "optimizer-argument-not-mappable",
    Severity.WARNING,
    "An argument of this Apex optimizer has no provably equal torch.optim form; the file uses the shim.",
    "Some Apex options change the update in ways torch cannot express "
    "(`bias_correction=False`, `wd_after_momentum=True`, `adagrad_w_mode=True`, "
    "`master_weights=True`); a non-literal `adam_w_mode` decides between two torch classes at "
    "run time; `*args`, `**kwargs` and unknown keywords cannot be checked at all. The call is "
    "left as it is and `--target auto` rewrites the file's imports to the shim, which keeps "
    "Apex's behaviour.",
    before="opt = FusedAdam(params, lr=1e-3, adam_w_mode=args.adamw)",
    after="from amp_shim.optimizers import FusedAdam  # import rewritten, call unchanged",
    falls_back=True,
    refusal="an optimizer argument with no equal torch form",
    fallback_title="Apex optimizers",
    shape="`FusedAdam(..., max_grad_norm=1.0)`.",
    fallback_why=(
        "`max_grad_norm` belongs to the pre-2019 FusedAdam, which clipped inside `step`; Apex's last "
        "FusedAdam rejects it, and no torch Adam clips."
    ),
    by_hand="Drop it and clip with `clip_grad_norm_` before the step (after `scaler.unscale_`).",
)
OPTIMIZER_REFERENCE = define(
    "AMP504",
    "optimizer-class-reference",
    Severity.WARNING,
    "An Apex optimizer class is used without being called; the file uses the shim.",
    "A bare class (`opt_cls = FusedAdam`, `isinstance(opt, FusedSGD)`) cannot carry what the "
    "torch form needs to behave the same: `fused=True`, `weight_decay` passed explicitly, or "
    "the choice between Adam and AdamW. Whoever calls the class later passes arguments this "
    "codemod cannot see, so the file keeps Apex's class through the shim.",
    before="OPTIMIZERS = {'adam': FusedAdam, 'sgd': FusedSGD}",
    after="from amp_shim.optimizers import FusedAdam, FusedSGD  # imports rewritten only",
    falls_back=True,
    refusal="a bare class cannot carry fused=True and torch's defaults",
    fallback_title="Apex optimizers",
    shape=(
        "`AVAILABLE_OPTIMIZERS['fused_adam'] = FusedAdam` (an optimizer registry looked up by name and "
        "called with configuration kwargs), `isinstance(opt, FusedAdam)`."
    ),
    fallback_why=(
        "The torch form is a call (`torch.optim.AdamW(..., weight_decay=<explicit>, fused=True)`); a bare "
        "class cannot carry `fused=True` or Apex's `weight_decay=0` default (AdamW's is 1e-2), and the "
        "registry's callers pass arguments this file does not show."
    ),
    by_hand=(
        "Register a `functools.partial(torch.optim.AdamW, weight_decay=0.0, fused=True)` and check the "
        "keyword arguments your configs pass."
    ),
)


# -- the rule ---------------------------------------------------------------------------------

_MODULES = {
    "FusedAdam": "fused_adam",
    "FusedSGD": "fused_sgd",
    "FusedAdagrad": "fused_adagrad",
    "FusedLAMB": "fused_lamb",
    "FusedNovoGrad": "fused_novograd",
    "FusedMixedPrecisionLamb": "fused_mixed_precision_lamb",
}


def _names(cls: str) -> set[str]:
    return {f"apex.optimizers.{cls}", f"apex.optimizers.{_MODULES[cls]}.{cls}"}


ADAM = _names("FusedAdam")
SGD = _names("FusedSGD")
ADAGRAD = _names("FusedAdagrad")
#: Kept as the shim's class in native code (AMP505); the other stays on the shim (AMP502).
FROM_SHIM = _names("FusedLAMB") | _names("FusedNovoGrad")
WITHOUT_EQUIVALENT = FROM_SHIM | _names("FusedMixedPrecisionLamb")

ADAM_SIGNATURE = (
    "params",
    "lr",
    "bias_correction",
    "betas",
    "eps",
    "adam_w_mode",
    "weight_decay",
    "amsgrad",
    "set_grad_none",
    "capturable",
    "master_weights",
)
SGD_SIGNATURE = (
    "params",
    "lr",
    "momentum",
    "dampening",
    "weight_decay",
    "nesterov",
    "wd_after_momentum",
    "materialize_master_grads",
    "set_grad_none",
)
ADAGRAD_SIGNATURE = ("params", "lr", "eps", "weight_decay", "set_grad_none", "adagrad_w_mode")

TORCH_ADAM = ("params", "lr", "betas", "eps", "weight_decay", "amsgrad")
TORCH_SGD = ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov")
TORCH_ADAGRAD = ("params", "lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")

FUSED_DEVICES = ("cuda", "cpu")


class FusedOptimizersToTorch(ApexClassRule):
    """FusedAdam/FusedSGD/FusedAdagrad → torch.optim with the same arguments, fused."""

    MARKERS = ("optimizers",)

    HANDLED = frozenset(ADAM | SGD | ADAGRAD | WITHOUT_EQUIVALENT)
    HANDLES = tuple(sorted(HANDLED))
    EMITS = (
        CHECKPOINT_FORMAT,
        ZERO_GRAD_SETS_NONE,
        NO_TORCH_OPTIMIZER,
        KEPT_FROM_SHIM,
        OPTIMIZER_ARGUMENT,
        OPTIMIZER_REFERENCE,
    )
    READS = frozenset({Fact.APEX_ANALYSED, Fact.OPTIMIZER_ALIASES_REWRITTEN})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.IMPORT_REQUESTS})

    def _short(self, name: str) -> str:
        return name.rsplit(".", 1)[1]

    def _fused(self) -> list[cst.Arg]:
        return [new_keyword("fused", "True")] if self.options.device in FUSED_DEVICES else []

    def _refuse(self, original: cst.Call, updated: cst.Call, name: str, why: str) -> cst.Call:
        self.report(original, OPTIMIZER_ARGUMENT, f"`{self._short(name)}(...)` kept: {why}")
        return updated

    def _from_shim(self, node: cst.CSTNode, name: str) -> cst.BaseExpression:
        """`amp_shim.optimizers.<Class>`, the class the legacy program ran through the shim."""
        short = self._short(name)
        self.report(
            node, KEPT_FROM_SHIM, f"`{short}` has no torch.optim class: `amp_shim.optimizers.{short}` is kept"
        )
        AddImportsVisitor.add_needed_import(self.context, "amp_shim.optimizers")
        return dotted(f"amp_shim.optimizers.{short}")

    def rewrite_call(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        short = self._short(name)
        if name in FROM_SHIM:
            return updated.with_changes(func=self._from_shim(original, name))
        if name in WITHOUT_EQUIVALENT:
            self.report(original, NO_TORCH_OPTIMIZER, f"`{short}` has no torch.optim equivalent")
            return updated
        if name in ADAM:
            return self._adam(original, updated, name)
        if name in SGD:
            return self._sgd(original, updated, name)
        return self._adagrad(original, updated, name)

    def _unmappable(self, bound: Bound, defaults: dict[str, tuple]) -> Optional[str]:
        if bound.problem:
            return bound.problem
        for arg, allowed in defaults.items():
            if not bound.is_(arg, *allowed):
                return f"`{self.code_of(bound.args[arg].value)}` for `{arg}` has no torch equivalent"
        return None

    def _zero_grad(self, call: cst.Call, bound: Bound, short: str, default: bool) -> None:
        if bound.is_("set_grad_none", True) and ("set_grad_none" in bound.args or default):
            return
        self.report(
            call,
            ZERO_GRAD_SETS_NONE,
            f"`{short}` zeroed gradients in `zero_grad()`; torch's sets them to None "
            "(call `zero_grad(set_to_none=False)` to keep zeros)",
        )

    def _adam(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        bound = bind(updated, ADAM_SIGNATURE)
        why = self._unmappable(
            bound, {"bias_correction": (True,), "amsgrad": (False,), "master_weights": (False,)}
        )
        if why is None and not bound.is_("adam_w_mode", True, False):
            why = "`adam_w_mode` is not a literal, so Adam or AdamW cannot be chosen"
        if why is not None:
            return self._refuse(original, updated, name, why)
        decoupled = bound.is_("adam_w_mode", True)
        torch_cls = "torch.optim.AdamW" if decoupled else "torch.optim.Adam"
        extra = []
        if decoupled and "weight_decay" not in bound.args:
            extra.append(new_keyword("weight_decay", "0.0"))
        keep = ("params", "lr", "betas", "eps", "weight_decay", "capturable")
        self._zero_grad(original, bound, "FusedAdam", True)
        self.report(
            original,
            CHECKPOINT_FORMAT,
            f"FusedAdam → {torch_cls}: state dicts saved by FusedAdam need `step` moved "
            "into each parameter's state before loading",
        )
        return rebuild_call(updated, torch_cls, bound, TORCH_ADAM, keep, extra + self._fused())

    def _sgd(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        bound = bind(updated, SGD_SIGNATURE)
        why = self._unmappable(bound, {"wd_after_momentum": (False,)})
        if why is None and "lr" not in bound.args:
            why = "FusedSGD requires `lr`"
        if why is not None:
            return self._refuse(original, updated, name, why)
        self._zero_grad(original, bound, "FusedSGD", False)
        keep = ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov")
        return rebuild_call(updated, "torch.optim.SGD", bound, TORCH_SGD, keep, self._fused())

    def _adagrad(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        bound = bind(updated, ADAGRAD_SIGNATURE)
        why = self._unmappable(bound, {"adagrad_w_mode": (False,)})
        if why is not None:
            return self._refuse(original, updated, name, why)
        self._zero_grad(original, bound, "FusedAdagrad", True)
        self.report(
            original,
            CHECKPOINT_FORMAT,
            "FusedAdagrad → torch.optim.Adagrad: state dicts saved by FusedAdagrad need "
            "`step` moved into each parameter's state before loading",
        )
        keep = ("params", "lr", "eps", "weight_decay")
        return rebuild_call(updated, "torch.optim.Adagrad", bound, TORCH_ADAGRAD, keep, self._fused())

    def bare_reference(self, node: cst.CSTNode, name: str) -> None:
        short = self._short(name)
        if name in FROM_SHIM:  # the very class, so every use of the reference means what it did
            self._from_shim(node, name)
            self.replacements[id(node)] = f"amp_shim.optimizers.{short}"
            return
        if name in WITHOUT_EQUIVALENT:
            self.report(node, NO_TORCH_OPTIMIZER, f"`{short}` has no torch.optim equivalent")
            return
        self.report(
            node,
            OPTIMIZER_REFERENCE,
            f"`{short}` is used without being called; its torch form needs arguments "
            "a bare class cannot carry",
        )
