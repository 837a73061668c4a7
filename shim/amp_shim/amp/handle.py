"""`apex.amp.handle`: the O1 handle, `disable_casts` and `scale_loss`.

`scale_loss` keeps Apex's protocol (stash grads, yield `loss.float() * S`, unscale and
recombine at exit, update the scale at exit, skip the next step after an overflow) but runs on
the tensor engine: nothing here reads a device value back. It also restores the stashed grads
when the body raises, where Apex left `param.grad = None` behind.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..engine.distributed import all_reduce_found_inf_
from ..engine.skip import arm_skip, print_landed_skip_messages
from ._amp_state import _amp_state
from ._process_optimizer import restore_stashed_grads
from .autocast_casts import AutocastCasts
from .casts_off import active_handle, disable_casts  # noqa: F401 (Apex exports disable_casts here)
from .opt import OptimWrapper
from .scaler import LossScaler

OLD_API_MESSAGE = (
    "The old Amp API is no longer supported.  Please move to the new API, "
    "documented here:  https://nvidia.github.io/apex/amp.html.  Transition guide:  "
    "https://nvidia.github.io/apex/amp.html#transition-guide-for-old-api-users"
)


class AmpHandle:
    """What `_amp_state.handle` holds while O1 casts are on; `amp.init()` returns it.

    Apex's handle owned its function patches; this one owns the autocast activation
    (`AutocastCasts`) plus the wrappers of registered and banned functions, and puts the
    originals back on `_deactivate()`.
    """

    def __init__(
        self,
        loss_scale: Any = "dynamic",
        enable_caching: bool = True,
        verbose: bool = False,
        *,
        casts: AutocastCasts | None = None,
    ) -> None:
        if casts is None:
            from .autocast_casts import shim_dtype

            device_type = "cuda" if torch.cuda.is_available() else "cpu"
            casts = AutocastCasts(device_type, shim_dtype(device_type))
        self._casts = casts
        self._enable_caching = enable_caching
        self._verbose = verbose
        self._is_active = True
        self._all_wrappers: list = []
        self._default_scaler: LossScaler | None = LossScaler(loss_scale, device=casts.device_type)

    def is_active(self) -> bool:
        return self._is_active and self._casts.active

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        was_active = self._is_active
        self._is_active = False
        try:
            with self._casts.disabled():
                yield
        finally:
            self._is_active = was_active

    def wrap_optimizer(self, optimizer, num_loss: int = 1):
        self._default_scaler = None
        return OptimWrapper(optimizer, self, num_loss)

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer):
        raise RuntimeError(OLD_API_MESSAGE)
        yield  # pragma: no cover - a generator, so that the error comes on `with` entry

    def _clear_cache(self) -> None:
        self._casts.clear_cache()

    def _save_func(self, mod, fn, func) -> None:
        self._all_wrappers.append((mod, fn, func))

    def _deactivate(self) -> None:
        for mod, fn, func in reversed(self._all_wrappers):
            setattr(mod, fn, func)
        self._all_wrappers = []
        self._casts.deactivate()
        self._is_active = False

    @property
    def has_cache(self) -> bool:
        return self._enable_caching

    @property
    def cache(self) -> dict:
        """Apex's cast cache; autocast keeps its cache inside torch, so this is always empty."""
        return {}

    def remove_cache(self, param) -> None:
        # torch cannot drop one entry of autocast's cache; dropping all is always correct.
        if self.has_cache:
            self._casts.clear_cache()

    @property
    def verbose(self) -> bool:
        return self._verbose


class NoOpHandle:
    """`amp.init(enabled=False)`: casts off, `scale_loss` yields the loss unchanged."""

    def is_active(self) -> bool:
        return False

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        yield

    def wrap_optimizer(self, optimizer, num_loss: int = 1):
        return OptimWrapper(optimizer, self, num_loss)

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer) -> Iterator[Any]:
        yield loss

    @property
    def has_cache(self) -> bool:
        return False

    @property
    def verbose(self) -> bool:
        return False

    def _clear_cache(self) -> None:
        pass

    def _deactivate(self) -> None:
        pass


@contextlib.contextmanager
def _casts_off_and_cleared(patch_torch_functions: bool) -> Iterator[None]:
    handle = active_handle() if patch_torch_functions else None
    if handle is None:
        yield
        return
    try:
        with handle._disable_casts():
            yield
    finally:
        handle._clear_cache()


def _is_single_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) or type(obj).__name__ == "LARC"


@contextlib.contextmanager
def scale_loss(
    loss: torch.Tensor,
    optimizers: Any,
    loss_id: int = 0,
    model: Any = None,
    delay_unscale: bool = False,
    delay_overflow_check: bool = False,
) -> Iterator[torch.Tensor]:
    if not hasattr(_amp_state, "opt_properties"):
        raise RuntimeError(
            "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
            "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
            "before `with amp.scale_loss`."
        )
    properties = _amp_state.opt_properties
    if not properties.enabled:
        yield loss
        return

    print_landed_skip_messages()  # a device-path skip whose copy has landed (CUDA)
    if _is_single_optimizer(optimizers):
        optimizers = [optimizers]
    loss_scaler = _amp_state.loss_scalers[loss_id]

    with _casts_off_and_cleared(properties.patch_torch_functions):
        if not properties.master_weights and not loss_scaler.dynamic and loss_scaler.loss_scale() == 1.0:
            yield loss.float()
            return

        prepared = []
        if not delay_unscale and isinstance(optimizers, list):
            for optimizer in optimizers:
                if not optimizer._amp_stash.params_have_scaled_gradients:
                    optimizer._prepare_amp_backward()
                    prepared.append(optimizer)
        try:
            yield loss_scaler.scaled(loss)
        except BaseException:
            for optimizer in prepared:
                restore_stashed_grads(optimizer)
            raise

        if delay_unscale:
            for optimizer in optimizers:
                optimizer._amp_stash.params_have_scaled_gradients = True
            return
        loss_scaler.clear_overflow_state()
        for optimizer in optimizers:
            optimizer._post_amp_backward(loss_scaler)
            optimizer._amp_stash.params_have_scaled_gradients = False
        if delay_overflow_check:
            return
        if loss_scaler.dynamic:
            all_reduce_found_inf_(loss_scaler.found_inf)  # under DDP every rank skips together
        found = loss_scaler.update_()
        if loss_scaler.dynamic:
            for optimizer in optimizers:
                arm_skip(optimizer, loss_id, found)
