"""Lossless conversion between Apex's `amp.state_dict()` and `torch.amp.GradScaler.state_dict()`.

The two formats::

    Apex     OrderedDict([('loss_scaler0', {'loss_scale': 65536.0, 'unskipped': 0}), ...])
    torch    {'scale': 65536.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
              'growth_interval': 2000, '_growth_tracker': 0}

`loss_scale` <-> `scale` and `unskipped` <-> `_growth_tracker`. Apex's factors (x2, x0.5) and its
2000-step window are constants, so Apex saves them nowhere; with those constants a GradScaler
and Apex's dynamic scaler take the same scale sequence, update for update, until Apex's
`max_loss_scale` cap (2**24 by default) or a `min_loss_scale` floor is hit (GradScaler has
neither).

What the conversion guarantees, and what it refuses instead of guessing:

* Round trips are exact, values and types: ``scale`` is always a Python ``float`` and the
  counter a Python ``int``. (Apex itself can hold an ``int`` scale, e.g. ``256`` after an
  integer `min_loss_scale` floor; it converts to ``256.0``, which Apex's loader accepts.)
* A scale must survive GradScaler's float32 storage unchanged; one that would not (e.g. a scale
  that underflowed to ``1e-303`` without a `min_loss_scale`) is refused rather than rounded.
* The counter must fit GradScaler's int32 growth tracker.
* Several loss scalers (`amp.initialize(..., num_losses=N)`, N > 1): a GradScaler has one
  scale, so the conversion refuses unless `index=` picks one of them; the other option is to
  keep running the Apex code on the shim (`amp_shim.amp.load_state_dict`), which keeps one
  scaler per loss.
* A GradScaler state whose growth factor, backoff factor or growth interval differs from
  Apex's constants cannot be represented in Apex's format and is refused.
* An empty GradScaler state (what a disabled ``GradScaler(enabled=False)`` saves) holds no
  scale and is refused.

Neither format says whether the scale was dynamic or static (Apex never saved it either): a
static Apex scale converts to the same numbers, but a GradScaler that loads them is dynamic.
Apex's static counter grows past 2000; like Apex's dynamic scaler, GradScaler grows only when
its counter *equals* the interval, so such a counter never triggers a growth until the next
overflow resets it.

The conversion itself is plain Python (no tensors): it works on the dicts that `torch.load`
returns, before any scaler exists.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from numbers import Integral, Real
from typing import Any, Mapping, Optional

__all__ = [
    "APEX_BACKOFF_FACTOR",
    "APEX_GROWTH_FACTOR",
    "APEX_GROWTH_INTERVAL",
    "ScalerStateError",
    "apex_to_grad_scaler",
    "grad_scaler_to_apex",
    "is_apex_scaler_state",
    "is_grad_scaler_state",
]

APEX_GROWTH_FACTOR = 2.0
APEX_BACKOFF_FACTOR = 0.5
APEX_GROWTH_INTERVAL = 2000

_GRAD_SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
_APEX_ENTRY_KEYS = ("loss_scale", "unskipped")
_INT32_MAX = 2**31 - 1


class ScalerStateError(ValueError):
    """A scaler state that cannot be converted without losing or inventing information."""


# -- predicates (never raise) ---------------------------------------------------------------


def is_apex_scaler_state(obj: Any) -> bool:
    """True if `obj` looks like `amp.state_dict()`: a non-empty mapping whose keys all contain
    ``'loss_scaler'`` and whose values each hold ``'loss_scale'`` and ``'unskipped'``."""
    if not isinstance(obj, Mapping) or len(obj) == 0:
        return False
    return all(
        isinstance(key, str)
        and "loss_scaler" in key
        and isinstance(value, Mapping)
        and all(k in value for k in _APEX_ENTRY_KEYS)
        for key, value in obj.items()
    )


def is_grad_scaler_state(obj: Any) -> bool:
    """True if `obj` looks like an enabled `torch.amp.GradScaler.state_dict()` (its five keys)."""
    return isinstance(obj, Mapping) and set(obj.keys()) == set(_GRAD_SCALER_KEYS)


# -- Apex -> GradScaler ------------------------------------------------------------------------


def apex_to_grad_scaler(state: Mapping[str, Any], *, index: Optional[int] = None) -> dict[str, Any]:
    """Convert Apex's `amp.state_dict()` to a `torch.amp.GradScaler.state_dict()`.

    Entries are taken the way Apex's `amp.load_state_dict` takes them: every key containing
    ``'loss_scaler'``, **in the mapping's iteration order**, and the i-th such entry belongs to
    loss scaler i, *by position, not by the number in the key* (``'loss_scaler1'`` listed
    first is scaler 0). `index` is that position: ``index=i`` converts the entry that Apex would
    have loaded into ``_amp_state.loss_scalers[i]``.

    With one entry `index` may be omitted (or be 0). With several (``num_losses > 1``) it is
    required, because a GradScaler has a single scale. Keys that do not contain
    ``'loss_scaler'`` are refused (Apex's loader raises on them too).

    Returns ``{'scale': float, 'growth_factor': 2.0, 'backoff_factor': 0.5,
    'growth_interval': 2000, '_growth_tracker': int}``, ready for
    ``GradScaler.load_state_dict``.

    Raises:
        TypeError: `state` is not a mapping.
        ScalerStateError (a ValueError): empty state, unexpected keys, several scalers and no
            `index`, `index` out of range, a malformed entry, or values GradScaler cannot
            hold exactly.
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            "expected Apex's amp.state_dict() (a mapping like "
            "{'loss_scaler0': {'loss_scale': 65536.0, 'unskipped': 0}}), got %s" % type(state).__name__
        )
    if len(state) == 0:
        raise ScalerStateError(
            "the Apex amp state is empty: it holds no loss scaler (amp.state_dict() was called "
            "before amp.initialize?), so there is no scale to convert"
        )
    unexpected = [key for key in state if not (isinstance(key, str) and "loss_scaler" in key)]
    if unexpected:
        raise ScalerStateError(
            "not an Apex amp state: unexpected key(s) %s; amp.state_dict() has only "
            "'loss_scaler<i>' keys (Apex's amp.load_state_dict would reject these too)"
            % ", ".join(repr(k) for k in unexpected)
        )
    entries = list(state.items())
    count = len(entries)
    if index is None:
        if count > 1:
            raise ScalerStateError(
                "the Apex amp state holds %d loss scalers (amp.initialize(..., num_losses=%d): "
                "keys %s), but torch.amp.GradScaler has a single scale. Either pick one scaler with "
                "apex_to_grad_scaler(state, index=i) (i is the position in the state, 0..%d, as "
                "Apex's loader assigns them), or keep the Apex code on the shim "
                "(amp_shim.amp.load_state_dict), which keeps one scaler per loss."
                % (count, count, ", ".join(repr(k) for k, _ in entries), count - 1)
            )
        index = 0
    if isinstance(index, bool) or not isinstance(index, Integral):
        raise TypeError("index must be an int position, got %r" % (index,))
    if not 0 <= index < count:
        raise ScalerStateError(
            "index=%d is out of range: the Apex amp state holds %d loss scaler(s) (positions 0..%d)"
            % (index, count, count - 1)
        )
    key, entry = entries[index]
    if not isinstance(entry, Mapping):
        raise ScalerStateError(
            "Apex entry %r must be a mapping with 'loss_scale' and 'unskipped', got %s"
            % (key, type(entry).__name__)
        )
    missing = [k for k in _APEX_ENTRY_KEYS if k not in entry]
    extra = [k for k in entry if k not in _APEX_ENTRY_KEYS]
    if missing or extra:
        raise ScalerStateError(
            "Apex entry %r must have exactly the keys 'loss_scale' and 'unskipped'%s%s"
            % (
                key,
                "; missing: %s" % ", ".join(repr(k) for k in missing) if missing else "",
                "; unexpected: %s" % ", ".join(repr(k) for k in extra) if extra else "",
            )
        )
    scale = _check_scale(entry["loss_scale"], "%r['loss_scale']" % key)
    if not _fits_float32(scale):
        raise ScalerStateError(
            "%r['loss_scale'] = %r is not exactly representable in float32, the dtype "
            "torch.amp.GradScaler keeps its scale in; loading it would change it to %r"
            % (key, scale, _to_float32(scale))
        )
    tracker = _check_counter(entry["unskipped"], "%r['unskipped']" % key)
    return {
        "scale": scale,
        "growth_factor": APEX_GROWTH_FACTOR,
        "backoff_factor": APEX_BACKOFF_FACTOR,
        "growth_interval": APEX_GROWTH_INTERVAL,
        "_growth_tracker": tracker,
    }


# -- GradScaler -> Apex ------------------------------------------------------------------------


def grad_scaler_to_apex(state: Mapping[str, Any]) -> "OrderedDict[str, dict[str, Any]]":
    """Convert a `torch.amp.GradScaler.state_dict()` to Apex's `amp.state_dict()` format.

    Returns ``OrderedDict([('loss_scaler0', {'loss_scale': float, 'unskipped': int})])``: one
    scaler, for `amp.initialize` with the default ``num_losses=1`` (loading it into more scalers
    sets only the first, with Apex's warning about the entry count).

    Raises:
        TypeError: `state` is not a mapping.
        ScalerStateError (a ValueError): empty state (a disabled GradScaler), missing or
            unexpected keys, or growth/backoff/interval other than Apex's 2.0/0.5/2000.
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            "expected torch.amp.GradScaler.state_dict() (a mapping with keys %s), got %s"
            % (", ".join(_GRAD_SCALER_KEYS), type(state).__name__)
        )
    if len(state) == 0:
        raise ScalerStateError(
            "the GradScaler state is empty, which is what a disabled GradScaler "
            "(enabled=False) saves: there is no loss scale to convert. The Apex equivalent is no "
            "loss scaling (opt_level O0); skip amp.load_state_dict for this checkpoint."
        )
    missing = [k for k in _GRAD_SCALER_KEYS if k not in state]
    extra = [k for k in state if k not in _GRAD_SCALER_KEYS]
    if missing or extra:
        raise ScalerStateError(
            "not a torch.amp.GradScaler state: expected the keys %s%s%s"
            % (
                ", ".join(repr(k) for k in _GRAD_SCALER_KEYS),
                "; missing: %s" % ", ".join(repr(k) for k in missing) if missing else "",
                "; unexpected: %s" % ", ".join(repr(k) for k in extra) if extra else "",
            )
        )
    differing = [
        "%s=%r (Apex: %r)" % (name, state[name], apex_value)
        for name, apex_value in (
            ("growth_factor", APEX_GROWTH_FACTOR),
            ("backoff_factor", APEX_BACKOFF_FACTOR),
            ("growth_interval", APEX_GROWTH_INTERVAL),
        )
        if isinstance(state[name], bool) or not isinstance(state[name], Real) or state[name] != apex_value
    ]
    if differing:
        raise ScalerStateError(
            "this GradScaler state cannot be represented in Apex's amp format: %s. Apex's "
            "LossScaler hard-codes growth x2, backoff x0.5 and a 2000-step window and saves only "
            "the scale and the counter; keep this checkpoint with torch.amp.GradScaler."
            % "; ".join(differing)
        )
    scale = _check_scale(state["scale"], "'scale'")
    tracker = _check_counter(state["_growth_tracker"], "'_growth_tracker'")
    return OrderedDict([("loss_scaler0", {"loss_scale": scale, "unskipped": tracker})])


# -- helpers -------------------------------------------------------------------------------------


def _check_scale(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ScalerStateError("%s must be a number, got %r" % (where, value))
    scale = float(value)
    if not math.isfinite(scale) or scale < 0.0:
        raise ScalerStateError("%s must be a finite, non-negative number, got %r" % (where, value))
    return scale


def _check_counter(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ScalerStateError("%s must be an int, got %r" % (where, value))
    counter = int(value)
    if not 0 <= counter <= _INT32_MAX:
        raise ScalerStateError(
            "%s = %d is outside 0..2**31-1, the range of GradScaler's int32 growth tracker" % (where, counter)
        )
    return counter


def _to_float32(value: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.inf


def _fits_float32(value: float) -> bool:
    return _to_float32(value) == value
