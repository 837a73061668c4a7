"""FusedSGD on fp16/bf16 params on the CPU updates every element, as torch's SGD does.

torch's CPU fused SGD (which the shim's FusedSGD runs elsewhere) leaves a reduced-precision
tensor of 16 or more elements almost unchanged (8 of 1000 elements moved); the shim routes
those params to torch's `sgd` without the fused kernel, bit for bit `torch.optim.SGD` with its
CPU default (what Apex's own FusedSGD test compares with), and within rounding of the update
computed in float64. `wd_after_momentum`, which torch lacks, follows Apex's kernel formula."""

from __future__ import annotations

import pytest
import torch

from amp_shim.optimizers import FusedSGD

SIZES = [15, 16, 1000]
CONFIGS = {
    "plain": dict(lr=0.1),
    "momentum_dampening_decay": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-2),
    "nesterov_decay": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
}
STEPS = 4


def _grads(n: int, steps: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(steps)]


def _start(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype)


def _float64_reference(
    p0, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, wd_after_momentum=False
):
    """The SGD update in float64 (torch's rule; Apex's with wd_after_momentum), no rounding."""
    p, buf = p0.double(), None
    for g in grads:
        inc = g.double()
        if weight_decay and not wd_after_momentum:
            inc = inc + weight_decay * p
        if momentum:
            buf = inc if buf is None else buf * momentum + (1 - dampening) * inc
            inc = inc + momentum * buf if nesterov else buf
        if weight_decay and wd_after_momentum:
            inc = inc + weight_decay * p
        p = p - lr * inc
    return p


def _run(opt_cls, p0, grads, **kwargs):
    param = p0.clone().requires_grad_()
    opt = opt_cls([param], **kwargs)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    return param.detach(), opt, param


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_sgd_on_reduced_precision_cpu_params_is_bit_for_bit_torch_sgd(dtype, n, name):
    kwargs = CONFIGS[name]
    p0, grads = _start(n, dtype), _grads(n, STEPS, dtype)
    got, opt, param = _run(FusedSGD, p0, grads, **kwargs)
    want, ref_opt, ref_param = _run(torch.optim.SGD, p0, grads, **kwargs)
    assert got.dtype == dtype and torch.equal(got, want)
    if kwargs.get("momentum"):
        assert torch.equal(opt.state[param]["momentum_buffer"], ref_opt.state[ref_param]["momentum_buffer"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(CONFIGS) + ["decay_after_momentum"])
def test_fused_sgd_on_reduced_precision_cpu_params_moves_every_element_as_the_float_update(dtype, n, name):
    kwargs = CONFIGS.get(name, dict(lr=0.1, momentum=0.9, weight_decay=1e-2, wd_after_momentum=True))
    p0, grads = _start(n, dtype), _grads(n, STEPS, dtype)
    got, _, _ = _run(FusedSGD, p0, grads, **kwargs)
    want = _float64_reference(p0, grads, **kwargs)
    # a rounding per op and step, relative to the values the update passes through
    ulp = torch.finfo(dtype).eps * (want.abs() + p0.double().abs() + 1.0)
    assert bool(((got.double() - want).abs() <= 2 * STEPS * ulp).all())
    # the upstream defect left >= 16-element tensors nearly unchanged
    moved = want.to(dtype) != p0
    assert moved.sum() > n // 2 and bool((got != p0)[moved].float().mean() > 0.95)


def test_fused_sgd_mixed_group_keeps_fp32_params_bit_for_bit_torch_fused():
    """A group mixing fp32 and fp16 CPU params: the fp32 ones stay on torch's fused kernel."""
    g = torch.Generator().manual_seed(11)
    p32, p16 = torch.randn(40, generator=g), torch.randn(40, generator=g).half()
    a32, a16 = p32.clone().requires_grad_(), p16.clone().requires_grad_()
    shim = FusedSGD([a32, a16], lr=0.1, momentum=0.9)
    grads32, grads16 = _grads(40, 3, torch.float32), _grads(40, 3, torch.float16)
    ref32 = p32.clone().requires_grad_()
    fused = torch.optim.SGD([ref32], lr=0.1, momentum=0.9, fused=True)
    for g32, g16 in zip(grads32, grads16):
        a32.grad, a16.grad, ref32.grad = g32.clone(), g16.clone(), g32.clone()
        shim.step()
        fused.step()
    assert torch.equal(a32.detach(), ref32.detach())
    assert torch.equal(a16.detach(), _run(torch.optim.SGD, p16, grads16, lr=0.1, momentum=0.9)[0])


@pytest.mark.parametrize("overflow", [False, True])
def test_fused_sgd_reduced_precision_cpu_unscales_and_skips_under_grad_scaler(overflow):
    """GradScaler refuses to unscale fp16 grads for torch's own SGD; the reference is torch's
    SGD stepped with the unscaled grad (a power-of-two scale: exactly `direction`)."""
    p0 = _start(64, torch.float16)
    direction = _grads(64, 1, torch.float16)[0]
    if overflow:
        direction[3] = float("inf")
    param = p0.clone().requires_grad_()
    opt = FusedSGD([param], lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((param * direction).sum()).backward()  # param.grad = 1024 * direction
    scaler.step(opt)
    scaler.update()
    if overflow:
        assert torch.equal(param.detach(), p0) and "momentum_buffer" not in opt.state.get(param, {})
        assert scaler.get_scale() == 512.0
    else:
        want, ref_opt, ref_param = _run(torch.optim.SGD, p0, [direction], lr=0.1, momentum=0.9)
        assert torch.equal(param.detach(), want) and not torch.equal(want, p0)
        assert torch.equal(opt.state[param]["momentum_buffer"], ref_opt.state[ref_param]["momentum_buffer"])
        assert scaler.get_scale() == 1024.0
