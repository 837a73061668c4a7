"""Acceptance: a loop written against the shim at O1 is torch's native autocast + GradScaler
recipe, step for step and bit for bit (CPU, float16)."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import amp


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def batches(n, blow_up_at=()):
    gen = torch.Generator().manual_seed(1)
    for i in range(n):
        x = torch.randn(8, 16, generator=gen)
        if i in blow_up_at:
            x = x * 3e4  # overflows the fp16 forward: inf loss, inf grads
        yield x, torch.randn(8, 4, generator=gen)


def run_native(model, opt, data, clip=None, growth_interval=2000, dtype=torch.float16):
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    losses, scales = [], []
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach().clone())
        scales.append(scaler.get_scale())
    return losses, scales


def run_shim(model, opt, data, clip=None, growth_interval=2000):
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    amp._amp_state.loss_scalers[0].scale_window = growth_interval
    losses, scales = [], []
    for x, y in data:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(amp.master_params(opt), clip)
        opt.step()
        losses.append(loss.detach().clone())
        scales.append(amp._amp_state.loss_scalers[0].loss_scale())
    return losses, scales


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_o1_matches_autocast_and_grad_scaler_exactly(optimizer, clip):
    ref_model = make_model()
    shim_model = copy.deepcopy(ref_model)

    def make_opt(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.Adam(params, lr=1e-3)

    blow_up = {0, 5, 6, 17}
    ref_losses, ref_scales = run_native(
        ref_model, make_opt(ref_model.parameters()), batches(40, blow_up), clip, growth_interval=7
    )
    shim_losses, shim_scales = run_shim(
        shim_model, make_opt(shim_model.parameters()), batches(40, blow_up), clip, growth_interval=7
    )

    assert [loss.dtype for loss in shim_losses] == [loss.dtype for loss in ref_losses]
    for i, (a, b) in enumerate(zip(shim_losses, ref_losses)):
        assert torch.equal(a, b) or (a.isnan() and b.isnan()) or (a.isinf() and b.isinf()), i
    assert shim_scales == ref_scales
    pairs = list(zip(ref_scales, ref_scales[1:]))
    assert any(b < a for a, b in pairs) and any(b > a for a, b in pairs)  # backoff and growth
    for p, q in zip(shim_model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def test_o1_with_amp_shim_dtype_bfloat16_matches_the_bfloat16_recipe(monkeypatch):
    monkeypatch.setenv("AMP_SHIM_DTYPE", "bfloat16")
    ref_model = make_model()
    shim_model = copy.deepcopy(ref_model)
    ref_losses, ref_scales = run_native(
        ref_model, torch.optim.SGD(ref_model.parameters(), lr=0.05), batches(12), dtype=torch.bfloat16
    )
    shim_losses, shim_scales = run_shim(
        shim_model, torch.optim.SGD(shim_model.parameters(), lr=0.05), batches(12)
    )
    assert all(torch.equal(a, b) for a, b in zip(shim_losses, ref_losses))
    assert shim_scales == ref_scales
    assert all(torch.equal(p, q) for p, q in zip(shim_model.parameters(), ref_model.parameters()))
    assert shim_model(torch.randn(2, 16)).dtype == torch.bfloat16


def test_o1_forward_runs_in_float16_and_loss_in_float32():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    out = model(torch.randn(2, 16))
    assert out.dtype == torch.float16
    assert F.mse_loss(out, torch.zeros(2, 4)).dtype == torch.float32


def test_o1_forward_autocasts_in_another_thread():
    import threading

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    seen = {}

    def worker():
        seen["dtype"] = model(torch.randn(2, 16)).dtype
        seen["after"] = torch.is_autocast_enabled("cpu")

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"dtype": torch.float16, "after": False}


def test_o1_casts_are_off_inside_scale_loss_and_step():
    seen = []

    class SpySGD(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(("step", torch.is_autocast_enabled("cpu")))
            return super().step(closure)

    model = make_model()
    model, opt = amp.initialize(model, SpySGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    loss = F.mse_loss(model(torch.randn(2, 16)), torch.zeros(2, 4))
    with amp.scale_loss(loss, opt) as scaled:
        seen.append(("body", torch.is_autocast_enabled("cpu")))
        scaled.backward()
    seen.append(("after", torch.is_autocast_enabled("cpu")))
    opt.step()
    assert seen == [("body", False), ("after", True), ("step", False)]


def test_disable_casts_restores_casts_after_an_exception():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    with pytest.raises(ValueError):
        with amp.disable_casts():
            assert model(torch.randn(2, 16)).dtype == torch.float32
            raise ValueError
    assert model(torch.randn(2, 16)).dtype == torch.float16
