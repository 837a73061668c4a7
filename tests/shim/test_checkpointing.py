"""Checkpointing within one process, ported device-agnostic from what Apex's own
`test_checkpointing.py` checks (an L0 test that needs CUDA): a model restored mid-run from
`{model, optimizer, amp}` trains on bit for bit with the original, the model's state_dict is
all fp32, forced overflows halve each loss's scale the expected number of times, and O0-O2
still train with Adam.

Apex's test could not check `amp.state_dict()` in the same script (its FIXME): a second
`initialize` rebuilds the scalers. Like Apex, the original and the restored run use disjoint
`loss_id`s of one amp state; unlike Apex, the restored half is loaded from the checkpoint, so
the scale state is part of what must match."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn, optim

from amp_shim import amp
from amp_shim.amp import _amp_state

LEVELS = ("O0", "O1", "O2", "O3")
LR = 1e-3
EPOCHS = 10
RESTORE_AFTER = EPOCHS // 2


class MyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(6)
        self.param = nn.Parameter(torch.randn(1))

    def forward(self, x):
        x = x * self.param
        x = F.relu(self.conv1(x))
        return self.bn1(x)


def deactivate_o1() -> None:
    """What Apex's tests do between initializations in one process."""
    handle = getattr(_amp_state, "handle", None)
    if handle is not None:
        handle._deactivate()


def train_step(model, optimizer, data, loss_ids):
    optimizer.zero_grad()
    output = model(data)
    for idx in loss_ids:
        loss = output.mean()
        with amp.scale_loss(loss, optimizer, loss_id=idx) as scaled_loss:
            scaled_loss.backward(retain_graph=True)
    optimizer.step()
    return output


def assert_state_dicts_equal(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


def both_halves(amp_state: dict, num_losses: int) -> dict:
    """The saved scalers 0..n-1, loaded into positions 0..n-1 and again into n..2n-1."""
    entries = list(amp_state.values())
    return {f"loss_scaler{i}": dict(entries[i % num_losses]) for i in range(2 * num_losses)}


@pytest.mark.parametrize("num_losses", [1, 2])
@pytest.mark.parametrize("amp_before_load", [True, False], ids=["amp-before-load", "amp-after-load"])
@pytest.mark.parametrize("opt_level", LEVELS)
def test_restored_model_trains_on_bit_for_bit_with_the_original(opt_level, amp_before_load, num_losses):
    torch.manual_seed(2319)
    model = MyModel()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=opt_level, num_losses=2 * num_losses, verbosity=0
    )
    original_ids, restored_ids = range(num_losses), range(num_losses, 2 * num_losses)
    compared = 0
    for epoch in range(EPOCHS):
        x = torch.randn(4, 3, 8, 8)
        output = train_step(model, optimizer, x, original_ids)
        if epoch == RESTORE_AFTER - 1:
            checkpoint = copy.deepcopy(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}
            )
            assert all(
                t.dtype == torch.float32
                for k, t in checkpoint["model"].items()
                if not k.endswith("num_batches_tracked")
            ), checkpoint["model"]
            scalers_before = list(_amp_state.loss_scalers)
            restore_model = MyModel()
            restore_optimizer = optim.SGD(restore_model.parameters(), lr=LR)
            if amp_before_load:
                deactivate_o1()
                restore_model, restore_optimizer = amp.initialize(
                    restore_model,
                    restore_optimizer,
                    opt_level=opt_level,
                    num_losses=2 * num_losses,
                    verbosity=0,
                )
            restore_model.load_state_dict(checkpoint["model"])
            restore_optimizer.load_state_dict(checkpoint["optimizer"])
            if not amp_before_load:
                deactivate_o1()
                restore_model, restore_optimizer = amp.initialize(
                    restore_model,
                    restore_optimizer,
                    opt_level=opt_level,
                    num_losses=2 * num_losses,
                    verbosity=0,
                )
            assert all(a is not b for a, b in zip(scalers_before, _amp_state.loss_scalers))
            amp.load_state_dict(both_halves(checkpoint["amp"], num_losses))
        elif epoch >= RESTORE_AFTER:
            restore_output = train_step(restore_model, restore_optimizer, x, restored_ids)
            assert_state_dicts_equal(model, restore_model)
            assert output.dtype == restore_output.dtype
            assert torch.equal(output, restore_output), f"epoch {epoch}"
            compared += 1
    assert compared == EPOCHS - RESTORE_AFTER
    state = amp.state_dict()
    for i in original_ids:
        assert state[f"loss_scaler{i}"] == state[f"loss_scaler{i + num_losses}"]


@pytest.mark.parametrize("opt_level", LEVELS)
def test_forced_overflows_halve_each_loss_scale_as_often_as_they_occur(opt_level):
    decreases = [0, 1, 2]
    num_losses = len(decreases)
    torch.manual_seed(0)
    model = MyModel()
    optimizer = optim.SGD(model.parameters(), lr=LR)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=opt_level, num_losses=num_losses, verbosity=0
    )
    if _amp_state.opt_properties.loss_scale != "dynamic":
        assert opt_level in ("O0", "O3")
        return
    initial = [_amp_state.loss_scalers[i].loss_scale() for i in range(num_losses)]
    x = torch.randn(4, 3, 8, 8)
    for idx, times in enumerate(decreases):
        for _ in range(times):
            optimizer.zero_grad()
            loss = model(x * 2**17).mean()
            with amp.scale_loss(loss, optimizer, loss_id=idx) as scaled_loss:
                scaled_loss.backward(retain_graph=True)
            optimizer.step()
    for idx, times in enumerate(decreases):
        assert _amp_state.loss_scalers[idx].loss_scale() == initial[idx] / 2**times
    state = amp.state_dict()
    for (key, entry), times, init in zip(state.items(), decreases, initial):
        assert entry["loss_scale"] == init / 2**times, key
        assert entry["unskipped"] == 0, key


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2"])
def test_model_state_dict_is_fp32_and_training_with_adam_lowers_the_loss(opt_level):
    torch.manual_seed(7)
    model = MyModel()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    assert not any(t.dtype == torch.float16 for t in model.state_dict().values())
    data = torch.randn(10, 3, 4, 4)
    target = torch.randn(10, 6, 4, 4)
    last_loss = None
    for _ in range(11):
        optimizer.zero_grad()
        loss = F.mse_loss(model(data), target)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        if last_loss is not None:
            assert loss.item() < last_loss
        last_loss = loss.item()
