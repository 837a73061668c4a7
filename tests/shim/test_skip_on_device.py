"""The skipped step after an overflow, decided on the device, for optimizers whose step supports
amp scaling (`_step_supports_amp_scaling`: `torch.optim.AdamW(fused=True)`, the shim's
FusedSGD, FusedAdam(capturable=True)); docs/differences.md row 42.

Such an optimizer gets the decision as torch.amp.GradScaler hands it over (`found_inf`, with
`grad_scale=None`), so an iteration takes no host sync, overflow or not. What must not change
against the host path (`_step_supports_amp_scaling` switched off, the path every other optimizer
takes): parameters, O2 masters, optimizer state with its step counts, the loss scales and
counters, and Apex's messages, with the same loss id and scale, in order.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_shim import amp
from amp_shim.amp._amp_state import _amp_state
from amp_shim.engine import skip
from amp_shim.engine.host_syncs import CountHostSyncs
from amp_shim.optimizers import FusedAdam, FusedMixedPrecisionLamb, FusedSGD

SKIP_MSG = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"
INF = float("inf")

OPTIMIZERS = {
    "torch_adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "torch_sgd_fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "apex_fused_sgd": lambda p: FusedSGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "apex_fused_adam_capturable": lambda p: FusedAdam(p, lr=1e-2, weight_decay=0.1, capturable=True),
    "torch_adagrad_fused": lambda p: torch.optim.Adagrad(p, lr=0.05, fused=True),
}
# Supports amp scaling but reads found_inf on the host itself (docs/differences.md row 25).
SELF_READING = {"apex_fused_mixed_precision_lamb": lambda p: FusedMixedPrecisionLamb(p, lr=1e-2)}


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _init(level, make, *, host_path=False, num_losses=1, model=None):
    model = model if model is not None else _mlp()
    opt = make(model.parameters())
    if host_path:
        opt._step_supports_amp_scaling = False  # the reference: today's host path
    model, opt = amp.initialize(model, opt, opt_level=level, num_losses=num_losses, verbosity=1)
    return model, opt


def _iteration(model, opt, i, overflow=False, loss_id=0):
    opt.zero_grad()
    g = torch.Generator().manual_seed(i)
    x = torch.randn(4, 8, generator=g)
    loss = F.mse_loss(model(x).float(), torch.randn(4, 4, generator=g))
    if overflow:
        loss = loss * INF
    with amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
        scaled.backward()
    opt.step()


def _skip_lines(text):
    return [line for line in text.splitlines() if line.startswith("Gradient overflow.")]


def _counted(fn):
    counter = CountHostSyncs()
    with counter:
        fn()
    return counter.calls


def _snapshot(model, opt):
    """Everything a skipped step must leave alone, as plain values."""
    sd = opt.state_dict()
    state = {
        k: {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in s.items()}
        for k, s in sd["state"].items()
    }
    groups = [
        {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return {
        "model": [p.detach().clone() for p in model.parameters()],
        "stepped": [p.detach().clone() for g in opt.param_groups for p in g["params"]],
        "state": state,
        "groups": groups,
        "scalers": [(s.scale.clone(), s.unskipped.clone()) for s in _amp_state.loss_scalers],
    }


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in ("model", "stepped"):
        assert len(a[key]) == len(b[key])
        for x, y in zip(a[key], b[key]):
            assert x.dtype == y.dtype and torch.equal(x, y), key
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert a["state"][k].keys() == b["state"][k].keys()
        for n in a["state"][k]:
            x, y = a["state"][k][n], b["state"][k][n]
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), (k, n)
            else:
                assert x == y, (k, n)
    for ga, gb in zip(a["groups"], b["groups"]):
        assert ga.keys() == gb.keys()
        for n in ga:
            if isinstance(ga[n], torch.Tensor):
                assert torch.equal(ga[n], gb[n]), n
            else:
                assert ga[n] == gb[n], n
    for (sa, ua), (sb, ub) in zip(a["scalers"], b["scalers"]):
        assert torch.equal(sa, sb) and torch.equal(ua, ub)


# 0 host syncs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_fused_optimizer_iterations_take_no_host_sync_even_when_they_overflow(level, name, capsys):
    model, opt = _init(level, OPTIMIZERS[name])
    _iteration(model, opt, 0)  # the first real step creates the optimizer state
    capsys.readouterr()
    overflows = [False, True, False, True, True, False]
    calls = _counted(lambda: [_iteration(model, opt, i + 1, o) for i, o in enumerate(overflows)])
    assert calls == []
    assert _skip_lines(capsys.readouterr().out) == [
        SKIP_MSG.format(0, 32768.0),
        SKIP_MSG.format(0, 16384.0),
        SKIP_MSG.format(0, 8192.0),
    ]


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_non_amp_scaling_optimizers_keep_the_one_sync_host_path(level):
    model, opt = _init(level, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    _iteration(model, opt, 0)
    assert _counted(lambda: _iteration(model, opt, 1, overflow=True)) == ["tolist"]
    assert _counted(lambda: _iteration(model, opt, 2)) == ["tolist"]


def test_a_skipped_first_step_takes_the_host_path_and_leaves_the_lazy_state_absent(capsys):
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    capsys.readouterr()
    before = [p.detach().clone() for p in model.parameters()]
    assert _counted(lambda: _iteration(model, opt, 0, overflow=True)) == ["tolist"]
    assert len(opt.state) == 0  # torch's fused AdamW would have created zero moments, step 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]
    assert _counted(lambda: _iteration(model, opt, 1)) == ["tolist"]  # creates the state
    assert _counted(lambda: _iteration(model, opt, 2, overflow=True)) == []


# Bit-identical to the host path ----------------------------------------------------------------

OVERFLOWS = {0, 3, 4, 8, 11}  # the first step, two in a row, isolated ones


@pytest.mark.parametrize("name", sorted(OPTIMIZERS) + sorted(SELF_READING))
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_device_skip_leaves_params_state_and_scale_bit_identical_to_the_host_path(level, name, capsys):
    make = {**OPTIMIZERS, **SELF_READING}[name]

    def run(host_path):
        model, opt = _init(level, make, host_path=host_path)
        capsys.readouterr()
        snapshots, syncs = [], 0
        for i in range(14):
            calls = _counted(lambda i=i: _iteration(model, opt, i, overflow=i in OVERFLOWS))
            syncs += len(calls)
            snapshots.append(_snapshot(model, opt))
        return snapshots, _skip_lines(capsys.readouterr().out), syncs

    device, device_lines, device_syncs = run(host_path=False)
    host, host_lines, host_syncs = run(host_path=True)
    for a, b in zip(device, host):
        _assert_identical(a, b)
    assert device_lines == host_lines and len(host_lines) == len(OVERFLOWS)
    assert host_syncs == 14
    if name in SELF_READING:
        assert device_syncs == 14
    elif name == "torch_adagrad_fused":
        assert device_syncs == 0  # its state exists from construction on
    else:
        # the host path until the optimizer state exists: the skipped first step, the first real one
        assert device_syncs == 2


def test_device_skip_keeps_torch_fused_adamw_step_counts_of_real_steps_only():
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    for i in range(6):
        _iteration(model, opt, i, overflow=i in (2, 3))
    steps = {float(s["step"]) for s in opt.state.values()}
    assert steps == {4.0}  # incremented, then decremented by found_inf inside torch's step


def test_device_skip_under_o2_clears_the_master_grads_and_keeps_model_and_masters():
    model, opt = _init("O2", OPTIMIZERS["torch_adamw_fused"])
    _iteration(model, opt, 0)
    masters = opt._amp_stash.all_fp32_from_fp16_params
    before_masters = [m.detach().clone() for m in masters]
    before_model = [p.detach().clone() for p in model.parameters()]
    assert _counted(lambda: _iteration(model, opt, 1, overflow=True)) == []
    assert all(m.grad is None for m in masters)
    assert all(torch.equal(a, b) for a, b in zip(before_masters, masters))
    assert all(torch.equal(a, b) for a, b in zip(before_model, model.parameters()))


# The message ------------------------------------------------------------------------------------


def test_device_skip_message_names_the_loss_that_overflowed_and_its_reduced_scale(capsys):
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"], num_losses=2)
    _iteration(model, opt, 0)
    capsys.readouterr()

    def two_losses(i, overflow_in):
        opt.zero_grad()
        for loss_id in (0, 1):
            loss = model(torch.ones(2, 8)).float().mean()
            if loss_id == overflow_in:
                loss = loss * INF
            with amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
                scaled.backward()
        opt.step()

    calls = _counted(lambda: (two_losses(1, 1), two_losses(2, None), two_losses(3, 0)))
    assert calls == []
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(1, 32768.0), SKIP_MSG.format(0, 32768.0)]


def test_device_skip_message_respects_verbosity_zero(capsys):
    model, opt = _init("O1", OPTIMIZERS["apex_fused_sgd"])
    _amp_state.verbosity = 0
    _iteration(model, opt, 0)
    _iteration(model, opt, 1, overflow=True)
    assert _skip_lines(capsys.readouterr().out) == []


class _InFlight:
    """A CUDA event stand-in: the copy lands when the test says so."""

    def __init__(self):
        self.landed = False
        self.waited = False

    def query(self):
        return self.landed

    def synchronize(self):
        self.waited = True
        self.landed = True


@pytest.fixture
def in_flight(monkeypatch):
    """Make every device-path record behave like a CUDA copy still in flight."""
    events = []
    original = skip._queue_skip_record

    def queue(record, scalers, verbose):
        original(record, scalers, verbose)
        host, _, scalers_, verbose_ = skip.landing[-1]
        events.append(_InFlight())
        skip.landing[-1] = (host.clone(), events[-1], scalers_, verbose_)

    monkeypatch.setattr(skip, "_queue_skip_record", queue)
    yield events
    skip.landing.clear()


def test_a_message_whose_copy_is_in_flight_is_printed_once_it_lands_in_order(in_flight, capsys):
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    _iteration(model, opt, 0)
    capsys.readouterr()
    _iteration(model, opt, 1, overflow=True)
    _iteration(model, opt, 2, overflow=True)
    assert _skip_lines(capsys.readouterr().out) == []  # not landed: nothing waits for it
    in_flight[0].landed = True
    calls = _counted(lambda: _iteration(model, opt, 3))
    assert calls == []
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]
    assert not in_flight[0].waited
    for event in in_flight[1:]:
        event.landed = True
    with amp.scale_loss(model(torch.ones(1, 8)).float().mean(), opt) as scaled:
        scaled.backward()  # scale_loss also prints what has landed
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 16384.0)]


def test_a_host_path_step_prints_in_flight_device_messages_first(in_flight, capsys):
    model = _mlp()
    fused = torch.optim.AdamW(model[0].parameters(), lr=1e-2, fused=True)
    plain = torch.optim.SGD(model[2].parameters(), lr=0.05, momentum=0.9)
    model, (fused, plain) = amp.initialize(model, [fused, plain], opt_level="O1", num_losses=2, verbosity=1)

    def iteration(i, overflow_in=None):
        fused.zero_grad()
        plain.zero_grad()
        out = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).float()
        for loss_id in (0, 1):
            loss = out.pow(2).mean()
            if loss_id == overflow_in:
                loss = loss * INF
            with amp.scale_loss(loss, [fused, plain], loss_id=loss_id) as scaled:
                scaled.backward(retain_graph=loss_id == 0)
        fused.step()
        plain.step()

    iteration(0)
    capsys.readouterr()
    iteration(1, overflow_in=0)
    # the fused optimizer's message is in flight; the SGD step reads its own decision (a sync),
    # so it waits for the earlier copy and prints that message first
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)] * 2
    assert in_flight[0].waited


def test_messages_still_in_flight_are_printed_at_exit(in_flight, capsys):
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    _iteration(model, opt, 0)
    capsys.readouterr()
    _iteration(model, opt, 1, overflow=True)
    assert _skip_lines(capsys.readouterr().out) == []
    skip._print_at_exit()  # registered with atexit
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]


# Closures ---------------------------------------------------------------------------------------


def test_closure_with_a_fused_optimizer_is_refused_on_a_skip_and_the_skip_stays_armed(capsys):
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    _iteration(model, opt, 0)
    with amp.scale_loss(model(torch.full((1, 8), INF)).float().sum(), opt) as scaled:
        scaled.backward()
    capsys.readouterr()
    with pytest.raises(
        RuntimeError,
        match="^" + re.escape("Currently, Amp does not support closure use with optimizers.") + "$",
    ):
        opt.step(lambda: 0.0)
    before = [p.detach().clone() for p in model.parameters()]
    assert _counted(opt.step) == []  # the skip is still armed, now taken on the device
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert _skip_lines(capsys.readouterr().out) == [SKIP_MSG.format(0, 32768.0)]


def test_closure_with_a_fused_optimizer_without_overflow_runs_as_before():
    model, opt = _init("O1", OPTIMIZERS["torch_adamw_fused"])
    _iteration(model, opt, 0)
    with amp.scale_loss(model(torch.ones(1, 8)).float().mean(), opt) as scaled:
        scaled.backward()
    calls = []
    assert opt.step(lambda: calls.append(1) or 2.5) == 2.5
    assert calls == [1]
    assert not hasattr(opt, "found_inf") and not hasattr(opt, "grad_scale")


# FusedSGD under torch.amp.GradScaler ------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(momentum=0.9, nesterov=True),
        dict(momentum=0.9, dampening=0.1),
        dict(momentum=0.9, wd_after_momentum=True, weight_decay=0.01),
        dict(momentum=0.0),
    ],
    ids=["nesterov", "dampening", "wd_after_momentum", "no_momentum"],
)
def test_fused_sgd_under_grad_scaler_skips_exactly_like_the_unscale_then_skip_path(kwargs):
    def run(amp_scaling):
        torch.manual_seed(0)
        params = [torch.randn(5, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
        opt = FusedSGD(params, lr=0.1, **kwargs)
        opt._step_supports_amp_scaling = amp_scaling
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        syncs, states = [], []
        for i in range(7):
            opt.zero_grad()
            g = torch.Generator().manual_seed(i)
            loss = sum((p * torch.randn(p.shape, generator=g)).sum() for p in params)
            scaled = scaler.scale(loss * (INF if i in (0, 3) else 1.0))
            scaled.backward()
            syncs.append(len(_counted(lambda: (scaler.step(opt), scaler.update()))))
            states.append(
                {
                    k: v["momentum_buffer"].clone()
                    for k, v in opt.state_dict()["state"].items()
                    if "momentum_buffer" in v
                }
            )
        return [p.detach() for p in params], states, scaler.get_scale(), syncs

    a, states_a, scale_a, syncs_a = run(True)
    b, states_b, scale_b, syncs_b = run(False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(states_a) == len(states_b)
    for sa, sb in zip(states_a, states_b):
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert states_a[0] == {}  # the overflowing first step created no momentum buffer
    assert scale_a == scale_b == 2.0**8
    assert syncs_b == [1] * 7
    if kwargs.get("wd_after_momentum"):
        assert syncs_a == [1] * 7  # Apex's formula in tensor ops: found_inf read on the host
    elif kwargs["momentum"]:
        assert syncs_a == [1, 1] + [0] * 5  # read on the host until the momentum buffers exist
    else:
        assert syncs_a == [0] * 7
