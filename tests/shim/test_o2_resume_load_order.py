"""O2 resume is bit for bit whichever side of `amp.initialize` the checkpoint is loaded on.

Apex's own checkpoint test (L0/run_amp/test_checkpointing.py) loads the model and optimizer
state into a fresh fp32 model before `amp.initialize` as well as after. Loaded before, the
fp32 values pass through initialize's cast to fp16; Apex then builds the masters (and recasts
momentum/Adam moments) from the fp16 copies, so training resumes from rounded values. The shim
builds the masters and their optimizer state from the fp32 values held just before the cast
(docs/differences.md row 6). Reference: the same training without the interruption."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from amp_shim import amp

N, M = 4, 4  # steps before the checkpoint, steps after it


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.bn, self.fc2 = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
}


def _batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)


def _step(model, opt, i):
    x, y = _batch(i)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    return loss.detach()


def _initialize(model, opt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return amp.initialize(model, opt, opt_level="O2", verbosity=0)


def _snapshot(model, opt, losses):
    return {
        "losses": torch.stack(losses),
        "model": copy.deepcopy(model.state_dict()),
        "masters": [m.detach().clone() for m in amp.master_params(opt)],
        "fp16": [p.detach().clone() for p in model.parameters()],
        # by param index: O2's lazy init moves state to the masters (state.pop/insert, as
        # Apex), so the dict's insertion order depends on when the state was created
        "optimizer": copy.deepcopy(dict(sorted(opt.state_dict()["state"].items()))),
    }


def _uninterrupted(make_opt):
    model = Net()
    model, opt = _initialize(model, make_opt(model.parameters()))
    losses = []
    checkpoint = None
    for i in range(N + M):
        if i == N:
            checkpoint = copy.deepcopy(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "amp": amp.state_dict()}
            )
            losses = []
        losses.append(_step(model, opt, i))
    return checkpoint, _snapshot(model, opt, losses)


def _resumed(make_opt, checkpoint, load_before_initialize):
    model = Net()
    opt = make_opt(model.parameters())
    if load_before_initialize:
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        model, opt = _initialize(model, opt)
    else:
        model, opt = _initialize(model, opt)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
    amp.load_state_dict(checkpoint["amp"])
    losses = [_step(model, opt, i) for i in range(N, N + M)]
    return _snapshot(model, opt, losses)


def _assert_same(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], "{}/{}".format(where, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, "{}[{}]".format(where, i))
    else:
        assert a == b, where


@pytest.mark.parametrize(
    "load_before_initialize", [True, False], ids=["load_then_initialize", "initialize_then_load"]
)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_o2_resume_is_bit_for_bit_whichever_side_of_initialize_the_checkpoint_is_loaded(
    name, load_before_initialize
):
    checkpoint, want = _uninterrupted(OPTIMIZERS[name])
    got = _resumed(OPTIMIZERS[name], checkpoint, load_before_initialize)
    _assert_same(want, got)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_o2_masters_and_their_state_are_the_checkpoints_fp32_values_when_loaded_before_initialize(name):
    checkpoint, _ = _uninterrupted(OPTIMIZERS[name])
    model = Net()
    opt = OPTIMIZERS[name](model.parameters())
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    model, opt = _initialize(model, opt)
    opt.zero_grad()  # lazy init builds the masters
    names = [n for n, _ in model.named_parameters()]
    for index, (key, master) in enumerate(zip(names, amp.master_params(opt))):
        saved = checkpoint["model"][key]
        assert master.dtype == torch.float32
        assert torch.equal(master, saved), key
        assert not torch.equal(saved, saved.half().float()) or "bn" in key  # not fp16-representable
        for state_key, value in checkpoint["optimizer"]["state"][index].items():
            assert torch.equal(opt.state[master][state_key], value), (key, state_key)
