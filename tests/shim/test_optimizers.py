"""`apex.optimizers`: FusedAdam, FusedSGD and FusedAdagrad step bit for bit as
the torch.optim optimizer with `fused=True` that the codemod migrates them to; FusedLAMB and
FusedNovoGrad follow their published update rules (references written out below); state
dicts keep Apex's format and load torch's where it can be continued."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch

from amp_shim.optimizers import (
    FusedAdagrad,
    FusedAdam,
    FusedLAMB,
    FusedMixedPrecisionLamb,
    FusedNovoGrad,
    FusedSGD,
)

SHAPES = [(7, 5), (3,), (2, 3, 4)]


def _params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in SHAPES]


def _set_grads(params, i, scale=1.0):
    g = torch.Generator().manual_seed(1000 + i)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(p.dtype)


def _train(make, steps=6, dtype=torch.float32, start=0, params=None, opt=None, grad_scale=1.0):
    params = _params(dtype) if params is None else params
    opt = make(params) if opt is None else opt
    for i in range(start, start + steps):
        _set_grads(params, i, grad_scale)
        opt.step()
    return params, opt


def _assert_bitwise(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y), (x - y).abs().max()


def _close(a, b, atol=1e-6):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.float(), y.float(), rtol=0, atol=atol)


# Exact match with torch.optim (fused=True) -------------------------------------------------------
EXACT = {
    "adam_defaults_are_adamw_without_decay": (
        lambda p: FusedAdam(p),
        lambda p: torch.optim.AdamW(p, weight_decay=0.0, fused=True),
    ),
    "adamw_weight_decay": (
        lambda p: FusedAdam(p, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, fused=True),
    ),
    "adam_l2_mode": (
        lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1, adam_w_mode=False),
        lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, fused=True),
    ),
    "sgd_plain": (lambda p: FusedSGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1, fused=True)),
    "sgd_momentum_dampening_decay": (
        lambda p: FusedSGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-2),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-2, fused=True),
    ),
    "sgd_nesterov": (
        lambda p: FusedSGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2, fused=True),
    ),
    "adagrad_defaults": (lambda p: FusedAdagrad(p), lambda p: torch.optim.Adagrad(p, fused=True)),
    "adagrad_decay_eps": (
        lambda p: FusedAdagrad(p, lr=0.05, eps=1e-6, weight_decay=0.1),
        lambda p: torch.optim.Adagrad(p, lr=0.05, eps=1e-6, weight_decay=0.1, fused=True),
    ),
}


# torch's CPU fused SGD does not update fp16 tensors of 16+ elements; the shim's FusedSGD runs
# Apex's kernel formula for them instead (tests/shim/test_fused_sgd_reduced_precision_cpu.py).
EXACT_CASES = [
    (case, dtype)
    for case in sorted(EXACT)
    for dtype in (torch.float32, torch.float16)
    if not (case.startswith("sgd") and dtype == torch.float16)
]


@pytest.mark.parametrize(
    "case,dtype",
    EXACT_CASES,
    ids=["{}-{}".format(c, "fp32" if d == torch.float32 else "fp16") for c, d in EXACT_CASES],
)
def test_matches_torch_fused_optimizer_bit_for_bit(case, dtype):
    shim, native = EXACT[case]
    a, _ = _train(shim, dtype=dtype)
    b, _ = _train(native, dtype=dtype)
    _assert_bitwise(a, b)


def test_param_groups_with_different_hyperparameters_match_torch_bit_for_bit():
    def groups(p):
        return [{"params": p[:1], "lr": 0.05, "weight_decay": 0.2}, {"params": p[1:]}]

    a, _ = _train(lambda p: FusedAdam(groups(p), lr=1e-2))
    b, _ = _train(lambda p: torch.optim.AdamW(groups(p), lr=1e-2, weight_decay=0.0, fused=True))
    _assert_bitwise(a, b)


def test_capturable_fused_adam_unscales_and_skips_under_grad_scaler_exactly_as_torch():
    def run(make):
        params = _params()
        opt, scaler = make(params), torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for i in range(6):
            opt.zero_grad()
            g = torch.Generator().manual_seed(i)
            loss = sum((p * torch.randn(p.shape, generator=g)).sum() for p in params)
            scaler.scale(loss * (float("inf") if i == 2 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        return params, opt, scaler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # GradScaler's note on the grad_scaler kwarg
        a, opt, sa = run(lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1, capturable=True))
    b, _, sb = run(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True))
    _assert_bitwise(a, b)
    assert sa.get_scale() == sb.get_scale() == 2.0**9
    assert int(opt.param_groups[0]["step"]) == 5  # the skipped step is not counted


# Apex's arguments and behaviour -----------------------------------------------------------------
def test_apex_only_arguments_fail_as_in_apex():
    p = _params()
    with pytest.raises(RuntimeError, match="^FusedAdam does not support the AMSGrad variant.$"):
        FusedAdam(p, amsgrad=True)
    with pytest.raises(RuntimeError, match="does not support the AMSGrad variant"):
        FusedLAMB(p, amsgrad=True)
    with pytest.raises(RuntimeError, match="does not support the AMSGrad variant"):
        FusedNovoGrad(p, amsgrad=True)
    with pytest.raises(RuntimeError, match="only supported with the capturable version"):
        FusedAdam(p, master_weights=True)
    opt = FusedAdam(p)
    with pytest.raises(RuntimeError, match=r"^FusedAdam has been updated\.  Simply initialize"):
        opt.step(scale=128.0)


def test_fused_sgd_validates_like_apex():
    p = _params()
    with pytest.raises(ValueError, match=r"^Invalid learning rate: -1$"):
        FusedSGD(p, lr=-1)
    with pytest.raises(ValueError, match=r"^Invalid momentum value: -0.5$"):
        FusedSGD(p, lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match=r"^Invalid weight_decay value: -1$"):
        FusedSGD(p, lr=0.1, weight_decay=-1)
    with pytest.raises(ValueError, match="^Nesterov momentum requires a momentum and zero dampening$"):
        FusedSGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)


@pytest.mark.parametrize(
    "make, default_none",
    [
        (lambda p, **k: FusedAdam(p, **k), True),
        (lambda p, **k: FusedLAMB(p, **k), True),
        (lambda p, **k: FusedNovoGrad(p, **k), True),
        (lambda p, **k: FusedAdagrad(p, **k), True),
        (lambda p, **k: FusedSGD(p, lr=0.1, **k), False),  # FusedSGD zeroes by default
    ],
)
def test_zero_grad_follows_set_grad_none(make, default_none):
    for set_grad_none in (None, True, False):
        params = _params()
        _set_grads(params, 0)
        kwargs = {} if set_grad_none is None else {"set_grad_none": set_grad_none}
        make(params, **kwargs).zero_grad()
        to_none = default_none if set_grad_none is None else set_grad_none
        if to_none:
            assert all(p.grad is None for p in params)
        else:
            assert all(p.grad is not None and not p.grad.any() for p in params)


def test_step_is_counted_per_param_group_even_for_params_without_grads():
    params = _params()
    opt = FusedAdam(params)
    opt.step()  # no grads at all: Apex still counts the step
    _set_grads(params, 0)
    opt.step()
    assert opt.param_groups[0]["step"] == 2
    assert set(opt.state[params[0]]) == {"exp_avg", "exp_avg_sq"}


# Apex-only variants, against the kernels' formulas -----------------------------------------------
def _ref_adam_no_bias_correction(params, steps, lr, wd, adam_w_mode, betas=(0.9, 0.999), eps=1e-8):
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    with torch.no_grad():
        for i in range(steps):
            _set_grads(params, i)
            for p, mi, vi in zip(params, m, v):
                g = p.grad if adam_w_mode else p.grad + wd * p
                mi.mul_(betas[0]).add_((1 - betas[0]) * g)
                vi.mul_(betas[1]).add_((1 - betas[1]) * g * g)
                update = mi / (vi.sqrt() + eps) + (wd * p if adam_w_mode else 0)
                p.sub_(lr * update)
    return params


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_fused_adam_without_bias_correction_follows_apex_kernel(adam_w_mode):
    a, _ = _train(
        lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1, bias_correction=False, adam_w_mode=adam_w_mode),
        steps=20,
    )
    b = _ref_adam_no_bias_correction(_params(), 20, 1e-2, 0.1, adam_w_mode)
    _close(a, b)


def test_fused_sgd_with_weight_decay_after_momentum_follows_apex_kernel():
    a, _ = _train(
        lambda p: FusedSGD(p, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True, wd_after_momentum=True),
        steps=20,
    )
    params = _params()
    bufs = [None] * len(params)
    with torch.no_grad():
        for i in range(20):
            _set_grads(params, i)
            for j, p in enumerate(params):
                bufs[j] = p.grad.clone() if bufs[j] is None else bufs[j] * 0.9 + p.grad
                step = p.grad + 0.9 * bufs[j] + 0.1 * p
                p.sub_(0.1 * step)
    _close(a, params)


def test_fused_adagrad_decoupled_mode_follows_apex_kernel():
    a, _ = _train(lambda p: FusedAdagrad(p, lr=0.05, weight_decay=0.1, adagrad_w_mode=True), steps=20)
    params = _params()
    sums = [torch.zeros_like(p) for p in params]
    with torch.no_grad():
        for i in range(20):
            _set_grads(params, i)
            for p, h in zip(params, sums):
                h.add_(p.grad * p.grad)
                p.sub_(0.05 * (p.grad / (h.sqrt() + 1e-10) + 0.1 * p))
    _close(a, params)


# LAMB -------------------------------------------------------------------------------------------
def ref_lamb(
    params,
    steps,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-6,
    weight_decay=0.01,
    adam_w_mode=True,
    grad_averaging=True,
    bias_correction=True,
    max_grad_norm=1.0,
    use_nvlamb=False,
    grad_scale=1.0,
):
    """LAMB (You et al. 2019) as Apex applies it, written out per parameter (cf. Apex's RefLAMB)."""
    beta1, beta2 = betas
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    with torch.no_grad():
        for step in range(1, steps + 1):
            _set_grads(params, step - 1, grad_scale)
            global_norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
            clip = global_norm / max_grad_norm if global_norm > max_grad_norm else 1.0
            bc1 = 1 - beta1**step if bias_correction else 1.0
            bc2 = 1 - beta2**step if bias_correction else 1.0
            for p, mi, vi in zip(params, m, v):
                g = p.grad / clip
                if not adam_w_mode:
                    g = g + weight_decay * p
                mi.mul_(beta1).add_(g * ((1 - beta1) if grad_averaging else 1.0))
                vi.mul_(beta2).add_((1 - beta2) * g * g)
                update = (mi / bc1) / ((vi / bc2).sqrt() + eps)
                if adam_w_mode:
                    update = update + weight_decay * p
                trust = 1.0
                if use_nvlamb or weight_decay != 0:
                    w_norm, u_norm = p.norm().item(), update.norm().item()
                    if w_norm > 0 and u_norm > 0:
                        trust = w_norm / u_norm
                p.sub_(lr * trust * update)
    return params


LAMB_OPTIONS = {
    "defaults": {},
    "apex_test_options_nvlamb": dict(lr=5e-4, eps=1e-8, weight_decay=0.0, use_nvlamb=True),
    "no_decay_no_trust_ratio": dict(lr=1e-2, weight_decay=0.0),
    "l2_mode_no_averaging": dict(lr=1e-2, adam_w_mode=False, grad_averaging=False, betas=(0.6, 0.9)),
    "no_bias_correction_large_clip": dict(lr=1e-2, bias_correction=False, max_grad_norm=100.0),
}


@pytest.mark.parametrize("name", sorted(LAMB_OPTIONS))
def test_fused_lamb_matches_the_reference_update_within_1e6_over_20_steps(name):
    options = LAMB_OPTIONS[name]
    a, opt = _train(lambda p: FusedLAMB(p, **options), steps=20)
    b = ref_lamb(_params(), 20, **options)
    _close(a, b)
    assert opt.param_groups[0]["step"] == 20


def test_fused_lamb_clips_the_global_grad_norm_over_fp16_and_fp32_params():
    def mixed(dtype_first):
        p = _params()
        p[0] = p[0].detach().to(dtype_first).requires_grad_()
        return p

    a, _ = _train(lambda p: FusedLAMB(p, lr=1e-2), steps=5, params=mixed(torch.float16), grad_scale=5.0)
    b, _ = _train(lambda p: FusedLAMB(p, lr=1e-2), steps=5, params=mixed(torch.float32), grad_scale=5.0)
    assert a[0].dtype == torch.float16
    _close(a, b, atol=2e-3)  # fp16 rounding of the first param only


def test_fused_mixed_precision_lamb_steps_fp32_masters_of_bf16_params():
    a, opt = _train(
        lambda p: FusedMixedPrecisionLamb(p, lr=1e-2, reduced_precision_dtype=torch.bfloat16),
        steps=10,
        dtype=torch.bfloat16,
    )
    # FusedLAMB on fp32 params that start from the same bf16 values and get the same bf16 grads
    b = [p.detach().float().requires_grad_() for p in _params(torch.bfloat16)]
    ref = FusedLAMB(b, lr=1e-2)
    for i in range(10):
        _set_grads(b, i)
        for p in b:
            p.grad = p.grad.to(torch.bfloat16).float()
        ref.step()
    masters = opt.param_groups_full_precision[0]["params"]
    assert all(m.dtype == torch.float32 for m in masters) and a[0].dtype == torch.bfloat16
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(a, masters))
    _close(masters, b)
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) and int(opt.param_groups[0]["step"]) == 10


# NovoGrad ---------------------------------------------------------------------------------------
def ref_novograd(
    params,
    steps,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    reg_inside_moment=False,
    grad_averaging=True,
    norm_type=2,
    init_zero=False,
    bias_correction=True,
):
    """NovoGrad (Ginsburg et al. 2019) as Apex applies it: a per-layer second moment of the grad
    norm, written out per parameter (cf. the Novograd reference in Apex's tests)."""
    beta1, beta2 = betas
    m = [torch.zeros_like(p) for p in params]
    v = [None] * len(params)
    with torch.no_grad():
        for step in range(1, steps + 1):
            _set_grads(params, step - 1)
            bc1 = 1 - beta1**step if bias_correction else 1.0
            bc2 = math.sqrt(1 - beta2**step) if bias_correction else 1.0
            for j, p in enumerate(params):
                g = p.grad
                n = g.abs().max().item() if norm_type == 0 else g.norm().item()
                if v[j] is None:
                    v[j] = 0.0 if init_zero else n
                if norm_type == 0:
                    v[j] = beta2 * v[j] + (1 - beta2) * n
                else:
                    v[j] = math.sqrt(beta2 * v[j] ** 2 + (1 - beta2) * n**2)
                denom = v[j] / bc2 + eps
                b3 = (1 - beta1) if grad_averaging else 1.0
                if reg_inside_moment:
                    m[j].mul_(beta1).add_(b3 * (g / denom + weight_decay * p))
                    p.sub_(lr * m[j] / bc1)
                else:
                    m[j].mul_(beta1).add_(b3 * g)
                    p.sub_(lr * (m[j] / bc1 / denom + weight_decay * p))
    return params


NOVOGRAD_OPTIONS = {
    "defaults": {},
    "apex_test_options": dict(
        betas=(0.95, 0),
        weight_decay=0,
        grad_averaging=False,
        bias_correction=False,
        reg_inside_moment=True,
        norm_type=2,
        init_zero=False,
    ),
    "decay_outside_moment": dict(lr=1e-2, weight_decay=0.1),
    "decay_inside_moment_init_zero": dict(lr=1e-2, weight_decay=0.1, reg_inside_moment=True, init_zero=True),
    "inf_norm": dict(lr=1e-2, norm_type=0, betas=(0.8, 0.5)),
}


@pytest.mark.parametrize("name", sorted(NOVOGRAD_OPTIONS))
def test_fused_novograd_matches_the_reference_update_within_1e6_over_20_steps(name):
    options = NOVOGRAD_OPTIONS[name]
    a, opt = _train(lambda p: FusedNovoGrad(p, **options), steps=20)
    b = ref_novograd(_params(), 20, **options)
    _close(a, b)
    norms = opt.param_groups[0]["exp_avg_sq"]
    assert norms[0].numel() == 0 and norms[1].numel() == len(SHAPES)  # [fp16 norms, fp32 norms]


def test_fused_novograd_rejects_other_norm_types():
    params = _params()
    _set_grads(params, 0)
    with pytest.raises(RuntimeError, match="^FusedNovoGrad only support l2/inf norm now.$"):
        FusedNovoGrad(params, norm_type=1).step()


# State dicts ------------------------------------------------------------------------------------
RESUMABLE = {
    "adam": lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1),
    "sgd": lambda p: FusedSGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda p: FusedAdagrad(p, lr=0.05),
    "lamb": lambda p: FusedLAMB(p, lr=1e-2),
    "novograd": lambda p: FusedNovoGrad(p, lr=1e-2),
}


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_save_and_resume_is_bit_for_bit(name):
    make = RESUMABLE[name]
    params, opt = _train(make, steps=3)
    saved_params = [p.detach().clone() for p in params]
    saved = _roundtrip(opt.state_dict())
    _train(make, steps=3, start=3, params=params, opt=opt)

    resumed = [p.clone().requires_grad_() for p in saved_params]
    ropt = make(resumed)
    ropt.load_state_dict(saved)
    _train(make, steps=3, start=3, params=resumed, opt=ropt)
    _assert_bitwise(params, resumed)


def test_fused_adam_state_dict_is_apex_format_with_step_in_the_param_group():
    _, opt = _train(RESUMABLE["adam"], steps=3)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["step"] == 3
    assert all(set(s) == {"exp_avg", "exp_avg_sq"} for s in sd["state"].values())
    assert {"lr", "bias_correction", "betas", "eps", "weight_decay"} <= set(sd["param_groups"][0])


def test_torch_adamw_cannot_load_a_fused_adam_state_dict_the_step_count_trap():
    """Documents §10's trap (torch's behaviour, not the shim's): the codemod reports it."""
    _, opt = _train(RESUMABLE["adam"], steps=3)
    native = torch.optim.AdamW(_params(), lr=1e-2, weight_decay=0.1, fused=True)
    with pytest.raises(KeyError, match="step"):
        native.load_state_dict(opt.state_dict())


@pytest.mark.parametrize(
    "shim, native",
    [
        (
            lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
        ),
        (lambda p: FusedAdagrad(p, lr=0.05), lambda p: torch.optim.Adagrad(p, lr=0.05, fused=True)),
        (
            lambda p: FusedSGD(p, lr=0.1, momentum=0.9),
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
        ),
    ],
    ids=["adam", "adagrad", "sgd"],
)
def test_loads_a_torch_state_dict_and_continues_exactly_as_torch(shim, native):
    params, opt = _train(native, steps=3)
    saved_params = [p.detach().clone() for p in params]
    saved = _roundtrip(opt.state_dict())
    _train(native, steps=3, start=3, params=params, opt=opt)

    resumed = [p.clone().requires_grad_() for p in saved_params]
    sopt = shim(resumed)
    sopt.load_state_dict(saved)
    _train(shim, steps=3, start=3, params=resumed, opt=sopt)
    _assert_bitwise(params, resumed)
    if not isinstance(sopt, FusedSGD):
        assert sopt.param_groups[0]["step"] == 6


def test_fused_sgd_state_dict_loads_into_torch_sgd():
    params, opt = _train(RESUMABLE["sgd"], steps=3)
    native = torch.optim.SGD(
        [p.detach().clone().requires_grad_() for p in params], lr=0.1, momentum=0.9, fused=True
    )
    native.load_state_dict(_roundtrip(opt.state_dict()))
    # torch takes the group options from the checkpoint, whose Apex groups have no `fused` key
    assert native.param_groups[0]["fused"] is False
    native.param_groups[0]["fused"] = True
    _train(None, steps=3, start=3, params=params, opt=opt)
    _train(None, steps=3, start=3, params=native.param_groups[0]["params"], opt=native)
    _assert_bitwise(params, native.param_groups[0]["params"])


def test_a_torch_state_dict_whose_param_steps_differ_is_refused_with_a_clear_error():
    params = _params()
    native = torch.optim.AdamW(params, fused=True)
    _set_grads(params, 0)
    native.step()
    params[1].grad = None  # the second param misses a step: torch counts per param
    native.step()
    with pytest.raises(
        ValueError,
        match=r"param group 0 were stepped different numbers of times \(\[1, 2\]\); "
        r"FusedAdam keeps one step count per param group",
    ):
        FusedAdam(_params()).load_state_dict(native.state_dict())


def test_an_amsgrad_state_dict_is_refused_with_a_clear_error():
    params = _params()
    native = torch.optim.Adam(params, amsgrad=True)
    _set_grads(params, 0)
    native.step()
    with pytest.raises(ValueError, match="'max_exp_avg_sq' state, which FusedAdam never keeps"):
        FusedAdam(_params()).load_state_dict(native.state_dict())


def test_apex_names_are_exported():
    import amp_shim.optimizers as optimizers

    assert set(optimizers.__all__) == {
        "FusedSGD",
        "FusedAdam",
        "FusedNovoGrad",
        "FusedLAMB",
        "FusedAdagrad",
        "FusedMixedPrecisionLamb",
    }
    assert all(issubclass(getattr(optimizers, n), torch.optim.Optimizer) for n in optimizers.__all__)


def test_zero_grad_also_takes_torchs_set_to_none():
    params = _params()
    _set_grads(params, 0)
    opt = FusedSGD(params, lr=0.1)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params)
    _set_grads(params, 0)
    FusedAdam(params).zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params)


def test_fused_adam_master_weights_step_fp32_masters_of_half_params_exactly_as_torch_on_fp32():
    half = _params(torch.float16)
    opt = FusedAdam(half, lr=1e-2, weight_decay=0.1, capturable=True, master_weights=True)
    fp32 = [p.detach().float().requires_grad_() for p in half]
    native = torch.optim.AdamW(fp32, lr=1e-2, weight_decay=0.1, fused=True)
    for i in range(5):
        _set_grads(half, i)
        for p, q in zip(half, fp32):
            q.grad = p.grad.float()
        opt.step()
        native.step()
    masters = [m for m in opt.param_groups_master[0]]
    _assert_bitwise(masters, fp32)
    assert all(torch.equal(p, m.half()) for p, m in zip(half, masters))
