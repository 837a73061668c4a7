"""`apex.amp.amp`: `init`, the user cast registry and the cast decorators.

Apex's O1 patched some 200 torch functions; the shim's O1 is `torch.autocast` (see
`autocast_casts.py`), and what Apex layered on top as policy stays here:

* `register_{half,float,promote}_function(module, name)` record a function; the next O1
  activation (`amp.init()`, or `amp.initialize` at O1) replaces `module.name` with a wrapper
  and empties the registry, so registrations made afterwards wait for a later activation, as
  in Apex. `handle._deactivate()` puts the originals back;
* `@half_function`, `@float_function`, `@promote_function` wrap at decoration time and look up
  the current handle at call time, so they act once O1 is on and pass through otherwise;
* `F.binary_cross_entropy` raises Apex's NotImplementedError on half inputs while O1 is on,
  or, with `amp.init(allow_banned=True)`, runs in float32.

A wrapper acts while O1 casts are on in the calling thread (autocast enabled for the handle's
device: not inside `disable_casts()`, a `scale_loss` body or `optimizer.step`). It casts the
floating-point tensors on that device among the arguments (also inside list and tuple
arguments) to the autocast dtype (half), to float32 (float), or to the widest floating dtype
present (promote), and runs the function with autocast off, so the cast sticks: autocast would
otherwise recast the function's ops by its own lists. This is exactly the `_cast_inputs`
wrapper that `amp-migrate` writes when it migrates these calls to native autocast, so a
program behaves the same through the shim and after migration.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from .._deprecation import shim_notice
from . import legacy_init_casts
from ._amp_state import _amp_state
from .autocast_casts import AutocastCasts, shim_dtype
from .handle import AmpHandle, NoOpHandle
from .lists import functional_overrides, tensor_overrides, torch_overrides  # noqa: F401 (Apex's names)

HALF, FLOAT, PROMOTE = "half", "float", "promote"

_DECORATOR_HANDLE: Optional[Any] = None
_USER_CAST_REGISTRY: set = set()  # (module, name, HALF | FLOAT)
_USER_PROMOTE_REGISTRY: set = set()  # (module, name)


# -- casting -------------------------------------------------------------------------------------
def _eligible(value: Any, device_type: str) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == device_type


def _cast(value: Any, dtype: torch.dtype, device_type: str) -> Any:
    if _eligible(value, device_type):
        return value.to(dtype)
    if type(value) in (list, tuple):
        return type(value)(_cast(item, dtype, device_type) for item in value)
    return value


def _widest(values, device_type: str) -> Optional[torch.dtype]:
    dtypes = set()
    for value in values:
        for item in value if type(value) in (list, tuple) else (value,):
            if _eligible(item, device_type):
                dtypes.add(item.dtype)
    return functools.reduce(torch.promote_types, dtypes) if dtypes else None


def _call_cast(handle: AmpHandle, fn: Callable, kind: str, args, kwargs):
    """Run `fn` with its inputs cast for `kind`, if O1 casts are on in this thread."""
    casts: AutocastCasts = handle._casts
    device_type = casts.device_type
    if not torch.is_autocast_enabled(device_type):
        return fn(*args, **kwargs)
    dtype: torch.dtype | None
    if kind == HALF:
        dtype = casts.dtype
    elif kind == FLOAT:
        dtype = torch.float32
    else:
        dtype = _widest((*args, *kwargs.values()), device_type)
    with casts.disabled():
        if dtype is not None:
            args = [_cast(a, dtype, device_type) for a in args]
            kwargs = {k: _cast(v, dtype, device_type) for k, v in kwargs.items()}
        return fn(*args, **kwargs)


def _is_reduced_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype in (torch.float16, torch.bfloat16)
    if type(value) in (list, tuple):
        return any(_is_reduced_tensor(v) for v in value)
    return False


# -- what an activation installs -----------------------------------------------------------------
def _install_cast(handle: AmpHandle, module: Any, name: str, kind: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not handle.is_active():
            return original(*args, **kwargs)
        return _call_cast(handle, original, kind, args, kwargs)

    handle._save_func(module, name, original)
    setattr(module, name, wrapper)


def _install_ban(handle: AmpHandle, module: Any, name: str, message: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        # As in Apex, regardless of disable_casts: the function is unsafe on half inputs.
        if any(_is_reduced_tensor(v) for v in (*args, *kwargs.values())):
            raise NotImplementedError(message)
        return original(*args, **kwargs)

    handle._save_func(module, name, original)
    setattr(module, name, wrapper)


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _activate(
    device_type: str,
    models=(),
    loss_scale: Any = "dynamic",
    enable_caching: bool = True,
    verbose: bool = False,
    allow_banned: bool = False,
    apex_lists: bool = False,
) -> AmpHandle:
    """Switch O1 on for `device_type` and install the cast policy; what `init` and O1 share.

    `apex_lists` (the old API's `init` only): Apex's own rules where autocast's lists differ
    (`legacy_init_casts`); O1 `initialize` stays autocast alone, its native recipe.
    """
    global _DECORATOR_HANDLE
    previous = getattr(_amp_state, "handle", None)
    if previous is not None:
        previous._deactivate()  # Apex stacked a second set of patches on the first
    casts = AutocastCasts(device_type, shim_dtype(device_type))
    handle = AmpHandle(loss_scale, enable_caching, verbose, casts=casts)
    casts.activate()
    for model in models:
        casts.cover_forward(model)

    for module, name, kind in list(_USER_CAST_REGISTRY):
        _install_cast(handle, module, name, kind)
    _USER_CAST_REGISTRY.clear()
    for module, name in list(_USER_PROMOTE_REGISTRY):
        _install_cast(handle, module, name, PROMOTE)
    _USER_PROMOTE_REGISTRY.clear()
    if apex_lists:
        legacy_init_casts.install(handle, _install_cast, FLOAT, HALF)

    for name, message in functional_overrides.BANNED_FUNCS:
        if allow_banned:
            _install_cast(handle, functional_overrides.MODULE, name, FLOAT)
        else:
            _install_ban(handle, functional_overrides.MODULE, name, message)

    _DECORATOR_HANDLE = handle
    _amp_state.handle = handle
    return handle


# -- public API ----------------------------------------------------------------------------------
def init(
    enabled: bool = True,
    loss_scale: Any = "dynamic",
    enable_caching: bool = True,
    verbose: bool = False,
    allow_banned: bool = False,
):
    """The old handle API's entry point: switch O1 casts on now and return the handle.

    With `enabled=False` it returns a `NoOpHandle` and changes nothing else. The device is
    CUDA when one is available, else the CPU (`amp.initialize` takes it from the models).
    """
    global _DECORATOR_HANDLE
    if not enabled:
        handle = NoOpHandle()
        _DECORATOR_HANDLE = handle
        return handle
    return _activate(
        _default_device_type(),
        loss_scale=loss_scale,
        enable_caching=enable_caching,
        verbose=verbose,
        allow_banned=allow_banned,
        apex_lists=True,
    )


def _check_registration(module: Any, name: str) -> None:
    if not hasattr(module, name):
        raise ValueError("No function named {} in module {}.".format(name, module))


def register_half_function(module: Any, name: str) -> None:
    _check_registration(module, name)
    _USER_CAST_REGISTRY.add((module, name, HALF))


def register_float_function(module: Any, name: str) -> None:
    _check_registration(module, name)
    _USER_CAST_REGISTRY.add((module, name, FLOAT))


def register_promote_function(module: Any, name: str) -> None:
    _check_registration(module, name)
    _USER_PROMOTE_REGISTRY.add((module, name))


def _decorator(fn: Callable, kind: str) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        handle = _DECORATOR_HANDLE
        if handle is None or not handle.is_active():
            return fn(*args, **kwargs)
        return _call_cast(handle, fn, kind, args, kwargs)

    return wrapper


def half_function(fn: Callable) -> Callable:
    shim_notice()
    return _decorator(fn, HALF)


def float_function(fn: Callable) -> Callable:
    shim_notice()
    return _decorator(fn, FLOAT)


def promote_function(fn: Callable) -> Callable:
    shim_notice()
    return _decorator(fn, PROMOTE)
