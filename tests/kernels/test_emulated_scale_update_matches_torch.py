"""The device scale update (kernels/scale_update.cu) takes the same scale / counter / skip
sequence as the engine's torch path (ops.update_scale_, Apex's update_scale() in
`apex/amp/scaler.py`): halving floored at min_loss_scale (None and 0: no floor), doubling after the
window capped at max_loss_scale, static scalers that only count, a counter loaded above the
window, and Apex's own documented sequence (max=1024, min=256, window 3)."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import kernels_env

from amp_shim.engine import ops
from amp_shim.engine.loss_scaler import DeviceLossScaler

SETTINGS = [
    dict(dynamic=True, min_loss_scale=None, max_loss_scale=2.0**24, scale_window=3),
    dict(dynamic=True, min_loss_scale=256, max_loss_scale=1024.0, scale_window=3),
    dict(dynamic=True, min_loss_scale=0, max_loss_scale=float("inf"), scale_window=2),
    dict(dynamic=True, min_loss_scale=0.75, max_loss_scale=3.0, scale_window=1),
    dict(dynamic=False, min_loss_scale=None, max_loss_scale=2.0**24, scale_window=2000),
]


def _run(settings, start_scale, start_counter, flags):
    scale = torch.tensor(start_scale, dtype=torch.float64)
    unskipped = torch.tensor(start_counter, dtype=torch.int64)
    found = torch.zeros(1)
    seq = []
    for flag in flags:
        found.fill_(flag)
        skip = ops.update_scale_(scale, unskipped, found, **settings)
        assert skip.dtype == torch.bool and skip.shape == ()
        seq.append((scale.item(), unskipped.item(), bool(skip)))
    return seq


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "dyn" if s["dynamic"] else "static")
def test_update_sequence_matches_the_torch_path(emulated, settings):
    rng = random.Random(0)
    for start_scale, start_counter in [(1024.0, 0), (2.0**24, 0), (0.1, 5), (3.0e-300, 1), (65536.0, 4000)]:
        flags = [rng.choice([0.0, 0.0, 0.0, 1.0, 2.0]) for _ in range(40)]
        with kernels_env("torch"):
            expected = _run(settings, start_scale, start_counter, flags)
        with emulated() as backend:
            got = _run(settings, start_scale, start_counter, flags)
        assert got == expected, (start_scale, start_counter)
        assert {name for name, _, _ in backend.launches} == {"amp_update_scale"}


def test_apex_documented_sequence_on_the_device_scaler(emulated):
    with emulated():
        scaler = DeviceLossScaler(
            "dynamic", init_scale=2.0**16, max_loss_scale=1024.0, min_loss_scale=256, scale_window=3
        )
        seen = []
        for overflow in (True, True, True, True):
            scaler.found_inf.fill_(1.0 if overflow else 0.0)
            scaler.update_()
            seen.append(scaler.loss_scale())
        assert seen == [512.0, 256.0, 256.0, 256.0]
        clean = []
        for _ in range(7):
            scaler.found_inf.zero_()
            scaler.update_()
            clean.append((scaler.loss_scale(), scaler.unskipped_count()))
        assert clean == [(256, 1), (256, 2), (512, 0), (512, 1), (512, 2), (1024, 0), (1024, 1)]
