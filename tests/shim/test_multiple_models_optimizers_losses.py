"""Multiple models, optimizers and losses through `amp.scale_loss`, ported device-agnostic from
the behaviour Apex's own `test_multiple_models_optimizers_losses.py` checks (an L0 test that needs CUDA):
which steps are skipped after an overflow, the unscaled grads, `amp.master_params` agreeing
with the model params, and final params equal to a run without amp.

The cases are an all-pairs covering of the full cross product (672 combinations, 46 cases; see
`full_product`): every value and every pair of values of scenario, O-level, zeroing, per-loss
scalers, overflow site, iteration and weight dtype is run. The overflow site stays crossed with
its scenario and loss (which models a loss sums and which optimizers it skips exist only per
scenario), and injection exists only at O1/O2."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
from torch.nn import Parameter

from amp_shim import amp
from amp_shim.amp import _amp_state
from pairwise_cover import all_pairs, pairs_of


class MyModel(torch.nn.Module):
    """One fp32 and one fp16 weight, so every O-level sees both kinds of gradient."""

    def __init__(self, unique: int):
        super().__init__()
        self.weight0 = Parameter(unique + torch.arange(2, dtype=torch.float32))
        self.weight1 = Parameter(1.0 + unique + torch.arange(2, dtype=torch.float16))

    def forward(self, x):
        return ((x * self.weight0.float()) * self.weight1.float()).sum()


@dataclass(frozen=True)
class Scenario:
    name: str
    n_models: int
    groups: tuple  # per optimizer: ((model index, lr), ...), momentum
    losses: tuple  # per loss: (model indices summed, optimizer indices passed to scale_loss)

    def build(self):
        models = [MyModel(i + 1) for i in range(self.n_models)]
        optimizers = [
            torch.optim.SGD(
                [{"params": models[m].parameters(), "lr": lr} for m, lr in groups], momentum=momentum
            )
            for groups, momentum in self.groups
        ]
        return models, optimizers


SCENARIOS = [
    Scenario("2models2losses1optimizer", 2, ((((0, 0.25), (1, 0.5)), 0.125),), (((0,), (0,)), ((1,), (0,)))),
    Scenario(
        "3models2losses1optimizer",
        3,
        ((((0, 0.25), (1, 0.5), (2, 0.125)), 0.125),),
        (((0, 2), (0,)), ((1, 2), (0,))),
    ),
    Scenario(
        "2models2losses2optimizers",
        2,
        ((((0, 0.25),), 0.125), (((1, 0.5),), 0.25)),
        (((0,), (0,)), ((1,), (1,))),
    ),
    Scenario(
        "3models2losses2optimizers",
        3,
        ((((0, 0.25), (1, 1.0)), 0.5), (((2, 0.5),), 0.25)),
        (((0, 1), (0,)), ((2, 1), (0, 1))),
    ),
]

X = torch.ones(2, dtype=torch.float32)


def loss_of(models, indices):
    return sum(models[m](X) for m in indices)


def optimizer_params(optimizers):
    return [p for opt in optimizers for g in opt.param_groups for p in g["params"]]


def reference_run(scenario, iters, skipped):
    """Plain fp32-math torch with the given (iteration -> optimizers skipped) plan."""
    models, optimizers = scenario.build()
    grads = {}
    for i in range(iters):
        for opt in optimizers:
            opt.zero_grad()
        for indices, _ in scenario.losses:
            loss_of(models, indices).backward()
        grads[i] = [p.grad.clone() for p in optimizer_params(optimizers)]
        for k, opt in enumerate(optimizers):
            if k not in skipped.get(i, ()):
                opt.step()
    return [p.detach().clone() for m in models for p in m.parameters()], grads


def full_product():
    """Every valid combination, as dimension -> value rows (the old full cross product).

    The overflow site (which loss of which scenario, and which model's weight in it) is one
    dimension: a loss's models and the optimizers it skips exist only per scenario, so the site
    stays crossed with the scenario and the loss, and injection exists only at O1/O2 (O0 and O3
    never scale dynamically). Iteration, weight dtype, O-level, zeroing and per-loss scalers are
    independent of one another and of the site: `all_pairs` covers each pair of their values.
    """
    rows = []
    for s, scenario in enumerate(SCENARIOS):
        for opt_level in ("O0", "O1", "O2", "O3"):
            for how_to_zero, multiple in itertools.product(("none", "model", "optimizer"), (True, False)):
                injections = [None]
                if opt_level in ("O1", "O2"):
                    for it, backward, loc in itertools.product((0, 1), (0, 1), ("fp16", "fp32")):
                        for target in scenario.losses[backward][0]:
                            injections.append((it, backward, loc, target))
                for inject in injections:
                    site = None if inject is None else (s, inject[1], inject[3])
                    it, loc = (None, None) if inject is None else (inject[0], inject[2])
                    rows.append(
                        dict(
                            scenario=s,
                            opt_level=opt_level,
                            how_to_zero=how_to_zero,
                            multiple=multiple,
                            site=site,
                            iteration=it,
                            loc=loc,
                        )
                    )
    return rows


def _inject(row):
    if row["site"] is None:
        return None
    _, backward, target = row["site"]
    return (row["iteration"], backward, row["loc"], target)


def cases():
    for row in all_pairs(full_product()):
        scenario, inject = SCENARIOS[row["scenario"]], _inject(row)
        multiple = row["multiple"]
        yield pytest.param(
            scenario,
            row["opt_level"],
            row["how_to_zero"],
            multiple,
            inject,
            id=f"{scenario.name}-{row['opt_level']}-{row['how_to_zero']}-{'multi' if multiple else 'shared'}-{inject}",
        )


def test_the_cases_cover_every_pair_of_values_of_the_full_product():
    full, chosen = full_product(), all_pairs(full_product())
    assert len(chosen) < len(full)
    assert set().union(*map(pairs_of, chosen)) == set().union(*map(pairs_of, full))
    assert all(row in full for row in chosen)


@pytest.mark.parametrize("scenario,opt_level,how_to_zero,multiple,inject", list(cases()))
def test_overflow_skips_exactly_the_optimizers_of_that_loss(
    scenario, opt_level, how_to_zero, multiple, inject
):
    iters = 3 if inject else 2
    skipped = {}
    if inject:
        it, backward, _, _ = inject
        skipped[it] = set(scenario.losses[backward][1])
    ref_params, ref_grads = reference_run(scenario, iters, skipped)

    models, optimizers = scenario.build()
    _amp_state.allow_incoming_model_not_fp32 = True
    models, optimizers = amp.initialize(
        models,
        optimizers,
        opt_level=opt_level,
        verbosity=0,
        cast_model_type=False,
        num_losses=2 if multiple else 1,
    )
    _amp_state.allow_incoming_model_not_fp32 = False
    _amp_state.loss_scalers[0]._loss_scale = 4.0
    if multiple:
        _amp_state.loss_scalers[1]._loss_scale = 16.0
    loss_ids = (0, 1) if multiple else (0, 0)
    start_scales = [s.loss_scale() for s in _amp_state.loss_scalers]

    for i in range(iters):
        if how_to_zero == "none":
            for m in models:
                for p in m.parameters():
                    p.grad = None
        elif how_to_zero == "model":
            for m in models:
                m.zero_grad()
        else:
            for opt in optimizers:
                opt.zero_grad()
        for b, (indices, opt_indices) in enumerate(scenario.losses):
            opts = [optimizers[k] for k in opt_indices]
            with amp.scale_loss(
                loss_of(models, indices), opts if len(opts) > 1 else opts[0], loss_id=loss_ids[b]
            ) as scaled_loss:
                scaled_loss.backward()
                if inject and i == inject[0] and b == inject[1]:
                    target = models[inject[3]]
                    weight = target.weight1 if inject[2] == "fp16" else target.weight0
                    weight.grad[0] = float("inf")
        if not inject or i != inject[0]:
            got = [p.grad.float() for p in optimizer_params(optimizers)]
            assert len(got) == len(ref_grads[i])
            for g, r in zip(got, ref_grads[i]):
                assert torch.allclose(g, r.float())
        for opt in optimizers:
            opt.step()

    model_params = [p for m in models for p in m.parameters()]
    for param, reference in zip(model_params, ref_params):
        assert torch.allclose(param.float(), reference.float())
    for opt in optimizers:
        for model_param, master in zip(
            [p for m in models for p in m.parameters() if any(p is q for q in _model_params_of(opt))],
            amp.master_params(opt),
        ):
            assert torch.allclose(model_param, master.to(model_param.dtype))

    scales = [s.loss_scale() for s in _amp_state.loss_scalers]
    expected = list(start_scales)
    if inject:
        expected[loss_ids[inject[1]]] /= 2
    assert scales == expected


def _model_params_of(opt):
    stash = opt._amp_stash
    if hasattr(stash, "fp16_groups"):  # O2: masters replaced the fp16 params
        return stash.all_fp16_params + stash.all_fp32_from_fp32_params
    return [p for g in opt.param_groups for p in g["params"]]


def test_skip_prints_apex_message_once_per_step(capsys):
    scenario = SCENARIOS[0]
    models, (opt,) = scenario.build()
    _amp_state.allow_incoming_model_not_fp32 = True
    models, opt = amp.initialize(models, opt, opt_level="O2", cast_model_type=False, verbosity=0)
    _amp_state.verbosity = 1
    before = [p.detach().clone() for p in models[0].parameters()]
    for b in range(2):  # two overflowing losses arm a single skip
        with amp.scale_loss(loss_of(models, (b,)), opt) as scaled:
            scaled.backward()
            models[b].weight0.grad[0] = float("nan")
    assert opt.step() is None
    out = capsys.readouterr().out
    assert out == "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0\n"
    assert all(torch.equal(a, b) for a, b in zip(before, models[0].parameters()))
    assert all(p.grad is None for p in opt._amp_stash.all_fp32_from_fp16_params)
    with amp.scale_loss(loss_of(models, (0,)), opt) as scaled:
        scaled.backward()
    opt.step()
    assert capsys.readouterr().out == ""
    assert not torch.equal(before[0], models[0].weight0)
