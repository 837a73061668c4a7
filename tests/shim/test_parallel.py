"""`amp_shim.parallel` (DDP, Reducer, SyncBatchNorm, LARC) and the engine's cross-rank skip decision.

Multi-rank behaviour runs in 2 gloo processes on 127.0.0.1 (tests/shim/parallel_workers.py);
the references are single-process computations over the ranks' concatenated batches.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import amp_shim
from amp_shim import parallel
from amp_shim._deprecation import DeprecatedFeatureWarning
from amp_shim.parallel import LARC, SyncBatchNorm, convert_syncbn_model

WORKER = Path(__file__).with_name("parallel_workers.py")
ROOT = Path(__file__).resolve().parents[2]
SPLIT = (3, 5)
SKIP_MSG = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(case: str, out: Path, world: int = 2, timeout: float = 60) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "shim"), env.get("PYTHONPATH")]))
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), case, str(rank), str(world), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-4000:]
    return [torch.load(out / f"{case}.rank{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.fixture
def single_rank_group(tmp_path):
    """A 1-rank gloo group in this process (constructing torch DDP needs one)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# -- SyncBatchNorm over 2 ranks == BatchNorm over the concatenated batch -----------------------
def _reference_bn(make_input, z_shape=None, channel_last=False, fuse_relu=False, **bn_kwargs):
    """What tests/shim/parallel_workers.py::_syncbn_run computes, as one process and one batch."""
    g = torch.Generator().manual_seed(7)
    x = make_input(g)
    grad_out = torch.randn(x.shape, generator=g)
    z = torch.randn(z_shape, generator=g) if z_shape else None
    to_cf = (lambda t: t.movedim(-1, 1)) if channel_last else (lambda t: t)
    from_cf = (lambda t: t.movedim(1, -1)) if channel_last else (lambda t: t)
    bn = nn.BatchNorm1d(x.shape[-1] if channel_last else x.shape[1], **bn_kwargs)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(bn.bias.shape, generator=g))
    ref = {"outputs": [], "x_grads": []}
    for step in range(2):
        xs = (x * (step + 1)).clone().requires_grad_()
        out = bn(to_cf(xs).reshape(xs.shape[0], bn.num_features, -1)).reshape(to_cf(xs).shape)
        if z is not None:
            out = out + to_cf(z)
        if fuse_relu:
            out = F.relu(out)
        out = from_cf(out)
        (out * grad_out).sum().backward()
        ref["outputs"].append(out.detach())
        ref["x_grads"].append(xs.grad)
    ref.update(
        weight_grad=bn.weight.grad,
        bias_grad=bn.bias.grad,
        running_mean=bn.running_mean,
        running_var=bn.running_var,
        num_batches_tracked=bn.num_batches_tracked,
    )
    bn.eval()
    out = bn(to_cf(x).reshape(x.shape[0], bn.num_features, -1)).reshape(to_cf(x).shape)
    ref["eval_output"] = from_cf(F.relu(out) if fuse_relu else out).detach()
    return ref


def _split(t):
    return torch.split(t, SPLIT)


@pytest.fixture(scope="module")
def syncbn_ranks(tmp_path_factory):
    return run_ranks("syncbn", tmp_path_factory.mktemp("syncbn"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, make_input, kwargs",
    [
        ("nchw", lambda g: torch.randn(8, 4, 3, 5, generator=g), {}),
        ("nc", lambda g: torch.randn(8, 6, generator=g), {}),
        ("ncl_cumulative", lambda g: torch.randn(8, 3, 7, generator=g), {"momentum": None}),
        (
            "channel_last_z_relu",
            lambda g: torch.randn(8, 3, 5, 4, generator=g),
            {"z_shape": (8, 3, 5, 4), "channel_last": True, "fuse_relu": True},
        ),
    ],
)
def test_syncbatchnorm_over_two_uneven_ranks_equals_batchnorm_over_the_concatenated_batch(
    syncbn_ranks, name, make_input, kwargs
):
    ref = _reference_bn(make_input, **kwargs)
    ranks = [r[name] for r in syncbn_ranks]
    close = dict(rtol=1e-5, atol=1e-5)
    for step in range(2):
        for rank, part in enumerate(_split(ref["outputs"][step])):
            torch.testing.assert_close(ranks[rank]["outputs"][step], part, **close)
        for rank, part in enumerate(_split(ref["x_grads"][step])):
            torch.testing.assert_close(ranks[rank]["x_grads"][step], part, **close)
    # Each rank holds the grad of its own loss; DDP sums (then averages) them across ranks.
    torch.testing.assert_close(sum(r["weight_grad"] for r in ranks), ref["weight_grad"], **close)
    torch.testing.assert_close(sum(r["bias_grad"] for r in ranks), ref["bias_grad"], **close)
    for r in ranks:
        torch.testing.assert_close(r["running_mean"], ref["running_mean"], **close)
        torch.testing.assert_close(r["running_var"], ref["running_var"], **close)
        assert int(r["num_batches_tracked"]) == int(ref["num_batches_tracked"]) == 2
    for rank, part in enumerate(_split(ref["eval_output"])):  # eval: local, running statistics
        torch.testing.assert_close(ranks[rank]["eval_output"], part, **close)


def test_syncbatchnorm_outside_a_process_group_is_batchnorm():
    torch.manual_seed(0)
    x = torch.randn(6, 3, 4, 4)
    bn, ref = SyncBatchNorm(3), nn.BatchNorm2d(3)
    assert torch.equal(bn(x), ref(x))
    assert torch.equal(bn.running_var, ref.running_var)
    assert list(bn.state_dict()) == list(ref.state_dict())
    bn.eval(), ref.eval()
    assert torch.equal(bn(x), ref(x))


def test_syncbatchnorm_returns_the_input_dtype_and_computes_in_fp32():
    bn = SyncBatchNorm(3)
    x = torch.randn(4, 3, 2, 2)
    assert bn(x.half()).dtype == torch.float16
    torch.testing.assert_close(
        bn(x.half()).float(), nn.BatchNorm2d(3)(x.half().float()), rtol=1e-3, atol=1e-3
    )


def test_convert_syncbn_model_replaces_batchnorms_and_keeps_their_state():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Sequential(nn.BatchNorm1d(4, momentum=0.3, eps=1e-3)),
        nn.InstanceNorm2d(4, affine=True),
    )
    with torch.no_grad():
        model[1].weight.uniform_(), model[1].running_mean.uniform_()
        model[1].num_batches_tracked.fill_(7)
    model[3][0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(DeprecatedFeatureWarning, match="convert_syncbn_model is deprecated"):
        converted = convert_syncbn_model(model, channel_last=True)
    assert type(converted[1]) is SyncBatchNorm and type(converted[3][0]) is SyncBatchNorm
    assert type(converted[4]) is nn.InstanceNorm2d
    assert converted[1].channel_last and converted[3][0].momentum == 0.3 and converted[3][0].eps == 1e-3
    assert not converted[3][0].weight.requires_grad
    after = converted.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert converted[1].running_mean is model[1].running_mean  # shared, as in Apex


def test_convert_syncbn_model_converts_a_bare_batchnorm():
    assert isinstance(convert_syncbn_model(nn.BatchNorm2d(3)), SyncBatchNorm)


def test_apex_parallel_exports_apexs_names():
    for name in (
        "DistributedDataParallel",
        "Reducer",
        "SyncBatchNorm",
        "LARC",
        "convert_syncbn_model",
        "create_syncbn_process_group",
        "ReduceOp",
    ):
        assert hasattr(parallel, name), name
    assert amp_shim.parallel is parallel
    from amp_shim.parallel.optimized_sync_batchnorm import SyncBatchNorm as Optimized
    from amp_shim.parallel.sync_batchnorm import SyncBatchNorm as Fallback

    assert Optimized is Fallback is SyncBatchNorm
    assert issubclass(SyncBatchNorm, nn.modules.batchnorm._BatchNorm)


# -- the engine: an overflow on one rank makes every rank skip -------------------------------
@pytest.fixture(scope="module")
def overflow_ranks(tmp_path_factory):
    return run_ranks("overflow", tmp_path_factory.mktemp("overflow"))


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_an_overflow_on_one_rank_makes_every_rank_skip_and_print_apexs_message(overflow_ranks, level):
    for rank in overflow_ranks:
        result = rank[level]
        assert result["skipped"]
        assert result["printed"].splitlines() == [SKIP_MSG]
        assert result["scale"] == 32768.0


@pytest.mark.slow
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_the_cross_rank_reduction_adds_no_host_sync(overflow_ranks, level):
    for rank in overflow_ranks:
        assert len(rank[level]["clean_syncs"]) <= 1, rank[level]["clean_syncs"]
        assert len(rank[level]["overflow_syncs"]) == 1, rank[level]["overflow_syncs"]


@pytest.mark.slow
def test_without_the_reduction_the_clean_rank_would_step(overflow_ranks):
    """The control: the engine's all-reduce is what makes rank 0 skip."""
    rank0, rank1 = (r["without_reduce"] for r in overflow_ranks)
    assert rank1["skipped"] and not rank0["skipped"]
    assert rank0["scale"] == 65536.0 and rank1["scale"] == 32768.0


# -- DistributedDataParallel ----------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory):
    return run_ranks("ddp", tmp_path_factory.mktemp("ddp"))


def _equal_lists(a, b, **close):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **close)


@pytest.mark.slow
def test_ddp_broadcasts_rank0s_params_and_averages_gradients(ddp_ranks):
    local = ddp_ranks[0]["local"]
    mean = [(a + b) / 2 for a, b in zip(*local)]
    total = [a + b for a, b in zip(*local)]
    _equal_lists(ddp_ranks[0]["params_after_wrap"], ddp_ranks[1]["params_after_wrap"])
    for rank in ddp_ranks:
        _equal_lists(rank["default"], mean)
        _equal_lists(rank["delay_allreduce"], mean)
        _equal_lists(rank["predivide"], mean)
        _equal_lists(rank["sum"], total)  # gradient_average=False
        _equal_lists(rank["reenabled"], mean)
        assert rank["state_dict_keys"][0].startswith("module.")
    for r, rank in enumerate(ddp_ranks):  # disable_allreduce(): local gradients
        _equal_lists(rank["disabled"], local[r])


@pytest.mark.slow
def test_reducer_broadcasts_the_module_and_averages_gradients_or_tensors(ddp_ranks):
    _equal_lists(ddp_ranks[0]["reducer_params"], ddp_ranks[1]["reducer_params"])
    mean = [(a + b) / 2 for a, b in zip(*ddp_ranks[0]["local"])]
    for rank in ddp_ranks:
        _equal_lists(rank["reducer_module"], mean)
        _equal_lists(rank["reducer_list"], [torch.full((2,), 1.5), torch.full((3,), 15.0)])


def test_ddp_accepts_apexs_arguments_and_warns_once_for_those_torch_lacks(single_rank_group):
    from amp_shim.parallel import distributed

    distributed._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = parallel.DistributedDataParallel(
            nn.Linear(2, 2),
            message_size=2**20,
            delay_allreduce=True,
            retain_allreduce_buffers=True,
            allreduce_always_fp32=True,
            gradient_average=True,
            gradient_predivide_factor=2.0,
            gradient_average_split_factor=None,
            prof=True,
        )
        parallel.DistributedDataParallel(
            nn.Linear(2, 2), retain_allreduce_buffers=True, prof=True, num_allreduce_streams=2
        )
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert model.delay_allreduce and model.gradient_predivide_factor == 2.0
    assert model.bucket_bytes_cap == 2**20 * 4
    ignored = [
        str(w.message)
        for w in caught
        if issubclass(w.category, UserWarning) and "has no equivalent" in str(w.message)
    ]
    assert len(ignored) == 3, ignored  # retain_allreduce_buffers, prof, num_allreduce_streams
    assert any("retain_allreduce_buffers=True" in m for m in ignored)
    deprecated = [w for w in caught if issubclass(w.category, DeprecatedFeatureWarning)]
    assert "apex.parallel.DistributedDataParallel is deprecated" in str(deprecated[0].message)
    out = model(torch.ones(1, 2))
    out.sum().backward()  # the comm hook runs on a 1-rank group


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shared_param": True}, "shared_param is no longer supported"),
        ({"delay_allreduce": True, "num_allreduce_streams": 2}, "may only be used if delay_allreduce=False"),
        ({"delay_allreduce": True, "allreduce_trigger_params": []}, "only valid if delay_allreduce=False"),
    ],
)
def test_ddp_keeps_apexs_argument_errors(single_rank_group, kwargs, message):
    with pytest.raises(ValueError, match=message):
        parallel.DistributedDataParallel(nn.Linear(2, 2), **kwargs)


# -- LARC ------------------------------------------------------------------------------------
def _larc_reference(params, grads, lr, wd, trust, clip, eps):
    """Apex's LARC: the local lr rescales the grad (weight decay folded in)."""
    out = []
    for p, g in zip(params, grads):
        pn, gn = torch.norm(p), torch.norm(g)
        if pn != 0 and gn != 0:
            local = trust * pn / (gn + pn * wd + eps)
            if clip:
                local = min(local / lr, 1)
            g = (g + wd * p) * local
        out.append(g)
    return out


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("wd", [0.0, 1e-2])
def test_larc_rescales_grads_by_the_local_lr_then_steps_without_weight_decay(clip, wd):
    torch.manual_seed(0)
    params = [
        nn.Parameter(torch.randn(5, 3)),
        nn.Parameter(torch.zeros(4)),
        nn.Parameter(torch.randn(3) * 100),
        nn.Parameter(torch.randn(2)),
    ]
    grads = [torch.randn(5, 3), torch.randn(4), torch.randn(3) * 1e-3, torch.zeros(2)]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    before = [p.detach().clone() for p in params]
    lr = 0.1
    expected = _larc_reference(before, grads, lr, wd, 0.02, clip, 1e-8)
    opt = LARC(torch.optim.SGD(params, lr=lr, weight_decay=wd), clip=clip)
    opt.step()
    for p, b, g in zip(params, before, expected):
        assert torch.equal(p.detach(), b - lr * g)  # plain SGD on the rescaled grad
    assert opt.param_groups[0]["weight_decay"] == wd  # restored after the step


def test_larc_proxies_the_wrapped_optimizer():
    p = nn.Parameter(torch.ones(2))
    inner = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    opt = LARC(inner, trust_coefficient=0.1, clip=False, eps=1e-6)
    assert opt.param_groups is inner.param_groups and opt.state is inner.state
    p.grad = torch.ones(2)
    opt.step()
    assert opt.state_dict() == inner.state_dict()
    opt.zero_grad()
    assert p.grad is None
    opt.add_param_group({"params": [nn.Parameter(torch.ones(1))]})
    assert len(inner.param_groups) == 2
    with pytest.raises(TypeError):
        opt.step(lambda: 0.0)  # no closure, as in Apex


def test_larc_trains_through_amp_as_a_single_optimizer(capsys):
    from amp_shim import amp

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = LARC(torch.optim.SGD(model.parameters(), lr=0.5), trust_coefficient=0.5)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
