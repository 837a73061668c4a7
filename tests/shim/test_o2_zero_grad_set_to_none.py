"""`optimizer.zero_grad(set_to_none=...)` on an O2-patched optimizer.

Apex's patched `zero_grad(self)` takes no arguments (TypeError on `set_to_none`, Apex #1196):
it zeroes the model grads in place (fp16 params and fp32 params without a master) and sets the
fp32 master grads to None. The shim keeps that for `zero_grad()` and `set_to_none=False`, and
with `set_to_none=True` sets the model grads to None too; training continues identically."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state

X = torch.linspace(-1.0, 1.0, 8 * 4).reshape(8, 4)
Y = torch.linspace(0.5, -0.5, 8 * 2).reshape(8, 2)


class Net(nn.Module):
    """fp16 Linears around an fp32 BatchNorm (a param without a master under O2)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.bn, self.fc2 = nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _o2():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0)
    _amp_state.loss_scalers[0]._loss_scale = 128.0
    return model, opt


def _backward(model, opt):
    loss = torch.nn.functional.mse_loss(model(X), Y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()


def _train(zero_grad_kwargs, steps=4):
    model, opt = _o2()
    for _ in range(steps):
        opt.zero_grad(**zero_grad_kwargs)
        _backward(model, opt)
        opt.step()
    return model, opt


def test_o2_zero_grad_set_to_none_true_clears_model_and_master_grads():
    model, opt = _o2()
    opt.zero_grad()
    _backward(model, opt)
    assert all(p.grad is not None for p in model.parameters())
    assert all(m.grad is not None for m in amp.master_params(opt))
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    assert all(m.grad is None for m in amp.master_params(opt))


@pytest.mark.parametrize(
    "args,kwargs",
    [((), {}), ((), {"set_to_none": False}), ((False,), {})],
    ids=["no_args", "set_to_none_false", "positional_false"],
)
def test_o2_zero_grad_without_set_to_none_is_apexs_zero_in_place(args, kwargs):
    model, opt = _o2()
    opt.zero_grad()
    _backward(model, opt)
    model_grads = {id(p): p.grad for p in model.parameters()}
    opt.zero_grad(*args, **kwargs)
    for p in model.parameters():  # the same tensors, zeroed in place
        assert p.grad is model_grads[id(p)] and not p.grad.any()
    fp16_masters = opt._amp_stash.all_fp32_from_fp16_params
    assert fp16_masters and all(m.grad is None for m in fp16_masters)


def test_o2_training_with_set_to_none_true_is_bit_for_bit_training_with_apexs_zero_grad():
    a, opt_a = _train({})
    b, opt_b = _train({"set_to_none": True})
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(x, y)
    for x, y in zip(amp.master_params(opt_a), amp.master_params(opt_b)):
        assert torch.equal(x, y)
