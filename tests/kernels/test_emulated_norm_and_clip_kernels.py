"""Unscale fused with the global L2 norm, and the clip that uses it (kernels/norm.cu), emulated.

What is compared, and how:
  * the grads that `unscale_and_norm_` writes, and the overflow flag: bit for bit against the
    torch path (the same as `unscale_`);
  * the norm: BIT FOR BIT against `reference.kernel_order_norm`, float32 torch ops in the
    kernels' documented summation order (per chunk, per thread, a fixed tree, then a fixed final
    reduction); and against a float64 sum within a relative 1e-5 (float32 rounding over these
    small sizes; the order differs from torch.linalg.vector_norm's, so bit-exactness against
    torch's own norm is not meaningful);
  * deterministic: the same norm bits for any grid size;
  * the clip: bit for bit against the torch path of `clip_scale_`, which is
    torch.nn.utils.clip_grad_norm_'s coefficient and multiply, given the same norm.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import kernels_env, run_both
from reference import FLOATS, assert_same_bits, float64_norm, kernel_order_norm, make_grad

from amp_shim.engine import ops

# (chunk_size, block_size, final_block_size, max_grid)
CONFIGS = [(64, 32, 32, 65535), (16, 96, 7, 2), (128, 64, 128, 1), (33, 1, 1, 5)]
IDS = [
    "chunk64-block32-final32",
    "chunk16-block96-final7-grid2",
    "chunk128-block64-final128-grid1",
    "chunk33-block1-final1",
]
MIXES = {"fp32": [torch.float32], "fp16": [torch.float16], "bf16": [torch.bfloat16], "mixed": list(FLOATS)}


def _config(c):
    return dict(chunk_size=c[0], block_size=c[1], final_block_size=c[2], max_grid=c[3])


def _finite_grads(chunk, dtypes, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 2, 40]
    # Finite, and at most 1e4 in magnitude: the sums of squares are float32 (as in Apex's
    # multi_tensor_l2norm and torch's CUDA norm), so a norm past ~1.8e19 would overflow to inf.
    return [
        make_grad(n, dtypes[i % len(dtypes)], g, finite=True).clamp_(-1e4, 1e4) for i, n in enumerate(sizes)
    ]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("mix", MIXES)
def test_unscale_and_norm_writes_torch_grads_and_the_kernel_order_norm(emulated, config, mix):
    chunk, block, final, _ = config
    for inv in (2.0**-12, 1.0, 0.3):
        grads = _finite_grads(chunk, MIXES[mix], seed=int(inv * 1000))
        inputs = (grads, torch.zeros(1), torch.tensor(inv))
        t_in, t_norm, k_in, k_norm, backend = run_both(
            emulated, _config(config), ops.unscale_and_norm_, inputs
        )
        for i, (a, b) in enumerate(zip(k_in[0], t_in[0])):
            assert_same_bits(a, b, "grad %d" % i)
        assert k_in[1].item() == t_in[1].item() == 0.0
        assert [n for n, _, _ in backend.launches] == ["amp_mt_unscale_norm", "amp_norm_finalize"]
        expected = kernel_order_norm([g.float() for g in t_in[0]], chunk, block, final)
        assert_same_bits(k_norm, expected, "norm")
        exact = float64_norm(t_in[0])
        assert math.isclose(k_norm.item(), exact, rel_tol=1e-5), (k_norm.item(), exact)
        assert math.isclose(t_norm.item(), exact, rel_tol=1e-5)  # the torch path's norm


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("mix", ["fp32", "mixed"])
def test_scaled_norm_reads_grads_once_and_matches_the_kernel_order(emulated, config, mix):
    chunk, block, final, _ = config
    grads = _finite_grads(chunk, MIXES[mix], seed=4)
    inv = 2.0**-9
    inputs = (grads, torch.zeros(1), torch.tensor(inv))
    t_in, t_norm, k_in, k_norm, _ = run_both(emulated, _config(config), ops.scaled_norm, inputs)
    for a, b in zip(k_in[0], grads):
        assert_same_bits(a, b, "grads are not written")
    unscaled = [g.float() * torch.tensor(inv) for g in grads]
    assert_same_bits(k_norm, kernel_order_norm(unscaled, chunk, block, final), "norm")
    assert math.isclose(k_norm.item(), t_norm.item(), rel_tol=1e-5)


def test_norm_is_the_same_bits_for_every_grid_size(emulated):
    grads = _finite_grads(16, list(FLOATS), seed=8)
    norms = []
    for grid in (1, 2, 3, 7, 1000):
        with emulated(chunk_size=16, block_size=8, final_block_size=4, max_grid=grid):
            norms.append(ops.scaled_norm([g.clone() for g in grads], torch.zeros(1), torch.tensor(0.125)))
    for n in norms[1:]:
        assert_same_bits(n, norms[0], "norm across grids")


def test_norm_flags_non_finite_grads_and_is_not_finite_then(emulated):
    for bad in (float("inf"), float("nan")):
        grads = _finite_grads(64, list(FLOATS), seed=1)
        grads[3][10] = bad
        inputs = (grads, torch.zeros(1), torch.tensor(0.5))
        t_in, t_norm, k_in, k_norm, _ = run_both(emulated, _config(CONFIGS[0]), ops.unscale_and_norm_, inputs)
        assert k_in[1].item() == t_in[1].item() == 1.0
        assert not math.isfinite(k_norm.item()) and not math.isfinite(t_norm.item())
        for a, b in zip(k_in[0], t_in[0]):
            assert_same_bits(a, b, "grads with %r" % bad)


def test_norm_of_no_elements_is_zero(emulated):
    for grads in ([], [torch.zeros(0)], [torch.zeros(0, dtype=torch.float16)] * 3):
        with emulated() as backend:
            norm = ops.unscale_and_norm_(grads, torch.zeros(1), torch.tensor(1.0))
        assert norm.item() == 0.0 and norm.dtype == torch.float32
        assert [n for n, _, _ in backend.launches] == (["amp_norm_finalize"] if grads else [])


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("max_norm", [1.0, 1e-3, 1e9, 0.7])
def test_clip_scale_matches_clip_grad_norm_given_the_same_norm(emulated, mix, max_norm):
    grads = _finite_grads(64, MIXES[mix], seed=6)
    norm = torch.tensor(float64_norm(grads), dtype=torch.float32)
    for inv in (None, torch.tensor(2.0**-7), torch.tensor(0.3)):
        run = lambda gs, n, inv=inv: ops.clip_scale_(gs, n, max_norm, inv_scale=inv)  # noqa: E731
        t_in, _, k_in, _, backend = run_both(emulated, _config(CONFIGS[1]), run, (grads, norm))
        for a, b in zip(k_in[0], t_in[0]):
            assert_same_bits(a, b, "clip inv=%r" % inv)
        assert [n for n, _, _ in backend.launches] == ["amp_mt_clip_scale"]
    # Without inv_scale, the torch path is torch.nn.utils.clip_grad_norm_'s arithmetic itself:
    # fed the total norm that clip_grad_norm_ returns, it clips to the same bits.
    if mix != "mixed":
        live = [g for g in grads if g.numel()]
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in live]
        for p, g in zip(params, live):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        with kernels_env("torch"):
            mine = [g.clone() for g in live]
            ops.clip_scale_(mine, total, max_norm)
        for p, m in zip(params, mine):
            assert_same_bits(p.grad, m, "clip_grad_norm_")


@pytest.mark.parametrize("mix", MIXES)
def test_three_pass_unscale_and_clip_matches_torch_given_its_norm(emulated, mix):
    chunk, block, final, grid = CONFIGS[0]
    grads = _finite_grads(chunk, MIXES[mix], seed=11)
    inv = torch.tensor(2.0**-10)
    with emulated(**_config(CONFIGS[0])) as backend:
        k_grads = [g.clone() for g in grads]
        found = torch.zeros(1)
        norm = ops.unscale_clip_(k_grads, found, inv, 0.05)
    assert [n for n, _, _ in backend.launches] == [
        "amp_mt_scaled_norm",
        "amp_norm_finalize",
        "amp_mt_clip_scale",
    ]
    unscaled = [g.float() * inv for g in grads]
    assert_same_bits(norm, kernel_order_norm(unscaled, chunk, block, final), "norm")
    with kernels_env("torch"):
        t_grads = [g.clone() for g in grads]
        ops.clip_scale_(t_grads, norm, 0.05, inv_scale=inv)
    for a, b in zip(k_grads, t_grads):
        assert_same_bits(a, b, "clipped")
    assert found.item() == 0.0
    # ... and close to torch's 5-pass unscale_ + clip_grad_norm_ (equal up to rounding).
    with kernels_env("torch"):
        five = [g.clone() for g in grads]
        ops.unscale_(five, torch.zeros(1), inv)
        ops.clip_scale_(five, ops._total_norm(five, torch.device("cpu")), 0.05)
    for a, b in zip(k_grads, five):
        torch.testing.assert_close(
            a.float(), b.float(), rtol=2e-2 if a.dtype != torch.float32 else 1e-5, atol=1e-30
        )
