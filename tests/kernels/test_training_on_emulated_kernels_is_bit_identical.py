"""Whole Apex-style training loops (amp.initialize + scale_loss + step, with gradient
accumulation and overflow) running on the emulated kernels through ops.py give the same
losses, loss scales, skip decisions and parameters, bit for bit, as on the torch path, launch
the kernels for every per-tensor op and for the scale update, and still cost at most one host
sync per iteration."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import kernels_env
from reference import assert_same_bits
from torch import nn

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.engine.host_syncs import CountHostSyncs
from shim_state import reset_amp_state


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 40)
        self.bn = nn.BatchNorm1d(40)  # stays fp32 under O2: the fp32-from-fp32 master path
        self.fc2 = nn.Linear(40, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _train(level, steps=6, accumulate=2, **kwargs):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0, **kwargs)
    g = torch.Generator().manual_seed(1)
    record, syncs = [], []
    for step in range(steps):
        counter = CountHostSyncs()
        with counter:
            opt.zero_grad()
            for micro in range(accumulate):
                x = torch.randn(6, 8, generator=g)
                if level == "O2":
                    x = x.half()
                loss = F.mse_loss(model(x).float(), torch.zeros(6, 3))
                if step == 3 and micro == 0 and "loss_scale" not in kwargs:
                    loss = loss * float("inf")  # an overflow: skipped step, halved scale
                    # (not for static scalers, which apply it and turn everything NaN)
                # Odd steps accumulate scaled grads (delay_unscale), even steps unscale each
                # backward and recombine it with the stashed grads (Apex's axpby path).
                delay = step % 2 == 1 and micro < accumulate - 1
                with amp.scale_loss(loss, opt, delay_unscale=delay) as scaled:
                    scaled.backward()
            opt.step()
        syncs.append(len(counter.calls))
        record.append((float(loss.detach().float()), _amp_state.loss_scalers[0].loss_scale()))
    params = [p.detach().clone() for p in model.parameters()]
    masters = [p.detach().clone() for p in amp.master_params(opt)]
    reset_amp_state()
    return record, params, masters, syncs


@pytest.mark.parametrize(
    "level, kwargs",
    [
        ("O1", {}),
        ("O2", {}),
        ("O2", {"loss_scale": 1.0}),
        ("O2", {"loss_scale": 128.0}),
        ("O1", {"min_loss_scale": 2.0**15, "max_loss_scale": 2.0**17}),
    ],
    ids=["O1", "O2", "O2-static-1", "O2-static-128", "O1-min-max"],
)
def test_training_matches_the_torch_path_bit_for_bit(emulated, level, kwargs):
    with kernels_env("torch"):
        expected = _train(level, **kwargs)
    with emulated(chunk_size=64, block_size=32) as backend:
        got = _train(level, **kwargs)
    assert got[0] == expected[0]  # losses and loss scales, step by step
    for name, a_list, b_list in (("param", got[1], expected[1]), ("master", got[2], expected[2])):
        for i, (a, b) in enumerate(zip(a_list, b_list)):
            assert_same_bits(a, b, "%s %d" % (name, i))
    assert max(got[3][1:]) <= 1, got[3]  # at most one host sync per steady-state iteration
    names = {name for name, _, _ in backend.launches}
    assert "amp_update_scale" in names
    assert "amp_mt_unscale_add" in names  # stashed grads recombined (O2: the fp32 BN params)
    if level == "O2":
        assert {"amp_mt_unscale_to_fp32", "amp_mt_copy"} <= names
    else:
        assert "amp_mt_unscale" in names
