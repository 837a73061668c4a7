"""`amp.scale_loss` and the loss-scale arithmetic it drives (Apex's `LossScaler`), observed
through `amp.initialize`: fast and full paths, grad stashing, `delay_unscale`,
`delay_overflow_check`, static and dynamic scalers, the skipped step, exceptions in the body,
O1's autocast around the body, and the number of host syncs per iteration."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.engine.host_syncs import SYNC_METHODS, CountHostSyncs

SKIP_MSG = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"
INF = float("inf")


class Weighted(nn.Module):
    """loss = sum(w * x): the gradient of w is exactly x (also x = inf for an overflow)."""

    def __init__(self, n=3):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.unused = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return (self.w * x).sum()


def _init(level="O1", model=None, momentum=0.0, **kwargs):
    model = model if model is not None else Weighted()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=momentum)
    model, opt = amp.initialize(model, opt, opt_level=level, verbosity=kwargs.pop("verbosity", 0), **kwargs)
    return model, opt


def _scaler(i=0):
    return _amp_state.loss_scalers[i]


def _backward(model, opt, x, **kwargs):
    with amp.scale_loss(model(x), opt, **kwargs) as scaled:
        scaled.backward()
    return scaled


def _skip_lines(text):
    return [line for line in text.splitlines() if line.startswith("Gradient overflow.")]


# Fast path ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["O0", "O3"])
def test_fast_path_yields_loss_float_for_o0_and_o3_defaults(level):
    model, opt = _init(level)
    loss = torch.tensor(1.5, dtype=torch.float16, requires_grad=True)
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled.dtype == torch.float32
        assert scaled.item() == 1.5
        scaled.backward()
    assert loss.grad.item() == 1.0  # no scale applied, nothing to unscale


@pytest.mark.parametrize("level", ["O0", "O3"])
def test_fast_path_leaves_grads_and_scaler_counters_alone(level):
    model, opt = _init(level, cast_model_outputs=torch.float16 if level == "O3" else None)
    dtype = model.w.dtype
    x = torch.tensor([1.0, 2.0, 4.0], dtype=dtype)
    model.w.grad = torch.full((3,), 0.5, dtype=dtype)
    loss = model(x)
    assert loss.dtype == (torch.float16 if level == "O3" else torch.float32)
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled.dtype == torch.float32
        assert model.w.grad is not None  # nothing stashed
        scaled.backward()
    assert torch.equal(model.w.grad, (x + 0.5).to(dtype))
    assert model.unused.grad is None
    assert opt._amp_stash.lazy_init_called is False  # no prepare/post ran
    assert _scaler()._unskipped == 0 and _scaler().loss_scale() == 1.0


# Full path ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level, expected_scale", [("O1", 65536.0), ("O2", 65536.0)])
def test_full_path_yields_fp32_loss_times_the_scale(level, expected_scale):
    model, opt = _init(level)
    loss = torch.tensor(1.5, dtype=torch.float16, requires_grad=True)
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled.dtype == torch.float32
        assert scaled.item() == 1.5 * expected_scale
        assert scaled.grad_fn is not None  # backward reaches the loss


def test_static_scale_other_than_one_takes_the_full_path():
    model, opt = _init("O0", loss_scale=128.0)
    x = torch.tensor([1.0, -2.0, 3.0])
    with amp.scale_loss(model(x), opt) as scaled:
        assert scaled.item() == 128.0 * 2.0
        scaled.backward()
        assert torch.equal(model.w.grad, 128.0 * x)  # scaled inside the block
    assert torch.equal(model.w.grad, x)  # unscaled at exit


def test_stashed_grads_are_added_to_the_new_unscaled_grads():
    model, opt = _init("O1")
    x = torch.tensor([1.0, -2.0, 3.0])
    model.w.grad = torch.tensor([0.25, 0.5, -1.0])
    model.unused.grad = torch.tensor([7.0, 8.0, 9.0])
    with amp.scale_loss(model(x), opt) as scaled:
        assert model.w.grad is None and model.unused.grad is None  # moved to the stash
        scaled.backward()
        assert torch.equal(model.w.grad, 65536.0 * x)
    assert torch.equal(model.w.grad, x + torch.tensor([0.25, 0.5, -1.0]))
    assert torch.equal(model.unused.grad, torch.tensor([7.0, 8.0, 9.0]))  # put back untouched
    assert _scaler()._unskipped == 1


def test_accumulation_without_delay_unscale_counts_every_pass():
    model, opt = _init("O1")
    for _ in range(3):
        _backward(model, opt, torch.full((3,), 2.0))
    assert torch.equal(model.w.grad, torch.full((3,), 6.0))
    assert _scaler()._unskipped == 3


# delay_unscale / delay_overflow_check ------------------------------------------------------------


def test_delay_unscale_accumulates_scaled_grads_and_the_last_pass_unscales_the_sum_once():
    model, opt = _init("O1")
    assert _scaler().loss_scale() == 65536.0
    x = torch.full((3,), 2.0)
    _backward(model, opt, x, delay_unscale=True)
    assert torch.equal(model.w.grad, torch.full((3,), 131072.0))
    assert opt._amp_stash.params_have_scaled_gradients is True
    assert _scaler()._unskipped == 0
    _backward(model, opt, x, delay_unscale=True)
    assert torch.equal(model.w.grad, torch.full((3,), 262144.0))
    assert _scaler()._unskipped == 0
    _backward(model, opt, x)
    assert torch.equal(model.w.grad, torch.full((3,), 6.0))
    assert opt._amp_stash.params_have_scaled_gradients is False
    assert _scaler()._unskipped == 1


def test_delay_unscale_pass_with_overflow_does_not_update_the_scale(capsys):
    model, opt = _init("O1")
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]), delay_unscale=True)
    assert _scaler().loss_scale() == 65536.0 and _scaler()._unskipped == 0
    opt.step()  # nothing armed: a real step
    assert _skip_lines(capsys.readouterr().out) == []


def test_delay_overflow_check_unscales_but_leaves_scale_and_counter():
    model, opt = _init("O1")
    x = torch.tensor([1.0, 2.0, 3.0])
    _backward(model, opt, x, delay_overflow_check=True)
    assert torch.equal(model.w.grad, x)
    assert _scaler().loss_scale() == 65536.0 and _scaler()._unskipped == 0
    assert _scaler().update_scale() is False
    assert _scaler()._unskipped == 1


def test_delay_overflow_check_keeps_the_flag_until_a_manual_update_scale(capsys):
    model, opt = _init("O1")
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]), delay_overflow_check=True)
    scaler = _scaler()
    assert scaler.loss_scale() == 65536.0 and scaler._unskipped == 0
    assert scaler._has_overflow is True
    assert scaler._has_overflow is True  # reading it does not clear it
    assert scaler.update_scale() is True
    assert scaler.loss_scale() == 32768.0 and scaler._unskipped == 0
    opt.step()  # the caller decides about the step; nothing was armed
    assert _skip_lines(capsys.readouterr().out) == []
    _backward(model, opt, torch.ones(3))  # the next exit clears the flag
    assert scaler._has_overflow is False


# Static scaler -----------------------------------------------------------------------------------


def test_static_loss_scale_never_skips_and_applies_inf_grads(capsys):
    model, opt = _init("O1", loss_scale=128.0)
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
    assert _scaler().loss_scale() == 128.0
    opt.step()
    assert _skip_lines(capsys.readouterr().out) == []
    assert model.w[0].item() == -INF
    assert model.w[1].item() == 0.5  # 1 - 0.5 * 1


def test_static_scaler_counts_every_exit_and_keeps_its_scale():
    model, opt = _init("O0", loss_scale=128.0)
    for i, x in enumerate([torch.ones(3), torch.tensor([INF, 0.0, 0.0]), torch.ones(3)], 1):
        opt.zero_grad()
        _backward(model, opt, x)
        assert _scaler()._unskipped == i
        assert _scaler().loss_scale() == 128.0


# Dynamic scaler through initialize ---------------------------------------------------------------


@pytest.mark.parametrize(
    "max_loss_scale, start", [(2.0**24, 65536.0), (2.0**20, 65536.0), (1024.0, 1024.0), (2.0**16, 65536.0)]
)
def test_dynamic_scale_starts_at_min_of_max_loss_scale_and_2_to_16(max_loss_scale, start):
    _init("O1", max_loss_scale=max_loss_scale)
    assert _scaler().loss_scale() == start
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": start, "unskipped": 0}


def test_dynamic_scale_floor_cap_and_doubling_sequence(capsys):
    """The sequence Apex's `update_scale()` gives for max=1024, min=256, window 3."""
    model, opt = _init("O1", min_loss_scale=256.0, max_loss_scale=1024.0, verbosity=1)
    _scaler().scale_window = 3
    capsys.readouterr()
    seen = []
    for _ in range(3):
        opt.zero_grad()
        _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
        seen.append((_scaler().loss_scale(), _scaler()._unskipped))
        w_before = model.w.detach().clone()
        opt.step()
        assert torch.equal(model.w.detach(), w_before)  # skipped
    assert seen == [(512.0, 0), (256.0, 0), (256.0, 0)]
    assert _skip_lines(capsys.readouterr().out) == [
        SKIP_MSG.format(0, 512.0),
        SKIP_MSG.format(0, 256.0),
        SKIP_MSG.format(0, 256.0),
    ]
    seen = []
    for _ in range(9):
        opt.zero_grad()
        _backward(model, opt, torch.ones(3))
        seen.append((_scaler().loss_scale(), _scaler()._unskipped))
        w_before = model.w.detach().clone()
        opt.step()
        assert not torch.equal(model.w.detach(), w_before)  # real steps
    assert seen == [
        (256.0, 1),
        (256.0, 2),
        (512.0, 0),
        (512.0, 1),
        (512.0, 2),
        (1024.0, 0),
        (1024.0, 1),
        (1024.0, 2),
        (1024.0, 0),
    ]
    assert _skip_lines(capsys.readouterr().out) == []


@pytest.mark.parametrize("min_loss_scale", [None, 0])
def test_without_a_truthy_min_the_scale_halves_freely(min_loss_scale):
    model, opt = _init("O1", max_loss_scale=4.0, min_loss_scale=min_loss_scale)
    for _ in range(4):
        _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
        opt.step()
    assert _scaler().loss_scale() == 0.25


def test_overflow_skips_exactly_the_next_step_with_apex_message(capsys):
    model, opt = _init("O1", verbosity=1)
    capsys.readouterr()
    _backward(model, opt, torch.tensor([1.0, INF, 1.0]))
    assert _scaler().loss_scale() == 32768.0  # reduced at scale_loss exit
    assert _skip_lines(capsys.readouterr().out) == []  # the message comes with the step
    w0 = model.w.detach().clone()
    assert opt.step() is None
    assert torch.equal(model.w.detach(), w0)
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]
    opt.zero_grad()
    _backward(model, opt, torch.ones(3))
    opt.step()
    assert torch.equal(model.w.detach(), w0 - 0.5)
    assert _skip_lines(capsys.readouterr().out) == []


def test_two_overflowing_passes_before_one_step_skip_only_that_step(capsys):
    model, opt = _init("O1")
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
    assert _scaler().loss_scale() == 16384.0
    w0 = model.w.detach().clone()
    opt.step()
    assert torch.equal(model.w.detach(), w0)
    opt.zero_grad()
    model.w.grad = torch.ones(3)
    opt.step()  # not skipped again
    assert torch.equal(model.w.detach(), w0 - 0.5)


def test_closure_passed_to_a_skipped_step_is_refused_and_the_skip_stays_armed(capsys):
    model, opt = _init("O1", verbosity=1)
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]))
    capsys.readouterr()
    with pytest.raises(
        RuntimeError,
        match="^" + re.escape("Currently, Amp does not support closure use with optimizers.") + "$",
    ):
        opt.step(lambda: 0.0)
    w0 = model.w.detach().clone()
    opt.step()
    assert torch.equal(model.w.detach(), w0)
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]


def test_o1_step_without_overflow_accepts_a_closure():
    model, opt = _init("O1")
    _backward(model, opt, torch.ones(3))
    calls = []
    assert opt.step(lambda: calls.append(1) or 2.5) == 2.5
    assert calls == [1]
    assert torch.equal(model.w.detach(), torch.full((3,), 0.5))


def test_overflow_message_names_the_loss_id_that_overflowed(capsys):
    model, opt = _init("O1", num_losses=2, verbosity=1)
    capsys.readouterr()
    _backward(model, opt, torch.ones(3), loss_id=0)
    _backward(model, opt, torch.tensor([INF, 1.0, 1.0]), loss_id=1)
    opt.step()
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(1, 32768.0)]
    assert _scaler(0).loss_scale() == 65536.0 and _scaler(0)._unskipped == 1


def test_o2_skip_clears_the_master_grads():
    model, opt = _init("O2")
    with amp.scale_loss(model(torch.tensor([INF, 1.0, 1.0])), opt) as scaled:
        scaled.backward()
    masters = opt._amp_stash.all_fp32_from_fp16_params
    assert masters[0].grad is not None  # w's master (the unused param has no grad)
    before = [m.detach().clone() for m in masters]
    opt.step()
    assert all(m.grad is None for m in masters)
    assert all(torch.equal(a, b) for a, b in zip(before, masters))


def test_loss_id_beyond_num_losses_is_an_index_error():
    model, opt = _init("O1", num_losses=2)
    _backward(model, opt, torch.ones(3), loss_id=1)
    with pytest.raises(IndexError):
        with amp.scale_loss(model(torch.ones(3)), opt, loss_id=2):
            pass


def test_disabled_amp_yields_the_raw_loss_object():
    model = Weighted()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = amp.initialize(model, opt, enabled=False, opt_level="O2")
    assert out[0] is model and out[1] is opt
    assert not hasattr(_amp_state, "loss_scalers")
    loss = torch.tensor(1.5, dtype=torch.float16, requires_grad=True)
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled is loss
    assert not hasattr(opt, "_amp_stash")


# Exceptions in the body (docs/differences.md row 5) ----------------------------------------------


def test_exception_in_the_body_restores_pre_block_grads_and_leaves_the_scaler():
    model, opt = _init("O1")
    g_w = torch.tensor([0.25, 0.5, -1.0])
    g_unused = torch.tensor([3.0, 3.0, 3.0])
    model.w.grad = g_w.clone()
    model.unused.grad = g_unused.clone()
    with pytest.raises(ValueError, match="boom"):
        with amp.scale_loss(model(torch.tensor([INF, 1.0, 1.0])), opt) as scaled:
            scaled.backward()
            raise ValueError("boom")
    assert torch.equal(model.w.grad, g_w)
    assert torch.equal(model.unused.grad, g_unused)
    scaler = _scaler()
    assert scaler.loss_scale() == 65536.0 and scaler._unskipped == 0
    assert opt._amp_stash.params_have_scaled_gradients is False
    assert torch.is_autocast_enabled("cpu")  # casts back on
    opt.step()  # nothing armed: applies the restored grads
    assert torch.equal(model.w.detach(), 1.0 - 0.5 * g_w)
    # and the next pass accumulates onto the restored grads
    _backward(model, opt, torch.ones(3))
    assert torch.equal(model.w.grad, g_w + 1.0)


def test_exception_in_the_body_leaves_o2_master_grads_unchanged():
    model, opt = _init("O2")
    _amp_state.loss_scalers[0]._loss_scale = 8.0
    _backward(model, opt, torch.tensor([1.0, 2.0, 3.0]))
    master = opt._amp_stash.all_fp32_from_fp16_params[0]
    before = master.grad.clone()
    with pytest.raises(RuntimeError, match="inner"):
        with amp.scale_loss(model(torch.tensor([5.0, 5.0, 5.0])), opt) as scaled:
            scaled.backward()
            raise RuntimeError("inner")
    assert torch.equal(master.grad, before)
    assert _scaler()._unskipped == 1 and _scaler().loss_scale() == 8.0


# O1 autocast around the body --------------------------------------------------------------------


def test_o1_casts_are_off_inside_the_body_and_back_on_after():
    model, opt = _init("O1")
    assert torch.is_autocast_enabled("cpu")
    with amp.scale_loss(model(torch.ones(3)), opt) as scaled:
        assert not torch.is_autocast_enabled("cpu")
        scaled.backward()
    assert torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("loss_scale", [None, 1.0])  # full path and fast path
def test_o1_autocast_cache_is_cleared_at_scale_loss_exit(loss_scale):
    torch.manual_seed(0)
    model = nn.Linear(2, 2, bias=False)
    model, opt = _init("O1", model=model, loss_scale=loss_scale)
    x = torch.ones(1, 2)
    out = model(x)
    assert out.dtype == torch.float16  # the fp16 weight copy is cached now
    with amp.scale_loss(out.float().sum(), opt) as scaled:
        scaled.backward()
    with torch.no_grad():
        model.weight.fill_(3.0)
    assert torch.equal(model(x), torch.full((1, 2), 6.0, dtype=torch.float16))


# Host syncs per iteration (the engine's bound: at most one, the skip decision) ------------------


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train_iteration(model, opt, overflow=False):
    opt.zero_grad()
    x = torch.linspace(-1, 1, 32).reshape(4, 8)
    loss = F.mse_loss(model(x), torch.zeros(4, 4))
    if overflow:
        loss = loss * INF
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()


def _count(fn):
    counter = CountHostSyncs()
    with counter:
        fn()
    return counter.calls


def test_sync_counter_sees_every_host_sync_method():
    t = torch.tensor([1.5])
    calls = _count(lambda: (t.item(), bool(t), t.tolist(), float(t), int(t), [0, 1][t.long()]))
    assert sorted(calls) == sorted(SYNC_METHODS)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_steady_state_iteration_costs_at_most_one_host_sync(level):
    model, opt = _init(level, model=_mlp(), momentum=0.9)
    _train_iteration(model, opt)
    calls = _count(lambda: _train_iteration(model, opt))
    assert len(calls) <= 1, calls
    assert opt.state  # the momentum step really ran


def test_first_o2_iteration_with_lazy_init_costs_at_most_one_host_sync():
    model, opt = _init("O2", model=_mlp(), momentum=0.9)
    calls = _count(lambda: _train_iteration(model, opt))
    assert len(calls) <= 1, calls
    assert opt._amp_stash.lazy_init_called


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_iteration_with_a_pending_overflow_costs_exactly_one_host_sync(level, capsys):
    model, opt = _init(level, model=_mlp(), momentum=0.9, verbosity=1)
    _train_iteration(model, opt)
    before = [p.detach().clone() for p in model.parameters()]
    capsys.readouterr()
    calls = _count(lambda: _train_iteration(model, opt, overflow=True))
    assert len(calls) == 1, calls
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_o0_iteration_costs_no_host_sync():
    model, opt = _init("O0", model=_mlp(), momentum=0.9)
    _train_iteration(model, opt)
    calls = _count(lambda: _train_iteration(model, opt))
    assert calls == []
