"""FusedSGD on fp16/bf16 params on the CPU updates every element as Apex's kernel does.

torch's CPU fused SGD (which the shim's FusedSGD runs elsewhere) leaves a reduced-precision
tensor of 16 or more elements almost unchanged; the shim routes those params to Apex's kernel
formula: fp32 arithmetic on the (unscaled) grad, one rounding to the param dtype per step.
The reference below is that formula written out in float32."""
from __future__ import annotations

import pytest
import torch

from amp_shim.optimizers import FusedSGD

SIZES = [15, 16, 1000]
CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum_dampening_decay": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-2),
    "nesterov_decay": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "decay_after_momentum": dict(lr=0.1, momentum=0.9, weight_decay=1e-2, wd_after_momentum=True),
}


def _grads(n: int, steps: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(steps)]


def _apex_kernel_reference(p0, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                           nesterov=False, wd_after_momentum=False, inv_scale=1.0):
    """Apex's multi_tensor_sgd per element, in float32 (`a + k * b` as torch.add with alpha),
    rounding the param and the momentum buffer to their dtype once a step."""
    p, buf = p0.clone(), None
    for g in grads:
        w, inc = p.float(), g.float() * inv_scale
        if weight_decay and not wd_after_momentum:
            inc = torch.add(inc, w, alpha=weight_decay)
        if momentum:
            mom = inc if buf is None else torch.add(buf.float() * momentum, inc, alpha=1 - dampening)
            buf = mom.to(p.dtype)
            inc = torch.add(inc, mom, alpha=momentum) if nesterov else mom
        if weight_decay and wd_after_momentum:
            inc = torch.add(inc, w, alpha=weight_decay)
        p = torch.add(w, inc, alpha=-lr).to(p.dtype)
    return p, buf


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_sgd_updates_every_element_of_reduced_precision_cpu_params_as_apex_kernel(dtype, n, name):
    kwargs = CONFIGS[name]
    p0 = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)
    param = p0.clone().requires_grad_()
    opt = FusedSGD([param], **kwargs)
    grads = _grads(n, 4, dtype)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    want, want_buf = _apex_kernel_reference(p0, grads, **kwargs)
    assert param.dtype == dtype
    assert torch.equal(param.detach(), want)
    if kwargs.get("momentum"):
        assert torch.equal(opt.state[param]["momentum_buffer"], want_buf)
    # the upstream defect left >= 16-element tensors nearly unchanged (8 of 1000 moved)
    assert (want != p0).sum() > n // 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_sgd_reduced_precision_cpu_step_stays_within_rounding_of_torch_foreach_sgd(dtype):
    p0 = torch.randn(1000, generator=torch.Generator().manual_seed(5)).to(dtype)
    a, b = p0.clone().requires_grad_(), p0.clone().requires_grad_()
    shim = FusedSGD([a], lr=0.1, momentum=0.9, weight_decay=1e-2)
    foreach = torch.optim.SGD([b], lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=True)
    for g in _grads(1000, 3, dtype):
        a.grad, b.grad = g.clone(), g.clone()
        shim.step()
        foreach.step()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(a.detach().float(), b.detach().float(), rtol=8 * eps, atol=8 * eps)


def test_fused_sgd_mixed_group_keeps_fp32_params_bit_for_bit_torch_fused():
    """A group mixing fp32 and fp16 CPU params: fp32 ones stay on torch's fused kernel."""
    g = torch.Generator().manual_seed(11)
    p32, p16 = torch.randn(40, generator=g), torch.randn(40, generator=g).half()
    a32, a16 = p32.clone().requires_grad_(), p16.clone().requires_grad_()
    ref32 = p32.clone().requires_grad_()
    shim = FusedSGD([a32, a16], lr=0.1, momentum=0.9)
    torch_fused = torch.optim.SGD([ref32], lr=0.1, momentum=0.9, fused=True)
    grads32, grads16 = _grads(40, 3, torch.float32), _grads(40, 3, torch.float16)
    for g32, g16 in zip(grads32, grads16):
        a32.grad, a16.grad, ref32.grad = g32.clone(), g16.clone(), g32.clone()
        shim.step()
        torch_fused.step()
    assert torch.equal(a32.detach(), ref32.detach())
    assert torch.equal(a16.detach(), _apex_kernel_reference(p16, grads16, lr=0.1, momentum=0.9)[0])


@pytest.mark.parametrize("overflow", [False, True])
def test_fused_sgd_reduced_precision_cpu_unscales_and_skips_under_grad_scaler(overflow):
    p0 = torch.randn(64, generator=torch.Generator().manual_seed(9)).half()
    param = p0.clone().requires_grad_()
    opt = FusedSGD([param], lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    grad = _grads(64, 1, torch.float16)[0]
    if overflow:
        grad[3] = float("inf")
    scaler.scale((param * grad).sum()).backward()  # param.grad = 1024 * grad, in fp16
    scaler.step(opt)
    scaler.update()
    if overflow:
        assert torch.equal(param.detach(), p0) and "momentum_buffer" not in opt.state.get(param, {})
        assert scaler.get_scale() == 512.0
    else:
        want, _ = _apex_kernel_reference(p0, [grad], lr=0.1, momentum=0.9)
        assert torch.equal(param.detach(), want)
