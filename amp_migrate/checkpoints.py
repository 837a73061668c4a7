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

Files are read with `torch.load(weights_only=True)`: a checkpoint that needs more (pickled
Python objects, such as FP16_Optimizer's `LossScaler`) is refused unless the caller allows an
unsafe load, since unpickling runs code from the file.
"""
from __future__ import annotations

import copy
import io
import os
import pickle
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from amp_shim.engine.state import (
    ScalerStateError,
    apex_to_grad_scaler,
    grad_scaler_to_apex,
    is_apex_scaler_state,
    is_grad_scaler_state,
)

_FP16_OPTIMIZER_KEYS = {"loss_scaler", "dynamic_loss_scale", "optimizer_state_dict", "fp32_from_fp16"}


class CheckpointError(Exception):
    """The checkpoint cannot be converted as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Change:
    where: str  # e.g. "['amp']"
    what: str


# -- loading ----------------------------------------------------------------------------------

class _ApexObject:
    """Stands in for a pickled Apex class (FP16_Optimizer's LossScaler): keeps its attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "apex" or module.startswith("apex."):
            return type(name, (_ApexObject,), {"__module__": module})
        return super().find_class(module, name)


class _PickleModule:
    """`pickle` with Apex classes readable without Apex installed (for `torch.load`)."""

    Unpickler = _Unpickler
    load = pickle.load
    __name__ = "amp_migrate.checkpoints._PickleModule"


def load(path: Path, *, unsafe: bool = False) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if not unsafe:
            raise CheckpointError(
                f"{path} holds pickled Python objects besides tensors and containers "
                f"({_first_line(exc)}). Loading them runs code from the file; if you trust "
                "it, pass --unsafe-load.") from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"{path}: cannot read a torch checkpoint ({_first_line(exc)})") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
    except Exception as exc:  # a broken pickle can raise anything
        raise CheckpointError(f"{path}: cannot unpickle ({type(exc).__name__}: {_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def save_atomically(obj: Any, path: Path) -> None:
    """Write next to the target and rename, so OUT is either absent/old or complete."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- converting -------------------------------------------------------------------------------

def _is_optimizer_state(obj: Any) -> bool:
    return isinstance(obj, Mapping) and set(obj) == {"state", "param_groups"} \
        and isinstance(obj["param_groups"], list)


def fused_step_to_torch(state: MutableMapping) -> int:
    """Move `step` from each param group into each param's state, as torch's optimizers keep it;
    returns the number of params updated (0 when the state already has torch's layout)."""
    moved = 0
    for group in state["param_groups"]:
        if "step" not in group:
            continue
        # torch takes group options from the checkpoint: without this the fused optimizer the
        # migrated code builds would fall back to the loop implementation after a resume.
        group.setdefault("fused", True)
        step = group.pop("step")
        value = float(step.item() if isinstance(step, torch.Tensor) else step)
        for index in group.get("params", []):
            entry = state["state"].get(index)
            if entry is not None and "step" not in entry:
                entry["step"] = torch.tensor(value)
                moved += 1
    return moved


def _scaler_from_apex_object(scaler: Any) -> dict[str, Any]:
    attrs = getattr(scaler, "__dict__", {})
    if "_loss_scale" not in attrs:
        raise CheckpointError("FP16_Optimizer's loss_scaler has no _loss_scale to convert")
    return apex_to_grad_scaler({"loss_scaler0": {"loss_scale": attrs["_loss_scale"],
                                                 "unskipped": attrs.get("_unskipped", 0)}})


def _to_torch_entry(name: str, value: Any, index: Optional[int], out: dict, changes: list[Change]) -> Any:
    where = f"[{name!r}]"
    if is_apex_scaler_state(value):
        try:
            converted = apex_to_grad_scaler(value, index=index)
        except ScalerStateError as exc:
            raise CheckpointError(
                f"{where}: {exc}. Pick one with --index N, or keep resuming this checkpoint with "
                "the Apex code on the shim (`amp-migrate run`), which keeps one scaler per loss.") from None
        changes.append(Change(where, f"Apex amp scaler state → GradScaler state (scale {converted['scale']}, "
                                     f"growth tracker {converted['_growth_tracker']})"))
        return converted
    if _is_optimizer_state(value):
        moved = fused_step_to_torch(value)
        if moved:
            changes.append(Change(where, f"fused optimizer state: `step` moved from the param groups "
                                         f"into {moved} parameter states (torch's layout), `fused` kept"))
        return value
    if isinstance(value, Mapping) and _FP16_OPTIMIZER_KEYS <= set(value):
        optimizer_state = value["optimizer_state_dict"]
        scaler = _scaler_from_apex_object(value["loss_scaler"]) if value.get("dynamic_loss_scale") \
            else None
        changes.append(Change(where, "FP16_Optimizer state → the wrapped optimizer's plain state"))
        if scaler is not None:
            key = f"{name}_scaler" if isinstance(name, str) else "scaler"
            out[key] = scaler
            changes.append(Change(f"[{key!r}]", f"FP16_Optimizer's dynamic loss scaler → GradScaler "
                                                f"state (scale {scaler['scale']})"))
        masters = value["fp32_from_fp16"]
        if masters and any(masters):
            key = f"{name}_fp32_from_fp16"
            out[key] = masters
            changes.append(Change(f"[{key!r}]", "FP16_Optimizer's fp32 master weights kept here: the "
                                                "fp16 model weights are their rounded copies; load these "
                                                "into the fp32 model for an exact resume"))
        return optimizer_state
    return value


def convert(obj: Any, *, key: str = "amp", to: str = "torch",
            index: Optional[int] = None) -> tuple[Any, list[Change]]:
    """The converted checkpoint (a new object) and what changed; `obj` is not modified."""
    if to not in ("torch", "apex"):
        raise ValueError("to must be 'torch' or 'apex'")
    obj = copy.deepcopy(obj)
    changes: list[Change] = []
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"the checkpoint is a {type(obj).__name__}, not a dict of entries")
    if to == "apex":
        if is_grad_scaler_state(obj):
            return grad_scaler_to_apex(obj), [Change("[]", "GradScaler state → Apex amp scaler state")]
        for name, value in list(obj.items()):
            if is_grad_scaler_state(value) and (name == key or key not in obj or not is_grad_scaler_state(obj[key])):
                try:
                    obj[name] = grad_scaler_to_apex(value)
                except ScalerStateError as exc:
                    raise CheckpointError(f"[{name!r}]: {exc}") from None
                changes.append(Change(f"[{name!r}]", "GradScaler state → Apex amp scaler state"))
        return obj, changes
    if is_apex_scaler_state(obj):
        converted = _to_torch_entry("", obj, index, {}, changes)
        return converted, [Change("[]", c.what) for c in changes]
    out: dict = {}
    names = [key] if key in obj and is_apex_scaler_state(obj[key]) else []
    names += [n for n in obj if n not in names]
    for name in names:
        out[name] = _to_torch_entry(name, obj[name], index, out, changes)
    result = type(obj)() if isinstance(obj, dict) else {}
    for name in list(obj) + [n for n in out if n not in obj]:
        result[name] = out[name]
    return result, changes
