"""Apex `amp.state_dict()` <-> `torch.amp.GradScaler.state_dict()` (per-loss `loss_scaler{i}`
entries <-> one scaler's `scale`, `_growth_tracker`, ...).

The conversion must be lossless (values and types), a GradScaler loaded from it must take the
same scale sequence as the shim's Apex scaler, and whatever one side cannot represent must be
refused with a message that says why and what to do instead.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.amp.scaler import LossScaler
from amp_shim.checkpoint_format import (
    ScalerStateError,
    apex_to_grad_scaler,
    grad_scaler_to_apex,
    is_apex_scaler_state,
    is_grad_scaler_state,
)

APEX_CONSTANTS = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def _apex(scale, unskipped):
    return OrderedDict([("loss_scaler0", {"loss_scale": scale, "unskipped": unskipped})])


def _grad_scaler(scale, tracker, **overrides):
    state = {"scale": scale, **APEX_CONSTANTS, "_growth_tracker": tracker}
    state.update(overrides)
    return state


def _same_float(a, b):
    """Equal as IEEE values, sign of zero included, and both Python floats."""
    return type(a) is float and type(b) is float and a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


# Any scale a float32 tensor holds (GradScaler's storage), and every power of two from the
# default 65536 down to the smallest subnormal and up to the largest float32 power of two.
float32_scales = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False, width=32) | st.integers(
    -149, 127
).map(lambda k: 2.0**k)
counters = st.integers(min_value=0, max_value=2**31 - 1)


# -- lossless round trips -------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scale=float32_scales, unskipped=counters)
def test_apex_state_round_trips_through_grad_scaler_format_exactly(scale, unskipped):
    apex_state = _apex(float(scale), unskipped)
    torch_state = apex_to_grad_scaler(apex_state)
    assert list(torch_state) == [
        "scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "_growth_tracker",
    ]
    assert _same_float(torch_state["scale"], float(scale))
    assert type(torch_state["_growth_tracker"]) is int and torch_state["_growth_tracker"] == unskipped
    back = grad_scaler_to_apex(torch_state)
    assert type(back) is OrderedDict
    assert back == apex_state
    assert _same_float(back["loss_scaler0"]["loss_scale"], float(scale))
    assert type(back["loss_scaler0"]["unskipped"]) is int


@settings(max_examples=300, deadline=None)
@given(scale=float32_scales, tracker=counters)
def test_grad_scaler_state_round_trips_through_apex_format_exactly(scale, tracker):
    torch_state = _grad_scaler(float(scale), tracker)
    back = apex_to_grad_scaler(grad_scaler_to_apex(torch_state))
    assert back == torch_state
    assert list(back) == list(torch_state)
    assert _same_float(back["scale"], float(scale))
    assert type(back["growth_factor"]) is float and type(back["backoff_factor"]) is float
    assert type(back["growth_interval"]) is int and type(back["_growth_tracker"]) is int


@pytest.mark.parametrize(
    "scale, unskipped",
    [
        (65536.0, 0),  # a fresh amp.initialize
        (65536.0, 1999),  # one clean step before growth
        (2.0**24, 17),  # at Apex's default cap
        (2.0**-20, 5),  # backed off far below 1
        (0.25, 0),
        (128.0, 123456),  # a static scale: its counter grows past the window
        (3.0, 2),  # not a power of two, still exact in float32
        (0.0, 0),  # underflowed without a min_loss_scale
    ],
)
def test_examples_round_trip_with_float_scale_and_int_counter(scale, unskipped):
    torch_state = apex_to_grad_scaler(_apex(scale, unskipped))
    assert torch_state == _grad_scaler(scale, unskipped)
    assert grad_scaler_to_apex(torch_state) == _apex(scale, unskipped)


def test_int_apex_scale_from_an_int_min_loss_scale_becomes_the_equal_float():
    # Apex stores `max(256, 512 / 2.)`'s winner as given; with an int floor it is the int 256.
    torch_state = apex_to_grad_scaler(_apex(256, 3))
    assert torch_state["scale"] == 256.0 and type(torch_state["scale"]) is float
    assert grad_scaler_to_apex(torch_state) == _apex(256.0, 3)


def test_real_amp_state_dict_converts_and_a_grad_scaler_reads_it_back_unchanged():
    scaler = LossScaler("dynamic")
    scaler.set_loss_scale(2.0**-3)
    scaler.set_unskipped(1234)
    _amp_state.loss_scalers = [scaler]
    converted = apex_to_grad_scaler(amp.state_dict())

    gs = torch.amp.GradScaler("cpu")
    gs.load_state_dict(converted)
    assert gs.state_dict() == converted  # before the lazy init of its tensors
    p = torch.nn.Parameter(torch.ones(2))
    gs.scale((p * 2).sum()).backward()  # creates the float32 scale / int32 tracker tensors
    assert gs.state_dict() == converted
    assert type(gs.state_dict()["scale"]) is float and type(gs.state_dict()["_growth_tracker"]) is int


def test_real_grad_scaler_state_converts_and_amp_load_state_dict_restores_it():
    gs = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    gs.load_state_dict({**gs.state_dict(), "_growth_tracker": 42})
    apex_state = grad_scaler_to_apex(gs.state_dict())
    assert apex_state == _apex(1024.0, 42)

    _amp_state.loss_scalers = [LossScaler("dynamic")]
    amp.load_state_dict(apex_state)
    assert _amp_state.loss_scalers[0].loss_scale() == 1024.0
    assert _amp_state.loss_scalers[0]._unskipped == 42
    assert amp.state_dict() == apex_state


# -- the same scale sequence, update for update -------------------------------------------------

# update index -> (element of the gradient to poison, value). Three backoffs in a row, a NaN,
# clean streaks long enough to grow before and after the switch at update 2500, and an
# overflow right after the switch.
OVERFLOWS = {
    0: (0, math.inf),
    1: (1, math.nan),
    2: (0, -math.inf),
    40: (1, math.inf),
    300: (0, math.nan),
    2600: (1, -math.inf),
    4800: (0, math.inf),
    4801: (1, math.inf),
}
UPDATES = 5000
SWITCH_AT = 2500


def _switch_both_scalers(gs, shim):
    """Continue with a fresh GradScaler made from the shim's Apex checkpoint, and a fresh shim
    scaler made from the GradScaler's checkpoint, as two resumed jobs would."""
    _amp_state.loss_scalers = [shim]
    new_gs = torch.amp.GradScaler("cpu")
    new_gs.load_state_dict(apex_to_grad_scaler(amp.state_dict()))

    new_shim = LossScaler("dynamic")
    _amp_state.loss_scalers = [new_shim]
    amp.load_state_dict(grad_scaler_to_apex(gs.state_dict()))
    return new_gs, new_shim


def test_grad_scaler_follows_shim_dynamic_scaler_over_5000_updates_with_overflows_and_a_midway_conversion():
    x = torch.tensor([1.0, -3.0])
    param = torch.nn.Parameter(torch.tensor([0.5, 0.25]))
    opt = torch.optim.SGD([param], lr=1e-6, foreach=False)
    gs = torch.amp.GradScaler("cpu")
    shim = LossScaler("dynamic")

    history = []
    for update in range(UPDATES):
        if update == SWITCH_AT:
            gs, shim = _switch_both_scalers(gs, shim)
            assert (gs.get_scale(), gs._get_growth_tracker()) == history[-1]

        opt.zero_grad(set_to_none=True)
        loss = (param * x).sum()
        gs.scale(loss).backward()
        if update in OVERFLOWS:
            where, value = OVERFLOWS[update]
            with torch.no_grad():
                param.grad[where] = value
        grads = [param.grad.detach().clone()]
        before = param.detach().clone()

        gs.step(opt)
        gs.update()

        shim.clear_overflow_state()
        shim.unscale_(grads)
        skipped = bool(shim.update_().item())

        overflowed = update in OVERFLOWS
        assert skipped == overflowed, update
        assert torch.equal(param.detach(), before) == overflowed, update
        if not overflowed:
            assert torch.equal(param.grad, grads[0]), update  # same unscaled gradient
        state = (shim.loss_scale(), shim.unskipped_count())
        assert (gs.get_scale(), gs._get_growth_tracker()) == state, update
        history.append(state)

    scales = [s for s, _ in history]
    backoffs = sum(1 for a, b in zip(scales, scales[1:]) if b < a)
    growths = sum(1 for a, b in zip(scales, scales[1:]) if b > a)
    assert backoffs == len(OVERFLOWS) - 1 and growths == 2  # the schedule exercised both rules
    assert history[SWITCH_AT - 1][1] > 0  # the switch carried a non-trivial counter
    assert history[-1] == (1024.0, UPDATES - 1 - 4801)


# -- Apex's loader semantics: position, not the number in the key -------------------------------


def test_index_picks_the_entry_apex_loader_assigns_to_that_position_not_the_key_number():
    state = OrderedDict(
        [
            ("loss_scaler1", {"loss_scale": 1024.0, "unskipped": 1}),
            ("loss_scaler0", {"loss_scale": 8.0, "unskipped": 7}),
        ]
    )
    _amp_state.loss_scalers = [LossScaler("dynamic"), LossScaler("dynamic")]
    amp.load_state_dict(state)
    for position, scaler in enumerate(_amp_state.loss_scalers):
        converted = apex_to_grad_scaler(state, index=position)
        assert (converted["scale"], converted["_growth_tracker"]) == (scaler.loss_scale(), scaler._unskipped)
    assert apex_to_grad_scaler(state, index=0)["scale"] == 1024.0


def test_any_key_containing_loss_scaler_counts_like_in_apex():
    state = {"my_loss_scaler": {"loss_scale": 4.0, "unskipped": 2}}
    assert apex_to_grad_scaler(state) == _grad_scaler(4.0, 2)
    assert is_apex_scaler_state(state)


# -- refusals ------------------------------------------------------------------------------------


def test_several_loss_scalers_without_index_are_refused_naming_both_options():
    state = OrderedDict(
        [
            ("loss_scaler0", {"loss_scale": 65536.0, "unskipped": 3}),
            ("loss_scaler1", {"loss_scale": 32768.0, "unskipped": 0}),
            ("loss_scaler2", {"loss_scale": 8.0, "unskipped": 9}),
        ]
    )
    with pytest.raises(ScalerStateError) as excinfo:
        apex_to_grad_scaler(state)
    message = str(excinfo.value)
    assert "3 loss scalers" in message and "num_losses=3" in message
    assert "index=" in message
    assert "shim" in message and "amp_shim.amp.load_state_dict" in message
    assert apex_to_grad_scaler(state, index=2) == _grad_scaler(8.0, 9)


@pytest.mark.parametrize("index", [1, 5, -1])
def test_index_outside_the_entries_is_refused(index):
    with pytest.raises(ScalerStateError, match=r"index=-?\d+ is out of range: .* 1 loss scaler"):
        apex_to_grad_scaler(_apex(65536.0, 0), index=index)


def test_empty_apex_state_is_refused():
    with pytest.raises(ScalerStateError, match="empty: it holds no loss scaler"):
        apex_to_grad_scaler(OrderedDict())


def test_apex_state_with_other_keys_is_refused_naming_them():
    state = OrderedDict([("loss_scaler0", {"loss_scale": 1.0, "unskipped": 0}), ("opt_level", "O1")])
    with pytest.raises(ScalerStateError, match=r"unexpected key\(s\) 'opt_level'"):
        apex_to_grad_scaler(state)


def test_grad_scaler_state_given_as_apex_state_is_refused():
    with pytest.raises(ScalerStateError, match="not an Apex amp state"):
        apex_to_grad_scaler(_grad_scaler(65536.0, 0))


@pytest.mark.parametrize(
    "entry, pattern",
    [
        ({"loss_scale": 1.0}, r"missing: 'unskipped'"),
        ({"loss_scale": 1.0, "unskipped": 0, "dynamic": True}, r"unexpected: 'dynamic'"),
        ({"loss_scale": "dynamic", "unskipped": 0}, r"'loss_scale'\] must be a number"),
        ({"loss_scale": True, "unskipped": 0}, r"'loss_scale'\] must be a number"),
        ({"loss_scale": math.inf, "unskipped": 0}, r"finite, non-negative"),
        ({"loss_scale": -2.0, "unskipped": 0}, r"finite, non-negative"),
        ({"loss_scale": 1.0, "unskipped": 1.0}, r"'unskipped'\] must be an int"),
        ({"loss_scale": 1.0, "unskipped": -1}, r"outside 0..2\*\*31-1"),
        ({"loss_scale": 1.0, "unskipped": 2**31}, r"outside 0..2\*\*31-1"),
        (65536.0, r"must be a mapping"),
    ],
)
def test_malformed_apex_entry_is_refused(entry, pattern):
    with pytest.raises(ScalerStateError, match=pattern):
        apex_to_grad_scaler({"loss_scaler0": entry})


@pytest.mark.parametrize("scale", [1e-303, 0.1, 2.0**128, 65536.0 + 2.0**-20])
def test_apex_scale_that_float32_would_round_is_refused_not_rounded(scale):
    with pytest.raises(
        ScalerStateError, match=re.escape(repr(scale)) + " is not exactly representable in float32"
    ):
        apex_to_grad_scaler(_apex(scale, 0))


def test_empty_grad_scaler_state_from_a_disabled_scaler_is_refused():
    disabled = torch.amp.GradScaler("cpu", enabled=False).state_dict()
    assert disabled == {}
    with pytest.raises(
        ScalerStateError, match=r"empty.*disabled GradScaler \(enabled=False\).*no loss scale"
    ):
        grad_scaler_to_apex(disabled)


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"growth_factor": 3.0}, "growth_factor=3.0 (Apex: 2.0)"),
        ({"backoff_factor": 0.25}, "backoff_factor=0.25 (Apex: 0.5)"),
        ({"growth_interval": 100}, "growth_interval=100 (Apex: 2000)"),
        (
            {"growth_factor": 1.5, "growth_interval": 50},
            "growth_factor=1.5 (Apex: 2.0); growth_interval=50 (Apex: 2000)",
        ),
    ],
)
def test_grad_scaler_state_with_non_apex_factors_is_refused_naming_them(overrides, named):
    with pytest.raises(ScalerStateError) as excinfo:
        grad_scaler_to_apex(_grad_scaler(65536.0, 0, **overrides))
    message = str(excinfo.value)
    assert "cannot be represented in Apex's amp format" in message
    assert named in message
    assert "keep this checkpoint with torch.amp.GradScaler" in message


def test_real_grad_scaler_with_custom_growth_interval_is_refused():
    gs = torch.amp.GradScaler("cpu", growth_interval=10)
    with pytest.raises(ScalerStateError, match=r"growth_interval=10 \(Apex: 2000\)"):
        grad_scaler_to_apex(gs.state_dict())


@pytest.mark.parametrize(
    "state, pattern",
    [
        (
            {"scale": 1.0, "_growth_tracker": 0},
            r"missing: 'growth_factor', 'backoff_factor', 'growth_interval'",
        ),
        ({**_grad_scaler(1.0, 0), "_per_optimizer_states": {}}, r"unexpected: '_per_optimizer_states'"),
        (_grad_scaler(math.nan, 0), r"'scale' must be a finite, non-negative number"),
        (_grad_scaler(1.0, 2.5), r"'_growth_tracker' must be an int"),
        (_apex(1.0, 0), r"not a torch.amp.GradScaler state"),
    ],
)
def test_malformed_grad_scaler_state_is_refused(state, pattern):
    with pytest.raises(ScalerStateError, match=pattern):
        grad_scaler_to_apex(state)


@pytest.mark.parametrize("convert", [apex_to_grad_scaler, grad_scaler_to_apex])
def test_non_mapping_is_a_type_error(convert):
    with pytest.raises(TypeError, match="expected"):
        convert([("loss_scaler0", {"loss_scale": 1.0, "unskipped": 0})])


def test_refusals_are_value_errors_for_callers_that_catch_those():
    assert issubclass(ScalerStateError, ValueError)


# -- recognising the formats ----------------------------------------------------------------------


def test_format_predicates_tell_apex_and_grad_scaler_states_apart():
    _amp_state.loss_scalers = [LossScaler("dynamic"), LossScaler(128.0)]
    apex_state = amp.state_dict()
    torch_state = torch.amp.GradScaler("cpu").state_dict()
    model_state = torch.nn.Linear(2, 2).state_dict()

    assert is_apex_scaler_state(apex_state) and not is_grad_scaler_state(apex_state)
    assert is_grad_scaler_state(torch_state) and not is_apex_scaler_state(torch_state)
    for other in (
        {},
        model_state,
        {"loss_scaler0": 1.0},
        {"loss_scaler0": {"loss_scale": 1.0}},
        None,
        "x",
        [1],
    ):
        assert not is_apex_scaler_state(other)
        assert not is_grad_scaler_state(other)
