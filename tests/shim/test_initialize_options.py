"""`amp.initialize` option handling, validation messages and printout, as Apex's `frontend.py` has them."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from amp_shim import _deprecation, amp
from amp_shim._deprecation import DeprecatedFeatureWarning, deprecated_warning
from amp_shim.amp import frontend
from amp_shim.amp._amp_state import _amp_state
from amp_shim.amp.frontend import O0, O1, O2, O3, Properties, opt_levels

pytestmark = pytest.mark.filterwarnings("ignore::amp_shim._deprecation.DeprecatedFeatureWarning")


def _model_and_optimizer():
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _properties_at(level: str) -> Properties:
    return opt_levels[level](Properties())


# Exact Apex messages -------------------------------------------------------------------------

CAST_MODEL_TYPE_O1 = (
    "O1 inserts casts around Torch functions rather than model weights, so with O1, the model "
    "weights themselves should remain FP32. If you wish to cast the model to a different type, "
    "use opt_level='O2' or 'O3'. cast_model_type was {}"
)
PATCH_NOT_O1 = "Currently, patch_torch_functions=True should only be set by selecting opt_level='O1'."
KEEP_BN_O1 = (
    "With opt_level O1, batchnorm functions are automatically patched to run in FP32, so "
    "keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was {}"
)
KEEP_BN_TYPE = (
    "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None, "
    "found keep_batchnorm_fp32={}"
)
MASTER_WEIGHTS_O1 = (
    "It doesn't make sense to use master_weights with O1. "
    "With O1, your model weights themselves should be FP32."
)
BAD_OPT_LEVEL = (
    "Unexpected optimization level {}. Options are 'O0', 'O1', 'O2', 'O3'.  Note that in `O0`, "
    "`O1`, etc., the prefix O is the letter O, not the number zero."
)
NOTICE = (
    "this program runs Apex's amp API on amp_shim over torch.amp; "
    "to migrate it to torch.amp itself, run `amp-migrate PATH`"
)


def _raises_exactly(exc_type, message):
    return pytest.raises(exc_type, match="^" + re.escape(message) + "$")


# The property object and the O-level table (§2.2) ---------------------------------------------


def test_fresh_properties_hold_apex_start_values_in_apex_order():
    assert list(Properties().options.items()) == [
        ("enabled", False),
        ("opt_level", None),
        ("cast_model_type", None),
        ("patch_torch_functions", False),
        ("keep_batchnorm_fp32", None),
        ("master_weights", None),
        ("loss_scale", 1.0),
    ]


@pytest.mark.parametrize(
    "level, cast_model_type, patch, keep_bn, master, loss_scale",
    [
        ("O0", torch.float32, False, None, False, 1.0),
        ("O1", None, True, None, None, "dynamic"),
        ("O2", torch.float16, False, True, True, "dynamic"),
        ("O3", torch.float16, False, False, False, 1.0),
    ],
)
def test_opt_level_sets_the_table_values(level, cast_model_type, patch, keep_bn, master, loss_scale):
    props = _properties_at(level)
    assert props.options == {
        "enabled": True,
        "opt_level": level,
        "cast_model_type": cast_model_type,
        "patch_torch_functions": patch,
        "keep_batchnorm_fp32": keep_bn,
        "master_weights": master,
        "loss_scale": loss_scale,
    }
    assert props.cast_model_type is cast_model_type
    assert props.keep_batchnorm_fp32 is keep_bn


def test_opt_levels_map_names_to_level_objects_in_apex_order():
    assert list(opt_levels) == ["O3", "O2", "O1", "O0"]
    assert [type(v) for v in opt_levels.values()] == [O3, O2, O1, O0]


def test_level_objects_return_the_properties_they_modify_in_place():
    props = Properties()
    assert O2()(props) is props


def test_level_sets_enabled_then_opt_level_then_the_five_properties_in_table_order():
    seen = []

    class Recording(Properties):
        def __setattr__(self, name, value):
            if "options" in self.__dict__:
                seen.append(name)
            super().__setattr__(name, value)

    O2()(Recording())
    assert seen == [
        "enabled",
        "opt_level",
        "cast_model_type",
        "patch_torch_functions",
        "keep_batchnorm_fp32",
        "master_weights",
        "loss_scale",
    ]


def test_level_applied_over_o1_properties_is_checked_against_the_new_level():
    props = _properties_at("O1")
    O2()(props)  # opt_level switches first, so the O1-only checks do not fire
    assert props.opt_level == "O2" and props.master_weights is True


def test_briefs_are_apex_strings():
    assert O0.brief == "O0:  Pure FP32 training.\n"
    assert O1.brief == "O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n"
    assert O2.brief == "O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n"
    assert O3.brief == "O3:  Pure FP16 training."


def test_every_level_has_a_longer_description():
    for level in opt_levels.values():
        assert isinstance(level.more, str) and len(level.more) > len(level.brief)


def test_unknown_property_read_raises_attribute_error_naming_the_class():
    with _raises_exactly(AttributeError, "'Properties' object has no attribute 'fused_optimizer'"):
        _ = Properties().fused_optimizer


def test_unknown_property_write_is_silently_dropped_as_in_apex():
    props = Properties()
    props.fused_optimizer = True
    assert "fused_optimizer" not in props.options
    assert "fused_optimizer" not in props.__dict__


def test_update_options_dict_bypasses_the_checks():
    props = _properties_at("O1")
    props._update_options_dict([("master_weights", True), ("keep_batchnorm_fp32", "yes")])
    assert props.master_weights is True
    assert props.keep_batchnorm_fp32 == "yes"


def test_update_options_dict_rejects_unknown_options():
    with _raises_exactly(ValueError, "Tried to set unexpected option fused_optimizer"):
        Properties()._update_options_dict([("fused_optimizer", True)])


# Validation under the selected opt_level (§2.3 step 6) ----------------------------------------


def test_o1_rejects_a_half_cast_model_type():
    with _raises_exactly(RuntimeError, CAST_MODEL_TYPE_O1.format("torch.float16")):
        _properties_at("O1").cast_model_type = torch.float16


@pytest.mark.parametrize("value", [False, torch.float32, None])
def test_o1_accepts_cast_model_type_false_float32_or_none(value):
    props = _properties_at("O1")
    props.cast_model_type = value
    assert props.cast_model_type is value


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_other_levels_accept_any_cast_model_type(level):
    props = _properties_at(level)
    props.cast_model_type = torch.bfloat16
    assert props.cast_model_type is torch.bfloat16


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_patch_torch_functions_outside_o1_is_an_error(level):
    with _raises_exactly(RuntimeError, PATCH_NOT_O1):
        _properties_at(level).patch_torch_functions = True


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_patch_torch_functions_false_outside_o1_is_accepted(level):
    props = _properties_at(level)
    props.patch_torch_functions = False
    assert props.patch_torch_functions is False


def test_patch_torch_functions_false_under_o1_is_accepted():
    props = _properties_at("O1")
    props.patch_torch_functions = False
    assert props.patch_torch_functions is False


@pytest.mark.parametrize("value", [True, False, "True", "False"])
def test_o1_rejects_any_keep_batchnorm_fp32(value):
    with _raises_exactly(RuntimeError, KEEP_BN_O1.format(value)):
        _properties_at("O1").keep_batchnorm_fp32 = value


@pytest.mark.parametrize("value", [True, False])
def test_o1_rejects_master_weights_even_false(value):
    with _raises_exactly(RuntimeError, MASTER_WEIGHTS_O1):
        _properties_at("O1").master_weights = value


@pytest.mark.parametrize(
    "value, expected", [("True", True), ("False", False), (True, True), (False, False), (None, None)]
)
def test_keep_batchnorm_fp32_strings_become_bools(value, expected):
    props = _properties_at("O2")
    props.keep_batchnorm_fp32 = value
    assert props.keep_batchnorm_fp32 is expected


@pytest.mark.parametrize("value", [1, 0, "true", "yes", 1.0])
def test_keep_batchnorm_fp32_other_values_fail_the_assertion(value):
    with _raises_exactly(AssertionError, KEEP_BN_TYPE.format(value)):
        _properties_at("O2").keep_batchnorm_fp32 = value


@pytest.mark.parametrize(
    "value, expected",
    [("128", 128.0), ("128.0", 128.0), (128, 128.0), (True, 1.0), (0.5, 0.5)],
)
def test_loss_scale_goes_through_float(value, expected):
    props = _properties_at("O1")
    props.loss_scale = value
    assert type(props.loss_scale) is float and props.loss_scale == expected


def test_loss_scale_dynamic_string_is_kept():
    props = _properties_at("O3")
    props.loss_scale = "dynamic"
    assert props.loss_scale == "dynamic"


def test_loss_scale_non_numeric_string_raises_value_error():
    with pytest.raises(ValueError, match="could not convert string to float: 'abc'"):
        _properties_at("O1").loss_scale = "abc"


def test_hard_override_prints_the_message_and_keeps_the_value(capsys):
    _amp_state.hard_override = True
    props = _properties_at("O1")
    props.master_weights = True
    props.cast_model_type = torch.float16
    props.keep_batchnorm_fp32 = "True"
    props.opt_level = "O3"
    props.patch_torch_functions = True
    assert capsys.readouterr().out == (
        "Warning:  "
        + MASTER_WEIGHTS_O1
        + "\n"
        + "Warning:  "
        + CAST_MODEL_TYPE_O1.format("torch.float16")
        + "\n"
        + "Warning:  "
        + KEEP_BN_O1.format("True")
        + "\n"
        + "Warning:  "
        + PATCH_NOT_O1
        + "\n"
    )
    assert props.master_weights is True
    assert props.cast_model_type is torch.float16
    assert props.keep_batchnorm_fp32 is True
    assert props.patch_torch_functions is True


def test_hard_override_does_not_silence_the_keep_batchnorm_fp32_assertion():
    _amp_state.hard_override = True
    with _raises_exactly(AssertionError, KEEP_BN_TYPE.format("yes")):
        _properties_at("O2").keep_batchnorm_fp32 = "yes"


# The same checks through initialize (§2.3) -----------------------------------------------------


@pytest.mark.parametrize(
    "overrides, exc_type, message",
    [
        (
            {"opt_level": "O1", "cast_model_type": torch.float16},
            RuntimeError,
            CAST_MODEL_TYPE_O1.format("torch.float16"),
        ),
        ({"opt_level": "O2", "patch_torch_functions": True}, RuntimeError, PATCH_NOT_O1),
        ({"opt_level": "O0", "patch_torch_functions": True}, RuntimeError, PATCH_NOT_O1),
        ({"opt_level": "O1", "keep_batchnorm_fp32": "False"}, RuntimeError, KEEP_BN_O1.format("False")),
        ({"opt_level": "O1", "master_weights": False}, RuntimeError, MASTER_WEIGHTS_O1),
        ({"opt_level": "O3", "keep_batchnorm_fp32": "yes"}, AssertionError, KEEP_BN_TYPE.format("yes")),
    ],
)
def test_initialize_override_errors(overrides, exc_type, message):
    model, optimizer = _model_and_optimizer()
    with _raises_exactly(exc_type, message):
        amp.initialize(model, optimizer, verbosity=0, **overrides)
    assert not hasattr(_amp_state, "loss_scalers")


def test_initialize_loss_scale_abc_raises_value_error():
    model, optimizer = _model_and_optimizer()
    with pytest.raises(ValueError):
        amp.initialize(model, optimizer, opt_level="O2", loss_scale="abc", verbosity=0)


@pytest.mark.parametrize("opt_level", [None, "o1", "01", "O4", "", "O 1"])
def test_unknown_opt_level_is_a_runtime_error(opt_level):
    model, optimizer = _model_and_optimizer()
    with _raises_exactly(RuntimeError, BAD_OPT_LEVEL.format(opt_level)):
        amp.initialize(model, optimizer, opt_level=opt_level)


def test_unknown_opt_level_prints_nothing_and_stores_no_loss_scale_limits(capsys):
    with pytest.raises(RuntimeError):
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O5", min_loss_scale=1.0)
    assert capsys.readouterr().out == ""
    assert not hasattr(_amp_state, "min_loss_scale")


def test_loss_scale_limits_are_stored_before_overrides_are_checked():
    with pytest.raises(RuntimeError):
        amp.initialize(
            torch.nn.Linear(2, 2),
            opt_level="O1",
            master_weights=True,
            verbosity=0,
            min_loss_scale=0.25,
            max_loss_scale=2.0**20,
        )
    assert _amp_state.min_loss_scale == 0.25
    assert _amp_state.max_loss_scale == 2.0**20


def test_cudnn_disabled_is_a_runtime_error():
    with torch.backends.cudnn.flags(enabled=False):
        with _raises_exactly(RuntimeError, "Amp requires torch.backends.cudnn.enabled = True"):
            amp.initialize(torch.nn.Linear(2, 2), opt_level="O0")


def test_hard_override_warnings_print_in_apex_override_order(capsys):
    _amp_state.hard_override = True
    model, optimizer = _model_and_optimizer()
    amp.initialize(
        model,
        optimizer,
        opt_level="O1",
        loss_scale="128",
        master_weights=True,
        keep_batchnorm_fp32=True,
        cast_model_type=torch.float16,
    )
    out = capsys.readouterr().out
    between = out.split("Processing user overrides (additional kwargs that are not None)...\n")[1]
    between = between.split("After processing overrides, optimization options are:\n")[0]
    assert between == (
        "Warning:  "
        + CAST_MODEL_TYPE_O1.format("torch.float16")
        + "\n"
        + "Warning:  "
        + KEEP_BN_O1.format("True")
        + "\n"
        + "Warning:  "
        + MASTER_WEIGHTS_O1
        + "\n"
    )
    props = _amp_state.opt_properties
    assert (props.cast_model_type, props.keep_batchnorm_fp32, props.master_weights, props.loss_scale) == (
        torch.float16,
        True,
        True,
        128.0,
    )


def test_initialize_stores_the_checked_properties_and_limits_in_amp_state():
    model, optimizer = _model_and_optimizer()
    amp.initialize(
        model,
        optimizer,
        opt_level="O0",
        loss_scale="dynamic",
        verbosity=0,
        min_loss_scale=2.0,
        max_loss_scale=2.0**10,
        num_losses=3,
    )
    props = _amp_state.opt_properties
    assert isinstance(props, Properties)
    assert props.opt_level == "O0" and props.loss_scale == "dynamic"
    assert (_amp_state.min_loss_scale, _amp_state.max_loss_scale) == (2.0, 2.0**10)
    assert len(_amp_state.loss_scalers) == 3
    assert all(s.dynamic and s.loss_scale() == 1024.0 for s in _amp_state.loss_scalers)


def test_initialize_string_loss_scale_makes_a_static_scaler():
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", loss_scale="128", verbosity=0)
    scaler = _amp_state.loss_scalers[0]
    assert scaler.dynamic is False and scaler.loss_scale() == 128.0


def test_initialize_builds_fresh_properties_on_every_call():
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    first = _amp_state.opt_properties
    amp.initialize(torch.nn.Linear(2, 2), enabled=False)
    assert _amp_state.opt_properties is not first
    assert _amp_state.opt_properties.options == Properties().options


# Exact printout (§2.7) ---------------------------------------------------------------------------

O0_TABLE = (
    "enabled                : True\n"
    "opt_level              : O0\n"
    "cast_model_type        : torch.float32\n"
    "patch_torch_functions  : False\n"
    "keep_batchnorm_fp32    : None\n"
    "master_weights         : False\n"
    "loss_scale             : 1.0\n"
)
O1_TABLE = (
    "enabled                : True\n"
    "opt_level              : O1\n"
    "cast_model_type        : None\n"
    "patch_torch_functions  : True\n"
    "keep_batchnorm_fp32    : None\n"
    "master_weights         : None\n"
    "loss_scale             : dynamic\n"
)
O2_TABLE = (
    "enabled                : True\n"
    "opt_level              : O2\n"
    "cast_model_type        : torch.float16\n"
    "patch_torch_functions  : False\n"
    "keep_batchnorm_fp32    : True\n"
    "master_weights         : True\n"
    "loss_scale             : dynamic\n"
)
O3_TABLE = (
    "enabled                : True\n"
    "opt_level              : O3\n"
    "cast_model_type        : torch.float16\n"
    "patch_torch_functions  : False\n"
    "keep_batchnorm_fp32    : False\n"
    "master_weights         : False\n"
    "loss_scale             : 1.0\n"
)
HEADERS = {
    "O0": "Selected optimization level O0:  Pure FP32 training.\n\n",
    "O1": "Selected optimization level O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n\n",
    "O2": "Selected optimization level O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n\n",
    "O3": "Selected optimization level O3:  Pure FP16 training.\n",
}
TABLES = {"O0": O0_TABLE, "O1": O1_TABLE, "O2": O2_TABLE, "O3": O3_TABLE}


def _expected_printout(level: str, after: str) -> str:
    return (
        HEADERS[level]
        + "Defaults for this optimization level are:\n"
        + TABLES[level]
        + "Processing user overrides (additional kwargs that are not None)...\n"
        + "After processing overrides, optimization options are:\n"
        + after
    )


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_printout_without_overrides_matches_apex(level, capsys):
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level=level)
    assert capsys.readouterr().out == _expected_printout(level, TABLES[level])


def test_printout_of_default_call_is_o1(capsys):
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer)
    assert capsys.readouterr().out == _expected_printout("O1", O1_TABLE)


@pytest.mark.parametrize(
    "level, overrides, after",
    [
        (
            "O0",
            {"loss_scale": "dynamic"},
            O0_TABLE.replace("loss_scale             : 1.0\n", "loss_scale             : dynamic\n"),
        ),
        (
            "O1",
            {"loss_scale": 128, "cast_model_type": torch.float32},
            O1_TABLE.replace(
                "cast_model_type        : None\n", "cast_model_type        : torch.float32\n"
            ).replace("loss_scale             : dynamic\n", "loss_scale             : 128.0\n"),
        ),
        (
            "O2",
            {"keep_batchnorm_fp32": "False", "master_weights": False, "loss_scale": "128.0"},
            O2_TABLE.replace("keep_batchnorm_fp32    : True\n", "keep_batchnorm_fp32    : False\n")
            .replace("master_weights         : True\n", "master_weights         : False\n")
            .replace("loss_scale             : dynamic\n", "loss_scale             : 128.0\n"),
        ),
        (
            "O3",
            {"keep_batchnorm_fp32": "True", "cast_model_type": False},
            O3_TABLE.replace("keep_batchnorm_fp32    : False\n", "keep_batchnorm_fp32    : True\n").replace(
                "cast_model_type        : torch.float16\n", "cast_model_type        : False\n"
            ),
        ),
    ],
)
def test_printout_with_overrides_matches_apex(level, overrides, after, capsys):
    assert after != TABLES[level]
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level=level, **overrides)
    assert capsys.readouterr().out == _expected_printout(level, after)


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_verbosity_zero_prints_nothing(level, capsys):
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level=level, verbosity=0)
    assert capsys.readouterr().out == ""
    assert _amp_state.verbosity == 0


def test_verbosity_zero_does_not_hide_hard_override_warnings(capsys):
    # warn_or_err prints with print(), not maybe_print, so verbosity=0 does not hide it.
    _amp_state.hard_override = True
    model, optimizer = _model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O1", master_weights=True, verbosity=0)
    assert capsys.readouterr().out == "Warning:  " + MASTER_WEIGHTS_O1 + "\n"


# Deprecation warning (§1) -------------------------------------------------------------------------


def test_deprecated_feature_warning_is_a_future_warning():
    assert issubclass(DeprecatedFeatureWarning, FutureWarning)


def test_initialize_gives_the_shim_notice_in_apex_deprecation_category(monkeypatch):
    monkeypatch.setattr(_deprecation, "_notice_given", False)  # as in a fresh process
    model, optimizer = _model_and_optimizer()
    with pytest.warns(DeprecatedFeatureWarning, match="^" + re.escape(NOTICE) + "$"):
        amp.initialize(model, optimizer, opt_level="O0", verbosity=0)


def test_the_notice_comes_even_when_disabled_or_invalid(monkeypatch):
    monkeypatch.setattr(_deprecation, "_notice_given", False)
    with pytest.warns(DeprecatedFeatureWarning):
        amp.initialize(torch.nn.Linear(2, 2), enabled=False)
    monkeypatch.setattr(_deprecation, "_notice_given", False)
    with pytest.warns(DeprecatedFeatureWarning):
        with pytest.raises(RuntimeError):
            amp.initialize(torch.nn.Linear(2, 2), opt_level="O9")


def test_deprecated_warning_warns_when_not_distributed():
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deprecated_warning("old thing")
    assert [(w.category, str(w.message)) for w in caught] == [(DeprecatedFeatureWarning, "old thing")]


# enabled=False pass-through (§2.8) ----------------------------------------------------------------


def test_disabled_returns_the_model_alone_when_no_optimizer(capsys):
    model = torch.nn.Linear(2, 2)
    assert amp.initialize(model, enabled=False, opt_level="O2") is model
    assert "forward" not in model.__dict__
    assert model.weight.dtype == torch.float32
    assert capsys.readouterr().out == ""


def test_disabled_returns_model_and_optimizer_untouched():
    model, optimizer = _model_and_optimizer()
    result = amp.initialize(model, optimizer, enabled=False, opt_level="O1")
    assert type(result) is tuple and len(result) == 2
    assert result[0] is model and result[1] is optimizer
    assert not hasattr(optimizer, "_amp_stash")
    assert "step" not in optimizer.__dict__
    assert not hasattr(_amp_state, "loss_scalers")
    assert getattr(_amp_state, "handle", None) is None


def test_disabled_keeps_containers_exactly_as_passed():
    models = [torch.nn.Linear(2, 2)]
    optimizers = (torch.optim.SGD(models[0].parameters(), lr=0.1),)  # a tuple: enabled=True would raise
    out_models, out_optimizers = amp.initialize(models, optimizers, enabled=False)
    assert out_models is models and out_optimizers is optimizers


def test_disabled_skips_every_check():
    not_a_model = "anything"
    assert (
        amp.initialize(not_a_model, enabled=False, opt_level="bogus", keep_batchnorm_fp32="yes")
        is not_a_model
    )
    with torch.backends.cudnn.flags(enabled=False):
        assert amp.initialize(not_a_model, enabled=False) is not_a_model


def test_disabled_leaves_disabled_properties_and_stores_verbosity():
    amp.initialize(torch.nn.Linear(2, 2), enabled=False, verbosity=0)
    assert _amp_state.opt_properties.enabled is False
    assert _amp_state.opt_properties.opt_level is None
    assert _amp_state.verbosity == 0
    assert not hasattr(_amp_state, "loss_scalers")
    assert not hasattr(_amp_state, "min_loss_scale")


def test_frontend_exposes_apex_names():
    for name in (
        "Properties",
        "O0",
        "O1",
        "O2",
        "O3",
        "opt_levels",
        "initialize",
        "state_dict",
        "load_state_dict",
    ):
        assert hasattr(frontend, name)
    assert amp.initialize is frontend.initialize
