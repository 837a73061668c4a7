"""`amp_shim.amp_C` (Apex's `amp_C` under the alias) and `amp_shim.apex_C`: each entry point,
driven through `multi_tensor_applier` with Apex's argument order, against a plain torch
reference (values, and the overflow flag: raised by a non-finite input, never cleared)."""

import pytest
import torch

from amp_shim import amp_C, apex_C
from amp_shim.multi_tensor_apply import multi_tensor_applier

DTYPES = (torch.float32, torch.float16)
INF, NAN = float("inf"), float("nan")


def flag():
    return torch.zeros(1, dtype=torch.int)


def tensors(dtype, sizes=(7, 65536 + 3, 1), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen).to(dtype) for n in sizes]


def close(actual, expected, dtype):
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(actual, expected.to(actual.dtype), **tol)


# -- scale / axpby -----------------------------------------------------------------------------


@pytest.mark.parametrize("src_dtype", DTYPES)
@pytest.mark.parametrize("dst_dtype", DTYPES)
def test_scale_writes_src_times_scale_in_the_destination_dtype(src_dtype, dst_dtype):
    src = tensors(src_dtype)
    dst = [torch.full_like(s, 7.0, dtype=dst_dtype) for s in src]
    buf = flag()
    multi_tensor_applier(amp_C.multi_tensor_scale, buf, [src, dst], 0.25)
    for s, d in zip(src, dst):
        assert d.dtype == dst_dtype
        assert torch.equal(d, (s.float() * 0.25).to(dst_dtype))
    assert buf.item() == 0


@pytest.mark.parametrize("bad", [INF, -INF, NAN])
def test_scale_raises_the_flag_for_a_non_finite_source_and_never_clears_it(bad):
    src = tensors(torch.float16)
    src[1][12345] = bad
    dst = [torch.empty_like(s) for s in src]
    buf = flag()
    multi_tensor_applier(amp_C.multi_tensor_scale, buf, [src, dst], 2.0)
    assert buf.item() == 1
    multi_tensor_applier(amp_C.multi_tensor_scale, buf, [tensors(torch.float16), dst], 2.0)
    assert buf.item() == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpby_writes_a_x_plus_b_y_in_fp32_math(dtype):
    xs, ys = tensors(dtype, seed=1), tensors(dtype, seed=2)
    outs = [torch.empty_like(x, dtype=torch.float32) for x in xs]
    buf = flag()
    multi_tensor_applier(amp_C.multi_tensor_axpby, buf, [xs, ys, outs], 2.0, -3.0, -1)
    for x, y, out in zip(xs, ys, outs):
        assert torch.equal(out, 2.0 * x.float() + -3.0 * y.float())
    assert buf.item() == 0


@pytest.mark.parametrize("arg_to_check,flagged_by_x,flagged_by_y", [(-1, 1, 1), (0, 1, 0), (1, 0, 1)])
def test_axpby_checks_only_the_arguments_arg_to_check_names(arg_to_check, flagged_by_x, flagged_by_y):
    for bad_list, expected in (("x", flagged_by_x), ("y", flagged_by_y)):
        xs, ys = tensors(torch.float32, seed=1), tensors(torch.float32, seed=2)
        (xs if bad_list == "x" else ys)[0][3] = INF
        buf = flag()
        outs = [torch.empty_like(x) for x in xs]
        multi_tensor_applier(amp_C.multi_tensor_axpby, buf, [xs, ys, outs], 1.0, 1.0, arg_to_check)
        assert buf.item() == expected, (arg_to_check, bad_list)


# -- norms -------------------------------------------------------------------------------------


def reference_norms(ts, factor=1.0):
    per = torch.stack([(t.double() * factor).norm() for t in ts])
    return per.norm().float().reshape(1), per.float()


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2norm_returns_a_shape_1_total_and_per_tensor_norms_or_an_empty_tensor(dtype):
    ts = tensors(dtype)
    buf = flag()
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, buf, [ts], True)
    ref_total, ref_per = reference_norms(ts)
    assert total.shape == (1,) and total.dtype == torch.float32 and per.shape == (3,)
    close(total, ref_total, torch.float32)
    close(per, ref_per, torch.float32)
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, buf, [ts])
    assert per.shape == (0,) and per.dtype == torch.float32
    close(total, ref_total, torch.float32)
    assert buf.item() == 0


def test_l2norm_is_the_float64_norm_rounded_once_on_a_large_cpu_tensor():
    """torch's fp32 CPU norm of 4M elements drifts ~1e-4 relative; the kernels' blocked sums
    stay near fp32 rounding, and so must the shim (one rounding of the float64 norm)."""
    x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(3)) * 0.01 + 0.005
    exact = x.double().norm()
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag(), [[x, x[:5]]], True)
    assert abs(per[0].double() - exact) / exact < 1.2e-7
    assert abs(total.double() - torch.stack([exact, x[:5].double().norm()]).norm()) / exact < 1.2e-7


@pytest.mark.parametrize("bad", [INF, NAN])
def test_l2norm_raises_the_flag_for_a_non_finite_value_and_never_clears_it(bad):
    ts = tensors(torch.float16)
    ts[2][0] = bad
    buf = flag()
    total, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm, buf, [ts])
    assert buf.item() == 1 and not torch.isfinite(total).all()
    multi_tensor_applier(amp_C.multi_tensor_l2norm, buf, [tensors(torch.float16)])
    assert buf.item() == 1


def test_l2norm_raises_the_flag_when_squares_leave_float32_range():
    buf = flag()
    multi_tensor_applier(amp_C.multi_tensor_l2norm, buf, [[torch.tensor([1e20, 1.0])]])
    assert buf.item() == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_l2norm_scale_writes_in_times_scale_and_returns_the_norms_of_in(dtype):
    ins = tensors(dtype)
    outs = [torch.empty_like(t) for t in ins]
    buf = flag()
    total, per = multi_tensor_applier(amp_C.multi_tensor_l2norm_scale, buf, [ins, outs], 0.5, True)
    ref_total, ref_per = reference_norms(ins)
    close(total, ref_total, torch.float32)
    close(per, ref_per, torch.float32)
    for i, o in zip(ins, outs):
        assert torch.equal(o, (i.float() * 0.5).to(dtype))
    ins[0][0] = INF
    multi_tensor_applier(amp_C.multi_tensor_l2norm_scale, buf, [ins, outs], 0.5, False)
    assert buf.item() == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_unscale_l2norm_returns_the_norms_of_the_unscaled_tensors_and_leaves_them(dtype):
    ts = tensors(dtype)
    before = [t.clone() for t in ts]
    inv_scale = torch.tensor([1 / 1024], dtype=torch.float32)
    buf = flag()
    total, per = multi_tensor_applier(amp_C.multi_tensor_unscale_l2norm, buf, [ts], inv_scale, True)
    ref_total, ref_per = reference_norms(ts, 1 / 1024)
    close(total, ref_total, torch.float32)
    close(per, ref_per, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(ts, before)) and buf.item() == 0
    ts[1][9] = NAN
    multi_tensor_applier(amp_C.multi_tensor_unscale_l2norm, buf, [ts], inv_scale, False)
    assert buf.item() == 1


# -- optimizers --------------------------------------------------------------------------------


def params_and_grads(dtype, seed=4):
    ps = tensors(dtype, sizes=(33, 5000), seed=seed)
    gs = tensors(dtype, sizes=(33, 5000), seed=seed + 1)
    return ps, gs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,torch_cls", [(0, torch.optim.Adam), (1, torch.optim.AdamW)])
def test_adam_matches_torch_adam_l2_mode_0_and_adamw_mode_1(dtype, mode, torch_cls):
    ps, gs = params_and_grads(dtype)
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    ref = [p.float().clone().requires_grad_() for p in ps]
    opt = torch_cls(ref, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    buf = flag()
    # fp16 moments are stored rounded, so the fp32 reference is only exact for the first step.
    for step in (1, 2, 3) if dtype == torch.float32 else (1,):
        for r, g in zip(ref, gs):
            r.grad = g.float().clone()
        opt.step()
        multi_tensor_applier(
            amp_C.multi_tensor_adam, buf, [gs, ps, ms, vs], 1e-2, 0.8, 0.95, 1e-6, step, mode, 1, 0.1
        )
    for p, r in zip(ps, ref):
        close(p, r.detach(), dtype)
    for m, r in zip(ms, ref):
        close(m, opt.state[r]["exp_avg"], dtype)
    assert buf.item() == 0  # Adam's kernel neither reads nor raises the flag


def test_adam_without_bias_correction_uses_the_raw_moments():
    p, g = torch.tensor([1.0]), torch.tensor([0.5])
    m, v = torch.zeros(1), torch.zeros(1)
    multi_tensor_applier(
        amp_C.multi_tensor_adam, flag(), [[g], [p], [m], [v]], 0.1, 0.9, 0.99, 0.0, 1, 1, 0, 0.0
    )
    m_ref, v_ref = 0.1 * 0.5, 0.01 * 0.25
    torch.testing.assert_close(p, torch.tensor([1.0 - 0.1 * m_ref / v_ref**0.5]))


@pytest.mark.parametrize(
    "momentum,dampening,nesterov,wd",
    [(0.0, 0.0, False, 0.0), (0.9, 0.0, False, 0.01), (0.9, 0.1, False, 0.01), (0.9, 0.0, True, 0.05)],
)
def test_sgd_matches_torch_sgd_with_first_run_starting_the_momentum(momentum, dampening, nesterov, wd):
    ps, gs = params_and_grads(torch.float32)
    bufs = [torch.zeros_like(p) for p in ps]
    ref = [p.clone().requires_grad_() for p in ps]
    opt = torch.optim.SGD(
        ref, lr=0.1, momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=wd
    )
    buf = flag()
    for i in range(3):
        for r, g in zip(ref, gs):
            r.grad = g.clone()
        opt.step()
        multi_tensor_applier(
            amp_C.multi_tensor_sgd,
            buf,
            [gs, ps, bufs],
            wd,
            momentum,
            dampening,
            0.1,
            nesterov,
            i == 0,
            False,
            1.0,
        )
    for p, r in zip(ps, ref):
        torch.testing.assert_close(p, r.detach())


def test_sgd_unscales_grads_and_writes_the_fp16_model_copy_from_the_fp32_master():
    master = [torch.tensor([1.0, 2.0])]
    grads16 = [torch.tensor([512.0, -1024.0], dtype=torch.float16)]
    mom, model = [torch.zeros(2)], [torch.zeros(2, dtype=torch.float16)]
    multi_tensor_applier(
        amp_C.multi_tensor_sgd,
        flag(),
        [grads16, master, mom, model],
        0.0,
        0.9,
        0.0,
        0.5,
        False,
        True,
        False,
        1 / 512,
    )
    assert master[0].tolist() == [0.5, 3.0] and mom[0].tolist() == [1.0, -2.0]
    assert model[0].dtype == torch.float16 and model[0].tolist() == [0.5, 3.0]


def test_sgd_does_nothing_when_the_flag_is_already_raised():
    p, g, mom = torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([5.0])
    model = torch.tensor([1.0], dtype=torch.float16)
    raised = torch.ones(1, dtype=torch.int)
    multi_tensor_applier(
        amp_C.multi_tensor_sgd,
        raised,
        [[g], [p], [mom], [model]],
        0.1,
        0.9,
        0.0,
        0.5,
        False,
        False,
        False,
        1.0,
    )
    assert p.item() == 1.0 and mom.item() == 5.0 and model.item() == 1.0 and raised.item() == 1


def reference_lamb(p, g, m, v, *, lr, b1, b2, eps, step, wd, mode, clip):
    """LAMB for one fp32 tensor, as multi_tensor_lamb computes it, in plain torch."""
    g = g / clip
    if mode == 0:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    update = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)
    if mode == 1:
        update = update + wd * p
    ratio = p.norm() / update.norm() if wd != 0 else torch.tensor(1.0)
    return p - lr * ratio * update, update, m, v


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("global_norm,max_norm", [(0.5, 1.0), (4.0, 1.0)])
def test_lamb_matches_the_reference_and_leaves_the_update_in_the_grads(mode, global_norm, max_norm):
    ps, gs = params_and_grads(torch.float32)
    ms, vs = [torch.rand_like(p) * 0.1 for p in ps], [torch.rand_like(p) * 0.1 for p in ps]
    expected = [
        reference_lamb(
            p,
            g,
            m,
            v,
            lr=0.01,
            b1=0.9,
            b2=0.99,
            eps=1e-6,
            step=3,
            wd=0.01,
            mode=mode,
            clip=max(global_norm / max_norm, 1.0),
        )
        for p, g, m, v in zip(ps, gs, ms, vs)
    ]
    buf = flag()
    multi_tensor_applier(
        amp_C.multi_tensor_lamb,
        buf,
        [gs, ps, ms, vs],
        0.01,
        0.9,
        0.99,
        1e-6,
        3,
        1,
        0.01,
        1,
        mode,
        torch.tensor([global_norm]),
        max_norm,
        False,
    )
    for (p_ref, u_ref, m_ref, v_ref), p, g, m, v in zip(expected, ps, gs, ms, vs):
        torch.testing.assert_close(p, p_ref)
        torch.testing.assert_close(g, u_ref)
        torch.testing.assert_close(m, m_ref)
        torch.testing.assert_close(v, v_ref)
    assert buf.item() == 0


def test_lamb_applies_the_trust_ratio_without_decay_only_with_nvlamb():
    def run(use_nvlamb):
        p, g = [torch.full((4,), 3.0)], [torch.full((4,), 1.0)]
        m, v = [torch.zeros(4)], [torch.zeros(4)]
        multi_tensor_applier(
            amp_C.multi_tensor_lamb,
            flag(),
            [g, p, m, v],
            0.1,
            0.9,
            0.99,
            0.0,
            1,
            1,
            0.0,
            1,
            1,
            torch.tensor([1.0]),
            1.0,
            use_nvlamb,
        )
        return p[0]

    # The update is 1 everywhere, so |p|/|update| = 3: plain lr without nvlamb, 3x lr with it.
    torch.testing.assert_close(run(False), torch.full((4,), 3.0 - 0.1))
    torch.testing.assert_close(run(True), torch.full((4,), 3.0 - 0.3))


def test_lamb_raises_the_flag_for_a_non_finite_grad():
    ps, gs = params_and_grads(torch.float32)
    gs[0][0] = INF
    buf = flag()
    multi_tensor_applier(
        amp_C.multi_tensor_lamb,
        buf,
        [gs, ps, [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]],
        0.01,
        0.9,
        0.99,
        1e-6,
        1,
        1,
        0.01,
        1,
        1,
        torch.tensor([1.0]),
        1.0,
        False,
    )
    assert buf.item() == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("norm_type", [2, 0])
def test_novograd_blends_the_layer_norms_and_steps_as_the_reference(dtype, mode, norm_type):
    ps, gs = params_and_grads(dtype)
    ms = [torch.zeros_like(p) for p in ps]
    old = torch.tensor([0.5, 2.0])
    norms = old.clone()
    b1, b2, lr, eps, wd, step = 0.95, 0.98, 0.01, 1e-8, 0.001, 2
    buf = flag()
    multi_tensor_applier(
        amp_C.multi_tensor_novograd,
        buf,
        [gs, ps, ms],
        norms,
        lr,
        b1,
        b2,
        eps,
        step,
        1,
        wd,
        1,
        mode,
        norm_type,
    )
    for i, (p0, g) in enumerate(zip(params_and_grads(dtype)[0], gs)):
        g32, p32 = g.double(), p0.double()
        if norm_type == 2:
            n = ((b2 * old[i] ** 2 + (1 - b2) * g32.norm() ** 2) ** 0.5).double()
        else:
            n = b2 * old[i].double() + (1 - b2) * g32.abs().max()
        close(norms[i], n, torch.float32)
        denom = n / (1 - b2**step) ** 0.5 + eps
        bc1 = 1 - b1**step
        if mode == 0:
            m = (1 - b1) * (g32 / denom + wd * p32)
            p = p32 - lr * m / bc1
        else:
            m = (1 - b1) * g32
            p = p32 - lr * ((m / bc1) / denom + wd * p32)
        close(ps[i], p, dtype)
        close(ms[i], m, dtype)
    assert buf.item() == 0


def test_novograd_raises_the_flag_for_a_non_finite_grad():
    ps, gs = params_and_grads(torch.float32)
    gs[1][7] = NAN
    buf = flag()
    multi_tensor_applier(
        amp_C.multi_tensor_novograd,
        buf,
        [gs, ps, [torch.zeros_like(p) for p in ps]],
        torch.ones(2),
        0.01,
        0.9,
        0.98,
        1e-8,
        1,
        1,
        0.0,
        1,
        1,
        2,
    )
    assert buf.item() == 1


# -- apex_C ------------------------------------------------------------------------------------


def test_apex_c_flatten_concatenates_and_unflatten_returns_views_shaped_like_the_originals():
    ts = [torch.arange(6.0).reshape(2, 3), torch.tensor([7.0]), torch.zeros(2, 1, 2)]
    flat = apex_C.flatten(ts)
    assert torch.equal(flat, torch.cat([t.reshape(-1) for t in ts]))
    back = apex_C.unflatten(flat * 2, ts)
    assert isinstance(back, list)
    assert [b.shape for b in back] == [t.shape for t in ts]
    assert all(torch.equal(b, t * 2) for b, t in zip(back, ts))


# -- update_scale_hysteresis -------------------------------------------------------------------


def reference_hysteresis(scale, growth, hyst, found, gf, bf, interval, hysteresis):
    """csrc/update_scale_hysteresis.cu on Python numbers (float32 via torch for the scale)."""
    if found > 0:
        hyst -= 1
        if hyst > 0:
            return scale, 0, hyst
    if found:
        scale = float(torch.tensor(scale * bf, dtype=torch.float32))
        scale = 0.0 if abs(scale) < torch.finfo(torch.float32).tiny else scale
        growth = 0
    else:
        growth += 1
        if growth == interval:
            new = float(torch.tensor(scale * gf, dtype=torch.float32))
            scale = new if new != float("inf") else scale
            growth = 0
    if found <= 0:
        hyst = hysteresis
    return scale, growth, hyst


def hysteresis_state(scale, growth, hyst):
    return (
        torch.tensor([scale], dtype=torch.float32),
        torch.tensor([growth], dtype=torch.int32),
        torch.tensor([hyst], dtype=torch.int32),
    )


def test_update_scale_hysteresis_follows_the_kernel_over_a_random_overflow_pattern():
    gen = torch.Generator().manual_seed(5)
    state, ref = hysteresis_state(2.0**20, 0, 3), (2.0**20, 0, 3)
    seen = set()
    for i in range(400):
        found = float(torch.rand(1, generator=gen) < 0.3)
        out = amp_C.update_scale_hysteresis(*state, torch.tensor([found]), 2.0, 0.5, 4, 3)
        new_ref = reference_hysteresis(*ref, found, 2.0, 0.5, 4, 3)
        seen.add(
            "grew"
            if new_ref[0] > ref[0]
            else "backed off"
            if new_ref[0] < ref[0]
            else "held"
            if found
            else "counted"
        )
        ref = new_ref
        assert out is state[0]
        assert tuple(t.item() for t in state) == ref, i
    assert seen == {"grew", "backed off", "held", "counted"}


def test_update_scale_hysteresis_flushes_a_subnormal_backoff_to_zero():
    state = hysteresis_state(2.0**-120, 5, 1)
    amp_C.update_scale_hysteresis(*state, torch.tensor([1.0]), 2.0, 2.0**-10, 100, 1)
    assert tuple(t.item() for t in state) == (0.0, 0, 0)


def test_update_scale_hysteresis_does_not_grow_past_float32():
    state = hysteresis_state(2.0**127, 0, 2)
    amp_C.update_scale_hysteresis(*state, torch.tensor([0.0]), 2.0, 0.5, 1, 2)
    assert tuple(t.item() for t in state) == (2.0**127, 0, 2)
