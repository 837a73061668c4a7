"""The shim's L2 norms on the CPU stay within float32 rounding of the exact (float64) norm.

torch's float32 CPU norm (`linalg.vector_norm`, `_foreach_norm`) drifts with size (about 1e-4
relative at 4M elements); Apex's kernels sum per-chunk float32 partials and stay near float32
rounding. FusedNovoGrad's per-layer norms, FusedLAMB's global grad norm, the engine's clipping
norm and `amp_C.multi_tensor_l2norm` all go through `engine.ops.l2_norms`; each is checked here
on a large layer against a float64 reference (Apex's novograd test saw ~1.5e-3 differences
before)."""

import torch

from amp_shim.engine import ops
from amp_shim.optimizers import FusedLAMB, FusedNovoGrad

ONE_ROUNDING = 1.2e-7  # float32 rounding of the exact value is at most 2**-24 ~ 6e-8 relative


def large(n=4_000_000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.01 + 0.005


def rel(actual, exact):
    return abs(float(actual) - float(exact)) / float(exact)


def test_l2_norms_per_tensor_and_total_are_the_float64_norms_rounded_once():
    a, b = large(), large(1_000_003, seed=1).half()
    per, total = ops.l2_norms([a, b], torch.device("cpu"))
    exact = torch.stack([a.double().norm(), b.double().norm()])
    assert per.dtype == total.dtype == torch.float32
    assert rel(per[0], exact[0]) < ONE_ROUNDING and rel(per[1], exact[1]) < ONE_ROUNDING
    assert rel(total, exact.norm()) < ONE_ROUNDING


def test_engine_clipping_norm_is_accurate_on_a_large_grad():
    g = large(seed=2)
    norm = ops.unscale_and_norm_([g], torch.zeros(1), torch.tensor(1.0))
    assert rel(norm, g.double().norm()) < ONE_ROUNDING


def test_fused_novograd_layer_norm_is_accurate_on_a_large_layer():
    p = torch.nn.Parameter(torch.zeros(4_000_000))
    p.grad = large(seed=3)
    opt = FusedNovoGrad([p], lr=1e-3)
    opt.step()
    (stored,) = opt.param_groups[0]["exp_avg_sq"][1]
    assert rel(stored, p.grad.double().norm()) < ONE_ROUNDING


def test_fused_lamb_clips_by_an_accurate_global_grad_norm():
    """max_grad_norm just below the exact norm: the clip divisor is norm / max_grad_norm, so the
    first moment after one step is grad * max_grad_norm / norm * (1 - beta1)."""
    grad = large(seed=4)
    exact = grad.double().norm()
    p = torch.nn.Parameter(torch.ones(grad.numel()))
    p.grad = grad.clone()
    max_norm = float(exact) * 0.5
    opt = FusedLAMB([p], lr=0.0, max_grad_norm=max_norm, weight_decay=0.0)
    opt.step()
    m = opt.state[p]["exp_avg"]
    expected = grad.double() * (max_norm / exact) * 0.1
    assert float((m.double() - expected).norm() / expected.norm()) < 3 * ONE_ROUNDING
