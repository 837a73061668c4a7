"""O2 master weights (Apex's `_process_optimizer.py`): lazy fp32 masters swapped into the param groups, the
patched `step`/`zero_grad`/`add_param_group`, grads unscaled into the masters, and the O2
checkpoint round trip (docs/differences.md row 6: the fp32 masters are saved and restored)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state

CLOSURE_MSG = "Currently, Amp does not support closure use with optimizers."
SET_MSG = (
    "optimizer parameters need to be organized in ordered collections, but the ordering of "
    "tensors in sets will change between runs. Please use a list instead."
)


def _exactly(exc_type, message):
    return pytest.raises(exc_type, match="^" + re.escape(message) + "$")


def _is_in(t, seq):
    return any(t is x for x in seq)


class Net(nn.Module):
    """Two Linear layers (fp16 under O2) around an affine BatchNorm (kept fp32)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class Weighted(nn.Module):
    """loss = sum(w * x): the gradient of w is exactly x."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return (self.w * x).sum()


X = torch.linspace(-1.0, 1.0, 8 * 4).reshape(8, 4)
Y = torch.linspace(0.5, -0.5, 8 * 2).reshape(8, 2)


def _o2(model, lr=0.1, momentum=0.9, scale=128.0):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    _amp_state.loss_scalers[0]._loss_scale = scale
    return model, opt


def _iteration(model, opt, x=X, y=Y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    return loss


def _fp16_params(model):
    return [model.fc1.weight, model.fc1.bias, model.fc2.weight, model.fc2.bias]


# Lazy init --------------------------------------------------------------------------------------


def test_param_groups_still_hold_the_fp16_model_params_right_after_initialize():
    model, opt = _o2(Net())
    params = opt.param_groups[0]["params"]
    assert len(params) == len(list(model.parameters()))
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert params[0].dtype == torch.float16
    assert opt._amp_stash.lazy_init_called is False
    assert [p for p in amp.master_params(opt)][0] is model.fc1.weight


def test_first_zero_grad_swaps_fp32_masters_into_the_same_param_group_lists():
    net = Net()
    fp32_before = {n: p.detach().clone() for n, p in net.named_parameters()}
    model, opt = _o2(net)
    params_list = opt.param_groups[0]["params"]
    fp16 = _fp16_params(model)
    opt.zero_grad()
    assert opt._amp_stash.lazy_init_called is True
    # the group dict is rebuilt by the load_state_dict recast (as in Apex); the list is kept
    assert opt.param_groups[0]["params"] is params_list
    by_name = dict(zip([n for n, _ in model.named_parameters()], params_list))
    for name, model_param in model.named_parameters():
        swapped = by_name[name]
        if model_param.dtype == torch.float16:
            assert swapped is not model_param
            assert swapped.dtype == torch.float32
            assert swapped.is_leaf and swapped.requires_grad
            # the fp32 value before initialize's cast, not the fp16 copy (differences.md row 6)
            assert torch.equal(swapped, fp32_before[name])
            assert torch.equal(swapped.half(), model_param)
        else:  # affine BatchNorm stays fp32 and is stepped directly
            assert swapped is model_param
    assert all(_is_in(p, opt._amp_stash.all_fp16_params) for p in fp16)


def test_lazy_init_happens_once():
    model, opt = _o2(Net())
    opt.zero_grad()
    masters = list(opt.param_groups[0]["params"])
    opt.zero_grad()
    opt._amp_lazy_init()
    assert all(a is b for a, b in zip(masters, opt.param_groups[0]["params"]))


def test_lazy_init_moves_existing_optimizer_state_to_the_masters_as_fp32_not_rounded():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.nn.functional.mse_loss(model(X), Y).backward()
    opt.step()  # fp32 momentum state before initialize
    before = {n: opt.state[p]["momentum_buffer"].clone() for n, p in model.named_parameters()}
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    assert opt.state[model.fc1.weight]["momentum_buffer"].dtype == torch.float16  # the recast trick
    opt.zero_grad()
    names = [n for n, _ in model.named_parameters()]
    for name, param, master in zip(names, model.parameters(), opt.param_groups[0]["params"]):
        buf = opt.state[master]["momentum_buffer"]
        assert buf.dtype == torch.float32
        if param.dtype == torch.float16:
            assert not any(k is param for k in opt.state)
            # Apex: before[name].half().float(); the shim keeps the fp32 state (row 6)
            assert torch.equal(buf, before[name])
        else:
            assert torch.equal(buf, before[name])


def test_params_without_requires_grad_are_left_in_the_group():
    model = Net()
    model.fc2.bias.requires_grad_(False)
    model, opt = _o2(model)
    opt.zero_grad()
    params = opt.param_groups[0]["params"]
    assert params[-1] is model.fc2.bias and params[-1].dtype == torch.float16
    assert not _is_in(model.fc2.bias, opt._amp_stash.all_fp16_params)


def test_scale_loss_also_triggers_lazy_init():
    model, opt = _o2(Net())
    loss = torch.nn.functional.mse_loss(model(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    assert opt._amp_stash.lazy_init_called
    assert opt.param_groups[0]["params"][0].dtype == torch.float32


def test_master_params_yields_the_masters_after_lazy_init():
    model, opt = _o2(Net())
    opt.zero_grad()
    masters = list(amp.master_params(opt))
    stash = opt._amp_stash
    assert all(a is b for a, b in zip(masters, opt.param_groups[0]["params"]))
    assert all(m.dtype == torch.float32 for m in masters)
    assert sum(_is_in(m, stash.all_fp32_from_fp16_params) for m in masters) == 4
    assert sum(_is_in(m, stash.all_fp32_from_fp32_params) for m in masters) == 2
    assert _is_in(model.bn.weight, masters) and not _is_in(model.fc1.weight, masters)


# Patched step ------------------------------------------------------------------------------------


def test_after_step_the_fp16_model_equals_master_half_and_master_grads_are_none():
    model, opt = _o2(Net())
    opt.zero_grad()
    initial = [m.detach().clone() for m in opt._amp_stash.all_fp32_from_fp16_params]
    _iteration(model, opt)
    stash = opt._amp_stash
    for fp16, master, start in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params, initial):
        assert not torch.equal(master, start)  # a real step happened
        assert torch.equal(fp16, master.detach().half())
        assert master.grad is None
    assert model.fc1.weight.grad is not None  # model grads are the user's zero_grad's job


def test_step_returns_the_original_steps_return_value():
    model, opt = _o2(Net())
    loss = torch.nn.functional.mse_loss(model(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    assert opt.step() is None


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_step_with_a_closure_is_refused(how):
    model, opt = _o2(Net())
    _iteration(model, opt)
    before = [m.detach().clone() for m in amp.master_params(opt)]
    with _exactly(RuntimeError, CLOSURE_MSG):
        if how == "positional":
            opt.step(lambda: 0.0)
        else:
            opt.step(closure=lambda: 0.0)
    assert all(torch.equal(a, b) for a, b in zip(before, amp.master_params(opt)))


# Patched zero_grad -------------------------------------------------------------------------------


def test_patched_zero_grad_zeroes_model_grads_in_place_and_drops_master_grads():
    model, opt = _o2(Net())
    loss = torch.nn.functional.mse_loss(model(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    fp16_grad = model.fc1.weight.grad
    bn_grad = model.bn.weight.grad
    assert fp16_grad.abs().sum() > 0 and bn_grad.abs().sum() > 0
    assert all(m.grad is not None for m in opt._amp_stash.all_fp32_from_fp16_params)
    opt.zero_grad()
    assert model.fc1.weight.grad is fp16_grad and fp16_grad.dtype == torch.float16
    assert model.bn.weight.grad is bn_grad
    assert torch.count_nonzero(fp16_grad) == 0 and torch.count_nonzero(bn_grad) == 0
    assert all(m.grad is None for m in opt._amp_stash.all_fp32_from_fp16_params)


# Patched add_param_group ------------------------------------------------------------------------


def test_o2_add_param_group_with_a_tensor_adds_an_fp32_master():
    model, opt = _o2(Net())
    extra = nn.Parameter(torch.full((2,), 0.5, dtype=torch.float16))
    opt.add_param_group({"params": extra, "lr": 0.5})
    stash = opt._amp_stash
    assert stash.lazy_init_called  # add_param_group runs lazy init first
    assert opt.param_groups[0]["params"][0].dtype == torch.float32
    group = opt.param_groups[-1]
    assert type(group["params"]) is list and len(group["params"]) == 1
    master = group["params"][0]
    assert master is not extra and master.dtype == torch.float32
    assert torch.equal(master, extra.float())
    assert stash.all_fp16_params[-1] is extra and stash.all_fp32_from_fp16_params[-1] is master
    assert stash.fp16_groups[-1][0] is extra


def test_o2_add_param_group_with_a_list_mixes_masters_and_fp32_params():
    model, opt = _o2(Net())
    half = nn.Parameter(torch.ones(2, dtype=torch.float16))
    full = nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [half, full]})
    stash = opt._amp_stash
    params = opt.param_groups[-1]["params"]
    assert params[0] is not half and params[0].dtype == torch.float32
    assert params[1] is full
    assert stash.all_fp32_from_fp32_params[-1] is full
    assert stash.fp32_from_fp32_groups[-1] == [full]


def test_o2_added_group_is_stepped_on_its_master_and_copied_to_the_model():
    model, opt = _o2(Net())
    extra = nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt.add_param_group({"params": (p for p in [extra]), "lr": 0.25, "momentum": 0.0})
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(X), Y) + (extra.float() * 2).sum()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    master = opt.param_groups[-1]["params"][0]
    assert torch.equal(master.detach(), torch.full((3,), 0.5))  # 1 - 0.25 * 2
    assert torch.equal(extra.detach(), torch.full((3,), 0.5, dtype=torch.float16))


@pytest.mark.parametrize("level", ["O2", "O0"])
def test_add_param_group_with_a_set_is_a_type_error(level):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp.initialize(model, opt, opt_level=level, verbosity=0)
    groups = len(opt.param_groups)
    with _exactly(TypeError, SET_MSG):
        opt.add_param_group({"params": {nn.Parameter(torch.ones(1))}})
    assert len(opt.param_groups) == groups


def test_o0_add_param_group_with_a_tensor_and_a_list_extends_the_stash():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp.initialize(model, opt, opt_level="O0", verbosity=0)
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": a})
    opt.add_param_group({"params": [b]})
    stash = opt._amp_stash
    assert stash.lazy_init_called
    assert opt.param_groups[-2]["params"] == [a] and opt.param_groups[-1]["params"][0] is b
    assert stash.all_fp32_params[-2] is a and stash.all_fp32_params[-1] is b
    assert len(stash.all_fp32_grad_stash) == len(stash.all_fp32_params)
    assert not hasattr(stash, "all_fp32_from_fp16_params")


# Grads: fp16 model grads stay scaled, masters hold the unscaled sum ------------------------------


def test_fp16_model_grads_stay_scaled_and_master_grads_are_unscaled():
    model, opt = _o2(Weighted(), scale=8.0)
    x = torch.tensor([1.0, -2.0, 0.5])
    opt.zero_grad()
    with amp.scale_loss(model(x), opt) as scaled:
        assert scaled.item() == 8.0 * (x.sum().item())
        scaled.backward()
    master = opt._amp_stash.all_fp32_from_fp16_params[0]
    assert model.w.grad.dtype == torch.float16 and master.grad.dtype == torch.float32
    assert torch.equal(master.grad, x)
    assert torch.equal(model.w.grad.float(), 8.0 * master.grad)


def test_two_scale_loss_calls_accumulate_into_the_master_grads():
    model, opt = _o2(Weighted(), scale=8.0)
    x1 = torch.tensor([1.0, -2.0, 0.5])
    x2 = torch.tensor([0.25, 3.0, -1.0])
    opt.zero_grad()
    for x in (x1, x2):
        with amp.scale_loss(model(x), opt) as scaled:
            scaled.backward()
    master = opt._amp_stash.all_fp32_from_fp16_params[0]
    assert torch.equal(master.grad, x1 + x2)
    # the fp16 grads only hold the latest backward, scaled: the fp32 master grads are the stash
    assert torch.equal(model.w.grad.float(), 8.0 * x2)
    opt.step()
    torch.testing.assert_close(master.detach(), 1.0 - 0.1 * (x1 + x2), rtol=0, atol=1e-6)


# Checkpoint round trip --------------------------------------------------------------------------


def _trained_o2():
    model, opt = _o2(Net(seed=1), lr=0.01)
    for _ in range(3):
        _iteration(model, opt)
    masters = [m.detach().clone() for m in amp.master_params(opt)]
    assert any(not torch.equal(m, m.half().float()) for m in masters)  # not fp16-representable
    return model, opt, masters


def _checkpoint(model, opt):
    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


def test_o2_model_state_dict_holds_the_exact_fp32_masters():
    model, opt, masters = _trained_o2()
    sd = model.state_dict()
    for (name, _param), master in zip(model.named_parameters(), masters):
        assert sd[name].dtype == torch.float32
        assert torch.equal(sd[name], master), name


@pytest.mark.parametrize(
    "order", ["model_then_optimizer", "optimizer_then_model", "zero_grad_then_model_then_optimizer"]
)
def test_o2_checkpoint_round_trip_restores_the_exact_masters(order):
    model, opt, masters = _trained_o2()
    model_sd, opt_sd = _checkpoint(model, opt)
    momentum = [opt.state[m]["momentum_buffer"].clone() for m in amp.master_params(opt)]
    amp_sd = amp.state_dict()

    model2 = Net(seed=2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.01, momentum=0.9)
    model2, opt2 = amp.initialize(model2, opt2, opt_level="O2", verbosity=0)
    amp.load_state_dict(amp_sd)
    if order == "model_then_optimizer":
        model2.load_state_dict(model_sd)  # before lazy init: remembered for the masters
        assert opt2._amp_stash.lazy_init_called is False
        opt2.load_state_dict(opt_sd)
    elif order == "optimizer_then_model":
        opt2.load_state_dict(opt_sd)  # runs lazy init first
        assert opt2._amp_stash.lazy_init_called is True
        model2.load_state_dict(model_sd)  # copied into the existing masters
    else:
        opt2.zero_grad()
        model2.load_state_dict(model_sd)
        opt2.load_state_dict(opt_sd)

    restored = list(amp.master_params(opt2))
    assert all(torch.equal(a, b) for a, b in zip(restored, masters))
    stash = opt2._amp_stash
    for fp16, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        assert torch.equal(fp16, master.detach().half())
    for m, buf in zip(restored, momentum):
        assert opt2.state[m]["momentum_buffer"].dtype == torch.float32
        assert torch.equal(opt2.state[m]["momentum_buffer"], buf)
    # and training continues identically
    _iteration(model, opt)
    _iteration(model2, opt2)
    assert all(torch.equal(a, b) for a, b in zip(amp.master_params(opt), amp.master_params(opt2)))


def test_bert_style_manual_master_restore_pattern_works():
    model, opt, masters = _trained_o2()
    _, opt_sd = _checkpoint(model, opt)
    model2 = Net(seed=3)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.01, momentum=0.9)
    model2, opt2 = amp.initialize(model2, opt2, opt_level="O2", verbosity=0)
    opt2._lazy_init_maybe_master_weights()
    opt2._amp_stash.lazy_init_called = True
    created = list(amp.master_params(opt2))
    opt2.load_state_dict(opt_sd)
    assert all(a is b for a, b in zip(created, amp.master_params(opt2)))  # no second lazy init
    for p, s in zip(amp.master_params(opt2), masters):
        p.data.copy_(s.data)
    assert all(torch.equal(a, b) for a, b in zip(amp.master_params(opt2), masters))


# Internals real code touches (§15) ---------------------------------------------------------------


def test_amp_stash_internals_used_in_the_wild_exist():
    model, opt = _o2(Net())
    stash = opt._amp_stash
    assert stash.lazy_init_called is False
    assert stash.params_have_scaled_gradients is False
    assert stash.already_patched is False
    for name in (
        "_lazy_init_maybe_master_weights",
        "_amp_lazy_init",
        "_prepare_amp_backward",
        "_post_amp_backward",
        "_master_params_to_model_params",
    ):
        assert callable(getattr(opt, name)), name
    opt._amp_lazy_init()
    assert stash.lazy_init_called is True
    assert len(stash.all_fp32_from_fp16_params) == 4
    assert len(stash.all_fp16_params) == 4 and len(stash.all_fp32_from_fp32_params) == 2
    assert [len(g) for g in stash.fp16_groups] == [4]
    assert [len(g) for g in stash.fp32_from_fp16_groups] == [4]
    assert [len(g) for g in stash.fp32_from_fp32_groups] == [2]
    assert all(m.grad is None for m in stash.all_fp32_from_fp16_params)


def test_master_params_to_model_params_copies_masters_into_the_model():
    model, opt = _o2(Net())
    opt.zero_grad()
    for master in opt._amp_stash.all_fp32_from_fp16_params:
        master.data.fill_(0.375)
    opt._master_params_to_model_params()
    assert all(torch.equal(p, torch.full_like(p, 0.375)) for p in _fp16_params(model))


def test_clearing_master_grads_through_the_stash_after_a_manual_skip():
    model, opt = _o2(Net())
    loss = torch.nn.functional.mse_loss(model(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    assert opt._amp_stash.params_have_scaled_gradients is False
    for p in opt._amp_stash.all_fp32_from_fp16_params:
        p.grad = None
    before = [m.detach().clone() for m in opt._amp_stash.all_fp32_from_fp16_params]
    opt.step()  # SGD skips params without grads
    assert all(torch.equal(a, b) for a, b in zip(before, opt._amp_stash.all_fp32_from_fp16_params))
