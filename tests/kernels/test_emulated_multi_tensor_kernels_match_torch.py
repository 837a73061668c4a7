"""The multi-tensor kernels (kernels/unscale.cu, kernels/master.cu), built for the host and
launched through engine/cuda.py exactly as on a GPU, leave every tensor bit for bit as the
engine's torch path does (engine/ops.py with AMP_SHIM_KERNELS=torch), in ONE launch per op:
over tensor counts 0..many, sizes 0, 1 and around chunk boundaries, fp32/fp16/bf16 (mixed in one
list), inf/-inf/NaN/subnormal/max-finite inputs, unscaling that overflows or underflows, and
several chunk/block/grid shapes (non-power-of-two blocks, blocks larger than a chunk, a grid
smaller than the chunk count)."""

from __future__ import annotations

import pytest
import torch
from helpers import flatten, run_both
from reference import FLOATS, assert_same_bits, make_grad

from amp_shim.engine import ops

# (chunk_size, block_size, max_grid)
CONFIGS = [(64, 32, 65535), (16, 96, 2), (128, 64, 1), (32, 1, 3)]
CONFIG_IDS = ["chunk64-block32", "chunk16-block96-grid2", "chunk128-block64-grid1", "chunk32-block1-grid3"]
INV_SCALES = [2.0**-16, 1.0, 4.0, 1.0 / 3.0, 2.0**-140]


def _config(c):
    return dict(chunk_size=c[0], block_size=c[1], max_grid=c[2])


def _sizes(chunk: int) -> list[int]:
    return [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk + 3, 5]


def _grads(sizes, dtypes, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    return [make_grad(n, dtypes[i % len(dtypes)], g, **kw) for i, n in enumerate(sizes)]


def _compare(a_tree, b_tree, what):
    a, b = flatten(a_tree), flatten(b_tree)
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert_same_bits(x, y, "%s[%d]" % (what, i))


MIXES = {"fp32": [torch.float32], "fp16": [torch.float16], "bf16": [torch.bfloat16], "mixed": list(FLOATS)}


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("mix", MIXES)
def test_unscale_matches_torch_in_one_launch(emulated, config, mix):
    chunk = config[0]
    for k, inv in enumerate(INV_SCALES):
        grads = _grads(_sizes(chunk), MIXES[mix], seed=k)
        if k % 2:  # one non-finite value, in the last chunk of the largest tensor
            grads[5][-1] = float("nan") if k % 4 == 1 else float("-inf")
        inputs = (grads, torch.zeros(1), torch.tensor(inv, dtype=torch.float32))
        t_in, _, k_in, _, backend = run_both(emulated, _config(config), ops.unscale_, inputs)
        _compare(k_in, t_in, "unscale inv=%r" % inv)  # includes found_inf
        if k % 2:
            assert k_in[1].item() == 1.0
        assert [name for name, _, _ in backend.launches] == ["amp_mt_unscale"]


@pytest.mark.parametrize("mix", MIXES)
def test_unscale_flag_is_clear_for_finite_grads_and_never_reset(emulated, mix):
    grads = _grads([1, 40, 64, 65, 300], MIXES[mix], seed=3, finite=True)
    for start in (0.0, 1.0):
        inputs = (grads, torch.full((1,), start), torch.tensor(2.0**-10))
        t_in, _, k_in, _, _ = run_both(emulated, _config(CONFIGS[0]), ops.unscale_, inputs)
        _compare(k_in, t_in, "finite unscale")
        assert k_in[1].item() == t_in[1].item() == start


def test_unscale_of_finite_values_overflowing_in_fp16_is_not_flagged(emulated):
    grads = [torch.full((70,), 60000.0, dtype=torch.float16)]
    inputs = (grads, torch.zeros(1), torch.tensor(4.0))
    t_in, _, k_in, _, _ = run_both(emulated, _config(CONFIGS[0]), ops.unscale_, inputs)
    _compare(k_in, t_in, "overflow on unscale")
    assert torch.isinf(k_in[0][0]).all() and k_in[1].item() == 0.0


@pytest.mark.parametrize("count", [0, 1, 2, 17])
def test_unscale_handles_any_number_of_tensors(emulated, count):
    grads = _grads([(7 * i) % 150 for i in range(count)], list(FLOATS), seed=count)
    inputs = (grads, torch.zeros(1), torch.tensor(2.0**-7))
    t_in, _, k_in, _, backend = run_both(emulated, _config(CONFIGS[0]), ops.unscale_, inputs)
    _compare(k_in, t_in, "unscale count=%d" % count)
    assert len(backend.launches) == (1 if any(g.numel() for g in grads) else 0)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=CONFIG_IDS[:2])
@pytest.mark.parametrize("mix", MIXES)
def test_unscale_add_matches_torch_and_checks_only_the_incoming_grads(emulated, config, mix):
    sizes = _sizes(config[0])
    for k, inv in enumerate(INV_SCALES[:4]):
        grads = _grads(sizes, MIXES[mix], seed=10 + k)
        stashed = [make_grad(g.numel(), g.dtype, torch.Generator().manual_seed(k)) for g in grads]
        inputs = (grads, stashed, torch.zeros(1), torch.tensor(inv))
        t_in, _, k_in, _, backend = run_both(emulated, _config(config), ops.unscale_add_, inputs)
        _compare(k_in, t_in, "unscale_add inv=%r" % inv)
        assert [name for name, _, _ in backend.launches] == ["amp_mt_unscale_add"]
    # A non-finite stash propagates but does not set the flag.
    grads = _grads([5, 70], MIXES[mix], seed=1, specials=False, finite=True)
    stashed = [torch.full_like(g, float("inf")) for g in grads]
    inputs = (grads, stashed, torch.zeros(1), torch.tensor(0.5))
    t_in, _, k_in, _, _ = run_both(emulated, _config(config), ops.unscale_add_, inputs)
    _compare(k_in, t_in, "unscale_add inf stash")
    assert k_in[2].item() == 0.0 and all(torch.isinf(g).all() for g in k_in[0])


def test_unscale_add_with_a_stash_of_another_type_matches_torch(emulated):
    g = torch.Generator().manual_seed(5)
    pairs = [(a, b) for a in FLOATS for b in FLOATS]
    grads = [make_grad(33, a, g) for a, _ in pairs]
    stashed = [make_grad(33, b, g) for _, b in pairs]
    inputs = (grads, stashed, torch.zeros(1), torch.tensor(2.0**-5))
    t_in, _, k_in, _, _ = run_both(emulated, _config(CONFIGS[0]), ops.unscale_add_, inputs)
    _compare(k_in, t_in, "unscale_add mixed types")


@pytest.mark.parametrize("mix", MIXES)
def test_plain_add_of_stashed_grads_matches_torch(emulated, mix):
    grads = _grads(_sizes(64), MIXES[mix], seed=2)
    stashed = [make_grad(g.numel(), g.dtype, torch.Generator().manual_seed(9)) for g in grads]
    t_in, _, k_in, _, backend = run_both(emulated, _config(CONFIGS[0]), ops.add_, (grads, stashed))
    _compare(k_in, t_in, "add_")
    assert [name for name, _, _ in backend.launches] == ["amp_mt_unscale_add"]


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("mix", ["fp16", "bf16", "mixed"])
def test_o2_model_grads_to_fp32_master_grads_written_or_accumulated_match_torch(emulated, config, mix):
    sizes = _sizes(config[0])
    for k, inv in enumerate(INV_SCALES):
        model = _grads(sizes, MIXES[mix], seed=20 + k)
        g = torch.Generator().manual_seed(100 + k)
        masters = [None if i % 2 else make_grad(n, torch.float32, g) for i, n in enumerate(sizes)]
        inputs = (model, masters, torch.zeros(1), torch.tensor(inv))
        t_in, t_out, k_in, k_out, backend = run_both(emulated, _config(config), ops.unscale_to_fp32_, inputs)
        _compare(k_out, t_out, "to_fp32 result inv=%r" % inv)
        _compare(k_in, t_in, "to_fp32 inputs inv=%r" % inv)
        assert [name for name, _, _ in backend.launches] == ["amp_mt_unscale_to_fp32"]
        for out, master in zip(k_out, k_in[1]):  # existing masters are updated in place
            assert master is None or out is master


def test_o2_to_fp32_flags_only_the_model_grads_not_the_existing_masters(emulated):
    model = [torch.ones(10, dtype=torch.float16)]
    masters = [torch.full((10,), float("nan"))]
    inputs = (model, masters, torch.zeros(1), torch.tensor(0.5))
    t_in, t_out, k_in, k_out, _ = run_both(emulated, _config(CONFIGS[0]), ops.unscale_to_fp32_, inputs)
    _compare(k_out, t_out, "to_fp32 nan master")
    assert k_in[2].item() == t_in[2].item() == 0.0


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_copy_masters_to_model_params_matches_torch_for_every_type_pair(emulated, config):
    g = torch.Generator().manual_seed(7)
    pairs = [(a, b) for a in FLOATS for b in FLOATS]
    sizes = _sizes(config[0])
    dst = [torch.empty(sizes[i % len(sizes)], dtype=a) for i, (a, _) in enumerate(pairs)]
    src = [make_grad(d.numel(), b, g) for d, (_, b) in zip(dst, pairs)]
    t_in, _, k_in, _, backend = run_both(emulated, _config(config), ops.copy_, (dst, src))
    _compare(k_in, t_in, "copy_")
    assert len(backend.launches) == 1
    # fp32 -> fp16 of values past fp16's range: inf, as torch.
    big = [torch.tensor([70000.0, -1e6, 65519.0, 65520.0])]
    half = [torch.empty(4, dtype=torch.float16)]
    t_in, _, k_in, _, _ = run_both(emulated, _config(config), ops.copy_, (half, big))
    _compare(k_in, t_in, "copy_ overflow")
