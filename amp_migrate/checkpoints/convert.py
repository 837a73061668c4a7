"""Convert checkpoints saved by Apex code into what the migrated native code loads (and back).

A migrated script saves `scaler.state_dict()` where the old one saved `amp.state_dict()`, and
builds `torch.optim.AdamW` where it built `apex.optimizers.FusedAdam`. Its old checkpoints
hold the old formats; resuming from them needs a one-time, lossless rewrite of exactly those
entries, leaving model weights and everything else as they are:

* Apex amp scaler state (`{"loss_scaler0": {"loss_scale", "unskipped"}}`) ⇄ GradScaler state;
* FusedAdam/FusedAdagrad/FusedLAMB optimizer state keeps `step` in each param group, where
  torch's optimizers need it per parameter (loading it raises `KeyError: 'step'`);
* `FP16_Optimizer.state_dict()` becomes the wrapped optimizer's plain state, with its loss
  scaler as GradScaler state beside it.

Files are read and written by `checkpoint_io`: with `torch.load(weights_only=True)`, so a
checkpoint that needs more (pickled Python objects, such as FP16_Optimizer's `LossScaler`) is
refused unless the caller allows an unsafe load, since unpickling runs code from the file.
A malformed entry raises CheckpointError naming it, never anything else.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Optional

import torch

from amp_shim.checkpoint_format import (
    ScalerStateError,
    apex_to_grad_scaler,
    grad_scaler_to_apex,
    is_grad_scaler_state,
)

from .files import CheckpointError, check_target, load, save_atomically

__all__ = [
    "Change",
    "CheckpointError",
    "check_target",
    "convert",
    "fused_step_to_torch",
    "load",
    "save_atomically",
]

_FP16_OPTIMIZER_KEYS = {"loss_scaler", "dynamic_loss_scale", "optimizer_state_dict", "fp32_from_fp16"}


@dataclass(frozen=True)
class Change:
    where: str  # e.g. "['amp']"
    what: str


# -- converting -------------------------------------------------------------------------------


def _is_optimizer_state(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and set(obj) == {"state", "param_groups"}
        and isinstance(obj["param_groups"], list)
    )


def fused_step_to_torch(state: MutableMapping) -> int:
    """Move `step` from each param group into each param's state, as torch's optimizers keep it;
    returns the number of params updated (0 when the state already has torch's layout).

    Raises CheckpointError, before changing anything, on a state that is not shaped like an
    optimizer's (a step that is no count, params that are no list)."""
    entries = state["state"]
    if not isinstance(entries, Mapping):
        raise CheckpointError(
            f"its 'state' is of type {type(entries).__name__}, not a dict of parameter states"
        )
    moves = []
    for position, group in enumerate(state["param_groups"]):
        if not isinstance(group, MutableMapping):
            raise CheckpointError(f"param group {position} is of type {type(group).__name__}, not a dict")
        if "step" not in group:
            continue
        params = group.get("params", [])
        if not isinstance(params, (list, tuple)):
            raise CheckpointError(
                f"param group {position}: 'params' is of type {type(params).__name__}, "
                "not a list of parameter indices"
            )
        value = _step_count(group["step"], position)
        for index in params:
            entry = entries.get(index) if isinstance(index, int) else None
            if entry is not None and not isinstance(entry, Mapping):
                raise CheckpointError(
                    f"the state of parameter {index} is of type {type(entry).__name__}, not a dict"
                )
        moves.append((group, params, value))
    moved = 0
    for group, params, value in moves:
        # torch takes group options from the checkpoint: without this the fused optimizer the
        # migrated code builds would fall back to the loop implementation after a resume.
        group.setdefault("fused", True)
        del group["step"]
        for index in params:
            entry = entries.get(index) if isinstance(index, int) else None
            if entry is not None and "step" not in entry:
                entry["step"] = torch.tensor(value)
                moved += 1
    return moved


def _step_count(step: Any, position: int) -> float:
    """A group's step as torch keeps it per parameter (a float); a count, whatever its type."""
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_complex():
        step = step.item()
    if isinstance(step, (int, float)) and not isinstance(step, bool) and 0 <= step < float("inf"):
        return float(step)
    shown = f"a tensor of shape {tuple(step.shape)}" if isinstance(step, torch.Tensor) else repr(step)
    raise CheckpointError(f"param group {position}: step {shown} is not a step count")


def _scaler_from_apex_object(scaler: Any) -> dict[str, Any]:
    attrs = getattr(scaler, "__dict__", {})
    if "_loss_scale" not in attrs:
        raise CheckpointError("FP16_Optimizer's loss_scaler has no _loss_scale to convert")
    try:
        return apex_to_grad_scaler(
            {"loss_scaler0": {"loss_scale": attrs["_loss_scale"], "unskipped": attrs.get("_unskipped", 0)}}
        )
    except ScalerStateError as exc:
        raise CheckpointError(f"FP16_Optimizer's loss_scaler: {exc}") from None


def _claims_apex_scaler_state(obj: Any) -> bool:
    """Keyed like `amp.state_dict()` (every key names a loss scaler, as Apex's loader requires),
    whatever the values: such an entry converts or is reported, never passed over as unknown."""
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and "loss_scaler" in k for k in obj)
    )


def _apex_scaler_entry(where: str, value: Mapping, index: Optional[int], changes: list[Change]) -> dict:
    try:
        converted = apex_to_grad_scaler(value, index=index)
    except ScalerStateError as exc:
        reason = str(exc).rstrip(".")
        if index is None and len(value) > 1:
            raise CheckpointError(
                f"{where}: {reason}. Pick one with --index N, or keep resuming this checkpoint with "
                "the Apex code on the shim (`amp-migrate run`), which keeps one scaler per loss."
            ) from None
        raise CheckpointError(f"{where}: malformed Apex amp state: {reason}") from None
    changes.append(
        Change(
            where,
            f"Apex amp scaler state → GradScaler state (scale {converted['scale']}, "
            f"growth tracker {converted['_growth_tracker']})",
        )
    )
    return converted


def _to_torch_entry(name: str, value: Any, index: Optional[int], out: dict, changes: list[Change]) -> Any:
    where = f"[{name!r}]"
    if _claims_apex_scaler_state(value):
        return _apex_scaler_entry(where, value, index, changes)
    if _is_optimizer_state(value):
        try:
            moved = fused_step_to_torch(value)
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: malformed optimizer state: {exc}") from None
        if moved:
            changes.append(
                Change(
                    where,
                    f"fused optimizer state: `step` moved from the param groups "
                    f"into {moved} parameter states (torch's layout), `fused` kept",
                )
            )
        return value
    if isinstance(value, Mapping) and _FP16_OPTIMIZER_KEYS <= set(value):
        optimizer_state = value["optimizer_state_dict"]
        try:
            scaler = (
                _scaler_from_apex_object(value["loss_scaler"]) if value.get("dynamic_loss_scale") else None
            )
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: malformed FP16_Optimizer state: {exc}") from None
        changes.append(Change(where, "FP16_Optimizer state → the wrapped optimizer's plain state"))
        if scaler is not None:
            key = f"{name}_scaler" if isinstance(name, str) else "scaler"
            out[key] = scaler
            changes.append(
                Change(
                    f"[{key!r}]",
                    f"FP16_Optimizer's dynamic loss scaler → GradScaler state (scale {scaler['scale']})",
                )
            )
        masters = value["fp32_from_fp16"]
        if masters and any(masters):
            key = f"{name}_fp32_from_fp16"
            out[key] = masters
            changes.append(
                Change(
                    f"[{key!r}]",
                    "FP16_Optimizer's fp32 master weights kept here: the "
                    "fp16 model weights are their rounded copies; load these "
                    "into the fp32 model for an exact resume",
                )
            )
        return optimizer_state
    return value


# What a malformed entry (a tensor where a list belongs, a missing key) raises from the
# conversion code: reported as that entry's fault rather than as a crash.
_MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, RuntimeError)


def _malformed(where: str, exc: BaseException) -> CheckpointError:
    detail = " ".join(str(exc).split())
    return CheckpointError(
        f"{where}: malformed entry, not converted ({type(exc).__name__}{': ' + detail if detail else ''})"
    )


def convert(
    obj: Any, *, key: str = "amp", to: str = "torch", index: Optional[int] = None
) -> tuple[Any, list[Change]]:
    """The converted checkpoint (a new object) and what changed; `obj` is not modified.

    Raises CheckpointError for anything it cannot convert, malformed entries included."""
    if to not in ("torch", "apex"):
        raise ValueError("to must be 'torch' or 'apex'")
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"[]: the checkpoint is of type {type(obj).__name__}, not a dict of entries")
    try:
        obj = copy.deepcopy(obj)
    except Exception as exc:  # objects loaded with --unsafe-load can fail to copy in any way
        raise _malformed("[]", exc) from None
    changes: list[Change] = []
    if to == "apex":
        if is_grad_scaler_state(obj):
            try:
                return grad_scaler_to_apex(obj), [Change("[]", "GradScaler state → Apex amp scaler state")]
            except ScalerStateError as exc:
                raise CheckpointError(f"[]: {exc}") from None
        for name, value in list(obj.items()):
            if is_grad_scaler_state(value) and (
                name == key or key not in obj or not is_grad_scaler_state(obj[key])
            ):
                try:
                    obj[name] = grad_scaler_to_apex(value)
                except ScalerStateError as exc:
                    raise CheckpointError(f"[{name!r}]: {exc}") from None
                changes.append(Change(f"[{name!r}]", "GradScaler state → Apex amp scaler state"))
        return obj, changes
    if _claims_apex_scaler_state(obj):
        converted = _apex_scaler_entry("[]", obj, index, changes)
        return converted, changes
    out: dict = {}
    names = [key] if key in obj and _claims_apex_scaler_state(obj[key]) else []
    names += [n for n in obj if n not in names]
    for name in names:
        try:
            out[name] = _to_torch_entry(name, obj[name], index, out, changes)
        except CheckpointError:
            raise
        except _MALFORMED as exc:
            raise _malformed(f"[{name!r}]", exc) from None
    result = type(obj)() if isinstance(obj, dict) else {}
    for name in list(obj) + [n for n in out if n not in obj]:
        result[name] = out[name]
    return result, changes
