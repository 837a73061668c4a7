"""`apex.parallel` → `torch.nn.parallel.DistributedDataParallel` and `torch.nn.SyncBatchNorm`.

What it does
    `apex.parallel.DistributedDataParallel(model, ...)` becomes
    `torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False, ...)`,
    `convert_syncbn_model(model)` becomes `torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`
    and `apex.parallel.SyncBatchNorm(...)` becomes `torch.nn.SyncBatchNorm(...)`.

Why
    Apex deprecated its DDP and SyncBatchNorm in favour of torch's, which need no compiled
    extension.

Soundness
    Both DDPs average gradients over ranks with an allreduce after backward and broadcast rank
    0's parameters when wrapping; `broadcast_buffers=False` keeps Apex's never-synchronised
    buffers, and the bucket size carries over. Options that change the reduced values fall
    back. torch's SyncBatchNorm computes the same global batch statistics as Apex's
    (tests/shim/test_parallel.py compares them over two gloo ranks).

Fix safety
    Safe where it applies. DDP: both average gradients over ranks with an allreduce after backward, and both
    broadcast rank 0's parameters when wrapping. `device_ids` is left out on purpose: Apex
    never moved inputs, and torch DDP without `device_ids` does not either (and works for CPU
    modules). Apex never synchronised buffers; torch does at wrap time and before every
    forward unless `broadcast_buffers=False`, which is therefore passed (torch 2.13 deprecates
    the flag in favour of `forward_sync_buffers`, which still syncs at wrap time; its warning
    recommends keeping `broadcast_buffers=False` for exactly this case). `message_size`
    (elements) becomes `bucket_cap_mb` (MiB of fp32). `gradient_predivide_factor=F` is dropped
    (AMP530): torch DDP multiplies every gradient by `1/world_size` before the allreduce, which
    is Apex's arithmetic for `F == world_size` bit for bit (`tests/codemod/test_ddp_predivide.py`
    checks it over 3 gloo ranks); any other positive factor gives the same mean, one
    rounding apart, as Apex's default of 1 (sum, then divide) already was. Options that only change when or on which
    stream the allreduce runs are dropped with an info diagnostic (`delay_allreduce`,
    `allreduce_trigger_params`, `retain_allreduce_buffers`, `num_allreduce_streams`,
    `allreduce_communicators`, `prof`); `gradient_average_split_factor` was never read by
    Apex. Options that change the reduced values (`allreduce_always_fp32=True`,
    `gradient_average=False`, a literal `gradient_predivide_factor` that is not a positive
    number) would need a comm hook: the file falls back to the shim, as it does when it calls Apex-only DDP methods such
    as `disable_allreduce()`.

    SyncBatchNorm: the arguments torch has are passed as they are; `channel_last=True` and
    `fuse_relu=True` have no equivalent and fall back. torch's SyncBatchNorm cannot train on
    CPU, so with `--device cpu` these fall back too (the shim has a CPU implementation).

    A bare `apex.parallel.SyncBatchNorm` used as a value (`norm_layer=SyncBatchNorm`) becomes
    `torch.nn.SyncBatchNorm`: both take the same first six arguments with the same defaults.
    A bare `convert_syncbn_model` (`converter = apex.parallel.convert_syncbn_model`) becomes
    `torch.nn.SyncBatchNorm.convert_sync_batchnorm` (AMP532): same leading `module,
    process_group` and the same conversion; Apex's `channel_last` would raise in torch. In
    `isinstance`/`issubclass` checks and class bases, and for the DDP class used without a call,
    the meaning would change for objects this file does not create, so the file falls back. `Reducer` and `LARC` have no torch equivalent and
    fall back. `create_syncbn_process_group(n)` becomes `torch.distributed.new_subgroups(n)[0]`
    (AMP531): both build the groups of `n` consecutive ranks collectively, in the same order, and
    return this rank's; Apex's `n == 0` (no group) stays `None`.

Example
    model = apex.parallel.DistributedDataParallel(model)
becomes
    model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
"""

from __future__ import annotations

import math
from typing import Optional, cast

import libcst as cst
import libcst.matchers as m

from ..analysis.call_args import NOT_LITERAL, Bound, bind, literal, new_keyword, rebuild_call
from ..diagnostics import Severity, define
from ..plan.types import pure
from .base import ApexClassRule
from .facts import Fact

DDP_REPLACED = define(
    "AMP520",
    "apex-ddp-to-torch",
    Severity.INFO,
    "apex.parallel.DistributedDataParallel became torch's DistributedDataParallel.",
    "Gradients are averaged over ranks as before, and parameters are broadcast from rank 0 "
    "when wrapping. One behaviour is stricter: torch DDP raises in the next iteration when a "
    "parameter that requires grad got no gradient (Apex skipped it). If the model has such "
    "parameters, pass `find_unused_parameters=True`. `broadcast_buffers=False` keeps Apex's "
    "per-rank buffers.",
    before="from apex.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)",
    after="import torch\nmodel = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)",
)
DDP_ARGUMENT_DROPPED = define(
    "AMP521",
    "apex-ddp-argument-dropped",
    Severity.INFO,
    "An Apex DDP option that only affects communication timing was dropped.",
    "`delay_allreduce`, `allreduce_trigger_params`, `retain_allreduce_buffers`, "
    "`num_allreduce_streams`, `allreduce_communicators` and `prof` decide when, on which "
    "stream or with which profiling ranges Apex ran its allreduces. torch DDP buckets and "
    "overlaps on its own (tune it with `bucket_cap_mb`); the averaged gradients are the same.",
    before="model = DDP(model, delay_allreduce=True)",
    after="model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)",
    variants=("the averaged gradients",),
)
DDP_ARGUMENT = define(
    "AMP522",
    "apex-ddp-argument-not-mappable",
    Severity.WARNING,
    "An Apex DDP option changes the reduced gradients in a way torch DDP does not by "
    "default; the file uses the shim.",
    "`allreduce_always_fp32=True`, `gradient_average=False` and a `gradient_predivide_factor` "
    "other than 1 change the values that are allreduced; torch needs a custom comm hook "
    "(`register_comm_hook`) for each. Non-literal values, `**kwargs` and unknown arguments "
    "cannot be checked. The file keeps Apex's DDP through the shim; write the comm hook by "
    "hand to go native.",
    before="model = DDP(model, gradient_predivide_factor=8.0)",
    after="from amp_shim.parallel import DistributedDataParallel as DDP  # import rewritten only",
    falls_back=True,
    refusal="the option changes the reduced gradients",
    fallback_title="`apex.parallel`",
    shape=(
        "`DistributedDataParallel(model, **ddp_kwargs)`; `allreduce_always_fp32=True`; "
        "`gradient_average=False`."
    ),
    fallback_why=(
        "Keyword arguments the file does not show cannot be checked; the others change the reduced gradients "
        "(torch needs a comm hook for each). A literal `gradient_predivide_factor` is native (AMP530) unless "
        "it is no positive number."
    ),
    by_hand="Spell the arguments out, or register a comm hook.",
)
DDP_METHOD = define(
    "AMP523",
    "apex-ddp-only-attribute",
    Severity.WARNING,
    "The file uses an attribute only Apex's DDP has; the file uses the shim.",
    "`enable_allreduce()`/`disable_allreduce()` (gradient accumulation without allreduce), "
    "`allreduce_buffers` and Apex's bucket internals do not exist on torch DDP. The usual "
    "replacement for `disable_allreduce()` is `with model.no_sync():` around the "
    "accumulation steps, which changes the code's structure, so it is left to you.",
    before="model.disable_allreduce()\nloss.backward()\nmodel.enable_allreduce()",
    after="with model.no_sync():\n    loss.backward()",
    falls_back=True,
    refusal="an attribute only Apex's DDP has",
    fallback_title="an attribute only Apex's DDP has",
    shape=(
        "`model.disable_allreduce()` during gradient accumulation and `model.enable_allreduce()` before the "
        "last micro-batch; `allreduce_buffers`; Apex's bucket internals."
    ),
    by_hand=(
        "Run the accumulation steps under `with model.no_sync():` on torch's `DistributedDataParallel`, and "
        "the last micro-batch outside it; drop the other attributes."
    ),
)
PREDIVIDE_DROPPED = define(
    "AMP530",
    "apex-ddp-predivide-dropped",
    Severity.INFO,
    "`gradient_predivide_factor` was dropped: torch DDP already divides every gradient by the "
    "world size before the allreduce.",
    "Apex multiplied each bucket by `1/F`, summed it over ranks, then by `F/world_size`; torch DDP "
    "multiplies by `1/world_size` and sums. With `F` equal to the world size (the usual "
    "`gradient_predivide_factor=get_world_size()`) that is the same arithmetic, bit for bit; any "
    "other positive `F` gives the same mean, differing at most in the last bit of one rounding, "
    "as Apex's default `F=1` (sum, then divide) already did. The factor guarded fp16 gradient "
    "sums against overflow; native gradients are fp32 and torch's division comes first. The "
    "expression is no longer evaluated: the message names any call it made.",
    before="model = DDP(model, gradient_predivide_factor=get_world_size())",
    after="model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)",
    variants=("by the world size before the allreduce",),
)
SUBGROUPS = define(
    "AMP531",
    "syncbn-process-group-to-new-subgroups",
    Severity.INFO,
    "`create_syncbn_process_group(n)` became this rank's group of `torch.distributed.new_subgroups(n)`.",
    "Both create the groups of `n` consecutive ranks, every rank creating every group in the "
    "same order (a collective), and hand back the one this rank belongs to "
    "(`tests/codemod/test_syncbn_process_group_semantics.py` compares them over 4 gloo ranks). "
    "Apex's `0` meant no group (the whole job): a literal 0 becomes `None`, a run-time size "
    "`... if n else None`. A size that does not divide the world size fails in both, with "
    "`ValueError` instead of Apex's `AssertionError`.",
    before="group = apex.parallel.create_syncbn_process_group(8)",
    after="group = torch.distributed.new_subgroups(8)[0]",
)
CONVERT_REFERENCE = define(
    "AMP532",
    "convert-syncbn-reference",
    Severity.INFO,
    "`convert_syncbn_model` used as a value became `torch.nn.SyncBatchNorm.convert_sync_batchnorm`.",
    "Both take `module, process_group=None` first and convert every `_BatchNorm` of the module "
    "into a SyncBatchNorm with its running statistics and affine parameters, so a caller that "
    "passes those gets the same model. A caller that passes Apex's `channel_last` gets a "
    "TypeError from torch's function, not a different model.",
    before="bn_converter = apex.parallel.convert_syncbn_model",
    after="bn_converter = torch.nn.SyncBatchNorm.convert_sync_batchnorm",
)
SYNCBN_ARGUMENT = define(
    "AMP524",
    "syncbn-argument-not-mappable",
    Severity.WARNING,
    "An argument of Apex's SyncBatchNorm has no torch equivalent; the file uses the shim.",
    "`channel_last=True` and `fuse_relu=True` select Apex's fused NHWC kernels (and the "
    "residual input `z` of its forward); torch's SyncBatchNorm has neither. Non-literal "
    "values, `**kwargs` and unknown arguments cannot be checked.",
    before="model = convert_syncbn_model(model, channel_last=True)",
    after="from amp_shim.parallel import convert_syncbn_model  # import rewritten only",
    falls_back=True,
    refusal="a SyncBatchNorm argument with no torch equivalent",
    fallback_title="a SyncBatchNorm argument with no torch equivalent",
    shape=(
        "`SyncBatchNorm(c, channel_last=True)`, `fuse_relu=True`, a non-literal value, `**kwargs` or an "
        "argument torch's class does not have."
    ),
    by_hand=(
        "Use `torch.nn.SyncBatchNorm` on NCHW input and apply the residual add and the ReLU after it "
        "(`torch.relu(bn(x) + z)`), or keep the shim's fused kernels."
    ),
)
NO_TORCH_PARALLEL = define(
    "AMP525",
    "parallel-without-torch-equivalent",
    Severity.WARNING,
    "This apex.parallel helper has no torch equivalent; the file uses the shim.",
    "`Reducer` (manual gradient allreduce) and `LARC` (layer-wise adaptive rate clipping "
    "around an optimizer) have no one-line torch form. `create_syncbn_process_group` has one "
    "(AMP531) except where its size cannot be read (`*args`, a size with side effects, which "
    "the native form reads twice). The shim provides them unchanged. "
    "The message names the helper, or the `group_size` that is no group size or has side effects.",
    before="from apex.parallel import LARC\nopt = LARC(opt)",
    after="from amp_shim.parallel import LARC\nopt = LARC(opt)",
    falls_back=True,
    refusal="no torch equivalent",
    variants=(
        "no group size",
        "has no torch equivalent",
        "side effects",
    ),
    fallback_title="`apex.parallel`",
    shape=(
        "`apex.parallel.Reducer`, `LARC`; `create_syncbn_process_group` with a size whose expression has "
        "side effects."
    ),
    fallback_why=(
        "No one-line torch form (Reducer, LARC); the native group size is read twice (`new_subgroups(n)[0] "
        "if n else None`)."
    ),
    by_hand="`dist.all_reduce` loops or DDP for Reducer; vendor LARC; read the size into a local.",
)
PARALLEL_REFERENCE = define(
    "AMP526",
    "parallel-class-reference",
    Severity.WARNING,
    "An apex.parallel class or function is used without being called in a way whose torch "
    "form is not provably the same; the file uses the shim.",
    "`isinstance(m, apex.parallel.DistributedDataParallel)` would become true for torch DDP "
    "models this file never wrapped and false for models Apex's DDP wrapped elsewhere; a bare "
    "DDP class is called elsewhere with arguments this codemod cannot see and map (Apex's "
    "`message_size`, `delay_allreduce`, ... are not torch's). The message says which: torch's "
    "class would match objects this file never made (and miss those Apex made elsewhere), or "
    "the class is called later with arguments this file does not show.",
    before="if isinstance(model, apex.parallel.DistributedDataParallel):\n    model = model.module",
    after="import amp_shim as apex  # import rewritten only",
    falls_back=True,
    refusal="a bare class would change meaning for objects made elsewhere",
    variants=(
        "would match objects this file never made",
        "called later with arguments",
    ),
    fallback_title="`apex.parallel`",
    shape=(
        "`parallel_wrappers + (apex_DDP,)` (a tuple of wrapper types for `isinstance`), a bare DDP class "
        "stored for later calls."
    ),
    fallback_why=(
        "In a library, models wrapped by the real Apex DDP in user code still reach the check; replacing the "
        "class would make it miss them, and a stored DDP class is called with Apex's arguments the file does "
        "not show. (A stored `convert_syncbn_model` is native: AMP532.)"
    ),
    by_hand="In your own code, where nothing wraps with Apex any more, delete the Apex entry.",
)
SYNCBN_CPU = define(
    "AMP527",
    "syncbn-on-cpu",
    Severity.WARNING,
    "torch.nn.SyncBatchNorm cannot train on CPU; with `--device cpu` the file uses the shim.",
    "torch's SyncBatchNorm synchronises statistics only for accelerator tensors and raises "
    "for CPU input in training. The shim's SyncBatchNorm works on CPU over gloo.",
    before="# amp-migrate --device cpu\nmodel = convert_syncbn_model(model)",
    after="from amp_shim.parallel import convert_syncbn_model  # import rewritten only",
    falls_back=True,
    refusal="torch's SyncBatchNorm cannot train on CPU",
    fallback_title="SyncBatchNorm trained on CPU",
    shape="`apex.parallel.SyncBatchNorm` or `convert_syncbn_model` in a file migrated with `--device cpu`.",
    by_hand=(
        "Migrate for an accelerator (`--device cuda`), or keep plain `torch.nn.BatchNorm2d` for CPU runs; "
        "the shim's SyncBatchNorm runs on CPU over gloo."
    ),
)
SYNCBN_REFERENCE = define(
    "AMP528",
    "syncbn-class-reference",
    Severity.INFO,
    "apex.parallel.SyncBatchNorm used as a value became torch.nn.SyncBatchNorm.",
    "Both classes take `num_features, eps, momentum, affine, track_running_stats, "
    "process_group` in that order with the same defaults, so a caller that passes those "
    "builds the same layer. Callers that pass `channel_last`/`fuse_relu`, or call the layer "
    "with a residual `z`, must drop them.",
    before="block = Block(norm_layer=SyncBatchNorm)",
    after="block = Block(norm_layer=torch.nn.SyncBatchNorm)",
)

TORCH_DDP = "torch.nn.parallel.DistributedDataParallel"
CONVERT = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
TORCH_SYNCBN = "torch.nn.SyncBatchNorm"

DDP_NAMES = {"apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel"}
CONVERT_NAMES = {"apex.parallel.convert_syncbn_model"}
SYNCBN_NAMES = {
    "apex.parallel.SyncBatchNorm",
    "apex.parallel.optimized_sync_batchnorm.SyncBatchNorm",
    "apex.parallel.sync_batchnorm.SyncBatchNorm",
}
WITHOUT_EQUIVALENT = {
    "apex.parallel.Reducer",
    "apex.parallel.distributed.Reducer",
    "apex.parallel.LARC",
    "apex.parallel.LARC.LARC",
}
PROCESS_GROUP_NAMES = {"apex.parallel.create_syncbn_process_group"}
NEW_SUBGROUPS = "torch.distributed.new_subgroups"

DDP_SIGNATURE = (
    "module",
    "message_size",
    "delay_allreduce",
    "shared_param",
    "allreduce_trigger_params",
    "retain_allreduce_buffers",
    "allreduce_always_fp32",
    "num_allreduce_streams",
    "allreduce_communicators",
    "gradient_average",
    "gradient_predivide_factor",
    "gradient_average_split_factor",
    "prof",
)
#: Apex DDP options that change only timing, streams or profiling, with their no-op value.
DDP_TIMING_ONLY = {
    "delay_allreduce": False,
    "allreduce_trigger_params": None,
    "retain_allreduce_buffers": False,
    "num_allreduce_streams": 1,
    "allreduce_communicators": None,
    "prof": False,
}
#: Apex DDP options that change the reduced values, with the only value torch matches.
DDP_VALUE_CHANGING = {"shared_param": None, "allreduce_always_fp32": False, "gradient_average": True}
DDP_ONLY_ATTRIBUTES = (
    "enable_allreduce",
    "disable_allreduce",
    "allreduce_buffers",
    "allreduce_fallback",
    "sync_bucket_structure",
    "needs_refresh",
)

CONVERT_SIGNATURE = ("module", "process_group", "channel_last")
SYNCBN_SIGNATURE = (
    "num_features",
    "eps",
    "momentum",
    "affine",
    "track_running_stats",
    "process_group",
    "channel_last",
    "fuse_relu",
)
TORCH_SYNCBN_ARGS = SYNCBN_SIGNATURE[:6]
FP32_BYTES = 4


def bucket_cap_mb(message_size: cst.BaseExpression) -> str:
    """Apex's bucket size counts fp32 elements; torch's counts MiB."""
    value = literal(message_size)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        mib = round(value * FP32_BYTES / 2**20, 2)
        return str(int(mib)) if mib == int(mib) else repr(mib)
    code = cst.Module([]).code_for_node(message_size)
    if not isinstance(message_size, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        code = f"({code})"
    return f"{code} * {FP32_BYTES} / 2**20"


class ApexParallelToTorch(ApexClassRule):
    """apex.parallel DDP, SyncBatchNorm and convert_syncbn_model → torch's."""

    MARKERS = ("parallel",)

    HANDLED = frozenset(DDP_NAMES | CONVERT_NAMES | SYNCBN_NAMES | WITHOUT_EQUIVALENT | PROCESS_GROUP_NAMES)
    HANDLES = tuple(sorted(HANDLED))
    EMITS = (
        DDP_REPLACED,
        DDP_ARGUMENT_DROPPED,
        DDP_ARGUMENT,
        DDP_METHOD,
        SYNCBN_ARGUMENT,
        NO_TORCH_PARALLEL,
        PARALLEL_REFERENCE,
        SYNCBN_CPU,
        SYNCBN_REFERENCE,
        PREDIVIDE_DROPPED,
        SUBGROUPS,
        CONVERT_REFERENCE,
    )
    READS = frozenset({Fact.APEX_ANALYSED})
    WRITES = frozenset({Fact.APEX_CALLS_REWRITTEN, Fact.FALLBACK_REASONS, Fact.IMPORT_REQUESTS})

    def visit_Module(self, node: cst.Module) -> None:
        self._ddp_only = [
            cast(cst.Attribute, a)  # what the m.Attribute matcher found
            for a in self.findall(
                node,
                m.Attribute(attr=m.OneOf(*(m.Name(n) for n in DDP_ONLY_ATTRIBUTES))),
                DDP_ONLY_ATTRIBUTES,
            )
            if self.apex_name(a) is None
        ]

    def _short(self, name: str) -> str:
        return name.rsplit(".", 1)[1]

    def rewrite_call(self, original: cst.Call, updated: cst.Call, name: str) -> cst.BaseExpression:
        if name in WITHOUT_EQUIVALENT:
            self.report(original, NO_TORCH_PARALLEL, f"`{self._short(name)}` has no torch equivalent")
            return updated
        if name in DDP_NAMES:
            return self._ddp(original, updated)
        if name in PROCESS_GROUP_NAMES:
            return self._subgroup(original, updated)
        if self.options.device == "cpu":
            self.report(original, SYNCBN_CPU)
            return updated
        if name in CONVERT_NAMES:
            return self._convert(original, updated)
        bound = bind(updated, SYNCBN_SIGNATURE)
        if not self._syncbn_arguments_map(original, bound, "SyncBatchNorm"):
            return updated
        return rebuild_call(updated, TORCH_SYNCBN, bound, TORCH_SYNCBN_ARGS, TORCH_SYNCBN_ARGS)

    def _syncbn_arguments_map(self, call: cst.Call, bound: Bound, short: str) -> bool:
        why = bound.problem
        for flag in ("channel_last", "fuse_relu"):
            value = bound.value(flag)  # given wherever it is not allowed (`is_`)
            if why is None and value is not None and not bound.is_(flag, False):
                why = f"`{flag}={self.code_of(value)}` has no torch equivalent"
        if why is not None:
            self.report(call, SYNCBN_ARGUMENT, f"`{short}(...)` kept: {why}")
            return False
        return True

    def _convert(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        bound = bind(updated, CONVERT_SIGNATURE)
        if not self._syncbn_arguments_map(original, bound, "convert_syncbn_model"):
            return updated
        return rebuild_call(updated, CONVERT, bound, ("module", "process_group"), ("module", "process_group"))

    def _ddp(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        bound = bind(updated, DDP_SIGNATURE)
        why = bound.problem
        for arg, allowed in DDP_VALUE_CHANGING.items():
            value = bound.value(arg)  # given wherever it is not allowed (`is_`)
            if why is None and value is not None and not bound.is_(arg, allowed):
                why = f"`{arg}={self.code_of(value)}` changes the reduced gradients"
        if why is None:
            why = self._predivide_problem(original, bound.value("gradient_predivide_factor"))
        if why is not None:
            self.report(original, DDP_ARGUMENT, f"`DistributedDataParallel(...)` kept: {why}")
            return updated
        for attribute in self._ddp_only:
            self.report(
                attribute,
                DDP_METHOD,
                f"`.{attribute.attr.value}` exists only on Apex's DistributedDataParallel",
            )
        dropped = [arg for arg, noop in DDP_TIMING_ONLY.items() if not bound.is_(arg, noop)]
        if dropped:
            self.report(
                original,
                DDP_ARGUMENT_DROPPED,
                "dropped "
                + ", ".join(f"`{a}`" for a in dropped)
                + ": "
                + ("it changes" if len(dropped) == 1 else "they change")
                + " only when or how the allreduce runs, not the averaged gradients",
            )
        self.report(
            original,
            DDP_REPLACED,
            "apex.parallel.DistributedDataParallel → torch's, with Apex's per-rank "
            "buffers; pass `find_unused_parameters=True` if some parameters get no "
            "gradient in an iteration",
        )
        extra = [new_keyword("broadcast_buffers", "False")]
        size = bound.value("message_size")
        if size is not None:
            extra.append(new_keyword("bucket_cap_mb", bucket_cap_mb(size)))
        return rebuild_call(updated, TORCH_DDP, bound, ("module",), ("module",), extra)

    def _subgroup(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """`create_syncbn_process_group(n)` → this rank's group of `new_subgroups(n)`; Apex's 0
        (no group: the whole job) stays None."""
        bound = bind(updated, ("group_size",))
        size = bound.value("group_size")
        value = literal(size) if size is not None else NOT_LITERAL
        why = bound.problem or ("no `group_size` is given" if size is None else None)
        if why is None and size is not None and value is NOT_LITERAL and not pure(size):
            why = f"`group_size={self.code_of(size)}` is read twice natively (0 gives no group) and has side effects"
        elif (
            why is None
            and size is not None
            and value is not NOT_LITERAL
            and (isinstance(value, bool) or not isinstance(value, int) or value < 0)
        ):
            why = f"`group_size={self.code_of(size)}` is no group size"
        if why is not None:
            self.report(original, NO_TORCH_PARALLEL, f"`create_syncbn_process_group(...)` kept: {why}")
            return updated
        assert size is not None, "`why` says where it is not given"
        self.report(original, SUBGROUPS)
        if value == 0:
            return cst.Name("None")
        group = cst.Subscript(
            cst.Call(cst.parse_expression(NEW_SUBGROUPS), [cst.Arg(size)]),
            [cst.SubscriptElement(cst.Index(cst.Integer("0")))],
        )
        if value is not NOT_LITERAL:
            return group
        loose = not isinstance(self._path[-1] if self._path else None, (cst.Assign, cst.Arg, cst.Return))
        parens = (
            ([cst.LeftParen()], [cst.RightParen()])
            if loose and not updated.lpar
            else (updated.lpar, updated.rpar)
        )
        return cst.IfExp(
            test=size.deep_clone(), body=group, orelse=cst.Name("None"), lpar=parens[0], rpar=parens[1]
        )

    def _predivide_problem(self, call: cst.Call, factor: Optional[cst.BaseExpression]) -> Optional[str]:
        """Why `gradient_predivide_factor` cannot be dropped (a literal that is no positive finite
        number, where Apex divided by zero or flipped signs); reports the drop otherwise."""
        if factor is None:
            return None
        value, code = literal(factor), self.code_of(factor)
        if value is not NOT_LITERAL:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                return f"`gradient_predivide_factor={code}` is no positive number"
            if value == 1:
                return None
        calls = [self.code_of(c) for c in m.findall(factor, m.Call())]
        dropped = f"; `{calls[0]}` is no longer evaluated here" if calls else ""
        self.report(
            call,
            PREDIVIDE_DROPPED,
            f"dropped `gradient_predivide_factor={code}`: torch DDP divides by the world size "
            f"before the allreduce, as Apex did with a factor equal to it{dropped}",
        )
        return None

    def bare_reference(self, node: cst.CSTNode, name: str) -> None:
        short = self._short(name)
        if name in WITHOUT_EQUIVALENT:
            self.report(node, NO_TORCH_PARALLEL, f"`{short}` has no torch equivalent")
        elif name in CONVERT_NAMES and self.reference_context(node) != "check":
            if self.options.device == "cpu":
                self.report(node, SYNCBN_CPU)
            else:
                self.report(node, CONVERT_REFERENCE)
                self.replacements[id(node)] = CONVERT
        elif name not in SYNCBN_NAMES or self.reference_context(node) == "check":
            if self.reference_context(node) == "check" or name in DDP_NAMES | SYNCBN_NAMES:
                why = (
                    "torch's class would match objects this file never made and miss those "
                    "Apex made elsewhere"
                )
            else:
                why = "it is called later with arguments this file does not show"
            self.report(
                node, PARALLEL_REFERENCE, f"`{short}` used without a call cannot be mapped provably: {why}"
            )
        elif self.options.device == "cpu":
            self.report(node, SYNCBN_CPU)
        else:
            self.report(node, SYNCBN_REFERENCE)
            self.replacements[id(node)] = TORCH_SYNCBN
