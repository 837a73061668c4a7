"""Apex's O1 cast tests (tests/L0/run_amp: test_basic_casts, test_promotion, test_cache, test_rnn),
rewritten device-agnostic for the shim's O1 `initialize`, which is `torch.autocast`.

Apex compared type strings ('torch.cuda.HalfTensor'); here HALF is the shim's autocast dtype on
the device (float16 unless AMP_SHIM_DTYPE=bfloat16). Where autocast on a device gives another
dtype than Apex's lists (softmax, pow, sum, `.cpu()`, ... on CPU), the test asserts the shim's
documented behaviour and says which docs/differences.md row lists it.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.amp.amp import _activate
from amp_shim.amp.autocast_casts import shim_dtype

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOAT = torch.float32


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def o1(device):
    """O1 as `amp.initialize` switches it on for `device`: autocast alone. (The old API's
    `amp.init()` adds Apex's own lists on top: tests/shim/test_legacy_init_casts.py.)"""
    handle = _activate(device)
    yield handle
    handle._deactivate()


def half(device):
    return shim_dtype(device)


def inputs(device, requires_grad=True):
    """The same data as a float and as a half tensor (Apex ran every check with both)."""
    base = torch.randn(4, 8, device=device)
    return [base.clone().requires_grad_(requires_grad), base.to(half(device)).requires_grad_(requires_grad)]


# Ops whose dtype under autocast on CPU differs from Apex O1's (docs/differences.md row 2 and
# row 33); on CUDA autocast runs them in float32 as Apex did.
def apex_float_or_input(device, x):
    return FLOAT if device == "cuda" else x.dtype


# -- test_basic_casts ---------------------------------------------------------------------------
class TestBasicCasts:
    @pytest.mark.parametrize(
        "make",
        [
            lambda d: nn.Linear(8, 5).to(d),
            lambda d: functools.partial(F.linear, weight=torch.randn(5, 8, device=d)),
        ],
        ids=["nn.Linear", "F.linear"],
    )
    def test_linear_outputs_half_for_half_and_float_inputs_with_grads_in_the_input_dtype(
        self, o1, device, make
    ):
        fn = make(device)
        for x in inputs(device):
            out = fn(x)
            assert out.dtype == half(device)
            out.float().sum().backward()
            assert x.grad.dtype == x.dtype

    def test_conv2d_outputs_half_for_half_and_float_inputs(self, o1, device):
        conv = nn.Conv2d(3, 4, 3).to(device)
        for dtype in (FLOAT, half(device)):
            x = torch.randn(2, 3, 6, 6, device=device, dtype=dtype, requires_grad=True)
            out = conv(x)
            assert out.dtype == half(device)
            out.float().sum().backward()
            assert x.grad.dtype == dtype

    def test_mse_loss_runs_in_float(self, o1, device):
        for x in inputs(device):
            assert nn.MSELoss()(x, x.detach().clone()).dtype == FLOAT

    @pytest.mark.parametrize(
        "op",
        [
            lambda x: F.softmax(x, dim=1),
            lambda x: nn.GroupNorm(2, 8).to(x.device)(x),
            lambda x: x.pow(2),
            lambda x: x**2,
            lambda x: x.sum(),
        ],
        ids=["softmax", "GroupNorm", "pow", "**", "sum"],
    )
    def test_apex_fp32_list_ops_follow_autocast_on_the_device(self, o1, device, op):
        """Apex: float. CUDA autocast: float. CPU autocast: the input dtype (rows 2 and 33)."""
        for x in inputs(device):
            assert op(x).dtype == apex_float_or_input(device, x)

    @pytest.mark.parametrize(
        "make",
        [
            lambda d: nn.ReLU(),
            lambda d: nn.BatchNorm1d(8).to(d),
            lambda d: nn.BatchNorm1d(8).to(d).eval(),
        ],
        ids=["ReLU", "BatchNorm-train", "BatchNorm-eval"],
    )
    def test_relu_and_batchnorm_match_the_input_dtype(self, o1, device, make):
        fn = make(device)
        for x in inputs(device):
            assert fn(x).dtype == x.dtype

    def test_matmul_and_the_matmul_operator_output_half(self, o1, device):
        for x in inputs(device):
            assert x.matmul(x.t()).dtype == half(device)
            assert (x @ x.t()).dtype == half(device)

    def test_tensor_cpu_keeps_the_dtype(self, o1, device):
        """Apex upcast `.cpu()` results to float; autocast does not touch `.cpu()` (docs/differences.md row 33)."""
        for x in inputs(device):
            assert x.cpu().dtype == x.dtype

    def test_binary_cross_entropy_on_half_raises_apex_error(self, o1, device):
        from amp_shim.amp.lists.functional_overrides import BANNED_FUNCS

        x = torch.rand(4, 8, device=device).to(half(device))
        target = torch.rand(4, 8, device=device)
        with pytest.raises(NotImplementedError) as info:
            nn.BCELoss()(x, target.to(x.dtype))
        assert str(info.value) == BANNED_FUNCS[0][1]
        with pytest.raises(NotImplementedError):
            F.binary_cross_entropy(x, target.to(x.dtype))
        assert F.binary_cross_entropy(x.float(), target).dtype == FLOAT  # float inputs are fine

    def test_binary_cross_entropy_with_allow_banned_returns_float(self, device):
        handle = _activate(device, allow_banned=True)
        try:
            x = torch.rand(4, 8, device=device).to(half(device))
            target = torch.rand(4, 8, device=device).to(x.dtype)
            assert nn.BCELoss()(x, target).dtype == FLOAT
            assert F.binary_cross_entropy(x, target).dtype == FLOAT
        finally:
            handle._deactivate()


# -- test_promotion -----------------------------------------------------------------------------
class TestPromotion:
    @pytest.mark.parametrize(
        "op",
        [torch.atan2, lambda a, b: a.atan2(b), torch.mul, lambda a, b: a.mul(b)],
        ids=["torch.atan2", "Tensor.atan2", "torch.mul", "Tensor.mul"],
    )
    def test_binary_ops_output_the_widest_input_type(self, o1, device, op):
        xf, xh = inputs(device)
        assert op(xf, xf).dtype == FLOAT
        assert op(xh, xh).dtype == half(device)
        for a, b in ((xf, xh), (xh, xf)):
            out = op(a, b)
            assert out.dtype == FLOAT
            out.sum().backward()
        assert xf.grad.dtype == FLOAT and xh.grad.dtype == half(device)

    def test_in_place_ops_keep_the_type_of_self(self, o1, device):
        xf, xh = inputs(device, requires_grad=False)
        assert xh.clone().add_(xf).dtype == half(device)
        assert xf.clone().add_(xh).dtype == FLOAT

    def test_cat_promotes_mixed_inputs_to_float_and_keeps_all_half(self, o1, device):
        xf, xh = inputs(device)
        assert torch.cat([xh, xf]).dtype == FLOAT
        assert torch.cat([xh, xh]).dtype == half(device)
        assert torch.stack([xh, xf]).dtype == FLOAT

    def test_in_place_fp32_list_op_on_half_is_allowed_and_stays_half(self, o1, device):
        """Apex raised NotImplementedError for `half.exp_()`; autocast allows it (docs/differences.md row 33)."""
        xf, xh = inputs(device, requires_grad=False)
        assert xh.clone().exp_().dtype == half(device)
        assert xf.clone().exp_().dtype == FLOAT


# -- test_cache ---------------------------------------------------------------------------------
def _weight(dtype, device):
    return nn.Parameter(torch.linspace(-1, 1, 64, device=device).view(8, 8).to(dtype))


class WhitelistModule(nn.Module):  # mm: cast down by autocast, weight used twice
    def __init__(self, dtype, device):
        super().__init__()
        self.weight = _weight(dtype, device)

    def forward(self, x):
        return x.mm(self.weight).mm(self.weight).float().sum()


class BlacklistModule(nn.Module):  # pow: Apex's fp32 list
    def __init__(self, dtype, device):
        super().__init__()
        self.weight = _weight(dtype, device)

    def forward(self, x):
        return (x + self.weight).pow(2).float().sum()


class PromoteModule(nn.Module):  # mul of mixed types: promotes
    def __init__(self, dtype, device):
        super().__init__()
        self.weight = _weight(dtype, device)

    def forward(self, x):
        return (x * self.weight * self.weight).float().sum()


@pytest.mark.parametrize("module_cls", [WhitelistModule, BlacklistModule, PromoteModule])
@pytest.mark.parametrize("weight_half", [False, True], ids=["fp32-weights", "half-weights"])
def test_cast_cache_gives_correct_grads_across_train_eval_no_grad_train(device, module_cls, weight_half):
    dtype = half(device) if weight_half else FLOAT
    reference = module_cls(FLOAT, device)
    x = torch.linspace(0, 1, 64, device=device).view(8, 8)
    reference(x).backward()
    expected = reference.weight.grad

    _amp_state.allow_incoming_model_not_fp32 = True
    model = module_cls(dtype, device)
    model, optimizer = amp.initialize(
        model, torch.optim.SGD(model.parameters(), lr=0.0), opt_level="O1", verbosity=0
    )
    _amp_state.loss_scalers[0]._loss_scale = 4.0

    def train_step():
        optimizer.zero_grad()
        loss = model(x)
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        return model.weight.grad.clone()

    first = train_step()
    model.eval()
    with torch.no_grad():
        model(x)  # an eval pass under no_grad: its casts must not serve the next training step
    model.train()
    second = train_step()
    _amp_state.handle._deactivate()

    assert first.dtype == dtype and second.dtype == dtype
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(first.float(), expected, rtol=2e-2, atol=2e-2)


# -- test_rnn -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cell_cls", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_rnn_cells_output_and_grads(o1, device, cell_cls):
    """Apex: every cell outputs HALF. CUDA autocast: the same. CPU autocast lowers RNNCell
    only; GRUCell and LSTMCell keep the input dtype (docs/differences.md row 34). Grads match the input dtype."""
    cell = cell_cls(8, 6).to(device)
    for x in inputs(device):
        out = cell(x)
        out = out[0] if isinstance(out, tuple) else out
        lowered = device == "cuda" or cell_cls is nn.RNNCell
        assert out.dtype == (half(device) if lowered else x.dtype)
        out.float().sum().backward()
        assert x.grad.dtype == x.dtype


@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_rnn_module_outputs_half_and_gru_keeps_float_on_cpu(o1, device, layers, bidirectional):
    if device != "cpu":
        pytest.skip("the CPU autocast behaviour is what this asserts (docs/differences.md row 34)")
    x = torch.randn(5, 2, 8, device=device)
    rnn_out, _ = nn.RNN(8, 6, num_layers=layers, bidirectional=bidirectional)(x)
    gru_out, _ = nn.GRU(8, 6, num_layers=layers, bidirectional=bidirectional)(x)
    assert rnn_out.dtype == half(device)  # as Apex
    assert gru_out.dtype == FLOAT  # Apex: HALF


def test_lstm_on_cpu_runs_under_bfloat16_o1(monkeypatch):
    """CPU float16 autocast cannot run nn.LSTM on float inputs (oneDNN has no fp16 LSTM
    primitive; docs/differences.md row 34); with AMP_SHIM_DTYPE=bfloat16 it runs and outputs bfloat16
    where torch's own bfloat16 autocast can run it (not on every CPU), and fails as torch's does where not."""
    monkeypatch.setenv("AMP_SHIM_DTYPE", "bfloat16")
    lstm, x = nn.LSTM(8, 6, num_layers=2, bidirectional=True), torch.randn(5, 2, 8)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(x)
        native_error = None
    except RuntimeError as exc:  # some CPUs' oneDNN has no bfloat16 LSTM primitive either
        native_error = str(exc).splitlines()[0]
    handle = _activate("cpu")
    try:
        if native_error is not None:
            with pytest.raises(RuntimeError) as raised:
                lstm(x)
            assert str(raised.value).splitlines()[0] == native_error  # as torch's own autocast
        else:
            out, _ = lstm(x)
            assert out.dtype == torch.bfloat16
    finally:
        handle._deactivate()


def test_packed_sequence_rnn_outputs_half(o1, device):
    if device != "cpu":
        pytest.skip("the CPU autocast behaviour is what this asserts")
    x = torch.randn(5, 3, 8)
    packed = nn.utils.rnn.pack_padded_sequence(x, [5, 4, 2])
    out, _ = nn.RNN(8, 6)(packed)
    assert out.data.dtype == half(device)
