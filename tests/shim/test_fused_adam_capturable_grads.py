"""The grads capturable FusedAdam leaves behind: Apex's `multi_tensor_adam_capturable` kernels
(plain and master-weights variant) write the grad they used back into `p.grad`: the grad
unscaled by the GradScaler's scale, plus `weight_decay * p` in L2 mode (adam_w_mode=False),
rounded to the grad's dtype; after an overflow the kernel returns at once, so the scaled grad
stays. Apex's own test (test_adam.py, testGradScalerCapturableMaster) compares these grads with
torch.optim.Adam's, which GradScaler unscales in place."""

from __future__ import annotations

import warnings

import pytest
import torch

from amp_shim.optimizers import FusedAdam

SCALE = 2.0**11


def _params(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in [(7, 5), (40,), (3,)]]


def _directions(params, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in params]


def _scaled_backward(params, dirs, scaler, overflow=False):
    for p in params:
        p.grad = None
    loss = sum((p * d).sum() for p, d in zip(params, dirs)) * (float("inf") if overflow else 1.0)
    scaler.scale(loss).backward()


def _step(opt, scaler):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("master_weights", [True, False])
def test_capturable_fused_adam_leaves_the_unscaled_grad_in_p_grad(dtype, master_weights):
    params = _params(dtype)
    opt = FusedAdam(params, lr=1e-3, weight_decay=0.1, capturable=True, master_weights=master_weights)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    for i in range(3):
        dirs = _directions(params, i)
        _scaled_backward(params, dirs, scaler)
        scaled = [p.grad.clone() for p in params]
        _step(opt, scaler)
        for p, s, d in zip(params, scaled, dirs):
            assert not torch.equal(s, d)  # the backward left them scaled
            want = (s.float() / SCALE).to(dtype)  # Apex: static_cast<T>(g * inv_scale)
            assert torch.equal(p.grad, want), (p.grad - want).abs().max()
            assert torch.equal(p.grad, d)  # a power-of-two scale: exactly the loss's gradient


def test_capturable_master_weights_grads_match_torch_adam_under_grad_scaler_as_apex_test_compares():
    """The issue's case: fp16 params, masters in fp32; the reference is torch.optim.Adam on fp32
    copies, whose grads GradScaler unscales in place (2.0, not 4096.0)."""
    half = [torch.full((16,), 0.5, dtype=torch.float16, requires_grad=True)]
    ref = [half[0].detach().float().requires_grad_()]
    opt = FusedAdam(half, lr=1e-3, capturable=True, master_weights=True)
    torch_opt = torch.optim.Adam(ref, lr=1e-3)
    s1, s2 = torch.amp.GradScaler("cpu", init_scale=2048.0), torch.amp.GradScaler("cpu", init_scale=2048.0)
    s1.scale((half[0] * 2.0).sum()).backward()
    s2.scale((ref[0] * 2.0).sum()).backward()
    assert float(half[0].grad[0]) == 4096.0
    _step(opt, s1)
    _step(torch_opt, s2)
    assert torch.equal(half[0].grad.float(), ref[0].grad) and float(ref[0].grad[0]) == 2.0
    torch.testing.assert_close(half[0].float(), ref[0].detach(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("master_weights", [True, False])
def test_capturable_fused_adam_in_l2_mode_writes_back_grad_plus_decay_times_pre_step_weight(master_weights):
    dtype = torch.float16
    params = _params(dtype)
    opt = FusedAdam(
        params, lr=1e-3, weight_decay=0.1, adam_w_mode=False, capturable=True, master_weights=master_weights
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    for i in range(3):
        weights = (
            [m.clone() for m in opt.param_groups_master[0]]
            if master_weights
            else [p.detach().float() for p in params]
        )
        _scaled_backward(params, _directions(params, i), scaler)
        scaled = [p.grad.clone() for p in params]
        _step(opt, scaler)
        for p, s, w in zip(params, scaled, weights):
            want = (s.float() / SCALE + 0.1 * w).to(dtype)
            torch.testing.assert_close(p.grad, want, rtol=0, atol=0)


@pytest.mark.parametrize("master_weights", [True, False])
def test_capturable_fused_adam_after_an_overflow_leaves_the_scaled_grads_and_params(master_weights):
    params = _params(torch.float16)
    opt = FusedAdam(params, lr=1e-3, capturable=True, master_weights=master_weights)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    _scaled_backward(params, _directions(params, 0), scaler)
    _step(opt, scaler)
    before = [p.detach().clone() for p in params]
    _scaled_backward(params, _directions(params, 1), scaler, overflow=True)
    scaled = [p.grad.clone() for p in params]
    _step(opt, scaler)
    for p, s, b in zip(params, scaled, before):
        assert not p.grad.isfinite().all()
        torch.testing.assert_close(p.grad, s, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(p.detach(), b)
    assert scaler.get_scale() == SCALE / 2
