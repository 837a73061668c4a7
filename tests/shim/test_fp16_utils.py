"""`apex.fp16_utils`: FP16_Optimizer trains a half model on CPU with Apex's
messages, skip rule and checkpoint format; the helpers and the legacy scalers behave as Apex's."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_shim._deprecation import DeprecatedFeatureWarning
from amp_shim.amp.scaler import LossScaler as AmpLossScaler
from amp_shim.fp16_utils import (
    BN_convert_float,
    DynamicLossScaler,
    FP16_Optimizer,
    FP16Model,
    LossScaler,
    clip_grad_norm,
    convert_module,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
    tofp16,
)
from forked_runs import launch

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "fixtures" / "programs" / "fp16_optimizer_legacy.py"
DEPRECATION_PRINT = (
    "Warning:  FP16_Optimizer is deprecated and dangerous, and will be deleted soon.  If it still "
    "works, you're probably getting lucky.  For mixed precision, use the documented API "
    "https://nvidia.github.io/apex/amp.html, with opt_level=O1."
)
X = torch.linspace(-1.0, 1.0, 16 * 6).reshape(16, 6)
Y = torch.linspace(0.5, -0.5, 16 * 2).reshape(16, 2)


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _wrapped(seed=0, lr=0.1, momentum=0.9, **kwargs):
    model = network_to_half(_net(seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    kwargs.setdefault("verbose", False)
    return model, FP16_Optimizer(opt, **kwargs)


def _iteration(model, opt, x=X, y=Y, scale_loss_by=1.0):
    opt.zero_grad()
    loss = F.mse_loss(model(x).float(), y) * scale_loss_by
    opt.backward(loss)
    opt.step()
    return loss


def _fp16_params(model):
    return [p for p in model.parameters() if p.dtype == torch.float16]


# Construction ------------------------------------------------------------------------------------
def test_constructor_prints_apex_deprecation_text_and_emits_deprecated_feature_warning(capsys):
    with pytest.warns(DeprecatedFeatureWarning, match="apex.fp16_utils is deprecated"):
        _wrapped()
    assert capsys.readouterr().out.splitlines()[0] == DEPRECATION_PRINT


def test_verbose_prints_one_line_per_group_and_per_param(capsys):
    model = network_to_half(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)))
    FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    out = capsys.readouterr().out.splitlines()[1:]
    assert out == [
        "FP16_Optimizer processing param group 0:",
        "FP16_Optimizer received torch.HalfTensor with torch.Size([2, 3])",
        "FP16_Optimizer received torch.HalfTensor with torch.Size([2])",
        "FP16_Optimizer received torch.FloatTensor with torch.Size([2])",
        "FP16_Optimizer received torch.FloatTensor with torch.Size([2])",
    ]


def test_masters_are_eager_fp32_copies_swapped_into_the_groups_with_the_state_moved():
    model = network_to_half(_net())
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fc1 = model[1][0].weight
    inner.state[fc1]["momentum_buffer"] = torch.ones_like(fc1)
    opt = FP16_Optimizer(inner, verbose=False)
    masters = opt.fp32_from_fp16_groups[0]
    assert [m.dtype for m in masters] == [torch.float32] * 4
    assert all(m.requires_grad and m.is_leaf for m in masters)
    assert torch.equal(masters[0], fc1.float())
    group = opt.param_groups[0]["params"]
    assert group[0] is masters[0] and not any(p is fc1 for p in group)
    # affine BatchNorm params stay fp32 and are stepped directly
    assert [p.dtype for p in opt.fp32_from_fp32_groups[0]] == [torch.float32] * 2
    # the momentum buffer followed the master and was recast to fp32
    assert opt.state[masters[0]]["momentum_buffer"].dtype == torch.float32
    assert fc1 not in opt.state


def test_rejects_params_other_than_float_and_half_with_apex_message():
    model = nn.Linear(2, 2).double()
    with pytest.raises(
        TypeError,
        match=re.escape(
            "Wrapped parameters must be either torch.cuda.FloatTensor or torch.cuda.HalfTensor. "
            "Received torch.DoubleTensor"
        ),
    ):
        FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)


def test_uses_amp_loss_scaler_static_by_default_and_dynamic_with_dynamic_loss_args():
    _, static = _wrapped()
    assert isinstance(static.loss_scaler, AmpLossScaler) and not static.loss_scaler.dynamic
    assert static.loss_scale == 1.0 and static.dynamic_loss_scale is False
    _, dynamic = _wrapped(dynamic_loss_scale=True)
    assert dynamic.loss_scale == 2.0**16 and dynamic.loss_scaler.scale_window == 2000
    _, custom = _wrapped(
        dynamic_loss_scale=True,
        static_loss_scale=4.0,
        dynamic_loss_args={"init_scale": 2**8, "scale_window": 3, "scale_factor": 10.0},
    )
    assert custom.loss_scale == 256.0  # dynamic overrides static; scale_factor is ignored (x2)
    m, opt = _wrapped(dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 2**8, "scale_window": 3})
    for _ in range(3):
        _iteration(m, opt)
    assert opt.loss_scale == 512.0


# Training ----------------------------------------------------------------------------------------
def _manual_reference(steps, scale):
    """The 2018 recipe by hand: fp16 model, fp32 masters, scaled backward, unscale, step, copy."""
    model = network_to_half(_net())
    model_params, masters = prep_param_lists(model)
    opt = torch.optim.SGD(masters, lr=0.1, momentum=0.9)
    for _ in range(steps):
        model.zero_grad()
        loss = F.mse_loss(model(X).float(), Y)
        (loss.float() * scale).backward()
        model_grads_to_master_grads(model_params, masters)
        for m in masters:
            m.grad.mul_(1.0 / scale)
        opt.step()
        master_params_to_model_params(model_params, masters)
    return model


@pytest.mark.parametrize("scale", [1.0, 128.0])
def test_static_scale_trains_the_half_model_exactly_as_the_manual_master_weight_recipe(scale):
    model, opt = _wrapped(static_loss_scale=scale)
    losses = [_iteration(model, opt).item() for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]
    reference = _manual_reference(8, scale)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert all(p.dtype == torch.float16 for p in _fp16_params(model))


def test_dynamic_scale_skips_overflowing_steps_with_apex_message_and_halves_the_scale(capsys):
    model, opt = _wrapped(dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 2.0**20})
    before = [p.detach().clone() for p in model.parameters()]
    _iteration(model, opt, scale_loss_by=1e3)  # fp16 grads overflow at this scale
    assert opt.overflow is True
    assert "Gradient overflow.  Skipping step, reducing loss scale to 524288.0" in capsys.readouterr().out
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert opt.clip_master_grads(1.0) == -1
    assert opt.inspect_master_grad_data() is None
    for _ in range(30):
        _iteration(model, opt)
    assert opt.overflow is False
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_static_scale_never_skips_even_when_grads_overflow(capsys):
    model, opt = _wrapped(static_loss_scale=2.0**20)
    _iteration(model, opt, scale_loss_by=1e3)
    assert opt.overflow is False and opt.loss_scale == 2.0**20
    assert "Gradient overflow" not in capsys.readouterr().out


def test_overflow_message_follows_amp_verbosity(capsys):
    from amp_shim.amp._amp_state import _amp_state

    _amp_state.verbosity = 0
    model, opt = _wrapped(dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 2.0**20})
    _iteration(model, opt, scale_loss_by=1e3)
    assert opt.overflow and "Gradient overflow" not in capsys.readouterr().out


def test_backward_without_update_then_update_master_grads_accumulates_two_losses():
    model, opt = _wrapped(static_loss_scale=8.0)
    ref_model, ref = _wrapped(static_loss_scale=8.0)
    opt.zero_grad()
    opt.backward(F.mse_loss(model(X).float(), Y), update_master_grads=False)
    opt.backward(F.mse_loss(model(X * 0.5).float(), Y), update_master_grads=False)
    opt.update_master_grads()
    ref.zero_grad()
    out = ref_model(X).float()
    loss = F.mse_loss(out, Y) + F.mse_loss(ref_model(X * 0.5).float(), Y)
    ref.backward(loss)
    for a, b in zip(opt.inspect_master_grad_data()[0], ref.inspect_master_grad_data()[0]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_clip_master_grads_clips_the_fp32_params_and_returns_the_total_norm():
    model, opt = _wrapped(static_loss_scale=16.0)
    opt.zero_grad()
    opt.backward(F.mse_loss(model(X).float(), Y) * 100)
    grads = [p.grad.clone() for g in opt.param_groups for p in g["params"]]
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    norm = opt.clip_master_grads(0.5)
    torch.testing.assert_close(norm, expected)
    after = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for g in opt.param_groups for p in g["params"]])
    )
    torch.testing.assert_close(after, torch.tensor(0.5), rtol=1e-4, atol=0)


def test_zero_grad_zeroes_or_sets_to_none_masters_and_fp16_model_grads():
    model, opt = _wrapped()
    opt.zero_grad()
    opt.backward(F.mse_loss(model(X).float(), Y))
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    assert all(m.grad is not None and not m.grad.any() for m in opt.fp32_from_fp16_groups[0])
    opt.zero_grad(set_grads_to_None=True)
    assert all(p.grad is None for p in model.parameters())
    assert all(m.grad is None for m in opt.fp32_from_fp16_groups[0])


def test_step_with_closure_refreshes_the_model_and_returns_the_loss():
    model, opt = _wrapped(static_loss_scale=4.0)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(X).float(), Y)
        opt.backward(loss)
        return loss

    first = opt.step(closure)
    second = opt.step(closure)
    assert second.item() < first.item()
    assert torch.equal(model[1][0].weight, opt.fp32_from_fp16_groups[0][0].half())
    assert opt.first_closure_call_this_step is True


def test_loss_scale_state_and_param_groups_are_proxied():
    model, opt = _wrapped(static_loss_scale=4.0)
    opt.loss_scale = 32.0
    assert opt.loss_scale == 32.0 and opt.loss_scaler.loss_scale() == 32.0
    assert opt.param_groups is opt.optimizer.param_groups and opt.state is opt.optimizer.state
    opt.param_groups[0]["lr"] = 0.01  # as lr schedules do
    assert opt.optimizer.param_groups[0]["lr"] == 0.01


# Checkpoints -------------------------------------------------------------------------------------
def test_pickling_the_wrapper_is_refused_as_in_apex():
    _, opt = _wrapped()
    with pytest.raises(RuntimeError, match=r"^FP16_Optimizer should be serialized using state_dict\(\)\.$"):
        pickle.dumps(opt)
    with pytest.raises(RuntimeError, match="deserialized using load_state_dict"):
        opt.__setstate__({})


def test_state_dict_has_apex_keys_with_the_loss_scaler_object_and_the_fp32_masters():
    _, opt = _wrapped(dynamic_loss_scale=True)
    sd = opt.state_dict()
    assert set(sd) == {
        "loss_scaler",
        "dynamic_loss_scale",
        "overflow",
        "first_closure_call_this_step",
        "optimizer_state_dict",
        "fp32_from_fp16",
    }
    assert sd["loss_scaler"] is opt.loss_scaler
    assert sd["dynamic_loss_scale"] is True and sd["overflow"] is False
    assert sd["fp32_from_fp16"] is opt.fp32_from_fp16_groups
    assert sd["optimizer_state_dict"].keys() == {"state", "param_groups"}


@pytest.mark.parametrize("dynamic", [False, True])
def test_state_dict_round_trips_through_torch_save_and_resumes_bit_for_bit(dynamic):
    kwargs = dict(
        dynamic_loss_scale=dynamic,
        static_loss_scale=64.0,
        dynamic_loss_args={"init_scale": 2.0**10, "scale_window": 3},
    )
    model, opt = _wrapped(**kwargs)
    for _ in range(4):
        _iteration(model, opt)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    for _ in range(4):
        _iteration(model, opt)

    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    resumed, ropt = _wrapped(seed=5, **kwargs)
    resumed.load_state_dict(ckpt["model"])
    ropt.load_state_dict(ckpt["optimizer"])
    for _ in range(4):
        _iteration(resumed, ropt)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    assert ropt.loss_scale == opt.loss_scale
    assert ropt.loss_scaler.unskipped_count() == opt.loss_scaler.unskipped_count()


def test_loads_a_checkpoint_whose_loss_scaler_was_pickled_by_apex():
    """Unpickled through the alias, Apex's LossScaler lands in the shim's class with Apex's
    plain attributes; the optimizer rebuilds a working scaler from them."""
    model, opt = _wrapped(dynamic_loss_scale=True)
    apex_scaler = object.__new__(AmpLossScaler)
    apex_scaler.__dict__.update(
        {
            "_loss_scale": 1024.0,
            "dynamic": True,
            "_max_loss_scale": 2.0**24,
            "_min_loss_scale": None,
            "_scale_seq_len": 2000,
            "_unskipped": 7,
            "_has_overflow": False,
            "_overflow_buf": torch.zeros(1, dtype=torch.int32),
        }
    )
    sd = opt.state_dict()
    sd["loss_scaler"] = apex_scaler
    opt.load_state_dict(sd)
    assert opt.loss_scale == 1024.0 and opt.loss_scaler.unskipped_count() == 7
    _iteration(model, opt)
    assert opt.loss_scaler.unskipped_count() == 8


# Helpers (§9.2) ----------------------------------------------------------------------------------
def test_network_to_half_prefixes_keys_with_1_and_keeps_affine_batchnorm_fp32():
    net = network_to_half(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.BatchNorm1d(3, affine=False)))
    assert isinstance(net[0], tofp16)
    assert all(k.startswith("1.") for k in net.state_dict())
    assert net[1][0].weight.dtype == torch.float16
    assert net[1][1].weight.dtype == torch.float32 and net[1][1].running_mean.dtype == torch.float32
    assert net[1][2].running_mean.dtype == torch.float16
    assert net(torch.randn(4, 2)).dtype == torch.float16


def test_fp16model_casts_positional_inputs_prefixes_keys_with_network_and_warns():
    with pytest.warns(DeprecatedFeatureWarning):
        model = FP16Model(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)))
    assert all(k.startswith("network.") for k in model.state_dict())
    assert model.network[0].weight.dtype == torch.float16
    assert model.network[1].weight.dtype == torch.float32
    assert model(torch.randn(4, 2)).dtype == torch.float16


def test_bn_convert_float_only_touches_affine_batchnorm_and_returns_the_module():
    net = nn.Sequential(
        nn.Linear(2, 2), nn.Sequential(nn.BatchNorm2d(2)), nn.BatchNorm1d(2, affine=False)
    ).half()
    assert BN_convert_float(net) is net
    assert net[0].weight.dtype == torch.float16
    assert net[1][0].weight.dtype == torch.float32
    assert net[2].running_mean.dtype == torch.float16


def test_convert_module_casts_own_params_grads_and_buffers_only():
    net = nn.Sequential(nn.BatchNorm1d(2))
    net[0].weight.grad = torch.ones(2)
    convert_module(net, torch.float16)  # the container has no params of its own
    assert net[0].weight.dtype == torch.float32
    convert_module(net[0], torch.float16)
    assert net[0].weight.dtype == torch.float16 and net[0].weight.grad.dtype == torch.float16
    assert net[0].running_var.dtype == torch.float16 and net[0].num_batches_tracked.dtype == torch.int64


def test_convert_network_skips_affine_batchnorm_and_handles_rnns():
    net = convert_network(nn.ModuleDict({"lstm": nn.LSTM(3, 4), "bn": nn.BatchNorm1d(4)}), torch.float16)
    assert net["lstm"].weight_ih_l0.dtype == torch.float16 and net["bn"].weight.dtype == torch.float32
    out, _ = net["lstm"](torch.randn(5, 2, 3, dtype=torch.float16))
    assert out.dtype == torch.float16


def test_prep_param_lists_makes_detached_fp32_masters_of_trainable_params():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).half()
    model[1].bias.requires_grad = False
    model_params, masters = prep_param_lists(model)
    assert len(model_params) == 3 and len(masters) == 3
    assert all(m.dtype == torch.float32 and m.requires_grad and m.is_leaf for m in masters)
    assert all(torch.equal(m, p.float()) for m, p in zip(masters, model_params))


def test_flat_master_is_one_fp32_parameter_with_a_grad_and_round_trips():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).half()
    model_params, (flat,) = prep_param_lists(model, flat_master=True)
    assert isinstance(flat, nn.Parameter) and flat.dtype == torch.float32
    assert flat.numel() == sum(p.numel() for p in model_params) and flat.grad.shape == flat.shape
    for p in model_params:
        p.grad = torch.full_like(p, 0.5)
    model_grads_to_master_grads(model_params, [flat], flat_master=True)
    assert torch.equal(flat.grad, torch.full_like(flat, 0.5))
    flat.data.fill_(0.25)
    master_params_to_model_params(model_params, [flat], flat_master=True)
    assert all(torch.equal(p, torch.full_like(p, 0.25)) for p in model_params)


def test_model_grads_to_master_grads_copies_and_clears_missing_grads():
    model = nn.Linear(3, 2).half()
    model_params, masters = prep_param_lists(model)
    model.weight.grad = torch.full_like(model.weight, 3.0)
    masters[1].grad = torch.ones(2)
    model_grads_to_master_grads(model_params, masters)
    assert masters[0].grad.dtype == torch.float32 and torch.equal(masters[0].grad, torch.full((2, 3), 3.0))
    assert masters[1].grad is None
    masters[0].data.fill_(1.5)
    master_params_to_model_params(model_params, masters)
    assert torch.equal(model.weight, torch.full_like(model.weight, 1.5))


def test_to_python_float_and_clip_grad_norm_are_apex_aliases():
    assert to_python_float(torch.tensor([2.5])) == 2.5
    assert to_python_float([4.0]) == 4.0  # no .item(): indexes
    assert clip_grad_norm is torch.nn.utils.clip_grad_norm_


def test_star_import_exports_apex_names():
    namespace = {}
    exec("from amp_shim.fp16_utils import *", namespace)
    assert {
        "BN_convert_float",
        "network_to_half",
        "prep_param_lists",
        "model_grads_to_master_grads",
        "master_params_to_model_params",
        "tofp16",
        "to_python_float",
        "clip_grad_norm",
        "convert_module",
        "convert_network",
        "FP16Model",
        "FP16_Optimizer",
        "LossScaler",
        "DynamicLossScaler",
    } <= set(namespace)


# Legacy scalers (§9.3) ---------------------------------------------------------------------------
def test_legacy_static_loss_scaler_scales_backward_never_overflows_and_warns():
    with pytest.warns(DeprecatedFeatureWarning):
        scaler = LossScaler(8)
    w = torch.ones(2, requires_grad=True)
    scaler.backward((w * 3).sum())
    assert torch.equal(w.grad, torch.full((2,), 24.0))
    assert scaler.loss_scale == 8 and scaler.has_overflow([w]) is False
    scaler.update_scale(True)
    assert scaler.loss_scale == 8
    assert scaler.scale_gradient(None, (torch.ones(1),), None)[0].item() == 8.0


def test_legacy_dynamic_loss_scaler_follows_apex_arithmetic_with_floor_of_one():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedFeatureWarning)  # no warning from this one
        scaler = DynamicLossScaler()
    assert (scaler.loss_scale, scaler.scale_factor, scaler.scale_window) == (2**32, 2.0, 1000)
    scaler = DynamicLossScaler(init_scale=4, scale_factor=2.0, scale_window=2)
    seq = []
    for overflow in [False, True, False, False, False, True, True, True, True]:
        scaler.update_scale(overflow)
        seq.append(scaler.loss_scale)
    # iter 0: (0-(-1))%2 != 0; overflow halves; growth every 2 clean iters after an overflow
    assert seq == [4, 2.0, 2.0, 4.0, 4.0, 2.0, 1, 1, 1]
    assert scaler.cur_iter == 9 and scaler.last_overflow_iter == 8


def test_legacy_dynamic_loss_scaler_detects_inf_and_nan_grads():
    scaler = DynamicLossScaler()
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    a.grad = torch.ones(2)
    assert scaler.has_overflow([a, b]) is False
    b.grad = torch.tensor([1.0, float("nan")])
    assert scaler.has_overflow([a, b]) is True
    assert DynamicLossScaler._has_inf_or_nan(torch.tensor([float("inf")], dtype=torch.float16)) is True


# The legacy program ------------------------------------------------------------------------------
def _run_legacy(tmp_path, *args) -> subprocess.CompletedProcess:
    """`python -m amp_shim LEGACY ARGS`, forked from a fork server that already imported torch
    (tests/forked_runs.py: what a fresh interpreter would record)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = [str(LEGACY), *map(str, args)]
    rc, stdout, stderr = launch(argv, shim=True, env=env, cwd=tmp_path, timeout=120)
    return subprocess.CompletedProcess(["python", "-m", "amp_shim", *argv], rc, stdout, stderr)


def _losses(stdout):
    return [float(v) for v in re.findall(r"loss (\d+\.\d+)", stdout)]


@pytest.mark.slow
def test_legacy_fp16_optimizer_script_runs_unchanged_and_the_loss_falls(tmp_path):
    proc = _run_legacy(tmp_path, "--steps", "40")
    assert proc.returncode == 0, proc.stderr
    assert "running with the Apex-compatible shim" in proc.stderr
    assert DEPRECATION_PRINT in proc.stdout
    losses = _losses(proc.stdout)
    assert len(losses) == 5 and losses[-1] < 0.1 * losses[0]
    assert "final loss scale 128.0" in proc.stdout


@pytest.mark.slow
def test_legacy_script_with_dynamic_scaling_skips_overflows_and_saves_a_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    proc = _run_legacy(
        tmp_path, "--steps", "40", "--dynamic-loss-scale", "--init-scale", "1e9", "--checkpoint", str(ckpt)
    )
    assert proc.returncode == 0, proc.stderr
    # init 1e9 is capped at max_loss_scale 2**24 and halved on each overflow
    assert "Gradient overflow.  Skipping step, reducing loss scale to 8388608.0" in proc.stdout
    losses = _losses(proc.stdout)
    assert losses[-1] < 0.1 * losses[0]
    saved = torch.load(ckpt, weights_only=False)
    assert set(saved["optimizer"]) >= {"loss_scaler", "fp32_from_fp16", "optimizer_state_dict"}
    assert all(k.startswith("1.") for k in saved["model"])
