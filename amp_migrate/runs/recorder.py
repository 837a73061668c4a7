"""Run one training program and record, from outside, what it did.

    python [-m amp_shim] recorder.py --mode shim|native|migrated RESULT.json PROGRAM.py [args...]

The program runs unchanged (`runpy`, as `__main__`, with its own `sys.argv`). Nothing in it
reports to the harness; the recorder watches it through hooks installed before it starts:

* per-iteration losses: the lines the program prints (one line per iteration, holding
  `loss <value>`; several losses per line for the GAN), parsed as they are written;
* which optimizer really stepped in which iteration (the iteration is the number of loss lines
  printed so far): torch's global optimizer step hook; in native mode a `GradScaler.step` that
  found inf/NaN counts as skipped even when a fused optimizer ran its kernel (which then skips
  internally); in shim mode, a step that ran with a non-zero `optimizer.found_inf` (the shim's
  amp hands the skip to an optimizer that supports amp scaling that way, as GradScaler does)
  counts as skipped too;
* the loss scale(s) at every iteration: shim mode reads `_amp_state.loss_scalers` (and the
  scalers of the old API's `OptimWrapper`), native mode every `torch.amp.GradScaler` created
  (`get_scale()`, 1.0 when disabled), migrated mode both (see below);
* the final parameters: every optimizer's param groups in creation order (fp32 masters under
  the shim's O2), saved next to RESULT.json as RESULT.pt;
* the step records ("step_records"): one per optimizer step the program asked for, real or
  skipped, whatever it prints (see `StepLog`). The step hook is `GradScaler.step` in native
  mode and, in shim mode, the step `amp.initialize` patches onto each optimizer, the old API's
  `OptimWrapper.step` and `FP16_Optimizer.step`; any other `optimizer.step()` comes through
  torch's global step hook. The losses are those of each `backward` (`Tensor.backward` or
  `torch.autograd.backward`), unscaled: when the tensor is a scaled loss (`GradScaler.scale`,
  the shim's scaler behind `amp.scale_loss` and `FP16_Optimizer.backward`, `OptimWrapper`'s
  `scale_loss`), the value of the loss that was scaled.

* the call sites ("step_calls", one list per step record): where in the program's own files
  (those under its folder) the amp calls since the previous record were made, as
  `[what, file, line]` (file relative to the starting directory): in native mode
  `GradScaler()`, its `scale`, `unscale_`, `step`, `update`, `state_dict`, `load_state_dict`
  and `torch.autocast` entered; in shim mode `amp.initialize`, `amp.scale_loss`,
  `amp.master_params`, `amp.state_dict`, `amp.load_state_dict` and the optimizer's step; in
  both, each outermost module forward, with the autocast it ran under. Kept apart from the
  step records, which the two modes must write equal; `verify` uses them to say where a
  diverging step's statements are.
* the amp calls of the whole run ("amp_calls", shim mode, and migrated mode once the program
  loaded the shim; from the start: calls before the first step record and from any file
  included): how often `amp.initialize`, `amp.scale_loss`, `amp.init`, the step
  `amp.initialize` patches on ("amp optimizer.step"), the old API's `OptimWrapper.scale_loss`/
  `step` and `FP16_Optimizer.backward`/`step` ran; `verify` passes no run in which none of
  them ran. "amp_used" says which mixed precision ran: "GradScaler" (one was built),
  "amp_shim" (one of those calls ran).
* with `--watch-lines FILE` (verify's migrated run: the lines the migration wrote), which of
  those lines executed ("executed_lines", per file).

`--max-steps N` ends the program once N step records are complete (their scales included: in
native mode a scaler step's record completes at the scaler's `update()`), by an exception that
the recorder catches, so the run still exits 0 and writes its result, with "stopped": true.
`--seed S` seeds torch, `random` and numpy (when importable) before the program starts;
`--deterministic` then turns on torch's deterministic algorithms (`warn_only`). `--progress
FILE` appends `RANK COUNT` to FILE as each step record is made (verify's progress). Under torchrun,
`{rank}` in RESULT becomes the rank (the RANK variable), so that each rank writes its own.

`--mode native` also makes `apex` and `amp_shim` unimportable and checks at exit that neither
was imported. `--mode shim` expects the shim: either the `apex` alias (`python -m amp_shim
recorder.py ...`) or code that imports `amp_shim` itself (the codemod's `--target shim` output).
`--mode migrated` is for a migrated tree that keeps some files on the shim: `apex` is
unimportable (and checked not imported), `amp_shim` is not; GradScaler is instrumented as in
native mode and the shim as in shim mode from the moment the program imports `amp_shim` (never
before: a run that does not import it records exactly what native mode records). Each record
is made by whichever hook its step ran through, and its scales are the GradScalers' (as in
native mode) followed by the shim's (as in shim mode), so a run that used only one of them
records what that one's mode would; a run that used both records both, in that order.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.abc
import io
import json
import math
import os
import re
import runpy
import sys
import threading
import time
import traceback
import types
import weakref
from typing import Any, Optional

LOSS = re.compile(
    r"\b[Ll]oss(?!_scale)(?:_\w+)?\s*[:=]?\s+([-+]?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))\b"
)
BLOCKED = ("apex", "amp_shim")
MODES = ("shim", "native", "migrated")
#: Per mode, the modules its program must not import (made unimportable, checked at exit: exit 3).
FORBIDDEN: dict[str, tuple[str, ...]] = {"shim": (), "native": BLOCKED, "migrated": ("apex",)}
#: Where the run started: call sites are written relative to it (verify starts each run in the
#: root of the tree it migrated, so they read as the migration's own paths).
_START_DIR = os.getcwd()
#: Calls kept per step record at most: a step that makes more is not a normal training step.
_MAX_CALLS = 200


class _Blocker(importlib.abc.MetaPathFinder):
    """Native mode: `import apex` / `import amp_shim` fail as on a machine without them
    (migrated mode: `import apex`)."""

    def __init__(self, blocked: tuple[str, ...] = BLOCKED) -> None:
        self.blocked = blocked

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (blocked by the recorder)", name=fullname
            )
        return None


class _OnFirstImport(importlib.abc.MetaPathFinder):
    """Migrated mode: `then` runs once the program's first import of the top-level module
    `name` has executed it, before that import returns, so that the shim is instrumented before
    the program can call it, and only in a run that loads it."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then
        self._looking = self._done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._looking or self._done:
            return None
        import importlib.util

        self._looking = True
        try:
            spec = importlib.util.find_spec(fullname)  # the finders after this one
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        self._done = True
        loader, then = spec.loader, self.then
        exec_module = loader.exec_module

        def exec_then(module) -> None:
            exec_module(module)
            then()

        loader.exec_module = exec_then
        return spec


class _StopRun(BaseException):
    """--max-steps reached. A BaseException, so that the program's `except Exception` handlers
    let it through to `main`, which ends the run cleanly."""


def _number(value: float) -> Any:
    """A float JSON can hold: "inf", "-inf" and "nan" as strings."""
    return value if math.isfinite(value) else repr(value)


def _params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _float64(tensor):
    """The tensor in float64, through the dispatcher's ops: the shim's O1 wraps tensor methods
    such as `sum` and `pow` in Python to cast them to float32, which would round a checksum."""
    import torch

    return torch.ops.aten._to_copy.default(tensor.detach(), dtype=torch.float64)


def _grad_norm(optimizer) -> float:
    """Global L2 norm of the optimizer's grads, accumulated in float64 (the same arithmetic in
    both modes, so equal grads give equal norms bit for bit). A fused optimizer that
    GradScaler drives gets its grads still scaled (`optimizer.grad_scale`, unscaled in its
    kernel): they are unscaled here the way `GradScaler.unscale_` does."""
    import torch

    aten = torch.ops.aten
    grad_scale = getattr(optimizer, "grad_scale", None)
    inv_scale = None
    if isinstance(grad_scale, torch.Tensor):
        inv_scale = aten._to_copy.default(aten.reciprocal.default(_float64(grad_scale)), dtype=torch.float32)
    total = 0.0
    for p in _params(optimizer):
        grad = p.grad
        if grad is None:
            continue
        if grad.is_sparse:
            grad = grad.coalesce().values()
        if inv_scale is not None:
            grad = aten.mul.Tensor(grad.detach(), inv_scale.to(grad.device))
        values = _float64(grad)
        total += aten.sum.default(aten.mul.Tensor(values, values)).item()
    return math.sqrt(total)


def _param_sums(optimizer) -> tuple[float, float]:
    import torch

    aten = torch.ops.aten
    total = absolute = 0.0
    for p in _params(optimizer):
        values = _float64(p)
        total += aten.sum.default(values).item()
        absolute += aten.sum.default(aten.abs.default(values)).item()
    return total, absolute


class CallSites:
    """Where in the program's own files a call was made: the first frame outward whose file lies
    under the program's folder (the recorder's, the shim's and torch's frames never count)."""

    def __init__(self) -> None:
        self._folder: Optional[str] = None
        self._mine: dict[str, bool] = {}
        self._recorder = os.path.abspath(__file__)

    def _is_user_file(self, filename: str) -> bool:
        known = self._mine.get(filename)
        if known is None:
            if self._folder is None:  # the program's path: `sys.argv[0]` while it runs
                self._folder = os.path.dirname(os.path.abspath(sys.argv[0])) + os.sep
            path = os.path.abspath(filename)
            known = (
                not filename.startswith("<")
                and path.startswith(self._folder)
                and path != self._recorder
                and "site-packages" not in path
            )
            self._mine[filename] = known
        return known

    def site(
        self, frame: Optional[types.FrameType] = None, outward: bool = True
    ) -> Optional[tuple[str, int]]:
        """(file, line) of the user's frame at or outward from `frame` (default: the caller);
        with `outward` False, only `frame` itself may be it."""
        frame = frame or sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if self._is_user_file(filename):
                path = os.path.abspath(filename)
                if path.startswith(_START_DIR + os.sep):
                    path = os.path.relpath(path, _START_DIR)
                return path.replace(os.sep, "/"), frame.f_lineno
            if not outward:
                return None
            frame = frame.f_back
        return None


def _autocast_state(torch) -> str:
    """The autocast a forward runs under, as the report shows it."""
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                return f"autocast {device} {str(torch.get_autocast_dtype(device)).replace('torch.', '')}"
        except (TypeError, RuntimeError, AttributeError):  # a torch without per-device queries
            continue
    return "no autocast"


class StepLog:
    """The step records: one per optimizer step the program asked for, in order, with the
    unscaled losses of the backwards since the previous record, the loss scales after the step,
    whether it was skipped, the grad norm it applied and a checksum of the parameters.

    A record's scales are taken when it is settled: at once, except after a native
    `GradScaler.step`, whose scale changes only at the `update()` that follows; such a record
    settles at that update (or, if none comes, at the next `scale`, backward or record-free end),
    so that both modes report the scale each step leaves behind.
    """

    def __init__(self, recorder: "Recorder", max_steps: Optional[int]) -> None:
        self.recorder = recorder
        self.max_steps = max_steps
        self.records: list[dict] = []
        self.stopped = False
        self._losses: list[float] = []  # unscaled losses of the backwards since the last record
        self._unsettled: list[dict] = []
        self._scaled: dict[int, tuple[Any, float]] = {}  # id(scaled) -> (weakref, unscaled value)
        self._norms: dict[int, float] = {}  # id(optimizer) -> grad norm as its step began
        self.calls: list[list[list]] = []  # per record: [what, file, line] of its amp calls
        self._pending_calls: list[list] = []
        self._clips: list[bool] = []  # whether each gradient clipping since the last record acted

    def note(self, what: str, site: Optional[tuple[str, int]], settling: bool = False) -> None:
        """A call made from the program's files: it belongs to the next record, unless it is
        `settling` the record before (a native `update()` after its step)."""
        if site is None or self.stopped:
            return
        calls = self.calls[-1] if settling and self._unsettled and self.calls else self._pending_calls
        if len(calls) < _MAX_CALLS:
            calls.append([what, site[0], site[1]])

    def remember_scaled(self, scaled, loss) -> None:
        """`scaled` is `loss` times a loss scale: its backward records `loss`'s value."""
        import torch

        if isinstance(loss, torch.Tensor) and isinstance(scaled, torch.Tensor) and loss.numel() == 1:
            if len(self._scaled) > 64:  # scaled losses that never backpropagated
                self._scaled = {k: v for k, v in self._scaled.items() if v[0]() is not None}
            self._scaled[id(scaled)] = (weakref.ref(scaled), float(loss.detach()))

    def on_backward(self, tensor) -> None:
        self.settle()
        entry = self._scaled.pop(id(tensor), None)
        if entry is not None and entry[0]() is tensor:
            self._losses.append(entry[1])
        elif tensor.numel() == 1:
            self._losses.append(float(tensor.detach()))

    def on_clip(self, acted: bool) -> None:
        self._clips.append(acted)

    def on_step_start(self, optimizer) -> None:
        """The grads as the update sees them (unscaled; the shim's O2 drops them after)."""
        self._norms[id(optimizer)] = _grad_norm(optimizer)

    def record(self, optimizer, skipped: bool, settle: bool = True) -> None:
        norm = self._norms.pop(id(optimizer), None)
        if self.stopped:
            return
        if norm is None and not skipped:
            norm = _grad_norm(optimizer)
        total, absolute = _param_sums(optimizer)
        entry = {
            "optimizer": self.recorder.optimizer_index(optimizer),
            "skipped": skipped,
            "losses": [_number(v) for v in self._losses],
            "scales": [],
            "grad_norm": None if skipped or norm is None else _number(norm),
            "param_sum": _number(total),
            "param_abs_sum": _number(absolute),
        }
        self._losses = []
        if any(self._clips[:-1]):  # a clipping that acted before the one that precedes the step
            entry["events"] = ["partial_clip"]
        self._clips = []
        self.records.append(entry)
        _report_progress(len(self.records))
        self.calls.append(self._pending_calls)
        self._pending_calls = []
        self._unsettled.append(entry)
        if settle:
            self.settle()

    def settle(self, stop: bool = True) -> None:
        if self._unsettled:
            scales = self.recorder.record_scales()
            for entry in self._unsettled:
                entry["scales"] = list(scales)
            self._unsettled = []
        if stop and not self.stopped and self.max_steps is not None and len(self.records) >= self.max_steps:
            self.stopped = True
            raise _StopRun


class Recorder:
    def __init__(self, mode: str, max_steps: Optional[int] = None) -> None:
        self.mode = mode
        self.losses: list[list[float]] = []
        self.scales: list[list[float]] = []
        self.steps: list[list[int]] = []  # [iteration, optimizer index] of every real step
        self.optimizers: list = []
        self.grad_scalers: list = []
        self._generation_start = 0  # the step records' first GradScaler (native)
        self._records_at_last_scaler = 0
        self.optim_wrappers: list = []
        self.fp16_optimizers: list = []
        self.log = StepLog(self, max_steps)
        self.sites = CallSites()
        self._forward_depth = threading.local()
        self._in_scaler_step = 0
        self._in_backward = 0
        # One list per step being run by a recorded step wrapper (shim): the (optimizer, skipped
        # on the device) of each real step the global hook saw inside it.
        self._wrapped_steps: list[list[tuple[Any, bool]]] = []
        # Shim: how often each amp call ran over the whole run, wherever it was called from.
        self.amp_calls: dict[str, int] = {}
        # Whether the shim's hooks are in (shim mode: from the start; migrated: once imported).
        self.shim_loaded = False
        self.native_hooks = mode != "shim"

    # -- clock: the loss lines ----------------------------------------------------------------
    def on_line(self, line: str) -> None:
        values = LOSS.findall(line)
        if not values:
            return
        self.losses.append([float(v) for v in values])
        self.scales.append(self.current_scales())

    @property
    def iteration(self) -> int:
        return len(self.losses)

    def current_scales(self) -> list[float]:
        scales = [float(s.get_scale()) for s in self.grad_scalers] if self.native_hooks else []
        return scales + self._shim_scales()

    def _shim_scales(self) -> list[float]:
        if not self.shim_loaded:
            return []
        from amp_shim.amp._amp_state import _amp_state

        scales = [float(s.loss_scale()) for s in getattr(_amp_state, "loss_scalers", [])]
        for wrapper in self.optim_wrappers:
            scales.extend(float(s.loss_scale()) for s in wrapper._loss_scaler)
        return scales

    def record_scales(self) -> list[float]:
        """A step record's scales, unlike the per-iteration `scales` (kept as they were): the shim's
        `FP16_Optimizer` scalers too, which are not part of amp's state; natively only the live
        GradScalers (a disabled one scales nothing) of the newest generation (see `_new_scaler`),
        as a second `amp.initialize` replaces Apex's loss scalers. Migrated mode: the GradScalers'
        then the shim's, each part empty where the program did not use it."""
        scales = []
        if self.native_hooks:
            newest = self.grad_scalers[self._generation_start :]
            scales = [float(s.get_scale()) for s in newest if s.is_enabled()]
        if self.shim_loaded:
            scales += self._shim_scales() + [float(o.loss_scaler.loss_scale()) for o in self.fp16_optimizers]
        return scales

    def precision(self) -> list[str]:
        """Why this (shim) run computes in another precision than the native recipe, float32
        weights under autocast: what a comparison may expect to differ."""
        if not self.shim_loaded:
            return []
        import torch

        from amp_shim.amp._amp_state import _amp_state

        reasons = []
        properties = getattr(_amp_state, "opt_properties", None)
        model_type = getattr(properties, "cast_model_type", None)
        if model_type in (torch.float16, torch.bfloat16):
            level, kind = getattr(properties, "opt_level", None) or "cast_model_type", str(model_type)[6:]
            if getattr(properties, "master_weights", False):
                reasons.append(
                    f"{level} runs a {kind} copy of the model and steps float32 master weights, the "
                    "migration float32 weights under autocast (they differ where autocast keeps an op in float32)"
                )
            else:
                reasons.append(f"{level} steps {kind} weights, the migration float32 weights under autocast")
        if self.fp16_optimizers:
            reasons.append(
                "FP16_Optimizer runs a float16 model and steps float32 master weights, the migration "
                "float32 weights under autocast"
            )
        return reasons

    def _new_scaler(self, scaler) -> None:
        """A GradScaler built after steps were recorded since the previous one was built (a new
        fold, a resume in the same process) starts a new generation: the step records forget
        the older scalers, as Apex forgets its loss scalers at a second `initialize`. Scalers
        built together (one per loss) stay one generation."""
        if len(self.log.records) > self._records_at_last_scaler:
            self._generation_start = len(self.grad_scalers)
        self._records_at_last_scaler = len(self.log.records)
        self.grad_scalers.append(scaler)

    # -- hooks ------------------------------------------------------------------------------
    def optimizer_index(self, optimizer) -> int:
        for i, known in enumerate(self.optimizers):
            if known is optimizer:
                return i
        self.optimizers.append(optimizer)
        return len(self.optimizers) - 1

    def note(self, what: str, settling: bool = False) -> None:
        """Record where the program made the call the calling hook is running for."""
        self.log.note(what, self.sites.site(sys._getframe(1)), settling)

    def _install_forward_sites(self, torch) -> None:
        """Each outermost module forward the program runs, with the autocast it runs under: where
        a migration dropped or narrowed an autocast region, the forward says so."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        depth = self._forward_depth

        def before(module, args):
            level = getattr(depth, "level", 0)
            if level == 0:
                self.note(f"forward ({_autocast_state(torch)})")
            depth.level = level + 1

        def after(module, args, output):
            depth.level = max(getattr(depth, "level", 1) - 1, 0)

        register_module_forward_pre_hook(before)
        register_module_forward_hook(after, always_call=True)

    def install(self) -> None:
        import torch

        recorder = self
        original_init = torch.optim.Optimizer.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder.optimizer_index(self)

        setattr(torch.optim.Optimizer, "__init__", init)  # noqa: B010 - a patch, not an assignment mypy should check

        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: self.log.on_step_start(optimizer))
        register_optimizer_step_post_hook(self._post_step)
        self._install_backward(torch)
        self._install_clipping(torch)
        self._install_forward_sites(torch)
        if self.native_hooks:
            self._install_native(torch)
        if self.mode == "shim":
            self._install_shim()
        elif self.mode == "migrated":
            sys.meta_path.insert(0, _OnFirstImport("amp_shim", self._install_shim))

    def amp_used(self) -> list[str]:
        """Which mixed precision the program used: "GradScaler" (one was built), "amp_shim" (an
        Apex call of the shim ran)."""
        return (["GradScaler"] if self.grad_scalers else []) + (["amp_shim"] if self.amp_calls else [])

    def _post_step(self, optimizer, args, kwargs) -> None:
        """Torch's global hook, after every real step: `steps`, and the record of a step that no
        other hook records (an `optimizer.step()` called directly)."""
        import torch

        if self._in_scaler_step:
            return
        found_inf = getattr(optimizer, "found_inf", None)
        # A non-zero found_inf: the kernel skipped the update on the device.
        skipped = isinstance(found_inf, torch.Tensor) and float(found_inf.sum()) != 0
        if not skipped:
            self.steps.append([self.iteration, self.optimizer_index(optimizer)])
        if self._wrapped_steps:
            self._wrapped_steps[-1].append((optimizer, skipped))
        else:
            self.note("optimizer.step")
            self.log.record(optimizer, skipped)

    def _install_clipping(self, torch) -> None:
        """Whether each `clip_grad_norm_` acted (its norm above the threshold): a step record
        whose steps saw one act before the last clipping gets the event "partial_clip", which
        docs/differences.md entry U2 is measured from (a loop that clipped every micro-batch
        of an accumulation window)."""
        from torch.nn.utils import clip_grad

        recorder = self
        original = clip_grad.clip_grad_norm_

        @functools.wraps(original)
        def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
            total = original(parameters, max_norm, *args, **kwargs)
            try:
                acted = float(max_norm) / (float(total) + 1e-6) < 1.0
            except (TypeError, ValueError, RuntimeError):
                acted = True  # a norm that is no number: say it may have acted
            recorder.log.on_clip(acted)
            return total

        clip_grad.clip_grad_norm_ = clip_grad_norm_
        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_

    def _install_backward(self, torch) -> None:
        """Each backward's loss; `torch.autograd.backward` called directly too. Only the
        outermost counts: a checkpointed segment's backward runs inside the loss's."""
        recorder = self

        def counting(original, tensors_of):
            @functools.wraps(original)
            def backward(*args, **kwargs):
                if not recorder._in_backward:
                    tensors = tensors_of(*args, **kwargs)
                    for tensor in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                        if isinstance(tensor, torch.Tensor):
                            recorder.log.on_backward(tensor)
                recorder._in_backward += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    recorder._in_backward -= 1

            return backward

        torch.Tensor.backward = counting(torch.Tensor.backward, lambda self, *a, **k: self)
        torch.autograd.backward = counting(torch.autograd.backward, lambda tensors=None, *a, **k: tensors)

    def _install_native(self, torch) -> None:
        recorder = self
        scaler_cls = torch.amp.GradScaler
        original_init = scaler_cls.__init__
        original_step = scaler_cls.step
        original_scale = scaler_cls.scale
        original_update = scaler_cls.update

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder._new_scaler(self)
            recorder.note("GradScaler()")

        def step(self, optimizer, *args, **kwargs):
            recorder.note("scaler.step")
            recorder._in_scaler_step += 1
            try:
                retval = original_step(self, optimizer, *args, **kwargs)
            finally:
                recorder._in_scaler_step -= 1
            state = self._per_optimizer_states.get(id(optimizer), {}) if self._enabled else {}
            found = sum(float(v.item()) for v in state.get("found_inf_per_device", {}).values())
            if not found:
                recorder.steps.append([recorder.iteration, recorder.optimizer_index(optimizer)])
            # Settled at `update()`, where the scale this step leaves behind is set.
            recorder.log.record(optimizer, bool(found), settle=not self._enabled)
            return retval

        def scale(self, outputs):
            recorder.log.settle()
            recorder.note("scaler.scale")
            scaled = original_scale(self, outputs)
            recorder.log.remember_scaled(scaled, outputs)
            return scaled

        def update(self, *args, **kwargs):
            recorder.note("scaler.update", settling=True)
            original_update(self, *args, **kwargs)
            recorder.log.settle()

        scaler_cls.__init__ = init
        scaler_cls.step = step
        scaler_cls.scale = scale
        scaler_cls.update = update
        for name in ("unscale_", "state_dict", "load_state_dict"):
            setattr(scaler_cls, name, self._noting(f"scaler.{name}", getattr(scaler_cls, name)))
        self._install_autocast_sites(torch)

    def _noting(self, what: str, function):
        """`function`, noting where the program calls it."""
        recorder = self

        @functools.wraps(function)
        def noted(*args, **kwargs):
            if not recorder._in_scaler_step:  # GradScaler.step unscales by itself
                recorder.note(what)
            return function(*args, **kwargs)

        return noted

    def _install_autocast_sites(self, torch) -> None:
        """Native: each `torch.autocast` region the program's own code enters (not those torch
        enters for it, such as a checkpoint's recomputation)."""
        recorder = self
        autocast_cls = torch.amp.autocast_mode.autocast
        original_enter = autocast_cls.__enter__

        @functools.wraps(original_enter)
        def enter(self):
            site = recorder.sites.site(sys._getframe(1), outward=False)
            if site is not None:
                state = (
                    f"{self.device} {str(self.fast_dtype).replace('torch.', '')}" if self._enabled else "off"
                )
                recorder.log.note(f"torch.autocast ({state})", site)
            return original_enter(self)

        autocast_cls.__enter__ = enter

    def _install_shim(self) -> None:
        self.shim_loaded = True
        from amp_shim.amp import _process_optimizer, opt
        from amp_shim.engine import loss_scaler
        from amp_shim.fp16_utils import fp16_optimizer

        recorder = self
        original_init = opt.OptimWrapper.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            recorder.optim_wrappers.append(self)

        setattr(opt.OptimWrapper, "__init__", init)  # noqa: B010 - a patch, not an assignment mypy should check
        original_fp16_init = fp16_optimizer.FP16_Optimizer.__init__

        def fp16_init(self, *args, **kwargs):
            original_fp16_init(self, *args, **kwargs)
            recorder.fp16_optimizers.append(self)

        setattr(fp16_optimizer.FP16_Optimizer, "__init__", fp16_init)  # noqa: B010 - a patch, not an assignment mypy should check
        original_patch_step = _process_optimizer._patch_step

        def patch_step(optimizer, properties) -> None:
            original_patch_step(optimizer, properties)
            optimizer.step = types.MethodType(self.recorded_step(optimizer.step), optimizer)

        _process_optimizer._patch_step = patch_step
        for cls in (opt.OptimWrapper, fp16_optimizer.FP16_Optimizer):
            setattr(cls, "step", self.recorded_method(cls.step))  # noqa: B010 - a patch, not an assignment mypy should check
        # `amp.scale_loss` and `FP16_Optimizer.backward` scale through the engine's scaler; the old
        # API's `OptimWrapper.scale_loss` multiplies by itself.
        original_scaled = loss_scaler.DeviceLossScaler.scaled

        def scaled(self, loss):
            result = original_scaled(self, loss)
            recorder.log.remember_scaled(result, loss)
            return result

        setattr(loss_scaler.DeviceLossScaler, "scaled", scaled)  # noqa: B010 - a patch, not an assignment mypy should check
        setattr(opt.OptimWrapper, "scale_loss", self.remembering(opt.OptimWrapper.scale_loss))  # noqa: B010 - a patch, not an assignment mypy should check
        self._install_shim_sites()
        self._install_amp_counts()

    def _install_amp_counts(self) -> None:
        """Shim: count the amp calls that show Apex's amp at work (verify passes no run in which
        none ran), from the program's start: calls before the first step record count too."""
        import amp_shim.amp as amp
        from amp_shim.amp import opt
        from amp_shim.fp16_utils import fp16_optimizer

        for owner, name, what in (
            (amp, "initialize", "amp.initialize"),
            (amp, "scale_loss", "amp.scale_loss"),
            (amp, "init", "amp.init"),
            (opt.OptimWrapper, "scale_loss", "OptimWrapper.scale_loss"),
            (fp16_optimizer.FP16_Optimizer, "backward", "FP16_Optimizer.backward"),
        ):
            setattr(owner, name, self._counted(what, getattr(owner, name)))

    def _counted(self, what: str, function):
        counts = self.amp_calls

        @functools.wraps(function)
        def counted(*args, **kwargs):
            counts[what] = counts.get(what, 0) + 1
            return function(*args, **kwargs)

        return counted

    def _install_shim_sites(self) -> None:
        """Shim: where the program calls the amp functions it reaches as `apex.amp.NAME`."""
        import amp_shim.amp as amp

        for name in ("initialize", "scale_loss", "master_params", "state_dict", "load_state_dict"):
            setattr(amp, name, self._noting(f"amp.{name}", getattr(amp, name)))

    def recorded_step(self, step):
        """Shim: a step the program calls (`amp.initialize`'s patched step, the old API's
        `OptimWrapper.step`, `FP16_Optimizer.step`) is one record, skipped when the real step
        did not run or its kernel skipped."""
        import torch

        recorder = self

        def recorded(owner, *args, **kwargs):
            recorder.note("optimizer.step")
            kind = type(owner).__name__
            what = f"{kind}.step" if kind in ("OptimWrapper", "FP16_Optimizer") else "amp optimizer.step"
            recorder.amp_calls[what] = recorder.amp_calls.get(what, 0) + 1
            ran: list[tuple[Any, bool]] = []
            recorder._wrapped_steps.append(ran)
            try:
                retval = step(*args, **kwargs)
            finally:
                recorder._wrapped_steps.pop()
            if ran:
                optimizer = ran[0][0]  # the optimizer that really stepped (a wrapper's)
            elif isinstance(owner, torch.optim.Optimizer):
                optimizer = owner
            else:  # OptimWrapper, FP16_Optimizer: the optimizer they wrap
                optimizer = getattr(owner, "_optimizer", None) or getattr(owner, "optimizer", owner)
            recorder.log.record(optimizer, not ran or any(skipped for _, skipped in ran))
            return retval

        return recorded

    def recorded_method(self, step):
        recorded = self.recorded_step(step)

        @functools.wraps(step)
        def method(owner, *args, **kwargs):
            return recorded(owner, owner, *args, **kwargs)

        return method

    def remembering(self, scale_loss):
        """Shim: the loss the old API's `scale_loss` yields scaled backpropagates as the loss it
        was given."""
        recorder = self

        @contextlib.contextmanager
        def wrapper(owner, loss, *args, **kwargs):
            with scale_loss(owner, loss, *args, **kwargs) as scaled:
                recorder.log.remember_scaled(scaled, loss)
                yield scaled

        return functools.wraps(scale_loss)(wrapper)

    # -- the result ---------------------------------------------------------------------------
    def final_params(self):
        return [
            [p.detach().float().cpu().clone() for group in o.param_groups for p in group["params"]]
            for o in self.optimizers
        ]


class LineWatch:
    """Which of the given lines of the given files executed (`--watch-lines`: verify's
    statements the migration wrote). A trace function that looks at each code object once and
    traces the lines only of those in the files, until all of their watched lines were seen;
    in every thread (`threading.settrace`); each torchrun rank records its own."""

    def __init__(self, watched: dict[str, list[int]]) -> None:
        self._wanted = {os.path.realpath(path): (path, frozenset(lines)) for path, lines in watched.items()}
        # Per code object seen: its watched lines not yet executed, and where to note them.
        self._state: dict[types.CodeType, Optional[tuple[set[int], set[int]]]] = {}
        self.executed: dict[str, set[int]] = {path: set() for path in watched}

    def start(self) -> None:
        threading.settrace(self._call)
        sys.settrace(self._call)

    def _watched(self, code: types.CodeType) -> Optional[tuple[set[int], set[int]]]:
        wanted = self._wanted.get(os.path.realpath(code.co_filename))
        if wanted is None:
            return None
        remaining = set(wanted[1]) & {line for _, _, line in code.co_lines() if line is not None}
        return (remaining, self.executed[wanted[0]]) if remaining else None

    def _call(self, frame, event, arg):
        code = frame.f_code
        try:
            state = self._state[code]
        except KeyError:
            state = self._state[code] = self._watched(code)
        if state is None or not state[0]:
            return None
        remaining, executed = state

        def line(frame, event, arg):
            if event == "line" and frame.f_lineno in remaining:
                remaining.discard(frame.f_lineno)
                executed.add(frame.f_lineno)
                if not remaining:  # every watched line of this code seen: stop tracing it
                    self._state[code] = None
                    frame.f_trace_lines = False
            return line

        return line

    def result(self) -> dict[str, list[int]]:
        return {path: sorted(lines) for path, lines in self.executed.items()}


class _Tee(io.TextIOBase):
    """stdout that also feeds complete lines to the recorder."""

    def __init__(self, stream, recorder: Recorder) -> None:
        self.stream = stream
        self.recorder = recorder
        self.pending = ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.recorder.on_line(line)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return self.stream.encoding


def _finite(values):
    return [v if math.isfinite(v) else repr(v) for v in values]


def _seed(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def _deterministic() -> None:
    """Deterministic algorithms where torch has them; `warn_only`, because an op without one
    should run as the program would without the recorder, not crash it. On CUDA, cuBLAS also
    needs CUBLAS_WORKSPACE_CONFIG in the environment (verify sets it for both runs)."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)


def result_path(template: str) -> str:
    """RESULT with `{rank}` replaced by this process's rank (torchrun's RANK, 0 without it), so
    that every rank of a distributed run writes its own result."""
    return template.replace("{rank}", os.environ.get("RANK", "0"))


def _end_threads_quietly_at_stop() -> None:
    """A program that trains in a thread of its own gets the --max-steps stop in that thread:
    the stop ends the thread, as it ends the main thread's training elsewhere, and the program's
    main thread goes on (further steps are not recorded). Such a thread ends without the
    "Exception in thread" report a failure gets."""
    previous = threading.excepthook

    def excepthook(args) -> None:
        if args.exc_type is not _StopRun:
            previous(args)

    threading.excepthook = excepthook


#: --progress: the file each completed step record is reported to, as a `RANK COUNT` line.
_PROGRESS: Optional[str] = None


def _report_progress(count: int) -> None:
    """One line per step record, appended (every rank of a torchrun to the same file), for the
    verify run that polls it; a line this short is written in one piece."""
    if _PROGRESS is None:
        return
    try:
        with open(_PROGRESS, "a") as progress:
            progress.write(f"{os.environ.get('RANK', '0')} {count}\n")
    except OSError:
        pass  # progress is for show: the run goes on without it


def _run_program(recorder: Recorder, program: str, args: list) -> tuple[int, Optional[float]]:
    """Run the program as `__main__` with its stdout teed to the recorder; its exit code and,
    when it raised, the time it did (distributed ranks fail in a chain: the first is the cause)."""
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, recorder)
    sys.argv = [program, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(program))
    exit_code, failed_at = 0, None
    _end_threads_quietly_at_stop()
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except _StopRun:
        pass  # --max-steps: recorder.log.stopped says so
    except Exception:
        # The steps before the failure are still recorded, so that a comparison can say
        # where two runs parted before one of them failed.
        failed_at = time.time()
        traceback.print_exc()
        exit_code = 1
    finally:
        sys.stdout.flush()
        sys.stdout = stdout
    return exit_code, failed_at


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many step records")
    parser.add_argument("--seed", type=int, default=None, help="seed torch, random and numpy first")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True, warn_only=True)",
    )
    parser.add_argument(
        "--watch-lines",
        default=None,
        help='JSON file {"/abs/file.py": [lines]}: record which of those lines executed',
    )
    parser.add_argument("--progress", help="append `RANK COUNT` to this file as each step record is made")
    parser.add_argument("result", help="RESULT.json; `{rank}` in it becomes the process's rank")
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    ns = _arguments(argv)
    global _PROGRESS
    _PROGRESS = ns.progress

    import importlib.util

    # Whether a real Apex could be imported here at all (the alias, if any, is not a real Apex).
    apex_installed = (
        not any(name.split(".")[0] in BLOCKED for name in sys.modules)
        and importlib.util.find_spec("apex") is not None
    )
    if ns.mode != "shim":
        assert not any(name.split(".")[0] in BLOCKED for name in sys.modules), "shim already imported"
        sys.meta_path.insert(0, _Blocker(FORBIDDEN[ns.mode]))

    recorder = Recorder(ns.mode, ns.max_steps)
    recorder.install()
    if ns.seed is not None:
        _seed(ns.seed)
    if ns.deterministic:
        _deterministic()

    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    watch = None
    if ns.watch_lines:
        with open(ns.watch_lines) as f:
            watch = LineWatch(json.load(f))
        watch.start()
    exit_code, failed_at = _run_program(recorder, ns.program, ns.args)
    if watch is not None:
        sys.settrace(None)
    recorder.log.settle(stop=False)
    imported = sorted({name.split(".")[0] for name in sys.modules} & set(BLOCKED))
    facts = {"deterministic": deterministic, "imported": imported, "apex_installed": apex_installed}
    _write_result(ns, recorder, exit_code, failed_at, facts, watch)
    forbidden = forbidden_imports(ns.mode, imported)
    if forbidden:
        print(f"recorder: {ns.mode} run imported {forbidden}", file=sys.stderr)
        return 3
    return exit_code


def forbidden_imports(mode: str, imported) -> list[str]:
    """Those of the `imported` modules (a result's "imported") that a run in `mode` must not
    import: a run that imported one exits 3, whatever its program did."""
    return sorted(set(imported) & set(FORBIDDEN[mode]))


def _write_result(ns, recorder: Recorder, exit_code: int, failed_at, facts: dict, watch) -> None:
    """RESULT.json, and the final parameters beside it as RESULT.pt."""
    import torch

    result = result_path(ns.result)
    params_path = os.path.splitext(result)[0] + ".pt"
    torch.save(recorder.final_params(), params_path)
    with open(result, "w") as f:
        json.dump(
            {
                "mode": ns.mode,
                "exit_code": exit_code,
                "failed_at": failed_at,
                "rank": int(os.environ.get("RANK", "0")),
                "deterministic": facts["deterministic"],
                "losses": [_finite(v) for v in recorder.losses],
                "scales": recorder.scales,
                "steps": recorder.steps,
                "num_optimizers": len(recorder.optimizers),
                "params": params_path,
                "imported": facts["imported"],
                "apex_installed": facts["apex_installed"],
                "step_records": recorder.log.records,
                "precision": recorder.precision(),
                "step_calls": recorder.log.calls,
                "amp_calls": recorder.amp_calls,
                "amp_used": recorder.amp_used(),
                "executed_lines": None if watch is None else watch.result(),
                "stopped": recorder.log.stopped,
            },
            f,
        )


if __name__ == "__main__":
    sys.exit(main())
