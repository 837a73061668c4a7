"""The old API's `amp.init()` follows Apex's own O1 lists where autocast's differ (on the CPU:
softmax, group_norm, pow, sum, `.cpu()` in float32; RNN cells and RNNs in half; in-place fp32
ops on half raise), while O1 `amp.initialize` stays autocast alone, its native recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import amp
from amp_shim.amp.amp import _activate
from amp_shim.amp.autocast_casts import shim_dtype

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

FP32_LIST_OPS = {
    "softmax": lambda x: F.softmax(x, dim=1),
    "nn.Softmax": lambda x: nn.Softmax(dim=1)(x),
    "GroupNorm": lambda x: nn.GroupNorm(2, 8).to(x.device)(x),
    "pow": lambda x: x.pow(2),
    "**": lambda x: x**2.0,
    "sum": lambda x: x.sum(),
    "torch.exp": lambda x: torch.exp(x),
    "cpu": lambda x: x.cpu(),
}


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def init(device):
    handle = _activate(device, apex_lists=True)  # what amp.init() does on that device
    yield handle
    handle._deactivate()


def _inputs(device, requires_grad=True):
    base = torch.randn(4, 8, device=device)
    return [
        base.clone().requires_grad_(requires_grad),
        base.to(shim_dtype(device)).requires_grad_(requires_grad),
    ]


@pytest.mark.parametrize("op", list(FP32_LIST_OPS), ids=list(FP32_LIST_OPS))
def test_apex_fp32_list_runs_in_float_with_grads_in_the_input_dtype(init, device, op):
    for x in _inputs(device):
        y = FP32_LIST_OPS[op](x)
        assert y.dtype == torch.float32
        y.float().sum().backward()
        assert x.grad.dtype == x.dtype


def test_init_picks_the_device_and_installs_the_lists():
    handle = amp.init()
    try:
        assert F.softmax(torch.randn(2, 3).half().to(handle._casts.device_type), dim=1).dtype == torch.float32
    finally:
        handle._deactivate()


@pytest.mark.parametrize("op", ["exp_", "log_", "pow_"])
def test_in_place_fp32_method_on_half_raises_apex_error(init, device, op):
    half = torch.rand(4, device=device).to(shim_dtype(device)) + 1
    args = (2.0,) if op == "pow_" else ()
    with pytest.raises(NotImplementedError, match=f"Cannot call in-place method {op} on fp16 Tensors."):
        getattr(half, op)(*args)
    full = torch.rand(4, device=device) + 1
    assert getattr(full, op)(*args) is full


def test_in_place_fp32_function_on_half_raises_apex_error(init, device):
    half = torch.rand(4, device=device).to(shim_dtype(device))
    with pytest.raises(NotImplementedError, match="Cannot call in-place function exp_ with fp16 arguments."):
        torch.exp_(half)


def test_disable_casts_turns_the_lists_and_the_checks_off(init, device):
    half = torch.rand(4, 8, device=device).to(shim_dtype(device))
    with amp.disable_casts():
        assert F.softmax(half, dim=1).dtype == half.dtype
        assert half.clone().exp_().dtype == half.dtype


@pytest.mark.parametrize("cell_cls", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_rnn_cells_output_half_with_grads_in_the_input_dtype(init, device, cell_cls):
    cell = cell_cls(8, 6).to(device)
    for x in _inputs(device):
        out = cell(x)
        out = out[0] if isinstance(out, tuple) else out
        assert out.dtype == shim_dtype(device)
        out.float().sum().backward()
        assert x.grad.dtype == x.dtype


@pytest.mark.parametrize("rnn_cls", [nn.RNN, nn.GRU, nn.LSTM])
def test_rnns_output_half_also_packed(init, device, rnn_cls):
    rnn = rnn_cls(8, 6, num_layers=2, bidirectional=True).to(device)
    x = torch.randn(5, 3, 8, device=device, requires_grad=True)
    out, _ = rnn(x)
    assert out.dtype == shim_dtype(device)
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and rnn.weight_ih_l0.grad.dtype == torch.float32
    packed = nn.utils.rnn.pack_padded_sequence(x.detach(), [5, 4, 2])
    assert rnn(packed)[0].data.dtype == shim_dtype(device)


def test_deactivate_restores_every_function_and_rnn_dispatch(device):
    originals = (F.softmax, torch.Tensor.sum, torch.Tensor.exp_, torch.exp_, torch.nn.modules.rnn._VF)
    handle = _activate(device, apex_lists=True)
    assert F.softmax is not originals[0] and torch.nn.modules.rnn._VF is not torch._VF
    handle._deactivate()
    assert (F.softmax, torch.Tensor.sum, torch.Tensor.exp_, torch.exp_, torch.nn.modules.rnn._VF) == originals


def test_o1_initialize_stays_autocast_alone():
    """O1's native migration is torch.autocast; the Apex lists would break that identity."""
    softmax = F.softmax
    model = nn.Linear(8, 8)
    model, _ = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)
    half = torch.randn(4, 8).to(shim_dtype("cpu"))
    with torch.autocast("cpu", dtype=shim_dtype("cpu")):
        native = F.softmax(half, dim=1).dtype
    assert F.softmax(half, dim=1).dtype == native == half.dtype
    assert F.softmax is softmax and torch.nn.modules.rnn._VF is torch._VF
