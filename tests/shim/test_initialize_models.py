"""`amp.initialize` on models and optimizers: validation errors, return shapes and the O2/O3
model handling (Apex's `_initialize.py`).

Exact messages are matched in full: legacy test suites and log scrapers match on them."""

from __future__ import annotations

import collections
import re
import socket
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from amp_shim import amp
from amp_shim.amp import _initialize as init_mod
from amp_shim.amp._amp_state import _amp_state


def _exactly(exc_type, message):
    return pytest.raises(exc_type, match="^" + re.escape(message) + "$")


def _model_and_optimizer(momentum=0.0):
    model = nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)


PARALLEL_MSG = (
    "Incoming model is an instance of {}. Parallel wrappers should only be applied to the "
    "model(s) AFTER \nthe model(s) have been returned from amp.initialize."
)
SCALE_LOSS_UNINITIALIZED = (
    "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
    "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
    "before `with amp.scale_loss`."
)


# §2.4 validation errors ------------------------------------------------------------------------


def test_optimizers_given_as_a_tuple_is_a_type_error():
    model, opt = _model_and_optimizer()
    with _exactly(TypeError, "optimizers must be either a single optimizer or a list of optimizers."):
        amp.initialize(model, (opt,), opt_level="O1", verbosity=0)
    assert not hasattr(opt, "_amp_stash")


@pytest.mark.parametrize("models", [(nn.Linear(2, 2),), {"m": nn.Linear(2, 2)}, "model", None])
def test_models_that_are_neither_a_module_nor_a_list_are_a_type_error(models):
    with _exactly(TypeError, "models must be either a single model or a list of models."):
        amp.initialize(models, opt_level="O1", verbosity=0)


def test_optimizer_type_is_checked_before_models_type():
    with _exactly(TypeError, "optimizers must be either a single optimizer or a list of optimizers."):
        amp.initialize("not a model", (), opt_level="O1", verbosity=0)


def test_dataparallel_wrapped_model_is_refused_with_apex_message():
    wrapped = nn.DataParallel(nn.Linear(2, 2))
    with _exactly(RuntimeError, PARALLEL_MSG.format("torch.nn.parallel.DataParallel")):
        amp.initialize(wrapped, opt_level="O1", verbosity=0)


def test_dataparallel_wrapped_model_inside_a_list_is_refused():
    wrapped = nn.DataParallel(nn.Linear(2, 2))
    with _exactly(RuntimeError, PARALLEL_MSG.format("torch.nn.parallel.DataParallel")):
        amp.initialize([nn.Linear(2, 2), wrapped], opt_level="O2", verbosity=0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ddp_wrapped_model_is_refused_with_apex_message():
    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method="tcp://127.0.0.1:{}".format(_free_port()), rank=0, world_size=1
    )
    try:
        wrapped = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
        with _exactly(RuntimeError, PARALLEL_MSG.format("torch.nn.parallel.DistributedDataParallel")):
            amp.initialize(wrapped, opt_level="O1", verbosity=0)
    finally:
        dist.destroy_process_group()


def test_half_param_is_refused_with_apex_found_param_message():
    model = nn.Linear(2, 2).half()
    message = (
        "Found param weight with type torch.HalfTensor, expected torch.cuda.FloatTensor.\n"
        "When using amp.initialize, you do not need to call .half() on your model\n"
        "before passing it, no matter what optimization level you choose."
    )
    with _exactly(RuntimeError, message):
        amp.initialize(model, opt_level="O2", verbosity=0)


def test_half_param_name_is_the_qualified_parameter_name():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].bias.data = model[1].bias.data.half()
    with pytest.raises(RuntimeError, match=r"^Found param 1\.bias with type torch\.HalfTensor"):
        amp.initialize(model, opt_level="O1", verbosity=0)


def test_half_param_check_goes_through_warn_or_err_so_hard_override_only_prints(capsys):
    _amp_state.hard_override = True
    model = nn.Linear(2, 2).half()
    assert amp.initialize(model, opt_level="O1", verbosity=0) is model
    assert "Warning:  Found param weight with type torch.HalfTensor" in capsys.readouterr().out


def test_allow_incoming_model_not_fp32_skips_the_fp32_check():
    _amp_state.allow_incoming_model_not_fp32 = True
    model = nn.Linear(2, 2).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    returned_model, returned_opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    assert returned_model is model and returned_opt is opt
    assert model.weight.dtype == torch.float16


def test_same_optimizer_passed_to_initialize_twice_is_refused():
    model, opt = _model_and_optimizer()
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with _exactly(RuntimeError, "A given optimizer should only be passed through amp.initialize once."):
        amp.initialize(nn.Linear(4, 3), opt, opt_level="O1", verbosity=0)


def test_same_optimizer_twice_in_one_list_is_refused():
    model, opt = _model_and_optimizer()
    with _exactly(RuntimeError, "A given optimizer should only be passed through amp.initialize once."):
        amp.initialize(model, [opt, opt], opt_level="O0", verbosity=0)


@pytest.mark.parametrize(
    "name",
    [
        "_lazy_init_maybe_master_weights",
        "_master_params_to_model_params",
        "_prepare_amp_backward",
        "_post_amp_backward",
        "_amp_lazy_init",
    ],
)
def test_optimizer_that_already_defines_an_amp_method_is_refused(name):
    model, opt = _model_and_optimizer()
    setattr(opt, name, lambda *a: None)
    with _exactly(RuntimeError, "Incoming optimizer already has {} defined.".format(name)):
        amp.initialize(model, opt, opt_level="O2", verbosity=0)


def test_float64_param_fails_at_lazy_init_not_at_initialize():
    model = nn.Linear(2, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)  # accepted here
    message = (
        "Optimizer's parameters must be either torch.cuda.FloatTensor or "
        "torch.cuda.HalfTensor. Received torch.DoubleTensor"
    )
    loss = model(torch.ones(1, 2, dtype=torch.float64)).sum()
    with _exactly(TypeError, message):
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
    with _exactly(TypeError, message):
        opt._amp_lazy_init()


def test_float64_param_outside_the_model_fails_at_o2_lazy_init():
    model = nn.Linear(2, 2)
    extra = nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = torch.optim.SGD([{"params": model.parameters()}, {"params": [extra]}], lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    with _exactly(
        TypeError,
        "Optimizer's parameters must be either torch.cuda.FloatTensor or "
        "torch.cuda.HalfTensor. Received torch.DoubleTensor",
    ):
        opt.zero_grad()


def test_scale_loss_before_initialize_raises_apex_message():
    assert not hasattr(_amp_state, "opt_properties")
    _, opt = _model_and_optimizer()
    with _exactly(RuntimeError, SCALE_LOSS_UNINITIALIZED):
        with amp.scale_loss(torch.ones(()), opt):
            pass


# §2.5 return shapes ----------------------------------------------------------------------------


def test_module_without_optimizers_returns_the_module():
    model = nn.Linear(2, 2)
    assert amp.initialize(model, opt_level="O1", verbosity=0) is model


def test_list_without_optimizers_returns_the_same_list():
    models = [nn.Linear(2, 2), nn.Linear(2, 2)]
    first, second = models
    out = amp.initialize(models, opt_level="O2", verbosity=0)
    assert out is models
    assert out[0] is first and out[1] is second


def test_module_and_optimizer_return_a_tuple_of_the_same_objects():
    model, opt = _model_and_optimizer()
    out = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    assert type(out) is tuple and len(out) == 2
    assert out[0] is model and out[1] is opt


def test_list_and_single_optimizer_return_the_list_and_the_optimizer():
    models = [nn.Linear(2, 2), nn.Linear(2, 2)]
    opt = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.1)
    out = amp.initialize(models, opt, opt_level="O1", verbosity=0)
    assert type(out) is tuple
    assert out[0] is models and out[1] is opt


def test_module_and_optimizer_list_return_the_module_and_the_same_list():
    model, opt = _model_and_optimizer()
    optimizers = [opt]
    out = amp.initialize(model, optimizers, opt_level="O0", verbosity=0)
    assert out[0] is model
    assert out[1] is optimizers and out[1][0] is opt


def test_module_and_empty_optimizer_list_return_the_module_and_the_empty_list():
    model = nn.Linear(2, 2)
    optimizers = []
    out = amp.initialize(model, optimizers, opt_level="O1", verbosity=0)
    assert out == (model, [])
    assert out[0] is model and out[1] is optimizers


def test_list_and_list_return_both_same_lists():
    models = [nn.Linear(2, 2), nn.Linear(2, 2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    saved = list(optimizers)
    out = amp.initialize(models, optimizers, opt_level="O2", verbosity=0)
    assert out[0] is models and out[1] is optimizers
    assert all(a is b for a, b in zip(out[1], saved))
    assert all(hasattr(o, "_amp_stash") for o in optimizers)


# O2/O3 model casting ---------------------------------------------------------------------------


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn_affine = nn.BatchNorm1d(4)
        self.bn_plain = nn.BatchNorm1d(4, affine=False)

    def forward(self, x):
        return self.bn_plain(self.bn_affine(self.fc(x)))


def test_o2_keeps_affine_batchnorm_fp32_and_casts_non_affine_batchnorm():
    net = BNNet()
    amp.initialize(net, opt_level="O2", verbosity=0)
    assert net.fc.weight.dtype == torch.float16 and net.fc.bias.dtype == torch.float16
    for t in (
        net.bn_affine.weight,
        net.bn_affine.bias,
        net.bn_affine.running_mean,
        net.bn_affine.running_var,
    ):
        assert t.dtype == torch.float32
    assert net.bn_plain.running_mean.dtype == torch.float16
    assert net.bn_plain.running_var.dtype == torch.float16
    assert net.bn_affine.num_batches_tracked.dtype == torch.int64
    assert net.bn_plain.num_batches_tracked.dtype == torch.int64


def test_o3_default_casts_batchnorm_too():
    net = BNNet()
    amp.initialize(net, opt_level="O3", verbosity=0)
    for t in (net.fc.weight, net.bn_affine.weight, net.bn_affine.running_mean, net.bn_plain.running_var):
        assert t.dtype == torch.float16
    assert net.bn_affine.num_batches_tracked.dtype == torch.int64


def test_o3_with_keep_batchnorm_fp32_keeps_affine_batchnorm_fp32():
    net = BNNet()
    amp.initialize(net, opt_level="O3", keep_batchnorm_fp32=True, verbosity=0)
    assert net.fc.weight.dtype == torch.float16
    assert net.bn_affine.weight.dtype == torch.float32
    assert net.bn_affine.running_var.dtype == torch.float32
    assert net.bn_plain.running_mean.dtype == torch.float16


def test_o2_with_keep_batchnorm_fp32_false_casts_batchnorm():
    net = BNNet()
    amp.initialize(net, opt_level="O2", keep_batchnorm_fp32=False, verbosity=0)
    assert net.bn_affine.weight.dtype == torch.float16


def test_model_casting_keeps_the_parameter_objects():
    net = BNNet()
    before = list(net.parameters())
    amp.initialize(net, opt_level="O2", verbosity=0)
    assert all(a is b for a, b in zip(before, net.parameters()))


class Recorder(nn.Module):
    """Records what its forward receives and returns `out` (or a default tensor)."""

    def __init__(self, out=None):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.seen_args = None
        self.seen_kwargs = None
        self.out = out

    def forward(self, *args, **kwargs):
        self.seen_args, self.seen_kwargs = args, kwargs
        if self.out is not None:
            return self.out
        return self.w * 2


def test_forward_patch_casts_float_inputs_to_fp16_and_leaves_int_tensors():
    model = Recorder()
    amp.initialize(model, opt_level="O2", verbosity=0)
    ints = torch.arange(3)
    model(torch.ones(2), torch.ones(2, dtype=torch.float64), ints, key=torch.zeros(1), idx=ints)
    a, b, c = model.seen_args
    assert a.dtype == torch.float16 and b.dtype == torch.float16
    assert c is ints
    assert model.seen_kwargs["key"].dtype == torch.float16
    assert model.seen_kwargs["idx"] is ints


def test_forward_patch_is_an_instance_attribute():
    model = Recorder()
    amp.initialize(model, opt_level="O3", verbosity=0)
    assert "forward" in vars(model)
    assert type(model).forward is Recorder.forward


def test_forward_patch_casts_outputs_to_fp32_by_default():
    model = Recorder(out=(torch.ones(2, dtype=torch.float16), torch.arange(2), "tag"))
    amp.initialize(model, opt_level="O3", verbosity=0)
    half, ints, tag = model(torch.ones(2))
    assert half.dtype == torch.float32
    assert ints.dtype == torch.int64
    assert tag == "tag"


def test_cpu_model_forward_does_not_warn_about_non_cuda_inputs():
    # docs/differences.md row 13: Apex warned "An input tensor was not cuda." for every CPU tensor
    model = nn.Linear(3, 2)
    amp.initialize(model, opt_level="O2", verbosity=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model(torch.ones(4, 3)).dtype == torch.float32


def test_model_output_of_the_fp16_model_is_fp32():
    model = nn.Linear(3, 2)
    amp.initialize(model, opt_level="O2", verbosity=0)
    out = model(torch.ones(4, 3))
    assert out.dtype == torch.float32
    assert model.weight.dtype == torch.float16


def test_cast_model_outputs_replaces_the_fp32_output_cast():
    model = Recorder(out={"y": torch.ones(2)})
    amp.initialize(model, opt_level="O2", cast_model_outputs=torch.float16, verbosity=0)
    assert model(torch.ones(2))["y"].dtype == torch.float16


def test_o0_forward_patch_casts_inputs_to_fp32():
    model = Recorder()
    amp.initialize(model, opt_level="O0", verbosity=0)
    model(torch.ones(2, dtype=torch.float16))
    assert model.seen_args[0].dtype == torch.float32


def test_cast_model_outputs_alone_at_o1_patches_only_the_outputs():
    model = Recorder(out=torch.ones(2, dtype=torch.float32))
    amp.initialize(model, opt_level="O1", cast_model_outputs=torch.float16, verbosity=0)
    x = torch.ones(2, dtype=torch.float64)
    out = model(x)
    assert model.seen_args[0] is x  # inputs untouched
    assert out.dtype == torch.float16
    assert model.w.dtype == torch.float32


def test_o1_without_cast_model_outputs_does_not_patch_forward():
    model = Recorder()
    amp.initialize(model, opt_level="O1", verbosity=0)
    assert "forward" not in vars(model)


def test_cast_model_type_false_with_cast_model_outputs_patches_only_outputs():
    model = Recorder(out=torch.ones(2))
    amp.initialize(
        model, opt_level="O2", cast_model_type=False, cast_model_outputs=torch.float16, verbosity=0
    )
    x = torch.ones(2)
    assert model(x).dtype == torch.float16
    assert model.seen_args[0] is x
    assert model.w.dtype == torch.float32


# applier semantics -----------------------------------------------------------------------------


def _half(t):
    return init_mod.to_type(torch.float16, t)


Pair = collections.namedtuple("Pair", ["a", "b"])


class Batch:
    def __init__(self, x):
        self.x = x
        self.cast_to = None

    def to(self, dtype):
        out = Batch(self.x.to(dtype))
        out.cast_to = dtype
        return out


def test_applier_turns_any_mapping_into_a_plain_dict():
    ordered = OrderedDict([("b", torch.ones(1)), ("a", torch.ones(1))])
    out = init_mod.applier(ordered, _half)
    assert type(out) is dict
    assert list(out) == ["b", "a"]
    assert all(v.dtype == torch.float16 for v in out.values())


def test_applier_passes_str_and_numpy_arrays_through():
    arr = np.ones(3, dtype=np.float32)
    assert init_mod.applier("text", _half) == "text"
    assert init_mod.applier(arr, _half) is arr
    out = init_mod.applier([arr, "s"], _half)
    assert out[0] is arr and out[1] == "s"


def test_applier_casts_a_custom_batch_object_through_its_to_method():
    out = init_mod.applier(Batch(torch.ones(2)), _half)
    assert isinstance(out, Batch)
    assert out.cast_to == torch.float16 and out.x.dtype == torch.float16


def test_applier_keeps_list_and_tuple_types_and_recurses():
    out = init_mod.applier([torch.ones(1), (torch.ones(1), 3)], _half)
    assert type(out) is list and type(out[1]) is tuple
    assert out[0].dtype == torch.float16 and out[1][0].dtype == torch.float16 and out[1][1] == 3


def test_applier_keeps_namedtuples():
    out = init_mod.applier(Pair(torch.ones(1), "x"), _half)
    assert type(out) is Pair
    assert out.a.dtype == torch.float16 and out.b == "x"


def test_applier_returns_non_iterables_unchanged():
    sentinel = object()
    assert init_mod.applier(sentinel, _half) is sentinel
    assert init_mod.applier(3, _half) == 3
    assert init_mod.applier(None, _half) is None


def test_applier_semantics_hold_through_the_patched_forward():
    arr = np.zeros(2)
    out_value = OrderedDict(
        [
            ("pair", Pair(torch.ones(1, dtype=torch.float16), "k")),
            ("items", [torch.ones(1, dtype=torch.float16)]),
        ]
    )
    model = Recorder(out=out_value)
    amp.initialize(model, opt_level="O2", verbosity=0)
    out = model({"x": torch.ones(1)}, Batch(torch.ones(1)), Pair(torch.ones(1), arr), "s")
    d, batch, pair, s = model.seen_args
    assert type(d) is dict and d["x"].dtype == torch.float16
    assert batch.cast_to == torch.float16
    assert type(pair) is Pair and pair.a.dtype == torch.float16 and pair.b is arr
    assert s == "s"
    assert type(out) is dict
    assert type(out["pair"]) is Pair and out["pair"].a.dtype == torch.float32
    assert type(out["items"]) is list and out["items"][0].dtype == torch.float32


# state_dict and the optimizer-state recast -----------------------------------------------------


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_model_state_dict_after_o2_o3_is_all_fp32(level):
    net = BNNet()
    amp.initialize(net, opt_level=level, verbosity=0)
    sd = net.state_dict()
    assert net.fc.weight.dtype == torch.float16  # the model itself stays fp16
    floats = {k: v for k, v in sd.items() if v.is_floating_point()}
    assert set(floats) >= {"fc.weight", "fc.bias", "bn_affine.weight", "bn_plain.running_mean"}
    assert all(v.dtype == torch.float32 for v in floats.values())
    assert sd["bn_affine.num_batches_tracked"].dtype == torch.int64
    assert torch.equal(sd["fc.weight"], net.fc.weight.float())


def test_o3_state_dict_of_a_submodule_is_fp32_too():
    net = BNNet()
    amp.initialize(net, opt_level="O3", verbosity=0)
    assert net.fc.state_dict()["weight"].dtype == torch.float32


def test_existing_momentum_state_is_recast_to_fp16_at_o3():
    model, opt = _model_and_optimizer(momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert opt.state[model.weight]["momentum_buffer"].dtype == torch.float32
    expected = opt.state[model.weight]["momentum_buffer"].clone()
    amp.initialize(model, opt, opt_level="O3", verbosity=0)
    buf = opt.state[model.weight]["momentum_buffer"]
    assert buf.dtype == torch.float16
    assert torch.equal(buf, expected.half())


def test_o1_leaves_existing_optimizer_state_alone():
    model, opt = _model_and_optimizer(momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    buf = opt.state[model.weight]["momentum_buffer"]
    amp.initialize(model, opt, opt_level="O1", verbosity=0)
    assert opt.state[model.weight]["momentum_buffer"] is buf
