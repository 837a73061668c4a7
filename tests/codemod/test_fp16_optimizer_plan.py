"""The `FP16_Optimizer` flow is planned on the parse (plan/fp16_optimizer.py) and only carried
out by Fp16OptimizerToGradScaler; where an earlier rule rewrote the file, that rule plans the
flow again on the tree it got, with the same output and diagnostics."""

from __future__ import annotations

import textwrap

import pytest

from amp_migrate import migrate
from amp_migrate.migrate import migrate_source
from amp_migrate.rules import fp16_optimizer as rule_module

FLOW = textwrap.dedent(
    """\
    import torch
    from apex.fp16_utils import FP16_Optimizer, network_to_half


    def train(model, loader, crit):
        model = network_to_half(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        for x, y in loader:
            optimizer.zero_grad()
            loss = crit(model(x), y)
            optimizer.backward(loss)
            optimizer.step()
    """
)

#: A flow with Apex's DDP in the block that computes the loss: ApexParallelToTorch rewrites that
#: line before the flow's rule runs, so the block (where the autocast region goes) and the
#: module are new nodes by then. (The region starting at the DDP line is how the flow's rule
#: has always placed it: the line reads the converted model.)
WITH_DDP = textwrap.dedent(
    """\
    import torch
    from apex.fp16_utils import FP16_Optimizer, network_to_half
    from apex.parallel import DistributedDataParallel as DDP


    def train_step(model, x, y, crit):
        model = network_to_half(model)
        model = DDP(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        optimizer.zero_grad()
        loss = crit(model(x), y)
        optimizer.backward(loss)
        optimizer.step()
    """
)

NATIVE_WITH_DDP = textwrap.dedent(
    """\
    import torch


    def train_step(model, x, y, crit):
        with torch.autocast("cuda", dtype=torch.float16):
            model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            optimizer.zero_grad(set_to_none=False)
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
)


@pytest.fixture
def plans(monkeypatch):
    """Every FilePlan the driver's planner phase returns, and every plan the rule makes again."""
    seen: dict[str, list] = {"file": [], "again": []}
    plan_file, again = migrate.plan_file, rule_module.plan_fp16_optimizer

    def recording_plan_file(module, state):
        made = plan_file(module, state)
        seen["file"].append((module, made, state))
        return made

    def recording_again(module, state):
        made = again(module, state)
        seen["again"].append(made)
        return made

    monkeypatch.setattr(migrate, "plan_file", recording_plan_file)
    monkeypatch.setattr(rule_module, "plan_fp16_optimizer", recording_again)
    return seen


def test_the_flow_is_planned_on_the_parse_and_kept_from_the_amp_rules(plans):
    result = migrate_source(FLOW, target="native")
    assert result.target_used == "native"
    (module, made, state) = plans["file"][0]
    plan = made.fp16_optimizer
    assert plan is not None and plan.module is module  # the parse, which the rule transforms
    assert made.training is None  # amp's rules never see the flow's TrainingPlan
    assert plan.training.scaler == "scaler" and plan.target == "optimizer"
    assert {d.code for d in made.diagnostics} == {"AMP465", "AMP468", "AMP469"}
    assert plans["again"] == []  # no rule before it changed the file: the plan was used as made
    assert state.training is plan.training  # handed on by the rule, for the step rule after it


def test_a_refused_flow_is_refused_by_the_planner():
    text = FLOW + "    torch.save(optimizer.state_dict(), 'ckpt.pt')\n"
    result = migrate_source(text, target="native")
    refusals = [d for d in result.diagnostics if d.code == "AMP466"]
    assert len(refusals) == 1 and refusals[0].line == 14
    assert "state_dict" in refusals[0].message


def test_a_file_an_earlier_rule_rewrote_is_planned_again_on_the_rules_tree(plans):
    result = migrate_source(WITH_DDP, target="native")
    assert result.code == NATIVE_WITH_DDP
    assert len(plans["again"]) == 1 and plans["again"][0] is not None
    codes = [d.code for d in result.diagnostics]
    assert sorted(codes) == ["AMP465", "AMP468", "AMP469", "AMP520"]  # each once: the parse's withdrawn
