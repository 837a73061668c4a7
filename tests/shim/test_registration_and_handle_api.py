"""Apex's cast registry, cast decorators, banned functions (Apex's `amp.py` and cast lists) and the old handle
API (`amp.init()`, `AmpHandle`, `NoOpHandle`, `wrap_optimizer`, the pre-2019 Amp) on the shim's O1."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import _deprecation, amp
from amp_shim._deprecation import DeprecatedFeatureWarning
from amp_shim.amp import amp as amp_module
from amp_shim.amp._amp_state import _amp_state
from amp_shim.amp.autocast_casts import shim_dtype
from amp_shim.amp.handle import OLD_API_MESSAGE, AmpHandle, NoOpHandle
from amp_shim.amp.opt import OptimWrapper

HALF = shim_dtype("cpu")


@pytest.fixture(autouse=True)
def empty_registries():
    yield
    amp_module._USER_CAST_REGISTRY.clear()
    amp_module._USER_PROMOTE_REGISTRY.clear()


@pytest.fixture
def lib():
    """A user module whose functions report the dtypes they computed in."""
    mod = types.ModuleType("userlib")

    def combine(x, y):
        mod.seen = (x.dtype, y.dtype, torch.is_autocast_enabled("cpu"))
        return x + y

    def one(x):
        mod.seen = (x.dtype, torch.is_autocast_enabled("cpu"))
        return x * 2

    mod.combine, mod.one = combine, one
    return mod


def o1(model=None):
    model = model or nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return amp.initialize(model, optimizer, opt_level="O1", verbosity=0)


# -- registration -------------------------------------------------------------------------------
def test_register_half_function_before_initialize_runs_it_in_the_autocast_dtype(lib):
    amp.register_half_function(lib, "one")
    original = lib.one
    o1()
    assert lib.one is not original
    assert lib.one(torch.ones(3)).dtype == HALF
    assert lib.seen == (HALF, False)  # cast inputs, body with autocast off
    _amp_state.handle._deactivate()
    assert lib.one is original


def test_register_float_function_runs_it_in_fp32_with_autocast_off(lib):
    amp.register_float_function(lib, "one")
    o1()
    assert lib.one(torch.ones(3, dtype=HALF)).dtype == torch.float32
    assert lib.seen == (torch.float32, False)


def test_register_promote_function_casts_to_the_widest_input_dtype(lib):
    amp.register_promote_function(lib, "combine")
    o1()
    out = lib.combine(torch.ones(3, dtype=HALF), torch.ones(3))
    assert out.dtype == torch.float32 and lib.seen[:2] == (torch.float32, torch.float32)
    assert lib.combine(torch.ones(3, dtype=HALF), torch.ones(3, dtype=HALF)).dtype == HALF


def test_registered_function_casts_list_arguments_and_leaves_other_arguments_alone():
    mod = types.ModuleType("m")
    mod.f = lambda xs, k, flag=None: [x.dtype for x in xs] + [k.dtype, flag]
    amp.register_half_function(mod, "f")
    o1()
    assert mod.f([torch.ones(2), torch.ones(2)], torch.ones(2, dtype=torch.long), flag="x") == [
        HALF,
        HALF,
        torch.long,
        "x",
    ]


def test_registered_function_is_a_pass_through_inside_disable_casts_and_scale_loss(lib):
    amp.register_half_function(lib, "one")
    model, optimizer = o1()
    with amp.disable_casts():
        assert lib.one(torch.ones(3)).dtype == torch.float32
    loss = model(torch.ones(2, 4)).float().sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        assert lib.one(torch.ones(3)).dtype == torch.float32
        scaled.backward()
    assert lib.one(torch.ones(3)).dtype == HALF


def test_registration_after_initialize_waits_for_the_next_o1_activation(lib):
    o1()
    amp.register_float_function(lib, "one")
    original = lib.one
    assert lib.one is original  # no effect now, as in Apex
    o1()  # a later activation consumes it
    assert lib.one is not original


def test_registrations_are_ignored_by_o0_and_o2(lib):
    amp.register_half_function(lib, "one")
    original = lib.one
    for level in ("O0", "O2"):
        model = nn.Linear(2, 2)
        amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level=level, verbosity=0)
        assert lib.one is original
    assert (lib, "one", "half") in amp_module._USER_CAST_REGISTRY


def test_register_unknown_name_raises_apex_value_error(lib):
    with pytest.raises(ValueError, match=r"^No function named nope in module <module 'userlib'>\.$"):
        amp.register_half_function(lib, "nope")


def test_register_needs_a_hashable_module_as_in_apex():
    with pytest.raises(TypeError):
        amp.register_float_function(types.SimpleNamespace(f=len), "f")


def test_registration_emits_no_deprecation_warning(lib, recwarn, monkeypatch):
    monkeypatch.setattr(_deprecation, "_notice_given", False)  # as in a fresh process
    amp.register_half_function(lib, "one")
    assert not [w for w in recwarn if issubclass(w.category, DeprecatedFeatureWarning)]


# -- decorators ---------------------------------------------------------------------------------
def test_decorators_act_only_while_o1_is_on():
    @amp.float_function
    def to_float(x):
        return x

    @amp.half_function
    def to_half(x):
        return x

    assert to_float.__name__ == "to_float"
    x16, x32 = torch.ones(2, dtype=HALF), torch.ones(2)
    assert to_float(x16).dtype == HALF and to_half(x32).dtype == torch.float32  # before O1
    o1()
    assert to_float(x16).dtype == torch.float32 and to_half(x32).dtype == HALF
    _amp_state.handle._deactivate()
    assert to_float(x16).dtype == HALF and to_half(x32).dtype == torch.float32


def test_promote_function_decorator_promotes_mixed_inputs():
    add = amp.promote_function(lambda a, b: a + b)
    o1()
    assert add(torch.ones(2, dtype=HALF), torch.ones(2)).dtype == torch.float32


# -- banned functions and disable_casts ---------------------------------------------------------
def test_binary_cross_entropy_on_half_raises_under_o1_even_inside_disable_casts():
    o1()
    x = torch.rand(3, dtype=HALF)
    with pytest.raises(
        NotImplementedError, match="amp does not work out-of-the-box with `F.binary_cross_entropy`"
    ):
        F.binary_cross_entropy(x, x)
    with amp.disable_casts(), pytest.raises(NotImplementedError):
        nn.BCELoss()(x, x)
    _amp_state.handle._deactivate()
    F.binary_cross_entropy(x.float(), x.float())  # original restored


def test_allow_banned_runs_binary_cross_entropy_in_float():
    handle = amp.init(allow_banned=True)
    x = torch.rand(3, dtype=HALF)
    assert F.binary_cross_entropy(x, x).dtype == torch.float32
    handle._deactivate()


def test_disable_casts_restores_casts_after_an_exception():
    o1()
    with pytest.raises(KeyError):
        with amp.disable_casts():
            assert not torch.is_autocast_enabled("cpu")
            raise KeyError("boom")
    assert torch.is_autocast_enabled("cpu") and _amp_state.handle.is_active()


def test_disable_casts_without_o1_raises_apex_attribute_error():
    with pytest.raises(AttributeError, match="'AmpState' object has no attribute 'handle'"):
        with amp.disable_casts():
            pass


# -- the handle API -----------------------------------------------------------------------------
def test_init_returns_an_active_handle_that_switches_o1_on():
    handle = amp.init()
    assert isinstance(handle, AmpHandle) and handle.is_active()
    assert _amp_state.handle is handle
    assert nn.Linear(4, 2)(torch.ones(1, 4)).dtype == HALF
    handle._deactivate()
    assert not handle.is_active()
    assert nn.Linear(4, 2)(torch.ones(1, 4)).dtype == torch.float32


def test_handle_scale_loss_raises_the_old_api_error_on_entry():
    handle = amp.init()
    model = nn.Linear(2, 1)
    cm = handle.scale_loss(model(torch.ones(1, 2)).sum(), torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(RuntimeError) as info:
        with cm:
            pass
    assert str(info.value) == (
        "The old Amp API is no longer supported.  Please move to the new API, documented here:  "
        "https://nvidia.github.io/apex/amp.html.  Transition guide:  "
        "https://nvidia.github.io/apex/amp.html#transition-guide-for-old-api-users"
    )
    assert str(info.value) == OLD_API_MESSAGE


def test_init_disabled_returns_a_no_op_handle():
    handle = amp.init(enabled=False)
    assert isinstance(handle, NoOpHandle) and not handle.is_active()
    assert not hasattr(_amp_state, "handle")
    loss = torch.tensor(3.0)
    with handle.scale_loss(loss, None) as same:
        assert same is loss
    model = nn.Linear(2, 1)
    optimizer = handle.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    with optimizer.scale_loss(loss) as same:
        assert same is loss


def _grads_of(losses_fn, params):
    for p in params:
        p.grad = None
    for loss in losses_fn():
        loss.backward()
    return [p.grad.clone() for p in params]


def make_problem():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(5))
    b = nn.Parameter(torch.randn(5))
    x = torch.randn(5)
    losses = lambda: [(w * x + b).pow(2).sum(), (w * b).sum() * 3]  # noqa: E731 (no cast ops)
    return w, b, losses


def test_wrap_optimizer_unscales_each_loss_by_its_own_scaler_and_sums_the_grads():
    w, b, losses = make_problem()
    expected = _grads_of(losses, [w, b])
    handle = amp.init()
    optimizer = handle.wrap_optimizer(torch.optim.SGD([w, b], lr=0.1), num_loss=2)
    assert isinstance(optimizer, OptimWrapper) and handle._default_scaler is None
    optimizer._loss_scaler[1]._loss_scale = 2.0**10
    optimizer.zero_grad()
    first, second = losses()
    with optimizer.scale_loss(first) as scaled:
        assert scaled.item() == first.item() * 2.0**16
        scaled.backward()
    with optimizer.scale_loss(second) as scaled:
        scaled.backward()
    torch.testing.assert_close([w.grad, b.grad], expected, rtol=0, atol=0)
    before = w.detach().clone()
    optimizer.step()
    assert not torch.equal(w, before)


def test_more_losses_than_num_loss_before_step_is_an_assertion_error():
    w, b, losses = make_problem()
    optimizer = amp.init().wrap_optimizer(torch.optim.SGD([w, b], lr=0.1))
    with optimizer.scale_loss(losses()[0]) as scaled:
        scaled.backward()
    with pytest.raises(AssertionError):
        with optimizer.scale_loss(losses()[1]) as scaled:
            scaled.backward()


def test_wrapped_optimizer_skips_the_step_after_an_overflow_with_apex_message(capsys):
    w, b, losses = make_problem()
    optimizer = amp.init().wrap_optimizer(torch.optim.SGD([w, b], lr=0.1))
    before = [w.detach().clone(), b.detach().clone()]
    with optimizer.scale_loss(losses()[0] * float("inf")) as scaled:
        scaled.backward()
    optimizer.step()
    assert capsys.readouterr().out == "Gradient overflow, skipping update\n"
    torch.testing.assert_close([w.detach(), b.detach()], before, rtol=0, atol=0)
    assert optimizer._loss_scaler[0].loss_scale() == 2.0**15
    optimizer.zero_grad()
    with optimizer.scale_loss(losses()[0]) as scaled:
        scaled.backward()
    optimizer.step()  # the next clean iteration steps
    assert capsys.readouterr().out == "" and not torch.equal(w.detach(), before[0])


def test_wrapped_optimizer_refuses_closures_and_forwards_the_optimizer_api():
    w, b, _ = make_problem()
    inner = torch.optim.SGD([w, b], lr=0.1)
    optimizer = amp.init().wrap_optimizer(inner)
    with pytest.raises(
        NotImplementedError, match="^The `closure` argument is unsupported by the amp optimizer wrapper.$"
    ):
        optimizer.step(lambda: 0.0)
    assert optimizer.param_groups is inner.param_groups
    assert optimizer.state_dict() == inner.state_dict()
    assert repr(optimizer) == repr(inner)
