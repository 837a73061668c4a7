"""`amp.state_dict()` / `amp.load_state_dict()`: Apex's checkpoint format and load quirks."""

from __future__ import annotations

import re
from collections import OrderedDict

import pytest
import torch

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.amp.scaler import LossScaler

pytestmark = pytest.mark.filterwarnings("ignore::amp_shim._deprecation.DeprecatedFeatureWarning")


def _scalers(*specs):
    _amp_state.loss_scalers = [LossScaler(spec) for spec in specs]
    return _amp_state.loss_scalers


def _state(scaler):
    return scaler.loss_scale(), scaler._unskipped


# Format ---------------------------------------------------------------------------------------


def test_state_dict_is_an_ordered_dict_of_scale_and_unskipped_per_loss():
    s0, s1 = _scalers("dynamic", 128.0)
    s0._unskipped = 7
    sd = amp.state_dict()
    assert type(sd) is OrderedDict
    assert list(sd.items()) == [
        ("loss_scaler0", {"loss_scale": 65536.0, "unskipped": 7}),
        ("loss_scaler1", {"loss_scale": 128.0, "unskipped": 0}),
    ]
    assert type(sd["loss_scaler0"]) is dict


def test_state_dict_values_are_python_numbers_not_tensors():
    _scalers("dynamic")
    entry = amp.state_dict()["loss_scaler0"]
    assert type(entry["loss_scale"]) is float
    assert type(entry["unskipped"]) is int


def test_state_dict_static_scale_is_stored_as_given():
    _scalers(1.0)
    assert amp.state_dict() == OrderedDict([("loss_scaler0", {"loss_scale": 1.0, "unskipped": 0})])


def test_state_dict_keys_follow_num_losses():
    _scalers(*["dynamic"] * 12)
    assert list(amp.state_dict()) == ["loss_scaler%d" % i for i in range(12)]


def test_state_dict_fills_a_given_destination():
    _scalers("dynamic")
    destination = {"model": "kept"}
    result = amp.state_dict(destination)
    assert result is destination
    assert destination == {"model": "kept", "loss_scaler0": {"loss_scale": 65536.0, "unskipped": 0}}


def test_state_dict_saves_nothing_but_scale_and_counter():
    _amp_state.loss_scalers = [LossScaler("dynamic", min_loss_scale=4.0, max_loss_scale=2.0**10)]
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 0}}


def test_state_dict_before_initialize_raises_attribute_error():
    with pytest.raises(AttributeError):
        amp.state_dict()


def test_state_dict_after_initialize_has_one_entry_per_loss():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp.initialize(model, optimizer, opt_level="O0", loss_scale="dynamic", num_losses=2, verbosity=0)
    assert amp.state_dict() == OrderedDict(
        [
            ("loss_scaler0", {"loss_scale": 65536.0, "unskipped": 0}),
            ("loss_scaler1", {"loss_scale": 65536.0, "unskipped": 0}),
        ]
    )


# Load ------------------------------------------------------------------------------------------


def test_round_trip_restores_scale_and_counter(capsys):
    s0, s1 = _scalers("dynamic", "dynamic")
    s0._loss_scale, s0._unskipped = 1024.0, 17
    s1._loss_scale, s1._unskipped = 2.0**20, 3
    saved = amp.state_dict()
    t0, t1 = _scalers("dynamic", "dynamic")
    amp.load_state_dict(saved)
    assert (_state(t0), _state(t1)) == ((1024.0, 17), (2.0**20, 3))
    assert capsys.readouterr().out == ""


def test_load_is_by_position_not_by_key_number():
    s0, s1 = _scalers("dynamic", "dynamic")
    amp.load_state_dict(
        OrderedDict(
            [
                ("loss_scaler1", {"loss_scale": 4.0, "unskipped": 1}),
                ("loss_scaler0", {"loss_scale": 8.0, "unskipped": 2}),
            ]
        )
    )
    assert _state(s0) == (4.0, 1)
    assert _state(s1) == (8.0, 2)


def test_load_matches_any_key_containing_loss_scaler():
    (s0,) = _scalers("dynamic")
    amp.load_state_dict({"my_loss_scaler_for_gan": {"loss_scale": 32.0, "unskipped": 5}})
    assert _state(s0) == (32.0, 5)


def test_load_with_fewer_entries_warns_and_loads_what_is_there(capsys):
    s0, s1 = _scalers("dynamic", "dynamic")
    s1._loss_scale = 16.0
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 9}})
    assert (
        capsys.readouterr().out == "Warning: state_dict contains 1 entries, while 2 loss_scalers are used\n"
    )
    assert _state(s0) == (2.0, 9)
    assert _state(s1) == (16.0, 0)


def test_load_with_more_entries_warns_then_skips_the_rest(capsys):
    (s0,) = _scalers("dynamic")
    amp.load_state_dict(
        OrderedDict(
            [
                ("loss_scaler0", {"loss_scale": 2.0, "unskipped": 1}),
                ("loss_scaler1", {"loss_scale": 4.0, "unskipped": 2}),
                ("loss_scaler2", {"loss_scale": 8.0, "unskipped": 3}),
            ]
        )
    )
    assert capsys.readouterr().out == (
        "Warning: state_dict contains 3 entries, while 1 loss_scalers are used\n"
        "Skipping loss_scaler[1], since num_losses was set to 1\n"
    )
    assert _state(s0) == (2.0, 1)


def test_unexpected_keys_raise_after_the_valid_entries_were_applied(capsys):
    s0, s1 = _scalers("dynamic", "dynamic")
    message = 'Error(s) in loading state_dict. Unexpected key(s) in state_dict: "foo", "bar". '
    with pytest.raises(RuntimeError, match="^" + re.escape(message) + "$"):
        amp.load_state_dict(
            OrderedDict(
                [
                    ("foo", 1),
                    ("loss_scaler0", {"loss_scale": 256.0, "unskipped": 4}),
                    ("bar", 2),
                    ("loss_scaler1", {"loss_scale": 512.0, "unskipped": 6}),
                ]
            )
        )
    assert _state(s0) == (256.0, 4)
    assert _state(s1) == (512.0, 6)
    # The unexpected keys count toward the entry total in the size warning.
    assert (
        capsys.readouterr().out == "Warning: state_dict contains 4 entries, while 2 loss_scalers are used\n"
    )


def test_single_unexpected_key_message():
    _scalers("dynamic")
    message = 'Error(s) in loading state_dict. Unexpected key(s) in state_dict: "foo". '
    with pytest.raises(RuntimeError, match="^" + re.escape(message) + "$"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}, "foo": 0})


def test_unexpected_keys_after_the_skip_point_are_not_reported(capsys):
    (s0,) = _scalers("dynamic")
    amp.load_state_dict(
        OrderedDict(
            [
                ("loss_scaler0", {"loss_scale": 2.0, "unskipped": 1}),
                ("loss_scaler1", {"loss_scale": 4.0, "unskipped": 2}),
                ("foo", 3),
            ]
        )
    )
    assert _state(s0) == (2.0, 1)
    assert "Skipping loss_scaler[1], since num_losses was set to 1\n" in capsys.readouterr().out


def test_static_checkpoint_loads_into_a_dynamic_scaler_without_complaint(capsys):
    (dynamic,) = _scalers("dynamic")
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 128.0, "unskipped": 42}})
    assert dynamic.dynamic is True
    assert _state(dynamic) == (128.0, 42)
    assert capsys.readouterr().out == ""


def test_dynamic_checkpoint_loads_into_a_static_scaler_without_complaint():
    (static,) = _scalers(1.0)
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 65536.0, "unskipped": 3}})
    assert static.dynamic is False
    assert _state(static) == (65536.0, 3)


def test_load_does_not_modify_the_given_state_dict():
    _scalers("dynamic")
    sd = OrderedDict([("loss_scaler0", {"loss_scale": 2.0, "unskipped": 1})])
    before = OrderedDict((k, dict(v)) for k, v in sd.items())
    amp.load_state_dict(sd)
    assert sd == before


def test_load_before_initialize_raises_attribute_error():
    with pytest.raises(AttributeError):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}})
