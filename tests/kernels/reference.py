"""Torch references for what the kernels compute, where the engine's torch path is not already
one: the norm kernels' summation order (kernels/norm.cu), reproduced with float32 torch ops,
and test data with the values that matter (inf, NaN, subnormals, max finite, overflow on
unscaling)."""

from __future__ import annotations

from typing import Sequence

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# -- bit-exact comparison -----------------------------------------------------------------------


def bits(t: torch.Tensor) -> torch.Tensor:
    view = {4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.uint8}[t.element_size()]
    return t.contiguous().view(view)


def assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Equal dtypes, shapes, NaN positions, and bits everywhere else (so +0 != -0). NaN payloads
    are not compared: torch's CPU casts keep them in some code paths and not in others (and a
    GPU makes them canonical)."""
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if not actual.dtype.is_floating_point:
        assert torch.equal(actual, expected), what
        return
    nan_a, nan_e = actual.isnan(), expected.isnan()
    assert torch.equal(nan_a, nan_e), "%s: NaN positions differ" % what
    keep = ~nan_a
    a, e = bits(actual)[keep], bits(expected)[keep]
    if not torch.equal(a, e):
        where = (a != e).nonzero()[:5].flatten().tolist()
        raise AssertionError(
            "%s: %d of %d elements differ, e.g. %s vs %s"
            % (
                what,
                int((a != e).sum()),
                a.numel(),
                actual[keep][where].tolist(),
                expected[keep][where].tolist(),
            )
        )


# -- test data ----------------------------------------------------------------------------------


def special_values(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    tiny_sub = info.smallest_normal * info.eps  # the smallest subnormal
    return [
        float("inf"),
        float("-inf"),
        float("nan"),
        0.0,
        -0.0,
        info.max,
        -info.max,
        info.smallest_normal,
        -info.smallest_normal,
        tiny_sub,
        -tiny_sub,
        tiny_sub * 3,
        info.smallest_normal / 2,
        1.0,
        -1.0,
        0.5,
        3.0,
        info.max / 2,
    ]


def make_grad(
    numel: int, dtype: torch.dtype, generator: torch.Generator, *, specials: bool = True, finite: bool = False
) -> torch.Tensor:
    """Normal values at several magnitudes, with special values sprinkled in."""
    base = torch.randn(numel, generator=generator, dtype=torch.float64)
    mags = torch.tensor([1e-6, 1e-3, 1.0, 1e3, 3e4], dtype=torch.float64)
    pick = torch.randint(0, len(mags), (numel,), generator=generator)
    values = base * mags[pick]
    if finite:
        limit = torch.finfo(dtype).max
        values = values.clamp(-limit, limit)
    out = values.to(dtype)
    if specials and numel:
        values = special_values(dtype)
        if finite:
            values = [v for v in values if v == v and abs(v) != float("inf")]
        count = max(1, numel // 8)
        where = torch.randint(0, numel, (count,), generator=generator)
        which = torch.randint(0, len(values), (count,), generator=generator)
        out[where] = torch.tensor([values[i] for i in which.tolist()], dtype=torch.float64).to(dtype)
    return out


# -- the norm kernels' summation order ---------------------------------------------------------


def _thread_sums(squares: torch.Tensor, block: int) -> torch.Tensor:
    """Thread t's sequential float32 sum of squares[t], squares[t + block], ... (from 0.0f)."""
    acc = torch.zeros(block, dtype=torch.float32)
    for start in range(0, squares.numel(), block):
        row = squares[start : start + block]
        acc[: row.numel()] = acc[: row.numel()] + row
    return acc


def _block_sum(values: torch.Tensor) -> torch.Tensor:
    """amp_block_sum's tree (kernels/multi_tensor.cuh) over one value per thread."""
    s = values.clone()
    b = s.numel()
    p = 1
    while p * 2 <= b:
        p *= 2
    if b > p:
        s[: b - p] = s[: b - p] + s[p:b]
    h = p // 2
    while h > 0:
        s[:h] = s[:h] + s[h : 2 * h]
        h //= 2
    return s[0].clone()


def kernel_order_norm(
    values: Sequence[torch.Tensor], chunk: int, block: int, final_block: int
) -> torch.Tensor:
    """sqrt of the sum of squares of `values` (float32, one per tensor), summed exactly as
    amp_mt_*_norm + amp_norm_finalize do for that chunk size and those block sizes."""
    partials = []
    for v in values:
        v = v.reshape(-1).to(torch.float32)
        for start in range(0, v.numel(), chunk):
            piece = v[start : start + chunk]
            partials.append(_block_sum(_thread_sums(piece * piece, block)))
    partial = torch.stack(partials) if partials else torch.zeros(0, dtype=torch.float32)
    total = _block_sum(_thread_sums(partial, final_block))
    # Correctly rounded square root (as __fsqrt_rn and the host's sqrtss): through float64, which
    # rounds a float32's square root exactly once more without error. Not torch.sqrt on float32:
    # on the CPU it is not correctly rounded (it differs in the last bit for ~19% of inputs here).
    return total.double().sqrt().float()


def float64_norm(values: Sequence[torch.Tensor]) -> float:
    return float(sum(float((v.double() ** 2).sum()) for v in values) ** 0.5)
