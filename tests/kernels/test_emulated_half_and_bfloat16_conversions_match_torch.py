"""The host emulation's software `__half` / `__nv_bfloat16` (kernels/emulate/cuda_emulate.h) convert
exactly as torch does: widening on all 65,536 bit patterns of each type, and narrowing
(round to nearest even, subnormals, overflow to inf) on every value those patterns widen to,
on the points halfway between neighbours (the ties), just off them, and on random floats.
NaN stays NaN (payloads are not compared: see reference.assert_same_bits)."""

from __future__ import annotations

import pytest
import torch
from reference import assert_same_bits

TYPES = {"half": torch.float16, "bf16": torch.bfloat16}


def _all_patterns(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("kind", TYPES)
def test_widening_matches_torch_on_all_65536_bit_patterns(emu, kind):
    values = _all_patterns(TYPES[kind])
    got = emu.to_float(values.view(torch.int16), kind)
    assert_same_bits(got, values.float(), "%s -> float" % kind)


def _narrowing_inputs(dtype: torch.dtype) -> torch.Tensor:
    widened = _all_patterns(dtype).float()
    finite = widened[torch.isfinite(widened)].double()
    ordered = torch.sort(torch.unique(finite)).values
    mids = (ordered[1:] + ordered[:-1]) / 2  # ties: exactly halfway (exact in float32 here)
    mids = mids.float()
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.full_like(mids, float("-inf")))
    rnd = (
        torch.randn(200_000, generator=torch.Generator().manual_seed(0))
        * torch.logspace(-45, 38, 200_000).float()
    )
    info = torch.finfo(dtype)
    edges = torch.tensor(
        [
            info.max,
            -info.max,
            float("inf"),
            float("-inf"),
            float("nan"),
            0.0,
            -0.0,
            3.0e38,
            1.0e-45,
            -1.0e-45,
            65519.0,
            65520.0,
            65536.0,
            5.9604645e-08,
            2.9802322e-08,
            2.9802326e-08,
            1.0e-40,
        ]
    )
    return torch.cat([widened, mids, up, down, rnd, edges])


@pytest.mark.parametrize("kind", TYPES)
def test_narrowing_rounds_to_nearest_even_like_torch(emu, kind):
    values = _narrowing_inputs(TYPES[kind])
    got = emu.from_float(values, kind).view(TYPES[kind])
    assert_same_bits(got, values.to(TYPES[kind]), "float -> %s" % kind)
    # Every NaN becomes the GPU's canonical NaN (0x7FFF), whatever torch's CPU path keeps.
    nan_bits = emu.from_float(torch.tensor([float("nan"), -float("nan")]), kind)
    assert nan_bits.tolist() == [0x7FFF, 0x7FFF]
